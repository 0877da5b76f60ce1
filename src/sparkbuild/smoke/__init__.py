"""The smoke stage: profiles, checks, known failure signatures, reports."""
