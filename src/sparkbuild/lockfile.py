"""images.lock: the whole schema, typed; canonical YAML, written only by sparkbuild,
atomically, one writer at a time.

The file holds one :class:`BuildEntry` per build; each stage owns one section of it
(``source``, ``image``, ``requirements``, ``preflight``, ``smoke``, ``bench``, ``publish``),
and every key a stage writes is a field of that section's model here. Records are made by
the models' own constructors from the stage's typed result (``SmokeRecord.from_result``,
``PreflightRun.from_report``, ...). A command opens a :class:`LockHandle` once, reads the
typed entries from it, queues its changes per build, and writes them in one go under the
file lock: the file is swapped in with a rename, so an interrupted write leaves the previous
lock intact, and a command that fails before it writes changes nothing.

One schema serves both readers: :func:`load` holds the file to the models below (strictly
typed, so a hand-edited ``verified: 1`` is not a ``true``, and a key no sparkbuild wrote is
refused); :func:`check` (``lock --check``) also requires the fields marked :data:`Written`,
which every lock sparkbuild writes has. A lock read and written again is byte-identical.
"""

from __future__ import annotations

import fcntl
import os
import re
import stat
import tempfile
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, Literal, TypeVar

import yaml
from pydantic import AfterValidator, BaseModel, ConfigDict, Field, ValidationError

from sparkbuild import fileio, validate, yamlfile
from sparkbuild.checks import Status, Verdict
from sparkbuild.errors import (
    BadYAMLError,
    ImageMismatchError,
    LockError,
    NoPinnedImageError,
)
from sparkbuild.redact import redact, strip_userinfo
from sparkbuild.spec import PRFields

if TYPE_CHECKING:  # the stages' results, for the constructors; the stages import this module
    from sparkbuild.bench.results import BenchReport, CellResult
    from sparkbuild.preflight.report import PreflightReport
    from sparkbuild.smoke.runner import SmokeResult
    from sparkbuild.source.items import ItemResult, PreparedSource

SCHEMA = 1
HEADER = "# images.lock: written by sparkbuild (`sparkbuild lock`), do not edit by hand.\n"

