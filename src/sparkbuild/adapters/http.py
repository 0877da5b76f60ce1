"""An engine's HTTP dialect: the one place that writes its endpoints and request bodies.

Smoke, the deep checks and bench ask an adapter (these methods, which every adapter has)
for what the engine serves, how many tokens a text is, the text of token ids, its version,
its counters and the body of a streamed completion; none of them writes a path or a body of
its own. The defaults are the OpenAI-style API with the extras vLLM and SGLang share
(``/tokenize`` with ``model`` and ``prompt``, answering ``count`` and ``max_model_len``); an
engine that speaks otherwise overrides what differs, in its own module.
"""

from __future__ import annotations

import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import ClassVar

import requests

from sparkbuild import jsontext, net
from sparkbuild.adapters.values import (
    Counters,
    first_model,
    no_counters,
    parse_counters,
    parse_or_fail,
    reported_version,
    shortened,
    whole_number,
)
from sparkbuild.errors import EngineHTTPError

#: The longest context an engine may say it serves.
MAX_MODEL_LEN = 1 << 31


@dataclass(frozen=True)
class Endpoints:
    """The paths of an engine's HTTP API (relative to its base URL)."""

    health: str = "/health"
    metrics: str = "/metrics"
    models: str = "/v1/models"
    completions: str = "/v1/completions"
    chat: str = "/v1/chat/completions"
    tokenize: str = "/tokenize"
    detokenize: str = "/detokenize"
    #: Where the engine reports its version, tried in order (vLLM and SGLang each answer one).
    version: tuple[str, ...] = ("/version", "/get_server_info", "/server_info")


@dataclass(frozen=True)
class ServedModel:
    """The model a running engine serves, as its model list says."""

    id: str
    owned_by: str = ""
    max_model_len: int | None = None  # None: the engine does not say


@dataclass(frozen=True)
class TokenCount:
    """How many tokens a text is to the served model, and its context when the engine says."""

    count: int
    context: int | None = None


