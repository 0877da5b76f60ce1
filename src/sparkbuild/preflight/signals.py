"""The metrics and response fields the smoke and bench adapters rely on, per engine version.

An adapter may declare them itself with a ``preflight_signals(version)`` classmethod (a list
of ``{"name", "kind": "metric"|"field", "used_for"}``), which lets it drop a signal a version
lacks; otherwise they are read off the adapter's own constants, so the list cannot drift from
what smoke and bench actually read.
"""

from __future__ import annotations

from typing import Any

from packaging.version import Version

from sparkbuild.engines.adapters import ADAPTERS, SglangAdapter, VllmAdapter

Signal = dict[str, str]


def _default(engine: str) -> list[Signal]:
    if engine == "sglang":
        return [
            _metric(SglangAdapter.VERIFY_CALLS, "smoke acceptance fallback (counters)"),
            _metric(SglangAdapter.GENERATED, "smoke/bench acceptance from counters"),
            _metric(SglangAdapter.ACCEPT_GAUGE, "bench acceptance gauge"),
            _field("spec_verify_ct", "per-request acceptance (meta_info)"),
            _field("spec_accept_length", "per-request acceptance (meta_info)"),
            _field("completion_tokens", "per-request token count (meta_info)"),
            _field("avg_spec_accept_length", "/server_info lifetime acceptance"),
        ]
    return [
        _metric(VllmAdapter.DRAFTS, "acceptance from counters"),
        _metric(VllmAdapter.DRAFT_TOKENS, "acceptance from counters"),
        _metric(VllmAdapter.ACCEPTED, "acceptance from counters"),
        _metric(VllmAdapter.CORRUPTED, "NaN check (engine counter)"),
    ]


def _metric(name: str, used_for: str) -> Signal:
    return {"name": name, "kind": "metric", "used_for": used_for}


def _field(name: str, used_for: str) -> Signal:
    return {"name": name, "kind": "field", "used_for": used_for}


def signals_for(engine: str, version: Version) -> list[Signal]:
    adapter: Any = ADAPTERS.get(engine)
    declared = getattr(adapter, "preflight_signals", None)
    if callable(declared):
        return [dict(s) for s in declared(version)]
    return _default(engine)


__all__ = ["signals_for"]
