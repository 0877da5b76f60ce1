"""`sparkbuild smoke --deep` on the real vLLM engine on the CPU: the deep checks pass on the
CPU reference, and each fails on real bad output, naming what failed.

Boots are the cost (about 20 s each on 2 quiet cores), so they are shared: six in all. The
CPU reference runs as a user runs it, with its own second boot for lossless's reference:
that one run shows every check passing. One engine without speculation serves as the
reference (``--reference-url``) of the engine whose verifier accepts every draft, and as the
engine under test of the late loop (``--url``); the engine whose verifier accepts every
draft is booted once for two runs (its first divergence failed, and then forced to a tie).
The NaN model is booted once (long context, and the text judge on its output). The
think-token model, served with n-gram speculation and a reasoning parser that files all of
its text as reasoning, fails two checks in one run: chat, and acceptance per position
against a floor its third position does not reach.
"""

from __future__ import annotations

import json
import shlex
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.adapters.vllm import VllmAdapter
from sparkbuild.engines.profiles import LongOutputLimits, load_profile
from sparkbuild.engines.targets import ProcessTarget, free_port, wait_ready
from sparkbuild.settings import Settings
from sparkbuild.smoke.checks import repeated_fraction
from sparkbuild.smoke.deep import lossless as ll
from sparkbuild.smoke.deep import phases
from sparkbuild.smoke.deep.compare import first_divergence
from sparkbuild.smoke.deep.text import judge
from sparkbuild.smoke.runner import profile_prompts
from tests.support.burst_proxy import BurstProxy
from tests.support.smoke_cli import REPO, SmokeRun, run_smoke_cli, write_profile
from tests.support.vllm_cpu import ENGINE_ARGS, ENGINE_ENV, tiny_llama, vllm_server_command
from tests.support.vllm_patched import patched_overlay

pytestmark = pytest.mark.engine

DEEP = ("lossless", "long_output", "acceptance_per_position", "burn_in", "long_context", "chat")
_REFERENCE_ARGS = yaml.safe_load((REPO / "smoke" / "cpu-reference.yaml").read_text())["args"]
SPECULATION = _REFERENCE_ARGS[_REFERENCE_ARGS.index("--speculative-config") + 1]
# The tiny tokenizer's whole words after a space (" the", " quick", ...): greedy decoding
# over them with presence_penalty 2 visits each once, then falls back into its own loop.
WORDS = [270, 290, 353, 355, 358, 359, 360, 363, 364, 365, 366, 367, 368, 369, 370, 375, 376,
         377, 378, 379, 380, 381, 382, 388, 389, 390, 391, 399, 400, 401, 402, 403, 404, 405,
         406, 407, 408, 409, 410, 411, 412, 413, 414, 415, 416, 417, 418, 419, 420, 421, 422,
         423, 425, 426]  # fmt: skip


def _serve(model: Path, *extra: str, env: dict[str, str] | None = None) -> Iterator[str]:
    port = free_port()
    adapter = VllmAdapter()
    args = [*ENGINE_ARGS, *extra]
    argv = [*shlex.split(vllm_server_command()),
            *adapter.serve_args(str(model), "127.0.0.1", port, args)]  # fmt: skip
    with ProcessTarget(argv, port=port, env={**ENGINE_ENV, **(env or {})}) as target:
        readiness = wait_ready(target, adapter, timeout_s=400)
        assert target.logs is not None
        assert readiness.ready, "\n".join(target.logs.tail(30))
        yield target.base_url


@pytest.fixture(scope="module")
def plain_server() -> Iterator[str]:
    """The tiny model without speculation: lossless's reference, and a --url engine."""
    yield from _serve(tiny_llama())


@pytest.fixture(scope="module")
def accept_all_server() -> Iterator[str]:
    """The CPU reference's n-gram speculation with our patch to vLLM's greedy verifier,
    applied by sparkbuild's source stage: it accepts every draft."""
    overlay = {"PYTHONPATH": str(patched_overlay())}
    yield from _serve(tiny_llama(), "--speculative-config", SPECULATION, env=overlay)


@pytest.fixture(scope="module")
def nan_server() -> Iterator[str]:
    yield from _serve(tiny_llama(nan=True))


@pytest.fixture(scope="module")
def thinking_server() -> Iterator[str]:
    """A model whose tokenizer has <think> tokens, served with deepseek_r1's reasoning parser
    and the CPU reference's n-gram speculation: its random text never closes </think>, so
    the parser files all of it as reasoning."""
    yield from _serve(tiny_llama(think=True), "--reasoning-parser", "deepseek_r1",
                      "--speculative-config", SPECULATION)  # fmt: skip


@pytest.fixture
def project(tmp_path: Path) -> Path:
    (tmp_path / "smoke").mkdir()
    return tmp_path


