"""Whether a long text is still text: judged along its whole length, not only as a whole.

A generation is judged on the units of its text (:mod:`.structure`: words and symbols, with
tables, rules, lists, code and JSON read as structure, not as loops). What a model stuck in
a loop or decoding garbage produces, and what this finds, naming where:

* **runs**: one unit ``max_run`` times in a row; with token ids, one token id ``max_run``
  times and token id 0 ``max_zero_run`` times (NaN logits decode as id 0 on sm_121:
  dgxarley's SGLang 0.5.18 recipe);
* **short loops**: a span of 3-8 units repeated ``min_short_loop_repeats`` times in a row
  and covering ``LOOP_UNITS`` units (2-unit spans count from ``max_run`` / 2 repeats); a
  span mostly of numbers and symbols (data, markup) from ``max_run`` repeats;
* **block loops**: a span of 9-64 units repeated three times in a row, or twice when it is
  32 units or longer;
* **repeated windows**: in each window of ``window`` units, the share of 16-grams that
  appeared earlier in the text (anywhere, so loops longer than the window and loops that
  start late are both seen) above ``max_repeated_fraction``;
* **restated sentences**: a prose sentence (five words or more, letters at least 80 % of its
  characters, outside tables and code) that starts over the one right before it: the same
  opening (``RESTART_SHARE`` of its words) and ``sentence_similarity`` alike. Parallel
  sentences (reference prose's "The ``+`` operator yields the sum ..." after "The ``-``
  operator ...") vary their subject and are not restated;
* **garbage**: control characters and U+FFFD (undecodable bytes) above ``max_garbage_share``
  of a window's characters; words mixing alphabetic scripts (Latin with Cyrillic, ...)
  above ``max_mixed_script_share`` of its words (word salad).

Every rule is linear in the text's length (a window of sentences, 64 periods, one pass of
16-grams), and :func:`oversized` bounds what is judged at all: an engine's text is not
bounded by its ``max_tokens``.
"""

from __future__ import annotations

import bisect
import itertools
import math
import operator
import re
import unicodedata
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from sparkbuild.engines.profiles import TextLimits
from sparkbuild.smoke.deep.structure import UNIT, Reading, clip, read, rule_char, words

#: The window rule's n-grams: long enough that data and code repeating their shape (keys,
#: calls, table cells) do not count, short enough for a loop of a sentence or two.
NGRAM = 16
MIN_WINDOW_UNITS = 32  # a window shorter than this has too few 16-grams to judge
SHORT_SPANS = range(3, 9)
LONGEST_SPAN = 64
#: A short loop covers at least this many units: fewer is a phrase said three times, as
#: code (``dict[str, dict[str, dict[str, ...``) and a program's output do.
LOOP_UNITS = 16
#: The most characters one token decodes to that an answer's length is held to: far more
#: than any tokenizer's longest token, so only a text that is not its tokens is refused.
MAX_CHARS_PER_TOKEN = 128
#: A restated sentence starts with this share of the earlier one's words (a loop restarts
#: its sentence; parallel prose varies its subject early).
RESTART_SHARE = 0.6
#: Characters of a sentence compared for similarity: the opening decides a restart.
SENTENCE_CHARS = 1000
#: Findings kept: a text with more is broken many times over; the search stops there.
MAX_FINDINGS = 100
_LETTER = re.compile(r"[^\W\d_]")
_SENTENCE_END = re.compile(r"(?<=[.!?])\s+")
# Alphabetic scripts whose letters do not mix inside one word in real text; CJK, kana and
# Hangul mix with Latin acronyms legitimately and are not counted.
_ALPHABETS = (
    "LATIN",
    "CYRILLIC",
    "GREEK",
    "ARABIC",
    "HEBREW",
    "ARMENIAN",
    "GEORGIAN",
    "THAI",
    "DEVANAGARI",
)


@dataclass(frozen=True)
class Finding:
    kind: str  # run, zero-run, short-loop, block-loop, repeated-window, restated, garbage, ...
    start: int  # the unit (word, or token for ``unit`` token) where it starts
    detail: str
    unit: str = "word"  # what ``start`` counts: the text's words (units), the engine's tokens


