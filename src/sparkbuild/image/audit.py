"""The device-code audit of an image: per library, whether its CUDA code runs on the
Spark's GPU (sm_121), read from the image's files without running it (docs/image.md,
"Device-code audit").

Each file with device code gets a verdict: ``native`` (SASS that runs on sm_121: sm_120,
sm_121, sm_121a, or a 12.x family cubin), ``ptx`` (no such SASS, but PTX the driver can
compile for sm_121: at first use, at a cost) or ``none`` (neither: the first launch of its
kernels fails with "no kernel image is available"). A library (the Python distribution,
Debian package or loose file that owns the files) takes its worst file's verdict, or
``jit`` when it ships no device code and compiles at run time by design (FlashInfer
without its cubin packages, Triton, DeepGEMM). Which files the engine's launch loads is
followed from the engine's own distributions: their requirements (``Requires-Dist``),
then every ELF's dynamic links; a library the launch loads with a ``none`` file fails the
build, a ``ptx`` one warns.
"""

from __future__ import annotations

import dataclasses
import re
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import docker.errors
from packaging.markers import InvalidMarker, UndefinedComparison, UndefinedEnvironmentName
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from sparkbuild.errors import AuditError
from sparkbuild.image.cubins import runs_on
from sparkbuild.image.devicecode import DeviceCode, ptx_runs_on
from sparkbuild.image.imagefiles import ImageFiles, read_image_files
from sparkbuild.jsontext import JsonObject

if TYPE_CHECKING:
    from docker import DockerClient

TARGET = "sm_121"  # GB10, compute capability 12.1
FileVerdict = Literal["native", "ptx", "none"]
Verdict = Literal["native", "ptx", "none", "jit"]
_RANK: dict[str, int] = {"none": 0, "ptx": 1, "native": 2}
_PYTHON_VERSION = re.compile(r"/python(3\.\d+)/")


@dataclass(frozen=True)
class FileCode:
    """One file with device code, and whether it runs on the target."""

    path: str
    sass: tuple[str, ...]
    ptx: tuple[str, ...]
    ptx_isa: tuple[str, ...]
    verdict: FileVerdict
    loaded: bool
    problem: str | None = None
    shape: str = "elf"  # or cubin, fatbin: loaded by name at run time, per GPU arch

    def to_json(self) -> JsonObject:
        return {
            "path": self.path,
            "shape": self.shape,
            "sass": list(self.sass),
            "ptx": list(self.ptx),
            "ptx_isa": list(self.ptx_isa),
            "verdict": self.verdict,
            "loaded": self.loaded,
            "problem": self.problem,
        }


@dataclass(frozen=True)
class Library:
    """The files one owner (Python distribution, Debian package, or a file no package
    owns) ships, and one verdict for them."""

    name: str
    version: str | None
    kind: Literal["python", "deb", "file"]
    verdict: Verdict
    loaded: bool
    files: tuple[FileCode, ...]
    compiles: str | None = None  # what it compiles at run time by design, where known

    @property
    def sass(self) -> list[str]:
        return sorted({a for f in self.files for a in f.sass})

    @property
    def ptx(self) -> list[str]:
        return sorted({a for f in self.files for a in f.ptx})

    def to_json(self) -> JsonObject:
        return {
            "name": self.name,
            "version": self.version,
            "kind": self.kind,
            "verdict": self.verdict,
            "loaded": self.loaded,
            "sass": self.sass,
            "ptx": self.ptx,
            "compiles": self.compiles,
            "files": [f.to_json() for f in self.files],
        }


@dataclass(frozen=True)
class DeviceAudit:
    """An image's device code, per library, judged for ``target``."""

    image_id: str
    target: str
    libraries: tuple[Library, ...]
    roots: tuple[str, ...]  # the distributions the launch was followed from
    nvcc: tuple[str, ...]
    skipped: tuple[str, ...]  # binaries too large to read
    files_read: int
    seconds: float = 0.0

    def failures(self) -> list[str]:
        """A library the launch loads with a file that has no code for the target."""
        return [
            f"{lib.name}: {f.path} ({_code(f)})"
            for lib in self.libraries
            for f in lib.files
            if f.loaded and f.verdict == "none"
        ]

    def warnings(self) -> list[str]:
        found = []
        for lib in self.libraries:
            for f in lib.files:
                if f.verdict == "ptx" and f.loaded:
                    found.append(f"{lib.name}: {f.path}: PTX only ({_code(f)}): JIT at first use")
                elif f.verdict == "none" and not f.loaded:
                    found.append(f"{lib.name}: {f.path}: no {self.target} code ({_code(f)})")
                if f.problem:
                    found.append(f"{lib.name}: {f.path}: {f.problem}")
        found += [f"not read (larger than the limit): {path}" for path in self.skipped]
        if not self.roots:
            found.append("no engine distribution found: which libraries load is unknown")
        return found

    def counts(self) -> dict[str, int]:
        counted = {"native": 0, "ptx": 0, "none": 0, "jit": 0}
        for lib in self.libraries:
            counted[lib.verdict] += 1
        return counted

    def to_json(self) -> JsonObject:
        return {
            "image_id": self.image_id,
            "target": self.target,
            "counts": dict(self.counts()),
            "roots": list(self.roots),
            "nvcc": list(self.nvcc),
            "skipped": list(self.skipped),
            "files_read": self.files_read,
            "seconds": round(self.seconds, 2),
            "failures": list(self.failures()),
            "warnings": list(self.warnings()),
            "libraries": [lib.to_json() for lib in self.libraries],
        }

    def summary(self) -> str:
        counted = self.counts()
        parts = [f"{n} {v}" for v, n in counted.items() if n]
        return f"{len(self.libraries)} libraries with device code ({', '.join(parts) or 'none'})"