Sha = Annotated[str, Field(pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")]  # SHA-1 or SHA-256
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
WHEEL_FILENAME = r"^[A-Za-z0-9_.+-]+\.whl$"  # one file name: no '/', so never '../'
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
# A measured figure, kept as written: a 2 read back stays 2 (a float field would write 2.0).
Number = int | float
_IMAGE_DIGEST = r"^sha256:[0-9a-f]{64}$"

# What the source stage concluded about a PR or patch (see sparkbuild.source).
ItemStatus = Literal["applied", "upstream", "out-of-range", "conflict", "missing", "invalid"]


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

    @classmethod
    def from_result(cls, item: ItemResult) -> LockedPR:
        if item.kind != "pr" or item.number is None:
            raise TypeError(f"{item.id} is not a PR")
        return cls(
            number=item.number,
            when=item.when,
            status=item.status,
            head=item.head,
            commits=list(item.commits),
            diff_sha256=item.diff_sha256,
        )


class LockedPatch(_Section):
    """One patch of ``source.patches``: its file, range, status and the bytes' sha256."""

    file: str
    when: str | None = None
    status: Written[ItemStatus] = None
    sha256: Sha256 | None = None

    @classmethod
    def from_result(cls, item: ItemResult) -> LockedPatch:
        if item.kind != "patch" or item.file is None:
            raise TypeError(f"{item.id} is not a patch")
        return cls(file=item.file, when=item.when, status=item.status, sha256=item.sha256)


class LockedStep(_Section):
    """One source step of ``source.steps``: which edit on which file, its range and status,
    and the version of the step's code that made it (``source.gencodes.VERSION``)."""

    step: str
    file: str
    when: str | None = None
    status: Written[ItemStatus] = None
    version: int | None = None

    @classmethod
    def from_result(cls, item: ItemResult) -> LockedStep:
        if item.kind != "step" or item.step is None or item.file is None:
            raise TypeError(f"{item.id} is not a source step")
        return cls(
            step=item.step,
            file=item.file,
            when=item.when,
            status=item.status,
            version=item.step_version,
        )


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

    @classmethod
    def from_prepared(cls, prepared: PreparedSource) -> SourceSection:
        build = prepared.build
        steps = [LockedStep.from_result(item) for item in prepared.items if item.kind == "step"]
        return cls(
            engine=build.engine,
            repo=strip_userinfo(build.spec_repo),  # a token never reaches the lock
            ref=build.ref,
            commit=prepared.base_commit,
            version=str(build.version),
            spec_digest=build.spec_digest(),
            tree=prepared.tree,
            prs=[LockedPR.from_result(item) for item in prepared.items if item.kind == "pr"],
            patches=[
                LockedPatch.from_result(item) for item in prepared.items if item.kind == "patch"
            ],
            # Only when the build has steps, so older entries keep their shape.
            **({"steps": steps} if steps else {}),
        )

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
    cuda_code: dict[str, Any] | None = None  # source mode: what the built cubins target


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


class PreflightRun(_Section):
    """``preflight.<tree>+<deps>``: one run's verdicts (per profile), not their details."""

    where: str | None = None  # venv, image or python
    image_id: str | None = None  # written for a run inside an image only
    tree: str | None = None
    deps_digest: str | None = None
    versions: dict[str, str] = {}
    checks: dict[str, Status] = {}
    profiles: dict[str, ProfileVerdict] = {}

    @classmethod
    def from_report(cls, report: PreflightReport) -> PreflightRun:
        run = cls(
            where=report.where,
            tree=report.tree,
            deps_digest=report.deps_digest,
            versions={name: str(v) for name, v in report.versions.items() if v},
            checks={c.name: c.status for c in report.package_checks},
            profiles={
                p.profile: ProfileVerdict(
                    verdict=report.verdict_for(p), checks={c.name: c.status for c in p.checks}
                )
                for p in report.profiles
            },
        )
        if report.image_id:
            run.image_id = report.image_id
        return run


class Topology(_Section):
    """How a run was spread: nodes and the tensor, expert and pipeline parallel sizes."""

    nodes: int
    tp: int
    ep: int = 1
    pp: int = 1

    @classmethod
    def of(cls, parallel: Any) -> Topology:
        return cls(nodes=parallel.nodes, tp=parallel.tp, ep=parallel.ep, pp=parallel.pp)


class NodeRecord(_Section):
    """One node of a cluster run: the image id its rank's container ran."""

    name: str
    endpoint: str | None = None
    rank: int | None = None
    image_id: str | None = None


class SmokeRecord(_Section):
    """``smoke.<image_id>.<profile>``: one smoke verdict and how it was obtained. A cluster
    run adds its topology, launcher and every node's image id; it is verified only when
    every node ran the pinned id."""

    verdict: Verdict | None = None
    checks: dict[str, Status] = {}
    accept_len: Number | None = None
    boot_seconds: Number | None = None
    engine: str | None = None
    engine_version: str | None = None
    nan_signal: str | None = None  # which NaN detection was active
    target: str | None = None  # KIND:WHAT (image, command or URL)
    verified: bool | None = None  # only an image run shows what ran; publish counts only these
    image_id: str | None = None  # the id the container ran (null when nothing proves it)
    cluster: str | None = None  # the cluster file's name
    topology: Topology | None = None
    launcher: str | None = None  # the engine's multi-node runtime: mp, ray, native, lws
    nodes: list[NodeRecord] = []

    @classmethod
    def from_result(cls, result: SmokeResult) -> SmokeRecord:
        record = cls._of(result)
        if result.cluster is not None:
            run = result.cluster
            record.cluster = run.name
            record.topology = Topology.of(run.topology)
            record.launcher = run.launcher
            record.nodes = [
                NodeRecord(name=n.node, endpoint=n.endpoint, rank=n.rank, image_id=n.ran_image_id)
                for n in run.nodes
            ]
        return record

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

    @classmethod
    def _of(cls, result: SmokeResult) -> SmokeRecord:
        return cls(
            verdict=result.verdict,
            checks={check.name: check.status for check in result.checks},
            accept_len=result.accept_len,
            boot_seconds=result.boot_seconds,
            engine=result.engine,
            engine_version=result.engine_version,
            nan_signal=result.nan_signal,
            target=redact(f"{result.target_kind}:{result.target}"),
            verified=result.verified,
            image_id=result.image_id if result.verified else None,
        )


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

    @classmethod
    def from_result(cls, cell: CellResult) -> BenchCell:
        return cls(
            pp=cell.pp,
            tg=cell.tg,
            depth=cell.depth,
            concurrency=cell.concurrency,
            ttft_s=cell.ttft_s.median,
            prefill_tps=cell.prefill_tps.median,
            decode_tps_request=cell.decode_tps_request.median,
            decode_tps_aggregate=cell.decode_tps_aggregate.median,
            decode_tps_engine=cell.decode_tps_engine.median,
            burst_runs=cell.burst_runs,
            accept_len=cell.accept_len,
            errors=cell.errors,
        )


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

    @classmethod
    def from_report(cls, report: BenchReport) -> BenchRecord:
        record = cls._of(report)
        if report.topology is not None:
            record.topology = Topology.of(report.topology)
        if report.target.nodes:
            record.nodes = [
                NodeRecord(name=n.name, endpoint=n.endpoint, rank=n.rank, image_id=n.image_id)
                for n in report.target.nodes
            ]
        return record

    @classmethod
    def _of(cls, report: BenchReport) -> BenchRecord:
        return cls(
            created=report.created,
            label=redact(report.label),
            harness=report.harness.version,
            seed=report.sweep.seed,
            runs=report.sweep.runs,
            engine_args=list(report.engine.args),
            host=report.host.summary,
            cells=[BenchCell.from_result(cell) for cell in report.cells],
        )


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

    @classmethod
    def after_push(
        cls, before: PublishRecord | None, publication: Publication, aliases: Sequence[str]
    ) -> PublishRecord:
        """The record once ``publication`` is pushed and ``aliases`` point at it: its digest
        moves to the end of the history (once)."""
        earlier = before.published() if before else []
        record = cls(
            tag=publication.tag,
            digest=publication.digest,
            image_id=publication.image_id,
            verified=publication.verified,
            aliases=list(aliases),
            history=[*(h for h in earlier if h.digest != publication.digest), publication],
        )
        if publication.signed is not None:  # an unsigned publication keeps its old shape
            record.signed = publication.signed
        return record

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
        return {**super().to_json(), "schema": SCHEMA, "builds": {
            name: entry.to_json() for name, entry in self.builds.items()
        }}  # fmt: skip


def empty() -> LockFile:
    return LockFile()


# --- reading -------------------------------------------------------------------------------


def _repair_hint(path: Path) -> str:
    return (
        f"restore it with `git checkout -- {path.name}`, or move it aside "
        f"(`mv {path} {path}.bad`) and run `sparkbuild lock` to pin the sources again"
    )


def _read(path: Path) -> tuple[Any, Any]:
    """The parsed YAML and its node tree; (None, None) when the file does not exist yet."""
    try:
        raw = fileio.read_bytes(path)  # a FIFO, a device or a huge file is refused, not read
    except FileNotFoundError:
        return None, None
    except OSError as exc:
        raise LockError(f"{path}: cannot read: {fileio.reason(exc)}", _repair_hint(path)) from exc
    try:
        return yamlfile.parse_yaml(raw)
    except BadYAMLError as exc:
        where = f"{path}:{exc.line}" if exc.line else str(path)
        raise LockError(f"{where}: {exc.problem}", _repair_hint(path)) from exc


def _validate(path: Path, data: Any, node: Any) -> LockFile:
    if data is None:
        return empty()
    if not isinstance(data, dict) or not isinstance(data.get("builds", {}), dict):
        raise LockError(f"{path}: not a sparkbuild lock (no 'builds' mapping)", _repair_hint(path))
    if data.get("schema", SCHEMA) != SCHEMA:
        raise LockError(
            f"{path}: `schema: {data.get('schema')!r}` is not {SCHEMA}, the one this sparkbuild "
            "reads",
            "use the sparkbuild that wrote it, or re-lock with `sparkbuild lock`",
        )
    try:
        return LockFile.model_validate(data)
    except ValidationError as exc:
        lines: dict[yamlfile.Location, int] = {}
        if node is not None:
            yamlfile.node_lines(node, (), lines)
        problems = [yamlfile.describe_error(e, LockFile, path, lines) for e in exc.errors()]
        shown = "\n  ".join(problems[:10])
        raise LockError(f"{path} is damaged:\n  {shown}", _repair_hint(path)) from exc


def load(path: Path) -> LockFile:
    """The typed lock; an empty one when the file does not exist yet.

    Anything else than a lock of this schema (not UTF-8, not YAML, aliases, a wrong shape) is
    a LockError naming the file, the line and the repair.
    """
    return load_with_tree(path)[0]


def load_with_tree(path: Path) -> tuple[LockFile, yaml.Node | None]:
    """The typed lock and the YAML node tree it was read from (None: no file, or empty), for
    a reader of each record's lines (the report's dates) that would otherwise parse it again."""
    data, node = _read(path)
    return _validate(path, data, node), node


def read_entry(path: Path, build: str) -> BuildEntry:
    """``build``'s entry (an empty one when the lock has none), for a command that only reads."""
    return load(path).entry(build) or BuildEntry()


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
            yield from _missing_in(getattr(model, name), (*loc, _alias(model, name)))


def _missing_in(value: Any, loc: tuple[str | int, ...]) -> Iterator[str]:
    if isinstance(value, BaseModel):
        yield from _missing(value, loc)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            yield from _missing_in(item, (*loc, index))
    elif isinstance(value, dict):
        for key, item in value.items():
            yield from _missing_in(item, (*loc, key))


def _alias(model: BaseModel, name: str) -> str:
    info = type(model).model_fields.get(name)
    return (info.alias if info else None) or name


def schema_problems(path: Path) -> list[str]:
    """What is wrong with the lock at ``path`` (empty when it is a complete, valid lock)."""
    return check(path)[1]


def check(path: Path) -> tuple[LockFile | None, list[str]]:
    """The lock at ``path`` (None when it does not load) and what is wrong with it.

    The loader's checks come first (UTF-8, no aliases, the schema every command reads, with
    file and line); then what a lock sparkbuild wrote always has: ``schema:``, no other
    top-level keys, and the :data:`Written` fields of each section."""
    try:
        data, node = _read(path)
        lock = _validate(path, data, node)
    except LockError as exc:
        return None, [exc.message]
    if not isinstance(data, dict):
        return lock, [f"{path.name}: not a mapping with `schema:` and `builds:`"]
    if "schema" not in data:
        return lock, [f"{path.name}: no `schema:` field (sparkbuild writes `schema: {SCHEMA}`)"]
    problems = [f"`{key}`: Extra inputs are not permitted" for key in data if key not in
                ("schema", "builds")]  # fmt: skip
    if "builds" not in data:
        problems.append("`builds`: Field required")
    problems += _missing_in(lock.builds, ("builds",))
    return lock, [f"{path.name}: {problem}" for problem in problems]


# --- writing -------------------------------------------------------------------------------


def dumps(lock: LockFile) -> str:
    """Canonical text: sorted keys, block style, no timestamps added here."""
    header = HEADER.removeprefix("# ").rstrip("\n")
    text = yamlfile.dump_yaml(lock.to_json(), comment=[header], sort_keys=True, width=80)
    return redact(text)  # every record: an address's userinfo or token never lands


def write_atomic(path: Path, text: str) -> None:
    """Write beside the target, fsync, then rename over it: readers never see half a file.
    A full or read-only disk is a LockError, and leaves the file as it was."""
    try:
        _write_atomic(path, text)
    except OSError as exc:
        raise _unwritable(path, f"cannot write {path}", exc) from exc


def _write_atomic(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    try:  # mkstemp makes 0600 files; the lock is a shared, committed file
        mode = stat.S_IMODE(path.stat().st_mode)
    except FileNotFoundError:
        mode = 0o644
    fd, tmp_name = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "w", encoding="utf-8") as handle:
            handle.write(text)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(tmp_name, path)
    except BaseException:
        Path(tmp_name).unlink(missing_ok=True)
        raise


def _unwritable(path: Path, what: str, exc: OSError) -> LockError:
    return LockError(
        f"{what}: {fileio.reason(exc)}; {path.name} is unchanged",
        f"free space on the disk that holds {path.parent}, or make it writable, then run the "
        "command again",
    )


@contextmanager
def _writer(path: Path) -> Iterator[None]:
    """Writers of ``path`` one at a time, across processes: an exclusive flock on the
    directory that holds it. Not a ``path.lock`` file beside it, which every project would
    have to ignore in git; not the lock file itself, which is replaced by rename. A lock that
    cannot be taken (a missing or unreadable directory, a file in its place) is a LockError,
    not a traceback."""
    what = f"cannot take the writer lock on {path.parent}"
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        fd = os.open(path.parent, os.O_RDONLY | os.O_DIRECTORY)
    except OSError as exc:
        raise _unwritable(path, what, exc) from exc
    try:
        try:
            fcntl.flock(fd, fcntl.LOCK_EX)
        except OSError as exc:
            raise _unwritable(path, what, exc) from exc
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the flock


Change = Callable[[BuildEntry], None]
_Stamp = tuple[int, int, int] | None


def _stamp(path: Path) -> _Stamp:
    try:
        info = path.stat()
    except FileNotFoundError:
        return None
    return (info.st_ino, info.st_size, info.st_mtime_ns)


@dataclass
class LockHandle:
    """One command's images.lock: read once, each build's entry written once.

    Stages read typed entries with :meth:`entry` and queue their changes with :meth:`change`;
    :meth:`write` applies them, holding the file lock, to the lock as it is then (re-read only
    when another command replaced the file meanwhile, so concurrent writers to other sections
    are kept), and writes the file once. A change that raises (say, the image it records for
    moved on) writes nothing; a command that fails before :meth:`write` changes nothing.
    """

    path: Path
    lock: LockFile
    _stamp: _Stamp = None
    _changes: dict[str, list[Change]] = field(default_factory=dict)

    @classmethod
    def open(cls, path: Path) -> LockHandle:
        stamp = _stamp(path)
        return cls(path, load(path), stamp)

    def entry(self, build: str) -> BuildEntry | None:
        return self.lock.entry(build)

    def change(self, build: str, change: Change) -> None:
        self._changes.setdefault(build, []).append(change)

    def set_section(self, build: str, section: Section) -> None:
        """Queue replacing one stage's section of ``build``'s entry."""
        self.change(build, lambda entry: _place(entry, section))

    def write(self) -> LockFile:
        """Apply the queued changes under the file lock and write the file once."""
        queued, self._changes = self._changes, {}  # tried once: a failure drops them
        if not queued:
            return self.lock
        with _writer(self.path):
            current = self.lock if _stamp(self.path) == self._stamp else load(self.path)
            changed = current.model_copy(deep=True)
            for build, changes in queued.items():
                entry = changed.builds.get(build) or BuildEntry()
                for change in changes:
                    change(entry)
                changed.builds[build] = BuildEntry.model_validate(entry.to_json())
            text = dumps(changed)
            if text != dumps(current) or not self.path.exists():
                write_atomic(self.path, text)
            self.lock, self._stamp = changed, _stamp(self.path)
        return changed


def update_entry(path: Path, build: str, change: Change) -> LockFile:
    """Open, change one build's entry and write: for a command that writes only that."""
    handle = LockHandle.open(path)
    handle.change(build, change)
    return handle.write()


def set_section(path: Path, build: str, section: Section) -> LockFile:
    """Replace one stage's section of one build's entry."""
    handle = LockHandle.open(path)
    handle.set_section(build, section)
    return handle.write()


def _place(entry: BuildEntry, section: Section) -> None:
    if isinstance(section, SourceSection):
        entry.source = section
    elif isinstance(section, ImageSection):
        entry.image = section
    else:
        entry.requirements = section


# --- the pinned image, for the stages that record verdicts about it or publish it ----------

Purpose = Literal["record", "publish"]
_NO_IMAGE = {  # purpose -> (message, hint)
    "record": (
        "build {build!r} has no image in {lock}; nothing to record the result for",
        "build it first: sparkbuild build {build}",
    ),
    "publish": (
        "{build}: {lock} pins no image for it; nothing to publish",
        "`sparkbuild build {build}`, then smoke it with "
        "`sparkbuild smoke --image IMAGE --profile P --record {build}`",
    ),
}


def pinned_image(
    entry: BuildEntry | None, build: str, lock_path: Path, purpose: Purpose = "record"
) -> ImageSection:
    """``builds.<build>.image`` of ``entry``, or an error saying how to get one. Publishing
    also needs its tree (the destination's tags are rendered from it)."""
    image = entry.image if entry else None
    if image is None or not image.image_id or (purpose == "publish" and not image.tree):
        message, hint = _NO_IMAGE[purpose]
        raise NoPinnedImageError(
            message.format(build=build, lock=lock_path.name), hint.format(build=build)
        )
    return image


def pinned_image_id(path: Path, build: str) -> str:
    """``builds.<build>.image.image_id`` or an error saying how to get one."""
    return str(pinned_image(load(path).entry(build), build, path).image_id)


def _check_tested(
    image_id: str, build: str, path: Path, tested_id: str | None, activity: str
) -> str:
    if tested_id and tested_id != image_id:
        raise ImageMismatchError(
            f"the image under test ({tested_id}) is not build {build!r}'s image in "
            f"{path.name} ({image_id})",
            f"run the {activity} on the pinned image (see `builds.{build}.image` in {path.name})",
        )
    return image_id


def check_pinned_image(path: Path, build: str, tested_id: str | None, activity: str) -> str:
    """The pinned image id, after making sure it is the image under test (when known)."""
    return _check_tested(pinned_image_id(path, build), build, path, tested_id, activity)


_Record = TypeVar("_Record", SmokeRecord, BenchRecord)


def _keyed(
    records: dict[str, dict[str, _Record]] | None, image_id: str, key: str, record: _Record
) -> dict[str, dict[str, _Record]]:
    records = records or {}
    records.setdefault(image_id, {})[key] = record
    return records


def record_for_image(
    path: Path,
    build: str,
    key: str,
    record: SmokeRecord | BenchRecord,
    *,
    tested_id: str | None,
    activity: str,
) -> str:
    """Store ``record`` at ``builds.<build>.<smoke|bench>.<image_id>.<key>`` for the pinned
    image; other images' entries stay. Used by the smoke and bench stages."""
    handle = LockHandle.open(path)
    pinned = str(pinned_image(handle.entry(build), build, path).image_id)
    image_id = _check_tested(pinned, build, path, tested_id, activity)

    def change(entry: BuildEntry) -> None:
        current = entry.image.image_id if entry.image else None
        if current != image_id:  # re-checked under the writer lock: a build may have landed
            raise ImageMismatchError(
                f"build {build!r}'s image changed in {path.name} during the {activity}",
                f"re-run the {activity} against the new image of {build}",
            )
        if isinstance(record, SmokeRecord):
            entry.smoke = _keyed(entry.smoke, image_id, key, record)
        else:
            entry.bench = _keyed(entry.bench, image_id, key, record)

    handle.change(build, change)
    handle.write()
    return image_id
