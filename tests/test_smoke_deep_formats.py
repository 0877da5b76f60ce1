"""Deep-smoke parts that need no engine: the adapters' facts (speculation off, per-position
counters, ranked answers in each engine's recorded format), the profile's declarations, the
publish gate's demand for them, and how the lock and the report keep the evidence.

SGLang's formats are the releases' own (field names read from the 0.5.10 and 0.5.23 wheels:
``managers/io_struct.py`` top_logprobs_num/return_text_in_logprobs, ``meta_info``
output_top_logprobs; ``sampling/sampling_params.py`` sampling_seed; ``arg_groups/fields/
spec.py`` for the ``--speculative-*`` flags); vLLM's were read from vLLM 0.32 on the CPU.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import cast

import pytest
import yaml

from sparkbuild import lockfile
from sparkbuild.adapters import PositionCounts
from sparkbuild.adapters.sglang import SglangAdapter
from sparkbuild.adapters.vllm import VllmAdapter
from sparkbuild.checks import CheckResult, Status
from sparkbuild.engines.profiles import BurnInLimits, Expectations, LosslessLimits, load_profile
from sparkbuild.errors import SpecError, UsageError
from sparkbuild.publish.gate import declared_checks, smoke_verdicts
from sparkbuild.settings import Settings
from sparkbuild.smoke.deep.evidence import EDGE_CHARS, RequestEvidence
from sparkbuild.smoke.deep.plan import DeepPlan, reference_url
from sparkbuild.smoke.record import smoke_record
from sparkbuild.smoke.runner import SmokeResult
from sparkbuild.spec import Build

REPO = Path(__file__).resolve().parents[1]
PIN = "sha256:" + "1" * 64

VLLM_RANKED = {
    "choices": [{
        "text": " the quick",
        "finish_reason": "length",
        "logprobs": {
            "tokens": ["token_id:270", "token_id:412"],
            "token_logprobs": [-0.5, -1.25],
            "top_logprobs": [{"token_id:270": -0.5, "token_id:9": -0.75},
                             {"token_id:412": -1.25, "token_id:270": -1.5}],
        },
    }],
    "usage": {"prompt_tokens": 4, "completion_tokens": 2},
}  # fmt: skip
SGLANG_RANKED = {
    "text": " the quick",
    "meta_info": {
        "finish_reason": {"type": "length", "length": 2},
        "completion_tokens": 2,
        "output_token_logprobs": [[-0.5, 270, " the"], [-1.25, 412, " quick"]],
        "output_top_logprobs": [[[-0.5, 270, " the"], [-0.75, 9, "*"]],
                                [[-1.25, 412, " quick"], [-1.5, 270, " the"]]],
        "spec_verify_ct": 1,
    },
}  # fmt: skip
VLLM_METRICS = """\
# TYPE vllm:spec_decode_num_drafts counter
vllm:spec_decode_num_drafts_total{engine="0",model_name="m"} 40.0
# TYPE vllm:spec_decode_num_accepted_tokens_per_pos counter
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="0"} 30.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="1"} 12.0
vllm:spec_decode_num_accepted_tokens_per_pos_total{engine="0",model_name="m",position="2"} 2.0
"""


def test_both_engines_give_ids_and_alternatives_by_id() -> None:
    ours = VllmAdapter.ranked_from_response("p", VLLM_RANKED)
    theirs = SglangAdapter.ranked_from_response("p", SGLANG_RANKED)
    for generation in (ours, theirs):
        assert generation.token_ids == (270, 412)
        assert generation.top_logprobs == ({270: -0.5, 9: -0.75}, {412: -1.25, 270: -1.5})
    assert theirs.token_texts == (" the", " quick")
    broken = {"choices": [{"logprobs": {"tokens": ["the"], "top_logprobs": []}}]}
    with pytest.raises(ValueError, match="not token_id:N"):
        VllmAdapter.ranked_from_response("p", broken)


def test_each_adapter_knows_how_to_turn_speculation_off() -> None:
    vllm_args = ["--dtype", "bfloat16", "--speculative-config", '{"method":"mtp"}',
                 "-sc={}", "--max-model-len", "1024"]  # fmt: skip
    assert VllmAdapter().without_speculation(vllm_args) == [
        "--dtype", "bfloat16", "--max-model-len", "1024"]  # fmt: skip
    sglang_args = ["--trust-remote-code", "--speculative-algorithm", "EAGLE",
                   "--speculative-num-steps", "3", "--speculative-use-rejection-sampling",
                   "--enable-multi-layer-eagle", "--speculative-eagle-topk=1",
                   "--no-speculative-enable-w4a4-mxfp4-megamoe",
                   "--mem-fraction-static", "0.8"]  # fmt: skip
    assert SglangAdapter().without_speculation(sglang_args) == [
        "--trust-remote-code", "--mem-fraction-static", "0.8"]  # fmt: skip
    assert (VllmAdapter.seed_field, SglangAdapter.seed_field) == ("seed", "sampling_seed")


def test_per_position_rates_from_vllm_counters_and_none_from_sglang() -> None:
    from sparkbuild.adapters.values import per_position

    accepted, drafts = per_position(VLLM_METRICS, VllmAdapter.ACCEPTED_PER_POS, VllmAdapter.DRAFTS)
    after = PositionCounts(tuple(accepted), drafts)
    before = PositionCounts((10.0, 2.0), 20.0)  # a position it had not reached yet counts 0
    assert after.rates_since(before) == [1.0, 0.5, 0.1]
    assert "SGLang exports no per-position acceptance" in SglangAdapter.per_position_missing
    assert not VllmAdapter.per_position_missing


def test_a_profile_declares_deep_checks_and_deep_runs_them_all(tmp_path: Path) -> None:
    declared = Expectations(lossless=LosslessLimits(), burn_in=BurnInLimits(rounds=2))
    assert declared.declared_deep() == ("lossless", "burn-in")
    plan = DeepPlan.of(declared, everything=False)
    assert plan is not None and plan.checks == ("lossless", "burn-in") and plan.ranked == 2
    everything = DeepPlan.of(declared, everything=True)
    assert everything is not None and len(everything.checks) == 6
    assert (
        everything.limits.burn_in is not None and everything.limits.burn_in.rounds == 2
    )  # declared limits
    assert DeepPlan.of(Expectations(), everything=False) is None
    (tmp_path / "smoke").mkdir()
    bad = {"engine": "vllm", "model": "m", "expect": {"lossless": {"top_logprobs": 1}}}
    (tmp_path / "smoke" / "p.yaml").write_text(yaml.safe_dump(bad), encoding="utf-8")
    with pytest.raises(SpecError, match="top_logprobs"):
        load_profile(Settings(project_dir=tmp_path), "p")
    with pytest.raises(UsageError, match="not an http"):
        reference_url("file:///etc/passwd")
    with pytest.raises(UsageError, match=r"query or fragment") as refused:
        reference_url("http://127.0.0.1:8001/?token=Zq81-secret")
    assert "Zq81-secret" not in str(refused.value)  # shown masked
    assert reference_url("http://127.0.0.1:8001/") == "http://127.0.0.1:8001"


def test_publish_counts_a_pass_only_with_the_declared_deep_checks_passed() -> None:
    name = "qwen3.6-35b-a3b-mtp-vllm"
    build = cast(Build, SimpleNamespace(smoke_profiles=(name,)))
    declared = declared_checks(Settings(project_dir=REPO), build)
    assert declared[name] == ("lossless", "long-output", "acceptance-per-position", "burn-in",
                              "long-context", "chat")  # fmt: skip

    def counted(checks: dict[str, Status]) -> str:
        record = lockfile.SmokeRecord(
            verdict="pass", verified=True, image_id=PIN, target=f"image:{PIN}", checks=checks
        )
        entry = lockfile.BuildEntry(smoke={PIN: {name: record}})
        return smoke_verdicts(entry, build, PIN, (), declared)[name]

    everything: dict[str, Status] = dict.fromkeys(declared[name], "pass")
    assert counted(everything) == "pass"
    assert counted({}) == (
        "pass without the declared deep checks (lossless not run, long-output not run, "
        "acceptance-per-position not run, burn-in not run, long-context not run, chat not run)"
    )
    skipped: dict[str, Status] = {**everything, "acceptance-per-position": "skip"}
    assert counted(skipped) == (
        "pass without the declared deep checks (acceptance-per-position skip)"
    )
    undeclared = lockfile.SmokeRecord(
        verdict="pass", verified=True, image_id=PIN, target=f"image:{PIN}"
    )
    entry = lockfile.BuildEntry(smoke={PIN: {name: undeclared}})
    assert smoke_verdicts(entry, build, PIN)[name] == "pass"


def test_the_lock_keeps_each_checks_numbers_and_the_answers_ends_redacted() -> None:
    secret = "https://user:hunter2secret@example.com/x"
    answer = "a" * 600 + secret + "b" * 600
    evidence = RequestEvidence.of_text("long-output", "long-output/1", answer, "length", 900)
    assert len(evidence.head) == EDGE_CHARS and evidence.tail.endswith("b" * 100)
    short = RequestEvidence.of_text("smoke", "p", f"see {secret}", "stop", 5)
    assert "hunter2secret" not in short.head and short.tail == ""
    result = SmokeResult(
        verdict="fail", profile="p", engine="vllm", model="m", target_kind="command",
        target="t", boot_seconds=1.0, accept_len=2.0,
        checks=[CheckResult("lossless", "fail", "diverged", value={"divergence": {"position": 7,
                                                                                  "gap": 0.9}})],
        evidence=[evidence, short], declared=("lossless",),
    )  # fmt: skip
    record = smoke_record(result).to_json()
    assert record["numbers"] == {"lossless": {"divergence": {"position": 7, "gap": 0.9}}}
    assert record["declared"] == ["lossless"]
    assert [e["request"] for e in record["evidence"]] == ["long-output/1", "p"]
    assert "hunter2secret" not in yaml.safe_dump(record)
    assert result.to_json()["evidence"][1]["head"] == short.head
