"""The FROZEN_KV_MTP speculative-defaults fix, run against the real SGLang release code.

The plain Gemma-4 launch line (`--speculative-algorithm NEXTN --speculative-draft-model-path
google/gemma-4-31B-it-assistant`, no steps/topk/draft tokens) is promoted to FROZEN_KV_MTP,
whose setup fills none of the three. For one release per code form, the release's own
setup function (extracted from its source, since the module imports torch) is run as
shipped and after `git apply` of the patch: as shipped the three stay None and the
release's own reserved-token expression raises the TypeError; patched they are 3 / 1 / 4
(upstream's auto-chosen steps for the Gemma-4 architecture, topk 1, steps + 1) and that
expression returns a number. Values the user passes are kept. Each patch applies to every
release its `when` range admits and to no other.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Iterator, Mapping
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

PATCHES = Path(__file__).resolve().parent.parent / "patches" / "sglang"
SERVER_ARGS = "python/sglang/srt/server_args.py"
HOOK = "python/sglang/srt/arg_groups/speculative_hook.py"
FIELDS = ("speculative_num_steps", "speculative_eagle_topk", "speculative_num_draft_tokens")
GEMMA4_TARGET = "Gemma4ForConditionalGeneration"
GEMMA4_DRAFT = "Gemma4AssistantForCausalLM"

# (patch file, a release of that code form)
CASES = [
    ("speculative-defaults-frozen-kv-mtp-server-args-0.5.12.patch", "0.5.12"),
    ("speculative-defaults-frozen-kv-mtp-hook-0.5.13.patch", "0.5.13"),
    ("speculative-defaults-frozen-kv-mtp-hook-0.5.14.patch", "0.5.17"),
    ("speculative-defaults-frozen-kv-mtp-hook-0.5.19.patch", "0.5.23"),
]
Setup = Callable[[Mapping[str, int | None]], dict[str, int | None]]


class _Args:
    """Stands in for ServerArgs: the fields the setup reads, None/False for the rest."""

    def __init__(self, **fields: Any) -> None:
        self.__dict__.update(fields)

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__"):
            raise AttributeError(name)
        return None

    def get_model_config(self) -> SimpleNamespace:
        return SimpleNamespace(hf_config=SimpleNamespace(architectures=[GEMMA4_TARGET]))


def _gemma4_launch(given: Mapping[str, int | None], algorithm: str) -> _Args:
    return _Args(
        model_path="/models/gemma-4-31B-it",
        speculative_algorithm=algorithm,
        speculative_draft_model_path="/models/gemma-4-31B-it-assistant",
        device="cuda",
        page_size=1,
        enable_mixed_chunk=False,
        speculative_adaptive=False,
        **dict(zip(FIELDS, (given["steps"], given["topk"], given["draft"]), strict=True)),
    )


AddModule = Callable[..., None]


@pytest.fixture
def fake_modules(monkeypatch: pytest.MonkeyPatch) -> Iterator[AddModule]:
    """sys.modules entries for the few sglang imports the setup code makes at call time."""

    def add(name: str, **attrs: Any) -> None:
        module = ModuleType(name)
        module.__dict__.update(attrs)
        monkeypatch.setitem(sys.modules, name, module)

    draft_config = SimpleNamespace(architectures=[GEMMA4_DRAFT])
    add("sglang.srt.utils.hf_transformers_utils", get_config=lambda *a, **k: draft_config)
    add(
        "sglang.srt.speculative.spec_info",
        SpeculativeAlgorithm=SimpleNamespace(from_string=lambda name: SimpleNamespace()),
    )
    add("sglang.srt.speculative.spec_registry", CustomSpecAlgo=type("CustomSpecAlgo", (), {}))
    yield add


def _server_args_setup(tree: Path) -> Setup:
    """0.5.12: ServerArgs._handle_speculative_decoding, the alias resolver and auto-choose."""
    ns: dict[str, Any] = {"logger": logging.getLogger("sglang-0.5.12"), "envs": _Envs()}
    path = tree / SERVER_ARGS
    load_definitions(
        path, {"_resolve_speculative_algorithm_alias", "auto_choose_speculative_params"}, ns
    )
    load_definitions(path, {"_handle_speculative_decoding"}, ns, class_name="ServerArgs")

    def run(given: Mapping[str, int | None]) -> dict[str, int | None]:
        args = _gemma4_launch(given, "NEXTN")  # the alias resolver promotes it
        ns["ServerArgs"]._handle_speculative_decoding(args)
        assert args.speculative_algorithm == "FROZEN_KV_MTP"
        return {name: getattr(args, name) for name in FIELDS}

    return run


class _Envs:
    def __getattr__(self, name: str) -> SimpleNamespace:
        return SimpleNamespace(get=lambda: False, set=lambda value: None)


def _hook_setup(tree: Path, version: str, add_module: AddModule) -> Setup:
    """0.5.13+: speculative_hook._handle_frozen_kv_mtp with the release's own auto-choose."""
    ns: dict[str, Any] = {"logger": logging.getLogger(f"sglang-{version}")}
    declared: list[tuple[str, dict[str, Any]]] = []
    if version == "0.5.13":
        # 0.5.13's hook imports auto_choose_speculative_params from server_args.
        name = "auto_choose_speculative_params"
        real = load_definitions(tree / SERVER_ARGS, {name}, {})[name]
        add_module("sglang.srt.server_args", **{name: real})
        names = {"_handle_frozen_kv_mtp"}
    else:
        names = {"_handle_frozen_kv_mtp", "_auto_choose_speculative_params"}
    ns |= {
        "resolving_view": lambda args: _Resolving(args, declared),
        "declare_resolution": lambda args, source, **f: declared.append((source, f)),
        "model_config_of": lambda args: args.get_model_config(),
    }
    load_definitions(tree / HOOK, names, ns)

    def run(given: Mapping[str, int | None]) -> dict[str, int | None]:
        declared.clear()
        args = _gemma4_launch(given, "FROZEN_KV_MTP")
        ns["_handle_frozen_kv_mtp"](args)
        view = _Resolving(args, declared)
        return {name: getattr(view, name) for name in FIELDS}

    return run