@dataclass(frozen=True)
class TextJudgement:
    """Everything found in one text, and its worst window's numbers."""

    units: int  # the text's units (words)
    findings: tuple[Finding, ...] = ()
    worst_window: dict[str, object] = field(default_factory=dict)
    tokens: int = 0  # token ids judged beside the text (0: the engine sent none)

    @property
    def ok(self) -> bool:
        return not self.findings

    def describe(self) -> str:
        if not self.findings:
            tokens = f" ({self.tokens} tokens)" if self.tokens else ""
            return f"{self.units} words{tokens}, no loop or garbage"
        first = self.findings[0]
        more = f" (+{len(self.findings) - 1} more)" if len(self.findings) > 1 else ""
        if first.unit == "character":
            return first.detail
        total = self.tokens if first.unit == "token" else self.units
        return f"{first.detail} at {first.unit} {first.start} of {total}{more}"

    def numbers(self) -> dict[str, object]:
        """What the evidence keeps: the findings' kinds and places, the worst window."""
        return {
            "units": self.units,
            "tokens": self.tokens,
            "findings": [
                {"kind": f.kind, "start": f.start, "unit": f.unit, "detail": f.detail}
                for f in self.findings[:5]
            ],
            "worst_window": self.worst_window,
        }


def oversized(text: str, max_tokens: int) -> str:
    """Why ``text`` cannot be the answer to a request of ``max_tokens`` tokens (longer than
    any tokenizer's tokens decode to), or empty: such a text is not judged."""
    limit = max_tokens * MAX_CHARS_PER_TOKEN
    if len(text) <= limit:
        return ""
    return (
        f"the answer is {len(text)} characters for at most {max_tokens} tokens (more than "
        f"{MAX_CHARS_PER_TOKEN} a token): the engine's text is not its tokens"
    )


# --- the judge -----------------------------------------------------------------------------


def judge(
    text: str, limits: TextLimits, token_ids: Sequence[int] = (), max_tokens: int | None = None
) -> TextJudgement:
    """Judge ``text`` by ``limits``: loops, runs and restated sentences on its units, garbage
    in its characters; with the engine's ``token_ids`` of it, runs of one token id too. A
    text longer than ``max_tokens`` can hold (:func:`oversized`) is that finding alone."""
    too_long = oversized(text, max_tokens) if max_tokens is not None else ""
    if too_long:
        return TextJudgement(0, (Finding("oversized", 0, too_long, "character"),), {}, 0)
    reading = read(text)
    units = reading.units
    findings = [_long_rule(start, rule) for start, rule in reading.long_rules]
    findings += _repeats(units, limits)
    windows, worst = _windows(units, text, limits)
    findings += windows + _restated(reading, limits)
    if token_ids:
        findings += _token_runs(token_ids, limits)
    findings.sort(key=lambda f: (f.unit != "token", f.start))
    return TextJudgement(len(units), tuple(findings[:MAX_FINDINGS]), worst, len(token_ids))


def _long_rule(start: int, rule: str) -> Finding:
    char = rule_char(rule)
    return Finding("run", start, f"{char!r} {len(rule)} times in a row (longer than a rule)")


def _token_runs(ids: Sequence[int], limits: TextLimits) -> list[Finding]:
    """Runs of one token id: what a text cannot show when the token decodes to nothing
    (a special token, id 0 of NaN logits) or to a word with no space around it."""
    found = []
    for start, repeats in _periodic(list(ids), 1):
        zero = ids[start] == 0
        if repeats >= (limits.max_zero_run if zero else limits.max_run):
            name = "token id 0" if zero else f"token id {ids[start]}"
            kind = "zero-run" if zero else "run"
            found.append(Finding(kind, start, f"{name} {repeats} times in a row", "token"))
    return found


