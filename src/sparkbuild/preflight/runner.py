"""Where the probe runs: a local interpreter (a cached venv) or the built image, no GPU.

Both hand the same plan to the same script (``data/preflight/probe.py``) and read the same
JSON back, so the checks and verdicts do not depend on where they ran.
"""

from __future__ import annotations

import hashlib
import json
import shutil
import subprocess
import tempfile
from collections.abc import Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any, Protocol

from sparkbuild.errors import PreflightSetupError, ProbeError

MARKER = "@@SPARKBUILD-PREFLIGHT@@"
PROBE = "data/preflight/probe.py"
# One probe run imports much of the engine; generous, but a hang must not block CI forever.
TIMEOUT_S = 1800


class ProbeTarget(Protocol):
    @property
    def where(self) -> str: ...

    def run(self, plan: Mapping[str, object]) -> dict[str, Any]: ...


# The probe's stand-ins for kernel binaries (the package preflight/native), shipped beside it
# under this name.
NATIVE_PACKAGE = "sparkbuild_native"


def probe_source() -> str:
    return resources.files("sparkbuild").joinpath(PROBE).read_text(encoding="utf-8")


def _native_sources() -> dict[str, str]:
    """The stand-in package's modules by file name, in a stable order."""
    package = resources.files("sparkbuild.preflight.native")
    files = sorted((f for f in package.iterdir() if f.name.endswith(".py")), key=lambda f: f.name)
    return {f.name: f.read_text(encoding="utf-8") for f in files}


def probe_digest() -> str:
    """The probe's code (with its stand-in package): cached results depend on it."""
    parts = [probe_source(), *(f"{name}\0{text}" for name, text in _native_sources().items())]
    return hashlib.sha256("\0".join(parts).encode()).hexdigest()


def write_native(directory: Path, name: str = NATIVE_PACKAGE) -> Path:
    """The stand-in package as ``directory/name``, importable as ``name`` from there."""
    package = directory / name
    package.mkdir()
    for file, text in _native_sources().items():
        (package / file).write_text(text, encoding="utf-8")
    return package


def write_probe(directory: Path) -> Path:
    """The probe and its stand-in package in ``directory``; returns the probe's path."""
    write_native(directory)
    probe = directory / "probe.py"
    probe.write_text(probe_source(), encoding="utf-8")
    return probe


def parse_output(stdout: str, stderr: str, where: str) -> dict[str, object]:
    _, sep, tail = stdout.rpartition(MARKER + "\n")
    if not sep:
        raise ProbeError(
            f"preflight probe in {where} ended without a report:\n{stderr[-3000:]}",
            "run it again with --json-file FILE and read the probe's stderr above",
        )
    try:
        data = json.loads(tail)
    except json.JSONDecodeError as exc:
        raise ProbeError(f"preflight probe in {where} printed a bad report ({exc})") from exc
    if not isinstance(data, dict):
        raise ProbeError(f"preflight probe in {where} printed a bad report")
    return data


@dataclass(frozen=True)
class LocalTarget:
    """``python`` runs the probe; ``package_root`` (holding the package dir) goes first on
    sys.path, so the prepared tree stands in for the installed package."""

    python: Path
    package_root: Path | None
    where: str = "venv"

    def run(self, plan: Mapping[str, object]) -> dict[str, Any]:
        with tempfile.TemporaryDirectory(prefix="sparkbuild-preflight-") as tmp:
            probe = write_probe(Path(tmp))
            full = {**plan, "workdir": str(Path(tmp) / "work")}
            if self.package_root is not None:
                full["package_root"] = str(self.package_root)
            plan_file = Path(tmp) / "plan.json"
            plan_file.write_text(json.dumps(full), encoding="utf-8")
            cmd = [str(self.python), "-I", str(probe), str(plan_file)]
            done = _run(cmd, f"{self.where} ({self.python})", cwd=Path(tmp))
        return parse_output(done.stdout, done.stderr, str(self.python))


@dataclass(frozen=True)
class ImageTarget:
    """The probe in ``docker run`` of the image: no GPU, no network, read-only mounts."""

    image: str
    docker: str = "docker"
    python: str = "python3"
    platform: str | None = None
    where: str = "image"
    extra_args: tuple[str, ...] = ()  # more `docker run` options (mounts, environment)

    def run(self, plan: Mapping[str, object]) -> dict[str, Any]:
        client = shutil.which(self.docker)
        if client is None:
            raise PreflightSetupError(
                f"no `{self.docker}` client on PATH to run preflight in image {self.image}",
                "install Docker, or preflight in a local venv (without --image)",
            )
        with tempfile.TemporaryDirectory(prefix="sparkbuild-preflight-") as tmp:
            write_probe(Path(tmp))
            full = {**plan, "workdir": "/tmp/sparkbuild-preflight"}
            Path(tmp, "plan.json").write_text(json.dumps(full), encoding="utf-8")
            cmd = [client, "run", "--rm", "--network", "none", "--entrypoint", self.python]
            cmd += ["--platform", self.platform] if self.platform else []
            cmd += [*self.extra_args, "-v", f"{tmp}:/sparkbuild-preflight:ro"]
            # `--`: an image name from the command line or a spec never becomes an option.
            cmd += ["--", self.image]
            cmd += ["/sparkbuild-preflight/probe.py", "/sparkbuild-preflight/plan.json"]
            done = _run(cmd, f"image {self.image}")
        return parse_output(done.stdout, done.stderr, f"image {self.image}")


def _run(cmd: list[str], where: str, cwd: Path | None = None) -> subprocess.CompletedProcess[str]:
    try:
        done = subprocess.run(
            cmd, capture_output=True, text=True, timeout=TIMEOUT_S, check=False, cwd=cwd
        )
    except subprocess.TimeoutExpired as exc:
        raise ProbeError(f"preflight probe in {where} did not finish in {TIMEOUT_S} s") from exc
    except OSError as exc:
        raise ProbeError(f"cannot start the preflight probe in {where}: {exc}") from exc
    if done.returncode != 0 and MARKER not in done.stdout:
        raise ProbeError(
            f"preflight probe in {where} failed (exit {done.returncode}):\n{done.stderr[-3000:]}",
            "the interpreter must be Python 3.10+ with the engine package importable",
        )
    return done


__all__ = [
    "ImageTarget",
    "LocalTarget",
    "ProbeTarget",
    "parse_output",
    "probe_digest",
    "probe_source",
    "write_native",
    "write_probe",
]
