"""The draft-memory backport, run as real patched SGLang code with device queries as numbers.

A release (0.5.11, 0.5.12, 0.5.13) is checked out from the local release repository and the
patch is applied with `git apply`. The patched `ModelRunnerKVCacheMixin` methods are then
executed from that file (the module itself imports torch and CUDA code), with
`get_available_gpu_memory` answering like a DGX Spark: 119 GiB unified memory before the
target loads, 27 GiB of target weights. The unpatched release hands the whole budget to the
target's KV pool; the patched one leaves room for the draft's weights and its KV pool.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from types import ModuleType, SimpleNamespace
from typing import Any

import pytest

from tests.support.sglang_releases import (
    ALL_RELEASES,
    applies_by_release,
    apply_patch,
    checkout_release,
    load_definitions,
    patch_when,
)

pytestmark = pytest.mark.upstream

PATCH = (
    Path(__file__).resolve().parent.parent
    / "patches"
    / "sglang"
    / "draft-memory-before-kv-pool.patch"
)
MIXIN = "python/sglang/srt/model_executor/model_runner_kv_cache_mixin.py"
GIB = 1 << 30
PATCHED_METHODS = {
    "_profile_available_bytes",
    "_draft_reserved_bytes",
    "_draft_memory_plan",
    "_draft_checkpoint_bytes",
}

# DGX Spark (GB10): unified memory seen by get_available_gpu_memory, in GiB.
SPARK_FREE_BEFORE_LOAD = 119.0
TARGET_WEIGHTS = 27.0
MEM_FRACTION_STATIC = 0.88
MAMBA_STATE = 10.0  # what the (stand-in) mamba split takes for a hybrid GDN target
# Per-token, per-layer KV bytes of a Qwen3.6-27B-like full-attention layer (fp8 KV):
KV_BYTES_PER_LAYER_TOKEN = 4 * (256 + 256) * 1


@dataclass
class Case:
    algorithm: str = "EAGLE"
    draft_path: str | None = None
    draft_nextn_outer: int | None = 1  # what the draft rewrite sets on the outer hf_config
    draft_layers: int = 64
    vocab: int = 248_320
    hidden: int = 5120
    hybrid: bool = True
    is_draft_worker: bool = False
    calls: list[str] = field(default_factory=list)


@pytest.fixture
def fake_model_config(monkeypatch: pytest.MonkeyPatch) -> Iterator[dict[str, Case]]:
    """`from sglang.srt.configs.model_config import ModelConfig` inside the patched method."""
    holder: dict[str, Case] = {}

    class ModelConfig:
        @staticmethod
        def from_server_args(
            server_args: Any, model_path: str, model_revision: str | None, is_draft_model: bool
        ) -> SimpleNamespace:
            case = holder["case"]
            case.calls.append(model_path)
            assert is_draft_model
            return SimpleNamespace(
                hf_config=SimpleNamespace(num_nextn_predict_layers=case.draft_nextn_outer),
                num_nextn_predict_layers=None,  # nested text config: upstream issue #29857
                num_hidden_layers=case.draft_layers,
                num_attention_layers=case.draft_layers,
                vocab_size=case.vocab,
                hidden_size=case.hidden,
            )

    for name in ("sglang", "sglang.srt", "sglang.srt.configs"):
        monkeypatch.setitem(sys.modules, name, ModuleType(name))
    module = ModuleType("sglang.srt.configs.model_config")
    module.ModelConfig = ModelConfig  # type: ignore[attr-defined]
    monkeypatch.setitem(sys.modules, "sglang.srt.configs.model_config", module)
    yield holder


def _mixin(source: Path, methods: set[str]) -> type:
    namespace: dict[str, object] = {
        "get_available_gpu_memory": lambda *a, **k: SPARK_FREE_BEFORE_LOAD - TARGET_WEIGHTS,
        "get_world_group": lambda: SimpleNamespace(world_size=1, cpu_group=None),
        "logger": logging.getLogger("sglang-under-test"),
    }
    load_definitions(source, methods, namespace, class_name="ModelRunnerKVCacheMixin")
    mixin = namespace["ModelRunnerKVCacheMixin"]
    assert isinstance(mixin, type)
    return mixin


def _runner(mixin: type, case: Case) -> Any:
    class Runner(mixin):  # type: ignore[misc]
        def handle_max_mamba_cache(self, rest_memory: float) -> float:
            return rest_memory - MAMBA_STATE  # stand-in for the release's mamba split

    runner = Runner()
    runner.device, runner.gpu_id, runner.tp_size = "cuda", 0, 1
    runner.mem_fraction_static = MEM_FRACTION_STATIC
    runner.is_draft_worker = case.is_draft_worker
    runner.spec_algorithm = SimpleNamespace(
        name=case.algorithm,
        is_eagle=lambda: case.algorithm in ("EAGLE", "EAGLE3", "FROZEN_KV_MTP"),
        is_standalone=lambda: case.algorithm == "STANDALONE",
    )
    runner.server_args = SimpleNamespace(
        model_path="Qwen/Qwen3.6-27B-FP8",
        speculative_draft_model_path=case.draft_path,
        speculative_draft_model_revision=None,
    )
    runner.model_config = SimpleNamespace(num_hidden_layers=64)
    runner.weight_load_mem_usage = TARGET_WEIGHTS
    runner.start_layer, runner.end_layer, runner.num_effective_layers = 0, 64, 64
    full_attention = list(range(3, 64, 4))  # 16 of 64 layers, as in Qwen3.5/3.6
    runner.mambaish_config = (
        SimpleNamespace(full_attention_layer_ids=full_attention) if case.hybrid else None
    )
    return runner


def _budget_bytes(hybrid: bool) -> int:
    rest = (SPARK_FREE_BEFORE_LOAD - TARGET_WEIGHTS) - SPARK_FREE_BEFORE_LOAD * (
        1 - MEM_FRACTION_STATIC
    )
    return int((rest - (MAMBA_STATE if hybrid else 0)) * GIB)


@pytest.fixture(scope="module", params=["0.5.11", "0.5.12", "0.5.13"])
def trees(
    request: pytest.FixtureRequest, release_repo: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[Path, Path]:
    version = str(request.param)
    base = tmp_path_factory.mktemp(f"sglang-{version}")
    unpatched = checkout_release(release_repo, version, base / "unpatched")
    patched = checkout_release(release_repo, version, base / "patched")
    assert apply_patch(patched, PATCH)
    return unpatched / MIXIN, patched / MIXIN


def test_unpatched_release_gives_the_draft_nothing(
    trees: tuple[Path, Path], fake_model_config: dict[str, Case]
) -> None:
    unpatched, _ = trees
    fake_model_config["case"] = case = Case()
    runner = _runner(_mixin(unpatched, {"_profile_available_bytes"}), case)
    assert runner._profile_available_bytes(SPARK_FREE_BEFORE_LOAD) == _budget_bytes(True)


def test_nextn_target_pool_leaves_room_for_draft_weights_and_kv(
    trees: tuple[Path, Path], fake_model_config: dict[str, Case]
) -> None:
    _, patched = trees
    fake_model_config["case"] = case = Case()  # Qwen3.6-27B NEXTN: MTP layer in the checkpoint
    runner = _runner(_mixin(patched, PATCHED_METHODS), case)
    budget = _budget_bytes(True)

    target_bytes = runner._profile_available_bytes(SPARK_FREE_BEFORE_LOAD)

    assert case.calls == ["Qwen/Qwen3.6-27B-FP8"]  # the draft config, from the target path
    draft_weights = int(TARGET_WEIGHTS * GIB / 64) + 2 * 2 * case.vocab * case.hidden
    target_cell = 16 * KV_BYTES_PER_LAYER_TOKEN  # the target pool's full-attention layers
    tokens = target_bytes // target_cell
    draft_kv = tokens * 1 * KV_BYTES_PER_LAYER_TOKEN  # the draft pool: one layer, same tokens
    used = target_bytes + draft_weights + draft_kv
    assert used <= budget
    assert budget - used < 2 * target_cell + 16  # and it wastes (almost) nothing
    reserved = budget - target_bytes
    assert reserved > 4 * GIB, "more than the flat 4 GiB spec reserve 0.5.13 keeps back"
    assert reserved < budget // 4, "one draft layer (outer hf_config), not 64 (issue #29857)"


def test_frozen_kv_mtp_reserves_only_the_assistant_weights(
    trees: tuple[Path, Path], fake_model_config: dict[str, Case], tmp_path: Path
) -> None:
    _, patched = trees
    assistant = tmp_path / "gemma-4-31B-it-assistant"
    assistant.mkdir()
    (assistant / "config.json").write_text("{}")
    with (assistant / "model.safetensors").open("wb") as f:
        f.truncate(GIB + 123)  # sparse: only the size is read
    fake_model_config["case"] = case = Case(
        algorithm="FROZEN_KV_MTP",
        draft_path=str(assistant),
        draft_nextn_outer=None,
        draft_layers=4,
        hybrid=False,
    )
    runner = _runner(_mixin(patched, PATCHED_METHODS), case)
    runner.server_args.model_path = "google/gemma-4-31B-it"

    target_bytes = runner._profile_available_bytes(SPARK_FREE_BEFORE_LOAD)

    assert _budget_bytes(False) - target_bytes == GIB + 123  # weights; it reads the target KV


@pytest.mark.parametrize(
    "case",
    [Case(algorithm="NONE"), Case(algorithm="NGRAM"), Case(is_draft_worker=True)],
    ids=["no-speculation", "ngram", "draft-worker"],
)
def test_nothing_changes_without_a_draft_model(
    trees: tuple[Path, Path], fake_model_config: dict[str, Case], case: Case
) -> None:
    _, patched = trees
    fake_model_config["case"] = case
    runner = _runner(_mixin(patched, PATCHED_METHODS), case)
    assert runner._profile_available_bytes(SPARK_FREE_BEFORE_LOAD) == _budget_bytes(True)
    assert case.calls == []


def test_reservation_is_capped_at_the_budget(trees: tuple[Path, Path]) -> None:
    _, patched = trees
    reserved = _mixin(patched, {"_draft_reserved_bytes"})._draft_reserved_bytes  # type: ignore[attr-defined]
    assert reserved(10 * GIB, 12 * GIB, 16, 1) == 10 * GIB  # -> "Not enough memory" upstream
    assert reserved(-5, 1, 16, 1) == 0
    assert reserved(17 * GIB, 0, 16, 1) == GIB
    assert reserved(17 * GIB, GIB, 16, 0) == GIB


def test_patch_applies_exactly_in_its_when_range(release_repo: Path) -> None:
    when = patch_when(PATCH)
    applies = applies_by_release(release_repo, PATCH)
    assert {v for v, ok in applies.items() if ok} == {v for v in ALL_RELEASES if v in when}
    assert {"0.5.11", "0.5.12", "0.5.13"} <= {v for v in ALL_RELEASES if v in when}