def _repeats(units: Sequence[str], limits: TextLimits) -> list[Finding]:
    """Spans repeated back to back, the shortest period first; a region already explained
    by a shorter span is not reported again."""
    numbers = _interned(units)
    found: list[Finding] = []
    covered = _Covered()
    for span in range(1, min(LONGEST_SPAN, len(units) // 2) + 1):
        for start, repeats in _periodic(numbers, span):
            end = start + span * repeats
            if covered.holds(start, end):
                continue
            finding = _loop_finding(units, span, start, repeats, limits)
            if finding is not None:
                found.append(finding)
                covered.add(start, end)
                if len(found) >= MAX_FINDINGS:
                    return found
    return found


def _interned(units: Sequence[Hashable]) -> list[int]:
    """Each unit as a small number, the same for equal units: compared in C below."""
    numbers: dict[Hashable, int] = {}
    return [numbers.setdefault(unit, len(numbers)) for unit in units]


@dataclass
class _Covered:
    """The stretches findings explain, by start, with the furthest end reached so far: a
    stretch inside one is explained (a bisection, however many there are)."""

    starts: list[int] = field(default_factory=list)
    ends: list[int] = field(default_factory=list)
    furthest: list[int] = field(default_factory=list)  # the furthest end up to each start

    def holds(self, start: int, end: int) -> bool:
        index = bisect.bisect_right(self.starts, start) - 1
        return index >= 0 and self.furthest[index] >= end

    def add(self, start: int, end: int) -> None:  # at most MAX_FINDINGS times
        index = bisect.bisect_right(self.starts, start)
        self.starts.insert(index, start)
        self.ends.insert(index, end)
        self.furthest = list(itertools.accumulate(self.ends, max))


def _periodic(numbers: Sequence[int], span: int) -> list[tuple[int, int]]:
    """(start, repeats) of every stretch where ``numbers`` repeats with period ``span`` at
    least twice, found by one comparison of the sequence with itself shifted (in C)."""
    same = bytes(map(operator.eq, numbers[span:], numbers[:-span]))
    return [
        (match.start(), (match.end() - match.start() + span) // span)
        for match in re.finditer(b"\x01{%d,}" % span, same)
    ]


def _loop_finding(
    units: Sequence[str], span: int, start: int, repeats: int, limits: TextLimits
) -> Finding | None:
    if span == 1:
        if repeats < limits.max_run:
            return None
        return Finding("run", start, f"{clip(units[start])!r} {repeats} times in a row")
    if not _wordy(units[start : start + span]):  # numbers and symbols: data, code, markup
        needed = limits.max_run
    elif span * repeats < LOOP_UNITS:
        return None
    elif span == 2:
        needed = max(limits.min_short_loop_repeats, math.ceil(limits.max_run / 2))
    elif span in SHORT_SPANS:
        needed = limits.min_short_loop_repeats
    else:
        needed = 2 if span >= 32 else 3
    if repeats < needed:
        return None
    kind = "short-loop" if span <= SHORT_SPANS[-1] else "block-loop"
    return Finding(kind, start, f"a {span}-word span repeated {repeats} times in a row")


def _wordy(span: Sequence[str]) -> bool:
    """Whether at least half of a span's units hold letters (not numbers, symbols or rules
    alone): a span of data or markup repeats its shape in arrays, grids and code."""
    return 2 * sum(1 for unit in span if _LETTER.search(unit)) >= len(span)


def _windows(
    units: Sequence[str], text: str, limits: TextLimits
) -> tuple[list[Finding], dict[str, object]]:
    """Each window's share of 16-grams seen earlier, and of garbage in its share of the text."""
    found: list[Finding] = []
    seen: set[tuple[str, ...]] = set()
    worst: dict[str, Any] = {}
    # A last window shorter than half of one joins the one before: too few 16-grams alone.
    count = max(1, round(len(units) / limits.window))
    for index in range(count):
        start = index * limits.window
        end = len(units) if index == count - 1 else start + limits.window
        chunk = text[len(text) * index // count : len(text) * (index + 1) // count]
        repeated = _seen_before(units, start, end, seen)
        garbage, mixed = garbage_share(chunk), mixed_script_share(chunk)
        numbers = {
            "start": start,
            "end": end,
            "repeated_fraction": round(repeated, 3),
            "garbage_share": round(garbage, 3),
            "mixed_script_share": round(mixed, 3),
        }
        if not worst or _badness(numbers) > _badness(worst):
            worst = numbers
        if end - start >= MIN_WINDOW_UNITS and repeated > limits.max_repeated_fraction:
            found.append(
                Finding(
                    "repeated-window",
                    start,
                    f"{repeated:.0%} of the {NGRAM}-grams in words {start}-{end} appeared earlier",
                )
            )
        if garbage > limits.max_garbage_share:
            found.append(
                Finding(
                    "garbage",
                    start,
                    f"{garbage:.0%} control or undecodable characters in words {start}-{end}",
                )
            )
        if mixed > limits.max_mixed_script_share:
            found.append(
                Finding(
                    "mixed-script",
                    start,
                    f"{mixed:.0%} of the words in words {start}-{end} mix alphabets",
                )
            )
    return found, worst


def _badness(numbers: dict[str, Any]) -> float:
    return float(
        numbers["repeated_fraction"] + numbers["garbage_share"] + numbers["mixed_script_share"]
    )


def _seen_before(units: Sequence[str], start: int, end: int, seen: set[tuple[str, ...]]) -> float:
    """The share of the 16-grams starting in [start, end) that occurred earlier; adds them."""
    total = repeated = 0
    for i in range(start, min(end, len(units) - NGRAM + 1)):
        gram = tuple(units[i : i + NGRAM])
        total += 1
        if gram in seen:
            repeated += 1
        seen.add(gram)
    return repeated / total if total else 0.0


def garbage_share(text: str) -> float:
    """The share of characters that are not text: controls (but newline, tab, CR), format
    and private-use characters, and U+FFFD (bytes that did not decode)."""
    if not text:
        return 0.0
    odd = set(text) - _PLAIN
    if not odd:
        return 0.0
    bad = {c for c in odd if c == "\ufffd" or _control(c)}
    return sum(1 for c in text if c in bad) / len(text) if bad else 0.0


_PLAIN = frozenset(chr(c) for c in range(32, 127)) | frozenset("\n\r\t")


def _control(char: str) -> bool:
    return char not in "\n\r\t" and unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs", "Cn")


def mixed_script_share(text: str) -> float:
    """The share of words whose letters come from two or more alphabets."""
    found = re.findall(r"[^\W\d_]{2,}", text)
    if not found:
        return 0.0
    return sum(1 for word in found if not word.isascii() and len(_alphabets(word)) > 1) / len(found)


def _alphabets(word: str) -> set[str]:
    scripts = set()
    for char in word:
        script = unicodedata.name(char, "UNKNOWN").split(" ")[0]
        if script in _ALPHABETS:
            scripts.add(script)
    return scripts


def _restated(reading: Reading, limits: TextLimits) -> list[Finding]:
    """Prose sentences that start over the one right before them; ``start`` is the first
    word of the sentence's line."""
    found: list[Finding] = []
    prose = reading.prose_text
    earlier: tuple[list[str], str] | None = None
    offset = 0
    for piece in _SENTENCE_END.split(prose):
        at = prose.find(piece, offset)
        offset = max(offset, at)
        sentence = piece.strip()
        if not _prose(sentence):
            earlier = None
            continue
        now = (_units_of(sentence[:SENTENCE_CHARS]), sentence[:SENTENCE_CHARS])
        line = max(0, bisect.bisect_right(reading.prose_at, at) - 1)
        if line in reading.fresh and not prose[reading.prose_at[line] : at].strip():
            earlier = None  # a list item or heading starts here: parallel to, not after
        if earlier is not None and _restarts(earlier, now, limits):
            detail = f"a sentence restating the one before ({clip(sentence)!r})"
            found.append(Finding("restated", reading.line_units[line], detail))
        earlier = now
    return found


def _units_of(text: str) -> list[str]:
    return [match.group() for match in UNIT.finditer(text)]


def _restarts(
    earlier: tuple[list[str], str], sentence: tuple[list[str], str], limits: TextLimits
) -> bool:
    """Whether ``sentence`` starts over ``earlier``: the same opening words, and alike."""
    before, now = earlier[0], sentence[0]
    shared = 0
    for a, b in zip(before, now, strict=False):
        if a != b:
            break
        shared += 1
    if shared < RESTART_SHARE * max(len(before), len(now)):
        return False
    return SequenceMatcher(None, earlier[1], sentence[1]).ratio() >= limits.sentence_similarity


def _prose(sentence: str) -> bool:
    letters = sum(1 for c in sentence if c.isalpha())
    visible = sum(1 for c in sentence if not c.isspace())
    return len(re.findall(r"[^\W\d_]+", sentence)) >= 5 and letters >= 0.8 * max(1, visible)


__all__ = [
    "MAX_CHARS_PER_TOKEN",
    "Finding",
    "TextJudgement",
    "garbage_share",
    "judge",
    "mixed_script_share",
    "oversized",
    "words",
]
