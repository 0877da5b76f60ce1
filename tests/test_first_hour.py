"""The smaller things a new user met in the first hour: each message says the one thing that
matters and names things that exist."""

from __future__ import annotations

import json
import re
import shlex
import sys
from pathlib import Path

import pytest
import yaml

from sparkbuild.cli import main
from tests.support.cli import RunCli
from tests.test_bench_figures import _report

ROOT = Path(__file__).resolve().parents[1]


def _with_args(report: Path, args: list[str], name: str) -> Path:
    data = json.loads(report.read_text())
    data["engine"]["args"] = args
    path = report.with_name(name)
    path.write_text(json.dumps(data))
    return path


def test_compare_names_the_one_setting_that_differs(run_cli: RunCli, tmp_path: Path) -> None:
    spec = '{{"method":"ngram","num_speculative_tokens":{}}}'
    common = ["--dtype", "bfloat16", "--max-model-len", "1024", "--speculative-config"]
    a = _with_args(_report(tmp_path), [*common, spec.format(3)], "a.json")
    b = _with_args(_report(tmp_path), [*common, spec.format(1)], "b.json")
    result = run_cli("bench", "compare", str(a), str(b))
    assert result.exit_code == 0, result.output
    assert "comparing engine arguments: num_speculative_tokens 3 → 1" in result.stderr
    assert "--max-model-len" not in result.stderr  # not both full argument strings


def test_claims_without_a_matching_setup_print_no_empty_table(
    run_cli: RunCli, tmp_path: Path
) -> None:
    claims = ROOT / "claims" / "qwen3.6-27b-sglang-vllm.yaml"
    result = run_cli("bench", "compare", str(_report(tmp_path)), "--claims", str(claims))
    assert result.exit_code == 0, result.output
    assert "no claim is about this run" in result.stdout
    assert "┏" not in result.stdout and "└" not in result.stdout


