"""The path-less NEXTN draft-KV fix, run against the real SGLang 0.5.23 code.

Qwen3.6 with its MTP head in the checkpoint: no --speculative-draft-model-path, and a
target text config without num_nextn_predict_layers. The release's own
`_resolve_eagle_aux_hidden_state` (extracted from its source: the module imports torch) is
called as shipped and after `git apply`: as shipped it leaves `eagle_draft_num_layers`
unset, so the pool configurator gives the draft no share of the KV budget; patched it takes
the draft-mode depth (1). A target that declares its depth, and a separate draft path, are
unchanged. The patch applies to exactly the releases its `when` admits.
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest

from tests.support.sglang_releases import (
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
    / "draft-kv-nextn-without-draft-path-0.5.22.patch"
)
MODULE = "python/sglang/srt/model_executor/model_runner_components/spec_aux_hidden_state.py"


def _config(nextn: int | None, layers: int = 64) -> SimpleNamespace:
    return SimpleNamespace(
        num_nextn_predict_layers=nextn,
        num_hidden_layers=layers,
        num_attention_layers=layers,
        is_hybrid_swa=False,
        is_deepseek_v4_arch=False,
        hf_config=SimpleNamespace(),
    )


def _resolver(tree: Path, draft_path: str | None, draft_mode_nextn: int | None) -> Any:
    """The release's function, with ModelConfig/get_spec standing in for a loaded model."""
    draft_mode = _config(draft_mode_nextn, layers=1)
    model_config_cls = SimpleNamespace(from_server_args=lambda *a, **k: draft_mode)
    spec = SimpleNamespace(
        speculative_draft_model_path=draft_path, speculative_draft_model_revision=None
    )
    ns = load_definitions(
        tree / MODULE,
        {"_resolve_eagle_aux_hidden_state"},
        {"ModelConfig": model_config_cls, "get_spec": lambda: spec},
    )
    return ns["_resolve_eagle_aux_hidden_state"]


def _draft_layers(tree: Path, target_nextn: int | None, draft_path: str | None) -> Any:
    config = SimpleNamespace(
        draft_kv_num_layers=None,
        draft_model_config=None,
        eagle_draft_num_layers=None,
        eagle_draft_swa_num_layers=None,
    )
    algorithm = SimpleNamespace(
        is_eagle=lambda: True, is_standalone=lambda: False, is_eagle3=lambda: False
    )
    _resolver(tree, draft_path, draft_mode_nextn=1)(
        config=config,
        server_args=SimpleNamespace(),
        model_config=_config(target_nextn),
        spec_algorithm=algorithm,
        is_draft_worker=False,
    )
    return config.eagle_draft_num_layers


def test_release_gives_the_pathless_head_no_kv_share_and_patch_counts_it(
    release_repo: Path, tmp_path: Path
) -> None:
    tree = checkout_release(release_repo, "0.5.23", tmp_path / "sglang")
    assert _draft_layers(tree, target_nextn=None, draft_path=None) is None  # the under-count
    assert _draft_layers(tree, target_nextn=2, draft_path=None) == 2

    assert apply_patch(tree, PATCH)
    assert _draft_layers(tree, target_nextn=None, draft_path=None) == 1
    assert _draft_layers(tree, target_nextn=2, draft_path=None) == 2  # declared depth wins
    assert _draft_layers(tree, target_nextn=None, draft_path="/draft") == 1  # unchanged path


def test_patch_applies_exactly_in_its_when_range(release_repo: Path) -> None:
    when = patch_when(PATCH)
    for version, ok in applies_by_release(release_repo, PATCH).items():
        assert ok == (version in when), f"{version} ({when}): applies={ok}"
