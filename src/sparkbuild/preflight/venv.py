"""Cached local venvs for preflight: one per engine version and dependency set.

A venv is made under a file lock and marked complete by its manifest, written last, so an
interrupted install is redone, never reused. A requirement that pip cannot install here (no
wheel for this CPU, a build failure) is recorded as unavailable: checks that need it report a
skip naming it, never a pass.

Before a venv's ``bin/python`` runs, the venv proves itself (``sparkbuild/cachetrust.py``;
docs/preflight.md, "What the caches trust"): its directories are the user's and written by
no one else, its manifest is intact and names what it was made from (the dependency set's
digest, the venv it is a layer over, the interpreter), ``bin/python`` resolves to that
interpreter, and the files Python reads before any import (``pyvenv.cfg``, ``.pth`` files,
``sitecustomize``) are the ones it was made with. The gigabytes of installed packages are
not hashed on each run: a warm check costs milliseconds; what is in site-packages is
trusted as far as the directories are (only the user could have changed it, and the user
can run code anyway). A venv that fails is made again, with a note.

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
from typing import Any

from filelock import FileLock

from sparkbuild import cachetrust, console
from sparkbuild.errors import PreflightSetupError
from sparkbuild.preflight.deps import TORCH, DependencySet, requirement_name

_MANIFEST = "sparkbuild-preflight.json"
# The manifest's layout, in every venv's name too: venvs made before their manifests were
# checked (layout 1) are left where they are, never used nor removed under a run of an
# older sparkbuild that shares the cache.
_LAYOUT = 2
_BASE = f"torch-m{_LAYOUT}-" + "-".join(r.replace("==", "") for r in TORCH)
_STARTUP = ("sitecustomize.py", "usercustomize.py")  # run by site at startup, as .pth files are
Manifest = dict[str, Any]
# PyPI's builds of these do not match the shared torch (a dependency such as timm pulls them).
_DROP_AFTER = ("torchaudio", "torchcodec")
_PYTHON = os.environ.get("SPARKBUILD_PREFLIGHT_PYTHON", "python3.11")


@dataclass(frozen=True)
class LocalVenv:
    path: Path
    deps: DependencySet
    unavailable: tuple[str, ...]  # requirements pip could not install on this machine
    layer_over: Path | None = None  # the release's venv this one is a layer of pins over
    installed: tuple[str, ...] = ()  # every distribution its Python sees (torch's too)

    @property
    def python(self) -> Path:
        return self.path / "bin" / "python"

    def distributions(self) -> list[str]:
        """Every distribution the venv's Python sees (the shared torch venv included), as
        its manifest lists them."""
        return list(self.installed)


def _installed(python: Path) -> list[str]:
    code = (
        "import importlib.metadata as m, json; "
        "print(json.dumps(sorted({d.metadata['Name'] for d in m.distributions()})))"
    )
    done = subprocess.run([str(python), "-c", code], capture_output=True, text=True, check=True)
    return [str(n) for n in json.loads(done.stdout) if n]


def _short(deps: DependencySet) -> str:
    return deps.digest.removeprefix("sha256:")[:16]


def _layer_over(deps: DependencySet, release: DependencySet | None) -> DependencySet | None:
    """``release`` where ``deps`` differs from it (a build's pins changed the set), so
    ``deps``'s venv is a layer over the release's; None where ``deps`` is the release's own."""
    return release if release is not None and release.digest != deps.digest else None


def venv_dir(root: Path, deps: DependencySet, release: DependencySet | None = None) -> Path:
    """``deps``'s venv; a layer over ``release``'s venv names that venv too."""
    name = f"{deps.engine}-{deps.version}-m{_LAYOUT}-{_short(deps)}"
    over = _layer_over(deps, release)
    if over is not None:
        name += f"-over-{_short(over)[:8]}"
    return root / name


def ensure_venv(root: Path, deps: DependencySet, release: DependencySet | None = None) -> LocalVenv:
    """The venv for ``deps`` under ``root``, created on first use (and again when it fails
    its checks): a layer over the venv of ``release`` (the release's own set, which ``deps``
    adds a build's pins to) where the two differ."""
    cachetrust.private_dir(root, "the preflight venv cache")
    over = _layer_over(deps, release)
    base = ensure_venv(root, over) if over is not None else None
    target = venv_dir(root, deps, release)
    made_from = {"deps": deps.digest, "layer_over": str(base.path) if base else None}
    manifest = _trusted(target, made_from)
    if manifest is None:
        with FileLock(str(target) + ".lock"):
            manifest = _trusted(target, made_from, say=True)
            if manifest is None:
                _create(target, deps, base, made_from)
                manifest = _trusted(target, made_from)
    if manifest is None:  # made just now, and still not what it was made as
        raise PreflightSetupError(f"the venv made at {target} does not pass its own checks")
    unavailable = tuple(manifest.get("unavailable", []))
    installed = tuple(manifest.get("distributions", []))
    if base is None:
        return LocalVenv(target, deps, unavailable, installed=installed)
    return LocalVenv(target, deps, (*base.unavailable, *unavailable), base.path, installed)


def _trusted(target: Path, made_from: Manifest, *, say: bool = False) -> Manifest | None:
    """``target``'s manifest when the venv passes its checks; else None (with ``say``: the
    venv is removed, saying why, to be made again)."""
    if not os.path.lexists(target):
        return None
    manifest = cachetrust.read_manifest(target.resolve() / _MANIFEST)
    why = _problem(target, manifest, made_from)
    if why is None:
        return manifest
    if say:
        cachetrust.discard(target, "the preflight venv", why)
    return None


def _problem(target: Path, manifest: Manifest | None, made_from: Manifest) -> str | None:
    """Why the venv at ``target`` is not the one its manifest says, or None."""
    why = cachetrust.chain_problem(target)
    if why is not None:
        return why
    if manifest is None:
        return "it has no manifest, or not the one it was written with (an unfinished venv?)"
    if manifest.get("layout") != _LAYOUT or manifest.get("made_from") != made_from:
        return "its manifest is for something else"
    real = target.resolve()
    site = real / str(manifest.get("site", ""))
    if not site.resolve().is_relative_to(real):
        return f"its site-packages {site} is outside it"
    for directory in (real / "bin", site):
        why = cachetrust.path_problem(directory)
        if why is not None:
            return f"{directory.relative_to(real)} {why}"
    interpreter = Path(str(manifest.get("interpreter")))
    if (real / "bin" / "python").resolve() != interpreter:
        return f"bin/python is not the interpreter it was made with ({interpreter})"
    why = cachetrust.chain_problem(interpreter, own=False)
    if why is not None:
        return f"its interpreter {interpreter} {why}"
    try:
        startup = _startup_files(real, site)
    except OSError as exc:
        return f"cannot read what Python reads at startup ({exc.strerror or exc})"
    if startup != manifest.get("startup"):
        return "a file Python runs at startup (pyvenv.cfg, a .pth, sitecustomize) has changed"
    return None


def _startup_files(venv: Path, site: Path) -> dict[str, str]:
    """What the interpreter reads before any import of ours, by sha256: ``pyvenv.cfg`` (its
    home: which Python), and site-packages' ``.pth`` files and sitecustomize (run at startup)."""
    found = {"pyvenv.cfg": cachetrust.sha256_of(venv / "pyvenv.cfg")}
    for path in sorted(site.iterdir()):
        if path.suffix == ".pth" or path.name in _STARTUP:
            if path.is_symlink() or not path.is_file():
                found[str(path.relative_to(venv))] = "not a regular file"
            else:
                found[str(path.relative_to(venv))] = cachetrust.sha256_of(path)
    return found


def _seal(target: Path, python: Path, made_from: Manifest, **more: object) -> None:
    """The manifest, written last: what the venv was made from and what it runs at startup
    (nothing in it writable by others, whatever the umask it was made under)."""
    cachetrust.seal_modes(target)
    site = _site_packages(python)
    body = {"layout": _LAYOUT, "made_from": made_from, "interpreter": str(python.resolve())}
    body |= {"site": str(site.relative_to(target)), "startup": _startup_files(target, site)}
    cachetrust.write_manifest(target / _MANIFEST, {**body, **more})


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
    """The one venv holding torch and torchvision (5 GB), shared by every preflight venv;
    returns its site-packages."""
    base = root / _BASE
    made_from = {"torch": list(TORCH)}
    manifest = _trusted(base, made_from)
    if manifest is None:
        with FileLock(str(base) + ".lock"):
            manifest = _trusted(base, made_from, say=True)
            if manifest is None:
                console.err.print(f"preflight: creating the shared torch venv at {base}")
                python = _new_venv(base)
                done = _pip(python, list(TORCH), constraints)
                if done.returncode != 0:
                    raise PreflightSetupError(
                        f"cannot install {' '.join(TORCH)} into {base}:\n{done.stderr[-2000:]}",
                        "check that pip finds the torch wheels (`pip config list`)",
                    )
                _seal(base, python, made_from)
                manifest = _trusted(base, made_from)
    if manifest is None:
        raise PreflightSetupError(f"the torch venv made at {base} does not pass its own checks")
    return base.resolve() / str(manifest["site"])


def _create(target: Path, deps: DependencySet, base: LocalVenv | None, made_from: Manifest) -> None:
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
    more: Manifest = {"deps": deps.to_json(), "unavailable": unavailable}
    if base is not None:
        more["layer_over"] = str(base.path)
    _seal(target, python, made_from, **more, distributions=_installed(python))


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
