"""A loopback proxy that hands an engine's streamed answers to the client in one burst.

On a busy host a bench client gets the CPU only now and then and reads what piled up in its
socket meanwhile (issue 14: 114-158x the engine's rate at c=1). Starving a client with busy
loops reproduces that only sometimes; this proxy does it every time. It forwards each request
to the real engine unchanged and passes each answer through as it streams, except the
streamed completions it is told to hold: those it reads to the end before writing a byte.
The engine, its counters and the bytes are real; only the delivery is bunched.

    with BurstProxy(engine_url, hold=lambda n: n % 2 == 0) as proxy:
        ... bench --url proxy.url ...   # the 2nd, 4th, ... completion arrives in one burst

With ``rewrite``, every answer that is not streamed is read whole and passed through
``rewrite(path, body)`` first: the real engine's answer with fields taken out, as an engine
that never sends them would answer.
"""

from __future__ import annotations

import http.client
import http.server
import json
import threading
from collections.abc import Callable
from types import TracebackType
from urllib.parse import urlsplit

_HOP_BY_HOP = {"connection", "keep-alive", "transfer-encoding", "content-length"}


class BurstProxy:
    """Forward to ``upstream``; hold the n-th streamed completion (counted from 1) whole
    where ``hold(n)`` is true. ``held`` lists the numbers held so far."""

    def __init__(
        self,
        upstream: str,
        hold: Callable[[int], bool] = lambda _n: False,
        rewrite: Callable[[str, bytes], bytes] | None = None,
    ) -> None:
        parts = urlsplit(upstream)
        self._rewrite = rewrite
        self._upstream = (parts.hostname or "127.0.0.1", parts.port or 80)
        self._hold = hold
        self._lock = threading.Lock()
        self._completions = 0
        self.held: list[int] = []
        self._server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), self._handler())
        self._thread = threading.Thread(target=self._server.serve_forever, daemon=True)

    @property
    def url(self) -> str:
        host, port = self._server.server_address[:2]
        return f"http://{host!s}:{port}"

    def __enter__(self) -> BurstProxy:
        self._thread.start()
        return self

    def __exit__(
        self, kind: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self._server.shutdown()
        self._server.server_close()
        self._thread.join(timeout=10)

    def _should_hold(self, method: str, path: str, body: bytes) -> bool:
        if method != "POST" or not path.startswith("/v1/") or not _streamed(body):
            return False
        with self._lock:
            self._completions += 1
            number = self._completions
            if self._hold(number):
                self.held.append(number)
                return True
        return False

    def _handler(self) -> type[http.server.BaseHTTPRequestHandler]:
        proxy = self

        class Handler(http.server.BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def do_GET(self) -> None:
                self._forward()

            def do_POST(self) -> None:
                self._forward()

            def log_message(self, format: str, *args: object) -> None:
                pass  # quiet: pytest shows the bench's own output

            def _forward(self) -> None:
                length = int(self.headers.get("Content-Length") or 0)
                body = self.rfile.read(length) if length else b""
                held = proxy._should_hold(self.command, self.path, body)
                upstream = http.client.HTTPConnection(*proxy._upstream, timeout=600)
                try:
                    headers = {
                        k: v for k, v in self.headers.items() if k.lower() not in _HOP_BY_HOP
                    }
                    upstream.request(self.command, self.path, body=body or None, headers=headers)
                    answer = upstream.getresponse()
                    self.send_response(answer.status)
                    for key, value in answer.getheaders():
                        if key.lower() not in _HOP_BY_HOP:
                            self.send_header(key, value)
                    if proxy._rewrite is not None and not _streamed(body):
                        self._send_whole(proxy._rewrite(self.path, answer.read()))
                    elif held:
                        self._send_whole(answer.read())
                    else:
                        self._send_as_it_comes(answer)
                finally:
                    upstream.close()

            def _send_whole(self, payload: bytes) -> None:
                self.send_header("Content-Length", str(len(payload)))
                self.end_headers()
                self.wfile.write(payload)
                self.wfile.flush()

            def _send_as_it_comes(self, answer: http.client.HTTPResponse) -> None:
                self.send_header("Transfer-Encoding", "chunked")
                self.end_headers()
                while chunk := answer.read1(65536):
                    self.wfile.write(b"%x\r\n%s\r\n" % (len(chunk), chunk))
                    self.wfile.flush()
                self.wfile.write(b"0\r\n\r\n")
                self.wfile.flush()

        return Handler


def _streamed(body: bytes) -> bool:
    try:
        request = json.loads(body)
    except ValueError:
        return False
    return isinstance(request, dict) and request.get("stream") is True


__all__ = ["BurstProxy"]