class EngineHTTP:
    """The HTTP side of :class:`~sparkbuild.adapters.base.EngineAdapter` (see the module)."""

    name: ClassVar[str]
    endpoints: ClassVar[Endpoints] = Endpoints()
    #: Top-level fields of an answer that carry the engine's own per-response facts (draft
    #: counts, timings): what a streamed answer keeps for :meth:`acceptance_from_responses`.
    response_extras: ClassVar[tuple[str, ...]] = ()

    def __init__(self, request_timeout_s: float = 300.0) -> None:
        self.request_timeout_s = request_timeout_s
        self._served: ServedModel | None = None

    def session(self) -> net.Session:
        """An HTTP session for this engine: no exchange outlives the request timeout."""
        return net.Session(deadline_s=self.request_timeout_s)

    def request_model(self, session: net.Session, base_url: str) -> str:
        """The model name an OpenAI-style request names (engines that serve one model take
        any)."""
        return "default"

    # --- what the engine serves ----------------------------------------------------------

    def served(self, session: net.Session, base_url: str) -> ServedModel:
        """The first model the engine lists (asked once); EngineHTTPError on any failure."""
        if self._served is None:
            where = f"GET {base_url}{self.endpoints.models}"
            payload = self.get_json(session, base_url + self.endpoints.models)
            entry = parse_or_fail(where, lambda: first_model(payload))
            self._served = parse_or_fail(where, lambda: self.served_model_of(entry))
        return self._served

    def served_model_of(self, entry: Mapping[str, object]) -> ServedModel:
        """A model list's entry as a :class:`ServedModel` (vLLM writes ``max_model_len``
        there); ValueError on an impossible length."""
        length = entry.get("max_model_len")
        limit = whole_number(length, "max_model_len", MAX_MODEL_LEN) if length else None
        return ServedModel(str(entry["id"]), str(entry.get("owned_by") or ""), limit or None)

    def owns(self, entry: Mapping[str, object]) -> bool:
        """Whether a model list's entry names this engine as its server (``owned_by``)."""
        return entry.get("owned_by") == self.name

    def server_version(self, session: net.Session, base_url: str) -> str | None:
        """The version the running server reports, or None when it reports none."""
        for path in self.endpoints.version:
            try:
                response = session.get(base_url + path, timeout=10)
                ok = response.status_code == 200
                value = reported_version(jsontext.loads(response.content)) if ok else None
            except (requests.RequestException, ValueError, RecursionError):  # nested too deep
                continue
            if value:
                return value
        return None

    # --- tokens ----------------------------------------------------------------------------

    def tokenize_body(self, session: net.Session, base_url: str, text: str) -> dict[str, object]:
        return {"model": self.request_model(session, base_url), "prompt": text}

    def token_count_of(self, payload: Mapping[str, object]) -> TokenCount:
        """A ``/tokenize`` answer as a count (``count``, else the token list's length) and the
        context (``max_model_len``); ValueError on an impossible number."""
        count = payload.get("count")
        if count is None or isinstance(count, str):
            tokens = payload.get("tokens", payload.get("input_ids"))
            if not isinstance(tokens, list):
                raise ValueError("the answer has neither a count nor a token list")
            count = len(tokens)
        limit = payload.get("max_model_len")
        context = whole_number(limit, "max_model_len", MAX_MODEL_LEN) if limit else None
        return TokenCount(whole_number(count, "count"), context)

    def count_tokens(self, session: net.Session, base_url: str, text: str) -> TokenCount | None:
        """How many tokens ``text`` is to the served model; None when the engine does not
        tell (no such endpoint, an error), EngineHTTPError when its 200 answer cannot be
        true."""
        url = base_url + self.endpoints.tokenize
        try:
            payload, _ = self.post_json(session, url, self.tokenize_body(session, base_url, text))
        except EngineHTTPError:
            return None
        return parse_or_fail(f"POST {url}", lambda: self.token_count_of(payload))

    def usage_prompt_tokens(self, session: net.Session, base_url: str, text: str) -> int:
        """The prompt tokens a one-token completion of ``text`` reports in its usage (for an
        engine without a tokenizer endpoint); EngineHTTPError when it cannot say."""
        body = {"model": self.request_model(session, base_url), "prompt": text, "max_tokens": 1}
        url = base_url + self.endpoints.completions
        payload, _ = self.post_json(session, url, body)

        def read() -> int:
            usage = payload["usage"]
            assert isinstance(usage, Mapping)
            return whole_number(usage["prompt_tokens"], "usage.prompt_tokens")

        return parse_or_fail(f"POST {url}", read)

    def detokenize_body(
        self, session: net.Session, base_url: str, ids: Sequence[int]
    ) -> dict[str, object]:
        return {"model": self.request_model(session, base_url), "tokens": list(ids)}

    def detokenize(self, session: net.Session, base_url: str, ids: Sequence[int]) -> str | None:
        """The text of token ``ids``; None when the engine does not say."""
        body = self.detokenize_body(session, base_url, ids)
        try:
            payload, _ = self.post_json(session, base_url + self.endpoints.detokenize, body)
        except EngineHTTPError:
            return None
        text = payload.get("prompt", payload.get("text", payload.get("content")))
        return text if isinstance(text, str) else None

    # --- streamed completions (bench) ------------------------------------------------------

    def stream_body(
        self, model: str, prompt: str, max_tokens: int, request: Mapping[str, object]
    ) -> dict[str, object]:
        """One streamed greedy completion of exactly ``max_tokens`` tokens, the profile's
        ``request`` fields over the defaults. Usage on every chunk (vLLM's
        ``continuous_usage_stats``), so a first chunk carrying several tokens is not counted
        as one."""
        return {
            "model": model,
            "prompt": prompt,
            "temperature": 0,
            "ignore_eos": True,  # every request generates exactly max_tokens tokens
            **request,
            "max_tokens": max_tokens,
            "stream": True,
            "stream_options": {"include_usage": True, "continuous_usage_stats": True},
        }

    # --- counters ----------------------------------------------------------------------------

    def snapshot_counters(self, session: net.Session, base_url: str) -> Counters:
        """All Prometheus samples of the engine right now."""
        path = self.endpoints.metrics
        where = f"GET {base_url}{path}"
        try:
            response = session.get(base_url + path, timeout=10)
        except (net.BodyTooLarge, net.RedirectRefused) as exc:
            return Counters({}, False, time.monotonic(), f"{where}: {exc}", malformed=True)
        except requests.RequestException as exc:
            return no_counters(f"{where}: no response ({type(exc).__name__})")
        if response.status_code != 200:
            return no_counters(f"{where}: HTTP {response.status_code}")
        try:
            return parse_counters(response.text)
        except (ValueError, TypeError, IndexError) as exc:
            problem = f"{where}: not Prometheus text ({shortened(str(exc))})"
            return Counters({}, False, time.monotonic(), problem, malformed=True)

    def metrics_text(self, session: net.Session, base_url: str) -> str | None:
        """The engine's Prometheus page as text (None: it could not be read)."""
        try:
            response = session.get(base_url + self.endpoints.metrics, timeout=10)
        except requests.RequestException:
            return None
        return response.text if response.status_code == 200 else None

    # --- the exchanges -------------------------------------------------------------------

    def get_json(self, session: net.Session, url: str) -> object:
        """One JSON GET; EngineHTTPError (named, with the request) on any failure."""
        try:
            response = session.get(url, timeout=min(10.0, self.request_timeout_s))
        except requests.RequestException as exc:
            raise EngineHTTPError.answered(f"GET {url}", None, str(exc)) from exc
        if response.status_code != 200:
            raise EngineHTTPError.answered(f"GET {url}", response.status_code, response.text)
        try:
            return jsontext.loads(response.content)
        except ValueError as exc:
            raise EngineHTTPError.answered(
                f"GET {url}", 200, "malformed response: not JSON"
            ) from exc

    def post_json(
        self, session: net.Session, url: str, body: Mapping[str, object]
    ) -> tuple[dict[str, object], float]:
        """One JSON POST to the engine: its answer object and the seconds it took;
        EngineHTTPError (named, with the request) on any failure."""
        started = time.monotonic()
        try:
            response = session.post(url, json=body, timeout=self.request_timeout_s)
        except requests.Timeout as exc:
            raise EngineHTTPError.answered(
                f"POST {url}",
                None,
                f"no answer within {self.request_timeout_s:g} s (request timeout)",
                timed_out=True,
            ) from exc
        except requests.RequestException as exc:
            raise EngineHTTPError.answered(f"POST {url}", None, str(exc)) from exc
        seconds = time.monotonic() - started
        if response.status_code != 200:
            raise EngineHTTPError.answered(f"POST {url}", response.status_code, response.text)
        try:  # NaN/Infinity literals are read: a NaN logprob is what the nan check looks for
            payload = jsontext.loads(response.content, nonfinite=True)
        except ValueError as exc:
            raise EngineHTTPError.answered(f"POST {url}", response.status_code, "not JSON") from exc
        if not isinstance(payload, dict):
            raise EngineHTTPError.answered(f"POST {url}", response.status_code, "not a JSON object")
        return payload, seconds
