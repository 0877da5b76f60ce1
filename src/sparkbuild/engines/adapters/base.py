"""What sparkbuild knows about each engine's HTTP API, metrics and log lines.

An adapter turns one engine's dialect into common values: how to launch and probe it,
one greedy generation with logprobs (:class:`Generation`), a snapshot of its Prometheus
counters (:class:`Counters`), and the mean acceptance length of speculative decoding over an
interval (:class:`Acceptance`), from counter deltas or from per-request fields. The bench stage
uses the same calls per sweep cell: snapshot before, run, snapshot after, ``acceptance(...)``.

Formats (checked against SGLang 0.5.10/0.5.23 wheels and vLLM 0.32 on the CPU):

* vLLM: OpenAI ``/v1/completions`` with ``logprobs``; counters
  ``vllm:spec_decode_num_drafts_total`` and ``vllm:spec_decode_num_accepted_tokens_total``
  (mean acceptance length = 1 + Δaccepted / Δdrafts); ``vllm:corrupted_requests_total`` with
  ``VLLM_COMPUTE_NANS_IN_LOGITS=1``; log ``SpecDecoding metrics: Mean acceptance length: 2.31``.
* SGLang: native ``/generate`` with ``return_logprob``; ``meta_info.spec_verify_ct`` (all
  versions) and ``spec_accept_length`` = completion_tokens / spec_verify_ct; 0.5.10 adds
  ``spec_accept_token_num``/``spec_draft_token_num``; ``spec_num_correct_drafts`` is there
  from 0.5.12 (``managers/tokenizer_manager.py`` sets it in ``meta_info``). With
  ``--enable-metrics``: counter ``sglang:generation_tokens_total`` and gauge
  ``sglang:spec_accept_length``; ``sglang:spec_verify_calls_total`` only from 0.5.13, so an
  adapter for an older version never relies on it. Decode log ``accept len: 2.83``.
  ``/server_info`` ``internal_states[*].avg_spec_accept_length`` (a lifetime average, so
  only a hint) and ``version``.

The NaN switch differs by version too (:mod:`sparkbuild.engines.versions`): an adapter made
with the engine's version sets only what that version reads (:meth:`EngineAdapter.nan_switch`).
"""

from __future__ import annotations

import math
import re
import time
from abc import ABC, abstractmethod
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any, ClassVar

import requests
from packaging.version import Version
from prometheus_client.parser import text_string_to_metric_families

from sparkbuild.engines import versions
from sparkbuild.errors import EngineHTTPError, UsageError


@dataclass(frozen=True)
class Generation:
    """One completion, in engine-neutral terms."""

    prompt: str
    text: str
    finish_reason: str | None
    completion_tokens: int
    tokens: tuple[str, ...]  # token strings (vLLM) or ids (SGLang), for repetition checks
    logprobs: tuple[float | None, ...]  # of each generated token; None where the engine sent null
    seconds: float
    spec_verify_ct: int | None = None  # SGLang: verify steps for this request
    spec_accept_length: float | None = None
    raw: Mapping[str, Any] = field(default_factory=dict, repr=False)


@dataclass(frozen=True)
class Counters:
    """Prometheus samples summed over label sets, keyed by sample name (``..._total``)."""

    values: Mapping[str, float]
    available: bool = True  # False when /metrics could not be read
    taken_at: float = 0.0
    problem: str = ""  # why not available, naming the endpoint
    malformed: bool = False  # the engine answered /metrics, with something that is not Prometheus

    def get(self, name: str) -> float | None:
        return self.values.get(name)

    def delta(self, before: Counters, name: str) -> float | None:
        after_value = self.values.get(name)
        if after_value is None:
            return None
        return after_value - (before.values.get(name) or 0.0)


@dataclass(frozen=True)
class Acceptance:
    """Mean acceptance length over an interval (tokens per verify step, bonus token included).

    ``active`` is False when the engine shows no speculative decoding at all; ``accept_len``
    is None then. ``source`` names where the number came from.
    """

    active: bool
    accept_len: float | None
    source: str
    steps: float = 0.0  # drafts (vLLM) or verify calls (SGLang)
    tokens: float = 0.0  # accepted draft tokens (vLLM) or generated tokens (SGLang)
    detail: str = ""


def parse_prometheus(text: str) -> dict[str, float]:
    """Sample values by name, summed over label sets (counters of all engines/ranks)."""
    values: dict[str, float] = {}
    for family in text_string_to_metric_families(text):
        for sample in family.samples:
            values[sample.name] = values.get(sample.name, 0.0) + float(sample.value)
    return values


