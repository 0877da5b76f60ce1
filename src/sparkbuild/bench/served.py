"""What the engine under a sweep says about itself over HTTP: the model it serves, its
length limit and version, and how prompts are counted (its tokenizer endpoint, else a
completion's usage). Every request is the adapter's (its endpoints and body shapes); the
sweep's event loop waits for them in a thread."""

from __future__ import annotations

import asyncio
from typing import Literal

from sparkbuild import net
from sparkbuild.adapters import EngineAdapter
from sparkbuild.errors import CalibrationError, EngineHTTPError

COUNTING_HINT = (
    "bench sizes prompts with the engine's tokenizer endpoint, else a one-token completion's "
    "usage: check that the engine still answers and look at its log"
)


class ServedEngine:
    """HTTP facts about the running engine that the sweep needs."""

    def __init__(self, adapter: EngineAdapter, base_url: str, session: net.Session) -> None:
        self.adapter = adapter
        self.base_url = base_url
        self.session = session
        self.served_model = ""
        self.max_model_len: int | None = None
        self.version: str | None = None
        self.calibration: Literal["tokenize", "usage"] = "tokenize"

    async def discover(self) -> None:
        """The served model and its limit (EngineHTTPError when the engine cannot say), the
        version, and whether the engine counts tokens itself."""
        served = await asyncio.to_thread(self.adapter.served, self.session, self.base_url)
        self.served_model = served.id
        self.max_model_len = served.max_model_len
        self.version = await asyncio.to_thread(
            self.adapter.server_version, self.session, self.base_url
        )
        probe = await self._tokenize("Note:")
        if probe is None:
            self.calibration = "usage"
        elif self.max_model_len is None:
            self.max_model_len = probe[1]

    async def _tokenize(self, text: str) -> tuple[int, int | None] | None:
        """The engine's token count of ``text`` and its context; None when it has no usable
        tokenizer endpoint, an error when it answers with a count that cannot be."""
        counted = await asyncio.to_thread(
            self.adapter.count_tokens, self.session, self.base_url, text
        )
        return (counted.count, counted.context) if counted is not None else None

    async def count_tokens(self, text: str) -> int:
        if self.calibration == "tokenize":
            counted = await self._tokenize(text)
            if counted is not None:
                return counted[0]
            raise CalibrationError(
                "the engine's tokenizer endpoint stopped answering while calibrating",
                COUNTING_HINT,
            )
        why = "cannot count prompt tokens through a completion's usage"
        try:
            return await asyncio.to_thread(
                self.adapter.usage_prompt_tokens, self.session, self.base_url, text or " "
            )
        except EngineHTTPError as exc:
            said = f"HTTP {exc.status}: {exc.body}" if exc.status is not None else exc.message
            raise CalibrationError(f"{why}: {said}", COUNTING_HINT) from exc
