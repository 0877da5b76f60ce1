"""images.lock's schema: a pydantic model per section, with every key a stage writes.

Strictly typed, so a hand-edited ``verified: 1`` is not a ``true``, and a key no sparkbuild
wrote is refused. Fields marked :data:`Written` are ones every lock sparkbuild writes has:
a load does not require them (every command still reads a lock that lacks one), and
``lock --check`` names each one missing (:func:`missing_fields`).

The models import no stage: each stage makes its own records from its own result (the
``record`` module of its package), and :mod:`sparkbuild.lockfile` reads and writes them.
The one shape the lock shares with the spec, a PR's number and range, is the spec's own
(:class:`sparkbuild.spec.PRFields`).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Annotated, Any, Literal, Self, TypeVar

from pydantic import AfterValidator, BaseModel, ConfigDict, Field, model_validator

from sparkbuild import validate
from sparkbuild.adapters import versions
from sparkbuild.checks import ItemStatus, Status, Verdict
from sparkbuild.spec import PRFields

SCHEMA = 1

Sha = Annotated[str, Field(pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")]  # SHA-1 or SHA-256
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
# Image ids go to docker, never to git or a shell; a plain token is enough.
ImageId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9:._@/-]*$")]
BuildName = Annotated[str, AfterValidator(validate.build_name)]
WHEEL_FILENAME = r"^[A-Za-z0-9][A-Za-z0-9_.+-]*\.whl$"  # a name, joined to a cache folder
WheelFile = Annotated[str, Field(pattern=WHEEL_FILENAME)]
# Publish records are references a rollback sends to a registry: a tag, a digest, a repository
# (HOST[:PORT]/path, the distribution grammar), never a path such as `../../victim/manifests`.
Tag = Annotated[str, Field(pattern=r"^[A-Za-z0-9_][A-Za-z0-9_.-]{0,127}$")]
_COMPONENT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
Repository = Annotated[
    str,
    Field(
        pattern=rf"^(?:[A-Za-z0-9.-]+|\[[0-9A-Fa-f:.]+\])(?::[0-9]+)?/{_COMPONENT}(?:/{_COMPONENT})*$"
    ),
]


def _utc_time(value: str) -> str:
    """An ISO 8601 date and time at UTC (offset zero), kept as written."""
    try:
        moment = datetime.fromisoformat(value)
    except ValueError:
        raise ValueError("not an ISO 8601 date and time") from None
    if moment.utcoffset() != timedelta(0):
        raise ValueError("not a UTC time: it must end in +00:00 or Z")
    return value


UtcTime = Annotated[str, AfterValidator(_utc_time)]


# A measured figure, kept as written: a 2 read back stays 2 (a float field would write 2.0);
# finite (.inf and .nan are no measurement, and crashed the report).
Number = int | Annotated[float, Field(allow_inf_nan=False)]
_IMAGE_DIGEST = r"^sha256:[0-9a-f]{64}$"


@dataclass(frozen=True)
class _Written:
    pattern: str | None = None  # what the value must match in a lock sparkbuild wrote


_T = TypeVar("_T")
# A field every lock sparkbuild writes has: `lock --check` requires it (non-null), while a
# load does not, so every command still reads a lock that lacks it and the check names it.
Written = Annotated[_T | None, _Written()]


class _Section(BaseModel):
    """A part of the lock: strictly typed, every key declared."""

    model_config = ConfigDict(extra="forbid", strict=True)

    def to_json(self) -> dict[str, Any]:
        """The plain mapping: exactly the keys that were read or set, nothing defaulted."""
        return self.model_dump(mode="python", by_alias=True, exclude_unset=True)

    def unset(self, name: str) -> None:
        """Drop field ``name`` from what is written, as if it had never been set."""
        setattr(self, name, type(self).model_fields[name].get_default())
        self.__pydantic_fields_set__.discard(name)


# --- source: what `lock` resolved ---------------------------------------------------------


class LockedPR(_Section, PRFields):
    """One PR of ``source.prs``: the spec's number and range, and what was resolved."""

    status: Written[ItemStatus] = None
    head: Sha | None = None
    commits: list[Sha] = []
    diff_sha256: Sha256 | None = None


class LockedPatch(_Section):
    """One patch of ``source.patches``: its file, range, status and the bytes' sha256."""

    file: str
    when: str | None = None
    status: Written[ItemStatus] = None
    sha256: Sha256 | None = None


class LockedStep(_Section):
    """One source step of ``source.steps``: which edit on which file, its range and status,
    and the version of the step's code that made it (``source.gencodes.VERSION``)."""

    step: str
    file: str
    when: str | None = None
    status: Written[ItemStatus] = None
    version: int | None = None


