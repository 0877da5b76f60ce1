"""What each stage needs to know about an engine, as frozen values an adapter declares.

An engine's module (:mod:`.sglang`, :mod:`.vllm`) fills one of each on its adapter class:
the source build (:class:`SourceBuild`), preflight (:class:`PreflightFacts`, with the facts
the probe reads as JSON, :class:`ProbeFacts`), and sparkrun's recipes (:class:`RecipeFacts`).
The stages read them through the registry (:mod:`.known`) and never name an engine.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Literal

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version

from sparkbuild.jsontext import JsonObject


@dataclass(frozen=True)
class Moved:
    """One build argument whose value changed at a release (``when``: a version range)."""

    name: str
    when: str
    value: str


@dataclass(frozen=True)
class SourceBuild:
    """A source build's facts: the default base image (a template over ``{version}``; a
    spec's ``base_image`` overrides it), the engine's own build arguments (the GPU
    architecture in the form its build reads: ``TORCH_CUDA_ARCH_LIST``, CMake's
    ``CMAKE_CUDA_ARCHITECTURES``), and the arguments whose values moved with the upstream
    tree, each with the range it covers."""

    base_image: str | None = None
    args: Mapping[str, str] = field(default_factory=dict)
    moves: tuple[Moved, ...] = ()

    def moved_args(self, version: Version) -> dict[str, str]:
        """The moved arguments' values for ``version``."""
        return {
            moved.name: moved.value
            for moved in self.moves
            if SpecifierSet(moved.when).contains(version, prereleases=True)
        }


_PEP440_TAG = re.compile(r"^v?(?P<version>\d[0-9A-Za-z.!+_-]*)\Z")


@dataclass(frozen=True)
class ReleaseTags:
    """How the engine's release tags name versions: ``pattern`` (its ``version`` group a
    PEP 440 version) and ``form`` (the tag of a version). The default is ``v0.5.13`` or
    ``0.5.13``; a build-numbered engine tags ``b6123``, version 6123."""

    pattern: re.Pattern[str] = _PEP440_TAG
    form: str = "v{version}"

    def version_of(self, tag: str) -> Version | None:
        """The version ``tag`` names, or None when it names none."""
        match = self.pattern.match(tag)
        if not match:
            return None
        try:
            return Version(match.group("version"))
        except InvalidVersion:
            return None

    def tag_of(self, version: Version) -> str:
        return self.form.format(version=version)


@dataclass(frozen=True)
class ProbeFacts:
    """The engine facts the preflight probe reads. The probe runs in the engine's own
    environment with the standard library only, so it gets these as JSON, not by import.

    ``parser`` picks how the probe parses the launch flags and builds the server config:
    ``server_args`` (the release's ``prepare_server_args``/``ServerArgs``, then the
    reserved-token and speculative-default steps) or ``arg_parser`` (the release's
    ``make_arg_parser``, then ``AsyncEngineArgs.create_engine_config``).
    """

    parser: Literal["server_args", "arg_parser"]
    prog: str  # the launch parser's name in its own messages
    model_flag: str
    distributions: tuple[str, ...]  # the engine's version is read from the first installed
    env_prefixes: tuple[str, ...]
    env_module: str  # the module declaring the variables, relative to the package
    config_registry: str  # model type -> config class, a module relative to the package
    config_args: tuple[str, ...] = ()  # added to the config check unless the flag is given
    model_inspector: str | None = None  # module:name of the registry a failed inspection names
    signals_source: str = ""  # where the adapter declares its signals (named in a failure)

    def to_json(self) -> JsonObject:
        return {
            "parser": self.parser,
            "prog": self.prog,
            "model_flag": self.model_flag,
            "distributions": list(self.distributions),
            "env_prefixes": list(self.env_prefixes),
            "env_module": self.env_module,
            "config_registry": self.config_registry,
            "config_args": list(self.config_args),
            "model_inspector": self.model_inspector,
            "signals_source": self.signals_source,
        }


@dataclass(frozen=True)
class PreflightFacts:
    """What preflight knows of the engine's tree and platform."""

    registry_dir: str | None  # the model directory, relative to the package (imported)
    #: True: the probe answers the engine's platform checks as the Spark's GPU, so a CPU run
    #: takes the Spark's import paths, and a local venv of the release's wheel can be made.
    #: False: the engine runs under its own CPU build (``--python`` or ``--image``).
    spark_gpu: bool
    probe: ProbeFacts


@dataclass(frozen=True)
class BenchCounters:
    """The engine's own counters bench reads beside its requests."""

    #: Its count of generated tokens, all requests (None: it has none).
    generated: str | None = None
    #: Its count of prompt tokens served from its prefix cache (None: it has none).
    prefix_hits: str | None = None
    #: The prefix of its per-request timing histograms (``request_time_per_output_token_
    #: seconds``, ``inter_token_latency_seconds``, ``time_to_first_token_seconds``; None:
    #: it exports none).
    timing_prefix: str | None = None


