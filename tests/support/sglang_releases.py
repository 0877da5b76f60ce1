"""A local git repository of real SGLang releases, built from their PyPI wheels.

No GitHub here, but every SGLang release from 0.5.10 on is on PyPI as a wheel holding the
`sglang/` package tree. `sglang_release_repo()` lays those trees out as the upstream git
repository does (`python/sglang/...`) with one commit and one tag `vX.Y.Z` per release, so
the real patch pipeline (checkout of a tag, `git apply`) runs against real upstream text.

Wheels from 0.5.11 on are platform wheels (`cp311-cp311-manylinux_2_34_*`) that also carry
compiled extension modules. We always download the linux/aarch64 CPython 3.11 wheel (what a
DGX Spark runs; 0.5.10 is `py3-none-any` and matches too). The git tree leaves out the
compiled modules (upstream git holds their sources, not the binaries) and the `.dist-info`;
`extract_wheel_package()` keeps both, as an installed package has them.

Everything is cached under `cache_dir` and built in a temporary directory that is renamed
into place under a file lock, so concurrent test processes never see a half-built result.
Commit and tag dates and identities are fixed, so the same version list gives the same
commit hashes on every machine.
"""

from __future__ import annotations
import __future__

import ast
import hashlib
import os
import re
import shutil
import subprocess
import sys
import tempfile
import zipfile
from pathlib import Path

from filelock import FileLock
from packaging.specifiers import SpecifierSet
from packaging.version import Version

from tests.support.gitrepos import git, git_env

__all__ = [
    "ALL_RELEASES",
    "applies_at_tag",
    "apply_patch",
    "checkout_release",
    "download_wheel",
    "extract_wheel_package",
    "load_definitions",
    "patch_when",
    "sglang_release_repo",
]

# Every SGLang release from 0.5.10 to the newest one checked (0.5.23), post releases included.
ALL_RELEASES = [
    "0.5.10",
    "0.5.10.post1",
    "0.5.11",
    "0.5.12",
    "0.5.12.post1",
    "0.5.13",
    "0.5.13.post1",
    "0.5.14",
    "0.5.15",
    "0.5.15.post1",
    "0.5.16",
    "0.5.17",
    "0.5.18",
    "0.5.19",
    "0.5.20",
    "0.5.21",
    "0.5.22",
    "0.5.23",
]

# Bump when the repository layout changes, so stale caches are not reused.
_LAYOUT = "1"
_PLATFORM_ARGS = (
    "--platform",
    "manylinux_2_34_aarch64",
    "--python-version",
    "3.11",
    "--implementation",
    "cp",
    "--abi",
    "cp311",
)
_COMPILED_SUFFIXES = (".so", ".pyd", ".dylib")
_BASE_EPOCH = 1_700_000_000  # 2023-11-14T22:13:20Z; release i is committed i days later


_LOCKS: dict[str, FileLock] = {}


def _lock(cache_dir: Path) -> FileLock:
    """One lock object per cache dir, so nested use in one process re-enters it."""
    cache_dir.mkdir(parents=True, exist_ok=True)
    path = str((cache_dir / ".sglang-releases.lock").resolve())
    return _LOCKS.setdefault(path, FileLock(path))


def _find_wheel(downloads: Path, version: str) -> Path | None:
    # "sglang-0.5.12-*" does not match "sglang-0.5.12.post1-*": the dash ends the version.
    found = sorted(downloads.glob(f"sglang-{version}-*.whl"))
    return found[0] if found else None


def _pip_download(version: str, dest: Path) -> None:
    cmd = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:"]
    cmd += [*_PLATFORM_ARGS, "--quiet", "--disable-pip-version-check", "-d", str(dest)]
    cmd.append(f"sglang=={version}")
    result = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise RuntimeError(f"pip download sglang=={version} failed:\n{result.stderr}")


def download_wheel(version: str, cache_dir: Path) -> Path:
    """The release's aarch64 CPython 3.11 wheel in `cache_dir/downloads/` (downloaded once)."""
    downloads = cache_dir / "downloads"
    wheel = _find_wheel(downloads, version)
    if wheel is not None:
        return wheel
    with _lock(cache_dir):
        return _download_locked(version, cache_dir)