def _code(file: FileCode) -> str:
    sass = f"SASS {', '.join(file.sass)}" if file.sass else "no SASS"
    return f"{sass}; PTX {', '.join(file.ptx)}" if file.ptx else sass


def file_verdict(code: DeviceCode, target: str = TARGET) -> FileVerdict:
    if any(runs_on(arch, target) for arch in code.sass):
        return "native"
    if any(ptx_runs_on(arch, target) for arch in code.ptx):
        return "ptx"
    return "none"


def library_verdict(files: Sequence[FileCode]) -> FileVerdict:
    """The worst of the host binaries that can load (all of them, when none can); a library
    of only cubins and fatbins loads the one for the GPU it runs on: the best of them."""
    binaries = [f for f in files if f.shape == "elf"]
    if not binaries:
        return max((f.verdict for f in files), key=lambda v: _RANK[v])
    loadable = [f for f in binaries if not (f.problem or "").startswith("cannot load")]
    return min((f.verdict for f in loadable or binaries), key=lambda v: _RANK[v])


# --- what compiles at run time by design --------------------------------------------------


def runtime_compile(name: str, installed: Mapping[str, str], nvcc: Sequence[str]) -> str | None:
    """What a library compiles at run time, from its name and what else the image has."""
    if name in ("flashinfer-python", "flashinfer"):
        for package in ("flashinfer-jit-cache", "flashinfer-cubin"):
            if package in installed:
                return (
                    f"kernels prebuilt in {package} {installed[package]} (audited as its own "
                    "library); only kernels it lacks compile at first use"
                )
        missing = "" if nvcc else "; the image has no nvcc, so that compile fails"
        return (
            "compiles its kernels with nvcc at first use (attention, sampling, norm: per head "
            "size and dtype), into ~/.cache/flashinfer; no flashinfer-cubin or "
            f"flashinfer-jit-cache is installed{missing}"
        )
    return _BY_DESIGN.get(name)


_BY_DESIGN = {
    "triton": "compiles each @triton.jit kernel at its first call (its own ptxas), into "
    "~/.triton/cache",
    "deep-gemm": "compiles its GEMM kernels per shape at first use, into ~/.deep_gemm",
    "torch": "torch.compile (inductor) compiles the model's graph at boot unless the engine "
    "runs eager, into /tmp/torchinductor_$USER (Triton kernels on a GPU)",
}


# --- which files the launch loads ---------------------------------------------------------


def _requirement_names(requires: Iterable[str], python: str) -> list[str]:
    environment = {
        "extra": "",
        "platform_machine": "aarch64",
        "sys_platform": "linux",
        "platform_system": "Linux",
        "os_name": "posix",
        "python_version": python,
        "python_full_version": f"{python}.0",
        "implementation_name": "cpython",
        "platform_python_implementation": "CPython",
    }
    names: list[str] = []
    for text in requires:
        try:
            requirement = Requirement(text)
            if requirement.marker and not requirement.marker.evaluate(environment):
                continue
        except (InvalidRequirement, InvalidMarker, UndefinedComparison, UndefinedEnvironmentName):
            continue
        names.append(str(canonicalize_name(requirement.name)))
    return names


def loaded_distributions(files: ImageFiles, roots: Iterable[str]) -> set[str]:
    """``roots`` and everything they require, transitively (extras left out)."""
    by_name = {str(canonicalize_name(name)): d for name, d in files.distributions.items()}
    pending = [str(canonicalize_name(r)) for r in roots if canonicalize_name(r) in by_name]
    seen: set[str] = set()
    while pending:
        name = pending.pop()
        if name in seen or name not in by_name:
            continue
        seen.add(name)
        dist = by_name[name]
        found = _PYTHON_VERSION.search(dist.site + "/")
        pending += _requirement_names(dist.requires, found.group(1) if found else "3.12")
    return seen


def library_index(files: ImageFiles) -> dict[str, list[str]]:
    """Each library name the image has (file names and symlinks to them) -> the files."""
    by_name: dict[str, list[str]] = {}
    for path in files.code:
        by_name.setdefault(path.rsplit("/", 1)[-1], []).append(path)
    for link, target in files.symlinks.items():
        if target in files.code:
            by_name.setdefault(link.rsplit("/", 1)[-1], []).append(target)
    return by_name


