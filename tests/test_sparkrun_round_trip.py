"""Round trips with sparkrun 0.4.2 that keep every field (issue 42).

Every recipe of sparkrun's own documentation and test fixtures (its released sdist on PyPI,
cached: tests/support/sparkrun_examples.py) is imported as a profile and the profile exported
back as a recipe; sparkrun's own code loads and renders both. The serve commands are the
same flag for flag but for what is sparkbuild's by design (the one list,
``recipe_command.ours``) and what a note of the import names; every top-level field of the
recipe reaches the exported one, or a note names it; the node range sparkrun reads holds
the profile's layout. A recipe the import refuses names the field why.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.adapters import ADAPTERS, adapter_type
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.engines.recipe_writer import export_recipe, recipe_yaml
from sparkbuild.engines.recipes import ImportedRecipe, import_recipe
from sparkbuild.errors import SparkbuildError
from tests.support.recipe_trips import unexplained
from tests.support.sparkrun_examples import write_examples
from tests.support.sparkrun_peer import Sparkrun, sparkrun_or_skip, sparkrun_sources

pytestmark = pytest.mark.upstream

IMAGE = "127.0.0.1:5000/sparkbuild/engine@sha256:" + "cd" * 32
#: sparkrun's examples whose parallel size its placement reads (defaults.tensor_parallel)
#: and its serve command leaves out: sparkrun would place the engine on nodes its command
#: does not span. The import refuses them naming the key.
REFUSED = {
    "fixture-sample-sglang-recipe-data": "defaults.tensor_parallel is 2",
    "fixture-sample-v1-recipe-data": "defaults.tensor_parallel is 2",
}
#: Fields compared through sparkrun's rendering of both ends (its command, env, runtime,
#: node range), and the fields the export writes for itself: the image it names by digest,
#: its description and provenance (``metadata``), the recipe version it writes.
COMPARED = {"model", "runtime", "defaults", "command", "env", "min_nodes", "max_nodes", "mode",
            "solo_only", "cluster_only"}  # fmt: skip
EXPORT_OWN = {"container", "metadata", "description", "recipe_version"}


@dataclass(frozen=True)
class Trip:
    """One recipe of sparkrun's: imported (or refused), exported back."""

    original: Path
    imported: ImportedRecipe | None = None
    refused: str | None = None
    exported: Path | None = None


def runtimes() -> set[str]:
    return {runtime for adapter in ADAPTERS.values() for runtime in adapter.recipes.runtimes}


def trip(original: Path, folder: Path) -> Trip:
    try:
        imported = import_recipe(original)
    except SparkbuildError as exc:
        return Trip(original, refused=str(exc))
    parallel = {"parallel": imported.parallel} if imported.parallel else {}
    profile = SmokeProfile.model_validate({**imported.profile, **parallel})
    exported = folder / original.name
    document = export_recipe(imported.name, profile, IMAGE)
    exported.write_text(recipe_yaml(document), encoding="utf-8")
    return Trip(original, imported, exported=exported)


@pytest.fixture(scope="module")
def sparkrun(tmp_path_factory: pytest.TempPathFactory) -> Sparkrun:
    return sparkrun_or_skip(tmp_path_factory.mktemp("sparkrun"))


@pytest.fixture(scope="module")
def trips(sparkrun: Sparkrun, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Trip]:
    examples = write_examples(
        sparkrun_sources(sparkrun.python), tmp_path_factory.mktemp("examples")
    )
    back = tmp_path_factory.mktemp("exported")
    return {name: trip(path, back) for name, path in examples.items()}


@pytest.fixture(scope="module")
def rendered(sparkrun: Sparkrun, trips: dict[str, Trip]) -> dict[str, list[dict[str, Any]]]:
    """sparkrun's rendering of each original and each exported recipe, asked at once."""
    paths = {n: [t.original, *([t.exported] if t.exported else [])] for n, t in trips.items()}
    asked = [{"op": "render", "path": str(p)} for ps in paths.values() for p in ps]
    answers = iter(sparkrun.ask(asked))
    return {name: [next(answers) for _ in ps] for name, ps in paths.items()}


def _notes(imported: ImportedRecipe) -> list[dict[str, str]]:
    return [{"item": n.item, "detail": n.detail} for n in imported.notes]


def _nodes(before: dict[str, Any], after: dict[str, Any], nodes: int) -> list[str]:
    """The exported range is the profile's layout exactly, and sparkrun's range for the
    original holds it."""
    low, high = before["min"], before["max"] or nodes
    lost = [] if low <= nodes <= high else [f"nodes: {nodes} outside {low}..{high}"]
    if (after["min"], after["max"]) != (nodes, nodes):
        lost.append(f"exported node range {after['min']}..{after['max']}, layout {nodes}")
    return lost