def _only(*checks: str, **limits: Any) -> dict[str, Any]:
    """An ``expect`` that declares ``checks`` alone (the CPU reference declares all six)."""
    expect: dict[str, Any] = {name: None for name in DEEP}
    for name in checks:
        expect[name] = limits.get(name, {})
    return expect


def test_the_cpu_reference_passes_every_deep_check(project: Path) -> None:
    """n-gram speculation on against off on the real engine: the CPU engine is bit-exact."""
    (project / "smoke" / "cpu-reference.yaml").write_text(
        (REPO / "smoke" / "cpu-reference.yaml").read_text(encoding="utf-8"), encoding="utf-8"
    )
    lock = project / "images.lock"
    lock.write_text(yaml.safe_dump({"schema": 1, "builds": {"tiny": {
        "image": {"image_id": "sha256:" + "c" * 64}}}}), encoding="utf-8")  # fmt: skip

    run = run_smoke_cli(
        project, "--deep", "--command", vllm_server_command(), "--profile", "cpu-reference",
        "--model", str(tiny_llama()), "--record", "tiny", timeout=1500,
    )  # fmt: skip

    assert run.returncode == 0, run.explain()
    for name in ("lossless", "long-output", "acceptance-per-position", "burn-in",
                 "long-context", "chat"):  # fmt: skip
        assert run.check(name)["status"] == "pass", run.explain()
    lossless = run.check("lossless")
    assert lossless["value"]["identical"] == 4 and lossless["value"]["divergence"] is None
    assert "second boot without speculation" in lossless["detail"]
    rates = run.check("acceptance-per-position")["value"]["rates"]
    assert len(rates) == 3 and rates[0] > rates[2] > 0
    assert run.check("long-output")["value"]["max_tokens"] == 512  # the profile's length
    assert "deep: burn-in round 3 of 3" in run.stderr  # progress per phase
    assert "deep: lossless: booting vllm without speculation" in run.stderr
    assert run.result is not None
    evidence = {(e["check"], e["request"]) for e in run.result["evidence"]}
    assert ("smoke", "prose/story") in evidence and (
        "lossless",
        "reference prose/story",
    ) in evidence
    longest = next(e for e in run.result["evidence"] if e["check"] == "long-output")
    assert len(longest["head"]) == 500 and len(longest["tail"]) == 500
    recorded = yaml.safe_load(lock.read_text(encoding="utf-8"))["builds"]["tiny"]["smoke"]
    entry = recorded["sha256:" + "c" * 64]["cpu-reference"]
    assert entry["checks"]["lossless"] == "pass" and entry["declared"] == [
        "lossless", "long-output", "acceptance-per-position", "burn-in", "long-context", "chat"
    ]  # fmt: skip
    assert entry["numbers"]["acceptance-per-position"]["rates"] == rates
    assert any(e["check"] == "long-context" for e in entry["evidence"])


def test_a_verifier_that_accepts_every_draft_fails_lossless(
    project: Path, plain_server: str, accept_all_server: str
) -> None:
    """Our patch to vLLM's greedy verifier, applied by sparkbuild's source stage: accept_len
    goes up, and lossless names where the text left the model's."""
    write_profile(project, "accept-all", expect=_only("lossless"))

    run = run_smoke_cli(
        project, "--url", accept_all_server, "--profile", "accept-all",
        "--reference-url", plain_server,
    )  # fmt: skip

    assert run.returncode == 1, run.explain()
    assert run.check("accept_len")["status"] == "pass"
    assert run.result is not None and run.result["accept_len"] > 3.0  # nearly every draft taken
    lossless = run.check("lossless")
    assert lossless["status"] == "fail", run.explain()
    divergence = lossless["value"]["divergence"]
    assert divergence["request"] in ("repetitive/count", "repetitive/echo", "prose/memory",
                                      "prose/story")  # fmt: skip
    assert divergence["token_id"] != divergence["reference_id"] and not divergence["tie"]
    assert divergence["gap"] >= 0.02
    assert f"token {divergence['position']} is {divergence['token_id']}" in lossless["detail"]
    assert "speculation changed the text" in lossless["detail"]
    assert f"--reference-url {plain_server}" in lossless["detail"]
    # What today's smoke trusts passes: drafts are accepted, logprobs are finite, no error.
    for name in ("accept_len", "nan", "errors"):
        assert run.check(name)["status"] == "pass", run.check("output")


