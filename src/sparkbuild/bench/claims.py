"""Claims files (``claims/*.yaml``): published benchmark figures a bench run is held against.

A file records one source (a post, a model card, a leaderboard): its setups (engine, image,
model, flags, profile, harness, prompts, hardware) and its claims, each a sweep cell with the
figures published for it. A cell dimension left out (``null``) was not published; it then
matches any value and is named as a difference. The schema is documented in docs/bench.md.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from sparkbuild.adapters import EngineName
from sparkbuild.engines.profiles import Parallel
from sparkbuild.errors import SpecError, UsageError
from sparkbuild.settings import Settings
from sparkbuild.yamlfile import load_model, named_file, read_yaml

Metric = Literal[
    "decode_tps",
    "decode_tps_request",
    "decode_tps_peak",
    "output_tps",
    "ttft_ms",
    "prefill_tps",
    "accept_len",
]
#: What each claim figure is compared with in a run (docs/bench.md, "Claims").
METRICS: dict[str, str] = {
    "decode_tps": "decode tok/s total",
    "decode_tps_request": "decode tok/s per request",
    "decode_tps_peak": "decode tok/s, sum over requests",
    "output_tps": "output tok/s (tokens / wall time)",
    "ttft_ms": "TTFT ms",
    "prefill_tps": "prefill tok/s",
    "accept_len": "accept len",
}
_DATE = re.compile(r"^\d{4}(-(0[1-9]|1[0-2])(-(0[1-9]|[12]\d|3[01]))?)?\Z")
_SETUP_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,63}\Z")


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


def _as_strings(value: object) -> object:
    # YAML turns `- 4` into an int; flags are strings on a command line.
    if isinstance(value, list):
        return [
            str(v) if isinstance(v, int | float) and not isinstance(v, bool) else v for v in value
        ]
    return value


class Setup(_Strict):
    """How the published figures were obtained."""

    engine: EngineName
    version: str | None = None  # engine release, when the source names it
    image: str | None = None
    model: str = Field(min_length=1)
    flags: list[str] | None = None  # null: not published
    profile: str | None = None  # the smoke profile that reproduces this setup
    harness: str = Field(min_length=1)  # e.g. "llama-benchy 0.4.0"
    prompts: str | None = None  # the prompt set, as the source describes it
    hardware: str | None = None  # e.g. "4x DGX Spark (GB10), TP=4"
    # How the engine was spread: {nodes, tp, ep, pp}; a claim is compared only with a run of
    # the same topology. null: not published (compared, and named as a difference).
    topology: Parallel | None = None
    source: str | None = None  # overrides the file's source (e.g. a leaderboard it quotes)
    note: str | None = None

    @field_validator("flags", mode="before")
    @classmethod
    def _flags(cls, value: object) -> object:
        return _as_strings(value)


class Cell(_Strict):
    """The sweep cell of a claim; null: the source did not publish that dimension."""

    pp: int | None = Field(default=None, ge=1)
    tg: int | None = Field(default=None, ge=1)
    depth: int | None = Field(default=None, ge=0)
    concurrency: int | None = Field(default=None, ge=1)

    def label(self) -> str:
        parts = [("pp", self.pp), ("tg", self.tg), ("depth", self.depth), ("c", self.concurrency)]
        return " ".join(f"{name}={'?' if value is None else value}" for name, value in parts)


# A number, or a published range [low, high]; never NaN or infinite (`.nan` in YAML).
FiniteFloat = Annotated[float, Field(allow_inf_nan=False)]
Figure = FiniteFloat | tuple[FiniteFloat, FiniteFloat]


class Claim(_Strict):
    setup: str
    cell: Cell
    decode_tps: Figure | None = None
    decode_tps_request: Figure | None = None
    decode_tps_peak: Figure | None = None
    output_tps: Figure | None = None
    ttft_ms: Figure | None = None
    prefill_tps: Figure | None = None
    accept_len: Figure | None = None
    note: str | None = None

    @field_validator(*METRICS)
    @classmethod
    def _figure(cls, value: Figure | None) -> Figure | None:
        if value is None:
            return None
        low, high = value if isinstance(value, tuple) else (value, value)
        if low <= 0 or high < low:
            raise ValueError("a figure is a positive number or a range [low, high], low <= high")
        return value

    @model_validator(mode="after")
    def _has_a_figure(self) -> Claim:
        if not self.figures():
            raise ValueError(f"a claim needs at least one figure ({', '.join(METRICS)})")
        return self

    def figures(self) -> dict[str, Figure]:
        return {name: getattr(self, name) for name in METRICS if getattr(self, name) is not None}


class ClaimsFile(_Strict):
    source: str = Field(min_length=1)  # who published it, and where
    url: str | None = None
    date: str  # YYYY, YYYY-MM or YYYY-MM-DD: as precise as the source is
    setups: dict[str, Setup] = Field(min_length=1)
    claims: list[Claim] = Field(min_length=1)

    @field_validator("date", mode="before")
    @classmethod
    def _date(cls, value: object) -> object:
        text = str(value)  # YAML reads 2026-03-01 as a date and 2026 as an int
        if not _DATE.match(text):
            raise ValueError("date must be YYYY, YYYY-MM or YYYY-MM-DD")
        return text

    @field_validator("setups")
    @classmethod
    def _setup_names(cls, value: dict[str, Setup]) -> dict[str, Setup]:
        for name in value:
            if not _SETUP_NAME.match(name):
                raise ValueError(f"setup name {name!r}: use letters, digits, '.', '_', '-'")
        return value


class LoadedClaim(BaseModel):
    """A claim with its setup and where it was written (for messages and output)."""

    model_config = ConfigDict(frozen=True)

    file: Path
    line: int | None
    index: int
    setup_name: str
    setup: Setup
    claim: Claim
    source: str
    url: str | None
    date: str

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else str(self.file)

    @property
    def id(self) -> str:
        return f"{self.setup_name} {self.claim.cell.label()}"


def claims_path(settings: Settings, name_or_path: str) -> Path:
    """A claims file by path, or by name in the project's ``claims/`` directory."""
    return named_file(
        settings.project_dir / "claims",
        name_or_path,
        file_kind="claims file",
        name_kind="claims file",
        known="known",
        otherwise="pass a claims file path",
    )


