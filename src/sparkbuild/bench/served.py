"""What the engine under a sweep says about itself over HTTP: the model it serves, its
length limit and version, and how prompts are counted (its ``/tokenize``, else a
completion's usage)."""

from __future__ import annotations

from typing import Any, Literal

import httpx

from sparkbuild import jsontext, net
from sparkbuild.adapters import (
    VERSION_PATHS,
    EngineAdapter,
    first_model,
    reported_version,
    whole_number,
)
from sparkbuild.bench.client import deadline_of
from sparkbuild.errors import CalibrationError, EngineHTTPError

COUNTING_HINT = (
    "bench sizes prompts with the engine's /tokenize, else a one-token completion's usage: "
    "check that the engine still answers and look at its log"
)
#: The longest context an engine may say it serves (``max_model_len``).
MAX_MODEL_LEN = 1 << 31


class ServedEngine:
    """HTTP facts about the running engine that the sweep needs."""

    def __init__(self, client: httpx.AsyncClient, adapter: EngineAdapter) -> None:
        self.client = client
        self.adapter = adapter
        self.served_model = ""
        self.max_model_len: int | None = None
        self.version: str | None = None
        self.calibration: Literal["tokenize", "usage"] = "tokenize"

    async def _call(self, method: str, path: str, **kwargs: Any) -> httpx.Response:
        """One exchange with the engine, whole within the request timeout, its body capped."""
        return await net.fetch(
            self.client, method, path, deadline_s=deadline_of(self.client), **kwargs
        )

    def _where(self, method: str, path: str) -> str:
        return f"{method} {self.client.base_url.join(path)}"

    async def discover(self) -> None:
        where = self._where("GET", "/v1/models")
        try:
            response = await self._call("GET", "/v1/models")
            response.raise_for_status()
            first = first_model(jsontext.loads(response.content))
        except httpx.HTTPStatusError as exc:
            raise EngineHTTPError.answered(
                where, exc.response.status_code, exc.response.text
            ) from exc
        except httpx.HTTPError as exc:
            timed_out = isinstance(exc, httpx.TimeoutException)
            raise EngineHTTPError.answered(
                where, None, net.httpx_failure(exc), timed_out=timed_out
            ) from exc
        except ValueError as exc:  # not JSON, or JSON of the wrong shape
            raise EngineHTTPError.answered(where, 200, f"malformed response: {exc}") from exc
        self.served_model = str(first["id"])
        length = first.get("max_model_len")
        if length is not None:
            try:
                self.max_model_len = whole_number(length, "max_model_len", MAX_MODEL_LEN) or None
            except ValueError as exc:
                raise EngineHTTPError.answered(where, 200, f"malformed response: {exc}") from exc
        self.version = await self._version()
        probe_count = await self._tokenize("Note:")
        if probe_count is None:
            self.calibration = "usage"

    async def _version(self) -> str | None:
        for path in VERSION_PATHS:
            try:
                response = await self._call("GET", path)
                ok = response.status_code == 200
                value = reported_version(jsontext.loads(response.content)) if ok else None
            except (httpx.HTTPError, ValueError):
                continue
            if value:
                return value
        return None

    async def _tokenize(self, text: str) -> int | None:
        """The engine's token count of ``text``; None when it has no usable /tokenize, an
        error when it answers with a count that cannot be (negative, huge)."""
        try:
            response = await self._call(
                "POST", "/tokenize", json={"model": self.served_model, "prompt": text}
            )
        except httpx.HTTPError:
            return None
        if response.status_code != 200:
            return None
        try:
            data = jsontext.loads(response.content)
        except ValueError:
            return None
        if not isinstance(data, dict):
            return None
        try:
            if "count" in data and not isinstance(data["count"], bool | str):
                return whole_number(data["count"], "count")
        except ValueError as exc:
            raise EngineHTTPError.answered(
                self._where("POST", "/tokenize"), 200, f"malformed response: {exc}"
            ) from exc
        tokens = data.get("tokens") or data.get("input_ids")
        return len(tokens) if isinstance(tokens, list) else None

    async def count_tokens(self, text: str) -> int:
        if self.calibration == "tokenize":
            counted = await self._tokenize(text)
            if counted is not None:
                return counted
            raise CalibrationError(
                "the engine's /tokenize stopped answering while calibrating", COUNTING_HINT
            )
        body = {"model": self.served_model, "prompt": text or " ", "max_tokens": 1}
        why = "cannot count prompt tokens through a completion's usage"
        try:
            response = await self._call("POST", "/v1/completions", json=body)
            response.raise_for_status()
            usage = jsontext.loads(response.content)["usage"]
            return whole_number(usage["prompt_tokens"], "usage.prompt_tokens")
        except httpx.HTTPError as exc:
            raise CalibrationError(f"{why}: {net.httpx_failure(exc)}", COUNTING_HINT) from exc
        except (KeyError, TypeError) as exc:
            raise CalibrationError(
                f"{why}: the answer has no usage.prompt_tokens", COUNTING_HINT
            ) from exc
        except ValueError as exc:
            raise CalibrationError(f"{why}: {exc}", COUNTING_HINT) from exc
