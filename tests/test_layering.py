"""Nothing imports from a later stage: CONTRIBUTING's own tables, checked against the code.

The stage order is the order of the rows in CONTRIBUTING's stage table; code beside the flow
sits where its second table says. Every module of the package is read with ``ast`` (imports
inside functions and ``TYPE_CHECKING`` blocks count too), and each import of another
sparkbuild module must go to the same stage or an earlier one, and so must the packages
Python runs on the way (``import a.b.c`` runs ``a/b/__init__.py`` first). An ``open`` module
(the lock), which every stage imports, imports nothing past the first stage.

Beside the layers: no import cycle at all, within a stage too (the same imports, and the
package ``__init__`` an import from outside its package runs first), and no module over
:data:`MAX_LINES` lines outside ``data/``.
"""

from __future__ import annotations

import ast
import itertools
import re
import shutil
from dataclasses import dataclass
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CONTRIBUTING = ROOT / "CONTRIBUTING.md"
PACKAGE = ROOT / "src" / "sparkbuild"
# Shipped files, not modules of the package: scripts run inside images and engine venvs.
NOT_MODULES = ("data/",)
STAGE_TABLE = "| stage | package |"
BESIDE_TABLE = "| code | sits at |"
OPEN = "open"  # any stage may import it, so it imports nothing past the first stage
MAX_LINES = 600


@dataclass(frozen=True)
class Layers:
    """Where each listed path of the package (``spec.py``, ``source/``) sits."""

    stages: dict[str, int]  # stage name (and ``start``, ``end``) -> rank
    ranks: dict[str, int]  # listed path -> rank
    open_paths: frozenset[str]  # paths any stage may import

    def path_of(self, relative: str) -> str | None:
        """The listed path a module file falls under: the file itself, else its folder."""
        candidates = [
            p for p in self.ranks if p == relative or (p.endswith("/") and relative.startswith(p))
        ]
        return max(candidates, key=len) if candidates else None

    def stage(self, rank: int) -> str:
        return next(name for name, r in self.stages.items() if r == rank)


def _table_rows(text: str, header: str) -> list[list[str]]:
    """The cells of each row of the markdown table whose header row starts with ``header``."""
    lines = text.splitlines()
    start = next(i for i, line in enumerate(lines) if line.startswith(header))
    rows = []
    for line in lines[start + 2 :]:
        if not line.startswith("|"):
            break
        rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


def _paths(cell: str) -> list[str]:
    """The package paths a cell names: ``x.py`` files and ``x/`` folders in backticks."""
    return re.findall(r"`([\w./]+(?:\.py|/))`", cell)


def read_layers(contributing: Path) -> Layers:
    """The stage order from the stage table, and the code beside it from the second table."""
    text = contributing.read_text(encoding="utf-8")
    rows = _table_rows(text, STAGE_TABLE)
    stages = {"start": -1, **{row[0]: rank for rank, row in enumerate(rows)}, "end": len(rows)}
    ranks = {path: stages[row[0]] for row in rows for path in _paths(row[1])}
    open_paths = set()
    for code, sits_at, *_ in _table_rows(text, BESIDE_TABLE):
        for path in _paths(code):
            if sits_at == OPEN:
                assert path in ranks, f"CONTRIBUTING: open `{path}` needs a row in the stage table"
                open_paths.add(path)
            else:
                assert sits_at in stages, f"CONTRIBUTING: `{path}` sits at unknown {sits_at!r}"
                ranks[path] = stages[sits_at]
    return Layers(stages, ranks, frozenset(open_paths))


@dataclass(frozen=True)
class Module:
    name: str  # sparkbuild.image.build
    relative: str  # image/build.py
    path: Path

    @property
    def package(self) -> str:
        """The package a relative import starts from."""
        is_init = self.relative.endswith("__init__.py")
        return self.name if is_init else self.name.rpartition(".")[0]


def modules(package: Path) -> list[Module]:
    found = []
    for path in sorted(package.rglob("*.py")):
        relative = path.relative_to(package).as_posix()
        if relative.startswith(NOT_MODULES):
            continue
        parts = [package.name, *Path(relative).with_suffix("").parts]
        if parts[-1] == "__init__":
            parts.pop()
        found.append(Module(".".join(parts), relative, path))
    return found


def imports(module: Module, known: set[str]) -> list[tuple[int, str, str]]:
    """(line, the import as written, the sparkbuild module it loads) for each import; the
    packages it loads on the way (from outside them) are listed after it, same line."""
    tree = ast.parse(module.path.read_text(encoding="utf-8"))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, f"import {a.name}", a.name) for a in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.package.split(".")[
                    : len(module.package.split(".")) - node.level + 1
                ]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:
                submodule = f"{base}.{alias.name}"  # `from pkg import module`, else a name
                loaded = submodule if submodule in known else base
                found.append((node.lineno, f"from {base} import {alias.name}", loaded))
    return [
        (line, written, target)
        for line, written, loaded in found
        if loaded in known
        for target in [loaded, *_packages_of(loaded, known, module.name)]
    ]