def load_claims(path: Path) -> list[LoadedClaim]:
    """Every claim of a file; any problem names the file and line (SpecError, exit 2)."""
    parsed = load_model(path, ClaimsFile)
    _, lines = read_yaml(path)
    loaded: list[LoadedClaim] = []
    problems: list[str] = []
    for index, claim in enumerate(parsed.claims):
        line = lines.get(("claims", index))
        setup = parsed.setups.get(claim.setup)
        if setup is None:
            where = lines.get(("claims", index, "setup"), line)
            problems.append(
                f"{path}:{where}: claims[{index}].setup: no setup {claim.setup!r} "
                f"(known: {', '.join(sorted(parsed.setups))})"
            )
            continue
        loaded.append(
            LoadedClaim(
                file=path,
                line=line,
                index=index,
                setup_name=claim.setup,
                setup=setup,
                claim=claim,
                source=setup.source or parsed.source,
                url=parsed.url,
                date=parsed.date,
            )
        )
    if problems:
        raise SpecError("\n".join(problems), "fix the claims file; docs/bench.md has the schema")
    return loaded


def load_claim_files(settings: Settings, names: tuple[str, ...] | list[str]) -> list[LoadedClaim]:
    """The claims of several files; a setup name must be unique across them (it keys the
    differences and --claims-setup)."""
    claims: list[LoadedClaim] = []
    owner: dict[str, Path] = {}
    for name in names:
        path = claims_path(settings, name)
        loaded = load_claims(path)
        for setup in {claim.setup_name for claim in loaded}:
            if owner.setdefault(setup, path) != path:
                raise UsageError(
                    f"setup {setup!r} is in both {owner[setup]} and {path}",
                    "rename one of them, or pass the files one at a time",
                )
        claims.extend(loaded)
    return claims
