"""The deep checks against hostile input (issue 46): a planted lossless reference, an engine
that lies about its token counts, its per-position counters, its version or its text, and
evidence that would leak a secret or hold what no UTF-8 file can.

Engines are real HTTP servers on loopback answering in vLLM 0.32's formats
(tests/support/hostile_http.py); references are written and read by lossless's own code.
Each test fails on the code before the fix.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
import yaml

from sparkbuild import lockfile, redact
from sparkbuild.adapters import Generation, PositionCounts
from sparkbuild.adapters.vllm import VllmAdapter
from sparkbuild.checks import CheckResult
from sparkbuild.engines.profiles import (
    AcceptancePerPositionLimits,
    LongContextLimits,
    LosslessLimits,
    load_profile,
)
from sparkbuild.settings import Settings
from sparkbuild.smoke import record as smoke_lock
from sparkbuild.smoke.deep import lossless as ll
from sparkbuild.smoke.deep import phases
from sparkbuild.smoke.deep.compare import first_divergence
from sparkbuild.smoke.deep.evidence import RequestEvidence
from sparkbuild.smoke.deep.plan import ReferenceSource, same_engine
from sparkbuild.smoke.runner import SmokeResult
from tests.support.hostile_http import HostileServer, Reply, Request
from tests.support.smoke_cli import write_profile

IMAGE = "sha256:" + "d" * 64
MODEL = json.dumps({"object": "list", "data": [{"id": "m", "object": "model"}]}).encode()


def _ranked(ids: list[int], text: str = "") -> dict[str, object]:
    """A /v1/completions answer asked with return_tokens_as_token_ids (vLLM 0.32)."""
    tokens = [f"token_id:{i}" for i in ids]
    return {
        "choices": [{
            "text": text or "".join(f" w{i}" for i in ids),
            "finish_reason": "length",
            "logprobs": {"tokens": tokens, "token_logprobs": [-0.1] * len(ids),
                         "top_logprobs": [{t: -0.1, "token_id:1": -2.0} for t in tokens]},
        }],
        "usage": {"prompt_tokens": 3, "completion_tokens": len(ids)},
    }  # fmt: skip


def _generation(ids: list[int], text: str = "") -> Generation:
    return VllmAdapter.ranked_from_response("p", _ranked(ids, text))


def _requests(names: tuple[str, ...] = ("a",)) -> ll.Requests:
    return ll.Requests(names, tuple(f"prompt {n}" for n in names), 4, {"seed": 0}, 2)


# --- recorded references ---------------------------------------------------------------------


def _recorded(store: Path, progress: list[str]) -> ll.Reference | None:
    source = ReferenceSource(store=store)
    return ll.recorded(source, IMAGE, "key", _requests(), progress.append)


@pytest.fixture
def store(tmp_path: Path) -> Path:
    """A reference recorded by lossless's own writer, for a run whose answer was [5, 6, 7, 8]."""
    folder = tmp_path / ".sparkbuild" / "smoke-references"
    reference = ll.Reference([_generation([5, 6, 7, 8])], "second boot", [])
    ll.record(ReferenceSource(store=folder), IMAGE, "key", _requests(), reference)
    assert os.stat(folder).st_mode & 0o777 == 0o700
    return folder


def test_a_recorded_reference_of_our_own_is_used(store: Path) -> None:
    reference = _recorded(store, [])
    assert reference is not None and reference.generations[0].token_ids == (5, 6, 7, 8)


def _plant_writable(store: Path) -> None:
    (store / "key.json").chmod(0o666)


def _plant_foreign(store: Path) -> None:
    os.chown(store / "key.json", 65534, 65534)


def _plant_link(store: Path) -> None:
    elsewhere = store.parent / "elsewhere.json"
    (store / "key.json").rename(elsewhere)
    (store / "key.json").symlink_to(elsewhere)


def _plant_edit(store: Path) -> None:
    """The answer swapped for the run's broken one, the file's digest of itself left as it
    was: what turns a lossless fail into a pass."""
    path = store / "key.json"
    data = json.loads(path.read_text(encoding="utf-8"))
    data["generations"][0]["token_ids"] = [5, 9, 9, 9]
    path.write_text(json.dumps(data), encoding="utf-8")


def _plant_open_folder(store: Path) -> None:
    store.chmod(0o777)