def _packages_of(name: str, known: set[str], importer: str) -> list[str]:
    """The packages Python runs before ``name`` (``a``, ``a.b`` for ``a.b.c``), but those
    ``importer`` is inside of (they ran before it)."""
    parts = name.split(".")
    outer = [".".join(parts[:end]) for end in range(1, len(parts))]
    return [
        package
        for package in outer
        if package in known and not (importer == package or importer.startswith(package + "."))
    ]


def split_packages(layers: Layers) -> list[str]:
    """Every listed path inside a listed package of another layer: a package in two layers
    runs its ``__init__`` (a later layer's) whenever an earlier one imports its part."""
    return [
        f"CONTRIBUTING places `{inner}` at {layers.stage(layers.ranks[inner])} inside "
        f"`{outer}` at {layers.stage(layers.ranks[outer])}: a package sits in one layer"
        for outer in sorted(p for p in layers.ranks if p.endswith("/"))
        for inner in sorted(layers.ranks)
        if inner != outer and inner.startswith(outer) and layers.ranks[inner] != layers.ranks[outer]
    ]


def layering_problems(contributing: Path, package: Path) -> list[str]:
    """Every import of a later stage, every module no table places, every listed path gone."""
    layers = read_layers(contributing)
    problems = [
        f"CONTRIBUTING lists `{path}`, which is not in {package}"
        for path in sorted(layers.ranks)
        if not (package / path).exists()
    ]
    problems += split_packages(layers)
    found = modules(package)
    rank: dict[str, int] = {}
    open_modules = set()
    for module in found:
        placed = layers.path_of(module.relative)
        if placed is None:
            problems.append(f"{module.relative} is in neither of CONTRIBUTING's tables")
            continue
        rank[module.name] = layers.ranks[placed]
        if placed in layers.open_paths:
            open_modules.add(module.name)
    first = min(r for r in layers.stages.values() if r >= 0)
    for module in found:
        if module.name not in rank:
            continue
        is_open = module.name in open_modules
        at = first if is_open else rank[module.name]
        latest: dict[tuple[int, str], str] = {}  # an import's latest-stage module it loads
        for line, written, target in imports(module, set(rank)):
            if (target in open_modules and not is_open) or rank[target] <= at:
                continue
            if (line, written) not in latest or rank[target] > rank[latest[line, written]]:
                latest[line, written] = target
        who = f"open {module.relative} (every stage imports it)" if is_open else None
        for (line, written), target in latest.items():
            problems.append(
                f"{module.relative}:{line}: `{written}`: {who or layers.stage(at)} "
                f"imports from {layers.stage(rank[target])}, a later stage"
            )
    return problems


def import_graph(package: Path) -> dict[str, dict[str, int]]:
    """module -> {module it loads: the line of the first import}. ``from a.b import c`` from
    outside package ``a.b`` loads ``a/b/__init__.py`` too, which Python runs first."""
    found = modules(package)
    known = {module.name for module in found}
    graph: dict[str, dict[str, int]] = {}
    for module in found:
        edges = graph.setdefault(module.name, {})
        for line, _written, target in imports(module, known):
            parts = target.split(".")
            packages = [".".join(parts[:end]) for end in range(2, len(parts))]
            for loaded in [target, *packages]:
                inside = module.name == loaded or module.name.startswith(loaded + ".")
                if loaded in known and not inside:
                    edges.setdefault(loaded, line)
    return graph


def _cycle_from(graph: dict[str, dict[str, int]], start: str, members: set[str]) -> list[str]:
    """One shortest way from ``start`` back to itself through ``members``."""
    paths = {start: [start]}
    queue = [start]
    while queue:
        here = queue.pop(0)
        for there in sorted(graph[here]):
            if there == start:
                return [*paths[here], start]
            if there in members and there not in paths:
                paths[there] = [*paths[here], there]
                queue.append(there)
    raise AssertionError(f"{start} is on no cycle")


def import_cycles(package: Path) -> list[str]:
    """Each group of modules that import each other, shown as one cycle through it with the
    line of each import (``errors.py:105 -> redact.py:30 -> errors.py``)."""
    graph = import_graph(package)
    files = {module.name: module.relative for module in modules(package)}
    reach = {name: _reachable(graph, name) for name in graph}
    groups = {
        frozenset(other for other in reach[name] if name in reach[other]) | {name}
        for name in graph
        if name in reach[name]
    }
    shown = []
    for group in sorted(groups, key=sorted):
        cycle = _cycle_from(graph, min(group), set(group))
        hops = [f"{files[a]}:{graph[a][b]}" for a, b in itertools.pairwise(cycle)]
        shown.append(" -> ".join([*hops, files[cycle[0]]]))
    return shown


