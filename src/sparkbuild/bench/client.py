"""Streaming completions over one async HTTP client (httpx): many streams, little CPU.

A request is timed on the client's monotonic clock: sent, first token chunk, last token chunk.
Token counts come only from the engine's ``usage`` (``stream_options.include_usage``), never
from the streamed text: a chunk can carry several tokens (speculative decoding) or none
(an incomplete UTF-8 sequence).
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import httpx

from sparkbuild import jsontext, net
from sparkbuild.adapters import whole_number

#: Chunks with text a stream may send beyond one per requested token (role and final chunks).
_SPARE_CHUNKS = 64


@dataclass(frozen=True)
class StreamResult:
    """One streamed completion; ``error`` is None when it finished normally."""

    sent: float
    first_token: float | None
    last_token: float | None
    done: float
    prompt_tokens: int | None
    completion_tokens: int | None
    finish_reason: str | None
    error: str | None = None
    transport_error: bool = False  # the connection failed (engine gone?) rather than HTTP
    first_chunk_tokens: int = 1  # tokens in the first chunk, when the engine reports it
    #: Arrival time of every chunk that carried text, and the engine's running token count
    #: at that chunk (0 where the engine sent no per-chunk usage).
    chunk_times: tuple[float, ...] = ()
    chunk_tokens: tuple[int, ...] = ()
    #: The engine's own per-response fields (its adapter's ``response_extras``), as the
    #: last chunk holding each sent them (llama.cpp's ``timings`` with its draft counts).
    extras: Mapping[str, object] = field(default_factory=dict)

    @property
    def decode_tokens(self) -> int:
        """Tokens that arrived after the first chunk (the decode phase)."""
        return max((self.completion_tokens or 0) - self.first_chunk_tokens, 0)

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def ttft(self) -> float | None:
        return None if self.first_token is None else self.first_token - self.sent

    @property
    def decode_seconds(self) -> float | None:
        if self.first_token is None or self.last_token is None:
            return None
        return self.last_token - self.first_token

    @property
    def time_per_output_token(self) -> float | None:
        """Decode seconds per decode token: the client's view of what vLLM and SGLang
        histogram as ``request_time_per_output_token_seconds``."""
        span = self.decode_seconds
        if not span or span <= 0 or self.decode_tokens <= 0:
            return None
        return span / self.decode_tokens

    def chunk_gaps(self) -> list[float]:
        """Seconds between consecutive chunks after the first, each divided over the tokens
        the later chunk carried (a speculative step delivers several at once)."""
        gaps: list[float] = []
        for i in range(1, len(self.chunk_times)):
            gap = self.chunk_times[i] - self.chunk_times[i - 1]
            carried = self.chunk_tokens[i] - self.chunk_tokens[i - 1]
            tokens = carried if carried > 0 else 1
            gaps.extend([gap / tokens] * tokens)
        return gaps


def make_client(base_url: str, connections: int, timeout_s: float) -> httpx.AsyncClient:
    """A client with room for ``connections`` streams at once; ``timeout_s`` bounds each
    exchange whole (:func:`deadline_of`), not only each read. Redirects are not followed, and
    streams come uncompressed (a compressing proxy would batch the chunks being timed)."""
    return httpx.AsyncClient(
        base_url=base_url,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        timeout=httpx.Timeout(timeout_s, connect=min(30.0, timeout_s)),
        trust_env=False,  # the engine is on loopback or a URL given explicitly; no proxy
        follow_redirects=False,
        headers={"Accept-Encoding": "identity"},
    )


def deadline_of(client: httpx.AsyncClient) -> float:
    """The whole-exchange deadline of ``client``'s requests (``--request-timeout``)."""
    return float(client.timeout.read or 1800.0)


class _StreamError(Exception):
    pass


def _usage_int(usage: Mapping[str, object], key: str) -> int | None:
    """A token count of the engine's ``usage``; a negative, huge or non-finite one is a
    malformed chunk (ValueError)."""
    value = usage.get(key)
    return None if value is None else whole_number(value, f"usage.{key}")


