"""The deep checks that run on the engine under test while it is up: burn-in, long output,
long context, the chat path and acceptance per draft position. Each phase returns its
:class:`CheckResult` and the evidence of its requests."""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any

from sparkbuild.adapters import (
    EngineAdapter,
    Generation,
    PositionCounts,
    answers,
    non_finite,
)
from sparkbuild.checks import CheckResult
from sparkbuild.engines.profiles import (
    AcceptancePerPositionLimits,
    BurnInLimits,
    ChatLimits,
    LongContextLimits,
    LongOutputLimits,
    SmokeProfile,
)
from sparkbuild.engines.prompts import Prompt
from sparkbuild.errors import EngineHTTPError
from sparkbuild.smoke.deep.compare import Divergence, first_divergence, missing_ids
from sparkbuild.smoke.deep.evidence import RequestEvidence
from sparkbuild.smoke.deep.text import Finding, TextJudgement, judge

Progress = Callable[[str], None]
#: Tokens left free between a prompt and the model's context (the engines count a few
#: special tokens of their own).
CONTEXT_MARGIN = 8
#: The most characters of the filler's English words one token can be (large vocabularies
#: take a word and its space: about 6); a count implying more is not believed.
MAX_FILLER_CHARS_PER_TOKEN = 16


@dataclass
class PhaseResult:
    check: CheckResult
    evidence: list[RequestEvidence] = field(default_factory=list)


@dataclass(frozen=True)
class Engine:
    """The engine under test, as a phase talks to it."""

    adapter: EngineAdapter
    base_url: str
    profile: SmokeProfile

    def extra(
        self, own: Mapping[str, object] | None = None, seed: int | None = None
    ) -> dict[str, object]:
        """The profile's request fields, its deep checks' (for ``own`` given), then the
        phase's own, then the seed."""
        deep = self.profile.deep_request if own is not None else {}
        fields = {**self.profile.request, **deep, **(own or {})}
        if seed is not None:
            fields[self.adapter.seed_field] = seed
        return fields

    def texts(self, ids: Sequence[int]) -> str:
        if not ids:
            return ""
        text = answers.detokenize(self.adapter, self.adapter.session(), self.base_url, ids)
        return text if text is not None else f"<ids {list(ids)[:8]}>"


# --- burn-in -------------------------------------------------------------------------------


def burn_in(
    engine: Engine,
    first: Sequence[tuple[Prompt, Generation]],
    extra: Mapping[str, object],
    limits: BurnInLimits,
    progress: Progress,
) -> PhaseResult:
    """Rounds 2..``rounds`` of the same greedy requests at ``concurrency``; each answer's
    tokens equal round 1's under the tie rule. Round 1 is ``first``: the smoke's own
    requests (lossless's speculative run), sent one at a time with ``extra``."""
    copies = max(limits.concurrency, len(first))
    picked = [first[i % len(first)] for i in range(copies)]
    names = [f"{prompt.name}#{i // len(first) + 1}" for i, (prompt, _) in enumerate(picked)]
    engine.adapter.request_model(engine.adapter.session(), engine.base_url)  # once, not per thread
    ties: list[Divergence] = []
    evidence: list[RequestEvidence] = []
    for round_number in range(2, limits.rounds + 1):
        progress(
            f"deep: burn-in round {round_number} of {limits.rounds} "
            f"({copies} requests, {limits.concurrency} at a time; round 1 was the smoke's own)"
        )
        try:
            answers = _round(engine, [p.text for p, _ in picked], extra, limits)
        except EngineHTTPError as exc:
            detail = f"round {round_number} failed: {exc.message}"
            return PhaseResult(CheckResult("burn-in", "fail", detail), evidence)
        for name, ours, (_, theirs) in zip(names, answers, picked, strict=True):
            missing = missing_ids(f"round {round_number} {name}", ours, theirs)
            if missing:
                evidence.append(RequestEvidence.of("burn-in", f"round {round_number} {name}", ours))
                return PhaseResult(CheckResult("burn-in", "fail", missing), evidence)
            found = first_divergence(
                f"round {round_number} {name}", ours, theirs, limits.tie_epsilon, engine.texts
            )
            if found is None:
                continue
            if not found.tie:
                evidence.append(RequestEvidence.of("burn-in", f"round {round_number} {name}", ours))
                value = {
                    "rounds": limits.rounds,
                    "requests": copies,
                    "ties": len(ties),
                    "divergence": found.numbers(),
                }
                detail = f"round {round_number} differs from round 1: {found.describe()}"
                return PhaseResult(CheckResult("burn-in", "fail", detail, value=value), evidence)
            ties.append(found)
    value = {
        "rounds": limits.rounds,
        "requests": copies,
        "ties": len(ties),
        "tie_positions": [t.numbers() for t in ties[:3]],
    }
    noted = f"; {len(ties)} numerical tie(s) noted" if ties else ""
    detail = (
        f"round 1 (the smoke's {len(first)} requests, one at a time) and "
        f"{limits.rounds - 1} round(s) of {copies} at concurrency {limits.concurrency}: "
        f"every round equals round 1{noted}"
    )
    return PhaseResult(CheckResult("burn-in", "pass", detail, value=value), evidence)


