"""A run's hosts as the lock keeps them (``hosts`` of a smoke, bench or preflight record),
and a verdict's hosts held against the host now running the image.

The record is made from the run's JSON (``HostRun.to_json()``, which the bench report keeps
as ``host_facts``), so smoke, bench and preflight write one shape; ``across`` names what
differs between where a verdict was obtained and this host (driver, kernel, DGX OS): what
``report``, ``verify``, ``bench compare`` and ``smoke --key/--record`` say.
"""

from __future__ import annotations

import math
from collections.abc import Mapping

from pydantic import ValidationError

from sparkbuild.engines.host_facts import FACT_LABELS, NodeFacts, this_host
from sparkbuild.jsontext import JsonObject
from sparkbuild.lockschema import BootPhase, HostNode, HostRecord, LockFile

#: What a verdict is held against the host running the image now.
ACROSS_HOSTS = ("driver", "kernel", "dgx_os")


def _number(value: object) -> float | int | None:
    if isinstance(value, bool) or not isinstance(value, int | float):
        return None
    return value if math.isfinite(value) else None


def _strings(value: object) -> dict[str, str]:
    if not isinstance(value, Mapping):
        return {}
    return {str(k): str(v)[:300] for k, v in value.items() if isinstance(v, str)}


def _items(value: object) -> list[Mapping[str, object]]:
    """The mappings of a JSON list (anything else: none)."""
    return [v for v in value if isinstance(v, Mapping)] if isinstance(value, list) else []


def _list(value: object) -> list[object]:
    return list(value) if isinstance(value, list) else []


def _mapping(value: object) -> Mapping[str, object]:
    return value if isinstance(value, Mapping) else {}


def _node(facts: Mapping[str, object], memory: Mapping[str, object]) -> HostNode:
    start = memory.get("available_at_start_gib")
    taken = memory.get("taken_gib_by_phase")
    total = memory.get("total_gib")
    if total is None:
        total = _mapping(facts.get("memory")).get("total_gib")
    return HostNode(
        node=str(facts.get("node") or memory.get("node") or "?"),
        facts=_strings(facts.get("facts")),
        unknown=_strings(facts.get("unknown")),
        total_gib=_number(total),
        available_at_start_gib=_number(start),
        lowest_available_gib=_number(memory.get("lowest_available_gib")),
        swap_used_peak_gib=_number(memory.get("swap_used_peak_gib")),
        taken_gib={
            str(phase): value
            for phase, gib in (taken.items() if isinstance(taken, Mapping) else ())
            if (value := _number(gib)) is not None
        },
    )


def host_record(payload: Mapping[str, object] | None) -> HostRecord | None:
    """The lock's ``hosts`` from a run's host JSON (None: the run has none)."""
    if not payload:
        return None
    guard = _mapping(payload.get("memory"))
    memory = {str(n.get("node")): n for n in _items(guard.get("nodes"))}
    nodes = _items(payload.get("nodes"))
    stopped = guard.get("stopped")
    try:
        return HostRecord(
            read_at=next((str(n["read_at"]) for n in nodes if n.get("read_at")), None),
            nodes=[_node(n, memory.get(str(n.get("node")), {})) for n in nodes],
            drift=[str(d) for d in _list(payload.get("drift"))],
            drift_allowed=bool(payload.get("drift_allowed")),
            memory_floor=str(guard["floor"]) if guard.get("floor") else None,
            stopped=_stopped(stopped) if isinstance(stopped, Mapping) else None,
            phases=[
                BootPhase(
                    phase=str(p.get("phase")),
                    started_s=_number(p.get("started_s")) or 0,
                    seconds=_number(p.get("seconds")),
                )
                for p in _items(payload.get("boot_phases"))
            ],
        )
    except ValidationError:
        return None


def _stopped(stop: Mapping[str, object]) -> str:
    return (
        f"MemAvailable on {stop.get('node')} fell to {stop.get('available_gib')} GiB (floor "
        f"{stop.get('floor_gib')} GiB) {stop.get('at_s')} s in, during {stop.get('phase')}: "
        f"stopped {stop.get('what')}"
    )