@dataclass(frozen=True)
class BinaryPreflight:
    """Preflight of an engine that is a built program, not a Python package: its server
    binary (on the image's PATH, or one given with ``--server``) is asked on the CPU what it
    can say without a GPU (preflight/binary: the version it was built as, its own flag parser
    on each profile's launch line, the profile's model file read and loaded on the CPU), and
    the report says what that cannot show (:attr:`cannot`)."""

    server: str  # the program's name on the image's PATH
    version_args: tuple[str, ...]
    #: The version in the program's ``version_args`` output (group ``version``).
    version: re.Pattern[str]
    #: Output that means the flag parser refused the launch line (group ``why``).
    refused: re.Pattern[str]
    #: Output that means the parser took the line and the model load began.
    parsed: re.Pattern[str]
    #: Output that means the model is loaded (the program serves it).
    loaded: re.Pattern[str]
    #: Flags that load a model on the CPU and nothing more (no GPU layers, no warm-up).
    cpu_args: tuple[str, ...]
    #: The model file format it reads (its header is read before the program loads it).
    model_format: Literal["gguf"]
    #: The file of the tree that names the model architectures the release knows, and how
    #: one is written there (group ``name``).
    architectures: str
    architecture: re.Pattern[str]
    #: What the CPU cannot show of this engine (said in every report).
    cannot: str


@dataclass(frozen=True)
class MemoryFacts:
    """How the engine sizes its memory, for the estimate before a boot
    (:mod:`sparkbuild.engines.memory_fit`, whose docstring has the formulas)."""

    #: The flag of the engine's static budget (a fraction of the memory), and its default.
    budget_flag: str
    budget_default: float
    context_flag: str
    #: The first release that counts the draft inside the budget before sizing the KV pool
    #: (None: every release does).
    draft_counted_from: Version | None = None
    #: The draft loads its own bf16 embedding and lm_head before it shares the target's.
    draft_head_transient: bool = False
    #: What lands outside the budget besides the draft (GiB): the runtime around the engine
    #: where its budget does not count it, and what the host itself keeps.
    reserve_gib: float = 13.0
    #: A flag that sizes the KV pool in bytes instead of the budget's fraction (None: none).
    kv_bytes_flag: str | None = None
    #: The flag of the KV cache's element type (None: the engine's KV is the model's dtype).
    kv_dtype_flag: str | None = "--kv-cache-dtype"
    #: sparkbuild's patch (a file name in ``patches/<engine>/``) that counts the draft before
    #: the KV pool is sized, for releases before ``draft_counted_from`` (None: no such patch).
    draft_patch: str | None = None


@dataclass(frozen=True)
class RecipeFacts:
    """How sparkrun's recipes (Spark Arena) name and launch the engine (sparkrun's
    RECIPES.md and ``core/recipe.py``; see :mod:`sparkbuild.engines.recipes`)."""

    #: sparkrun's runtime names for this engine, each with the multi-node launcher it means.
    runtimes: Mapping[str, str]
    #: The serve commands' prefixes (the first is the one a recipe without a command gets).
    prefixes: tuple[tuple[str, ...], ...]
    model_flags: tuple[str, ...]
    #: ``defaults`` keys sparkrun renders into flags when a recipe has no ``command``.
    rendered_keys: Mapping[str, str]
    #: The rendered keys whose flags are toggles: given for a true value, else left out.
    toggles: frozenset[str]
    #: Flags whose values make the parallel layout, and what each sets.
    parallel_flags: Mapping[str, str]
    speculative_flags: tuple[str, ...]
    #: The serve command a recipe sparkbuild exports starts with (``{model}``: sparkrun fills
    #: it); the parallel sizes follow as the rendered keys' flags.
    export_command: str
    #: The ``defaults`` key a recipe asks for speculation with (None: the engine has none).
    speculative_key: str | None = None
    #: ``defaults`` keys sparkrun renders before the rest, as its first flags (vLLM's ``-tp``).
    leading_keys: tuple[str, ...] = ()
    #: sparkrun pins a hub model's ``model_revision`` on the command (``--revision``).
    pins_revision: bool = False
    #: The flag sparkrun adds with the recipe's model name when a recipe's command has none
    #: (vLLM's ``--served-model-name``; None: sparkrun adds none).
    adds_served_model_flag: str | None = None
    #: The runtime an exported recipe names for each multi-node launcher (the first: none set).
    export_runtimes: Mapping[str, str] = field(default_factory=dict)
    #: The flags the launcher adds for expert parallelism (``{ep}``: the size).
    expert_parallel_args: tuple[str, ...] = ()
    #: A command naming this engine when the recipe names no runtime (None: only the default).
    command: re.Pattern[str] | None = None
    #: sparkrun's runtime when a recipe names none and its command names no other.
    default: bool = False
    #: Expert parallel spans the whole tensor-parallel group (a recipe's ep is then tp).
    ep_is_tp: bool = False
