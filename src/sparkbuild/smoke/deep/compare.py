"""Token-by-token comparison of two greedy generations of the same request, with the tie rule
the ``lossless`` and ``burn-in`` checks share.

Greedy decoding is deterministic in exact arithmetic; on a GPU, batched verification is not
bit-exact, so two runs may pick different tokens where the model's top two are all but
equal. At the first differing position, the reference's logprobs say how far apart they
were: the gap is the reference's top-1 logprob minus its logprob of the token the other run
chose. Under ``epsilon`` that is a numerical tie (noted; the texts cannot be compared past
it); otherwise the other run chose a token the model did not, and the check fails.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from sparkbuild.adapters import Generation
from sparkbuild.smoke.deep.evidence import kept

#: Tokens of text shown on either side of a divergence, and the characters kept of each
#: side and of one token's text.
CONTEXT_TOKENS = 12
CONTEXT_CHARS = 240
TOKEN_CHARS = 80
#: Ties a verdict shows with their text; the others by request and position.
SHOWN_TIES = 3
#: Ties crossed in one request at most, and the tokens of each part of a continuation: a
#: tie costs the reference a generation of one part, not of the rest of the request.
MAX_TIES = 32
CONTINUATION_TOKENS = 32


@dataclass(frozen=True)
class Divergence:
    """The first position where a run differs from its reference."""

    request: str
    position: int  # 0-based, in generated tokens
    token_id: int | None  # what the run under test chose (None: it ended there)
    reference_id: int | None  # what the reference chose (None: it ended there)
    gap: float | None  # reference top-1 minus its logprob of ``token_id``; None: unknown
    gap_at_least: bool = False  # ``token_id`` not among the reference's top k: gap >= this
    tie: bool = False
    token_text: str = ""
    reference_text: str = ""
    context: str = ""  # the common text before it, then [run | reference]

    def describe(self) -> str:
        if self.token_id is None or self.reference_id is None:
            ended = "the run" if self.token_id is None else "the reference"
            return f"{self.request}: {ended} ended at token {self.position}; {self.context}"
        if self.gap is None:
            gap = "gap unknown (the reference sent no logprobs there)"
        else:
            gap = f"gap {'>= ' if self.gap_at_least else ''}{self.gap:.4f}"
        return (
            f"{self.request}: token {self.position} is {self.token_id} {self.token_text!r}, "
            f"the reference's is {self.reference_id} {self.reference_text!r} ({gap}); "
            f"{self.context}"
        )

    def numbers(self) -> dict[str, object]:
        return {
            "request": self.request,
            "position": self.position,
            "token_id": self.token_id,
            "token_text": self.token_text,
            "reference_id": self.reference_id,
            "reference_text": self.reference_text,
            "gap": None if self.gap is None else round(self.gap, 6),
            "gap_at_least": self.gap_at_least,
            "tie": self.tie,
            "context": self.context,
        }


Texts = Callable[[Sequence[int]], str]


def missing_ids(request: str, run: Generation, reference: Generation) -> str | None:
    """Why ``run`` and ``reference`` cannot be compared token by token (a side sent no token
    ids: an engine that leaves them out, or an empty answer), or None. Two empty lists are
    not "identical": nothing was compared."""
    sides = [
        side for side, g in (("the run", run), ("the reference", reference)) if not g.token_ids
    ]
    if not sides:
        return None
    return (
        f"{request}: {' and '.join(sides)} sent no token ids "
        f"({len(run.text)} and {len(reference.text)} characters of text), so nothing was compared"
    )


def first_divergence(
    request: str,
    run: Generation,
    reference: Generation,
    epsilon: float,
    texts: Texts,
    start: int = 0,
) -> Divergence | None:
    """Where ``run`` first differs from ``reference`` (None: the same tokens), judged by the
    tie rule; ``texts`` turns token ids into text for the report. With ``start``, the
    reference continues the run from its token ``start`` on (after a tie), and positions are
    the run's."""
    ours, theirs = run.token_ids, reference.token_ids
    offset = next(
        (i for i, (a, b) in enumerate(zip(ours[start:], theirs, strict=False)) if a != b),
        min(len(ours) - start, len(theirs)),
    )
    position = start + offset
    if position == len(ours) and offset == len(theirs):
        return None
    context = _context(ours, theirs, position, offset, texts)
    if position >= len(ours) or offset >= len(theirs):
        return Divergence(
            request, position, _at(ours, position), _at(theirs, offset), None, context=context
        )
    chosen, wanted = ours[position], theirs[offset]
    gap, at_least = _gap(reference, offset, chosen, wanted)
    return Divergence(
        request,
        position,
        chosen,
        wanted,
        gap,
        at_least,
        tie=gap is not None and not at_least and gap < epsilon,
        token_text=kept(texts([chosen]), TOKEN_CHARS),
        reference_text=kept(texts([wanted]), TOKEN_CHARS),
        context=context,
    )


