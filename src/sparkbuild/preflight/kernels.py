"""The CUDA-only kernel packages a release pins, as stand-ins for a CPU preflight venv.

For each package the local venv leaves out (``deps.CUDA_ONLY``), the release's own pin is
downloaded as the Spark's wheel (linux/aarch64, CPython 3.11) and unpacked into the cache:
its Python files as they are, and each native binary as a placeholder beside an index of
what the real file provides (``native.index_binary``: symbols, op schemas, names). The wheel
itself is not kept: it is checked against the package index's sha256 before it is read
(``sparkbuild/wheelindex.py``), and each stand-in's manifest holds that sha256 and every
file it unpacked, by sha256, checked before each use (``sparkbuild/cachetrust.py``;
docs/preflight.md, "What the caches trust"): a stand-in that fails is made again, with a
note.

The probe puts these directories on ``sys.path`` and serves the native loads from the
indexes (``native.install``). Their dependencies that the venv lacks come the same way when
they are CUDA packages too; any other (a CPU library such as ml-dtypes or tabulate) is this
host's own wheel, unpacked whole and imported for real.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import tempfile
import zipfile
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from filelock import FileLock
from packaging.markers import default_environment
from packaging.requirements import InvalidRequirement, Requirement
from packaging.utils import canonicalize_name

from sparkbuild import cachetrust, console
from sparkbuild.jsontext import JsonObject
from sparkbuild.preflight.deps import CUDA_ONLY, STANDIN_ALSO_INSTALLED
from sparkbuild.preflight.native import (
    INDEX_VERSION,
    PLACEHOLDER,
    SIDECAR,
    index_binary,
    is_native,
)
from sparkbuild.wheelindex import IndexFile, download, on_index

# What the Spark runs: the stand-ins are its wheels, whatever this host is.
PLATFORM_ARGS = (
    *("--platform", "manylinux_2_34_aarch64", "--platform", "manylinux_2_28_aarch64"),
    *("--platform", "manylinux_2_17_aarch64", "--platform", "manylinux2014_aarch64"),
    *("--platform", "linux_aarch64", "--python-version", "3.11", "--implementation", "cp"),
    *("--abi", "cp311", "--abi", "abi3", "--abi", "none"),
)
TARGET_ENV: dict[str, str] = {
    **{k: str(v) for k, v in default_environment().items()},
    "platform_machine": "aarch64",
    "sys_platform": "linux",
    "python_version": "3.11",
    "platform_system": "Linux",
}
# Sources, build files and kernel images: never imported, so never unpacked.
_NOT_UNPACKED = re.compile(
    r"\.(?:h|hh|hpp|cuh|cu|cc|cpp|cxx|c|a|cubin|fatbin|ptx|lib|cmake|o)$|/(?:include|csrc)/"
)
# Dependencies of the kernel packages that are CUDA packages themselves (stood in for, like
# the packages in deps.CUDA_ONLY); any other dependency is installed for real.
CUDA_PACKAGE = re.compile(
    r"^(?:nvidia-|cuda-|flashinfer|sgl-|sglang-kernel|tilelang|tokenspeed|torch-c-dlpack|"
    r"quack-kernels|humming-kernels|flash-attn|deep-)|-cu1[0-9]\Z"
)
# Left out of the venv but CPU libraries at heart: their real package (this host's wheel of
# the release's pin) is imported, and only the binaries it loads for kernel packages are
# stood in for (``tvm_ffi.load_module``).
REAL_ON_CPU = frozenset({"apache-tvm-ffi"})
# Left out, not stood in: `kernels` downloads kernels from the Hub at run time, and the
# release leaves it unpinned, so its newest release is not what the image held.
NOT_STOOD_IN = frozenset({"kernels"})
# CUDA runtime libraries in wheels: shared objects for the kernels, no Python API to check.
CUDA_LIBRARIES = re.compile(
    r"^nvidia-(?:cublas|cuda-(?:runtime|nvrtc|cupti|nvcc|cccl|crt)|cudnn-cu|cufft|curand|"
    r"cusolver|cusparse|nccl|nvjitlink|nvtx|cufile|nvshmem-cu|nvvm|npp|nvjpeg)"
)
_MAX_MEMBER = 4 * 1024 * 1024  # larger data files are kernels or test data, not Python
_READY = ".sparkbuild-standin.json"
# In every folder's name: stand-ins made before their manifests were checked (layout 1) are
# left where they are, never used nor removed under a run of an older sparkbuild.
_LAYOUT = "2"


@dataclass(frozen=True)
class KernelStandin:
    """One distribution unpacked for the probe."""

    dist: str
    version: str
    wheel: str
    root: Path
    modules: tuple[str, ...]
    requires: tuple[str, ...]
    real: bool = False  # a CPU dependency imported for real, not a stand-in

    def to_probe(self) -> dict[str, object]:
        return {
            "dist": self.dist,
            "version": self.version,
            "wheel": self.wheel,
            "roots": [str(self.root)],
            "modules": list(self.modules),
            "real": self.real,
        }


@dataclass(frozen=True)
class KernelStandins:
    """The stand-ins for one release, and the packages that could not be had."""

    packages: tuple[KernelStandin, ...]
    missing: tuple[tuple[str, str], ...]  # (requirement, why)
    site: Path | None = None  # every package's files in one folder, as an install has them

    def import_names(self) -> set[str]:
        return {m for p in self.packages for m in p.modules if not p.real}

    def to_probe(self) -> list[dict[str, object]]:
        return [p.to_probe() for p in self.packages]

    def to_json(self) -> JsonObject:
        return {
            "packages": [
                f"{p.dist}=={p.version} ({p.wheel}{', real' if p.real else ''})"
                for p in self.packages
            ],
            "missing": [{"requirement": r, "why": w} for r, w in self.missing],
            "site": str(self.site) if self.site else None,
        }


def _wheel_top_level(names: Iterable[str]) -> list[str]:
    """Import names a wheel provides: top-level modules, and folders holding Python."""
    tops: set[str] = set()
    for name in names:
        parts = PurePosixPath(name).parts
        if len(parts) == 1 and name.endswith((".py", ".so")):
            tops.add(parts[0].split(".")[0])
        elif len(parts) > 1 and name.endswith(".py") and "." not in parts[0]:
            tops.add(parts[0])
    return sorted(tops)


def _unpack(wheel: Path, dest: Path, *, real: bool) -> tuple[list[str], list[str]]:
    """Python files and small data as they are; binaries as placeholder + index (a real
    dependency: everything as it is)."""
    with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
        names = [i.filename for i in archive.infolist() if not i.is_dir()]
        for info in archive.infolist():
            name = info.filename
            if info.is_dir() or ".." in PurePosixPath(name).parts or name.startswith("/"):
                continue
            target = dest / name
            if real:
                archive.extract(info, dest)
                if is_native(name):
                    target.chmod(0o755)
            elif is_native(name):
                scratch = Path(tmp) / "binary"
                with archive.open(info) as source, scratch.open("wb") as sink:
                    shutil.copyfileobj(source, sink, 1 << 20)
                target.parent.mkdir(parents=True, exist_ok=True)
                index = {"file": name, **index_binary(scratch)}
                Path(str(target) + SIDECAR).write_text(json.dumps(index), encoding="utf-8")
                target.write_bytes(PLACEHOLDER)
                scratch.unlink()
            elif not _NOT_UNPACKED.search(name) and info.file_size <= _MAX_MEMBER:
                archive.extract(info, dest)
        metadata = next((n for n in names if re.fullmatch(r"[^/]+\.dist-info/METADATA", n)), "")
        text = archive.read(metadata).decode("utf-8", "replace") if metadata else ""
    requires = [
        line.split(":", 1)[1].strip()
        for line in text.splitlines()
        if line.startswith("Requires-Dist:")
    ]
    return _wheel_top_level(names), requires


def _download(requirement: str, into: Path, *, real: bool) -> tuple[Path, IndexFile] | str:
    """The Spark's wheel of a CUDA package, this host's wheel of a real dependency: checked
    against the index's sha256; or why it cannot be had."""
    args = [] if real else list(PLATFORM_ARGS)
    found = on_index(requirement, args)
    if isinstance(found, str):
        return found
    got = download(found, args, into)
    return got if isinstance(got, str) else (got, found)


