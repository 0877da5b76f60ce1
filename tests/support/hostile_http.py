"""A hostile HTTP server on loopback: each path answers as a test scripts it.

It stands in for an engine or a registry that misbehaves the way real servers can: it holds
a request by sending its headers or body a byte at a time (a slowloris), sends far more than
asked, compresses a bomb, redirects to another host, or reports numbers that cannot be true.
A real socket and real HTTP/1.1 framing: the client under test cannot tell it from a server.

    with HostileServer() as server:
        server.route("/metrics", Reply(body=b"..."))
        server.route("/v1/completions", Reply(dribble_s=0.2, body=b"{...}"))
        ... server.url ...
"""

from __future__ import annotations

import contextlib
import http.server
import threading
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from types import TracebackType
from typing import Any


@dataclass(frozen=True)
class Reply:
    """One answer: status, headers and body, each delivered as slowly as asked."""

    status: int = 200
    body: bytes = b""
    headers: dict[str, str] = field(default_factory=dict)
    content_type: str = "application/json"
    #: Seconds between header lines sent after the status line (a slowloris on the headers).
    header_dribble_s: float = 0.0
    #: Seconds between the bytes of the body (a slowloris on the body).
    dribble_s: float = 0.0
    #: A streamed body (SSE): each item is written and flushed on its own, no Content-Length.
    stream: tuple[bytes, ...] | None = None


Route = Reply | Callable[["Request"], Reply]


@dataclass(frozen=True)
class Request:
    method: str
    path: str
    body: bytes
    count: int  # how many requests this path had before this one


class _QuietServer(http.server.ThreadingHTTPServer):
    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that hangs up on a hostile answer is the point, not an error


class HostileServer:
    """A threaded HTTP server on 127.0.0.1 whose paths answer as routed (404 otherwise)."""

    def __init__(self) -> None:
        self.routes: dict[str, Route] = {}
        self.seen: list[str] = []
        self.closing = threading.Event()
        server = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def _answer(self) -> None:
                path = self.path.split("?", 1)[0]
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                count = server.seen.count(path)
                server.seen.append(path)
                route = server.routes.get(path)
                if route is None:
                    reply = Reply(404, b"not found")
                elif isinstance(route, Reply):
                    reply = route
                else:
                    reply = route(Request(self.command, path, body, count))
                # A client that hangs up on a hostile answer is what these tests want.
                with contextlib.suppress(BrokenPipeError, ConnectionResetError):
                    server._send(self, reply)

            do_GET = do_POST = do_PUT = do_HEAD = _answer  # noqa: N815

            def log_message(self, format: str, *args: Any) -> None:
                pass

        self._server = _QuietServer(("127.0.0.1", 0), Handler)
        self._server.daemon_threads = True
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def address(self) -> str:
        return f"127.0.0.1:{self._server.server_address[1]}"

    @property
    def url(self) -> str:
        return f"http://{self.address}"

    def route(self, path: str, reply: Route) -> None:
        self.routes[path] = reply

    def _pause(self, seconds: float) -> None:
        if seconds and self.closing.wait(seconds):
            raise BrokenPipeError("the test is over")

    def _send(self, handler: http.server.BaseHTTPRequestHandler, reply: Reply) -> None:
        out = handler.wfile
        out.write(f"HTTP/1.1 {reply.status} X\r\n".encode())
        headers = {"Content-Type": reply.content_type, **reply.headers}
        if reply.stream is None:
            headers.setdefault("Content-Length", str(len(reply.body)))
        else:
            headers["Transfer-Encoding"] = "chunked"
        for name, value in headers.items():
            out.write(f"{name}: {value}\r\n".encode())
            out.flush()
            self._pause(reply.header_dribble_s)
        out.write(b"\r\n")
        out.flush()
        if handler.command == "HEAD":
            return
        if reply.stream is not None:
            for item in reply.stream:
                out.write(f"{len(item):x}\r\n".encode() + item + b"\r\n")
                out.flush()
                self._pause(reply.dribble_s)
            out.write(b"0\r\n\r\n")
        elif reply.dribble_s:
            for index in range(len(reply.body)):
                out.write(reply.body[index : index + 1])
                out.flush()
                self._pause(reply.dribble_s)
        else:
            out.write(reply.body)
        out.flush()

    def __enter__(self) -> HostileServer:
        self._thread.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        traceback: TracebackType | None,
    ) -> None:
        self.closing.set()
        self._server.shutdown()
        self._server.server_close()


def sse(chunks: Iterable[dict[str, Any] | str]) -> tuple[bytes, ...]:
    """``data:`` lines of an OpenAI-style stream (a str is sent as it is, e.g. ``[DONE]``)."""
    import json

    return tuple(
        f"data: {item if isinstance(item, str) else json.dumps(item)}\n\n".encode()
        for item in chunks
    )


__all__ = ["HostileServer", "Reply", "Request", "sse"]