def _reachable(graph: dict[str, dict[str, int]], start: str) -> set[str]:
    seen: set[str] = set()
    todo = list(graph[start])
    while todo:
        name = todo.pop()
        if name not in seen:
            seen.add(name)
            todo += graph[name]
    return seen


def oversized(package: Path) -> list[str]:
    """Each module over :data:`MAX_LINES` lines, outside the shipped ``data/``."""
    sizes = {
        m.relative: len(m.path.read_text(encoding="utf-8").splitlines()) for m in modules(package)
    }
    return [f"{relative}: {lines} lines" for relative, lines in sizes.items() if lines > MAX_LINES]


def test_no_module_imports_from_a_later_stage() -> None:
    assert layering_problems(CONTRIBUTING, PACKAGE) == []


def test_no_import_cycles() -> None:
    assert import_cycles(PACKAGE) == []


def test_no_module_is_over_600_lines() -> None:
    assert oversized(PACKAGE) == []


def test_the_stage_order_is_contributings() -> None:
    layers = read_layers(CONTRIBUTING)
    flow = ["spec.py", "source/", "requirements.py", "image/", "preflight/", "smoke/", "bench/"]
    ranks = [layers.ranks[path] for path in [*flow, "lockfile.py", "publish/"]]
    assert ranks == list(range(len(ranks)))
    assert layers.ranks["registry/"] == layers.ranks["image/"]
    assert layers.ranks["engines/"] == layers.ranks["preflight/"]
    # What each engine is (its module, the registry) sits before the spec, which reads it.
    assert layers.ranks["adapters/"] < layers.ranks["spec.py"]
    assert layers.ranks["errors.py"] < layers.ranks["spec.py"]
    assert layers.ranks["cli/"] > layers.ranks["publish/"]
    assert layers.open_paths == {"lockfile.py"}


@pytest.fixture
def copy(tmp_path: Path) -> tuple[Path, Path]:
    """A copy of CONTRIBUTING.md and of the package, to put probes into."""
    shutil.copy(CONTRIBUTING, tmp_path / "CONTRIBUTING.md")
    shutil.copytree(PACKAGE, tmp_path / "sparkbuild", ignore=shutil.ignore_patterns("*.pyc"))
    return tmp_path / "CONTRIBUTING.md", tmp_path / "sparkbuild"


@pytest.mark.parametrize(
    ("where", "probe", "named"),
    [
        # what image/base_config.py did before registry/ left publish/
        (
            "image/base_config.py",
            "from sparkbuild.publish import credentials",
            "image imports from publish",
        ),
        ("source/probe.py", "import sparkbuild.image.build", "source imports from image"),
        (
            "spec.py",
            "def probe() -> None:\n    from sparkbuild.source import prepare",
            "spec imports from source",
        ),
        (
            "engines/probe.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from sparkbuild.smoke.runner import SmokeResult",
            "preflight imports from smoke",
        ),
        ("image/probe.py", "from ..smoke import runner", "image imports from smoke"),
        ("errors.py", "from sparkbuild import spec", "start imports from spec"),
        ("registry/probe.py", "from sparkbuild import cli", "image imports from end"),
    ],
)
def test_a_probe_import_from_a_later_stage_fails(
    copy: tuple[Path, Path], where: str, probe: str, named: str
) -> None:
    contributing, package = copy
    target = package / where
    before = target.read_text() if target.exists() else ""
    target.write_text(before + "\n" + probe + "\n")
    line = len((before + "\n" + probe).splitlines())
    written = probe.splitlines()[-1].strip().replace("..smoke", "sparkbuild.smoke")
    assert layering_problems(contributing, package) == [
        f"{where}:{line}: `{written}`: {named}, a later stage"
    ]


def test_earlier_stages_and_the_lock_may_be_imported(copy: tuple[Path, Path]) -> None:
    contributing, package = copy
    (package / "publish" / "probe.py").write_text("from sparkbuild.image import build\n")
    (package / "source" / "probe.py").write_text("from sparkbuild import lockfile\n")
    (package / "cli" / "probe.py").write_text("from sparkbuild import bench, publish\n")
    assert layering_problems(contributing, package) == []


