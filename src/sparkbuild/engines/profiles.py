"""Smoke profiles (``smoke/<name>.yaml``): what to serve and what a healthy engine must show.

The schema is documented for profile authors in docs/smoke.md.
"""

from __future__ import annotations

import os
import re
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkbuild.adapters import EngineName, LauncherName
from sparkbuild.engines.memory_floor import parse_floor
from sparkbuild.engines.prompts import PROMPT_SETS, PromptSetName
from sparkbuild.errors import SpecError
from sparkbuild.settings import MAX_WAIT_S, Settings
from sparkbuild.yamlfile import load_model, named_file

FinishReason = Literal["stop", "length", "any"]


class _Strict(BaseModel):
    # allow_inf_nan=False: a NaN timeout waits forever and a NaN limit compares false.
    model_config = ConfigDict(extra="forbid", frozen=True, allow_inf_nan=False)


class CustomPrompt(_Strict):
    """A prompt of the profile's own, next to the built-in sets."""

    text: str = Field(min_length=1)
    name: str | None = None
    # A prompt that asks for repetition (e.g. to exercise an n-gram drafter) is exempt from
    # the degenerate-repetition check.
    expect_repetition: bool = False


class RepetitionLimits(_Strict):
    """Degenerate output: too many repeated n-grams among the generated tokens."""

    ngram: int = Field(default=8, ge=2, le=64)
    max_repeated_fraction: float = Field(default=0.6, gt=0.0, le=1.0)
    min_tokens: int = Field(default=32, ge=1)  # shorter outputs are not judged


class ContainerSettings(_Strict):
    """How ``--image`` runs the engine."""

    gpus: str | None = "all"  # docker --gpus value; "none" or null for no GPU
    ipc: str = "host"
    shm_size: str | None = "16g"  # used when ipc is not "host"
    model_dir: Path | None = None  # host dir mounted read-only (default: see docs/smoke.md)
    model_mount: str = "/models"
    launcher: list[str] | None = None  # entrypoint; default: the engine's server module
    port: int | None = Field(default=None, gt=0, lt=65536)  # in the container
    mounts: list[str] = []  # extra "HOST:CONTAINER[:ro|rw]" bind mounts
    env: dict[str, str] = {}  # container-only environment (added to the profile's env)

    @field_validator("mounts")
    @classmethod
    def _mounts(cls, values: list[str]) -> list[str]:
        for value in values:
            parts = value.split(":")
            if len(parts) not in (2, 3) or not parts[0] or not parts[1]:
                raise ValueError(f"'{value}' is not HOST:CONTAINER[:ro|rw]")
            if len(parts) == 3 and parts[2] not in ("ro", "rw"):
                raise ValueError(f"'{value}': mode must be 'ro' or 'rw'")
        return values


class LosslessLimits(_Strict):
    """``lossless``: greedy text with speculation equals the text without it (docs/smoke.md).

    The speculative run is the smoke's own greedy requests, asked for ``top_logprobs``
    alternatives per token; the reference is the same requests on the engine booted again
    without speculation (the adapter drops its speculation flags), or a reference recorded
    earlier for the same image id, model and requests."""

    top_logprobs: int = Field(default=2, ge=2, le=20)
    # At the first differing token, a gap (the reference's top-1 logprob minus its logprob of
    # the token the speculative run chose) under this is a numerical tie: noted, not failed.
    tie_epsilon: float = Field(default=0.02, ge=0.0, le=1.0)
    seed: int = Field(default=0, ge=0)


