"""Recipes held against sparkrun 0.4.2's own code (PyPI, its own Python >= 3.12 venv, no
network, telemetry off): the corpus in tests/data/recipes/sparkrun/ covers every section of
sparkrun's recipe reference (RECIPES.md), and sparkrun loads and renders every recipe in it
but the one whose base only a registry could give.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.adapters import engine_names
from sparkbuild.engines.recipe_writer import flag_groups
from sparkbuild.engines.recipes import import_recipe
from sparkbuild.engines.sparkrun_flags import SPARKRUN_VERSION, sparkrun_flags
from sparkbuild.errors import UsageError
from tests.support.recipe_trips import named
from tests.support.sparkrun_peer import Sparkrun, recipes_md, sparkrun_or_skip

pytestmark = pytest.mark.upstream

RECIPES = Path(__file__).parent / "data" / "recipes"
CORPUS = RECIPES / "sparkrun"
#: Corpus recipes sparkrun itself refuses to load, and the reason it gives.
SPARKRUN_REFUSES = {
    "include-registry-vllm.yaml": "not found in registry 'official'",
}


def corpus() -> list[Path]:
    return sorted(CORPUS.glob("*.yaml"), key=lambda p: p.name) + sorted(RECIPES.glob("*.yaml"))


def recipe_files() -> list[Path]:
    return [p for p in corpus() if p.name != "FEATURES.yaml"]


@pytest.fixture(scope="module")
def sparkrun(tmp_path_factory: pytest.TempPathFactory) -> Sparkrun:
    return sparkrun_or_skip(tmp_path_factory.mktemp("sparkrun"))


@pytest.fixture(scope="module")
def rendered(sparkrun: Sparkrun) -> dict[str, dict[str, Any]]:
    """sparkrun's own rendering of every corpus recipe, asked once for the module."""
    paths = recipe_files()
    answers = sparkrun.ask([{"op": "render", "path": str(p)} for p in paths])
    return {p.name: a for p, a in zip(paths, answers, strict=True)}


def sections(reference: str) -> list[str]:
    """The headings of a Markdown reference, outside its code blocks."""
    found: list[str] = []
    fenced = False
    for line in reference.splitlines():
        if line.startswith("```"):
            fenced = not fenced
        elif not fenced and (match := re.match(r"^#{2,4} (.+?)\s*$", line)):
            found.append(match[1])
    return found


def uncovered(reference: str, features: dict[str, Any]) -> list[str]:
    """Sections of the reference the corpus map does not name, and files it names that
    do not exist."""
    mapped = features["sections"]
    missing = [s for s in sections(reference) if s not in mapped]
    for section, entry in mapped.items():
        missing += [
            f"{section}: {f}" for f in entry.get("recipes", []) if not (CORPUS / f).is_file()
        ]
        if not entry.get("recipes") and not entry.get("not_a_recipe"):
            missing.append(f"{section}: neither recipes nor a reason")
    return missing


def test_the_corpus_covers_every_section_of_sparkruns_recipe_reference(sparkrun: Sparkrun) -> None:
    features = yaml.safe_load((CORPUS / "FEATURES.yaml").read_text(encoding="utf-8"))
    reference = recipes_md(sparkrun.python)
    assert len(sections(reference)) >= 50
    assert uncovered(reference, features) == []
    # The check can fail: a section sparkrun adds, or a recipe that is not there.
    grown = reference + "\n### Recipe signing\n"
    features["sections"]["Metadata"] = {"recipes": ["no-such.yaml"]}
    assert uncovered(grown, features) == ["Recipe signing", "Metadata: no-such.yaml"]


def test_sparkrun_renders_every_corpus_recipe_but_the_registry_include(
    rendered: dict[str, dict[str, Any]],
) -> None:
    refused = {name: a["error"] for name, a in rendered.items() if "error" in a}
    assert set(refused) == set(SPARKRUN_REFUSES), refused
    for name, reason in SPARKRUN_REFUSES.items():
        assert reason in refused[name]
    loaded = [a for a in rendered.values() if "error" not in a]
    assert len(loaded) == len(recipe_files()) - len(SPARKRUN_REFUSES) >= 40
    assert all(a["argv"] and a["runtime"] for a in loaded)


def test_the_shipped_flag_maps_are_sparkruns_own(sparkrun: Sparkrun) -> None:
    theirs = sparkrun.one({"op": "flag_maps"})
    ours = sparkrun_flags()
    assert ours.sparkrun == SPARKRUN_VERSION == "0.4.2"
    assert sorted(ours.engines) == engine_names()  # a map for every engine, none more
    for engine in engine_names():
        mine = ours.engines[engine]
        assert list(mine.flags.items()) == list(theirs[engine]["flags"].items()), engine
        assert sorted(mine.booleans) == theirs[engine]["booleans"]
        assert sorted(mine.negatable) == theirs[engine]["negatable"]
        assert sorted(mine.after) == theirs[engine].get("special", [])
        assert mine.defaults == theirs[engine].get("defaults", {})
    counts = {engine: len(ours.engines[engine].flags) for engine in engine_names()}
    assert counts == {"llamacpp": 20, "sglang": 48, "vllm": 76}
    assert ours.read_keys == theirs["read_keys"]
    assert list(ours.read_keys) == theirs["read_key_reasons"]
    assert ours.runtime_display == theirs["runtime_display"]