def _no_counters(problem: str) -> Counters:
    return Counters({}, available=False, taken_at=time.monotonic(), problem=problem)


def _short(text: str, limit: int = 120) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def whole_number(value: Any, name: str) -> int:
    """An engine's count field; a string, float or list there is a malformed response."""
    if value is None:
        return 0
    if isinstance(value, bool) or not isinstance(value, int | float):
        raise ValueError(f"{name} is {_short(repr(value), 40)}, not a whole number")
    if isinstance(value, float) and not value.is_integer():
        raise ValueError(f"{name} is {value!r}, not a whole number")
    return int(value)


def first_model(payload: Any) -> Mapping[str, Any]:
    """The first entry of an OpenAI ``/v1/models`` answer, or ValueError saying what is off."""
    if not isinstance(payload, Mapping):
        raise ValueError(f"the answer is a JSON {type(payload).__name__}, not an object")
    data = payload.get("data")
    if not isinstance(data, list) or not data:
        raise ValueError(f"'data' is {_short(repr(data), 40)}, not a non-empty list")
    first = data[0]
    if not isinstance(first, Mapping) or not isinstance(first.get("id"), str):
        raise ValueError(f"data[0] is {_short(repr(first), 60)}, not a model with an 'id'")
    return first


def parse_or_fail(what: str, parse: Callable[[], Generation]) -> Generation:
    """Run ``parse`` over a 200 answer; a wrong shape becomes EngineHTTPError naming ``what``."""
    try:
        return parse()
    except (TypeError, ValueError, AttributeError, KeyError, IndexError) as exc:
        raise EngineHTTPError(what, 200, f"malformed response: {_short(str(exc))}") from exc


def non_finite(values: Iterable[float | None]) -> int:
    """How many logprobs are null, NaN or infinite."""
    return sum(1 for v in values if v is None or not math.isfinite(v))


def last_float(pattern: re.Pattern[str], lines: Sequence[str]) -> float | None:
    """The number captured by ``pattern`` in the last line that matches it."""
    for line in reversed(lines):
        match = pattern.search(line)
        if match:
            return float(match.group(1))
    return None


