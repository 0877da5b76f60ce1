"""The long-text judge (smoke/deep/text.py) held against dgxarley's own labelled texts and a
corpus of real, well-formed documents (tests/support/text_corpus.py), and the token
comparison of lossless and burn-in (smoke/deep/compare.py) on its edges.

dgxarley 0.0.64 runs from PyPI in a venv of its own (tests/support/dgxarley_peer.py): its
tests hand texts to its detectors, a plugin records each text with the detector's verdict,
and that verdict (what the test asserts) is the label ours must agree with.
"""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from sparkbuild.adapters import Generation
from sparkbuild.engines.profiles import TextLimits
from sparkbuild.smoke.checks import repeated_fraction
from sparkbuild.smoke.deep.compare import compare_across_ties, first_divergence
from sparkbuild.smoke.deep.structure import words
from sparkbuild.smoke.deep.text import judge
from tests.support.dgxarley_peer import Labelled, labelled_texts

LIMITS = TextLimits()
# What the plain output check judges: 8-gram repetition over the whole answer, limit 60 %,
# and only from 32 tokens (RepetitionLimits' defaults).
PLAIN_MIN_TOKENS, PLAIN_LIMIT = 32, 0.6


@pytest.fixture(scope="module")
def labelled(tmp_path_factory: pytest.TempPathFactory) -> list[Labelled]:
    return labelled_texts(tmp_path_factory.mktemp("dgxarley"))


def _plain_verdict(text: str) -> bool:
    units = text.split()
    return len(units) >= PLAIN_MIN_TOKENS and repeated_fraction(units, 8) > PLAIN_LIMIT


def test_we_agree_with_dgxarley_on_every_labelled_text(labelled: list[Labelled]) -> None:
    assert len(labelled) >= 20, "dgxarley's tests fed fewer texts than its 0.0.64 tests do"
    assert {item.repetitive for item in labelled} == {True, False}
    disagreements = [
        (item.test, item.detector, item.repetitive, judge(item.text, LIMITS).describe())
        for item in labelled
        if (not judge(item.text, LIMITS).ok) != item.repetitive
    ]
    assert disagreements == []


def test_the_plain_check_misses_the_short_and_late_loops_we_catch(
    labelled: list[Labelled],
) -> None:
    """What the issue measured: loops under 32 tokens (a 20-word loop, a 24-word n-gram
    flood, a restated sentence) pass the plain output check; ours fails each."""
    missed = {item.test for item in labelled if item.repetitive and not _plain_verdict(item.text)}
    assert {"test_ngram_detects_repeated_phrase", "test_guard_detects_ngram_flood",
            "test_sentence_detects_similar_pair"} <= missed  # fmt: skip
    for item in labelled:
        if item.test in missed and item.repetitive:
            assert not judge(item.text, LIMITS).ok, item.test


def test_a_loop_that_starts_late_is_named_where_it_starts() -> None:
    prose = (
        "Unified memory lets the GPU and the CPU share one pool, so the KV cache competes "
        "with the weights and with the operating system for the same bytes. A server that "
        "sizes its cache from free device memory alone will overcommit, and the first long "
        "request then fails in the middle of decoding rather than at admission. "
    )
    loop = "the cache is full and the request waits "
    text = prose + loop * 8
    judged = judge(text, LIMITS)
    assert not judged.ok
    assert judged.findings[0].start >= len(words(prose)) - 1
    assert f"at word {judged.findings[0].start}" in judged.describe()
    assert repeated_fraction(text.split(), 8) < PLAIN_LIMIT  # the plain rule passes it


def test_token_id_zero_runs_fail_early_and_garbage_is_counted() -> None:
    ids = [5, 9, 11, 0, 0, 0, 0, 7]
    judged = judge("ab cd ef", LIMITS, ids)
    assert [f.kind for f in judged.findings] == ["zero-run"]
    assert "token id 0 4 times in a row at token 3 of 8" in judged.describe()
    # Latin words with Cyrillic letters inside them (\u0440 er, \u043e o), and undecodable bytes.
    salad = "\u041f\u0440\u0438\u0432et w\u043erld " * 3 + "\ufffd\x07" * 20
    found = {f.kind for f in judge(salad, LIMITS).findings}
    assert {"garbage", "mixed-script"} <= found


def _generation(ids: list[int], top: list[dict[int, float]]) -> Generation:
    return Generation(prompt="p", text="", finish_reason="length", completion_tokens=len(ids),
                      tokens=tuple(map(str, ids)), logprobs=(), seconds=0.0,
                      token_ids=tuple(ids), top_logprobs=tuple(top))  # fmt: skip


