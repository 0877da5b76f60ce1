"""Smoke-stage parts that need no engine: SGLang's recorded formats, signatures, profiles, CLI.

SGLang cannot run on this machine, so its adapter is tested against responses, metrics and
log lines in the exact formats of the releases (field names read from the 0.5.10 and 0.5.23
wheels: tokenizer_manager.py, metrics_collector.py, metrics_reporter.py, http_server.py).
"""

from __future__ import annotations

import json
import math
import os
from pathlib import Path

import pytest
import yaml

from sparkbuild.adapters import Counters, Generation, adapter_type, parse_prometheus
from sparkbuild.adapters.sglang import SglangAdapter
from sparkbuild.adapters.vllm import VllmAdapter
from sparkbuild.engines.profiles import Expectations, load_profile
from sparkbuild.engines.signatures import Evidence, diagnose, load_signatures
from sparkbuild.errors import EngineHTTPError, SpecError
from sparkbuild.settings import Settings
from sparkbuild.smoke import checks
from sparkbuild.smoke.deep.compare import missing_ids
from sparkbuild.spec import load_builds
from tests.support.cli import CliResult, run_cli

# /generate responses as SGLang builds them (meta_info keys per version).
SGLANG_0_5_10_RESPONSE = {
    "text": " 1, 1, 2, 3, 5, 8",
    "meta_info": {
        "id": "a1",
        "finish_reason": {"type": "length", "length": 12},
        "prompt_tokens": 9,
        "completion_tokens": 12,
        "cached_tokens": 0,
        "output_token_logprobs": [[-0.12, 220, None], [-0.5, 16, None], [-0.01, 11, None]],
        "spec_accept_rate": 0.6,
        "spec_accept_length": 2.4,
        "spec_accept_token_num": 7,
        "spec_draft_token_num": 15,
        "spec_verify_ct": 5,
        "e2e_latency": 0.31,
    },
}
SGLANG_0_5_23_RESPONSE = {
    "text": "def fib(n):",
    "meta_info": {
        "id": "b2",
        "finish_reason": {"type": "stop", "matched": 151645},
        "prompt_tokens": 20,
        "completion_tokens": 30,
        "output_token_logprobs": [[-0.2, 750, None], [None, 16, None], [float("nan"), 9, None]],
        "spec_accept_rate": 0.55,
        "spec_accept_length": 3.0,
        "spec_num_correct_drafts": 20,
        "spec_num_proposed_drafts": 30,
        "spec_verify_ct": 10,
    },
}
SGLANG_NO_SPEC_RESPONSE = {
    "text": "hello",
    "meta_info": {
        "finish_reason": {"type": "length", "length": 4},
        "completion_tokens": 4,
        "output_token_logprobs": [[-1.0, 1, None]] * 4,
    },
}
SGLANG_METRICS = """\
# HELP sglang:spec_accept_length The average acceptance length of speculative decoding.
# TYPE sglang:spec_accept_length gauge
sglang:spec_accept_length{model_name="Qwen/Qwen3-8B",tp_rank="0"} 2.83
# HELP sglang:generation_tokens_total Number of generation tokens processed.
# TYPE sglang:generation_tokens_total counter
sglang:generation_tokens_total{model_name="Qwen/Qwen3-8B"} %d
# HELP sglang:spec_verify_calls_total Number of speculative verify calls.
# TYPE sglang:spec_verify_calls_total counter
sglang:spec_verify_calls_total{model_name="Qwen/Qwen3-8B"} %d
"""
SGLANG_DECODE_LOG = (
    "[2026-01-10 10:00:00] Decode batch, #running-req: 1, #token: 345, token usage: 0.00, "
    "accept len: 2.83, accept rate: 0.61, cuda graph: True, gen throughput (token/s): 45.12, "
    "#queue-req: 0"
)


def test_sglang_generations_from_both_versions() -> None:
    old = SglangAdapter.generation_from_response("p", SGLANG_0_5_10_RESPONSE)
    new = SglangAdapter.generation_from_response("p", SGLANG_0_5_23_RESPONSE)
    assert (old.finish_reason, old.completion_tokens, old.spec_verify_ct) == ("length", 12, 5)
    assert old.tokens == ("220", "16", "11") and old.logprobs == (-0.12, -0.5, -0.01)
    assert (new.finish_reason, new.spec_verify_ct, new.spec_accept_length) == ("stop", 10, 3.0)
    adapter = SglangAdapter()
    acceptance = adapter.acceptance_from_generations([old, new])
    assert acceptance is not None and acceptance.source == "per-request fields"
    assert acceptance.accept_len == pytest.approx((12 + 30) / (5 + 10))