def test_a_missing_matplotlib_is_a_usage_error(
    run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import matplotlib raises ImportError
    report = str(_report(tmp_path))
    result = run_cli("bench", "compare", report, report, "--plot", str(tmp_path / "p.png"))
    assert result.exit_code == 2, result.output
    assert "--plot needs matplotlib" in result.stderr
    assert "pip install 'sparkbuild[plot]'" in result.stderr


def test_bench_boot_timeout_has_help(run_cli: RunCli) -> None:
    result = run_cli("bench", "--help")
    line = next(line for line in result.stdout.splitlines() if "--boot-timeout" in line)
    assert "ready" in line or "ready" in result.stdout.split("--boot-timeout", 1)[1][:200]


@pytest.mark.parametrize("command", ["smoke", "bench"])
def test_the_usage_hint_names_a_profile_that_exists(run_cli: RunCli, command: str) -> None:
    result = run_cli("--project", str(ROOT), command, "--profile", "cpu-reference")
    assert result.exit_code == 2
    hint = next(line for line in result.stderr.splitlines() if line.startswith("hint:"))
    named = hint.split("--profile ", 1)[1].split()[0]
    assert (ROOT / "smoke" / f"{named}.yaml").is_file(), hint


def test_the_group_help_says_global_options_may_follow_the_command() -> None:
    assert "may also follow the command" in (main.help or "")


def test_bench_refuses_a_sweep_that_cannot_fit_before_any_boot(
    run_cli: RunCli, tmp_path: Path
) -> None:
    """cpu-reference serves 1024 tokens; a 4096-token prompt is refused before the boot
    (the command would fail at once: it is never started)."""
    never = tmp_path / "never-started"
    result = run_cli(
        "--project", str(ROOT), "bench", "--command", f"touch {never}", "--profile",
        "cpu-reference", "--model", str(tmp_path), "--pp", "4096", "--concurrency", "1",
    )  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "no cell fits the profile's --max-model-len 1024 tokens" in result.stderr
    assert not never.exists()


def test_bench_leaves_out_the_cells_that_cannot_fit_and_says_so(
    run_cli: RunCli, tmp_path: Path
) -> None:
    result = run_cli(
        "--project", str(ROOT), "bench", "--command", "false", "--profile", "cpu-reference",
        "--model", str(tmp_path), "--pp", "512,2048", "--tg", "128", "--concurrency", "1,2",
        "--boot-timeout", "30",
    )  # fmt: skip
    warning = (
        "warning: 2 cell(s) need more than the profile's --max-model-len 1024 tokens "
        "(depth+pp+tg) and are left out: pp=2048 tg=128 depth=0 c=1; pp=2048 tg=128 depth=0 c=2"
    )
    assert warning in " ".join(result.stderr.split())
    assert result.exit_code == 1  # then `false` exits at boot: the sweep itself went ahead
    assert "exited with status 1" in result.stderr


def test_the_max_length_flag_is_read_in_each_form() -> None:
    from sparkbuild.adapters import adapter_for
    from sparkbuild.bench.sweep import Sweep, fit_to_length

    vllm, sglang = adapter_for("vllm"), adapter_for("sglang")
    assert vllm.declared_max_len(["--dtype", "bf16", "--max-model-len", "1024"]) == 1024
    assert vllm.declared_max_len(["--max-model-len=8k"]) == 8000
    assert vllm.declared_max_len(["--max-model-len", "2K"]) == 2048
    assert sglang.declared_max_len(["--context-length", "32768"]) == 32768
    assert sglang.declared_max_len(["--max-model-len", "1024"]) is None
    sweep = Sweep(pp=[512, 2048], tg=[128], concurrency=[1])
    fitted, dropped = fit_to_length(sweep, 1024, "x")
    assert [k.pp for k in fitted.cells()] == [512] and [k.pp for k in dropped] == [2048]
    assert fitted.max_len == 1024 and fitted.cell_count == 1
    assert fit_to_length(sweep, None, "x") == (sweep, [])


def _in_a_terminal(*args: str, cwd: Path, seconds: float = 120) -> str:
    """The sparkbuild console script run in a real pseudo-terminal: what a person sees."""
    import os
    import pty
    import select
    import subprocess
    import time

    from tests.support.cli import installed_entry_point

    leader, follower = pty.openpty()
    env = {**os.environ, "COLUMNS": "160", "TERM": "xterm"}
    process = subprocess.Popen(
        [installed_entry_point(), *args],
        cwd=cwd, stdin=follower, stdout=follower, stderr=follower, env=env,
    )  # fmt: skip
    os.close(follower)
    seen = b""
    deadline = time.monotonic() + seconds
    while time.monotonic() < deadline:
        ready, _, _ = select.select([leader], [], [], 0.5)
        if ready:
            try:
                chunk = os.read(leader, 65536)
            except OSError:
                break
            if not chunk:
                break
            seen += chunk
        elif process.poll() is not None:
            break
    process.wait(timeout=30)
    os.close(leader)
    return re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", seen.decode(errors="replace"))  # no colours


# An engine that logs a line and never becomes ready: the boot wait runs to its timeout.
SLOW_ENGINE = (
    "python3 -c \"print('loading the tiny weights', flush=True); import time; time.sleep(60)\""
)


def test_in_a_terminal_the_boot_wait_shows_its_seconds_and_the_last_log_line(
    tmp_path: Path,
) -> None:
    shown = _in_a_terminal(
        "--project", str(ROOT), "smoke", "--command", SLOW_ENGINE, "--profile",
        "cpu-reference", "--model", str(tmp_path), "--boot-timeout", "4",
        "--log", str(tmp_path / "engine.log"), cwd=tmp_path,
    )  # fmt: skip
    assert "waiting for vllm to boot" in shown
    assert "loading the tiny weights" in shown  # the engine's last line, live
    assert re.search(r"waiting for vllm to boot[^\n\r]* · [1-4] s · loading the tiny", shown)
    assert "smoke FAIL" in shown


def test_quiet_silences_the_live_line(tmp_path: Path) -> None:
    shown = _in_a_terminal(
        "--project", str(ROOT), "smoke", "--quiet", "--command", SLOW_ENGINE, "--profile",
        "cpu-reference", "--model", str(tmp_path), "--boot-timeout", "3",
        "--log", str(tmp_path / "engine.log"), cwd=tmp_path,
    )  # fmt: skip
    assert "smoke FAIL" in shown
    assert "waiting for vllm" not in shown and " · 1 s" not in shown


def test_a_plot_says_which_cells_it_left_out(run_cli: RunCli, tmp_path: Path) -> None:
    path = _report(tmp_path)
    data = json.loads(path.read_text())
    cell = data["cells"][1]  # c=2: every run's tokens arrived in one burst
    cell["decode_tps_aggregate"] = {"median": None, "min": None, "max": None, "n": 0}
    cell["burst_runs"] = len(cell["runs"])
    bursty = path.with_name("bursty.json")
    bursty.write_text(json.dumps(data))
    plot = tmp_path / "decode.png"
    result = run_cli("bench", "compare", str(path), str(bursty), "--plot", str(plot))
    assert result.exit_code == 0, result.output
    assert plot.stat().st_size > 0
    warning = " ".join(result.stderr.split())
    assert f"warning: {plot} leaves out 1 cell(s):" in warning
    assert "pp=32 tg=16 depth=0 c=2: only burst runs (no client decode rate)" in warning


def test_an_ssh_endpoint_that_does_not_answer_names_the_ssh_command_to_try() -> None:
    """The docker SDK imports paramiko for any ssh:// address (a dependency now: without it
    this failed with "Install paramiko package"), then runs the `ssh` command."""
    import socket

    from sparkbuild import dockerhost
    from sparkbuild.errors import DockerUnavailableError

    with socket.socket() as probe:  # a loopback port that nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    endpoint = f"ssh://root@127.0.0.1:{port}"
    with pytest.raises(DockerUnavailableError) as raised:
        dockerhost.client(timeout=30, endpoint=endpoint)
    assert f"no Docker daemon answers at {endpoint}" in raised.value.message
    assert "paramiko" not in raised.value.message
    assert raised.value.hint is not None
    assert f"`ssh -p {port} root@127.0.0.1 docker info`" in raised.value.hint
    assert "without a prompt" in raised.value.hint


def test_a_recipe_host_flag_is_replaced_not_changed(run_cli: RunCli, tmp_path: Path) -> None:
    """The recipe's --host is not kept (it was labelled "changed"): the launcher sets its own."""
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text("model: m\nruntime: vllm\ncommand: vllm serve m --host 0.0.0.0 --port 8000\n")
    result = run_cli("--project", str(tmp_path), "profile", "import", str(recipe))
    assert result.exit_code == 0, result.output
    assert "replaced --host 0.0.0.0: sparkbuild's launcher sets it" in result.stdout
    assert "changed  --host" not in result.stdout


def test_the_smoke_headline_is_whole_when_piped(run_cli: RunCli, tmp_path: Path) -> None:
    result = run_cli(
        "--project", str(ROOT), "smoke", "--command", "false", "--profile", "cpu-reference",
        "--model", str(tmp_path), "--boot-timeout", "30", "--log", str(tmp_path / "e.log"),
    )  # fmt: skip
    assert result.exit_code == 1, result.output
    headline = next(line for line in result.stdout.splitlines() if line.startswith("smoke FAIL"))
    assert "…" not in headline
    last = yaml.safe_load((ROOT / "smoke" / "cpu-reference.yaml").read_text())["args"][-1]
    assert headline.endswith(shlex.quote(last)), headline  # the last argument


def test_a_long_plot_title_wraps_inside_the_figure(tmp_path: Path) -> None:
    """Two long labels made a title wider than the figure, cut at both ends."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from sparkbuild.bench.plot import plot_title

    labels = ["cpu-reference · command: vllm 0.32.0 · tiny-llama-v1 (build machine)"] * 2
    title = plot_title(labels)
    figure, axes = plt.subplots(figsize=(8, 5), dpi=120)  # as the plot draws it
    shown = axes.set_title(title, fontsize="medium")
    figure.tight_layout()
    figure.canvas.draw()
    box = shown.get_window_extent()
    plt.close(figure)
    assert title.replace("\n", " ") == f"Decode throughput: {' vs '.join(labels)}"
    assert box.x0 >= 0 and box.x1 <= figure.bbox.x1, (box, figure.bbox)