class TextLimits(_Strict):
    """How a long text is judged (``long_output``, ``long_context``, ``chat``): in windows,
    for loops, runs of one token, restated sentences and characters that are not text."""

    window: int = Field(default=256, ge=16, le=8192)  # tokens per judged window
    max_run: int = Field(default=16, ge=2)  # one token id (or word) this many times in a row
    max_zero_run: int = Field(default=4, ge=2)  # token id 0 (decoded NaN logits) in a row
    min_short_loop_repeats: int = Field(default=3, ge=2)  # a 3-8 token span repeated in a row
    max_repeated_fraction: float = Field(default=0.6, gt=0.0, le=1.0)  # 8-grams, per window
    max_garbage_share: float = Field(default=0.05, ge=0.0, le=1.0)  # control, U+FFFD
    max_mixed_script_share: float = Field(default=0.05, ge=0.0, le=1.0)  # of words
    sentence_similarity: float = Field(default=0.75, gt=0.0, le=1.0)  # a restated sentence


class LongOutputLimits(TextLimits):
    """``long_output``: generations of ``max_tokens`` (cut to what the model's context allows
    after the prompt), each judged window by window."""

    max_tokens: int = Field(default=12000, ge=64, le=1 << 20)
    requests: int = Field(default=1, ge=1, le=16)
    prompt: str = Field(
        default="Write a long, detailed essay on the history of computing, from mechanical "
        "calculators to today's accelerators, one section per era.",
        min_length=1,
    )
    request: dict[str, object] = {}  # sampling for these requests only (over the profile's)


class AcceptancePerPositionLimits(_Strict):
    """``acceptance_per_position``: the share of drafts whose token at each position was
    accepted, from the engine's own counters; ``min_rates[i]`` is the floor at position i."""

    min_rates: list[float] = Field(default=[], max_length=64)

    @field_validator("min_rates")
    @classmethod
    def _rates(cls, values: list[float]) -> list[float]:
        if any(not 0.0 <= v <= 1.0 for v in values):
            raise ValueError("every rate is a share from 0 to 1")
        return values


class BurnInLimits(_Strict):
    """``burn_in``: the greedy requests for ``rounds`` rounds at ``concurrency``; every
    round's text equals the first's (ties as in ``lossless``)."""

    rounds: int = Field(default=3, ge=2, le=100)
    concurrency: int = Field(default=6, ge=1, le=256)
    top_logprobs: int = Field(default=2, ge=2, le=20)
    tie_epsilon: float = Field(default=0.02, ge=0.0, le=1.0)


class LongContextLimits(TextLimits):
    """``long_context``: one prompt of ``depth`` tokens (cut to the model's context), its
    answer checked for NaN logprobs, runs of one token id and an empty or cut answer."""

    depth: int = Field(default=131072, ge=64, le=1 << 22)
    max_tokens: int = Field(default=64, ge=8, le=4096)
    request: dict[str, object] = {}


class ChatLimits(TextLimits):
    """``chat``: requests through ``/v1/chat/completions`` (the model's chat template, the
    profile's reasoning parser); the answer's content and its reasoning judged apart."""

    max_tokens: int = Field(default=256, ge=8, le=32768)
    prompts: list[str] = Field(
        default=[
            "In three sentences, why does a GPU inference server batch requests?",
            "Name four prime numbers and say what makes each prime.",
        ],
        min_length=1,
    )
    request: dict[str, object] = {}


class CompileLimits(_Strict):
    """``compile``: the most a boot may spend compiling (torch.compile, Triton, FlashInfer's
    JIT) while the compile cache grows; past it the boot is stopped and fails, naming what
    was compiling (docs/smoke.md, "Compile cache")."""

    max_seconds: float = Field(gt=0, le=MAX_WAIT_S)