def test_sglang_accept_length_without_verify_count() -> None:
    payload = json.loads(json.dumps(SGLANG_0_5_10_RESPONSE))
    del payload["meta_info"]["spec_verify_ct"]
    generation = SglangAdapter.generation_from_response("p", payload)
    acceptance = SglangAdapter().acceptance_from_generations([generation])
    assert acceptance is not None and acceptance.accept_len == pytest.approx(2.4)


def test_sglang_counter_delta_and_inactive_speculation() -> None:
    adapter = SglangAdapter()
    before = Counters(parse_prometheus(SGLANG_METRICS % (1000, 400)))
    after = Counters(parse_prometheus(SGLANG_METRICS % (1283, 500)))
    assert after.get("sglang:spec_accept_length") == 2.83
    by_delta = adapter.acceptance_from_delta(before, after)
    assert by_delta.active and by_delta.accept_len == pytest.approx(2.83)
    plain = SglangAdapter.generation_from_response("p", SGLANG_NO_SPEC_RESPONSE)
    assert adapter.acceptance_from_generations([plain]) is None
    idle = adapter.acceptance(before, before, [plain])
    assert not idle.active and idle.accept_len is None
    result = checks.check_accept_len(idle, Expectations())
    assert result.status == "fail" and result.detail.startswith(checks.SPECULATION_INACTIVE)


def test_sglang_server_info_and_log_lines() -> None:
    info = {"internal_states": [{"avg_spec_accept_length": 2.5}, {"avg_spec_accept_length": 3.5}]}
    assert SglangAdapter.server_info_accept_length(info) == 3.0
    assert SglangAdapter.server_info_accept_length({"internal_states": [{}]}) is None
    adapter = SglangAdapter()
    assert adapter.acceptance_from_log(["x", SGLANG_DECODE_LOG]) == 2.83
    assert adapter.ready_line.search("[2026-01-10] The server is fired up and ready to roll!")
    assert adapter.nan_line.search("NaN detected in sampler: next_token_logits; values were")
    assert adapter.nan_line.search("Detected errors during sampling! NaN in the logits.")
    assert adapter.error_line.search("[2026-01-10] Scheduler hit an exception: Traceback")
    assert not adapter.error_line.search(SGLANG_DECODE_LOG)
    assert adapter.serve_args("m", "0.0.0.0", 30000, [])[-1] == "--enable-metrics"


def test_nan_check_reads_null_and_nan_logprobs() -> None:
    generation = SglangAdapter.generation_from_response("p", SGLANG_0_5_23_RESPONSE)
    assert generation.logprobs[1] is None and math.isnan(generation.logprobs[2] or 0.0)
    result = checks.check_nan([generation], None, [])
    assert result.status == "fail" and result.value == 2
    assert "2 of 3 logprobs are NaN, null or infinite" in result.detail


def test_a_check_of_nothing_is_no_pass() -> None:
    """An engine that sends text without logprobs, token ids or usage (issue 46, critical)."""
    text_only = Generation("p", "four five six", "length", 0, (), (), 0.1)
    nan = checks.check_nan([text_only], None, [])
    assert nan.status == "fail" and "no logprobs to inspect (1 completion(s), 0 logprobs)" in (
        nan.detail
    )
    assert missing_ids("p", text_only, text_only) == (
        "p: the run and the reference sent no token ids (13 and 13 characters of text), so "
        "nothing was compared"
    )
    with_ids = Generation("p", "x", "length", 1, ("x",), (-0.1,), 0.1, token_ids=(5,))
    assert missing_ids("p", with_ids, with_ids) is None
    assert checks.check_nan([with_ids], None, []).status == "pass"


def test_vllm_log_formats() -> None:
    adapter = VllmAdapter()
    line = (
        "(APIServer pid=1) INFO 11-21 10:00:00 [metrics.py:122] SpecDecoding metrics: "
        "Mean acceptance length: 2.31, Accepted throughput: 1.2 tokens/s"
    )
    assert adapter.acceptance_from_log([line]) == 2.31
    assert adapter.error_line.search("(EngineCore pid=2) ERROR 11-21 10:00:00 [core.py:1] boom")
    assert not adapter.error_line.search("(APIServer pid=1) WARNING 11-21 x: an ERRORS-free day")
    assert adapter.nan_line.search("RuntimeError: NaNs detected in logits: {'r1': 3}")


