"""The smoke stage: one run's checks, verdict and report (launching is in sparkbuild.engines)."""
