"""The long-text judge (smoke/deep/text.py, smoke/deep/structure.py) on real, well-formed
documents: no false alarm on Markdown with tables, lists, headings, rules and code blocks,
on source code, JSON, CSV and Python's reference manual; and structure that loops, or a text
longer than its tokens, still fails.

The corpus is read at test time (tests/support/text_corpus.py). Before structure was read
as structure, the judge failed 102 of 173 of these documents: every three-column table,
every reST heading underline, every code banner, and Python's reference manual's parallel
sentences as "restated".
"""

from __future__ import annotations

import itertools
import re
from difflib import SequenceMatcher

import pytest

from sparkbuild.engines.profiles import TextLimits
from sparkbuild.smoke.deep.structure import read, words
from sparkbuild.smoke.deep.text import MAX_CHARS_PER_TOKEN, judge
from tests.support.text_corpus import corpus

LIMITS = TextLimits()


@pytest.fixture(scope="module")
def documents() -> dict[str, str]:
    return corpus()


def test_no_false_alarm_on_real_documents(documents: dict[str, str]) -> None:
    kinds = {name.split(":")[0] for name in documents}
    assert {"repo", "sdist", "pypi", "stdlib", "json", "jsonl", "csv", "pydoc"} <= kinds
    markdown = "\n".join(t for n, t in documents.items() if n.endswith(".md"))
    assert markdown.count("\n|") > 300 and markdown.count("```") > 200  # tables, code blocks
    assert re.search(r"^-{3,}$", markdown, re.M) and re.search(r"^={3,}$", markdown, re.M)
    alarms = {name: judge(text, LIMITS).describe() for name, text in documents.items()}
    assert {name: why for name, why in alarms.items() if "no loop" not in why} == {}


def test_parallel_sentences_of_the_reference_manual_are_not_restated(
    documents: dict[str, str],
) -> None:
    """pydoc_data.topics holds sentence pairs 0.77-0.96 alike, one right after the other
    ("The context manager's __enter__() is loaded ..." then "... __exit__() ..."): the
    old rule (any of the eight sentences before, 0.75 alike) failed 82 of them."""
    pairs = []
    for name, text in documents.items():
        if name.startswith("pydoc:"):
            sentences = [s.strip() for s in re.split(r"(?<=[.!?])\s+", text) if len(s) > 40]
            pairs += [
                (a, b)
                for a, b in itertools.pairwise(sentences)
                if SequenceMatcher(None, a.lower(), b.lower()).ratio() >= 0.77
            ]
    assert len(pairs) >= 20
    for earlier, sentence in pairs:
        judged = judge(f"{earlier} {sentence}", LIMITS)
        assert not [f for f in judged.findings if f.kind == "restated"], (earlier, sentence)


STRUCTURE_THAT_LOOPS = {
    "the same table row": "| a | b |\n|---|---|\n" + "| same | row |\n" * 20,
    "a rule of 1000 characters": "Intro text here.\n" + "-" * 1000,
    "a code line, fenced": "```\n" + "print(1)\n" * 20 + "```",
    "a code block cut in its loop": "```python\n" + "x = compute(x)\n" * 40,
    "the same list item": "- the same item again\n" * 20,
    "the same heading": "## Section\n" * 20,
    "JSON cut in its loop": '{"a": [' + '{"k": "v", "n": 1}, ' * 50,
    "a run of bangs": "Answer: " + "!" * 40,
    "two table rows in turn": "| x | y |\n|---|---|\n" + "| one | two |\n| three | four |\n" * 10,
}


@pytest.mark.parametrize("name", sorted(STRUCTURE_THAT_LOOPS))
def test_structure_that_loops_still_fails(name: str) -> None:
    assert not judge(STRUCTURE_THAT_LOOPS[name], LIMITS).ok, name


def test_a_rule_and_a_row_are_one_unit_each() -> None:
    text = "Title\n=====\n\n| a | b | c |\n|---|:-:|---|\n| 1 | 2 | 3 |\n\n- item one\n"
    assert words(text) == ["Title", "===", "|a | b | c|", "---", "|1 | 2 | 3|", "item", "one"]
    reading = read('```json\n{"k": [1, 2]}\n```\n    indented code line\n')
    assert reading.units == ["<json>", "indented code line"] and reading.prose == []


def test_a_text_longer_than_its_tokens_is_not_judged() -> None:
    """304 KB of prose for 128 tokens took the old judge 307 s (its restated-sentence rule
    was quadratic); an engine's text is not bounded by max_tokens, so it is refused."""
    sentence = "Unified memory lets the GPU and the CPU share one pool of bytes. "
    text = (sentence * (1 + 304_000 // len(sentence)))[:304_000]
    judged = judge(text, LIMITS, max_tokens=128)
    assert [f.kind for f in judged.findings] == ["oversized"]
    assert judged.describe() == (
        f"the answer is 304000 characters for at most 128 tokens (more than "
        f"{MAX_CHARS_PER_TOKEN} a token): the engine's text is not its tokens"
    )
    fits = text[: 128 * MAX_CHARS_PER_TOKEN]
    kinds = {f.kind for f in judge(fits, LIMITS, max_tokens=128).findings}
    assert "oversized" not in kinds and {"block-loop", "restated"} <= kinds  # judged: a loop
