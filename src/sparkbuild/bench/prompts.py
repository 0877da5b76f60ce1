"""Deterministic benchmark prompts, hit to the token with the engine's own tokenizer.

Every request gets ``head + body``:

* ``body`` is prose drawn from a built-in corpus by a generator seeded with ``(seed, length)``
  and fitted to ``depth + pp - len(head)`` tokens;
* ``head`` is a run of single-token words that spells the request's index, so no two requests
  of a sweep share their first block and a prefix cache cannot serve any of them. A different
  ``seed`` changes every body and head, so neither can a repeat of the sweep.

With the sweep's prefix caching (``context_prompts``), a request's prompt is its own context
(``head + body`` of ``depth`` tokens) followed by a question of ``pp`` tokens; the context is
sent alone first, so the engine's prefix cache serves it to the measured request, and only
that request's own context, never another's.

Lengths are measured, not estimated: with the engine's ``/tokenize`` (vLLM, SGLang) or, when
that is missing, from ``usage.prompt_tokens`` of a one-token completion. Each final prompt is
counted once more before it is sent; the engine's usage fields report what was really served.
"""

from __future__ import annotations

import asyncio
import hashlib
import random
from collections.abc import Awaitable, Callable, Iterator, Sequence
from dataclasses import dataclass

from sparkbuild.errors import CalibrationError, UsageError

PROMPT_RECIPE = "builtin-prose-v1"
HEAD_WORDS = 6

# Plain sentences on mixed topics: enough variety that n-gram drafters get no free ride, and
# ordinary enough that any tokenizer splits them sensibly.
_CORPUS = (
    "The committee met on a grey morning to review the budget for the coming year.",
    "A river bends around the old mill before it widens into the valley below.",
    "Engineers measured the bridge every spring and wrote the numbers in a ledger.",
    "She packed two notebooks, a map of the coast and a thermos of strong tea.",
    "Prices at the market rose slowly while the harvest came in later than usual.",
    "The library kept its rarest books in a cool room behind a heavy oak door.",
    "Each train left the station on time, although the platform clock ran fast.",
    "Small changes in temperature can shift the balance of a mountain lake.",
    "The new compiler rejected the program because a type did not match.",
    "Volunteers planted three hundred trees along the northern edge of the park.",
    "A good recipe lists the ingredients in the order they are used.",
    "The orchestra tuned for several minutes before the conductor raised her hand.",
    "Storms from the west brought heavy rain and closed the coastal road twice.",
    "He wrote letters by hand and kept copies of every one in a wooden box.",
    "The survey counted birds at dawn, when most of them were singing.",
    "Memory bandwidth often limits how fast a large model can produce each token.",
    "The museum opened a gallery of maps drawn by sailors three centuries ago.",
    "A careful reviewer reads the tests before reading the code they cover.",
    "Farmers rotated the crops so that the soil could recover between seasons.",
    "The council agreed to repair the lighthouse before the winter storms.",
    "Children in the village learned to swim in the shallow bay each summer.",
    "The report explained why the second design used less power than the first.",
    "Snow covered the pass for months, so traders took the longer southern route.",
    "A well placed index can turn a slow query into a fast one.",
    "The baker started work at four and sold out of bread before noon.",
    "Astronomers watched the comet fade as it moved away from the sun.",
    "The team wrote down every decision so that newcomers could follow the reasons.",
    "Old roads often follow the paths that cattle took across the hills.",
    "The factory switched to a quieter machine after neighbours complained.",
    "Clear instructions save more time than clever shortcuts ever do.",
    "The garden had a pond, a row of apple trees and a bench in the shade.",
    "Most of the islands were settled by fishermen who came from the mainland.",
)

# Common words that most tokenizers keep whole; the ones the engine's tokenizer really keeps
# as one token (with a leading space) spell the request heads and pad fitted bodies.
# a word list: one word a line would spread it over 49 lines
_HEAD_CANDIDATES = (
    "the", "a", "and", "of", "to", "in", "is", "it", "on", "for", "as", "at", "by", "an",
    "be", "or", "we", "he", "she", "they", "this", "that", "with", "from", "one", "two",
    "three", "four", "five", "six", "seven", "eight", "nine", "ten", "red", "blue", "old",
    "new", "day", "way", "man", "map", "sun", "sea", "car", "cat", "dog", "fox", "box",
)  # fmt: skip

CountTokens = Callable[[str], Awaitable[int]]


@dataclass(frozen=True)
class BenchPrompt:
    text: str
    tokens: int  # as counted by the engine before sending
    target: int

    @property
    def exact(self) -> bool:
        return self.tokens == self.target


def _words(seed: int, stream: str) -> Iterator[str]:
    """An endless, reproducible stream of corpus words for ``(seed, stream)``."""
    rng = random.Random(f"sparkbuild-bench:{PROMPT_RECIPE}:{seed}:{stream}")
    while True:
        yield from rng.choice(_CORPUS).split()


