"""Every HTTP exchange sparkbuild makes, bounded: engines, ``/metrics``, SSE streams, registries
and their token services are all answered by servers sparkbuild does not control.

requests' and httpx's timeouts bound each socket operation, not the exchange: a server that
sends a byte a second (a slowloris) holds a request forever, one that sends 150 MB or a gzip
bomb fills memory, and one that redirects sends the next request wherever it likes. So, one
helper per concern:

- a whole-exchange deadline: :class:`Session` (requests) runs a watchdog that shuts the
  exchange's socket down when the deadline passes, however slowly the bytes trickle in;
  :func:`fetch` and :func:`deadline` (httpx, asyncio) cancel the exchange;
- a size cap on every body, decompressed included (:class:`BodyReader`);
- redirects followed only to the same host (:func:`same_host`), or, for content addressed by
  digest, to another host without credentials;
- capped retries: :mod:`sparkbuild.retries`.

The errors are requests' and httpx's own exception types (a deadline is a ``Timeout``), so
callers that handle a timeout or a failed request handle these too.
"""

from __future__ import annotations

import asyncio
import contextlib
import socket
import threading
import time
import zlib
from collections.abc import AsyncIterator, MutableMapping
from typing import Any, Literal
from urllib.parse import urljoin, urlsplit

import httpx
import requests
import urllib3
from requests.adapters import HTTPAdapter

MIB = 1024 * 1024
#: An engine's JSON answer: completions with logprobs, /metrics pages, model lists.
ENGINE_BODY_LIMIT = 32 * MIB
#: One line of an SSE stream (one chunk of a completion).
STREAM_LINE_LIMIT = 1 * MIB
#: Attempts and backoff a user may ask for (SPARKBUILD_NET_ATTEMPTS, SPARKBUILD_NET_BACKOFF).
MAX_ATTEMPTS = 20
MAX_BACKOFF_SCALE = 10.0
#: The longest all attempts of one operation may take together.
MAX_RETRY_SECONDS = 900.0
MAX_REDIRECTS = 5
CONNECT_S = 10.0

Redirects = Literal["same-host", "content", "none"]


class DeadlineExceeded(requests.Timeout):
    """The exchange did not complete within its whole-exchange deadline."""


class BodyTooLarge(requests.RequestException):
    """The answer's body (after decompression) is larger than the cap."""


class RedirectRefused(requests.RequestException):
    """A redirect to another host (or from https to http) that is not followed."""


# --- the deadline ----------------------------------------------------------------------------

_active = threading.local()


class _Watchdog:
    """Shuts down the sockets of one exchange once its deadline has passed.

    A socket timeout bounds one ``recv``; a watchdog bounds all of them together: a shut-down
    socket wakes the blocked read at once, whatever the server sends or holds back.
    """

    def __init__(self, seconds: float) -> None:
        self.seconds = seconds
        self.deadline = time.monotonic() + seconds
        self.fired = False
        self._connections: list[object] = []
        self._done = threading.Event()
        self._thread = threading.Thread(target=self._run, name="http-deadline", daemon=True)

    def watch(self, connection_or_socket: object) -> None:
        self._connections.append(connection_or_socket)

    def remaining(self) -> float:
        return self.deadline - time.monotonic()

    def _run(self) -> None:
        if self._done.wait(max(self.remaining(), 0.0)):
            return
        self.fired = True
        while not self._done.is_set():  # again and again: a connection may open meanwhile
            for watched in list(self._connections):
                _shut(watched if _is_socket(watched) else getattr(watched, "sock", None))
            self._done.wait(0.05)

    def __enter__(self) -> _Watchdog:
        _active.watchdog = self
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._done.set()
        _active.watchdog = None
        self._thread.join()


def _is_socket(value: object) -> bool:
    return isinstance(value, socket.socket) or hasattr(value, "recv_into")


def _shut(sock: object) -> None:
    if sock is None:
        return
    with contextlib.suppress(OSError, ValueError):
        # socket.socket's own shutdown, also for an SSLSocket: the fd, not the TLS session,
        # so the blocked read in the other thread simply sees the connection end.
        raw = sock if isinstance(sock, socket.socket) else getattr(sock, "socket", None)
        if isinstance(raw, socket.socket):
            socket.socket.shutdown(raw, socket.SHUT_RDWR)


