"""Streaming completions over one async HTTP client (httpx): many streams, little CPU.

A request is timed on the client's monotonic clock: sent, first token chunk, last token chunk.
Token counts come only from the engine's ``usage`` (``stream_options.include_usage``), never
from the streamed text: a chunk can carry several tokens (speculative decoding) or none
(an incomplete UTF-8 sequence).
"""

from __future__ import annotations

import asyncio
import json
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any

import httpx


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
    """A client with room for ``connections`` streams at once and no read deadline per chunk
    tighter than ``timeout_s``."""
    return httpx.AsyncClient(
        base_url=base_url,
        limits=httpx.Limits(max_connections=connections, max_keepalive_connections=connections),
        timeout=httpx.Timeout(timeout_s, connect=30.0),
        trust_env=False,  # the engine is on loopback or a URL given explicitly; no proxy
    )


class _StreamError(Exception):
    pass


def _usage_int(usage: Mapping[str, Any], key: str) -> int | None:
    value = usage.get(key)
    return int(value) if isinstance(value, int | float) else None


def _why(exc: Exception, client: httpx.AsyncClient) -> str:
    """A reason for httpx errors whose text is empty (timeouts mostly)."""
    if isinstance(exc, httpx.TimeoutException):
        return f"no answer within {client.timeout.read or 0:g} s (--request-timeout)"
    return "the connection failed"


async def stream_completion(
    client: httpx.AsyncClient, body: Mapping[str, Any], path: str = "/v1/completions"
) -> StreamResult:
    """POST one streaming completion and time it; never raises for engine or network faults."""
    # continuous_usage_stats: usage on every chunk, so a first chunk carrying several tokens
    # (a frontend that batches its output) is not mistaken for one token.
    options = {"include_usage": True, "continuous_usage_stats": True}
    payload = {**body, "stream": True, "stream_options": options}
    sent = time.monotonic()
    first = last = None
    usage: Mapping[str, Any] = {}
    finish: str | None = None
    first_tokens = 1
    times: list[float] = []
    counts: list[int] = []
    try:
        async with client.stream("POST", path, json=payload) as response:
            if response.status_code != 200:
                text = (await response.aread()).decode("utf-8", errors="replace")
                raise _StreamError(f"HTTP {response.status_code}: {text[:300]}")
            async for line in response.aiter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[5:].strip()
                if data == "[DONE]":
                    break
                chunk = json.loads(data)
                if "error" in chunk and not chunk.get("choices"):
                    raise _StreamError(f"engine error in stream: {str(chunk['error'])[:300]}")
                if chunk.get("choices"):
                    last = time.monotonic()
                    running = _usage_int(chunk.get("usage") or {}, "completion_tokens") or 0
                    times.append(last)
                    counts.append(running)
                    if first is None:
                        first = last
                        first_tokens = running or 1
                    finish = chunk["choices"][0].get("finish_reason") or finish
                if chunk.get("usage"):
                    usage = chunk["usage"]
    except _StreamError as exc:
        return StreamResult(sent, first, last, time.monotonic(), None, None, finish, str(exc))
    except (httpx.TransportError, httpx.StreamError) as exc:
        reason = str(exc) or _why(exc, client)
        message = f"{type(exc).__name__}: {reason}"
        return StreamResult(
            sent, first, last, time.monotonic(), None, None, finish, message, transport_error=True
        )
    except (ValueError, TypeError, AttributeError, KeyError, IndexError) as exc:
        # a data line that is not JSON, or JSON of the wrong shape
        message = f"malformed stream chunk from POST {path}: {type(exc).__name__}: {exc}"
        return StreamResult(sent, first, last, time.monotonic(), None, None, finish, message)
    done = time.monotonic()
    prompt_tokens = _usage_int(usage, "prompt_tokens")
    completion_tokens = _usage_int(usage, "completion_tokens")
    error = None
    if completion_tokens is None:
        error = "the stream ended without usage (engine too old for stream_options?)"
    elif first is None:
        error = "the stream ended without a token"
    return StreamResult(
        sent,
        first,
        last,
        done,
        prompt_tokens,
        completion_tokens,
        finish,
        error,
        first_chunk_tokens=first_tokens,
        chunk_times=tuple(times),
        chunk_tokens=tuple(counts),
    )


async def stream_many(
    client: httpx.AsyncClient, bodies: Sequence[Mapping[str, Any]]
) -> list[StreamResult]:
    """All ``bodies`` in flight at once (the cell's concurrency), results in the same order."""
    return list(await asyncio.gather(*(stream_completion(client, body) for body in bodies)))
