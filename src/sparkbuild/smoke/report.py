"""Showing a smoke result (rich table) and recording it in images.lock."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table
from rich.text import Text

from sparkbuild.console import show_table
from sparkbuild.smoke.runner import SmokeResult

_STYLE = {"pass": "green", "fail": "red", "skip": "dim"}
SCREEN_LOG_LINES = 12


def _value(value: object) -> str:
    """A check's measured value in a table cell: numbers and short lists; what is nested
    deeper (a divergence, windows) is in the detail, the JSON and the lock."""
    if value is None:
        return "-"
    if isinstance(value, float):
        return f"{value:.2f}"
    if isinstance(value, dict):
        shown = {k: v for k, v in value.items() if not isinstance(v, dict | list) or _flat(v)}
        return " ".join(f"{k}={_value(v)}" for k, v in shown.items())
    if isinstance(value, list):
        return "[" + ", ".join(_value(v) for v in value) + "]"
    return str(value)


def _flat(value: object) -> bool:
    """A short list of numbers (per-position rates), shown in full."""
    return (
        isinstance(value, list)
        and len(value) <= 8
        and all(isinstance(v, int | float) for v in value)
    )


def _short(text: str, limit: int = 90) -> str:
    return text if len(text) <= limit else text[: limit - 1] + "…"


def render(result: SmokeResult, console: Console) -> None:
    """A summary that fits one screen: verdict, checks, and on failure diagnosis + log tail."""
    style = _STYLE[result.verdict]
    # Cut to one line for a person at a terminal; whole for a pipe, a file or CI's log.
    target = _short(result.target) if console.is_terminal else result.target
    headline = Text.assemble(
        ("smoke ", "bold"),
        (result.verdict.upper(), f"bold {style}"),
        f"  {result.profile} · {result.engine} · {result.target_kind} {target}",
    )
    console.print(headline)
    table = Table(show_header=True, header_style="bold", expand=False, pad_edge=False)
    table.add_column("check")
    table.add_column("status")
    table.add_column("value", justify="right")
    table.add_column("detail", overflow="fold", max_width=90)
    for check in result.checks:
        table.add_row(  # Text everywhere: engine output and names are data, not markup
            Text(check.name),
            Text(check.status, style=_STYLE[check.status]),
            Text(_value(check.value)),
            Text(check.detail),
        )
    show_table(console, table)
    if result.cluster is not None:
        _render_cluster(result, console)
    for line in result.host.lines() if result.host else ():
        console.print(Text(line, style="dim"))
    version = f"{result.engine} {result.engine_version}" if result.engine_version else result.engine
    console.print(Text(f"NaN signal ({version}): {result.nan_signal or '-'}", style="dim"))
    if result.versions_disagree:
        console.print(
            Text(
                f"engine version: the image says {result.engine_version}, the engine that "
                f"answered reported {result.served_version}; both are recorded",
                style="bold yellow",
            )
        )
    for diagnosis in result.diagnoses:
        console.print(
            Text.assemble(("diagnosis ", "bold yellow"), f"[{diagnosis.id}] ", diagnosis.diagnosis)
        )
        console.print(Text.assemble(("remedy    ", "bold yellow"), diagnosis.remedy))
        source = {"log": "log", "http": "HTTP error", "check": "check"}[diagnosis.source]
        console.print(Text(f"  {source}: {diagnosis.line[:200]}", style="dim"))
    log_matters = any(
        c.status == "fail" and c.name in ("boot", "errors", "nan") for c in result.checks
    )
    if log_matters and result.log_excerpt:
        console.print(Text("last engine log lines:", style="bold"))
        for line in result.log_excerpt[-SCREEN_LOG_LINES:]:
            console.print(Text(f"  {line[:200]}", style="dim"))
    if result.log_file:
        console.print(Text(f"full engine log: {result.log_file}", style="dim"))


def _render_cluster(result: SmokeResult, console: Console) -> None:
    run = result.cluster
    assert run is not None
    console.print(
        Text(
            f"cluster {run.name}: {run.topology.label()} ({run.launcher}); "
            + ("every node ran the same image" if result.verified else "NOT VERIFIED"),
            style="dim" if result.verified else "bold yellow",
        )
    )
    for node in run.nodes:
        ran = (node.ran_image_id or "-")[:19]
        console.print(
            Text(f"  rank {node.rank} on {node.node} ({node.endpoint}): {ran}", style="dim")
        )
    if run.failed:
        console.print(Text(f"  {run.failed}", style="bold red"))
