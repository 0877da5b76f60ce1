"""Known failure signatures: evidence -> diagnosis -> remedy (package data).

The evidence is a log line, an HTTP error the engine answered, or a failed check's detail:
some failures leave nothing in the log (vLLM logs nothing about NaN logits; the evidence is
its NaN counter and the HTTP 400 it answers for a response it cannot serialize)."""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkbuild.adapters import EngineName
from sparkbuild.yamlfile import load_model


class SignatureModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    pattern: str | None = None  # searched in each log line
    http: str | None = None  # searched in each HTTP error the engine answered
    checks: dict[str, str] = Field(default_factory=dict)  # check name -> its failed detail
    diagnosis: str
    remedy: str
    engines: list[EngineName] | None = None

    @field_validator("pattern", "http")
    @classmethod
    def _compiles(cls, value: str | None) -> str | None:
        if value is not None:
            _must_compile(value)
        return value

    @field_validator("checks")
    @classmethod
    def _all_compile(cls, value: dict[str, str]) -> dict[str, str]:
        for pattern in value.values():
            _must_compile(pattern)
        return value

    @model_validator(mode="after")
    def _has_evidence(self) -> SignatureModel:
        if self.pattern is None and self.http is None and not self.checks:
            raise ValueError(f"{self.id}: give a log `pattern`, an `http` pattern or `checks`")
        return self


def _must_compile(value: str) -> None:
    try:
        re.compile(value)
    except re.error as exc:
        raise ValueError(f"not a valid regular expression: {exc}") from exc


class SignatureFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    signatures: list[SignatureModel]


@dataclass(frozen=True)
class Diagnosis:
    """A signature that matched, with the first evidence it matched and where that was."""

    id: str
    diagnosis: str
    remedy: str
    line: str
    source: Literal["log", "http", "check"] = "log"


@dataclass(frozen=True)
class Evidence:
    """What a run saw besides its log: the HTTP errors the engine answered, and the
    details of the checks that failed (by check name)."""

    http: Sequence[str] = ()
    checks: Mapping[str, str] = field(default_factory=dict)


def load_signatures(path: Path | None = None) -> tuple[SignatureModel, ...]:
    """The signatures in ``path``, or the ones shipped with sparkbuild."""
    if path is not None:
        return tuple(load_model(path, SignatureFile).signatures)
    return _packaged()


@cache
def _packaged() -> tuple[SignatureModel, ...]:
    """The shipped signatures: ``data/signatures.yaml`` (shared by the engines), then each
    engine's own file in ``data/signatures/`` (by file name), so an engine's failures ship
    with it."""
    data = resources.files("sparkbuild") / "data"
    files = [data / "signatures.yaml"]
    folder = data / "signatures"
    if folder.is_dir():
        files += sorted(
            (e for e in folder.iterdir() if e.name.endswith(".yaml")), key=lambda e: e.name
        )
    found: list[SignatureModel] = []
    for file in files:
        with resources.as_file(file) as path:
            found += load_model(path, SignatureFile).signatures
    return tuple(found)


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def diagnose(
    lines: Sequence[str],
    engine: str | None = None,
    signatures: Sequence[SignatureModel] | None = None,
    evidence: Evidence | None = None,
) -> list[Diagnosis]:
    """Every known signature found in ``lines`` or the other ``evidence``, in signature
    order, each once (with the first evidence it matched)."""
    found: list[Diagnosis] = []
    for signature in signatures if signatures is not None else load_signatures():
        if engine is not None and signature.engines and engine not in signature.engines:
            continue
        match = _first_match(signature, lines, evidence or Evidence())
        if match is not None:
            source, text = match
            found.append(
                Diagnosis(signature.id, signature.diagnosis, signature.remedy, text, source)
            )
    return found


def _first_match(
    signature: SignatureModel, lines: Sequence[str], evidence: Evidence
) -> tuple[Literal["log", "http", "check"], str] | None:
    if signature.pattern is not None:
        pattern = _compiled(signature.pattern)
        line = next((line for line in lines if pattern.search(line)), None)
        if line is not None:
            return "log", line.strip()
    if signature.http is not None:
        pattern = _compiled(signature.http)
        error = next((e for e in evidence.http if pattern.search(e)), None)
        if error is not None:
            return "http", error.strip()
    for name, detail_pattern in signature.checks.items():
        detail = evidence.checks.get(name)
        if detail is not None and _compiled(detail_pattern).search(detail):
            return "check", f"{name}: {detail}"
    return None