# --- import: the same engine command as sparkrun's own renderer, or a note for each flag ------

#: Recipes the import refuses, and the true reason it gives.
WE_REFUSE = {
    "include-registry-vllm.yaml": "is a registry recipe: only sparkrun's registries",
    "trtllm.yaml": "runtime 'trtllm': sparkbuild launches vLLM, llama.cpp and SGLang only",
    "atlas.yaml": "runtime 'atlas': sparkbuild launches vLLM, llama.cpp and SGLang only",
    "env-templates-launch-vllm.yaml": "{launch.model_path} is the prepared model directory",
}
_PREFIXES = (
    ("vllm", "serve"), ("python", "-m", "vllm.entrypoints.openai.api_server"),
    ("python3", "-m", "sglang.launch_server"), ("python", "-m", "sglang.launch_server"),
    ("sglang", "serve"), ("llama-server",),
)  # fmt: skip
_LAUNCHER = {"--host", "--port"}
_SIZES = {"-tp": "tp", "--tensor-parallel-size": "tp", "--tp-size": "tp", "--tp": "tp",
          "-pp": "pp", "--pipeline-parallel-size": "pp", "--pp-size": "pp",
          "--ep-size": "ep", "--enable-expert-parallel": "ep"}  # fmt: skip


def _their_groups(argv: list[str]) -> tuple[list[tuple[str, ...]], dict[str, str]]:
    """sparkrun's command as flag groups, the serve prefix and model left out; the parallel
    sizes apart (a profile holds them as its layout)."""
    prefix = next(p for p in _PREFIXES if tuple(argv[: len(p)]) == p)
    rest = argv[len(prefix) :]
    if rest and not rest[0].startswith("-"):
        rest = rest[1:]  # vllm serve MODEL
    groups, sizes = [], {}
    for flag, *values in flag_groups(rest):
        if flag in ("--model-path", "--model", "-m", "-hf") or flag in _LAUNCHER:
            continue
        if flag in _SIZES:
            sizes[_SIZES[flag]] = values[0] if values else "on"
            continue
        groups.append((flag, *values))
    return groups, sizes


def differences(theirs: dict[str, Any], imported: Any) -> list[str]:
    """Every flag on one side only that no note names (the test's failure list)."""
    engine = imported.profile["engine"]
    groups, sizes = _their_groups(theirs["argv"])
    ours = [tuple(g) for g in flag_groups(imported.profile["args"])]
    notes = [n.to_json() for n in imported.notes]
    unnamed = [f"sparkrun only: {' '.join(g)}" for g in groups
               if g not in ours and not named(g[0], notes, engine)]  # fmt: skip
    unnamed += [f"import only: {' '.join(g)}" for g in ours
                if g not in groups and not named(g[0], notes, engine)]  # fmt: skip
    layout = imported.parallel or {"tp": 1, "pp": 1, "ep": 1}
    for size in ("tp", "pp"):
        if int(sizes.get(size, "1")) != layout[size] and not named("parallel", notes, engine):
            unnamed.append(f"{size}: sparkrun {sizes.get(size, 1)}, layout {layout[size]}")
    return unnamed


@pytest.mark.parametrize("name", [p.name for p in recipe_files()])
def test_the_import_renders_what_sparkrun_renders_or_says_why_not(
    rendered: dict[str, dict[str, Any]], name: str
) -> None:
    path = next(p for p in recipe_files() if p.name == name)
    if name in WE_REFUSE:
        with pytest.raises(UsageError) as refused:
            import_recipe(path)
        assert WE_REFUSE[name] in str(refused.value)
        return
    imported = import_recipe(path)
    assert differences(rendered[name], imported) == [], [n.to_json() for n in imported.notes]
    # The env sparkrun hands the container, template tokens filled, shell references apart.
    for key, value in rendered[name]["env"].items():
        if "{" not in value and "$" not in value:
            assert imported.profile["env"][key] == value


def test_a_speculative_recipe_never_imports_without_its_speculation(
    rendered: dict[str, dict[str, Any]],
) -> None:
    speculative = []
    for path in recipe_files():
        argv = rendered[path.name].get("argv") or []
        if path.name in WE_REFUSE or not (
            {"--speculative-config", "--speculative-algorithm"} & set(argv)
        ):
            continue
        speculative.append(path.name)
        imported = import_recipe(path)
        assert imported.profile["expect"]["speculation"] is True, path.name
    assert len(speculative) >= 9, speculative


def test_the_comparison_can_fail() -> None:
    """A flag sparkrun renders that the import lost, unnamed by any note, is reported."""
    path = CORPUS / "structured-mtp-vllm.yaml"
    imported = import_recipe(path)
    argv = ["vllm", "serve", "m", "--max-num-seqs", "16", "--brand-new-flag", "7"]
    lost = differences({"argv": argv}, imported)
    assert "sparkrun only: --brand-new-flag 7" in lost