def _round(
    engine: Engine, texts: Sequence[str], extra: Mapping[str, object], limits: BurnInLimits
) -> list[Generation]:
    max_tokens = engine.profile.expect.max_tokens

    def one(text: str) -> Generation:
        session = engine.adapter.session()
        return engine.adapter.generate(
            session, engine.base_url, text, max_tokens, dict(extra), ranked=limits.top_logprobs
        )

    with ThreadPoolExecutor(max_workers=limits.concurrency) as pool:
        return list(pool.map(one, texts))


# --- long output ---------------------------------------------------------------------------


def long_output(
    engine: Engine, limits: LongOutputLimits, seed: int, progress: Progress
) -> PhaseResult:
    """``requests`` generations as long as the model's context allows (up to
    ``max_tokens``), each judged window by window. Request i carries ``seed + i``: a
    sampled verdict is re-run to the same text."""
    session = engine.adapter.session()
    counted = answers.count_tokens(engine.adapter, session, engine.base_url, limits.prompt)
    max_tokens, why = _output_budget(limits.max_tokens, counted, engine)
    evidence: list[RequestEvidence] = []
    judged: list[tuple[str, TextJudgement]] = []
    for index in range(limits.requests):
        name = f"long-output/{index + 1}"
        progress(f"deep: long output {index + 1} of {limits.requests} ({max_tokens} tokens{why})")
        try:
            generation = engine.adapter.generate(
                session,
                engine.base_url,
                limits.prompt,
                max_tokens,
                engine.extra(limits.request, seed + index),
                ranked=2,
            )
        except EngineHTTPError as exc:
            return PhaseResult(
                CheckResult("long-output", "fail", f"{name}: {exc.message}"), evidence
            )
        evidence.append(RequestEvidence.of("long-output", name, generation))
        judged.append((name, _judge_generation(generation, limits, max_tokens)))
    return PhaseResult(_text_verdict("long-output", judged, max_tokens), evidence)


def _output_budget(
    wanted: int, counted: tuple[int, int | None] | None, engine: Engine
) -> tuple[int, str]:
    """``wanted`` tokens, cut to what the context leaves after the prompt."""
    prompt_tokens, context = counted if counted else (0, None)
    context = context or engine.adapter.declared_max_len(engine.profile.args)
    if context is None:
        return wanted, ""
    room = context - prompt_tokens - CONTEXT_MARGIN
    if room >= wanted:
        return wanted, ""
    return max(1, room), f", all the {context}-token context leaves"


def _judge_generation(
    generation: Generation, limits: LongOutputLimits | LongContextLimits, max_tokens: int
) -> TextJudgement:
    return judge(generation.text, limits, generation.token_ids, max_tokens)