def _texts(ids: object) -> str:
    return "".join(f"<{i}>" for i in ids)  # type: ignore[attr-defined]


def test_a_near_tie_at_the_first_difference_is_noted_not_failed() -> None:
    reference = _generation([1, 2, 3], [{1: -0.1}, {2: -0.69, 4: -0.70}, {3: -0.2}])
    run = _generation([1, 4, 9], [])
    tie = first_divergence("r", run, reference, 0.02, _texts)
    assert tie is not None and tie.tie and tie.position == 1
    assert tie.gap == pytest.approx(0.01)
    wide = first_divergence("r", run, reference, 0.005, _texts)
    assert wide is not None and not wide.tie
    assert "token 1 is 4 '<4>', the reference's is 2 '<2>' (gap 0.0100)" in wide.describe()


def test_a_token_outside_the_reference_top_k_has_a_lower_bound() -> None:
    reference = _generation([1, 2], [{1: -0.1}, {2: -0.5, 4: -0.9}])
    found = first_divergence("r", _generation([1, 7], []), reference, 0.5, _texts)
    assert found is not None and found.gap_at_least and not found.tie
    assert found.gap is not None and math.isclose(found.gap, 0.4)
    assert "gap >= 0.4000" in found.describe()


def test_a_run_that_ends_early_differs_where_it_ends(tmp_path: Path) -> None:
    reference = _generation([1, 2, 3], [{1: 0.0}, {2: 0.0}, {3: 0.0}])
    found = first_divergence("r", _generation([1, 2], []), reference, 0.02, _texts)
    assert found is not None and found.position == 2 and found.token_id is None
    assert "the run ended at token 2" in found.describe()


def test_lossless_goes_on_past_a_tie_from_the_runs_own_tokens() -> None:
    """At a tie the reference continues from the run's first n tokens; positions are the
    run's. (On the real engine: tests/test_smoke_deep_vllm_cpu.py.)"""
    reference = _generation([1, 2, 3, 4, 5], [{1: 0.0}, {2: -0.69, 7: -0.70}, {}, {}, {}])
    run = _generation([1, 7, 3, 9, 5], [])
    asked: list[int] = []

    def resume(n: int) -> Generation:
        asked.append(n)  # the reference, given [1, 7], goes on as 3, 4, 5
        return _generation([3, 4, 5], [{3: 0.0}, {4: -0.1, 9: -2.0}, {5: 0.0}])

    found = compare_across_ties("r", run, reference, 0.02, _texts, resume)
    assert asked == [2] and [t.position for t in found.ties] == [1]
    assert found.divergence is not None and found.divergence.position == 3
    assert found.divergence.token_id == 9 and found.divergence.reference_id == 4
    assert not found.divergence.tie and found.divergence.gap == pytest.approx(1.9)
    alike = compare_across_ties("r", _generation([1, 7, 3, 4, 5], []), reference, 0.02,
                                _texts, resume)  # fmt: skip
    assert alike.divergence is None and alike.tail is not None and not alike.stopped


def test_a_tie_that_cannot_be_crossed_says_why() -> None:
    reference = _generation([1, 2, 3], [{1: 0.0}, {2: -0.69, 7: -0.70}, {}])
    run = _generation([1, 7, 3], [])
    assert compare_across_ties("r", run, reference, 0.02, _texts, None).stopped
    failed = compare_across_ties("r", run, reference, 0.02, _texts, lambda n: "no /tokenize")
    assert failed.stopped == "no /tokenize" and failed.divergence is None
    last = compare_across_ties("r", _generation([1, 7], []), reference, 0.02, _texts, None)
    assert not last.stopped and len(last.ties) == 1  # the tie was its last token


def test_a_continuation_in_parts_goes_on_where_each_part_ends() -> None:
    reference = _generation([1, 2, 3, 4], [{1: 0.0}, {2: -0.69, 7: -0.70}, {}, {}])
    run = _generation([1, 7, 3, 4], [])
    wanted = {2: [3], 3: [4]}  # the reference, one token a part

    def resume(n: int) -> Generation:
        return _generation(wanted[n], [{}])  # finish "length": its part's max_tokens

    found = compare_across_ties("r", run, reference, 0.02, _texts, resume)
    assert found.divergence is None and not found.stopped and len(found.ties) == 1