class _Resolving:
    """What resolving_view() gives from 0.5.19 on: raw fields with declarations on top."""

    def __init__(self, args: _Args, declared: list[tuple[str, dict[str, Any]]]) -> None:
        self._args, self._declared = args, declared

    def __getattr__(self, name: str) -> Any:
        for _, fields in reversed(self._declared):
            if name in fields:
                return fields[name]
        return getattr(self._args, name)


def _setup(tree: Path, version: str, fake_modules: AddModule) -> Setup:
    if version == "0.5.12":
        return _server_args_setup(tree)
    return _hook_setup(tree, version, fake_modules)


def _reserved_tokens(values: dict[str, int | None]) -> int:
    """The reserved-token max() every release computes (0.5.12 form; later forms agree)."""
    topk, steps = values["speculative_eagle_topk"], values["speculative_num_steps"]
    return int(max(topk * steps, values["speculative_num_draft_tokens"]))  # type: ignore[operator,type-var,arg-type]


UNSET: Mapping[str, int | None] = {"steps": None, "topk": None, "draft": None}


@pytest.mark.parametrize(("patch_name", "version"), CASES)
def test_release_leaves_defaults_unset_and_patch_fills_them(
    release_repo: Path, tmp_path: Path, fake_modules: AddModule, patch_name: str, version: str
) -> None:
    tree = checkout_release(release_repo, version, tmp_path / "sglang")
    shipped = _setup(tree, version, fake_modules)(UNSET)
    assert shipped == dict.fromkeys(FIELDS), shipped
    with pytest.raises(TypeError, match="NoneType"):
        _reserved_tokens(shipped)

    assert apply_patch(tree, PATCHES / patch_name)
    fill = _setup(tree, version, fake_modules)
    filled = fill(UNSET)
    assert filled == dict(zip(FIELDS, (3, 1, 4), strict=True))
    assert _reserved_tokens(filled) == 4
    assert fill({"steps": 5, "topk": None, "draft": None}) == dict(
        zip(FIELDS, (5, 1, 6), strict=True)
    )
    given: Mapping[str, int | None] = {"steps": 2, "topk": 1, "draft": 3}
    assert fill(given) == dict(zip(FIELDS, (2, 1, 3), strict=True))


@pytest.mark.parametrize("patch_name", [case[0] for case in CASES])
def test_patch_applies_exactly_in_its_when_range(release_repo: Path, patch_name: str) -> None:
    patch = PATCHES / patch_name
    when = patch_when(patch)
    for version, ok in applies_by_release(release_repo, patch).items():
        assert ok == (version in when), f"{patch_name} on {version} ({when}): applies={ok}"


def test_when_ranges_cover_every_release_with_frozen_kv_mtp() -> None:
    whens = [patch_when(PATCHES / name) for name, _ in CASES]
    for version in ALL_RELEASES:
        covering = sum(version in when for when in whens)
        assert covering == (0 if version.startswith(("0.5.10", "0.5.11")) else 1), version