def _text_verdict(
    check: str, judged: Sequence[tuple[str, TextJudgement]], tokens: int
) -> CheckResult:
    value = {
        "max_tokens": tokens,
        "generations": [{"request": n, **j.numbers()} for n, j in judged],
    }
    bad = [(name, j) for name, j in judged if not j.ok]
    if bad:
        name, worst = bad[0]
        return CheckResult(check, "fail", f"{name}: {worst.describe()}", value=value)
    total = sum(j.units for _, j in judged)
    if not total:
        return CheckResult(check, "fail", "no generated text to judge", value=value)
    detail = f"{len(judged)} generation(s), {total} words: no loop, run or garbage in any window"
    return CheckResult(check, "pass", detail, value=value)


# --- long context --------------------------------------------------------------------------

# a word list: one word a line would spread it over 60 lines
_FILLER_WORDS = (
    "the", "system", "memory", "cache", "node", "kernel", "request", "token", "model",
    "layer", "batch", "queue", "server", "graph", "tensor", "stream", "value", "index",
    "block", "page", "buffer", "signal", "driver", "thread", "process", "channel", "network",
    "packet", "vector", "matrix", "weight", "bias", "scale", "shape", "format", "report",
    "record", "engine", "window", "context", "answer", "question", "river", "mountain",
    "city", "garden", "market", "winter", "summer", "morning", "evening", "library",
    "bridge", "harbor", "forest", "meadow", "village", "station",
)  # fmt: skip
_QUESTION = "\n\nQuestion: in one sentence, what are the notes above about?\nAnswer:"


def filler(chars: int, seed: int = 0) -> str:
    """Varied sentences of ``chars`` characters (no loop for a checker to find)."""
    rng = random.Random(seed)
    out: list[str] = []
    size = 0
    while size < chars:
        sentence = " ".join(rng.choice(_FILLER_WORDS) for _ in range(rng.randint(8, 15)))
        out.append(sentence.capitalize() + ".")
        size += len(out[-1]) + 1
    return " ".join(out)[:chars]


def long_context(
    engine: Engine, limits: LongContextLimits, seed: int, progress: Progress
) -> PhaseResult:
    """One prompt of ``depth`` tokens (the context permitting), sent with ``seed``; its
    answer must be finite, not a run of one token id, and neither empty nor cut."""
    session = engine.adapter.session()
    progress("deep: long context: sizing the prompt")
    try:
        prompt, tokens, why = _deep_prompt(engine, limits)
    except _UnsizedError as exc:
        return PhaseResult(CheckResult("long-context", "fail", str(exc)))
    progress(f"deep: long context: a {tokens}-token prompt{why}")
    try:
        generation = engine.adapter.generate(
            session,
            engine.base_url,
            prompt,
            limits.max_tokens,
            engine.extra(limits.request, seed),
            ranked=2,
        )
    except EngineHTTPError as exc:
        nan = engine.adapter.nan_response.search(exc.body)
        what = "the answer held NaN/inf logprobs: " if nan else ""
        failed = {"prompt_tokens": tokens, "nan": bool(nan)}
        return PhaseResult(CheckResult("long-context", "fail", what + exc.message, value=failed))
    evidence = [RequestEvidence.of("long-context", f"depth {tokens}", generation, tokens)]
    problems = _context_problems(generation, limits)
    value: dict[str, object] = {
        "prompt_tokens": tokens,
        "completion_tokens": generation.completion_tokens,
        "finish_reason": generation.finish_reason,
        "nan_logprobs": non_finite(generation.logprobs),
    }
    if problems:
        return PhaseResult(
            CheckResult("long-context", "fail", "; ".join(problems), value=value), evidence
        )
    detail = (
        f"a {tokens}-token prompt: {generation.completion_tokens} tokens answered, "
        f"every logprob finite, no run of one token"
    )
    return PhaseResult(CheckResult("long-context", "pass", detail, value=value), evidence)


class _UnsizedError(Exception):
    """The engine's token counts cannot be true: the prompt cannot be sized by them."""