def test_repetition_detector() -> None:
    loop = ["a", "b", "c"] * 30
    prose = [f"w{i}" for i in range(90)]
    assert checks.repeated_fraction(loop, 8) > 0.9
    assert checks.repeated_fraction(prose, 8) == 0.0


SIGNATURE_LINES = {
    "sglang-tokenizer-manager-none": (
        '  File "/sgl-workspace/sglang/python/sglang/srt/managers/utils.py", line 71, in '
        "compute_num_reserved_tokens\nTypeError: unsupported operand type(s) for *: "
        "'NoneType' and 'NoneType'"
    ),
    "draft-or-kv-out-of-memory": "torch.OutOfMemoryError: CUDA out of memory. Tried to allocate",
    "kv-cache-no-memory": "ValueError: No available memory for the cache blocks. Try increasing",
    "flashinfer-head-dim-256": "RuntimeError: FlashInfer Internal Error: Invalid configuration",
    "cutlass-moe-fp4-shape": "RuntimeError: cutlass_moe_fp4: mismatch in expected n",
    "cudnn-unavailable": "RuntimeError: cuDNN is not available",
}


@pytest.mark.parametrize("signature_id", sorted(SIGNATURE_LINES))
def test_known_signatures(signature_id: str) -> None:
    lines = ["INFO starting", *SIGNATURE_LINES[signature_id].splitlines()]
    found = diagnose(lines, "sglang")
    assert found and found[0].id == signature_id
    assert found[0].remedy


def test_signature_remedies_name_patch_or_flag() -> None:
    by_id = {s.id: s for s in load_signatures()}
    assert "patches/sglang/reserved-tokens-none-" in by_id["sglang-tokenizer-manager-none"].remedy
    assert "--speculative-num-draft-tokens" in by_id["sglang-tokenizer-manager-none"].remedy
    assert "--attention-backend triton" in by_id["flashinfer-head-dim-256"].remedy
    assert (
        "patches/sglang/draft-memory-before-kv-pool.patch"
        in by_id["draft-or-kv-out-of-memory"].remedy
    )
    repo = Path(__file__).resolve().parents[1]
    for path in ("patches/sglang/draft-memory-before-kv-pool.patch",):
        assert (repo / path).exists(), f"signature remedy names a missing patch: {path}"
    assert diagnose(["TypeError: unsupported operand type(s) for *: 'NoneType' and 'NoneType'"],
                    "vllm") == []  # fmt: skip


def test_a_signature_matches_http_errors_and_failed_checks_not_only_log_lines(
    tmp_path: Path,
) -> None:
    """vLLM logs nothing about NaN logits: the evidence is an HTTP 400 or the nan check."""
    body = "POST /v1/completions: HTTP 400: Out of range float values are not JSON compliant"
    (by_http,) = diagnose(["INFO serving"], "vllm", evidence=Evidence(http=[body]))
    assert (by_http.id, by_http.source, by_http.line) == ("nan-logits", "http", body)
    nan = {"nan": "engine NaN counter rose by 4"}
    (by_check,) = diagnose([], "vllm", evidence=Evidence(checks=nan))
    assert (by_check.id, by_check.source) == ("nan-logits", "check")
    assert diagnose([], "vllm", evidence=Evidence(checks={"output": "NaN counter rose"})) == []
    bare = tmp_path / "signatures.yaml"
    bare.write_text("signatures:\n  - {id: no-evidence, diagnosis: d, remedy: r}\n")
    with pytest.raises(SpecError, match="pattern"):
        load_signatures(bare)


def test_nan_responses_are_one_failed_check() -> None:
    nan = EngineHTTPError.answered(
        "POST /v1/completions", 400, "Out of range float values are not JSON compliant"
    )
    other = EngineHTTPError.answered("POST /v1/completions", 500, "boom")
    expect = Expectations()
    assert checks.check_output([], [], [], expect, 2, 2).status == "skip"
    assert checks.check_output([], [], [], expect, 2, 1).status == "fail"
    only_nan = checks.check_errors([nan, nan], [], 0, [nan, nan])
    assert only_nan.status == "pass" and "2 NaN response(s) judged by nan" in only_nan.detail
    mixed = checks.check_errors([nan, other], [], 0, [nan])
    assert mixed.status == "fail" and "HTTP 500" in mixed.detail
    assert "hint" not in mixed.detail and "points at a running engine" not in mixed.detail