class SourceSection(_Section):
    engine: Written[str] = None
    repo: Written[str] = None
    ref: Written[str] = None
    commit: Written[Sha] = None
    version: Written[str] = None
    spec_digest: Written[Digest] = None
    tree: Written[Sha] = None
    prs: list[LockedPR] = []
    patches: list[LockedPatch] = []
    steps: list[LockedStep] = []

    def pr_heads(self) -> dict[int, str]:
        return {pr.number: pr.head for pr in self.prs if pr.head}


# --- image: what `build` built -------------------------------------------------------------


class ImageSection(_Section):
    mode: str | None = None
    base_image: str | None = None
    base_digest: str | None = None
    platform: str | None = None
    tree: Sha | None = None
    inputs_digest: str | None = None
    image_id: Annotated[ImageId | None, _Written(_IMAGE_DIGEST)] = None
    repo_digest: str | None = None
    tags: list[str] = []
    cuda_code: dict[str, object] | None = None  # source mode: what the built cubins target
    # The device-code audit of this image (image/audit_record.py): per library, whether its
    # CUDA code runs on sm_121; absent in locks older than the audit.
    device_code: dict[str, object] | None = None
    # When the build of this image started (the image job, before its source was prepared)
    # and finished (built and checked), UTC; absent in locks older than these fields, and
    # for an image no sparkbuild run was seen building.
    started: UtcTime | None = None
    finished: UtcTime | None = None
    # What built it (docker client, engine, BuildKit, Dockerfile frontend, canonical form):
    # a rebuild needs the same canonical form; the rest says where a difference may come from.
    builder: dict[str, str] | None = None
    source_date_epoch: int | None = None  # every time in the image is this, or earlier
    # `build --check-reproducible`: a second build without cache gave this very image id
    # (true), or not (false, with the differences, most useful first).
    reproducible: bool | None = None
    differences: list[str] = []

    @model_validator(mode="after")
    def _finished_after_started(self) -> Self:
        times = self.build_times()
        if times is not None and times[1] < times[0]:
            raise ValueError(f"finished ({self.finished}) is before started ({self.started})")
        return self

    def build_times(self) -> tuple[datetime, datetime] | None:
        """(started, finished) of the image's build, when both are recorded."""
        if not self.started or not self.finished:
            return None
        return datetime.fromisoformat(self.started), datetime.fromisoformat(self.finished)

    def set_build_times(self, started: datetime, finished: datetime) -> None:
        self.started = started.astimezone(UTC).isoformat(timespec="seconds")
        self.finished = finished.astimezone(UTC).isoformat(timespec="seconds")


class LockedWheel(_Section):
    """One wheel an image installs (``requirements:``)."""

    requirement: str
    name: str
    version: str
    filename: WheelFile
    sha256: Sha256


# --- verdicts: preflight, smoke, bench, keyed by what they were run on ---------------------


class ProfileVerdict(_Section):
    """One profile's preflight verdict (its own checks and the build-wide ones)."""

    verdict: Status | None = None
    checks: dict[str, Status] = {}


class HostNode(_Section):
    """One node a verdict ran on: its facts (engines/host_facts; each unknown one with why)
    and what its memory did (the guard: at the start, the lowest, the most taken per phase)."""

    node: str
    facts: dict[str, str] = {}
    unknown: dict[str, str] = {}
    total_gib: Number | None = None
    available_at_start_gib: Number | None = None
    lowest_available_gib: Number | None = None
    swap_used_peak_gib: Number | None = None
    taken_gib: dict[str, Number] = {}  # boot phase -> the most memory the run took in it


class BootPhase(_Section):
    phase: str
    started_s: Number
    seconds: Number | None = None  # None: still going when the run ended


class HostRecord(_Section):
    """``hosts``: where a verdict was obtained, node by node; the drift named before the
    boot (and whether it was run anyway), the memory floor and a stop by the guard, and the
    boot's phases."""

    read_at: UtcTime | None = None
    nodes: list[HostNode] = []
    drift: list[str] = []
    drift_allowed: bool | None = None
    memory_floor: str | None = None
    stopped: str | None = None
    phases: list[BootPhase] = []


class PreflightRun(_Section):
    """``preflight.<tree>+<deps>``: one run's verdicts (per profile), not their details."""

    where: str | None = None  # venv, image or python
    image_id: str | None = None  # written for a run inside an image only
    tree: str | None = None
    deps_digest: str | None = None
    versions: dict[str, str] = {}
    checks: dict[str, Status] = {}
    profiles: dict[str, ProfileVerdict] = {}
    hosts: HostRecord | None = None


