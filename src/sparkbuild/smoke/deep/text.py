"""Whether a long text is still text: judged along its whole length, not only as a whole.

A generation is a sequence of units (token ids when the engine sends them, else words and
punctuation of the text). What a model stuck in a loop or decoding garbage produces, and
what this finds, naming where:

* **runs**: one unit many times in a row (``max_run``); token id 0 ``max_zero_run`` times
  (NaN logits decode as id 0 on sm_121: dgxarley's SGLang 0.5.18 recipe);
* **short loops**: a span of 3-8 units repeated ``min_short_loop_repeats`` times in a row
  (2-unit spans count from ``max_run`` / 2 repeats);
* **block loops**: a span of 9-64 units repeated three times in a row, or twice when it is
  32 units or longer;
* **repeated windows**: in each window of ``window`` units, the share of 8-grams that
  appeared earlier in the text (anywhere, so loops longer than the window and loops that
  start late are both seen) above ``max_repeated_fraction``;
* **restated sentences**: a prose sentence (five words or more, letters at least 80 % of its
  characters) nearly the same (``sentence_similarity``) as one of the eight before it;
  records and tables (numbers, punctuation) repeat their shape legitimately and are left out;
* **garbage**: control characters and U+FFFD (undecodable bytes) above ``max_garbage_share``
  of a window's characters; words mixing alphabetic scripts (Latin with Cyrillic, ...)
  above ``max_mixed_script_share`` of its words (word salad).
"""

from __future__ import annotations

import math
import re
import unicodedata
from collections.abc import Hashable, Sequence
from dataclasses import dataclass, field
from difflib import SequenceMatcher
from typing import Any

from sparkbuild.engines.profiles import TextLimits

NGRAM = 8
MIN_WINDOW_UNITS = 32  # a window shorter than this has too few 8-grams to judge
SHORT_SPANS = range(3, 9)
LONGEST_SPAN = 64
SENTENCES_BACK = 8
_WORD = re.compile(r"\w+|[^\w\s]")
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
    start: int  # the unit (token or word) where it starts
    detail: str


@dataclass(frozen=True)
class TextJudgement:
    """Everything found in one text, and its worst window's numbers."""

    units: int
    findings: tuple[Finding, ...] = ()
    worst_window: dict[str, object] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.findings

    def describe(self, unit: str = "token") -> str:
        if not self.findings:
            return f"{self.units} {unit}s, no loop or garbage"
        first = min(self.findings, key=lambda f: f.start)
        more = f" (+{len(self.findings) - 1} more)" if len(self.findings) > 1 else ""
        return f"{first.detail} at {unit} {first.start} of {self.units}{more}"

    def numbers(self) -> dict[str, object]:
        """What the evidence keeps: the findings' kinds and places, the worst window."""
        return {
            "units": self.units,
            "findings": [
                {"kind": f.kind, "start": f.start, "detail": f.detail} for f in self.findings[:5]
            ],
            "worst_window": self.worst_window,
        }


def words(text: str) -> list[str]:
    """A text's units when the engine sent no token ids: lowercase words and punctuation."""
    return _WORD.findall(text.lower())


def judge(
    units: Sequence[Hashable], text: str, limits: TextLimits, *, token_ids: bool = False
) -> TextJudgement:
    """Judge ``units`` (token ids with ``token_ids``, else words) and ``text`` (the same
    generation decoded) by ``limits``."""
    findings = _repeats(units, limits, token_ids)
    windows, worst = _windows(units, text, limits)
    findings += windows + _restated(text, limits)
    findings.sort(key=lambda f: f.start)
    return TextJudgement(len(units), tuple(findings), worst)