def test_a_package_loaded_on_the_way_counts(copy: tuple[Path, Path]) -> None:
    """``import a.b.c`` runs ``a/b/__init__.py`` first: the registry of engines put back
    inside the engines package (at preflight), with a row of its own at start as it had,
    makes the settings' import of it run later code, and fails; so does the split row."""
    contributing, package = copy
    shutil.move(package / "adapters", package / "engines" / "adapters")
    (package / "settings.py").write_text(
        "from sparkbuild.engines.adapters.known import engine_names\n"
    )
    text = contributing.read_text()
    row = "| `adapters/` | start |"
    assert row in text
    contributing.write_text(text.replace(row, "| `engines/adapters/` | start |"))
    problems = layering_problems(contributing, package)
    assert (
        "CONTRIBUTING places `engines/adapters/` at start inside `engines/` at preflight: "
        "a package sits in one layer" in problems
    )
    settings = [p for p in problems if p.startswith("settings.py:")]
    assert settings == [
        "settings.py:1: `from sparkbuild.engines.adapters.known import engine_names`: start "
        "imports from preflight, a later stage"
    ], problems


def test_no_package_sits_in_two_layers() -> None:
    assert split_packages(read_layers(CONTRIBUTING)) == []


def test_an_unplaced_module_and_a_stale_row_fail(copy: tuple[Path, Path]) -> None:
    contributing, package = copy
    (package / "stray.py").write_text("")
    shutil.rmtree(package / "bump")
    assert layering_problems(contributing, package) == [
        f"CONTRIBUTING lists `bump/`, which is not in {package}",
        "stray.py is in neither of CONTRIBUTING's tables",
    ]


def test_moving_a_row_moves_the_rule(copy: tuple[Path, Path]) -> None:
    """The rule is read from CONTRIBUTING, not written into this test: with registry/ at the
    end of the flow, the image stage's base_config breaks it."""
    contributing, package = copy
    text = contributing.read_text()
    contributing.write_text(text.replace("| `registry/` | image |", "| `registry/` | end |"))
    problems = layering_problems(contributing, package)
    assert any(p.startswith("image/base_config.py:") for p in problems), problems
    assert all("imports from end, a later stage" in p for p in problems), problems


def test_the_lock_imports_no_stage(copy: tuple[Path, Path]) -> None:
    """What lockfile.py did before each stage made its own records: it is open, so even an
    import the type checker alone reads is one from a later stage."""
    contributing, package = copy
    target = package / "lockfile.py"
    before = target.read_text()
    probe = "if TYPE_CHECKING:\n    from sparkbuild.smoke.runner import SmokeResult\n"
    target.write_text(before + "\nfrom typing import TYPE_CHECKING\n" + probe)
    line = len(before.splitlines()) + 4
    assert layering_problems(contributing, package) == [
        f"lockfile.py:{line}: `from sparkbuild.smoke.runner import SmokeResult`: open "
        "lockfile.py (every stage imports it) imports from smoke, a later stage"
    ]


@pytest.mark.parametrize(
    ("where", "probe", "cycle"),
    [
        # what errors.py and redact.py did, with the import only the type checker reads
        (
            "errors.py",
            "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n"
            "    from sparkbuild.redact import Redactor",
            "errors.py -> redact.py -> errors.py",
        ),
        (
            "checks.py",
            "def probe() -> None:\n    from sparkbuild.source import items",
            "checks.py -> source/items.py -> checks.py",
        ),
        # source/items.py imports no lock; the cycle runs through source/__init__.py
        (
            "lockschema.py",
            "from sparkbuild.source.items import ItemResult",
            "lockfile.py -> lockschema.py -> source/__init__.py -> source/pins.py -> lockfile.py",
        ),
        # what bump/decide, plan, report and write did
        (
            "bump/items.py",
            "from sparkbuild.bump.plan import plan_bump",
            "bump/decide.py -> bump/items.py -> bump/plan.py -> bump/decide.py",
        ),
    ],
)
def test_a_probe_import_cycle_fails(
    copy: tuple[Path, Path], where: str, probe: str, cycle: str
) -> None:
    _contributing, package = copy
    target = package / where
    before = target.read_text()
    target.write_text(before + "\n" + probe + "\n")
    line = len((before + "\n" + probe).splitlines())
    found = import_cycles(package)
    assert [re.sub(r":\d+", "", shown) for shown in found] == [cycle]
    assert f"{where}:{line} -> " in found[0]  # the probe's own import, by its line


def test_a_module_over_600_lines_fails_outside_data(copy: tuple[Path, Path]) -> None:
    _contributing, package = copy
    long = "".join(f"LINE_{n} = {n}\n" for n in range(MAX_LINES + 1))
    (package / "data" / "preflight" / "long.py").write_text(long)
    (package / "source" / "long.py").write_text(long)
    (package / "source" / "fits.py").write_text(long.split("\n", 1)[1])
    assert [p for p in oversized(package) if "long" in p or "fits" in p] == [
        f"source/long.py: {MAX_LINES + 1} lines"
    ]