class Topology(_Section):
    """How a run was spread: nodes and the tensor, expert and pipeline parallel sizes."""

    nodes: int
    tp: int
    ep: int = 1
    pp: int = 1


class NodeRecord(_Section):
    """One node of a cluster run: the image id its rank's container ran."""

    name: str
    endpoint: str | None = None
    rank: int | None = None
    image_id: str | None = None


class EvidenceRecord(_Section):
    """One request of a smoke run, as the verdict keeps it: the first and last characters of
    its answer (redacted), its finish reason and token counts."""

    check: str
    request: str
    finish_reason: str | None = None
    completion_tokens: int | None = None
    prompt_tokens: int | None = None
    chars: int | None = None
    head: str = ""
    tail: str = ""
    note: str = ""


class CompileBoot(_Section):
    """One boot's compiling (engines/compile_cache.py): the engine's own seconds, what the
    compile cache gained, and the boot's length."""

    seconds: Number | None = None
    files_added: int = 0
    bytes_added: int = 0
    compiled: list[str] = []  # the cache's parts that grew
    boot_seconds: Number | None = None


class CompileRecord(_Section):
    """The compile phase of the image's boots on this host: the first (an empty cache) is
    kept when a later run records, so the two can be held against each other."""

    cache: str | None = None
    first_boot: CompileBoot | None = None
    latest: CompileBoot | None = None


class SmokeRecord(_Section):
    """``smoke.<image_id>.<profile>``: one smoke verdict and how it was obtained. A cluster
    run adds its topology, launcher and every node's image id; it is verified only when
    every node ran the pinned id."""

    verdict: Verdict | None = None
    checks: dict[str, Status] = {}
    accept_len: Number | None = None
    boot_seconds: Number | None = None
    engine: str | None = None
    engine_version: str | None = None  # the image's label (or --engine-version)
    served_version: str | None = None  # what the engine that answered reported
    nan_signal: str | None = None  # which NaN detection was active
    target: str | None = None  # KIND:WHAT (image, command or URL)
    verified: bool | None = None  # only an image run shows what ran; publish counts only these
    image_id: str | None = None  # the id the container ran (null when nothing proves it)
    cluster: str | None = None  # the cluster file's name
    topology: Topology | None = None
    launcher: str | None = None  # the engine's multi-node runtime: mp, ray, native, lws
    nodes: list[NodeRecord] = []
    declared: list[str] = []  # the deep checks the profile declared: publish needs each passed
    numbers: dict[str, object] = {}  # each check's measured value (divergence, rates, windows)
    evidence: list[EvidenceRecord] = []
    compile: CompileRecord | None = None
    hosts: HostRecord | None = None

    @property
    def versions_disagree(self) -> bool:
        """The image declared one engine release and the engine that answered another."""
        return versions.disagree(self.engine_version, self.served_version)

    @property
    def target_kind(self) -> str:
        """What ran: image, cluster, command or url (``target`` is ``KIND:WHAT``)."""
        return (self.target or "").partition(":")[0] or "unknown"

    def image_verified(self, image_id: str) -> bool:
        """A verdict about ``image_id`` as it ran: marked verified, of that id, and from a
        run of the image itself (an image or cluster target). A --url or --command run
        shows nothing of what ran, whatever its record says."""
        kinds = ("image", "cluster")
        return self.verified is True and self.image_id == image_id and self.target_kind in kinds

    def every_node_ran(self, image_id: str) -> bool:
        """A cluster record whose every node ran ``image_id`` (False for one box)."""
        return bool(self.nodes) and all(node.image_id == image_id for node in self.nodes)


class BenchCell(_Section):
    """One cell of a sweep: its shape, and the medians over its runs."""

    pp: int | None = None
    tg: int | None = None
    depth: int | None = None
    concurrency: int | None = None
    ttft_s: Number | None = None
    prefill_tps: Number | None = None
    decode_tps_request: Number | None = None
    decode_tps_aggregate: Number | None = None
    decode_tps_engine: Number | None = None
    burst_runs: int | None = None
    accept_len: Number | None = None
    errors: int | None = None
    carried: bool | None = None  # bench --resume: measured by an earlier process of the sweep


class BenchRecord(_Section):
    """``bench.<image_id>.<profile>``: what the lock keeps of a benchmark run, enough to see
    a regression (the report file has the rest)."""

    label: str | None = None
    created: str | None = None
    harness: str | None = None  # the harness's version
    seed: int | None = None
    runs: int | None = None
    engine_args: list[str] = []
    host: str | None = None
    cells: list[BenchCell] = []
    topology: Topology | None = None  # how the engine was spread (the profile's parallel:)
    nodes: list[NodeRecord] = []  # a cluster run: every node's image id
    hosts: HostRecord | None = None


