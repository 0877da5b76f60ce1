"""The reserved-token TypeError fix, run against the real SGLang release code.

For one release per patch file: the real expression (extracted from the release's own
source, since its module imports torch) raises the TypeError with the settings a Gemma 4
FROZEN_KV_MTP launch leaves unset; after `git apply` of the patch it returns what the
None convention implies. Each patch applies to every release its `when` range admits and
to no other release from 0.5.13 on (older ones share the 0.5.12 text but do not need it).
"""

from __future__ import annotations

import ast
import logging
from collections.abc import Callable
from pathlib import Path
from types import SimpleNamespace
from typing import Any

import pytest
from packaging.version import Version

from tests.support.sglang_releases import (
    ALL_RELEASES,
    applies_by_release,
    apply_patch,
    checkout_release,
    load_definitions,
    patch_when,
)

pytestmark = pytest.mark.upstream

PATCHES = Path(__file__).resolve().parent.parent / "patches" / "sglang"
TOKENIZER = "python/sglang/srt/managers/tokenizer_manager.py"
UTILS = "python/sglang/srt/managers/utils.py"
RUNTIME_CONTEXT = "python/sglang/srt/runtime_context.py"

# (patch file, a release it is for, where the expression lives)
CASES = [
    ("reserved-tokens-none-tokenizer-manager-0.5.12.patch", "0.5.12", TOKENIZER),
    ("reserved-tokens-none-tokenizer-manager-0.5.13.patch", "0.5.16", TOKENIZER),
    ("reserved-tokens-none-utils-0.5.17.patch", "0.5.17", UTILS),
    ("reserved-tokens-none-utils-0.5.18.patch", "0.5.23", UTILS),
]
FROZEN_KV_MTP_UNSET = {"topk": None, "steps": None, "draft": None}
STEPS_WITHOUT_DRAFT = {"topk": 1, "steps": 3, "draft": None}
FULLY_SET = {"topk": 1, "steps": 3, "draft": 4}


class _EagleFamily:
    """Stands in for SpeculativeAlgorithm: FROZEN_KV_MTP is in is_eagle() (checked below)."""

    @staticmethod
    def from_string(name: str | None) -> SimpleNamespace:
        return SimpleNamespace(is_eagle=lambda: name in ("EAGLE", "EAGLE3", "FROZEN_KV_MTP"))


def _reserved_tokens(tree: Path, where: str, version: str) -> Callable[[dict[str, Any]], int]:
    """The release's own reserved-token computation, callable with topk/steps/draft."""
    if where == TOKENIZER:
        return _tokenizer_manager_expression(tree / TOKENIZER)
    if Version(version) < Version("0.5.18"):
        ns = load_definitions(
            tree / UTILS, {"compute_num_reserved_tokens"}, {"SpeculativeAlgorithm": _EagleFamily}
        )

        def call_017(s: dict[str, Any]) -> int:
            args = SimpleNamespace(
                speculative_algorithm="FROZEN_KV_MTP",
                speculative_eagle_topk=s["topk"],
                speculative_num_steps=s["steps"],
                max_speculative_num_draft_tokens=s["draft"],
            )
            return int(ns["compute_num_reserved_tokens"](args))  # type: ignore[operator]

        return call_017

    spec = SimpleNamespace(speculative_algorithm="FROZEN_KV_MTP", speculative_adaptive=False)
    shared: dict[str, object] = {"get_spec": lambda: spec, "SpeculativeAlgorithm": _EagleFamily}
    load_definitions(tree / RUNTIME_CONTEXT, {"max_speculative_num_draft_tokens"}, shared)
    load_definitions(tree / UTILS, {"compute_num_reserved_tokens"}, shared)

    def call_018(s: dict[str, Any]) -> int:
        spec.speculative_eagle_topk = s["topk"]
        spec.speculative_num_steps = s["steps"]
        spec.speculative_num_draft_tokens = s["draft"]
        spec.max_speculative_num_draft_tokens = None
        return int(shared["compute_num_reserved_tokens"]())  # type: ignore[operator]

    return call_018


def _tokenizer_manager_expression(source: Path) -> Callable[[dict[str, Any]], int]:
    """The `if speculative_algorithm.is_eagle(): self.num_reserved_tokens = ...` block."""
    tree = ast.parse(source.read_text())
    block = next(
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.If)
        and "speculative_algorithm.is_eagle()" in ast.unparse(node.test)
        and "num_reserved_tokens" in ast.unparse(node)
    )
    code = compile(ast.Module(body=[block], type_ignores=[]), str(source), "exec")

    def run(s: dict[str, Any]) -> int:
        server_args = SimpleNamespace(
            speculative_eagle_topk=s["topk"],
            speculative_num_steps=s["steps"],
            speculative_num_draft_tokens=s["draft"],
            max_speculative_num_draft_tokens=s["draft"],
        )
        target = SimpleNamespace()
        algo = _EagleFamily.from_string("FROZEN_KV_MTP")
        exec(code, {"self": target, "server_args": server_args, "speculative_algorithm": algo})
        return int(target.num_reserved_tokens)

    return run


@pytest.mark.parametrize(("patch_name", "version", "where"), CASES)
def test_release_crashes_and_patch_follows_none_convention(
    release_repo: Path, tmp_path: Path, patch_name: str, version: str, where: str
) -> None:
    tree = checkout_release(release_repo, version, tmp_path / "sglang")
    spec_info = (tree / "python/sglang/srt/speculative/spec_info.py").read_text()
    is_eagle = spec_info.split("def is_eagle(self)", 1)[1].split("def ", 1)[0]
    assert "FROZEN_KV_MTP" in is_eagle, "FROZEN_KV_MTP takes the eagle reserved-token path"

    unpatched = _reserved_tokens(tree, where, version)
    with pytest.raises(TypeError, match="NoneType"):
        unpatched(FROZEN_KV_MTP_UNSET)
    with pytest.raises(TypeError, match="NoneType"):
        unpatched(STEPS_WITHOUT_DRAFT)
    assert unpatched(FULLY_SET) == 4

    assert apply_patch(tree, PATCHES / patch_name)
    patched = _reserved_tokens(tree, where, version)
    assert patched(FROZEN_KV_MTP_UNSET) == 0  # max((None or 1) * (None or 0), None or 0)
    assert patched(STEPS_WITHOUT_DRAFT) == 3
    assert patched(FULLY_SET) == 4  # unchanged when everything is set


@pytest.mark.parametrize("patch_name", [case[0] for case in CASES])
def test_patch_applies_exactly_in_its_when_range(release_repo: Path, patch_name: str) -> None:
    patch = PATCHES / patch_name
    when = patch_when(patch)
    applies = applies_by_release(release_repo, patch)
    logging.getLogger(__name__).info("%s applies: %s", patch_name, applies)
    for version, ok in applies.items():
        if version in when:
            assert ok, f"{patch_name} must apply to {version} ({when})"
        elif patch_name == CASES[0][0] and Version(version) < Version("0.5.12"):
            continue  # same text as 0.5.12, but no FROZEN_KV_MTP there: not needed
        else:
            assert not ok, f"{patch_name} must not apply to {version} ({when})"
    assert any(version in when for version in ALL_RELEASES)


def test_when_ranges_cover_every_affected_release() -> None:
    """0.5.12 (FROZEN_KV_MTP appears) to the newest release, each by exactly one patch."""
    whens = [patch_when(PATCHES / name) for name, _, _ in CASES]
    for version in ALL_RELEASES:
        covering = sum(version in when for when in whens)
        assert covering == (1 if Version(version) >= Version("0.5.12") else 0), version
