"""Running and talking to inference engines, for smoke and bench.

What sparkbuild knows about each engine, and the registry of engines, sit at the start of
the flow in :mod:`sparkbuild.adapters`; this package launches them. :mod:`~.targets` (where
an engine runs), :mod:`~.profiles` (what to serve, from ``smoke/<name>.yaml``),
:mod:`~.prompts` (the profiles' built-in prompt sets), :mod:`~.launch` (a profile and
``--image``/``--command``/``--url`` made into a target; mounts; settled counters),
:mod:`~.signatures` (known failures in engine logs), :mod:`~.logs`, :mod:`~.lifeline`.
"""