@pytest.mark.parametrize(
    ("plant", "why"),
    [
        (_plant_writable, "writable by group or others (mode 0666)"),
        (_plant_foreign, "owned by uid 65534"),
        (_plant_link, "it is a symlink"),
        (_plant_edit, "its digest or shape"),
        (_plant_open_folder, "its folder is writable by group or others"),
    ],
)
def test_a_planted_reference_is_not_used(store: Path, plant: object, why: str) -> None:
    assert callable(plant)
    plant(store)
    progress: list[str] = []
    assert _recorded(store, progress) is None
    assert progress and why in progress[0], progress


def test_recording_replaces_a_planted_link_never_its_target(store: Path) -> None:
    _plant_link(store)
    target = store.parent / "elsewhere.json"
    before = target.read_bytes()
    reference = ll.Reference([_generation([5, 6, 7, 8])], "second boot", [])
    ll.record(ReferenceSource(store=store), IMAGE, "key", _requests(), reference)
    assert target.read_bytes() == before and not (store / "key.json").is_symlink()
    assert _recorded(store, []) is not None


# --- lossless: the text too, and never the engine under test as its reference ----------------


def test_the_same_token_ids_with_other_text_fail_lossless() -> None:
    ours = _generation([5, 6, 7, 8], text=" something else entirely")
    theirs = _generation([5, 6, 7, 8])
    reference = ll.Reference([theirs], "second boot", [])
    result = ll.judge_lossless([ours], reference, _requests(), LosslessLimits(), lambda ids: "")
    assert result is not None and result.status == "fail"
    assert "a: the same token ids as the reference, but other text" in result.detail


def test_a_reference_url_that_is_the_engine_under_test_is_refused() -> None:
    with HostileServer() as server:
        server.route("/v1/models", Reply(body=MODEL))
        server.route("/v1/completions", Reply(body=json.dumps(_ranked([5, 6, 7, 8])).encode()))
        alias = server.url.replace("127.0.0.1", "localhost") + "/"
        found = ll.url_reference(VllmAdapter(), alias, _requests(), lambda _: None, server.url)
        assert "is the engine under test" in found.failure
        assert "/v1/completions" not in server.seen
    assert same_engine("http://127.0.0.1:8000", "http://localhost:8000/")
    assert not same_engine("http://127.0.0.1:8000", "http://127.0.0.1:8001")
    assert not same_engine("http://10.0.0.2:8000", "http://10.0.0.3:8000")


def test_a_reference_url_that_speculates_is_refused() -> None:
    """Its drafts counter moves during the reference's requests: it is not without
    speculation (another port of the engine under test, or another speculating engine)."""

    def metrics(request: Request) -> Reply:
        drafts, accepted = 10 * request.count, 25 * request.count
        body = (
            f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}\n'
            f'vllm:spec_decode_num_draft_tokens_total{{engine="0"}} {3 * drafts}\n'
            f'vllm:spec_decode_num_accepted_tokens_total{{engine="0"}} {accepted}\n'
        )
        return Reply(body=body.encode(), content_type="text/plain")

    with HostileServer() as server:
        server.route("/v1/models", Reply(body=MODEL))
        server.route("/v1/completions", Reply(body=json.dumps(_ranked([5, 6, 7, 8])).encode()))
        server.route("/metrics", metrics)
        found = ll.url_reference(
            VllmAdapter(), server.url, _requests(), lambda _: None, "http://127.0.0.1:1"
        )
    assert "speculates (accept_len 3.50" in found.failure, found.failure


# --- bounds on what an engine says -----------------------------------------------------------


def test_a_divergence_keeps_a_bounded_redacted_text_of_a_huge_answer() -> None:
    """A 1 MB /detokenize answer went into the lock whole, three times (5 MB)."""
    huge = "x" * 1_000_000

    with HostileServer() as server:
        server.route("/v1/models", Reply(body=MODEL))
        server.route("/detokenize", Reply(body=json.dumps({"prompt": huge}).encode()))
        engine_texts = phases.Engine(VllmAdapter(), server.url, None).texts  # type: ignore[arg-type]
        found = first_divergence(
            "a", _generation([5, 6, 7]), _generation([5, 9, 7]), 0.02, engine_texts
        )
    assert found is not None
    assert len(json.dumps(found.numbers())) < 2_000 and len(found.describe()) < 2_000