class EngineAdapter(ABC):
    """One engine's launch flags, endpoints, counters and log formats."""

    name: ClassVar[str]
    default_port: ClassVar[int]
    default_launcher: ClassVar[tuple[str, ...]]
    health_path: ClassVar[str] = "/health"
    metrics_path: ClassVar[str] = "/metrics"
    ready_line: ClassVar[re.Pattern[str]]
    #: Log lines that mean NaN/inf logits were seen.
    nan_line: ClassVar[re.Pattern[str]]
    #: Log lines that mean something went wrong while serving.
    error_line: ClassVar[re.Pattern[str]]
    #: An HTTP error body that means the response held NaN/inf (it could not be serialized).
    nan_response: ClassVar[re.Pattern[str]] = re.compile(
        r"Out of range float values are not JSON compliant|\bNaN\b"
    )
    #: The engine's periodic acceptance-length log line (group 1: the value).
    accept_line: ClassVar[re.Pattern[str]]

    def __init__(self, request_timeout_s: float = 300.0, version: Version | None = None) -> None:
        self.request_timeout_s = request_timeout_s
        self.version = version  # of the engine under test, when known

    def nan_switch(self) -> versions.NanSwitch:
        """The NaN detection this engine version reads (environment and flags to add)."""
        return versions.UNKNOWN_VERSION

    def ignored_variables(self, env: Mapping[str, str]) -> list[str]:
        """Variables in ``env`` that this engine version is known not to read."""
        return []

    @abstractmethod
    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        """Arguments after the launcher: model, bind address and the profile's flags."""

    @abstractmethod
    def generate(
        self,
        session: requests.Session,
        base_url: str,
        prompt: str,
        max_tokens: int,
        extra: Mapping[str, Any] | None = None,
    ) -> Generation:
        """One greedy completion with logprobs; raises EngineHTTPError on an HTTP failure."""

    @abstractmethod
    def acceptance_from_delta(self, before: Counters, after: Counters) -> Acceptance:
        """Acceptance over the interval between two counter snapshots."""

    def acceptance_from_generations(self, generations: Sequence[Generation]) -> Acceptance | None:
        """Acceptance from per-request fields, when the engine returns them (None otherwise)."""
        return None

    def acceptance(
        self, before: Counters, after: Counters, generations: Sequence[Generation] = ()
    ) -> Acceptance:
        """The best measurement available: per-request fields, else counter deltas."""
        per_request = self.acceptance_from_generations(generations)
        if per_request is not None and per_request.active:
            return per_request
        return self.acceptance_from_delta(before, after)

    def nan_count_from_delta(self, before: Counters, after: Counters) -> float | None:
        """Requests the engine flagged as NaN/corrupted in the interval (None: no counter)."""
        return None

    def acceptance_from_log(self, lines: Sequence[str]) -> float | None:
        """The last acceptance length the engine logged (a lifetime/windowed figure)."""
        return last_float(self.accept_line, lines)

    def snapshot_counters(self, session: requests.Session, base_url: str) -> Counters:
        """All Prometheus samples of the engine right now."""
        where = f"GET {base_url}{self.metrics_path}"
        try:
            response = session.get(base_url + self.metrics_path, timeout=10)
        except requests.RequestException as exc:
            return _no_counters(f"{where}: no response ({type(exc).__name__})")
        if response.status_code != 200:
            return _no_counters(f"{where}: HTTP {response.status_code}")
        try:
            values = parse_prometheus(response.text)
        except (ValueError, TypeError, IndexError) as exc:
            problem = f"{where}: not Prometheus text ({_short(str(exc))})"
            return Counters({}, False, time.monotonic(), problem, malformed=True)
        return Counters(values, taken_at=time.monotonic())

    def _post(
        self, session: requests.Session, url: str, body: Mapping[str, Any]
    ) -> tuple[dict[str, Any], float]:
        started = time.monotonic()
        try:
            response = session.post(url, json=body, timeout=self.request_timeout_s)
        except requests.Timeout as exc:
            raise EngineHTTPError(
                f"POST {url}",
                None,
                f"no answer within {self.request_timeout_s:g} s (request timeout)",
                timed_out=True,
            ) from exc
        except requests.RequestException as exc:
            raise EngineHTTPError(f"POST {url}", None, str(exc)) from exc
        seconds = time.monotonic() - started
        if response.status_code != 200:
            raise EngineHTTPError(f"POST {url}", response.status_code, response.text)
        try:
            payload = response.json()  # Python's json reads NaN/Infinity literals too
        except ValueError as exc:
            raise EngineHTTPError(f"POST {url}", response.status_code, "not JSON") from exc
        if not isinstance(payload, dict):
            raise EngineHTTPError(f"POST {url}", response.status_code, "not a JSON object")
        return payload, seconds