def _download_locked(version: str, cache_dir: Path) -> Path:
    downloads = cache_dir / "downloads"
    downloads.mkdir(parents=True, exist_ok=True)
    wheel = _find_wheel(downloads, version)
    if wheel is not None:
        return wheel
    with tempfile.TemporaryDirectory(dir=downloads, prefix=".dl-") as tmp:
        _pip_download(version, Path(tmp))
        got = _find_wheel(Path(tmp), version)
        if got is None:
            raise RuntimeError(f"pip download gave no wheel for sglang=={version}")
        target = downloads / got.name
        os.replace(got, target)
    return target


def _package_members(wheel: zipfile.ZipFile, *, keep_all: bool) -> list[zipfile.ZipInfo]:
    members = []
    for info in wheel.infolist():
        top = info.filename.split("/", 1)[0]
        if info.is_dir():
            continue
        if top == "sglang":
            if keep_all or not info.filename.endswith(_COMPILED_SUFFIXES):
                members.append(info)
        elif keep_all and top.endswith(".dist-info"):
            members.append(info)
    return members


def _extract(wheel_path: Path, dest: Path, *, keep_all: bool) -> None:
    with zipfile.ZipFile(wheel_path) as wheel:
        for info in _package_members(wheel, keep_all=keep_all):
            wheel.extract(info, dest)


def extract_wheel_package(version: str, cache_dir: Path) -> Path:
    """A directory holding the release as installed: `sglang/` and `sglang-V.dist-info/`.

    Copy both into an image's site-packages to stand for the installed package.
    """
    target = cache_dir / "packages" / f"sglang-{version}"
    if target.is_dir():
        return target
    wheel = download_wheel(version, cache_dir)
    with _lock(cache_dir):
        if target.is_dir():
            return target
        target.parent.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=target.parent, prefix=".tmp-"))
        try:
            _extract(wheel, tmp, keep_all=True)
            os.replace(tmp, target)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return target


def _build_repo(repo: Path, versions: list[str], cache_dir: Path) -> None:
    work = repo.parent / (repo.name + ".work")
    git(repo.parent, "init", "--quiet", "--bare", "--initial-branch=main", str(repo))
    for i, version in enumerate(versions):
        wheel = download_wheel(version, cache_dir)
        shutil.rmtree(work, ignore_errors=True)
        _extract(wheel, work / "python", keep_all=False)
        date = f"@{_BASE_EPOCH + i * 86_400} +0000"
        dated = {"GIT_AUTHOR_DATE": date, "GIT_COMMITTER_DATE": date}
        in_work = (f"--git-dir={repo}", f"--work-tree={work}")
        git(work, *in_work, "add", "--all", ".", env=dated)
        message = f"SGLang {version} (python/sglang from the PyPI wheel)"
        commit = ["-c", "commit.gpgsign=false", "commit", "--quiet", "--allow-empty"]
        git(work, *in_work, *commit, "-m", message, env=dated)
        tag = ["-c", "tag.gpgsign=false", "tag", "-a", f"v{version}", "-m", f"v{version}"]
        git(work, *in_work, *tag, env=dated)
    shutil.rmtree(work, ignore_errors=True)
    git(repo, "gc", "--quiet", "--prune=now")


def sglang_release_repo(cache_dir: Path, versions: list[str]) -> Path:
    """A bare git repository with one commit and tag `vX.Y.Z` per release, on `main`.

    Releases are committed in version order; each commit's tree is `python/sglang/...`
    from that release's wheel. The path works as a git URL (`git clone PATH`).
    """
    ordered = sorted(set(versions), key=Version)
    if not ordered:
        raise ValueError("no versions given")
    key = hashlib.sha256("\n".join([_LAYOUT, *ordered]).encode()).hexdigest()[:16]
    repos = cache_dir / "repos"
    repo = repos / f"sglang-{ordered[0]}-{ordered[-1]}-{key}.git"
    if repo.is_dir():
        return repo
    for version in ordered:  # download outside the repo lock's critical section first
        download_wheel(version, cache_dir)
    with _lock(cache_dir):
        if repo.is_dir():
            return repo
        repos.mkdir(parents=True, exist_ok=True)
        tmp = Path(tempfile.mkdtemp(dir=repos, prefix=".tmp-"))
        try:
            _build_repo(tmp / "repo.git", ordered, cache_dir)
            os.replace(tmp / "repo.git", repo)
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return repo