def _first_gaps(project: Path, accept_all: str, plain: str) -> dict[str, float]:
    """Each smoke request's gap at its first divergence (the accept-all verifier against
    the plain engine), as lossless's requests send it: exact gaps only (the run's token
    among the reference's 20 most likely)."""
    _, profile = load_profile(Settings(project_dir=project), "ties")
    prompts = profile_prompts(profile)
    names, texts = tuple(p.name for p in prompts), tuple(p.text for p in prompts)
    extra = {**profile.request, "seed": 0}
    requests = ll.Requests(names, texts, profile.expect.max_tokens, extra, 20)
    adapter = VllmAdapter()
    ours = ll.replay(adapter, accept_all, requests, lambda _: None)
    theirs = ll.replay(adapter, plain, requests, lambda _: None)
    gaps = {}
    for name, run, reference in zip(requests.names, ours, theirs, strict=True):
        found = first_divergence(name, run, reference, 0.0, lambda ids: "")
        if found is not None and found.gap is not None and not found.gap_at_least:
            gaps[name] = found.gap
    return gaps


def test_a_broken_verifier_whose_first_divergence_is_a_tie_fails_past_it(
    project: Path, plain_server: str, accept_all_server: str
) -> None:
    """The accept-all verifier with the tie epsilon set just above every request's first
    gap: each request first differs in a "tie". Comparing stopped there, and lossless
    passed; the reference now continues from the run's own tokens and the text leaves the
    model's later, named with the ties crossed."""
    model = str(tiny_llama())
    write_profile(project, "ties", model=model, expect=_only("lossless"))
    gaps = _first_gaps(project, accept_all_server, plain_server)
    assert gaps and max(gaps.values()) < 0.9, gaps
    epsilon = round(max(gaps.values()) + 0.0005, 4)
    lossless = {"tie_epsilon": epsilon, "top_logprobs": 20}
    write_profile(project, "ties", model=model, expect=_only("lossless", lossless=lossless))

    run = run_smoke_cli(
        project, "--url", accept_all_server, "--profile", "ties", "--reference-url", plain_server
    )

    print(gaps, epsilon, run.check("lossless"))
    assert run.returncode == 1, run.explain()
    check = run.check("lossless")
    assert check["status"] == "fail", run.explain()
    divergence = check["value"]["divergence"]
    crossed = [t for t in check["value"]["crossed"] if t["request"] == divergence["request"]]
    assert crossed and divergence["position"] > crossed[-1]["position"], check
    assert not divergence["tie"] and divergence["gap"] >= epsilon
    assert f"after {len(crossed)} tie(s) crossed" in check["detail"]
    assert f"token {divergence['position']} is {divergence['token_id']}" in check["detail"]
    assert "deep: lossless reference" in run.stderr and "past a tie: from token" in run.stderr


def test_nan_weights_fail_long_context(project: Path, nan_server: str) -> None:
    write_profile(project, "nan", expect={**_only("long_context", long_context={
        "depth": 900, "max_tokens": 16}), "speculation": False})  # fmt: skip

    run = run_smoke_cli(project, "--url", nan_server, "--profile", "nan")

    assert run.returncode == 1, run.explain()
    context = run.check("long-context")
    assert context["status"] == "fail", run.explain()
    assert "NaN" in context["detail"] and context["value"]["nan"] is True
    assert context["value"]["prompt_tokens"] > 850


def test_nan_weights_fail_the_text_judge(nan_server: str) -> None:
    """The engine's own output with NaN weights, judged as long-output judges it. A request
    with logprobs fails on this engine (long-context's test); without them it answers, and
    its token ids (``return_token_ids``) are what the text judge is given beside the text."""
    adapter = VllmAdapter()
    session = adapter.session()
    body = {"model": adapter.request_model(session, nan_server), "prompt": "The history of",
            "max_tokens": 32, "temperature": 0, "return_token_ids": True}  # fmt: skip
    payload, _ = adapter.post_json(session, nan_server + "/v1/completions", body)
    choice = payload["choices"][0]  # type: ignore[index]
    ids = choice["token_ids"]

    judged = judge(choice["text"], LongOutputLimits(), ids)

    assert len(ids) == 32 and not judged.ok, (choice, judged)
    assert {f.kind for f in judged.findings} & {"zero-run", "run"}, judged.describe()


def test_a_late_loop_fails_long_output_where_the_plain_check_passes(
    project: Path, plain_server: str
) -> None:
    """Greedy decoding with presence_penalty over 54 words: each word once, then a loop. The
    plain output check (8-gram repetition over the whole answer, limit 60 %) passes it."""
    greedy = {"temperature": 0, "presence_penalty": 2.0, "allowed_token_ids": WORDS}
    limits = {"max_tokens": 110, "request": greedy}  # over the reference's sampling deep_request
    write_profile(project, "late", expect={**_only("long_output", long_output=limits),
                                           "speculation": False})  # fmt: skip

    run = run_smoke_cli(project, "--url", plain_server, "--profile", "late")

    assert run.returncode == 1, run.explain()
    long_output = run.check("long-output")
    assert long_output["status"] == "fail", run.explain()
    (generation,) = long_output["value"]["generations"]
    first = generation["findings"][0]  # runs of one token id first, then the text's loops
    assert first["start"] >= 40, generation  # the loop starts late: a clean first half
    assert generation["tokens"] == 110
    total = 110 if first["unit"] == "token" else generation["units"]
    assert f"at {first['unit']} {first['start']} of {total}" in long_output["detail"]
    assert run.result is not None
    text = next(e["head"] for e in run.result["evidence"] if e["check"] == "long-output")
    assert repeated_fraction(text.split(), 8) < 0.6  # what the plain check would have judged