class VllmAdapter(EngineAdapter):
    name = "vllm"
    default_port = 8000
    default_launcher = ("python3", "-m", "vllm.entrypoints.openai.api_server")
    ready_line = re.compile(r"Starting vLLM (API |)server on|Application startup complete")
    nan_line = re.compile(r"\bNaNs? (?:detected|found|in (?:the )?(?:logits|logprobs))", re.I)
    error_line = re.compile(
        r"(?:^|[\s)])ERROR\b|Traceback \(most recent call last\)|EngineDeadError"
    )
    accept_line = re.compile(r"Mean acceptance length:\s*([0-9.]+)")

    DRAFTS = "vllm:spec_decode_num_drafts_total"
    DRAFT_TOKENS = "vllm:spec_decode_num_draft_tokens_total"
    ACCEPTED = "vllm:spec_decode_num_accepted_tokens_total"
    CORRUPTED = "vllm:corrupted_requests_total"

    def __init__(self, request_timeout_s: float = 300.0, version: Version | None = None) -> None:
        super().__init__(request_timeout_s, version)
        self._served_model: str | None = None

    def nan_switch(self) -> versions.NanSwitch:
        return versions.VLLM_NAN_SWITCH

    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        return ["--model", model, "--host", host, "--port", str(port), *args]

    def served_model(self, session: requests.Session, base_url: str) -> str:
        """The name requests must use (``--served-model-name`` or the model path)."""
        if self._served_model is None:
            try:
                response = session.get(base_url + "/v1/models", timeout=10)
                response.raise_for_status()
                self._served_model = str(first_model(response.json())["id"])
            except requests.RequestException as exc:
                raise EngineHTTPError(f"GET {base_url}/v1/models", None, str(exc)) from exc
            except ValueError as exc:  # not JSON, or JSON of the wrong shape
                raise EngineHTTPError(
                    f"GET {base_url}/v1/models", 200, f"malformed response: {exc}"
                ) from exc
        return self._served_model

    def generate(
        self,
        session: requests.Session,
        base_url: str,
        prompt: str,
        max_tokens: int,
        extra: Mapping[str, Any] | None = None,
    ) -> Generation:
        body: dict[str, Any] = {
            "model": self.served_model(session, base_url),
            "prompt": prompt,
            "max_tokens": max_tokens,
            "temperature": 0,
            "logprobs": 1,
            **(extra or {}),
        }
        url = base_url + "/v1/completions"
        payload, seconds = self._post(session, url, body)
        return parse_or_fail(
            f"POST {url}", lambda: self.generation_from_response(prompt, payload, seconds)
        )

    @staticmethod
    def generation_from_response(
        prompt: str, payload: Mapping[str, Any], seconds: float = 0.0
    ) -> Generation:
        """A /v1/completions response as a Generation; TypeError/ValueError on a wrong shape."""
        choice = (payload.get("choices") or [{}])[0]
        logprobs = choice.get("logprobs") or {}
        usage = payload.get("usage") or {}
        return Generation(
            prompt=prompt,
            text=str(choice.get("text") or ""),
            finish_reason=choice.get("finish_reason"),
            completion_tokens=whole_number(usage.get("completion_tokens"), "completion_tokens"),
            tokens=tuple(str(t) for t in logprobs.get("tokens") or ()),
            logprobs=tuple(_number(v) for v in logprobs.get("token_logprobs") or ()),
            seconds=seconds,
            raw=payload,
        )

    def acceptance_from_delta(self, before: Counters, after: Counters) -> Acceptance:
        drafts = after.delta(before, self.DRAFTS)
        accepted = after.delta(before, self.ACCEPTED)
        if not after.available:
            return Acceptance(
                False, None, "counters", detail=after.problem or "/metrics not readable"
            )
        if drafts is None or accepted is None:
            return Acceptance(False, None, "counters", detail="no spec_decode counters on /metrics")
        if drafts <= 0:
            return Acceptance(
                False, None, "counters", detail="no drafts proposed during the requests"
            )
        return Acceptance(True, 1.0 + accepted / drafts, "counters", drafts, accepted)

    def nan_count_from_delta(self, before: Counters, after: Counters) -> float | None:
        return after.delta(before, self.CORRUPTED)