def _watched(connection_or_socket: object) -> None:
    watchdog = getattr(_active, "watchdog", None)
    if watchdog is not None and connection_or_socket is not None:
        watchdog.watch(connection_or_socket)


class _HTTPConnection(urllib3.connection.HTTPConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        _watched(self)  # while it connects and sends
        super().request(*args, **kwargs)
        _watched(self.sock)  # the response keeps reading it after the connection lets go


class _HTTPSConnection(urllib3.connection.HTTPSConnection):
    def request(self, *args: Any, **kwargs: Any) -> None:
        _watched(self)
        super().request(*args, **kwargs)
        _watched(self.sock)


class _HTTPPool(urllib3.HTTPConnectionPool):
    ConnectionCls = _HTTPConnection


class _HTTPSPool(urllib3.HTTPSConnectionPool):
    ConnectionCls = _HTTPSConnection


_POOLS = {"http": _HTTPPool, "https": _HTTPSPool}


class _WatchedAdapter(HTTPAdapter):
    """requests' adapter whose connections report to the exchange's watchdog."""

    def init_poolmanager(self, *args: Any, **kwargs: Any) -> None:
        super().init_poolmanager(*args, **kwargs)
        self.poolmanager.pool_classes_by_scheme = _POOLS

    def proxy_manager_for(self, proxy: str, **proxy_kwargs: object) -> object:
        manager = super().proxy_manager_for(proxy, **proxy_kwargs)
        manager.pool_classes_by_scheme = _POOLS
        return manager


# --- the body --------------------------------------------------------------------------------


class BodyReader:
    """Decodes a body as it arrives (identity, gzip, deflate) and refuses more than ``limit``
    bytes of it, before they are all in memory: a gzip bomb stops at the cap."""

    def __init__(self, encoding: str | None, limit: int, what: str) -> None:
        self.limit = limit
        self.what = what
        self.total = 0
        name = (encoding or "identity").strip().lower()
        if name in ("identity", ""):
            self._inflate: Any = None
        elif name in ("gzip", "x-gzip"):
            self._inflate = zlib.decompressobj(16 + zlib.MAX_WBITS)
        elif name == "deflate":
            self._inflate = zlib.decompressobj()
        else:
            raise ValueError(
                f"the answer to {what} has an unsupported Content-Encoding {encoding!r}"
            )

    def feed(self, data: bytes) -> bytes:
        if self._inflate is None:
            out = data
        else:
            try:
                out = self._inflate.decompress(data, self.limit - self.total + 1)
            except zlib.error as exc:
                raise ValueError(
                    f"the answer to {self.what} is corrupt compressed data ({exc})"
                ) from None
        self.total += len(out)
        if self.total > self.limit:
            raise ValueError(f"the answer to {self.what} is larger than {_size(self.limit)}")
        return out


def _size(limit: int) -> str:
    return f"{limit // MIB} MiB" if limit >= MIB else f"{limit} bytes"


# --- redirects -------------------------------------------------------------------------------


def _origin(url: str) -> tuple[str, str, int | None]:
    parts = urlsplit(url)
    default = {"http": 80, "https": 443}.get(parts.scheme)
    return parts.scheme, (parts.hostname or "").lower(), parts.port or default


def same_host(url: str, target: str) -> bool:
    """Whether ``target`` is on the host (and port) of ``url``, and not https -> http."""
    scheme, host, port = _origin(url)
    to_scheme, to_host, to_port = _origin(target)
    if (scheme, to_scheme) == ("https", "http") or to_scheme not in ("http", "https"):
        return False
    upgraded = (scheme, to_scheme) == ("http", "https") and to_port == 443
    return host == to_host and (port == to_port or upgraded)


# --- the session -----------------------------------------------------------------------------


class Session:
    """requests, bounded: each exchange (redirects included) ends within its deadline, reads at
    most ``max_body`` bytes, and follows redirects only as ``redirects`` allows.

    ``deadline_s`` caps every exchange; a call's ``timeout=`` may only shorten it. The body
    is read before the call returns (``response.content``, ``.text``, ``.json()`` work).
    """

    def __init__(self, *, deadline_s: float, max_body: int = ENGINE_BODY_LIMIT) -> None:
        self.deadline_s = deadline_s
        self.max_body = max_body
        self._session = requests.Session()
        adapter = _WatchedAdapter()
        self._session.mount("http://", adapter)
        self._session.mount("https://", adapter)
        self._session.headers["Accept-Encoding"] = "gzip, deflate"  # what BodyReader decodes

    @property
    def headers(self) -> MutableMapping[str, str | bytes]:
        return self._session.headers

    def get(self, url: str, **kwargs: Any) -> requests.Response:
        return self.request("GET", url, **kwargs)

    def post(self, url: str, **kwargs: Any) -> requests.Response:
        return self.request("POST", url, **kwargs)

    def close(self) -> None:
        self._session.close()

    def request(
        self,
        method: str,
        url: str,
        *,
        timeout: float | None = None,
        max_body: int | None = None,
        redirects: Redirects = "same-host",
        **kwargs: object,
    ) -> requests.Response:
        seconds = self.deadline_s if timeout is None else min(float(timeout), self.deadline_s)
        with _Watchdog(seconds) as watchdog:
            try:
                return self._exchange(method, url, watchdog, max_body, redirects, kwargs)
            except requests.RequestException as exc:
                if watchdog.fired and not isinstance(exc, DeadlineExceeded):
                    raise _late(method, url, seconds) from None
                raise

    def _exchange(
        self,
        method: str,
        url: str,
        watchdog: _Watchdog,
        max_body: int | None,
        redirects: Redirects,
        kwargs: dict[str, Any],
    ) -> requests.Response:
        for _hop in range(MAX_REDIRECTS + 1):
            remaining = watchdog.remaining()
            if remaining <= 0:
                raise _late(method, url, watchdog.seconds)
            response = self._session.request(
                method,
                url,
                allow_redirects=False,
                stream=True,
                timeout=(min(CONNECT_S, remaining), remaining),
                **kwargs,
            )
            target = self._redirect(response, method, url, redirects)
            if target is None:
                self._read(response, max_body or self.max_body, watchdog, method, url)
                return response
            if not same_host(url, target):  # content by digest: the bytes are hashed anyway
                kwargs = _without_credentials(kwargs)
            url = target
        raise requests.TooManyRedirects(
            f"{method} {url} was redirected more than {MAX_REDIRECTS} times"
        )

    @staticmethod
    def _redirect(
        response: requests.Response, method: str, url: str, redirects: Redirects
    ) -> str | None:
        """Where to go next, or None when ``response`` is the answer."""
        location = response.headers.get("Location")
        if not response.is_redirect or not location or method not in ("GET", "HEAD"):
            return None
        target = urljoin(url, location)
        response.close()
        if redirects == "none":
            raise RedirectRefused(f"{method} {url} was redirected to {target}; not followed")
        if redirects == "same-host" and not same_host(url, target):
            raise RedirectRefused(
                f"{method} {url} was redirected to another host ({target}); sparkbuild follows "
                "redirects only to the same host"
            )
        if redirects == "content" and urlsplit(target).scheme not in ("http", "https"):
            raise RedirectRefused(f"{method} {url} was redirected to {target}")
        return target

    @staticmethod
    def _read(
        response: requests.Response, limit: int, watchdog: _Watchdog, method: str, url: str
    ) -> None:
        what = f"{method} {url}"
        try:
            declared = int(response.headers.get("Content-Length") or 0)
        except ValueError:
            declared = 0
        try:
            if declared > limit:
                raise ValueError(f"the answer to {what} is larger than {_size(limit)}")
            reader = BodyReader(response.headers.get("Content-Encoding"), limit, what)
            chunks = [
                reader.feed(chunk) for chunk in response.raw.stream(64 * 1024, decode_content=False)
            ]
        except ValueError as exc:
            response.close()
            raise BodyTooLarge(str(exc)) from None
        except urllib3.exceptions.HTTPError as exc:
            response.close()
            if watchdog.fired:
                raise _late(method, url, watchdog.seconds) from None
            raise requests.ConnectionError(f"{what} failed: {exc}") from None
        if watchdog.fired:  # the socket was shut: what came may be cut short
            raise _late(method, url, watchdog.seconds)
        # requests' own cache of the body: .content, .text and .json() read it from here.
        response._content = b"".join(chunks)
        response._content_consumed = True  # type: ignore[attr-defined]


def _late(method: str, url: str, seconds: float) -> DeadlineExceeded:
    return DeadlineExceeded(f"no complete answer to {method} {url} within {seconds:g} s")


def _without_credentials(kwargs: dict[str, Any]) -> dict[str, object]:
    headers = {k: v for k, v in (kwargs.get("headers") or {}).items() if k != "Authorization"}
    return {**kwargs, "headers": headers, "auth": None}


# --- asyncio and httpx (bench streams) -------------------------------------------------------


@contextlib.asynccontextmanager
async def deadline(seconds: float, what: str) -> AsyncIterator[None]:
    """The whole of an asyncio exchange within ``seconds``; an ``httpx.ReadTimeout`` after."""
    try:
        async with asyncio.timeout(seconds):
            yield
    except TimeoutError:
        raise httpx.ReadTimeout(f"no complete answer to {what} within {seconds:g} s") from None


def httpx_failure(exc: httpx.HTTPError | httpx.StreamError) -> str:
    """What went wrong in an httpx exchange, in words: its status and the start of the
    engine's answer (httpx's own text for a status names its docs), else the transport's
    reason, which httpx often leaves empty."""
    if isinstance(exc, httpx.HTTPStatusError):
        body = exc.response.text[:200].strip()
        return f"HTTP {exc.response.status_code}" + (f": {body}" if body else "")
    timed_out = isinstance(exc, httpx.TimeoutException)
    return str(exc) or ("no answer in time" if timed_out else "the connection failed")


class ResponseTooLarge(httpx.DecodingError):
    """An httpx answer over its size cap (an ``httpx.HTTPError``, as callers expect)."""


async def fetch(
    client: httpx.AsyncClient,
    method: str,
    url: str,
    *,
    deadline_s: float,
    max_body: int = ENGINE_BODY_LIMIT,
    **kwargs: Any,
) -> httpx.Response:
    """One httpx exchange within ``deadline_s``, its body read (at most ``max_body``)."""
    what = f"{method} {client.base_url.join(url)}"
    async with deadline(deadline_s, what), client.stream(method, url, **kwargs) as response:
        try:
            reader = BodyReader(response.headers.get("Content-Encoding"), max_body, what)
            body = b"".join([reader.feed(chunk) async for chunk in response.aiter_raw()])
        except ValueError as exc:
            raise ResponseTooLarge(str(exc)) from None
    return httpx.Response(
        response.status_code, headers=response.headers, content=body, request=response.request
    )


async def first_text(response: httpx.Response, limit: int = 4096) -> str:
    """The start of an answer's body, for an error message (the rest is never read)."""
    got = b""
    async for chunk in response.aiter_raw():
        got += chunk
        if len(got) >= limit:
            break
    return got[:limit].decode("utf-8", errors="replace")


async def lines(response: httpx.Response, what: str) -> AsyncIterator[str]:
    """The lines of a streamed answer, decoded as they arrive; a line longer than
    :data:`STREAM_LINE_LIMIT` is a ``ValueError``."""
    reader = BodyReader(response.headers.get("Content-Encoding"), 2**62, what)
    pending = b""
    async for chunk in response.aiter_raw():
        pending += reader.feed(chunk)
        *complete, pending = pending.split(b"\n")
        if len(pending) > STREAM_LINE_LIMIT:
            raise ValueError(
                f"a line of the answer to {what} is longer than {_size(STREAM_LINE_LIMIT)}"
            )
        for line in complete:
            yield line.rstrip(b"\r").decode("utf-8", errors="replace")
    if pending:
        yield pending.rstrip(b"\r").decode("utf-8", errors="replace")


__all__ = [
    "BodyReader",
    "BodyTooLarge",
    "DeadlineExceeded",
    "RedirectRefused",
    "Session",
    "deadline",
    "fetch",
    "first_text",
    "lines",
    "same_host",
]
