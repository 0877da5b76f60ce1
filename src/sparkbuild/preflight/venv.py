"""Cached local venvs for preflight: one per engine version and dependency set.

A venv is made under a file lock and marked complete by its manifest, written last, so an
interrupted install is redone, never reused. A requirement that pip cannot install here (no
wheel for this CPU, a build failure) is recorded as unavailable: checks that need it report a
skip naming it, never a pass.

Venvs are layered, as the releases share their files: torch (5 GB) is one base venv for all;
each release's own dependency set is a venv over it (about 1.3 GB); a build whose
``requirements:`` pins change that set is a small layer over its release's venv, holding
only the pins and what they pull in, resolved with the release's other pins as constraints.
Builds of one release then share its venv, and a pin costs seconds, not a whole install.
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
from sparkbuild.preflight.deps import TORCH, DependencySet, requirement_name

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
    layer_over: Path | None = None  # the release's venv this one is a layer of pins over

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


def _short(deps: DependencySet) -> str:
    return deps.digest.removeprefix("sha256:")[:16]


def _layer_over(deps: DependencySet, release: DependencySet | None) -> DependencySet | None:
    """``release`` where ``deps`` differs from it (a build's pins changed the set), so
    ``deps``'s venv is a layer over the release's; None where ``deps`` is the release's own."""
    return release if release is not None and release.digest != deps.digest else None


def venv_dir(root: Path, deps: DependencySet, release: DependencySet | None = None) -> Path:
    """``deps``'s venv; a layer over ``release``'s venv names that venv too."""
    name = f"{deps.engine}-{deps.version}-{_short(deps)}"
    over = _layer_over(deps, release)
    if over is not None:
        name += f"-over-{_short(over)[:8]}"
    return root / name


def ensure_venv(root: Path, deps: DependencySet, release: DependencySet | None = None) -> LocalVenv:
    """The venv for ``deps`` under ``root``, created on first use: a layer over the venv of
    ``release`` (the release's own set, which ``deps`` adds a build's pins to) where the
    two differ."""
    over = _layer_over(deps, release)
    base = ensure_venv(root, over) if over is not None else None
    target = venv_dir(root, deps, release)
    if not (target / _MANIFEST).exists():
        root.mkdir(parents=True, exist_ok=True)
        with FileLock(str(target) + ".lock"):
            if not (target / _MANIFEST).exists():
                _create(target, deps, base)
    manifest = json.loads((target / _MANIFEST).read_text(encoding="utf-8"))
    unavailable = tuple(manifest.get("unavailable", []))
    if base is None:
        return LocalVenv(target, deps, unavailable)
    return LocalVenv(target, deps, (*base.unavailable, *unavailable), base.path)


def _pip(python: Path, args: list[str], constraints: Path) -> subprocess.CompletedProcess[str]:
    # --no-compile: pip byte-compiles every file it installs, most never imported (40 % of
    # a release venv's install CPU). The probe runs `python -I`, which writes the .pyc of
    # what it imports even under PYTHONDONTWRITEBYTECODE, so that is compiled once, lazily.
    cmd = [str(python), "-m", "pip", "install", "--disable-pip-version-check", "--quiet"]
    cmd += ["--no-compile"]
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


def _create(target: Path, deps: DependencySet, base: LocalVenv | None) -> None:
    # A venv's scripts hold absolute paths, so it is built at its final path; the manifest,
    # written last, marks it complete.
    what = f"a layer of its pins over {base.path.name}" if base else "the release's dependencies"
    console.err.print(
        f"preflight: creating the {deps.engine} {deps.version} venv at {target} ({what})"
    )
    with tempfile.TemporaryDirectory(prefix="sparkbuild-pf-") as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join(TORCH) + "\n", encoding="utf-8")
        torch_site = ensure_torch_base(target.parent, constraints)
        python = _new_venv(target)
        site = _site_packages(python)
        if base is None:
            # Appended to sys.path after the venv's own site-packages: torch from its venv.
            (site / "sparkbuild-torch.pth").write_text(f"{torch_site}\n", encoding="utf-8")
            wanted = list(deps.requirements)
        else:
            # addsitedir, not a plain path line: the base's own .pth files (torch's among
            # them) are processed too, so the layer sees the base, then torch, behind itself.
            base_site = _site_packages(base.python)
            line = f"import site; site.addsitedir({str(base_site)!r})\n"
            (site / "sparkbuild-layer.pth").write_text(line, encoding="utf-8")
            wanted = _layer_requirements(deps, base.deps)
            pinned = {requirement_name(w) for w in wanted}
            kept = [r for r in base.deps.requirements if requirement_name(r) not in pinned]
            constraints.write_text("\n".join([*TORCH, *kept]) + "\n", encoding="utf-8")
        unavailable = _install_all(python, wanted, constraints) if wanted else []
    drop = [str(python), "-m", "pip", "uninstall", "-y", "-q", *_DROP_AFTER]
    subprocess.run(drop, check=False, capture_output=True)
    manifest: dict[str, object] = {"deps": deps.to_json(), "unavailable": unavailable}
    if base is not None:
        manifest["layer_over"] = str(base.path)
    (target / _MANIFEST).write_text(json.dumps(manifest, indent=2), encoding="utf-8")


def _layer_requirements(deps: DependencySet, release: DependencySet) -> list[str]:
    """What a build's pins add to or change in its release's set."""
    own = set(release.requirements)
    return [r for r in deps.requirements if r not in own]


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
