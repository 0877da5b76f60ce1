"""The bench stage: throughput sweeps of an engine (image, command or URL), reports, compare.

Layout: :mod:`~sparkbuild.bench.sweep` (the grid and its parsing), :mod:`~.prompts`
(deterministic prompts hit to the token), :mod:`~.client` (async streaming requests),
:mod:`~.runner` (one sweep against a target), :mod:`~.results` (the JSON schema),
:mod:`~.report` (Markdown/terminal tables, compare, images.lock), :mod:`~.plot`.
"""

#: Bumped whenever a change can move the numbers (prompt recipe, timing or metric definitions),
#: so `bench compare` can warn when two reports were measured differently.
HARNESS_VERSION = "1"