def _counted(engine: Engine, text: str) -> tuple[int, int | None] | None:
    """``/tokenize``'s count of ``text`` (None: the engine has none), held to what text can
    be: from one token per ``MAX_FILLER_CHARS_PER_TOKEN`` characters to one per character
    (and a few special ones). A count outside that would size a prompt of any length."""
    session = engine.adapter.session()
    counted = answers.count_tokens(engine.adapter, session, engine.base_url, text)
    if counted is None:
        return None
    low, high = len(text) / MAX_FILLER_CHARS_PER_TOKEN, len(text) + CONTEXT_MARGIN
    if not low <= counted[0] <= high:
        raise _UnsizedError(
            f"the engine's /tokenize counts {counted[0]} tokens in {len(text)} characters of "
            f"text (possible: {int(low)} to {high}); the prompt cannot be sized by it"
        )
    return counted


def _deep_prompt(engine: Engine, limits: LongContextLimits) -> tuple[str, int, str]:
    """A prompt of about ``depth`` tokens (cut to the context less the answer), counted by
    the engine's own tokenizer where it has ``/tokenize``; _UnsizedError when its counts cannot
    be true."""
    probe = _counted(engine, filler(4000) + _QUESTION)
    context = (probe[1] if probe else None) or engine.adapter.declared_max_len(engine.profile.args)
    depth, why = limits.depth, ""
    if context is not None and depth > context - limits.max_tokens - CONTEXT_MARGIN:
        depth = context - limits.max_tokens - CONTEXT_MARGIN
        why = f" (depth {limits.depth} cut to the {context}-token context)"
    chars_per_token = 4000 / probe[0] if probe and probe[0] else 4.0
    chars = int(depth * chars_per_token)
    for _ in range(6):  # the count per character varies a little with the text's length
        prompt = filler(chars) + _QUESTION
        counted = _counted(engine, prompt)
        if counted is None:
            return prompt, depth, why + " (estimated: the engine has no /tokenize)"
        if counted[0] <= depth:
            return prompt, counted[0], why
        chars = int(chars * depth / counted[0]) - 8
    return prompt, depth, why + " (about: the count did not settle)"


def _context_problems(generation: Generation, limits: LongContextLimits) -> list[str]:
    problems = []
    bad = non_finite(generation.logprobs)
    if not generation.logprobs:
        problems.append("the answer carried no logprobs to check")
    elif bad:
        problems.append(f"{bad} of {len(generation.logprobs)} logprobs are NaN, null or infinite")
    if not generation.text.strip():
        problems.append("the answer is empty")
    if generation.finish_reason not in ("stop", "length"):
        problems.append(f"the answer was cut (finish reason {generation.finish_reason!r})")
    elif generation.finish_reason == "length" and generation.completion_tokens < limits.max_tokens:
        problems.append(
            f"the answer stopped at {generation.completion_tokens} of "
            f"{limits.max_tokens} tokens with finish reason 'length'"
        )
    judged = _judge_generation(generation, limits, limits.max_tokens)
    runs = [f for f in judged.findings if f.kind in ("run", "zero-run", "oversized")]
    if runs:
        first = runs[0]
        at = "" if first.kind == "oversized" else f" at {first.unit} {first.start}"
        problems.append(first.detail + at)
    return problems


# --- the chat path -------------------------------------------------------------------------


def chat(engine: Engine, limits: ChatLimits, seed: int, progress: Progress) -> PhaseResult:
    """Each prompt through ``/v1/chat/completions``; the content must not be empty, and
    content and reasoning are each judged as text."""
    session = engine.adapter.session()
    evidence: list[RequestEvidence] = []
    problems: list[str] = []
    shown: list[dict[str, Any]] = []
    for index, prompt in enumerate(limits.prompts, start=1):
        name = f"chat/{index}"
        progress(f"deep: chat {index} of {len(limits.prompts)}")
        try:
            answer = answers.chat(
                engine.adapter,
                session,
                engine.base_url,
                prompt,
                limits.max_tokens,
                engine.extra(limits.request, seed + index),
            )
        except EngineHTTPError as exc:
            problems.append(f"{name}: {exc.message}")
            continue
        evidence += RequestEvidence.of_chat("chat", name, answer)
        shown.append(
            {
                "request": name,
                "content_chars": len(answer.content),
                "reasoning_chars": len(answer.reasoning),
                "finish_reason": answer.finish_reason,
            }
        )
        problems += _chat_problems(name, answer.content, answer.reasoning, limits)
    value = {"answers": shown}
    if problems:
        return PhaseResult(
            CheckResult("chat", "fail", "; ".join(problems[:3]), value=value), evidence
        )
    reasoning = sum(int(a["reasoning_chars"] or 0) for a in shown)
    split = f", {reasoning} characters of reasoning apart" if reasoning else ", no reasoning part"
    detail = f"{len(shown)} chat answer(s) with content{split}; no loop or garbage in either"
    return PhaseResult(CheckResult("chat", "pass", detail, value=value), evidence)


