"""The memory-fit estimate against hostile and broken input (issue 46): a config.json that
would make it loop for hours or eat the host's memory, one too large or not a file, values no
checkpoint has (zero, negative, non-finite, the wrong type), and a budget flag that is no
fraction. Each is refused naming the file and key (exit 2), never a traceback."""

from __future__ import annotations

import json
import os
import resource
import subprocess
import sys
from pathlib import Path

import pytest

from sparkbuild.engines import memory_fit
from sparkbuild.engines.memory_fit import model_shape
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.errors import UsageError
from sparkbuild.yamlfile import load_model

ROOT = Path(__file__).resolve().parents[1]
VLLM_PROFILE = "qwen3.6-nvfp4-mtp-vllm"
#: A small model's config, each test changing one key.
GOOD = {
    "num_hidden_layers": 4, "num_attention_heads": 8, "num_key_value_heads": 2,
    "head_dim": 64, "hidden_size": 512, "vocab_size": 1000, "max_position_embeddings": 4096,
}  # fmt: skip


def _model(tmp_path: Path, config: object) -> Path:
    model = tmp_path / "model"
    model.mkdir(exist_ok=True)
    text = config if isinstance(config, str) else json.dumps(config)
    (model / "config.json").write_text(text, encoding="utf-8")
    (model / "model.safetensors").write_bytes(b"\0" * 4096)
    return model


def _fit_cli(model: Path, *args: str) -> subprocess.CompletedProcess[str]:
    """``profile fit`` in its own process, under a 2 GiB address-space limit and a minute:
    an estimate that allocates without bound dies of MemoryError there, not the host."""

    def limit() -> None:
        resource.setrlimit(resource.RLIMIT_AS, (2 << 30, 2 << 30))

    return subprocess.run(
        [sys.executable, "-m", "sparkbuild", "--project", str(ROOT), "profile", "fit",
         VLLM_PROFILE, "--model", str(model), *args],
        capture_output=True, text=True, timeout=60, preexec_fn=limit, check=False,
        env={**os.environ, "HF_HOME": str(model.parent / "no-hf")},
    )  # fmt: skip


@pytest.mark.parametrize(
    "changes",
    [{"num_hidden_layers": 10_000_000_000},
     {"num_hidden_layers": 10_000_000_000, "full_attention_interval": 4}],
    ids=["layers", "layers-with-interval"],
)  # fmt: skip
def test_a_120_byte_config_with_ten_billion_layers_is_refused_at_once(
    tmp_path: Path, changes: dict[str, int]
) -> None:
    model = _model(tmp_path, {**GOOD, **changes})
    assert (model / "config.json").stat().st_size < 300
    done = _fit_cli(model)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "num_hidden_layers is 10000000000, outside 1..4096" in done.stderr
    assert "Traceback" not in done.stderr and "MemoryError" not in done.stderr


def test_a_config_json_too_large_or_not_a_file_is_refused_without_reading_it(
    tmp_path: Path,
) -> None:
    padded = {**GOOD, "padding": "x" * (5 << 20)}  # valid JSON, 5 MiB
    model = _model(tmp_path, padded)
    done = _fit_cli(model)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "is larger than 4 MiB, more than sparkbuild reads" in done.stderr
    (model / "config.json").unlink()
    os.mkfifo(model / "config.json")  # reading a FIFO waits for a writer forever
    with pytest.raises(UsageError, match="is a FIFO"):
        model_shape(str(model))


@pytest.mark.parametrize(
    ("text", "message"),
    [
        (json.dumps({**GOOD, "hidden_size": 0, "head_dim": None}), "hidden_size is 0, outside"),
        (json.dumps({**GOOD, "full_attention_interval": 0.5}), "is 0.5, not a whole number"),
        (json.dumps(GOOD)[:-1] + ', "num_attention_heads": 1e400}', "is inf, not a whole"),
        (json.dumps({**GOOD, "head_dim": "64"}), "head_dim is '64', not a number"),
        (json.dumps({**GOOD, "vocab_size": True}), "vocab_size is True, not a number"),
        (json.dumps({**GOOD, "layer_types": ["full_attention"] * 5000}), "more than 4096"),
        (json.dumps([GOOD]), "is not a JSON object"),
        ("{" + json.dumps(GOOD)[1:-1] + ', "hidden_size": NaN}', "is not JSON"),
        ('{"num_hidden_layers": 2', "is not JSON"),
        (b"\xff\xfe{}".decode("latin-1"), "is not JSON"),
    ],
    ids=["zero", "fraction", "inf", "string", "bool", "layer-list", "list", "nan", "cut",
         "not-utf8"],
)  # fmt: skip
def test_values_no_checkpoint_has_are_refused_naming_the_key(
    tmp_path: Path, text: str, message: str
) -> None:
    model = _model(tmp_path, text)
    with pytest.raises(UsageError, match=r"config\.json") as raised:
        model_shape(str(model))
    assert message in str(raised.value)


@pytest.mark.parametrize(
    "changes",
    [{"num_key_value_heads": -2}, {"head_dim": -64}, {"vocab_size": -1000},
     {"hybrid_override_pattern": "M*M*", "mamba_num_heads": 8, "mamba_head_dim": 64,
      "ssm_state_size": -1_000_000, "n_groups": 1}],
    ids=["kv-heads", "head-dim", "vocab", "ssm-state"],
)  # fmt: skip
def test_negative_sizes_are_refused_instead_of_fitting(
    tmp_path: Path, changes: dict[str, object]
) -> None:
    model = _model(tmp_path, {**GOOD, **changes})
    key = next(k for k, v in changes.items() if isinstance(v, int) and v < 0)
    with pytest.raises(UsageError, match=f"{key} is -"):
        model_shape(str(model))


@pytest.mark.parametrize("value", ["nan", "inf", "-0.5", "0", "1.5", "ninety"])
def test_a_budget_flag_that_is_no_fraction_is_refused(tmp_path: Path, value: str) -> None:
    profile = load_model(ROOT / "smoke" / f"{VLLM_PROFILE}.yaml", SmokeProfile)
    args = [*profile.args]
    args[args.index("--gpu-memory-utilization") + 1] = value
    model = _model(tmp_path, GOOD)
    changed = profile.model_copy(update={"args": args, "model": str(model)})
    with pytest.raises(UsageError, match="is not a fraction of the memory") as raised:
        memory_fit.profile_fit(changed, version=None)
    assert f"--gpu-memory-utilization {value!r}" in str(raised.value)


def test_memory_and_context_that_are_no_sizes_are_usage_errors(tmp_path: Path) -> None:
    model = _model(tmp_path, GOOD)
    for args, says in ((["--memory-gib", "nan"], "is not a finite number"),
                       (["--context", "0"], "is not a token count"),
                       (["--context", "9" * 5000], "is not a token count")):  # fmt: skip
        done = _fit_cli(model, *args)
        assert done.returncode == 2, (args, done.stdout + done.stderr)
        assert says in done.stderr and "Traceback" not in done.stderr