def _fields(trip: Trip) -> list[str]:
    """Each top-level field of the original that is neither compared, the export's own, nor
    named by a note."""
    assert trip.imported is not None
    data = yaml.safe_load(trip.original.read_text(encoding="utf-8"))
    notes = _notes(trip.imported)
    return [
        f"field {key} not carried and not named"
        for key in data
        if key not in COMPARED | EXPORT_OWN
        and not any(key in n["item"] or key in n["detail"] for n in notes)
    ]


def differences(trip: Trip, before: dict[str, Any], after: dict[str, Any]) -> list[str]:
    """What the round trip lost or changed that nothing names."""
    assert trip.imported is not None
    adapter = adapter_type(trip.imported.profile["engine"])
    notes = _notes(trip.imported)
    lost = unexplained(adapter, before["argv"], after["argv"], notes)
    if before["runtime"] != after["runtime"] and not any("runtime" in n["item"] for n in notes):
        lost.append(f"runtime {before['runtime']} became {after['runtime']}")
    for key in before["env"].keys() | after["env"].keys():
        if before["env"].get(key) != after["env"].get(key) and not any(
            key in n["item"] for n in notes
        ):
            lost.append(f"env {key}: {before['env'].get(key)!r} -> {after['env'].get(key)!r}")
    nodes = int((trip.imported.parallel or {"nodes": 1})["nodes"])
    return lost + _nodes(before["nodes"], after["nodes"], nodes) + _fields(trip)


def test_sparkruns_own_examples_are_read_from_its_release(trips: dict[str, Trip]) -> None:
    docs = [n for n in trips if n.startswith("doc-")]
    fixtures = [n for n in trips if n.startswith("fixture-")]
    assert len(docs) >= 6 and len(fixtures) >= 7, sorted(trips)
    keys = {k for t in trips.values() for k in yaml.safe_load(t.original.read_text())}
    # The node range in every spelling sparkrun reads, and its version-1 recipes.
    assert {"mode", "min_nodes", "max_nodes", "cluster_only", "sparkrun_version"} <= keys


def test_every_example_round_trips_or_is_refused_by_name(
    trips: dict[str, Trip], rendered: dict[str, list[dict[str, Any]]]
) -> None:
    failures: dict[str, object] = {}
    for name, one in trips.items():
        sparkruns = rendered[name]
        assert "error" not in sparkruns[0], (name, sparkruns[0])  # sparkrun loads it
        if one.refused is not None:
            expected = REFUSED.get(name) or f"runtime {sparkruns[0]['runtime']!r}"
            if sparkruns[0]["runtime"] in runtimes() and name not in REFUSED:
                expected = "(not refused)"
            if expected not in one.refused:
                failures[name] = f"refused: {one.refused}; expected {expected}"
            continue
        if name in REFUSED:
            failures[name] = f"imported; expected a refusal naming {REFUSED[name]}"
            continue
        before, after = sparkruns
        assert "error" not in after, (name, after)
        lost = differences(one, before, after)
        if lost:
            failures[name] = lost
    assert failures == {}
    assert sum(t.imported is not None for t in trips.values()) >= 9


def test_the_round_trip_check_can_fail(
    trips: dict[str, Trip], rendered: dict[str, list[dict[str, Any]]]
) -> None:
    """A flag the export lost, a changed env value, a range that no longer holds the layout
    and a field nothing names are each reported."""
    name = "doc-recipes-1518"  # RECIPES.md's complete example: tp 2, 1-4 nodes, env, hooks
    one = trips[name]
    before, after = (dict(a) for a in rendered[name])
    after["argv"] = [w for w in after["argv"] if w != "--enable-prefix-caching"]
    after["env"] = {**after["env"], "NCCL_CUMEM_ENABLE": "1"}
    after["nodes"] = {"mode": "auto", "min": 1, "max": None}
    lost = differences(one, before, after)
    assert "lost: --enable-prefix-caching" in lost
    assert "env NCCL_CUMEM_ENABLE: '0' -> '1'" in lost
    assert "exported node range 1..None, layout 2" in lost
    unnamed = one.original.with_name("unnamed.yaml")
    unnamed.write_text(one.original.read_text() + "brand_new_field: 1\n")
    assert "field brand_new_field not carried and not named" in _fields(Trip(unnamed, one.imported))