class SglangAdapter(EngineAdapter):
    name = "sglang"
    default_port = 30000
    default_launcher = ("python3", "-m", "sglang.launch_server")
    ready_line = re.compile(r"The server is fired up and ready to roll")
    nan_line = re.compile(r"NaN detected|NaN in the logits|Detected errors during sampling", re.I)
    error_line = re.compile(
        r"hit an exception|Traceback \(most recent call last\)|\bERROR\b|CUDA error"
    )
    accept_line = re.compile(r"\baccept len:\s*([0-9.]+)")

    VERIFY_CALLS = "sglang:spec_verify_calls_total"
    GENERATED = "sglang:generation_tokens_total"
    ACCEPT_GAUGE = "sglang:spec_accept_length"

    def nan_switch(self) -> versions.NanSwitch:
        return versions.sglang_nan_switch(self.version)

    @classmethod
    def preflight_signals(cls, version: Version | str | None) -> list[dict[str, str]]:
        """Every metric and response field this adapter relies on for SGLang ``version``."""
        parsed = versions.parse_version(str(version)) if version is not None else None
        fields = ("completion_tokens", "spec_verify_ct", "spec_accept_length")
        signals = [
            {"name": f, "kind": "field", "used_for": "acceptance per request"} for f in fields
        ]
        if versions.sglang_has_verify_counter(parsed):
            signals += [
                {"name": cls.VERIFY_CALLS, "kind": "metric",
                 "used_for": "acceptance from counters"},
                {"name": cls.GENERATED, "kind": "metric",
                 "used_for": "acceptance from counters"},
            ]  # fmt: skip
        return signals

    def ignored_variables(self, env: Mapping[str, str]) -> list[str]:
        if self.version is None:
            return []
        return versions.sglang_ignored_variables(self.version, env)

    def serve_args(self, model: str, host: str, port: int, args: Sequence[str]) -> list[str]:
        extra = [] if "--enable-metrics" in args else ["--enable-metrics"]
        return ["--model-path", model, "--host", host, "--port", str(port), *extra, *args]

    def generate(
        self,
        session: requests.Session,
        base_url: str,
        prompt: str,
        max_tokens: int,
        extra: Mapping[str, Any] | None = None,
    ) -> Generation:
        body = {
            "text": prompt,
            "sampling_params": {"max_new_tokens": max_tokens, "temperature": 0, **(extra or {})},
            "return_logprob": True,
        }
        url = base_url + "/generate"
        payload, seconds = self._post(session, url, body)
        return parse_or_fail(
            f"POST {url}", lambda: self.generation_from_response(prompt, payload, seconds)
        )

    @staticmethod
    def generation_from_response(
        prompt: str, payload: Mapping[str, Any], seconds: float = 0.0
    ) -> Generation:
        """A /generate response (any version from 0.5.10 on) as a Generation."""
        meta = payload.get("meta_info") or {}
        finish = meta.get("finish_reason")
        reason = finish.get("type") if isinstance(finish, Mapping) else finish
        entries = meta.get("output_token_logprobs") or []
        verify = meta.get("spec_verify_ct")
        length = meta.get("spec_accept_length")
        return Generation(
            prompt=prompt,
            text=str(payload.get("text") or ""),
            finish_reason=reason,
            completion_tokens=whole_number(meta.get("completion_tokens"), "completion_tokens"),
            tokens=tuple(str(e[1]) for e in entries if len(e) > 1),
            logprobs=tuple(_number(e[0]) for e in entries if e),
            seconds=seconds,
            spec_verify_ct=whole_number(verify, "spec_verify_ct") if verify is not None else None,
            spec_accept_length=_number(length) if length is not None else None,
            raw=payload,
        )

    def acceptance_from_generations(self, generations: Sequence[Generation]) -> Acceptance | None:
        """Σ completion_tokens / Σ spec_verify_ct over the requests that report speculation.

        Falls back to completion_tokens / spec_accept_length for a response that has the
        length but not the verify count.
        """
        tokens = steps = 0.0
        for generation in generations:
            if generation.spec_verify_ct:
                steps += generation.spec_verify_ct
                tokens += generation.completion_tokens
            elif generation.spec_accept_length:
                steps += generation.completion_tokens / generation.spec_accept_length
                tokens += generation.completion_tokens
        if steps <= 0:
            return None
        return Acceptance(True, tokens / steps, "per-request fields", steps, tokens)

    def acceptance_from_delta(self, before: Counters, after: Counters) -> Acceptance:
        if not after.available:
            return Acceptance(
                False,
                None,
                "counters",
                detail=after.problem or "/metrics not readable (start with --enable-metrics)",
            )
        if not versions.sglang_has_verify_counter(self.version):
            return Acceptance(
                False,
                None,
                "counters",
                detail=f"SGLang {self.version} has no {self.VERIFY_CALLS} (first in "
                f"{versions.SGLANG_VERIFY_COUNTER_SINCE}); per-request fields only",
            )
        verify = after.delta(before, self.VERIFY_CALLS)
        generated = after.delta(before, self.GENERATED)
        if verify is None or generated is None or verify <= 0:
            return Acceptance(
                False, None, "counters", detail="no speculative verify steps during the requests"
            )
        return Acceptance(True, generated / verify, "counters", verify, generated)

    @staticmethod
    def server_info_accept_length(server_info: Mapping[str, Any]) -> float | None:
        """``internal_states[*].avg_spec_accept_length`` (lifetime average; mean over DP ranks)."""
        states = server_info.get("internal_states") or []
        if not isinstance(states, list):
            return None
        found = [
            _number(state.get("avg_spec_accept_length"))
            for state in states
            if isinstance(state, Mapping)
        ]
        values = [v for v in found if v is not None and math.isfinite(v)]
        return sum(values) / len(values) if values else None

    def fetch_server_info(
        self, session: requests.Session, base_url: str
    ) -> Mapping[str, Any] | None:
        for path in ("/server_info", "/get_server_info"):
            try:
                response = session.get(base_url + path, timeout=10)
            except requests.RequestException:
                return None
            if response.status_code == 200:
                try:
                    data = response.json()
                except ValueError:  # a hint only: a garbled one is no hint
                    return None
                return data if isinstance(data, dict) else None
        return None


def _number(value: Any) -> float | None:
    if value is None:
        return None
    try:
        return float(value)
    except (TypeError, ValueError):
        return None


ADAPTERS: dict[str, type[EngineAdapter]] = {"vllm": VllmAdapter, "sglang": SglangAdapter}


def adapter_for(engine: str, **kwargs: Any) -> EngineAdapter:
    try:
        return ADAPTERS[engine](**kwargs)
    except KeyError:
        known = ", ".join(sorted(ADAPTERS))
        raise UsageError(f"unknown engine {engine!r}; known engines: {known}") from None
