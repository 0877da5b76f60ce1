"""The bench stage without the command line: ``run_stage``'s checks before any boot,
``run_compare`` on two real reports, and the launch options smoke and bench share as one group.

The reports are the reference run kept in ``benchmarks/`` (measured on the CPU engine) and a
copy of it with one figure changed; nothing here boots an engine.
"""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest

from sparkbuild.bench.compare import CompareOptions, CompareOutputs, run_compare
from sparkbuild.bench.outputs import BenchOutputs
from sparkbuild.bench.runner import SweepSettings
from sparkbuild.bench.stage import BenchOptions, prepare
from sparkbuild.bench.sweep import Sweep
from sparkbuild.cli import options
from sparkbuild.engines.launch import LaunchSettings, TargetChoice
from sparkbuild.errors import NothingToCompareError, UsageError
from sparkbuild.settings import Settings
from tests.support.cli import every_command

ROOT = Path(__file__).resolve().parents[1]
REFERENCE = ROOT / "benchmarks" / "cpu-reference.json"


def _settings(tmp_path: Path) -> Settings:
    return Settings(project_dir=tmp_path, cache_dir=tmp_path / "cache")


def _options(
    sweep: Sweep, url: str = "http://127.0.0.1:9", outputs: BenchOutputs | None = None
) -> BenchOptions:
    launch = LaunchSettings(TargetChoice(url=url), engine="vllm")
    return BenchOptions(launch, SweepSettings(sweep), outputs or BenchOutputs())


def test_a_sweep_longer_than_any_engine_serves_is_refused_before_the_boot(tmp_path: Path) -> None:
    sweep = Sweep(pp=[1 << 30], tg=[1 << 30], depth=[0], concurrency=[1])
    with pytest.raises(UsageError, match=r"more than any engine serves"):
        prepare(_settings(tmp_path), _options(sweep))


def test_an_unwritable_output_is_refused_before_the_boot(tmp_path: Path) -> None:
    sweep = Sweep(pp=[16], tg=[4], depth=[0], concurrency=[1])
    missing = tmp_path / "no-such-dir" / "report.md"
    with pytest.raises(UsageError, match=r"--markdown .*does not exist"):
        prepare(_settings(tmp_path), _options(sweep, outputs=BenchOutputs(markdown_path=missing)))


def test_arena_without_a_profile_is_refused(tmp_path: Path) -> None:
    sweep = Sweep(pp=[16], tg=[4], depth=[0], concurrency=[1])
    with pytest.raises(UsageError, match=r"--arena needs --profile"):
        prepare(
            _settings(tmp_path),
            _options(sweep, outputs=BenchOutputs(arena_dir=tmp_path / "submission")),
        )


def test_a_url_run_is_planned_without_a_profile(tmp_path: Path) -> None:
    """``--url`` and ``--engine``: the plan is the URL's, nothing is asked of a server."""
    sweep = Sweep(pp=[16], tg=[4], depth=[0], concurrency=[1, 2])
    run = prepare(_settings(tmp_path), _options(sweep, url="http://user:secret@127.0.0.1:9"))
    assert run.adapter.name == "vllm"
    assert run.plan.profile is None and run.plan.model == "(as served)"
    assert "secret" not in run.plan.label  # the label is redacted
    assert run.target.kind == "url" and not run.target.owns_engine


def _changed_copy(tmp_path: Path, **changes: object) -> Path:
    data = json.loads(REFERENCE.read_text())
    data.update(changes)
    path = tmp_path / "b.json"
    path.write_text(json.dumps(data))
    return path


def test_compare_returns_the_shared_cells_and_writes_its_json(tmp_path: Path) -> None:
    other = _changed_copy(tmp_path, label="other run")
    out = tmp_path / "compare.json"
    comparison = run_compare(CompareOptions(REFERENCE, other, CompareOutputs(json_path=str(out))))
    cells = len(json.loads(REFERENCE.read_text())["cells"])
    assert len(comparison.rows) == cells > 0
    written = json.loads(out.read_text())
    assert written["cells"] == json.loads(json.dumps(list(comparison.rows)))
    assert written["a"] == str(REFERENCE) and written["b"] == str(other)


def test_compare_without_a_common_cell_is_an_error(tmp_path: Path) -> None:
    other = _changed_copy(tmp_path, cells=[])
    with pytest.raises(NothingToCompareError, match="no cell in common"):
        run_compare(CompareOptions(REFERENCE, other))


def test_compare_of_one_report_needs_claims(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="two reports, or one report and --claims"):
        run_compare(CompareOptions(REFERENCE))


def _options_of(command: click.Command) -> list[str]:
    return [p.name or "" for p in command.params if isinstance(p, click.Option)]


def test_smoke_and_bench_list_the_launch_group_in_one_order() -> None:
    commands = every_command()
    group = ["image", "command", "url", "cluster", "key_path", "profile_name", "model", "gpus"]
    group += ["boot_timeout", "request_timeout", "log_path", "force", "drop_caches"]
    for path in ("smoke", "bench"):
        names = _options_of(commands[path])
        start = names.index("image")
        together = [n for n in names[start : start + len(group) + 1] if n != "engine"]
        assert together[: len(group)] == group, path  # bench's --engine sits in the group


def test_a_launch_override_names_an_option_of_the_group() -> None:
    with pytest.raises(TypeError, match="not launch options: timeout"):
        options.launch(timeout={"help": "x"})
