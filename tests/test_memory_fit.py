"""The memory-fit estimate (engines/memory_fit.py) held against the published runs the
profiles cite, and its formulas against hand-computed configs; `profile fit`; dropping the
page cache (engines/page_cache.py) without the privilege.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import pytest
from packaging.version import Version

from sparkbuild.adapters import adapter_type
from sparkbuild.engines import memory_fit
from sparkbuild.engines.memory_fit import GIB, Launch, estimate, model_shape, shape_from_config
from sparkbuild.engines.page_cache import drop_local
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.errors import UsageError
from sparkbuild.yamlfile import load_model
from tests.support.cli import RunCli

ROOT = Path(__file__).resolve().parents[1]
SEED = "seed-qwen3.6-27b-fp8-nextn-sglang"

_vllm_memory = adapter_type("vllm").memory
assert _vllm_memory is not None
VLLM_MEMORY = _vllm_memory


def _fit(name: str, version: str, **kwargs: Any) -> memory_fit.Fit:
    profile = load_model(ROOT / "smoke" / f"{name}.yaml", SmokeProfile)
    fit = memory_fit.profile_fit(profile, version=Version(version), **kwargs)
    assert not isinstance(fit, str), fit
    return fit


@pytest.fixture(autouse=True)
def _no_local_models(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """Only the shipped facts: a Hugging Face cache on the machine must not change a verdict."""
    monkeypatch.setenv("HF_HOME", str(tmp_path / "no-hf-cache"))


@pytest.mark.parametrize("version", ["0.5.12", "0.5.13"])
def test_the_seeds_nextn_launch_runs_out_of_memory_before_the_draft_was_counted(
    version: str,
) -> None:
    fit = _fit(SEED, version)
    assert not fit.fits
    (problem,) = fit.problems
    assert problem.startswith("out of memory: the budget 0.82 x 119 GiB = 97.6 GiB")
    beside = {i.name: round(i.gib, 1) for i in fit.items if not i.inside}
    # The draft's MTP layer, its KV pool (1 layer beside the target's 16) and the bf16
    # embed_tokens + lm_head it loads before sharing the target's.
    assert beside == {"draft weights": 0.4, "draft KV": 4.4, "draft embed+lm_head": 4.7}
    assert fit.peak_gib == pytest.approx(120.1, abs=0.05)


@pytest.mark.parametrize(("version", "patched"), [("0.5.14", False), ("0.5.23", False),
                                                  ("0.5.12", True)])  # fmt: skip
def test_the_same_launch_fits_once_the_draft_is_counted_first(version: str, patched: bool) -> None:
    fit = _fit(SEED, version, draft_patched=patched)
    assert fit.fits, fit.problems
    assert all(i.inside for i in fit.items)
    assert fit.peak_gib == pytest.approx(110.6, abs=0.05)  # 8.4 GiB to spare
    # The target's KV cell grows by the draft's layer: 16 + 1 layers per token.
    assert fit.pool_tokens == int(fit.pool_gib * GIB // (2 * 4 * 256 * 2 * 17))


def test_ngram_has_no_draft_to_place() -> None:
    fit = _fit("qwen3.6-27b-fp8-ngram-sglang", "0.5.12", concurrency=8)
    assert fit.fits and [i.name for i in fit.items] == ["weights", "recurrent state", "KV pool"]


def test_a_pool_short_of_one_sequence_is_refused_and_one_short_of_the_run_is_said() -> None:
    shape = model_shape("Qwen/Qwen3.6-27B-FP8")
    assert shape is not None and shape.kv_layers == 16 and shape.max_context == 262144
    tight = estimate(
        shape, Launch(engine="vllm", facts=VLLM_MEMORY, version=None, fraction=0.24, context=262144)
    )
    assert tight.problems == (
        f"the KV pool holds {tight.pool_tokens} tokens, less than one sequence of 262144: the "
        "engine refuses to start",
    )
    launch = Launch(engine="vllm", facts=VLLM_MEMORY, version=None, fraction=0.8, context=262144,
                    concurrency=16)  # fmt: skip
    queued = estimate(shape, launch)
    assert queued.fits and any("of the 16 full-length sequences" in n for n in queued.notes)


def test_hybrid_configs_count_attention_layers_and_state_by_hand() -> None:
    # A Nemotron-H-shaped config: 2 attention layers of 6, Mamba2 layers keep state.
    nemotron = {
        "num_hidden_layers": 6, "hybrid_override_pattern": "M-M*E*", "num_attention_heads": 8,
        "num_key_value_heads": 2, "head_dim": 128, "hidden_size": 1024, "vocab_size": 1000,
        "mamba_num_heads": 16, "mamba_head_dim": 64, "ssm_state_size": 128, "n_groups": 8,
        "conv_kernel": 4, "max_position_embeddings": 4096,
    }  # fmt: skip
    shape = shape_from_config("n", nemotron, GIB, "test")
    assert (shape.kv_layers, shape.kv_heads, shape.head_dim) == (2, 2, 128)
    per_layer = 16 * 64 * 128 * 4 + (16 * 64 + 2 * 8 * 128) * 3 * 2
    assert shape.state_bytes == 2 * per_layer
    # A Qwen3.5-shaped config nested as text_config, with an explicit layer list.
    qwen = {"text_config": {
        "num_hidden_layers": 4, "layer_types": ["linear_attention"] * 3 + ["full_attention"],
        "num_attention_heads": 8, "num_key_value_heads": 2, "head_dim": 256,
        "hidden_size": 2048, "vocab_size": 1000, "linear_num_key_heads": 2,
        "linear_num_value_heads": 4, "linear_key_head_dim": 8, "linear_value_head_dim": 8,
        "linear_conv_kernel_dim": 4, "mtp_num_hidden_layers": 1,
    }}  # fmt: skip
    shape = shape_from_config("q", qwen, GIB, "test")
    assert (shape.kv_layers, shape.mtp_layers) == (1, 1)
    assert shape.state_bytes == 3 * (4 * 8 * 8 * 4 + (2 * 2 * 8 + 4 * 8) * 3 * 2)
    with pytest.raises(UsageError, match="lacks what the memory estimate reads"):
        shape_from_config("bad", {"num_hidden_layers": 2}, GIB, "bad/config.json")


def test_a_local_config_json_wins_over_the_shipped_facts(tmp_path: Path) -> None:
    model = tmp_path / "m"
    model.mkdir()
    (model / "config.json").write_text(json.dumps({
        "num_hidden_layers": 2, "num_attention_heads": 4, "hidden_size": 256,
        "vocab_size": 100, "max_position_embeddings": 1024,
    }))  # fmt: skip
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    shape = model_shape(str(model))
    assert shape is not None and shape.weight_bytes == 4096 and shape.kv_heads == 4
    assert shape.head_dim == 64 and shape.source.endswith("config.json")
    assert model_shape("nobody/unknown-model") is None


def test_profile_fit_exits_by_its_verdict(run_cli: RunCli) -> None:
    oom = run_cli("--project", str(ROOT), "profile", "fit", SEED, "--engine-version", "0.5.12")
    assert oom.exit_code == 1
    assert "does not fit (peak 120.1 of 119 GiB)" in oom.stdout
    assert "draft embed+lm_head" in oom.stdout
    fits = run_cli("--project", str(ROOT), "profile", "fit", SEED, "--engine-version",
                   "0.5.14", "--context", "32k", "--concurrency", "8", "--json")  # fmt: skip
    assert fits.exit_code == 0, fits.output
    payload = json.loads(fits.stdout)
    assert payload["fits"] and payload["need_tokens"] == 32768 * 8
    unknown = run_cli("--project", str(ROOT), "profile", "fit", "qwen3.6-35b-a3b-mtp-vllm")
    assert unknown.exit_code == 2
    assert "no memory estimate: rdtand/Qwen3.6-35B-A3B-PrismaQuant-4.75bit-vllm" in unknown.stderr


def test_dropping_the_page_cache_writes_the_kernels_switch(tmp_path: Path) -> None:
    switch = tmp_path / "drop_caches"
    drop_local(switch)
    assert switch.read_text() == "1\n"


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is missing")
def test_dropping_the_page_cache_without_root_is_a_clear_error() -> None:
    code = (
        "from sparkbuild.engines.page_cache import drop_local\n"
        "from sparkbuild.errors import UsageError\n"
        "try:\n    drop_local()\nexcept UsageError as e:\n    print(e, '|', e.hint)\n"
    )
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-c",
         code], capture_output=True, text=True, check=False,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "writing /proc/sys/vm/drop_caches needs root (uid 65534" in done.stdout
    assert "run as root (or with sudo), or leave out --drop-caches" in done.stdout


# --- before the boot: smoke and bench refuse what cannot fit, drop the page cache ----------


def _smoke(run_cli: RunCli, tmp_path: Path, *args: str) -> Any:
    return run_cli("--project", str(ROOT), "smoke", "--command", "false", "--profile", SEED,
                   "--engine-version", "0.5.12", "--boot-timeout", "20",
                   "--log", str(tmp_path / "engine.log"), *args)  # fmt: skip


def test_on_a_spark_a_launch_that_cannot_fit_is_refused_before_anything_starts(
    run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # This machine is no GB10: only the host check stands in for one.
    monkeypatch.setattr("sparkbuild.engines.boot_prep.spark_here", lambda: True)
    refused = _smoke(run_cli, tmp_path)
    assert refused.exit_code == 2, refused.output
    assert f"error: profile {SEED} does not fit a DGX Spark's memory: out of memory" in (
        refused.stderr
    )
    assert "pass --force to boot anyway" in refused.stderr
    assert "does not fit (peak 120.1 of 119 GiB)" in refused.stderr  # printed first
    assert not (tmp_path / "engine.log").exists()  # nothing was started
    out = tmp_path / "smoke.json"
    forced = _smoke(run_cli, tmp_path, "--force", "--json-file", str(out))
    assert forced.exit_code == 1, forced.output  # `false` exits at once: a failed boot
    recorded = json.loads(out.read_text())["before_boot"]
    assert recorded["spark"] and recorded["forced"] and recorded["fit"]["fits"] is False
    assert recorded["page_cache_dropped"] == []  # a --command run: off unless asked


def test_off_a_spark_there_is_no_estimate_and_the_run_says_so(
    run_cli: RunCli, tmp_path: Path
) -> None:
    out = tmp_path / "smoke.json"
    result = _smoke(run_cli, tmp_path, "--json-file", str(out))
    assert result.exit_code == 1, result.output  # booted (and failed): nothing refused
    assert json.loads(out.read_text())["before_boot"] == {
        "spark": False, "fit": None, "no_estimate": "not a DGX Spark: no memory estimate",
        "forced": False, "page_cache_dropped": [],
    }  # fmt: skip


@pytest.mark.skipif(shutil.which("setpriv") is None, reason="setpriv (util-linux) is missing")
def test_drop_caches_without_root_stops_the_run_before_the_boot() -> None:
    home = Path(tempfile.mkdtemp(prefix="sparkbuild-nobody-"))  # pytest's tmp is root's only
    home.chmod(0o777)
    log = home / "engine.log"
    try:
        _smoke_as_nobody(home, log)
    finally:
        shutil.rmtree(home, ignore_errors=True)


def _smoke_as_nobody(home: Path, log: Path) -> None:
    done = subprocess.run(
        ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups", sys.executable, "-m",
         "sparkbuild", "--project", str(ROOT), "smoke", "--command", "false", "--profile",
         SEED, "--drop-caches", "--log", str(log)],
        capture_output=True, text=True, check=False, env={"PATH": "/usr/bin:/bin",
                                                          "HOME": str(home)},
    )  # fmt: skip
    assert done.returncode == 2, done.stdout + done.stderr
    assert "error: --drop-caches: writing /proc/sys/vm/drop_caches needs root" in done.stderr
    assert "Traceback" not in done.stderr and not log.exists()
