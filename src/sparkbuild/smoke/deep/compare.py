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

from sparkbuild.engines.adapters import Generation
from sparkbuild.redact import redact

#: Tokens of text shown on either side of a divergence.
CONTEXT_TOKENS = 12


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
    request: str, run: Generation, reference: Generation, epsilon: float, texts: Texts
) -> Divergence | None:
    """Where ``run`` first differs from ``reference`` (None: the same tokens), judged by the
    tie rule; ``texts`` turns token ids into text for the report."""
    ours, theirs = run.token_ids, reference.token_ids
    position = next(
        (i for i, (a, b) in enumerate(zip(ours, theirs, strict=False)) if a != b),
        min(len(ours), len(theirs)),
    )
    if position == len(ours) == len(theirs):
        return None
    context = _context(ours, theirs, position, texts)
    if position >= len(ours) or position >= len(theirs):
        return Divergence(
            request, position, _at(ours, position), _at(theirs, position), None, context=context
        )
    chosen, wanted = ours[position], theirs[position]
    gap, at_least = _gap(reference, position, chosen, wanted)
    return Divergence(
        request,
        position,
        chosen,
        wanted,
        gap,
        at_least,
        tie=gap is not None and not at_least and gap < epsilon,
        token_text=texts([chosen]),
        reference_text=texts([wanted]),
        context=context,
    )


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


def _context(ours: Sequence[int], theirs: Sequence[int], position: int, texts: Texts) -> str:
    before = texts(ours[max(0, position - CONTEXT_TOKENS) : position])
    mine = texts(ours[position : position + CONTEXT_TOKENS])
    other = texts(theirs[position : position + CONTEXT_TOKENS])
    return redact(f"…{before!r} then [{mine!r} | reference {other!r}]")


__all__ = ["CONTEXT_TOKENS", "Divergence", "first_divergence", "missing_ids"]