def _chat_problems(name: str, content: str, reasoning: str, limits: ChatLimits) -> list[str]:
    problems = []
    if not content.strip():
        where = (
            f"all {len(reasoning)} characters went to reasoning"
            if reasoning.strip()
            else "the answer is empty"
        )
        problems.append(f"{name}: the content is empty ({where})")
    for part, text in (("content", content), ("reasoning", reasoning)):
        judged = judge(text, limits, max_tokens=limits.max_tokens)
        if not judged.ok:
            problems.append(f"{name} {part}: {judged.describe()}")
    return problems


# --- acceptance per position ---------------------------------------------------------------


def _counts_problem(before: PositionCounts, after: PositionCounts) -> str:
    """Why two scrapes of the per-position counters cannot be true (a count that is not a
    finite number, fewer positions the second time, a count that went down), or empty."""
    for when, counts in (("first", before), ("second", after)):
        values = [counts.drafts, *counts.accepted]
        if not all(math.isfinite(v) and v >= 0 for v in values):
            return f"the {when} scrape holds a count that is not a finite number ({values[:8]})"
    if before.accepted and len(after.accepted) < len(before.accepted):
        return (
            f"{len(before.accepted)} positions in the first scrape, "
            f"{len(after.accepted)} in the second"
        )
    earlier = [before.drafts, *before.accepted]
    later = [after.drafts, *after.accepted]
    if any(now < then for now, then in zip(later, earlier, strict=False)):
        return "a count went down between the scrapes"
    return ""


def acceptance_per_position(
    adapter: EngineAdapter,
    before: PositionCounts,
    after: PositionCounts,
    limits: AcceptancePerPositionLimits,
    speculation: bool,
) -> CheckResult:
    """The share of drafts accepted at each draft position over the run, against the
    profile's floors, from the engine's own counters."""
    name = "acceptance-per-position"
    if not speculation:
        return CheckResult(name, "skip", "profile expects no speculation")
    if adapter.per_position_missing:
        return CheckResult(name, "skip", adapter.per_position_missing)
    broken = _counts_problem(before, after)
    if broken:
        return CheckResult(name, "fail", f"the per-position counters cannot be true: {broken}")
    rates = after.rates_since(before)
    if rates is None:
        why = after.note or before.note or "no drafts during the run"
        detail = f"no per-position acceptance: {why}"
        if limits.min_rates:
            return CheckResult(name, "fail", detail)
        return CheckResult(name, "skip", detail)
    value = {
        "rates": [round(r, 3) for r in rates],
        "floors": list(limits.min_rates),
        "drafts": after.drafts - before.drafts,
    }
    shown = ", ".join(f"{i + 1}: {r:.2f}" for i, r in enumerate(rates))
    low = [
        (i, r, f) for i, (r, f) in enumerate(zip(rates, limits.min_rates, strict=False)) if r < f
    ]
    if low:
        position, rate, floor = low[0]
        detail = (
            f"position {position + 1} accepted {rate:.2f} of drafts, floor {floor:.2f} "
            f"(by position: {shown})"
        )
        return CheckResult(name, "fail", detail, value=value)
    floors = " (no floors set)" if not limits.min_rates else " (every floor met)"
    return CheckResult(name, "pass", f"by position: {shown}{floors}", value=value)


__all__ = [
    "Engine",
    "Finding",
    "PhaseResult",
    "acceptance_per_position",
    "burn_in",
    "chat",
    "filler",
    "long_context",
    "long_output",
]
