"""A pytest plugin loaded into dgxarley's own test run (tests/support/dgxarley.py): it wraps
dgxarley's repetition detectors before its tests import them and records, per call, the text
and the detector's verdict into the JSON file named by ``DGXARLEY_RECORD``.

Runs in dgxarley's venv (Python 3.13), never in sparkbuild's: nothing here imports sparkbuild.
"""

from __future__ import annotations

import functools
import importlib
import json
import os
from collections.abc import Callable
from typing import Any

_RECORDS: list[dict[str, Any]] = []
_GUARDS: dict[int, dict[str, Any]] = {}
_CURRENT = {"test": ""}


def _record(detector: str, text: str, repetitive: bool, detail: str) -> None:
    _RECORDS.append({"test": _CURRENT["test"], "detector": detector, "text": text,
                     "repetitive": repetitive, "detail": detail})  # fmt: skip


def _scored(name: str, verdict: Callable[[Any], tuple[bool, str]]) -> Callable[..., Any]:
    module = importlib.import_module("dgxarley.integration.repetition_detector")
    original = getattr(module, name)

    @functools.wraps(original)
    def wrapper(text: str, *args: Any, **kwargs: Any) -> Any:
        result = original(text, *args, **kwargs)
        repetitive, detail = verdict(result)
        _record(name, text, repetitive, detail)
        return result

    setattr(module, name, wrapper)
    return wrapper


def _hits(result: Any) -> tuple[bool, str]:
    score, hits = result
    return bool(hits), f"score {score:.2f}, {len(hits)} hit(s)"


def _severity(report: Any) -> tuple[bool, str]:
    # dgxarley's own scale: none < 0.05, low < 0.15 ("usually acceptable"), then medium
    # ("noticeable"), high ("clear problem") and critical ("essentially broken").
    return report.severity not in ("none", "low"), report.summary()


def _wrap_guard() -> None:
    module = importlib.import_module("dgxarley.integration.streaming_repetition_guard")
    original = module.RepetitionGuard.feed

    def feed(self: Any, *args: Any, **kwargs: Any) -> Any:
        result = original(self, *args, **kwargs)
        chunk = args[0] if args else kwargs.get("chunk", kwargs.get("text", ""))
        state = _GUARDS.setdefault(id(self), {"text": "", "stopped": False, "detail": ""})
        if not state["stopped"]:
            state["text"] += chunk
            if result.should_stop:
                state.update(stopped=True, detail=f"{result.reason.name}: {result.detail}")
        return result

    module.RepetitionGuard.feed = feed


def _flush_guards() -> None:
    for state in _GUARDS.values():
        if state["text"].strip():
            _record("RepetitionGuard", state["text"], state["stopped"],
                    state["detail"] or "no stop")  # fmt: skip
    _GUARDS.clear()


_scored("detect_repetition", _severity)
for _name in ("detect_ngram_repetition", "detect_sentence_repetition", "detect_loops"):
    _scored(_name, _hits)
_wrap_guard()


def pytest_runtest_setup(item: Any) -> None:
    _CURRENT["test"] = item.name


def pytest_runtest_teardown(item: Any) -> None:
    _flush_guards()


def pytest_sessionfinish(session: Any) -> None:
    path = os.environ["DGXARLEY_RECORD"]
    with open(path + ".part", "w", encoding="utf-8") as out:
        json.dump(_RECORDS, out)
    os.replace(path + ".part", path)