class Expectations(_Strict):
    boot_timeout_s: float = Field(default=900.0, gt=0, le=MAX_WAIT_S)
    # Per request; a request that times out ends the run (a hung engine answers no others),
    # so the request phase is bounded by about this plus the answers before it.
    request_timeout_s: float = Field(default=300.0, gt=0, le=MAX_WAIT_S)
    speculation: bool = True
    # None: strictly greater than 1.0 (at least one draft token accepted on average).
    min_accept_len: float | None = Field(default=None, ge=1.0)
    max_tokens: int = Field(default=128, ge=1, le=32768)
    finish: FinishReason = "length"
    repetition: RepetitionLimits | None = RepetitionLimits()
    nan_counter: bool = True  # fail on the engine's own NaN counter when it has one
    # Turn on the NaN detection the engine version under test reads (the engine's adapter module);
    # a profile never names the variable itself, since it changes between releases.
    nan_switch: bool = True
    max_error_lines: int = Field(default=0, ge=0)
    # The memory guard's floor on each node (engines/memory_floor: 8, 512MiB, 5%, off);
    # None: --memory-floor, else the DGX Spark default.
    memory_floor: str | None = None
    # The deep checks (docs/smoke.md, "Deep checks"): a profile declares the ones it runs and
    # their limits (`lossless: {}` takes the defaults); `smoke --deep` runs every one, the
    # undeclared with their defaults. Publish requires a pass of each one declared here.
    lossless: LosslessLimits | None = None
    long_output: LongOutputLimits | None = None
    acceptance_per_position: AcceptancePerPositionLimits | None = None
    burn_in: BurnInLimits | None = None
    long_context: LongContextLimits | None = None
    chat: ChatLimits | None = None
    compile: CompileLimits | None = None

    @field_validator("memory_floor")
    @classmethod
    def _floor(cls, value: str | None) -> str | None:
        if value is not None:
            parse_floor(value)  # a ValueError names the forms it takes
        return value

    def declared_deep(self) -> tuple[str, ...]:
        """The deep checks this profile declares, by check name."""
        return tuple(
            check for check, field_name in DEEP_FIELDS.items() if getattr(self, field_name)
        )


#: Each deep check's name (as a CheckResult, in the lock and the report) and its field in
#: ``expect``.
DEEP_FIELDS = {
    "lossless": "lossless",
    "long-output": "long_output",
    "acceptance-per-position": "acceptance_per_position",
    "burn-in": "burn_in",
    "long-context": "long_context",
    "chat": "chat",
}


class RecipeSource(_Strict):
    """The Spark Arena / sparkrun recipe a profile was imported from (``sparkbuild profile
    import``, engines/recipes.py): where it came from, its bytes, and what the profile does
    not hold of it."""

    file: str = Field(min_length=1)  # as given at import (credentials removed from a URL)
    name: str = Field(min_length=1)
    sha256: str = Field(pattern=r"^[0-9a-f]{64}$")
    recipe_version: str
    runtime: str  # as sparkrun resolves it: vllm-distributed, vllm-ray, sglang, ...
    container: str | None = None
    not_carried: list[str] = []


class Parallel(_Strict):
    """How the engine is spread: over how many nodes, and its tensor, expert and pipeline
    parallel sizes. Bench reports and claims carry it as their topology, so a TP=4 figure is
    held only against a TP=4 run."""

    nodes: int = Field(default=1, ge=1, le=8)
    tp: int = Field(default=1, ge=1, le=64)
    ep: int = Field(default=1, ge=1, le=64)
    pp: int = Field(default=1, ge=1, le=64)
    # The engine's multi-node runtime, one its adapter names (`parallel_launchers`, the first
    # its default): vLLM `mp` (--nnodes/--node-rank, headless workers) or `ray`; SGLang has
    # one (`native`: --nnodes/--node-rank/--dist-init-addr).
    launcher: LauncherName | None = None

    @model_validator(mode="after")
    def _fits(self) -> Parallel:
        if (self.tp * self.pp) % self.nodes:
            raise ValueError(
                f"tp x pp = {self.tp * self.pp} ranks do not spread evenly over {self.nodes} nodes"
            )
        if self.ep > 1 and self.tp % self.ep:
            raise ValueError(f"ep {self.ep} does not divide tp {self.tp}")
        return self

    def label(self) -> str:
        words = [f"nodes={self.nodes}", f"tp={self.tp}", f"ep={self.ep}"]
        return " ".join([*words, f"pp={self.pp}"] if self.pp > 1 else words)

    def same_layout(self, other: Parallel) -> bool:
        """Whether two topologies are the same figure's topology (the launcher aside)."""
        fields = ("nodes", "tp", "ep", "pp")
        return all(getattr(self, f) == getattr(other, f) for f in fields)