def _parse_wheel_name(wheel: str) -> tuple[str, str]:
    dist, version = wheel.split("-")[:2]
    return str(canonicalize_name(dist)), version


class StandinCache:
    """``$CACHE/preflight-kernels``: one directory per wheel, and what each requirement
    resolved to (so a warm run asks no registry)."""

    def __init__(self, root: Path) -> None:
        self.root = root

    def _resolved_file(self, requirement: str, real: bool) -> Path:
        where = "host" if real else PLATFORM_ARGS
        key = hashlib.sha256(f"{_LAYOUT}\n{requirement}\n{where}".encode()).hexdigest()
        return self.root / "resolved" / f"{key[:24]}.json"

    def get(self, requirement: str, *, real: bool = False) -> KernelStandin | str:
        """The stand-in (or, ``real``, the real package) for ``requirement``, or why it
        cannot be had."""
        cachetrust.private_dir(self.root, "the kernel stand-in cache")
        resolved = self._resolved_file(requirement, real)
        record = cachetrust.read_manifest(resolved)
        if record is not None and record.get("requirement") == requirement:
            found = self._load(str(record.get("wheel")), requirement)
            if found is not None:
                return found
        with (
            FileLock(str(self.root / ".lock")),
            tempfile.TemporaryDirectory(dir=self.root, prefix=".dl-") as tmp,
        ):
            got = _download(requirement, Path(tmp), real=real)
            if isinstance(got, str):
                return got
            wheel, index = got
            made = self._load(wheel.stem, requirement) or self._make(wheel, index, real=real)
            cachetrust.private_dir(resolved.parent, "the kernel stand-in cache")
            cachetrust.write_manifest(resolved, {"requirement": requirement, "wheel": wheel.stem})
            return made

    def _folder(self, stem: str) -> Path:
        return self.root / f"{stem}.i{INDEX_VERSION}.m{_LAYOUT}"

    def _load(self, stem: str, requirement: str | None = None) -> KernelStandin | None:
        """The stand-in made from the wheel ``stem``, when it passes its checks (for
        ``requirement``: a version it allows); else None, a failing one removed."""
        folder = self._folder(stem)
        if Path(stem).name != stem or not os.path.lexists(folder):
            return None
        data = cachetrust.read_manifest(folder / _READY)
        why = _standin_problem(folder, data, stem, requirement)
        if why is not None or data is None:
            cachetrust.discard(folder, "the kernel stand-in", why or "no manifest")
            return None
        return KernelStandin(
            dist=data["dist"],
            version=data["version"],
            wheel=stem + ".whl",
            root=folder,
            modules=tuple(data["modules"]),
            requires=tuple(data["requires"]),
            real=bool(data.get("real")),
        )

    def _make(self, wheel: Path, index: IndexFile, *, real: bool) -> KernelStandin:
        dist, version = _parse_wheel_name(wheel.name)
        what = "dependency" if real else "stand-in"
        console.err.print(f"preflight: unpacking the {dist} {version} {what} ({wheel.name})")
        target = self._folder(wheel.stem)
        work = target.with_name(target.name + f".tmp{os.getpid()}")
        shutil.rmtree(work, ignore_errors=True)
        modules, requires = _unpack(wheel, work, real=real)
        cachetrust.seal_modes(work)
        ready: dict[str, object] = {"dist": dist, "version": version, "real": real}
        ready |= {"modules": modules, "requires": requires, "wheel": index.to_json()}
        ready["files"] = cachetrust.file_hashes(work)
        cachetrust.write_manifest(work / _READY, ready)
        shutil.rmtree(target, ignore_errors=True)
        work.rename(target)
        made = self._load(wheel.stem)
        assert made is not None
        return made


