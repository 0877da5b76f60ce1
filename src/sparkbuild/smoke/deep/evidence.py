"""What a smoke run keeps of each answer, so a verdict can be looked at afterwards: the first
and last characters, the finish reason, the token counts. Redacted as every record is."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkbuild.engines.adapters import ChatAnswer, Generation
from sparkbuild.redact import redact

#: Characters kept from each end of an answer.
EDGE_CHARS = 500


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
        return redact(text), ""
    return redact(text[:EDGE_CHARS]), redact(text[-EDGE_CHARS:])


__all__ = ["EDGE_CHARS", "RequestEvidence", "edges"]
