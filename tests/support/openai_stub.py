"""A small OpenAI-compatible HTTP server on loopback, speaking vLLM's formats.

For tests of what sparkbuild prints and records (secrets, terminal safety), not of an engine:
``/v1/models``, ``/version``, ``/tokenize`` (one token per whitespace-separated word),
``/v1/completions`` (plain, and streamed as SSE with per-chunk usage), ``/metrics`` and
``/health``. A real socket and real HTTP; every request's path and query are recorded.
``engine_text`` is what the engine says about itself (its version and generated text), so a
test can make that hostile.
"""

from __future__ import annotations

import http.server
import json
import threading
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from typing import Any

MODEL = "stub-model"


@dataclass
class StubEngine:
    url: str
    requests: list[str] = field(default_factory=list)
    engine_text: str = "stub"


def _handler(engine: StubEngine) -> type[http.server.BaseHTTPRequestHandler]:
    class Handler(http.server.BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, format: str, *args: Any) -> None:
            pass

        def _json(self, payload: Any, status: int = 200) -> None:
            body = json.dumps(payload).encode()
            self.send_response(status)
            self.send_header("Content-Type", "application/json")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _text(self, text: str) -> None:
            body = text.encode()
            self.send_response(200)
            self.send_header("Content-Type", "text/plain; version=0.0.4")
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def _body(self) -> dict[str, Any]:
            length = int(self.headers.get("Content-Length") or 0)
            data = json.loads(self.rfile.read(length) or b"{}")
            return data if isinstance(data, dict) else {}

        def do_GET(self) -> None:
            engine.requests.append(self.path)
            path = self.path.split("?", 1)[0]
            if path == "/v1/models":
                self._json({"data": [{"id": MODEL, "owned_by": "vllm", "max_model_len": 4096}]})
            elif path == "/version":
                self._json({"version": engine.engine_text})
            elif path == "/metrics":
                self._text("# TYPE vllm:num_requests_running gauge\nvllm:num_requests_running 0\n")
            elif path == "/health":
                self._json({})
            else:
                self._json({"error": "not found"}, 404)

        def do_POST(self) -> None:
            engine.requests.append(self.path)
            path = self.path.split("?", 1)[0]
            body = self._body()
            if path == "/tokenize":
                self._json({"count": len(str(body.get("prompt", "")).split())})
            elif path == "/v1/completions" and body.get("stream"):
                self._stream(body)
            elif path == "/v1/completions":
                self._complete(body)
            else:
                self._json({"error": "not found"}, 404)

        def _complete(self, body: dict[str, Any]) -> None:
            tokens = int(body.get("max_tokens") or 1)
            words = [f"w{i}" for i in range(tokens)]
            self._json(
                {
                    "choices": [
                        {
                            "text": " " + " ".join(words),
                            "finish_reason": "length",
                            "logprobs": {"tokens": words, "token_logprobs": [-0.5] * tokens},
                        }
                    ],
                    "usage": {
                        "prompt_tokens": len(str(body.get("prompt", "")).split()),
                        "completion_tokens": tokens,
                    },
                }
            )

        def _stream(self, body: dict[str, Any]) -> None:
            tokens = int(body.get("max_tokens") or 1)
            prompt = len(str(body.get("prompt", "")).split())
            self.send_response(200)
            self.send_header("Content-Type", "text/event-stream")
            self.send_header("Connection", "close")
            self.end_headers()
            for index in range(tokens):
                finish = "length" if index == tokens - 1 else None
                chunk = {
                    "choices": [{"text": f" w{index}", "finish_reason": finish}],
                    "usage": {"prompt_tokens": prompt, "completion_tokens": index + 1},
                }
                self.wfile.write(f"data: {json.dumps(chunk)}\n\n".encode())
            self.wfile.write(b"data: [DONE]\n\n")
            self.wfile.flush()
            self.close_connection = True

    return Handler


@contextmanager
def stub_engine(engine_text: str = "stub") -> Iterator[StubEngine]:
    """A running stub engine on a free loopback port; stopped on exit."""
    engine = StubEngine(url="", engine_text=engine_text)
    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), _handler(engine))
    server.daemon_threads = True
    engine.url = f"http://127.0.0.1:{server.server_address[1]}"
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield engine
    finally:
        server.shutdown()
        server.server_close()