def missing_links(code: DeviceCode, index: Mapping[str, list[str]]) -> list[str]:
    """The libraries a file links that the image lacks (the driver's own, which the
    container runtime brings, aside): such a file cannot load here, e.g. a CUDA 11 build
    (libcudart.so.11.0) beside the CUDA 13 one in the same wheel."""
    return [n for n in code.needed if n not in index and not _DRIVER.match(n)]


_DRIVER = re.compile(r"^lib(cuda|nvidia-[\w.-]+|nvcuvid|nvoptix)\.so(\.\d+)*\Z")


def loaded_files(files: ImageFiles, distributions: set[str]) -> set[str]:
    """The distributions' ELF files that can load, then every library they link."""
    index = library_index(files)
    pending = [
        path
        for path, code in files.code.items()
        if code.shape == "elf"
        and (owner := files.owners.get(path)) is not None
        and owner[0] == "python"
        and canonicalize_name(owner[1]) in distributions
        and not missing_links(code, index)
    ]
    seen: set[str] = set()
    while pending:
        path = pending.pop()
        if path in seen:
            continue
        seen.add(path)
        for needed in files.code[path].needed:
            pending += [p for p in index.get(needed, []) if files.code[p].shape == "elf"]
    return seen


# --- the audit ----------------------------------------------------------------------------


def judge(
    image_id: str, files: ImageFiles, roots: Sequence[str], target: str = TARGET
) -> DeviceAudit:
    """Verdicts for every library with device code in ``files``; ``roots``: the engine's
    distributions, where the launch starts."""
    present = [r for r in roots if canonicalize_name(r) in _canonical(files.distributions)]
    loaded = loaded_files(files, loaded_distributions(files, present))
    index = library_index(files)
    grouped: dict[tuple[str, str], list[FileCode]] = {}
    for path, code in sorted(files.code.items()):
        if not code.has_code and code.problem is None:
            continue
        kind, name = files.owners.get(path, ("file", path))
        verdict = file_verdict(code, target)
        missing = missing_links(code, index)
        problem = code.problem or (
            f"cannot load in this image: links {', '.join(missing[:3])}, which it lacks"
            if missing
            else None
        )
        grouped.setdefault((kind, name), []).append(
            FileCode(
                path,
                tuple(sorted(code.sass)),
                tuple(sorted(code.ptx)),
                tuple(sorted(code.ptx_isa)),
                verdict,
                path in loaded,
                problem,
                code.shape,
            )
        )
    return DeviceAudit(
        image_id=image_id,
        target=target,
        libraries=tuple(_libraries(files, grouped, loaded_distributions(files, present))),
        roots=tuple(present),
        nvcc=tuple(sorted(files.nvcc)),
        skipped=tuple(sorted(files.skipped)),
        files_read=files.members,
    )


def _canonical(distributions: Mapping[str, object]) -> set[str]:
    return {canonicalize_name(name) for name in distributions}


def _libraries(
    files: ImageFiles,
    grouped: Mapping[tuple[str, str], list[FileCode]],
    loaded_dists: set[str],
) -> list[Library]:
    installed = {str(canonicalize_name(n)): d.version for n, d in files.distributions.items()}
    found = []
    for (kind, name), members in sorted(grouped.items(), key=lambda item: item[0][1]):
        verdict = library_verdict(members)
        found.append(
            Library(
                name=name,
                version=_version(files, kind, name),
                kind=kind,  # type: ignore[arg-type]
                verdict=verdict,
                loaded=any(f.loaded for f in members),
                files=tuple(members),
                compiles=runtime_compile(canonicalize_name(name), installed, files.nvcc)
                if kind == "python"
                else None,
            )
        )
    owners = {canonicalize_name(name) for (kind, name) in grouped if kind == "python"}
    for name, dist in sorted(files.distributions.items()):
        canonical = canonicalize_name(name)
        compiles = runtime_compile(canonical, installed, files.nvcc)
        if compiles and canonical not in owners:
            found.append(
                Library(
                    name, dist.version, "python", "jit", canonical in loaded_dists, (), compiles
                )
            )
    return found


def _version(files: ImageFiles, kind: str, name: str) -> str | None:
    if kind == "python":
        dist = files.distributions.get(name)
        return dist.version if dist else None
    return files.debian.get(name) if kind == "deb" else None


def audit_image(
    api: DockerClient,
    image: str,
    roots: Sequence[str],
    progress: Callable[[int], None] = lambda _n: None,
) -> DeviceAudit:
    """Read ``image`` (an id or reference) and judge its device code."""
    started = time.monotonic()
    try:
        image_id = str(api.images.get(image).id)
    except docker.errors.DockerException as exc:
        raise AuditError(
            f"no local image {image[:80]} ({type(exc).__name__})",
            "pull or build it first; `docker image ls` lists what this host has",
        ) from None
    files = read_image_files(api, image_id, progress)
    audit = judge(image_id, files, roots)
    return dataclasses.replace(audit, seconds=time.monotonic() - started)


__all__ = ["TARGET", "DeviceAudit", "FileCode", "Library", "audit_image", "judge"]