def _why(exc: httpx.HTTPError | httpx.StreamError, client: httpx.AsyncClient) -> str:
    """Why a stream failed: a timeout names ``client``'s whole-exchange deadline."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {deadline_of(client):g} s (--request-timeout)"
    return net.httpx_failure(exc)


@dataclass
class _Chunks:
    """What a stream has delivered so far, chunk by chunk."""

    most: int  # chunks with text a stream may send for the tokens it was asked for
    what: str
    extra_keys: tuple[str, ...] = ()
    extras: dict[str, object] = field(default_factory=dict)
    first: float | None = None
    last: float | None = None
    usage: Mapping[str, object] = field(default_factory=dict)
    finish: str | None = None
    first_tokens: int = 1
    times: list[float] = field(default_factory=list)
    counts: list[int] = field(default_factory=list)

    def take(self, data: str) -> None:
        """One ``data:`` payload (not ``[DONE]``); ValueError and friends when malformed."""
        chunk = jsontext.loads(data)
        if "error" in chunk and not chunk.get("choices"):
            raise _StreamError(f"engine error in stream: {str(chunk['error'])[:300]}")
        if chunk.get("choices"):
            if len(self.times) >= self.most:
                raise _StreamError(f"{self.what}: more than {self.most} chunks with text")
            self.last = time.monotonic()
            running = _usage_int(chunk.get("usage") or {}, "completion_tokens") or 0
            self.times.append(self.last)
            self.counts.append(running)
            if self.first is None:
                self.first = self.last
                self.first_tokens = running or 1
            self.finish = chunk["choices"][0].get("finish_reason") or self.finish
        if chunk.get("usage"):
            self.usage = chunk["usage"]
        self.extras.update((k, chunk[k]) for k in self.extra_keys if k in chunk)

    def failed(self, sent: float, error: str, *, transport: bool = False) -> StreamResult:
        return StreamResult(
            sent,
            self.first,
            self.last,
            time.monotonic(),
            None,
            None,
            self.finish,
            error,
            transport_error=transport,
        )

    def result(self, sent: float) -> StreamResult:
        done = time.monotonic()
        try:
            prompt_tokens = _usage_int(self.usage, "prompt_tokens")
            completion_tokens = _usage_int(self.usage, "completion_tokens")
        except (ValueError, AttributeError) as exc:
            return self.failed(sent, f"malformed usage from {self.what}: {exc}")
        error = None
        if completion_tokens is None:
            error = "the stream ended without usage (engine too old for stream_options?)"
        elif self.first is None:
            error = "the stream ended without a token"
        return StreamResult(
            sent,
            self.first,
            self.last,
            done,
            prompt_tokens,
            completion_tokens,
            self.finish,
            error,
            first_chunk_tokens=self.first_tokens,
            chunk_times=tuple(self.times),
            chunk_tokens=tuple(self.counts),
            extras=dict(self.extras),
        )


async def stream_completion(
    client: httpx.AsyncClient,
    body: Mapping[str, Any],
    path: str,
    extras: tuple[str, ...] = (),
) -> StreamResult:
    """POST one streaming completion (``body``: the adapter's, ``stream`` and its usage
    options included) to ``path`` and time it; never raises for engine or network faults.
    ``extras``: the answer's top-level fields the engine's own per-response facts are in.

    The whole stream ends within the request timeout, its lines are bounded, and it may not
    send more chunks with text than tokens were asked for (plus a few)."""
    payload = dict(body)
    what = f"POST {path}"
    chunks = _Chunks(2 * int(body.get("max_tokens") or 0) + _SPARE_CHUNKS, what, extras)
    sent = time.monotonic()
    try:
        async with (
            net.deadline(deadline_of(client), what),
            client.stream("POST", path, json=payload) as response,
        ):
            if response.status_code != 200:
                text = await net.first_text(response)
                raise _StreamError(f"HTTP {response.status_code}: {text[:300]}")
            ended = False  # every OpenAI-style stream ends with [DONE]; a cut one does not
            async for line in net.lines(response, what):
                data = line[5:].strip() if line.startswith("data:") else None
                if data == "[DONE]":
                    ended = True
                    break
                if data is not None:
                    chunks.take(data)
            if not ended:
                raise _StreamError(
                    f"the stream from {what} ended without [DONE] after {len(chunks.times)} "
                    "chunks (cut mid-way)"
                )
    except _StreamError as exc:
        return chunks.failed(sent, str(exc))
    except (httpx.TransportError, httpx.StreamError) as exc:
        reason = _why(exc, client)  # a timeout: a read, or the whole deadline
        return chunks.failed(sent, f"{type(exc).__name__}: {reason}", transport=True)
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        # a data line that is not JSON, or JSON of the wrong shape
        return chunks.failed(
            sent, f"malformed stream chunk from {what}: {type(exc).__name__}: {exc}"
        )
    return chunks.result(sent)


async def stream_many(
    client: httpx.AsyncClient,
    bodies: Sequence[Mapping[str, object]],
    path: str,
    extras: tuple[str, ...] = (),
) -> list[StreamResult]:
    """All ``bodies`` in flight at once (the cell's concurrency), results in the same order."""
    streams = (stream_completion(client, body, path, extras) for body in bodies)
    return list(await asyncio.gather(*streams))