def _project(tmp_path: Path, profile: str) -> Settings:
    (tmp_path / "smoke").mkdir(exist_ok=True)
    (tmp_path / "smoke" / "p.yaml").write_text(profile, encoding="utf-8")
    return Settings(project_dir=tmp_path)


def test_profile_unknown_key_names_file_line_and_suggestion(tmp_path: Path) -> None:
    settings = _project(tmp_path, "engine: sglang\nmodel: m\nexpect:\n  min_accept_lenn: 1.5\n")
    with pytest.raises(SpecError) as error:
        load_profile(settings, "p")
    assert "p.yaml:4" in error.value.message and "did you mean 'min_accept_len'" in str(error.value)


def test_profile_defaults_model_override_and_env(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    settings = _project(tmp_path, "engine: vllm\nmodel: ${SMOKE_TEST_MODEL:-org/default}\n")
    name, profile = load_profile(settings, "p")
    assert (name, profile.model) == ("p", "org/default")
    assert profile.expect.min_accept_len is None and profile.container.gpus == "all"
    assert profile.prompts == ["code", "prose", "repetitive"]
    monkeypatch.setenv("SMOKE_TEST_MODEL", "org/from-env")
    assert load_profile(settings, "p")[1].model == "org/from-env"
    assert load_profile(settings, "p", model="other/model")[1].model == "other/model"


def test_repo_profiles_start_what_they_check() -> None:
    """Each shipped profile passes a speculative flag exactly when it expects speculation
    (else its accept_len check judges a run that never drafted), and every build lists only
    profiles of its own engine."""
    repo = Path(__file__).resolve().parents[1]
    settings = Settings(project_dir=repo)
    engines: dict[str, str] = {}
    for path in sorted((repo / "smoke").glob("*.yaml")):
        name, profile = load_profile(settings, str(path), model="x")
        method = adapter_type(profile.engine).speculative_method(profile.args)
        assert bool(method) == profile.expect.speculation, f"{name}: speculates with {method}"
        engines[path.stem] = profile.engine
    assert engines
    for build in load_builds(settings).values():
        for listed in build.smoke_profiles:
            assert engines.get(listed) == build.engine, f"{build.name} lists {listed}"


def _cli(tmp_path: Path, *args: str) -> CliResult:
    return run_cli("--project", str(tmp_path), "smoke", *args)


def test_cli_usage_errors(tmp_path: Path) -> None:
    _project(tmp_path, "engine: vllm\nmodel: m\n")
    neither = _cli(tmp_path, "--profile", "p")
    assert neither.exit_code == 2 and "exactly one of --image, --command, --url" in neither.stderr
    both = _cli(tmp_path, "--profile", "p", "--url", "http://127.0.0.1:1", "--command", "x")
    assert both.exit_code == 2
    missing = _cli(tmp_path, "--profile", "nope", "--url", "http://127.0.0.1:1")
    assert missing.exit_code == 2 and "no smoke profile 'nope'" in missing.stderr
    assert "known profiles: p" in missing.stderr


def test_record_without_image_entry_says_how_to_get_one(tmp_path: Path) -> None:
    _project(tmp_path, "engine: vllm\nmodel: m\n")
    (tmp_path / "images.lock").write_text(yaml.safe_dump({"schema": 1, "builds": {}}))
    run = _cli(tmp_path, "--profile", "p", "--url", "http://127.0.0.1:1", "--record", "b1")
    assert run.exit_code == 1
    assert "build 'b1' has no image in images.lock" in run.stderr
    assert "hint: build it first: sparkbuild build b1" in run.stderr


def test_unreachable_url_fails_with_http_errors(tmp_path: Path) -> None:
    _project(tmp_path, "engine: sglang\nmodel: m\n")
    port = 9  # discard: nothing listens on loopback
    run = _cli(tmp_path, "--profile", "p", "--url", f"http://127.0.0.1:{port}", "--json")
    assert run.exit_code == 1, run.stderr
    result = json.loads(run.stdout)
    by_name = {c["name"]: c for c in result["checks"]}
    assert by_name["errors"]["status"] == "fail" and "no response" in by_name["errors"]["detail"]
    assert by_name["output"]["status"] == "fail"
    assert by_name["boot"]["status"] == "skip"


def test_container_mounts_for_local_model_and_hub_id(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    from sparkbuild.engines.launch import command_argv, container_mounts
    from sparkbuild.engines.profiles import SmokeProfile

    model = tmp_path / "models" / "tiny"
    model.mkdir(parents=True)
    local = SmokeProfile(engine="vllm", model=str(model))
    mounts, inside, env = container_mounts(local)
    assert [(m.source, m.target, m.read_only) for m in mounts] == [(model, "/models", True)]
    assert (inside, env) == ("/models", {})
    nested = local.model_copy(
        update={"container": local.container.model_copy(update={"model_dir": tmp_path})}
    )
    assert container_mounts(nested)[1] == "/models/models/tiny"

    monkeypatch.setenv("HF_HOME", str(tmp_path))
    hub = SmokeProfile(engine="sglang", model="Qwen/Qwen3-8B")
    mounts, inside, env = container_mounts(hub)
    assert [(m.source, m.target) for m in mounts] == [(tmp_path, "/root/.cache/huggingface")]
    assert inside == "Qwen/Qwen3-8B" and env["HF_HUB_OFFLINE"] == "1"

    argv = command_argv("python -m sglang.launch_server", SglangAdapter(), "m", 1234, ["--x"])
    assert argv[3:] == ["--model-path", "m", "--host", "127.0.0.1", "--port", "1234",
                        "--enable-metrics", "--x"]  # fmt: skip
    full = command_argv("serve {model} --port {port}", VllmAdapter(), "m", 99, ["--x"])
    assert full == ["serve", "m", "--port", "99"]


def test_the_total_wait_is_bounded_by_the_profile() -> None:
    from sparkbuild.engines.profiles import SmokeProfile
    from sparkbuild.smoke.runner import profile_prompts, request_bound_s, total_bound_s

    profile = SmokeProfile.model_validate(
        {
            "engine": "vllm",
            "model": "/models/x",
            "prompts": ["prose", "repetitive"],
            "expect": {"boot_timeout_s": 100, "request_timeout_s": 7},
        }
    )
    count = len(profile_prompts(profile))
    assert count >= 2
    assert request_bound_s(profile, count) == 7 * count
    assert total_bound_s(profile, count) == 100 + 7 * count


def test_containers_are_named_and_labelled_by_the_stage_that_starts_them(tmp_path: Path) -> None:
    from sparkbuild.engines import lifeline
    from sparkbuild.engines.launch import TargetChoice, make_target
    from sparkbuild.engines.profiles import SmokeProfile
    from sparkbuild.engines.targets import STAGE_LABEL, ContainerTarget

    profile = SmokeProfile(engine="vllm", model=str(tmp_path))
    choice = TargetChoice(image="sparkbuild/vllm:test", gpus="none")
    for stage in ("smoke", "bench"):
        target = make_target(choice, profile, VllmAdapter(), None, stage=stage)
        assert isinstance(target, ContainerTarget)
        assert target.name.startswith(f"sparkbuild-{stage}-")
        labels = target._run_kwargs()["labels"]
        assert labels[STAGE_LABEL] == stage and labels[lifeline.LABEL_PID] == str(os.getpid())


def test_smoke_reads_the_timeouts_as_expectations() -> None:
    from sparkbuild.engines.launch import LaunchSettings, TargetChoice
    from sparkbuild.engines.profiles import SmokeProfile
    from sparkbuild.smoke.runner import expecting

    profile = SmokeProfile.model_validate(
        {"engine": "vllm", "model": "/m", "expect": {"boot_timeout_s": 100, "request_timeout_s": 7}}
    )
    choice = TargetChoice(url="http://127.0.0.1:1")
    unchanged = expecting(profile, LaunchSettings(choice))
    assert (unchanged.expect.boot_timeout_s, unchanged.expect.request_timeout_s) == (100, 7)
    both = expecting(profile, LaunchSettings(choice, boot_timeout_s=5, request_timeout_s=2))
    assert (both.expect.boot_timeout_s, both.expect.request_timeout_s) == (5, 2)
    one = expecting(profile, LaunchSettings(choice, request_timeout_s=3))
    assert (one.expect.boot_timeout_s, one.expect.request_timeout_s) == (100, 3)
    assert profile.expect.boot_timeout_s == 100  # the loaded profile itself is left alone