def test_a_sampled_deep_request_is_re_run_to_the_same_text(
    project: Path, plain_server: str
) -> None:
    """The deep checks' sampled requests carry a fixed seed: the same verdict's text comes
    back on a re-run, and another seed samples another text (so the seed is what holds it)."""
    write_profile(project, "seeded", model=str(tiny_llama()))
    _, profile = load_profile(Settings(project_dir=project), "seeded")
    engine = phases.Engine(VllmAdapter(), plain_server, profile)
    limits = LongOutputLimits(max_tokens=64)

    def text(seed: int) -> str:
        result = phases.long_output(engine, limits, seed, lambda _: None)
        assert result.evidence, result.check
        return result.evidence[0].head

    first = text(7)
    assert text(7) == first
    assert text(8) != first


@pytest.fixture(scope="module")
def thinking_run(thinking_server: str, tmp_path_factory: pytest.TempPathFactory) -> SmokeRun:
    """One run on the thinking engine, declaring chat and a floor for each draft position
    that its third position does not reach (n-gram k=3 accepts about 0.6 there)."""
    project = tmp_path_factory.mktemp("thinking")
    floors = {"min_rates": [0.0, 0.0, 0.99]}
    expect = _only("chat", "acceptance_per_position", chat={"max_tokens": 24},
                   acceptance_per_position=floors)  # fmt: skip
    write_profile(project, "think", expect=expect)
    return run_smoke_cli(project, "--url", thinking_server, "--profile", "think")


def test_a_parser_that_files_everything_as_reasoning_fails_chat(thinking_run: SmokeRun) -> None:
    run = thinking_run
    assert run.returncode == 1, run.explain()
    chat = run.check("chat")
    assert chat["status"] == "fail", run.explain()
    assert "chat/1: the content is empty (all" in chat["detail"]
    assert "characters went to reasoning" in chat["detail"]
    assert run.result is not None
    notes = {e.get("note") for e in run.result["evidence"] if e["check"] == "chat"}
    assert "reasoning" in notes  # kept apart in the evidence


def test_acceptance_per_position_fails_below_its_floor(thinking_run: SmokeRun) -> None:
    """The real engine's per-position counters against a floor its third position does not
    reach: the failure names the position and shows every rate."""
    run = thinking_run
    assert run.returncode == 1, run.explain()
    per_position = run.check("acceptance-per-position")
    assert per_position["status"] == "fail", run.explain()
    assert per_position["detail"].startswith("position 3 accepted"), per_position
    assert "floor 0.99" in per_position["detail"] and "by position: 1:" in per_position["detail"]
    rates = per_position["value"]["rates"]
    assert len(rates) == 3 and rates[2] < 0.99 and run.check("accept_len")["status"] == "pass"


def _text_only(path: str, body: bytes) -> bytes:
    """The engine's completions without logprobs (so without token ids) and usage."""
    answer = json.loads(body) if path.startswith("/v1/completions") else None
    if not isinstance(answer, dict):
        return body
    answer.pop("usage", None)
    for choice in answer.get("choices") or []:
        choice["logprobs"] = None
    return json.dumps(answer).encode()


def test_an_engine_that_sends_only_text_passes_no_check_of_numbers(
    project: Path, plain_server: str
) -> None:
    """Issue 46 (critical): with no token ids, logprobs or usage, nan said "0 logprobs
    finite" and lossless "identical token by token (0 tokens)", and the lock took a pass."""
    expect = _only("lossless", "long_context", long_context={"depth": 200, "max_tokens": 8})
    write_profile(project, "text-only", expect={**expect, "speculation": False})
    with (
        BurstProxy(plain_server, rewrite=_text_only) as engine,
        BurstProxy(plain_server, rewrite=_text_only) as reference,
    ):
        run = run_smoke_cli(project, "--url", engine.url, "--profile", "text-only",
                            "--reference-url", reference.url)  # fmt: skip

    assert run.returncode == 1, run.explain()
    assert run.check("output")["status"] == "pass"  # the text itself came
    nan = run.check("nan")
    assert nan["status"] == "fail" and "no logprobs to inspect" in nan["detail"], run.explain()
    lossless = run.check("lossless")
    assert lossless["status"] == "fail", run.explain()
    assert "the run and the reference sent no token ids" in lossless["detail"]
    context = run.check("long-context")
    assert context["status"] == "fail" and "no logprobs to check" in context["detail"]
