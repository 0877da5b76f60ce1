"""Cached local venvs for preflight: one per engine version and dependency set.

A venv is made under a file lock in a temporary directory and renamed into place only when
complete, so an interrupted install is redone, never reused. A requirement that pip cannot
install here (no wheel for this CPU, a build failure) is recorded as unavailable: checks that
need it report a skip naming it, never a pass.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from sparkbuild import console
from sparkbuild.errors import PreflightSetupError
from sparkbuild.preflight.deps import TORCH, DependencySet

_MANIFEST = "sparkbuild-preflight.json"
_DISTRIBUTIONS = "sparkbuild-distributions.json"
_BASE = "torch-" + "-".join(r.replace("==", "") for r in TORCH)
# PyPI's builds of these do not match the shared torch (a dependency such as timm pulls them).
_DROP_AFTER = ("torchaudio", "torchcodec")
_PYTHON = os.environ.get("SPARKBUILD_PREFLIGHT_PYTHON", "python3.11")


@dataclass(frozen=True)
class LocalVenv:
    path: Path
    deps: DependencySet
    unavailable: tuple[str, ...]  # requirements pip could not install on this machine

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def distributions(self) -> list[str]:
        """Every distribution the venv's Python sees (the shared torch venv included),
        listed once and kept beside the manifest."""
        listed = self.path / _DISTRIBUTIONS
        if not listed.is_file():
            code = (
                "import importlib.metadata as m, json; "
                "print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions()})))"
            )
            done = subprocess.run(
                [str(self.python), "-c", code], capture_output=True, text=True, check=True
            )
            tmp = listed.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(done.stdout, encoding="utf-8")
            tmp.replace(listed)
        return [str(n) for n in json.loads(listed.read_text(encoding="utf-8")) if n]


def venv_dir(root: Path, deps: DependencySet) -> Path:
    return root / f"{deps.engine}-{deps.version}-{deps.digest.removeprefix('sha256:')[:16]}"


def ensure_venv(root: Path, deps: DependencySet) -> LocalVenv:
    """The venv for ``deps`` under ``root``, created on first use."""
    target = venv_dir(root, deps)
    if not (target / _MANIFEST).exists():
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if not (target / _MANIFEST).exists():
                _create(target, deps)
    manifest = json.loads((target / _MANIFEST).read_text(encoding="utf-8"))
    return LocalVenv(target, deps, tuple(manifest.get("unavailable", [])))


def _pip(python: Path, args: list[str], constraints: Path) -> subprocess.CompletedProcess[str]:
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    cmd += ["--constraint", str(constraints), *args]
    return subprocess.run(cmd, capture_output=True, text=True, check=False)


def _new_venv(target: Path) -> Path:
    shutil.rmtree(target, ignore_errors=True)
    interpreter = shutil.which(_PYTHON) or sys.executable
    subprocess.run([interpreter, "-m", "venv", str(target)], check=True, capture_output=True)
    return target / "bin" / "python"


def _site_packages(python: Path) -> Path:
    code = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
    out = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return Path(out.stdout.strip())


def ensure_torch_base(root: Path, constraints: Path) -> Path:
    """The one venv holding torch and torchvision (5 GB), shared by every preflight venv."""
    base = root / _BASE
    if (base / _MANIFEST).exists():
        return _site_packages(base / "bin" / "python")
    with FileLock(str(base) + ".lock"):
        if not (base / _MANIFEST).exists():
            console.err.print(f"preflight: creating the shared torch venv at {base}")
            python = _new_venv(base)
            done = _pip(python, list(TORCH), constraints)
            if done.returncode != 0:
                raise PreflightSetupError(
                    f"cannot install {' '.join(TORCH)} into {base}:\n{done.stderr[-2000:]}",
                    "check that pip finds the torch wheels (`pip config list`)",
                )
            (base / _MANIFEST).write_text(json.dumps({"torch": list(TORCH)}), encoding="utf-8")
    return _site_packages(base / "bin" / "python")


def _create(target: Path, deps: DependencySet) -> None:
    # A venv's scripts hold absolute paths, so it is built at its final path; the manifest,
    # written last, marks it complete.
    console.err.print(f"preflight: creating the {deps.engine} {deps.version} venv at {target}")
    with tempfile.TemporaryDirectory(prefix="sparkbuild-pf-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join(TORCH) + "\n", encoding="utf-8")
        torch_site = ensure_torch_base(target.parent, constraints)
        python = _new_venv(target)
        # Appended to sys.path after the venv's own site-packages: torch comes from the base.
        (_site_packages(python) / "sparkbuild-torch.pth").write_text(f"{torch_site}\n")
        unavailable = _install_all(python, list(deps.requirements), constraints)
    drop = [str(python), "-m", "pip", "uninstall", "-y", "-q", *_DROP_AFTER]
    subprocess.run(drop, check=False, capture_output=True)
    manifest = {"deps": deps.to_json(), "unavailable": unavailable}
    (target / _MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def _install_all(python: Path, requirements: list[str], constraints: Path) -> list[str]:
    """Install everything at once; if that fails, one by one to name what cannot install."""
    if _pip(python, requirements, constraints).returncode == 0:
        return []
    unavailable = []
    for requirement in requirements:
        result = _pip(python, [requirement], constraints)
        if result.returncode != 0:
            unavailable.append(requirement)
    return unavailable


__all__ = ["LocalVenv", "ensure_venv", "venv_dir"]