def _standin_problem(
    folder: Path, data: Mapping[str, object] | None, stem: str, requirement: str | None
) -> str | None:
    """Why the stand-in ``folder`` is not the one its manifest says it was made from."""
    why = cachetrust.chain_problem(folder)
    if why is not None:
        return why
    if data is None:
        return "it has no manifest, or not the one it was written with (unfinished?)"
    wheel = data.get("wheel")
    if not isinstance(wheel, dict) or wheel.get("file") != stem + ".whl":
        return "its manifest is for another wheel"
    if requirement is not None and not Requirement(requirement).specifier.contains(
        str(data.get("version")), prereleases=True
    ):
        return f"it holds {data.get('version')}, which {requirement} does not allow"
    files = data.get("files")
    if not isinstance(files, dict):
        return "its manifest lists no files"
    return cachetrust.files_problem(folder, files, skip=frozenset({_READY}))


def _wanted(requirement: Requirement, extras: set[str]) -> bool:
    if requirement.marker is None:
        return True
    return any(
        requirement.marker.evaluate({**TARGET_ENV, "extra": extra}) for extra in extras or {""}
    )


def kernel_standins(root: Path, requirements: Iterable[str], have: Iterable[str]) -> KernelStandins:
    """Stand-ins for ``requirements`` (the left-out pins), with their dependencies that
    neither the venv (``have``: distribution names) nor another stand-in provides, cached
    under ``root``."""
    cache = StandinCache(root)
    present = {str(canonicalize_name(h)) for h in have}
    queue: list[tuple[str, set[str]]] = []
    for line in requirements:
        req = Requirement(line)
        if canonicalize_name(req.name) not in NOT_STOOD_IN:
            queue.append((_pin(req), set(req.extras)))
    packages: dict[str, KernelStandin] = {}
    missing: list[tuple[str, str]] = []
    seen: set[str] = set()
    while queue:
        line, extras = queue.pop(0)
        name = str(canonicalize_name(Requirement(line).name))
        if name in seen or name in present:
            continue
        seen.add(name)
        if CUDA_LIBRARIES.match(name) or name in NOT_STOOD_IN:
            continue
        got = cache.get(line, real=not is_cuda_package(name))
        if isinstance(got, str):
            missing.append((line, got))
            continue
        packages[name] = got
        for dep_line in got.requires:
            try:
                dep = Requirement(dep_line)
            except InvalidRequirement:
                continue
            if _wanted(dep, extras):
                queue.append((_pin(dep), set(dep.extras)))
    found = tuple(packages.values())
    return KernelStandins(found, tuple(missing), merged_site(cache.root, found))


