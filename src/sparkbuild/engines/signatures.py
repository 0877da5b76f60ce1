"""Known failure signatures: log pattern -> diagnosis -> remedy (package data)."""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from functools import cache
from importlib import resources
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

from sparkbuild.yamlfile import load_model


class SignatureModel(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    id: str = Field(pattern=r"^[a-z0-9][a-z0-9-]*$")
    pattern: str
    diagnosis: str
    remedy: str
    engines: list[Literal["sglang", "vllm"]] | None = None

    @field_validator("pattern")
    @classmethod
    def _compiles(cls, value: str) -> str:
        try:
            re.compile(value)
        except re.error as exc:
            raise ValueError(f"not a valid regular expression: {exc}") from exc
        return value


class SignatureFile(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)

    signatures: list[SignatureModel]


@dataclass(frozen=True)
class Diagnosis:
    """A signature that matched, with the first log line it matched."""

    id: str
    diagnosis: str
    remedy: str
    line: str


def load_signatures(path: Path | None = None) -> tuple[SignatureModel, ...]:
    """The signatures in ``path``, or the ones shipped with sparkbuild."""
    if path is not None:
        return tuple(load_model(path, SignatureFile).signatures)
    return _packaged()


@cache
def _packaged() -> tuple[SignatureModel, ...]:
    data = resources.files("sparkbuild") / "data" / "signatures.yaml"
    with resources.as_file(data) as path:
        return tuple(load_model(path, SignatureFile).signatures)


@cache
def _compiled(pattern: str) -> re.Pattern[str]:
    return re.compile(pattern)


def diagnose(
    lines: Sequence[str],
    engine: str | None = None,
    signatures: Sequence[SignatureModel] | None = None,
) -> list[Diagnosis]:
    """Every known signature found in ``lines``, in signature order."""
    found: list[Diagnosis] = []
    for signature in signatures if signatures is not None else load_signatures():
        if engine is not None and signature.engines and engine not in signature.engines:
            continue
        pattern = _compiled(signature.pattern)
        for line in lines:
            if pattern.search(line):
                found.append(
                    Diagnosis(signature.id, signature.diagnosis, signature.remedy, line.strip())
                )
                break
    return found
