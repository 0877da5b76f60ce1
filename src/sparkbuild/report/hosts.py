"""The hosts a verdict was obtained on, as the build page shows them: each node's facts and
memory, the drift named before the boot, the boot's phases, and what differs from the host
the report is made on (its driver, kernel or DGX OS)."""

from __future__ import annotations

from dataclasses import dataclass
from functools import cache

from sparkbuild.engines.host_facts import FACT_LABELS, FACT_NAMES, NodeFacts, this_host
from sparkbuild.engines.host_record import across
from sparkbuild.lockschema import HostNode, HostRecord


@dataclass(frozen=True)
class NodeRow:
    node: str
    facts: list[tuple[str, str]]  # (label, value), "unknown: why" for an unread one
    memory: list[tuple[str, str]]  # (what, GiB)


@dataclass(frozen=True)
class HostsView:
    read_at: str | None
    nodes: list[NodeRow]
    drift: list[str]
    drift_allowed: bool
    floor: str | None
    stopped: str | None
    phases: list[tuple[str, str]]  # (phase, "12.3 s" or "from 40.1 s")
    elsewhere: list[str]  # what differs from this host


@cache
def here() -> NodeFacts:
    """The host the report is made on (read once per report)."""
    return this_host()


def _gib(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _row(node: HostNode) -> NodeRow:
    facts = [(FACT_LABELS[n], node.facts[n]) for n in FACT_NAMES if n in node.facts]
    facts += [(FACT_LABELS.get(n, n), f"unknown: {why}") for n, why in node.unknown.items() if n]
    memory = [
        ("total", _gib(node.total_gib)),
        ("MemAvailable at the start", _gib(node.available_at_start_gib)),
        ("lowest MemAvailable", _gib(node.lowest_available_gib)),
        ("swap used, most", _gib(node.swap_used_peak_gib)),
    ]
    memory += [(f"taken, {phase}", _gib(gib)) for phase, gib in node.taken_gib.items()]
    return NodeRow(node.node, facts, [(k, v) for k, v in memory if v != "-"])


def hosts_view(record: HostRecord | None, *, compare: bool = True) -> HostsView | None:
    """The view of a record's ``hosts`` (None: the verdict names none)."""
    if record is None:
        return None
    phases = [
        (p.phase, f"{p.seconds:.1f} s" if p.seconds is not None else f"from {p.started_s:.1f} s")
        for p in record.phases
    ]
    return HostsView(
        record.read_at,
        [_row(n) for n in record.nodes],
        list(record.drift),
        bool(record.drift_allowed),
        record.memory_floor,
        record.stopped,
        phases,
        across(record, here(), "this verdict") if compare else [],
    )


__all__ = ["HostsView", "NodeRow", "here", "hosts_view"]