def across(record: HostRecord | None, here: NodeFacts, what: str) -> list[str]:
    """What differs between where ``what`` (a verdict) was obtained and this host: its
    driver, kernel or DGX OS (on each node of the record that differs); empty when alike or
    when the verdict names no host."""
    if record is None or not record.nodes:
        return []
    lines = []
    for node in record.nodes:
        changed = [
            f"{FACT_LABELS[name]} {node.facts[name]} (here: {here.value(name)})"
            for name in ACROSS_HOSTS
            if node.facts.get(name) and here.value(name) and node.facts[name] != here.value(name)
        ]
        if changed:
            lines.append(f"{what} was obtained on {node.node} with " + ", ".join(changed))
    return lines


def between(a: HostRecord | None, b: HostRecord | None) -> list[str]:
    """The driver, kernel or DGX OS that differ between two runs' first nodes (bench
    compare's A and B): a run on another box measures the box as much as the settings."""
    if a is None or b is None or not a.nodes or not b.nodes:
        return []
    fa, fb = a.nodes[0].facts, b.nodes[0].facts
    return [
        f"the runs were obtained on another {FACT_LABELS[name]}: A {fa[name]}, B {fb[name]}"
        for name in ACROSS_HOSTS
        if fa.get(name) and fb.get(name) and fa[name] != fb[name]
    ]


def earlier_verdicts(
    lock: LockFile, image_id: str | None, here: NodeFacts, skip: tuple[str, str] | None = None
) -> list[str]:
    """What differs between this host and where the lock's smoke verdicts of ``image_id``
    were obtained (``skip``: the build and profile this run replaces)."""
    if not image_id:
        return []
    lines = []
    for build, entry in lock.builds.items():
        for profile, record in ((entry.smoke or {}).get(image_id) or {}).items():
            if (build, profile) != skip:
                lines += across(record.hosts, here, f"the smoke verdict {build}/{profile}")
    return lines


def signed_hosts(predicate: Mapping[str, object] | None) -> dict[str, HostRecord]:
    """profile -> the hosts a signed verdicts predicate names for its smoke verdict."""
    smoke = _mapping(_mapping(predicate).get("smoke"))
    found = {}
    for profile, record in smoke.items():
        hosts = _mapping(record).get("hosts")
        if isinstance(hosts, Mapping):
            try:
                found[str(profile)] = HostRecord.model_validate(dict(hosts))
            except ValidationError:
                continue
    return found


def verdict_hosts(predicate: Mapping[str, object] | None) -> tuple[JsonObject, list[str]]:
    """``verify``'s view of the signed verdicts' hosts: profile -> hosts, and what differs
    from this host (the one about to run the image)."""
    hosts = signed_hosts(predicate)
    if not hosts:
        return {}, []
    here = this_host()
    elsewhere = [
        line
        for profile, record in hosts.items()
        for line in across(record, here, f"the signed smoke verdict {profile}")
    ]
    return {profile: record.to_json() for profile, record in hosts.items()}, elsewhere


def host_lines(hosts: Mapping[str, object]) -> list[str]:
    """One line per node of each profile's hosts (``verify``'s text)."""
    lines = []
    for profile, record in hosts.items():
        for node in _items(_mapping(record).get("nodes")):
            facts = _mapping(node.get("facts"))
            shown = ", ".join(
                f"{FACT_LABELS[name]} {facts[name]}" for name in ACROSS_HOSTS if name in facts
            )
            lines.append(f"host  {profile} on {node.get('node')}: {shown or 'no facts recorded'}")
    return lines


def peak_taken(record: HostRecord | None) -> tuple[str, float] | None:
    """The node and the most memory the run took there (None: not measured)."""
    if record is None:
        return None
    best: tuple[str, float] | None = None
    for node in record.nodes:
        for gib in node.taken_gib.values():
            if best is None or gib > best[1]:
                best = (node.node, float(gib))
    return best


__all__ = [
    "ACROSS_HOSTS",
    "across",
    "between",
    "earlier_verdicts",
    "host_lines",
    "host_record",
    "peak_taken",
    "signed_hosts",
    "verdict_hosts",
]