class PromptFactory:
    """Makes the prompts of one sweep against one engine's tokenizer."""

    def __init__(self, count_tokens: CountTokens, seed: int, *, max_parallel: int = 8) -> None:
        self._count = count_tokens
        self.seed = seed
        self._gate = asyncio.Semaphore(max_parallel)
        self._pieces: list[str] = []  # single-token words, each with its leading space
        self._bodies: dict[int, str] = {}
        self._questions: dict[tuple[int, int], str] = {}
        self.fingerprint = hashlib.sha256(f"{PROMPT_RECIPE}:{seed}".encode())
        self._cell = hashlib.sha256()  # the prompts made since the last cell_digest()

    def _made(self, prompts: Sequence[BenchPrompt]) -> None:
        """Every prompt made goes into the sweep's fingerprint and its cell's digest."""
        for prompt in prompts:
            self.fingerprint.update(prompt.text.encode())
            self._cell.update(prompt.text.encode())

    def cell_digest(self) -> str:
        """sha256 over the prompts made since the last call, in order; then starts again."""
        digest, self._cell = self._cell.hexdigest(), hashlib.sha256()
        return digest

    async def count(self, text: str) -> int:
        async with self._gate:
            return await self._count(text)

    async def prepare(self) -> None:
        """Find the tokenizer's single-token words (needs at least two to spell heads)."""
        probe = "Note:"
        base = await self.count(probe)
        doubled = await asyncio.gather(
            *(self.count(f"{probe} {word} {word}") for word in _HEAD_CANDIDATES)
        )
        self._pieces = [
            f" {word}" for word, n in zip(_HEAD_CANDIDATES, doubled, strict=True) if n == base + 2
        ]
        if len(self._pieces) < 2:
            raise CalibrationError(
                "the engine's tokenizer keeps fewer than two common English words as single "
                "tokens, so prompts cannot be fitted to exact lengths",
                "report the model and tokenizer to the sparkbuild maintainers",
            )

    def head(self, index: int) -> str:
        """``HEAD_WORDS`` single-token words spelling ``index`` (unique per sweep and seed)."""
        base = len(self._pieces)
        number = index + (self.seed % 100_003) * 7_919
        digits = []
        for _ in range(HEAD_WORDS):
            number, digit = divmod(number, base)
            digits.append(self._pieces[digit])
        return "Request" + "".join(digits) + ":"

    async def _fit(self, prefix: str, target: int, stream: str) -> str:
        """``prefix`` followed by corpus words and padding, ``target`` tokens long."""
        floor = await self.count(prefix)
        if floor > target:
            raise UsageError(
                f"a prompt of {target} tokens is too short for the request header ({floor} tokens)",
                "use a larger --pp",
            )
        words = _words(self.seed, stream)
        pool = [next(words) for _ in range(target + 1)]  # every word is at least one token

        def text(k: int) -> str:
            return prefix + "".join(" " + w for w in pool[:k])

        lo, hi = 0, len(pool)  # count(text(lo)) <= target < count(text(hi)) (or hi = all)
        while hi - lo > 1:
            mid = (lo + hi) // 2
            if await self.count(text(mid)) <= target:
                lo = mid
            else:
                hi = mid
        for k in range(lo, max(lo - 4, -1), -1):
            body = text(k)
            gap = target - await self.count(body)
            padded = body + "".join(self._pieces[i % len(self._pieces)] for i in range(gap))
            if await self.count(padded) == target:
                return padded
        return text(lo)  # closest from below; reported as inexact

    async def body(self, tokens: int) -> str:
        """The shared part of every prompt of ``tokens`` total tokens (cached)."""
        if tokens not in self._bodies:
            reference = self.head(0)
            fitted = await self._fit(reference, tokens, f"body:{tokens}")
            self._bodies[tokens] = fitted[len(reference) :]
        return self._bodies[tokens]

    async def prompts(self, tokens: int, indices: Sequence[int]) -> list[BenchPrompt]:
        """One prompt per request index, each checked (and refitted if needed) to ``tokens``."""
        body = await self.body(tokens)

        async def one(index: int) -> BenchPrompt:
            text = self.head(index) + body
            counted = await self.count(text)
            if counted != tokens:  # the head's words merged with the body's first word
                text = await self._fit(self.head(index), tokens, f"request:{index}")
                counted = await self.count(text)
            return BenchPrompt(text, counted, tokens)

        made = await asyncio.gather(*(one(i) for i in indices))
        self._made(made)
        return list(made)

    async def _question(self, depth: int, pp: int) -> str:
        """What follows a ``depth``-token context to make ``depth + pp`` tokens (cached)."""
        if (depth, pp) not in self._questions:
            context = self.head(0) + await self.body(depth)
            fitted = await self._fit(context, depth + pp, f"question:{depth}:{pp}")
            self._questions[depth, pp] = fitted[len(context) :]
        return self._questions[depth, pp]

    async def context_prompts(
        self, depth: int, pp: int, indices: Sequence[int]
    ) -> list[tuple[BenchPrompt, BenchPrompt]]:
        """Per request index: its context alone (``depth`` tokens) and that context followed
        by a question (``depth + pp``). The context is a prefix of the whole prompt, so once
        it was sent alone the engine's prefix cache holds it (llama-benchy's context load)."""
        contexts = await self.prompts(depth, indices)
        question = await self._question(depth, pp)

        async def one(index: int, context: BenchPrompt) -> BenchPrompt:
            text = context.text + question
            counted = await self.count(text)
            if counted != depth + pp:  # the question's first word merged with the context
                text = await self._fit(context.text, depth + pp, f"question:{index}")
                counted = await self.count(text)
            return BenchPrompt(text, counted, depth + pp)

        whole = await asyncio.gather(*(one(i, c) for i, c in zip(indices, contexts, strict=True)))
        self._made(whole)
        return list(zip(contexts, whole, strict=True))
