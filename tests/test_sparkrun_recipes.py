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

from sparkbuild.engines.sparkrun_flags import SPARKRUN_VERSION, sparkrun_flags
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
    for engine in ("vllm", "sglang"):
        mine = ours.engines[engine]
        assert list(mine.flags.items()) == list(theirs[engine]["flags"].items()), engine
        assert sorted(mine.booleans) == theirs[engine]["booleans"]
        assert sorted(mine.negatable) == theirs[engine]["negatable"]
    assert (len(ours.engines["vllm"].flags), len(ours.engines["sglang"].flags)) == (76, 48)
    assert ours.read_keys == theirs["read_keys"]
    assert list(ours.read_keys) == theirs["read_key_reasons"]
