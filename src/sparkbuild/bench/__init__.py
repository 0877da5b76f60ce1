"""The bench stage: throughput sweeps of an engine (image, command or URL), reports, compare.

Layout: :mod:`~sparkbuild.bench.stage` (the entry point, ``run_stage``) and
:mod:`~.compare` (``bench compare``'s, ``run_compare``); :mod:`~.sweep` (the grid and its
parsing), :mod:`~.prompts` (deterministic prompts hit to the token), :mod:`~.client` (async
streaming requests), :mod:`~.served` (what the engine says about itself), :mod:`~.runner`
(one sweep against a target), :mod:`~.progress`, :mod:`~.results` (the JSON schema),
:mod:`~.outputs` (where a report goes), :mod:`~.report` (Markdown/terminal tables, compare
rows, images.lock), :mod:`~.plot`; claims in :mod:`~.claims`, :mod:`~.claims_request` and
:mod:`~.claims_report`; Spark Arena in :mod:`~.arena`.
"""

#: Bumped whenever a change can move the numbers (prompt recipe, timing or metric definitions),
#: so `bench compare` can warn when two reports were measured differently.
HARNESS_VERSION = "1"
