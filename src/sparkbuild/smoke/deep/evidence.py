"""What a smoke run keeps of each answer, so a verdict can be looked at afterwards: the first
and last characters, the finish reason, the token counts. Redacted as every record is."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Any

from sparkbuild.adapters import ChatAnswer, Generation
from sparkbuild.redact import redact

#: Characters kept from each end of an answer.
EDGE_CHARS = 500
#: Characters beyond a cut redacted with what is kept: longer than any secret.
REDACT_MARGIN = 4096
_SURROGATE = re.compile("[\ud800-\udfff]")


@dataclass(frozen=True)
class RequestEvidence:
    """One request of one check: where it went and what came back, cut at both ends."""

    check: str  # the check that sent it (smoke for the plain requests)
    request: str  # the prompt's name, round or part
    finish_reason: str | None
    completion_tokens: int
    head: str  # the first EDGE_CHARS characters
    tail: str = ""  # the last EDGE_CHARS, when the answer is longer than both ends
    chars: int = 0
    prompt_tokens: int | None = None
    note: str = ""  # e.g. "reasoning" for a chat answer's reasoning part

    @classmethod
    def of_text(
        cls,
        check: str,
        request: str,
        text: str,
        finish: str | None,
        tokens: int,
        prompt_tokens: int | None = None,
        note: str = "",
    ) -> RequestEvidence:
        head, tail = edges(text)
        return cls(check, request, finish, tokens, head, tail, len(text), prompt_tokens, note)

    @classmethod
    def of(
        cls, check: str, request: str, generation: Generation, prompt_tokens: int | None = None
    ) -> RequestEvidence:
        return cls.of_text(
            check,
            request,
            generation.text,
            generation.finish_reason,
            generation.completion_tokens,
            prompt_tokens,
        )

    @classmethod
    def of_chat(cls, check: str, request: str, answer: ChatAnswer) -> list[RequestEvidence]:
        kept = [
            cls.of_text(
                check,
                request,
                answer.content,
                answer.finish_reason,
                answer.completion_tokens,
                answer.prompt_tokens,
                "content",
            )
        ]
        if answer.reasoning:
            kept.append(
                cls.of_text(
                    check,
                    request,
                    answer.reasoning,
                    answer.finish_reason,
                    answer.completion_tokens,
                    answer.prompt_tokens,
                    "reasoning",
                )
            )
        return kept

    def to_json(self) -> dict[str, Any]:
        shown = {
            "check": self.check,
            "request": self.request,
            "finish_reason": self.finish_reason,
            "completion_tokens": self.completion_tokens,
            "prompt_tokens": self.prompt_tokens,
            "chars": self.chars,
            "head": self.head,
            "tail": self.tail,
            "note": self.note,
        }
        return {key: value for key, value in shown.items() if value not in (None, "")}


def edges(text: str) -> tuple[str, str]:
    """(head, tail) of an answer, redacted: the whole text as head when it is short."""
    if len(text) <= 2 * EDGE_CHARS:
        return kept(text, 2 * EDGE_CHARS), ""
    return kept(text, EDGE_CHARS), kept(text, EDGE_CHARS, tail=True)


def kept(text: str, limit: int, *, tail: bool = False) -> str:
    """At most ``limit`` characters of an engine's ``text`` (its first, or its last with
    ``tail``), redacted before they are cut, so a secret across the cut is masked whole and
    never half kept; lone surrogates (a JSON ``\\ud800`` alone: no UTF-8 can hold it) become
    U+FFFD."""
    window = text[-(limit + REDACT_MARGIN) :] if tail else text[: limit + REDACT_MARGIN]
    masked = redact(window)
    keep = limit
    if len(window) < len(text):  # a secret at the window's far edge is cut: keep clear of it
        keep = max(0, min(limit, len(masked) - REDACT_MARGIN))
    part = masked[len(masked) - keep :] if tail else masked[:keep]
    return _SURROGATE.sub("\ufffd", part)


__all__ = ["EDGE_CHARS", "RequestEvidence", "edges", "kept"]