def checkout_release(repo: Path, version: str, dest: Path) -> Path:
    """A work tree of the release tagged `vVERSION` in `repo`, cloned to `dest`."""
    cmd = ["git", "-c", "advice.detachedHead=false", "clone", "--quiet"]
    cmd += ["--branch", f"v{version}", str(repo), str(dest)]
    subprocess.run(cmd, env=git_env(), check=True, capture_output=True)
    return dest


def apply_patch(work_tree: Path, patch: Path, *, check_only: bool = False) -> bool:
    """`git apply` (no fuzz) of `patch` in `work_tree`; False when it does not apply."""
    cmd = ["git", "apply", *(["--check"] if check_only else []), str(patch.resolve())]
    result = subprocess.run(cmd, cwd=work_tree, env=git_env(), capture_output=True, check=False)
    return result.returncode == 0


def applies_at_tag(repo: Path, version: str, patch: Path) -> bool:
    """Whether `git apply` would take `patch` on tag `vVERSION`, without a work tree."""
    with tempfile.TemporaryDirectory(prefix="sparkbuild-index-") as tmp:
        index = {"GIT_INDEX_FILE": str(Path(tmp) / "index")}
        git(repo, "read-tree", f"v{version}", env=index)
        env = git_env(**index)
        cmd = ["git", f"--git-dir={repo}", "apply", "--cached", "--check", str(patch.resolve())]
        return subprocess.run(cmd, env=env, capture_output=True, check=False).returncode == 0


def applies_by_release(repo: Path, patch: Path) -> dict[str, bool]:
    """For every release in ALL_RELEASES: whether `patch` applies at its tag."""
    return {version: applies_at_tag(repo, version, patch) for version in ALL_RELEASES}


def patch_when(patch: Path) -> SpecifierSet:
    """The `when: "..."` specifier written in a patch's header."""
    header = patch.read_text().split("\ndiff --git ", 1)[0]
    found = re.search(r'^when:\s*"([^"]+)"', header, re.MULTILINE)
    if found is None:
        raise ValueError(f"{patch} has no when: line in its header")
    return SpecifierSet(found.group(1))


def load_definitions(
    source: Path,
    names: set[str],
    namespace: dict[str, object],
    *,
    class_name: str | None = None,
) -> dict[str, object]:
    """Execute only the named top-level functions (or methods of `class_name`) of a file.

    Lets a test run the real code of a release module whose imports (torch, CUDA) are not
    available here: `namespace` supplies the globals that code uses. Annotations are not
    evaluated. Returns `namespace`, now holding the functions (or the reduced class).
    """
    tree = ast.parse(source.read_text(), filename=str(source))
    body: list[ast.stmt]
    if class_name is None:
        body = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name in names]
        found = {n.name for n in body if isinstance(n, ast.FunctionDef)}
    else:
        cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == class_name)
        methods = [n for n in cls.body if isinstance(n, ast.FunctionDef) and n.name in names]
        found = {m.name for m in methods}
        reduced = ast.ClassDef(
            name=cls.name, bases=[], keywords=[], body=list(methods), decorator_list=[]
        )
        body = [reduced]
    if found != names:
        raise LookupError(f"{source}: not found: {sorted(names - found)}")
    module = ast.fix_missing_locations(ast.Module(body=body, type_ignores=[]))
    flags = __future__.annotations.compiler_flag
    exec(compile(module, str(source), "exec", flags=flags, dont_inherit=True), namespace)
    return namespace