def _repeats(units: Sequence[Hashable], limits: TextLimits, token_ids: bool) -> list[Finding]:
    """Spans repeated back to back, the shortest period first; a region already explained
    by a shorter span is not reported again."""
    found: list[Finding] = []
    covered: list[tuple[int, int]] = []
    for span in range(1, min(LONGEST_SPAN, len(units) // 2) + 1):
        for start, repeats in _periodic(units, span):
            end = start + span * repeats
            if any(s <= start and end <= e for s, e in covered):
                continue
            finding = _loop_finding(units, span, start, repeats, limits, token_ids)
            if finding is not None:
                found.append(finding)
                covered.append((start, end))
    return found


def _periodic(units: Sequence[Hashable], span: int) -> list[tuple[int, int]]:
    """(start, repeats) of every stretch where ``units`` repeats with period ``span`` at
    least twice."""
    stretches = []
    run = 0
    for j in range(span, len(units) + 1):
        if j < len(units) and units[j] == units[j - span]:
            run += 1
            continue
        if run >= span:
            stretches.append((j - run - span, (run + span) // span))
        run = 0
    return stretches


def _loop_finding(
    units: Sequence[Hashable],
    span: int,
    start: int,
    repeats: int,
    limits: TextLimits,
    token_ids: bool,
) -> Finding | None:
    what = "token" if token_ids else "word"
    if span == 1:
        zero = token_ids and units[start] == 0
        limit = limits.max_zero_run if zero else limits.max_run
        if repeats < limit:
            return None
        name = "token id 0" if zero else f"{what} {units[start]!r}"
        return Finding("zero-run" if zero else "run", start, f"{name} {repeats} times in a row")
    if span == 2:
        needed = max(limits.min_short_loop_repeats, math.ceil(limits.max_run / 2))
    elif span in SHORT_SPANS:
        needed = limits.min_short_loop_repeats
    else:
        needed = 2 if span >= 32 else 3
    if repeats < needed:
        return None
    kind = "short-loop" if span <= SHORT_SPANS[-1] else "block-loop"
    return Finding(kind, start, f"a {span}-{what} span repeated {repeats} times in a row")


def _windows(
    units: Sequence[Hashable], text: str, limits: TextLimits
) -> tuple[list[Finding], dict[str, object]]:
    """Each window's share of 8-grams seen earlier, and of garbage in its share of the text."""
    found: list[Finding] = []
    seen: set[tuple[Hashable, ...]] = set()
    worst: dict[str, Any] = {}
    count = max(1, math.ceil(len(units) / limits.window))
    for index in range(count):
        start, end = index * limits.window, min(len(units), (index + 1) * limits.window)
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
                    f"{repeated:.0%} of the 8-grams in units {start}-{end} appeared earlier",
                )
            )
        if garbage > limits.max_garbage_share:
            found.append(
                Finding(
                    "garbage",
                    start,
                    f"{garbage:.0%} control or undecodable characters in units {start}-{end}",
                )
            )
        if mixed > limits.max_mixed_script_share:
            found.append(
                Finding(
                    "mixed-script",
                    start,
                    f"{mixed:.0%} of the words in units {start}-{end} mix alphabets",
                )
            )
    return found, worst


def _badness(numbers: dict[str, Any]) -> float:
    return float(
        numbers["repeated_fraction"] + numbers["garbage_share"] + numbers["mixed_script_share"]
    )


def _seen_before(
    units: Sequence[Hashable], start: int, end: int, seen: set[tuple[Hashable, ...]]
) -> float:
    """The share of the 8-grams starting in [start, end) that occurred earlier; adds them."""
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
    bad = sum(1 for c in text if c == "\ufffd" or _control(c))
    return bad / len(text)


def _control(char: str) -> bool:
    return char not in "\n\r\t" and unicodedata.category(char) in ("Cc", "Cf", "Co", "Cs", "Cn")


def mixed_script_share(text: str) -> float:
    """The share of words whose letters come from two or more alphabets."""
    found = re.findall(r"[^\W\d_]{2,}", text)
    if not found:
        return 0.0
    return sum(1 for word in found if len(_alphabets(word)) > 1) / len(found)


def _alphabets(word: str) -> set[str]:
    scripts = set()
    for char in word:
        script = unicodedata.name(char, "UNKNOWN").split(" ")[0]
        if script in _ALPHABETS:
            scripts.add(script)
    return scripts


def _restated(text: str, limits: TextLimits) -> list[Finding]:
    """Prose sentences nearly the same as one of the few before them; ``start`` is the
    sentence's first word."""
    found: list[Finding] = []
    sentences = [s.strip() for s in _SENTENCE_END.split(text.strip()) if _prose(s)]
    position = {}
    offset = 0
    for sentence in sentences:
        at = text.find(sentence, offset)
        position[sentence] = len(words(text[:at])) if at >= 0 else 0
        offset = max(offset, at)
    for index, sentence in enumerate(sentences):
        lowered = sentence.lower()
        for earlier in sentences[max(0, index - SENTENCES_BACK) : index]:
            matcher = SequenceMatcher(None, earlier.lower(), lowered)
            if matcher.quick_ratio() < limits.sentence_similarity:
                continue
            similarity = matcher.ratio()
            if similarity >= limits.sentence_similarity:
                found.append(
                    Finding(
                        "restated",
                        position[sentence],
                        f"a sentence {similarity:.0%} like an earlier one ({_clip(sentence)!r})",
                    )
                )
                break
    return found


def _prose(sentence: str) -> bool:
    letters = sum(1 for c in sentence if c.isalpha())
    visible = sum(1 for c in sentence if not c.isspace())
    return len(re.findall(r"[^\W\d_]+", sentence)) >= 5 and letters >= 0.8 * max(1, visible)


def _clip(text: str, limit: int = 60) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


__all__ = ["Finding", "TextJudgement", "garbage_share", "judge", "mixed_script_share", "words"]