def merged_site(root: Path, packages: tuple[KernelStandin, ...]) -> Path | None:
    """One site directory of links to every package's files, later packages over earlier
    ones as pip installs them: packages that share a folder (the CuTe DSL's libs-base,
    libs-core and libs-cu13 all fill ``nvidia_cutlass_dsl/``) meet as they do when
    installed, and their ``.pth`` files are processed. Links resolve into each package's
    own directory, which is how the probe knows whose binary a path is. Its manifest lists
    every link; a site whose links are not those is made again."""
    if not packages:
        return None
    # By the packages' folders, which carry the index version: links into old ones are stale.
    key = hashlib.sha256("\n".join(str(p.root) for p in packages).encode()).hexdigest()[:24]
    sites = cachetrust.private_dir(root / "sites", "the kernel stand-in cache")
    site = sites / key
    if os.path.lexists(site):
        why = _site_problem(site, packages)
        if why is None:
            return root / "sites" / key
        cachetrust.discard(site, "the stand-ins' site", why)
    work = site.with_name(f"{key}.tmp{os.getpid()}")
    shutil.rmtree(work, ignore_errors=True)
    links: dict[str, str] = {}
    for package in packages:
        for path in package.root.rglob("*"):
            if path.is_dir() or path.name == _READY or cachetrust.PYCACHE in path.parts:
                continue
            relative = path.relative_to(package.root)
            link = work / relative
            link.parent.mkdir(parents=True, exist_ok=True)
            link.unlink(missing_ok=True)
            link.symlink_to(path)
            links[str(relative)] = str(path)
    cachetrust.seal_modes(work)
    cachetrust.write_manifest(
        work / _READY, {"wheels": [p.wheel for p in packages], "links": links}
    )
    shutil.rmtree(site, ignore_errors=True)
    work.rename(site)
    return root / "sites" / key


def _site_problem(site: Path, packages: tuple[KernelStandin, ...]) -> str | None:
    """Why ``site`` is not the links its manifest lists, each into one of ``packages``."""
    data = cachetrust.read_manifest(site / _READY)
    if data is None or data.get("wheels") != [p.wheel for p in packages]:
        return "its manifest is missing, or for other stand-ins"
    links = data.get("links")
    if not isinstance(links, dict):
        return "its manifest lists no links"
    roots = [p.root.resolve() for p in packages]

    def same(link: str, target: str) -> bool:
        if not os.path.islink(link) or os.readlink(link) != target:
            return False
        return any(Path(target).resolve().is_relative_to(r) for r in roots)

    return cachetrust.files_problem(
        site, links, skip=frozenset({_READY}), same=same, within=root_of(packages)
    )


def root_of(packages: tuple[KernelStandin, ...]) -> Path:
    """The stand-in cache the packages' folders are in."""
    return packages[0].root.parent


def is_cuda_package(name: str) -> bool:
    if name in REAL_ON_CPU:
        return False
    return name in CUDA_ONLY or name in STANDIN_ALSO_INSTALLED or bool(CUDA_PACKAGE.search(name))


def _pin(req: Requirement) -> str:
    """The requirement without extras or markers, as pip downloads it."""
    return f"{req.name}{req.specifier}"


__all__ = [
    "REAL_ON_CPU",
    "KernelStandin",
    "KernelStandins",
    "StandinCache",
    "kernel_standins",
    "merged_site",
]