def _default_prompts() -> list[PromptSetName | CustomPrompt]:
    return ["code", "prose", "repetitive"]


class SmokeProfile(_Strict):
    engine: EngineName
    model: str = Field(min_length=1)
    description: str | None = None
    args: list[str] = []  # serve flags after model/host/port
    env: dict[str, str] = {}
    prompts: list[PromptSetName | CustomPrompt] = Field(
        default_factory=_default_prompts, min_length=1
    )
    request: dict[str, object] = {}  # extra fields merged into every request's sampling params
    # Fields of the deep checks' own requests (long-output, long-context, chat) over
    # `request`; each check's `request` goes over these.
    deep_request: dict[str, object] = {}
    expect: Expectations = Expectations()
    container: ContainerSettings = ContainerSettings()
    recipe: RecipeSource | None = None  # set by `sparkbuild profile import`
    parallel: Parallel = Parallel()

    @field_validator("args", mode="before")
    @classmethod
    def _args_as_strings(cls, value: object) -> object:
        # YAML turns `- 1024` into an int; flags are strings on a command line.
        if isinstance(value, list):
            return [
                str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v
                for v in value
            ]
        return value


_ENV_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)(?::-([^}]*))?\}")


def expand_env(value: str, where: str) -> str:
    """``${NAME}`` and ``${NAME:-default}`` from the environment; unset without default errors."""

    def replace(match: re.Match[str]) -> str:
        name, default = match.group(1), match.group(2)
        if name in os.environ:
            return os.environ[name]
        if default is not None:
            return default
        raise SpecError(
            f"{where}: environment variable {name} is not set",
            f"set {name}, or pass --model PATH",
        )

    return _ENV_REF.sub(replace, value)


def profile_path(settings: Settings, name_or_path: str) -> Path:
    """A profile by name (``smoke/<name>.yaml``) or by path."""
    return named_file(
        settings.smoke_dir,
        name_or_path,
        file_kind="profile file",
        name_kind="smoke profile",
        known="known profiles",
        otherwise="pass a profile file path",
    )


def resolve_model(
    profile: SmokeProfile, path: Path, override: str | None, *, required: bool = True
) -> str:
    """The model to serve: ``--model`` wins; env references expanded; relative paths that
    exist next to the profile become absolute. With ``required=False`` (an engine that is
    already running chose its model) an unset variable leaves the text as written."""
    try:
        raw = override if override is not None else expand_env(profile.model, f"{path}: model")
    except SpecError:
        if required:
            raise
        return profile.model
    local = Path(raw).expanduser()
    if not local.is_absolute() and override is None and (path.parent / local).exists():
        return str((path.parent / local).resolve())
    if local.exists():
        return str(local.resolve())
    return raw


def load_profile(
    settings: Settings, name_or_path: str, *, model: str | None = None, need_model: bool = True
) -> tuple[str, SmokeProfile]:
    """(profile name, profile) with the model resolved (``model`` overrides the file's)."""
    path = profile_path(settings, name_or_path)
    profile = load_model(path, SmokeProfile)
    resolved = resolve_model(profile, path, model, required=need_model)
    return path.stem, profile.model_copy(update={"model": resolved})


__all__ = [
    "DEEP_FIELDS",
    "PROMPT_SETS",
    "AcceptancePerPositionLimits",
    "BurnInLimits",
    "ChatLimits",
    "ContainerSettings",
    "CustomPrompt",
    "Expectations",
    "LongContextLimits",
    "LongOutputLimits",
    "LosslessLimits",
    "Parallel",
    "RecipeSource",
    "RepetitionLimits",
    "SmokeProfile",
    "TextLimits",
    "load_profile",
]