# --- publish: where the image went -------------------------------------------------------


class SignedRecord(_Section):
    """What publish signed and attached for one digest: the signature manifest, each
    attestation's referrer manifest, and the SBOM's size (see docs/verify.md)."""

    key: str | None = None  # the public key's fingerprint (sha256 of its DER), or "keyless"
    signature: Digest | None = None  # the sha256-<hex>.sig manifest
    attestations: dict[str, Digest] = {}  # sbom, provenance, verdicts -> referrer manifest
    referrers: Literal["api", "tag"] | None = None  # the registry's API, or the fallback tag
    sbom_packages: int | None = None


class Publication(_Section):
    """One digest in a repository's ``history``."""

    digest: Digest | None = None
    image_id: ImageId | None = None
    tag: Tag | None = None
    verified: bool | None = None
    # profile -> the verdict publish counted: pass, fail, missing or "unverified pass (TARGET)"
    smoke: dict[str, str] = {}
    rolled_back: bool | None = None
    signed: SignedRecord | None = None


class PublishRecord(_Section):
    """``publish.<repository>``: what the repository's tags point at now, and before."""

    tag: Tag | None = None
    digest: Digest | None = None
    image_id: ImageId | None = None
    verified: bool | None = None
    aliases: list[Tag] = []
    history: list[Publication] = []
    signed: SignedRecord | None = None

    def published(self) -> list[Publication]:
        return [h for h in self.history if h.digest]


class BuildEntry(_Section):
    source: SourceSection | None = None
    image: ImageSection | None = None
    requirements: list[LockedWheel] | None = None
    preflight: dict[str, PreflightRun] | None = None
    smoke: dict[str, dict[str, SmokeRecord]] | None = None
    bench: dict[str, dict[str, BenchRecord]] | None = None
    publish: dict[Repository, PublishRecord] | None = None


# A section a command replaces whole (the keyed verdict sections are changed record by record).
Section = SourceSection | ImageSection | list[LockedWheel]


class LockFile(_Section):
    # The one open mapping: a top-level key other than `schema` and `builds` still loads, as
    # it always has, so every command keeps working and `lock --check` names the key. No
    # sparkbuild ever wrote one, nor a key the section models above lack (see each writer's
    # history), so they are closed.
    model_config = ConfigDict(extra="allow", strict=True)

    schema_: int = Field(default=SCHEMA, alias="schema")
    builds: dict[BuildName, BuildEntry] = {}

    def entry(self, build: str) -> BuildEntry | None:
        return self.builds.get(build)

    def to_json(self) -> dict[str, Any]:
        return {
            **super().to_json(),
            "schema": SCHEMA,
            "builds": {name: entry.to_json() for name, entry in self.builds.items()},
        }


def empty() -> LockFile:
    return LockFile()


# --- what `lock --check` requires beyond a load ----------------------------------------


def _written(model: BaseModel) -> Iterator[tuple[str, _Written]]:
    for name, info in type(model).model_fields.items():  # in declaration order: a stable report
        yield from ((name, mark) for mark in info.metadata if isinstance(mark, _Written))


def _missing(model: BaseModel, loc: tuple[str | int, ...]) -> Iterator[str]:
    """What a lock sparkbuild wrote would have, and ``model`` (at ``loc``) lacks."""
    for name, written in _written(model):
        where = ".".join(str(p) for p in (*loc, name))
        value = getattr(model, name)
        if name not in model.model_fields_set:
            yield f"`{where}`: Field required"
        elif value is None:
            yield f"`{where}`: Input should be a valid string"
        elif written.pattern and not re.match(written.pattern, str(value)):
            yield f"`{where}`: String should match pattern '{written.pattern}'"
    for name in type(model).model_fields:
        if name in model.model_fields_set:
            yield from missing_fields(getattr(model, name), (*loc, _alias(model, name)))


def missing_fields(value: object, loc: tuple[str | int, ...]) -> Iterator[str]:
    """What a lock sparkbuild wrote would have, and ``value`` (models, lists and mappings of
    them, at ``loc``) lacks: each :data:`Written` field unset, null or off its pattern."""
    if isinstance(value, BaseModel):
        yield from _missing(value, loc)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from missing_fields(item, (*loc, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from missing_fields(item, (*loc, key))


def _alias(model: BaseModel, name: str) -> str:
    info = type(model).model_fields.get(name)
    return (info.alias if info else None) or name