def test_long_context_does_not_size_its_prompt_by_an_impossible_count(tmp_path: Path) -> None:
    """/tokenize answering 1 token for any text made it build a 500-million-character
    prompt; the count is refused and no prompt is sent."""
    write_profile(tmp_path, "deep", model="m")
    _, profile = load_profile(Settings(project_dir=tmp_path), "deep")
    with HostileServer() as server:
        server.route("/v1/models", Reply(body=MODEL))
        server.route("/tokenize", Reply(body=b'{"count": 1, "max_model_len": 1000000}'))
        engine = phases.Engine(VllmAdapter(), server.url, profile)
        result = phases.long_context(engine, LongContextLimits(), 0, lambda _: None)
        assert "/v1/completions" not in server.seen
    assert result.check.status == "fail"
    assert "/tokenize counts 1 tokens in" in result.check.detail


def test_a_deeply_nested_version_is_no_version_and_no_crash() -> None:
    deep = b'{"version": ' + b"[" * 100_000 + b"]" * 100_000 + b"}"
    with HostileServer() as server:
        server.route("/version", Reply(body=deep))
        assert VllmAdapter().server_version(VllmAdapter().session(), server.url) is None
        server.route("/version", Reply(body=b'{"version": ' + b"[" * 500 + b"]" * 500 + b"}"))
        assert VllmAdapter().server_version(VllmAdapter().session(), server.url) is None


def _scrape(server: HostileServer, text: str) -> PositionCounts:
    server.route("/metrics", Reply(body=text.encode(), content_type="text/plain"))
    return VllmAdapter().position_counts(VllmAdapter().session(), server.url)


def _positions(drafts: str, *accepted: str) -> str:
    lines = [f'vllm:spec_decode_num_drafts_total{{engine="0"}} {drafts}']
    lines += [
        f'vllm:spec_decode_num_accepted_tokens_per_pos_total{{engine="0",position="{i}"}} {v}'
        for i, v in enumerate(accepted)
    ]
    return "\n".join(lines) + "\n"


@pytest.mark.parametrize(
    ("first", "second", "why"),
    [
        (_positions("10", "5", "2"), _positions("NaN", "NaN", "NaN"), "not a finite number"),
        (_positions("10", "5", "2", "1"), _positions("20", "9"), "3 positions in the first"),
        (_positions("10", "5", "2"), _positions("20", "1", "1"), "a count went down"),
    ],
)
def test_per_position_counters_that_cannot_be_true_fail(first: str, second: str, why: str) -> None:
    """NaN counters passed every floor (NaN < floor is false) and fewer positions in the
    second scrape crashed the run."""
    with HostileServer() as server:
        before, after = _scrape(server, first), _scrape(server, second)
    limits = AcceptancePerPositionLimits(min_rates=[0.5, 0.5])
    result = phases.acceptance_per_position(VllmAdapter(), before, after, limits, True)
    assert result.status == "fail" and why in result.detail, result.detail


# --- evidence ---------------------------------------------------------------------------------


def test_evidence_is_redacted_before_it_is_cut() -> None:
    """A known secret across the 500th character was cut first, and its first half kept."""
    secret = "S3cretRegistryPassw0rdValue"
    redact.remember(secret)
    try:
        answer = "a" * 490 + secret + "b" * 2000
        evidence = RequestEvidence.of_text("long-output", "long-output/1", answer, "length", 9)
    finally:
        redact.forget_all()
    assert secret[:10] not in evidence.head and "***" in evidence.head
    assert len(evidence.head) <= 500 and evidence.tail == "b" * 500


def test_a_lone_surrogate_in_an_answer_is_kept_as_text_the_lock_can_hold(tmp_path: Path) -> None:
    """JSON's "\\ud800" alone decodes to a lone surrogate, which no UTF-8 file can hold: it
    reached the lock's evidence and broke every later report."""
    answer = json.loads('"before \\ud800 after"')
    evidence = RequestEvidence.of_text("chat", "chat/1", answer, "stop", 3)
    assert evidence.head == "before \ufffd after"
    lock = tmp_path / "images.lock"
    build = {"b": {"image": {"image_id": IMAGE}}}
    lock.write_text(yaml.safe_dump({"schema": 1, "builds": build}), encoding="utf-8")
    result = SmokeResult(
        verdict="fail", profile="p", engine="vllm", model="m", target_kind="url", target="u",
        boot_seconds=None, accept_len=None, checks=[CheckResult("chat", "fail", "x")],
        evidence=[evidence], declared=("chat",),
    )  # fmt: skip
    smoke_lock.record(lock, "b", result)
    lock.read_bytes().decode("utf-8")
    entry = lockfile.load(lock).builds["b"].smoke
    assert "\ufffd" in json.dumps(entry, ensure_ascii=False, default=str)
