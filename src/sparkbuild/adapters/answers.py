"""What the deep checks ask an engine beyond completions: a chat answer with its reasoning
apart, a token count, the text of token ids. The requests are the adapter's (its endpoints,
its body shapes, its reasoning fields and the model name a request names: :mod:`.http`);
these are the deep checks' view of them."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from typing import Any, Protocol, runtime_checkable

from sparkbuild import net
from sparkbuild.adapters.base import EngineAdapter
from sparkbuild.adapters.values import MAX_TOKENS, Generation, parse_or_fail, whole_number
from sparkbuild.errors import EngineHTTPError


@runtime_checkable
class IdPrompts(Protocol):
    """An adapter whose engine takes a prompt of token ids (lossless's reference continues
    past a tie with the speculative run's own tokens): vLLM's and SGLang's."""

    def generate_ids(
        self,
        session: net.Session,
        base_url: str,
        prompt_ids: Sequence[int],
        max_tokens: int,
        extra: Mapping[str, object] | None = None,
        *,
        ranked: int = 0,
    ) -> Generation:
        """:meth:`EngineAdapter.generate` of a prompt given as token ids."""
        ...


@dataclass(frozen=True)
class ChatAnswer:
    """One answer of ``/v1/chat/completions``: its content and its reasoning, kept apart as
    the engine's reasoning parser split them."""

    content: str
    reasoning: str
    finish_reason: str | None
    completion_tokens: int
    prompt_tokens: int
    seconds: float = 0.0


def chat(
    adapter: EngineAdapter,
    session: net.Session,
    base_url: str,
    prompt: str,
    max_tokens: int,
    extra: Mapping[str, object] | None = None,
) -> ChatAnswer:
    """One greedy chat answer through ``/v1/chat/completions`` (the model's chat template
    and the server's reasoning parser apply)."""
    body = {
        "model": adapter.request_model(session, base_url),
        "messages": [{"role": "user", "content": prompt}],
        "max_tokens": max_tokens,
        "temperature": 0,
        **(extra or {}),
    }
    url = base_url + adapter.endpoints.chat
    payload, seconds = adapter.post_json(session, url, body)
    return parse_or_fail(f"POST {url}", lambda: chat_answer(adapter, payload, seconds))


def chat_answer(
    adapter: EngineAdapter, payload: Mapping[str, Any], seconds: float = 0.0
) -> ChatAnswer:
    """A chat completion as a :class:`ChatAnswer`; ValueError/TypeError on a wrong shape."""
    choice = (payload.get("choices") or [{}])[0]
    message = choice.get("message") or {}
    if not isinstance(message, Mapping):
        raise ValueError(f"choices[0].message is {repr(message)[:60]}")
    reasoning = next((message[f] for f in adapter.reasoning_fields if message.get(f)), "")
    usage = payload.get("usage") or {}
    return ChatAnswer(
        content=str(message.get("content") or ""),
        reasoning=str(reasoning or ""),
        finish_reason=choice.get("finish_reason"),
        completion_tokens=whole_number(usage.get("completion_tokens"), "completion_tokens"),
        prompt_tokens=whole_number(usage.get("prompt_tokens"), "prompt_tokens"),
        seconds=seconds,
    )


def count_tokens(
    adapter: EngineAdapter, session: net.Session, base_url: str, text: str
) -> tuple[int, int | None] | None:
    """How many tokens ``text`` is to the served model, and the model's context length when
    the engine says (the adapter's tokenizer request, in its engine's shape); None when the
    engine does not tell."""
    try:
        counted = adapter.count_tokens(session, base_url, text)
    except EngineHTTPError:
        return None
    return (counted.count, counted.context) if counted is not None else None


def prompt_ids(
    adapter: EngineAdapter, session: net.Session, base_url: str, text: str
) -> list[int] | None:
    """The token ids the served model reads ``text`` as, special tokens included as a
    completion adds them (``/tokenize``: ``tokens``; vLLM and SGLang alike); None when the
    engine does not tell."""
    body = {"model": adapter.request_model(session, base_url), "prompt": text}
    try:
        payload, _ = adapter.post_json(session, base_url + "/tokenize", body)
        tokens = payload.get("tokens")
        if not isinstance(tokens, list) or len(tokens) > MAX_TOKENS:
            return None
        if not all(type(token) is int for token in tokens):
            return None
        return [whole_number(token, "token id", 1 << 31) for token in tokens]
    except (EngineHTTPError, ValueError):
        return None


def detokenize(
    adapter: EngineAdapter, session: net.Session, base_url: str, ids: Sequence[int]
) -> str | None:
    """The text of token ``ids`` (the adapter's detokenizer request); None when the engine
    does not say."""
    return adapter.detokenize(session, base_url, ids)


__all__ = [
    "ChatAnswer",
    "IdPrompts",
    "chat",
    "chat_answer",
    "count_tokens",
    "detokenize",
    "prompt_ids",
]