#: Continues the reference from the run's first ``n`` tokens (the prompt, then those token
#: ids), to the request's end: its Generation, or why it cannot.
Resume = Callable[[int], "Generation | str"]


@dataclass(frozen=True)
class Comparison:
    """One request compared over its whole length, across every numerical tie."""

    request: str
    ties: tuple[Divergence, ...] = ()  # each crossed (the reference continued past it)
    divergence: Divergence | None = None  # where the run left the model's text
    stopped: str = ""  # why a tie could not be crossed (the request is not compared past it)
    tail: Generation | None = None  # the reference's last continuation, when ties were crossed


def compare_across_ties(
    request: str,
    run: Generation,
    reference: Generation,
    epsilon: float,
    texts: Texts,
    resume: Resume | None,
) -> Comparison:
    """``run`` against ``reference`` token by token; at each tie the reference is given the
    run's tokens up to it (``resume``: a part of at most ``CONTINUATION_TOKENS``, continued
    the same way where it ends) and the comparison goes on from there, to the end."""
    ties: list[Divergence] = []
    start, segment = 0, reference
    while True:
        found = _next(request, run, segment, epsilon, texts, start, shown=len(ties) < SHOWN_TIES)
        if found is not None and segment is not reference and _part_ended(found, segment):
            start = found.position  # a part of the continuation ended, the run goes on
        elif found is None or not found.tie:
            return Comparison(request, tuple(ties), found, tail=segment if ties else None)
        else:
            ties.append(found)
            start = found.position + 1
        why = _no_further(run, start, resume, ties)
        if why is not None or resume is None:
            return Comparison(request, tuple(ties), stopped=why or "")
        resumed = resume(start)
        if isinstance(resumed, str):
            return Comparison(request, tuple(ties), stopped=resumed)
        segment = resumed


def _next(
    request: str,
    run: Generation,
    segment: Generation,
    epsilon: float,
    texts: Texts,
    start: int,
    *,
    shown: bool,
) -> Divergence | None:
    """The next divergence from ``start``; a tie past the ones a verdict shows is found
    without decoding its text."""
    found = first_divergence(request, run, segment, epsilon, texts if shown else _untold, start)
    if found is not None and not found.tie and not shown:
        found = first_divergence(request, run, segment, epsilon, texts, start)
    return found


def _part_ended(found: Divergence, segment: Generation) -> bool:
    """Whether ``found`` is only the end of a continuation's part (its ``max_tokens``)."""
    return found.reference_id is None and segment.finish_reason == "length"


def _no_further(
    run: Generation, start: int, resume: Resume | None, ties: Sequence[Divergence]
) -> str | None:
    """Why the comparison ends at ``start`` ("": compared to the run's end), or None."""
    if start >= len(run.token_ids):  # a tie at the run's last token: nothing after it
        return ""
    if resume is None:
        return "no engine to continue from"
    if len(ties) >= MAX_TIES:
        return f"{len(ties)} ties in one request: more are not crossed (numbers, not ties)"
    return None


def _untold(ids: Sequence[int]) -> str:
    """No text: a tie past the ones a verdict shows costs no decoding."""
    return ""


def _at(ids: Sequence[int], position: int) -> int | None:
    return ids[position] if position < len(ids) else None


def _gap(
    reference: Generation, position: int, chosen: int, wanted: int
) -> tuple[float | None, bool]:
    """The reference's top-1 logprob minus its logprob of ``chosen`` at ``position``; when
    ``chosen`` is not among its top k, the gap to the k-th (a lower bound)."""
    if position >= len(reference.top_logprobs):
        return None, False
    ranked = {k: v for k, v in reference.top_logprobs[position].items() if math.isfinite(v)}
    if not ranked:
        return None, False
    best = ranked.get(wanted, max(ranked.values()))
    if chosen in ranked:
        return max(0.0, best - ranked[chosen]), False
    return max(0.0, best - min(ranked.values())), True


def _context(
    ours: Sequence[int], theirs: Sequence[int], position: int, offset: int, texts: Texts
) -> str:
    """The run's text before ``position``, then both texts from it (the reference's from
    ``offset``), each redacted and cut to ``CONTEXT_CHARS``: an engine's text of 12 tokens
    is not bounded."""
    before = kept(
        texts(ours[max(0, position - CONTEXT_TOKENS) : position]), CONTEXT_CHARS, tail=True
    )
    mine = kept(texts(ours[position : position + CONTEXT_TOKENS]), CONTEXT_CHARS)
    other = kept(texts(theirs[offset : offset + CONTEXT_TOKENS]), CONTEXT_CHARS)
    return f"…{before!r} then [{mine!r} | reference {other!r}]"


__all__ = [
    "CONTEXT_TOKENS",
    "CONTINUATION_TOKENS",
    "Comparison",
    "Divergence",
    "Resume",
    "compare_across_ties",
    "first_divergence",
    "missing_ids",
]
