"""Entry points. Each session installs the package and hands its arguments to `sparkbuild`."""

from __future__ import annotations

import hashlib
import importlib.util
import os
from pathlib import Path

import nox

nox.options.sessions = ["tests"]
nox.options.reuse_existing_virtualenvs = True


def _cli(session: nox.Session, *args: str) -> None:
    _install(session)
    session.run("sparkbuild", *args, *session.posargs)


def _install(session: nox.Session) -> None:
    """``pip install -e .``, once per change of pyproject.toml: the install is editable, so the
    code is read from this clone anyway, and pip's isolated build takes 15-20 s each time."""
    location = getattr(getattr(session, "virtualenv", None), "location", None)
    stamp = hashlib.sha256(Path("pyproject.toml").read_bytes()).hexdigest()
    marker = Path(location) / ".sparkbuild-installed" if location else None
    if marker is not None and marker.is_file() and marker.read_text() == stamp:
        session.log("sparkbuild is installed (editable; pyproject.toml unchanged)")
        return
    session.install("-e", ".")
    if marker is not None:
        marker.write_text(stamp)


@nox.session
def tests(session: nox.Session) -> None:
    """The test suite against real git, Docker, registry and vLLM (see scripts/setup-host.sh)."""
    session.install("-e", ".[test]")
    # Two workers: much of the suite waits on engines, Docker and downloads, so the second
    # core would idle. Each test file stays on one worker with its module fixtures.
    workers = os.environ.get("SPARKBUILD_TEST_WORKERS", "2")
    session.run("pytest", "-n", workers, "--dist", "loadgroup", "--durations=40", *session.posargs)


@nox.session
def lint(session: nox.Session) -> None:
    """ruff and mypy over the package, tests and benchmarks; zizmor (offline) and actionlint
    over the GitHub workflows (.github/actionlint.yaml names the self-hosted runner labels)."""
    session.install("-e", ".[lint,test]", "nox")
    session.run("ruff", "check", ".")
    session.run("ruff", "format", "--check", ".")
    session.run("mypy")
    session.run("zizmor", "--offline", ".github/workflows")
    session.run("actionlint")


@nox.session
def lock(session: nox.Session) -> None:
    """Resolve every build and write images.lock (`-- --check` verifies it offline)."""
    _cli(session, "lock")


@nox.session
def patches(session: nox.Session) -> None:
    """The status of every PR and patch of every build."""
    _cli(session, "patches")


@nox.session
def prepare(session: nox.Session) -> None:
    """Check out a build's patched tree: `nox -s prepare -- BUILD [--out DIR]`."""
    _cli(session, "prepare")


@nox.session
def build(session: nox.Session) -> None:
    """Build the named images: `nox -s build -- NAME...`."""
    _cli(session, "build")


def _shipped_engines() -> list[str]:
    """The engines sparkbuild ships, as its registry finds them (``adapters/names.py``,
    standard library only: read here without the package's dependencies)."""
    path = Path(__file__).parent / "src" / "sparkbuild" / "adapters" / "names.py"
    spec = importlib.util.spec_from_file_location("sparkbuild_engine_names", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return list(module.shipped_engines())


def _build_session(engine: str) -> None:
    """``build-ENGINE``: every build of that engine, or those named after `--`."""

    def build_engine(session: nox.Session) -> None:
        _cli(session, "build", "--engine", engine)

    build_engine.__doc__ = (
        f"Build every {engine} build in builds/{engine}.yaml, or those named after `--`."
    )
    nox.session(name=f"build-{engine}")(build_engine)


for _engine in _shipped_engines():
    _build_session(_engine)


@nox.session(name="setup-host", venv_backend="none")
def setup_host(session: nox.Session) -> None:
    """Install and start what builds and tests need: docker, qemu, registry, debootstrap."""
    session.run("bash", "scripts/setup-host.sh", *session.posargs, external=True)


@nox.session
def smoke(session: nox.Session) -> None:
    """Boot an engine and check it: `nox -s smoke -- --image I --profile P`."""
    _cli(session, "smoke")


@nox.session
def publish(session: nox.Session) -> None:
    """Push smoke-tested images by digest: `nox -s publish -- BUILD --registry REG`."""
    _cli(session, "publish")


@nox.session
def rollback(session: nox.Session) -> None:
    """Move a build's aliases back to its previous passing digest."""
    _cli(session, "rollback")


@nox.session
def bench(session: nox.Session) -> None:
    """Throughput sweep of an image or endpoint: `nox -s bench -- --url U ...`."""
    _cli(session, "bench")


@nox.session
def bump(session: nox.Session) -> None:
    """Carry a build to a new release: `nox -s bump -- sglang --to v0.5.24 [--write]`."""
    _cli(session, "bump")


@nox.session
def releases(session: nox.Session) -> None:
    """Upstream releases newer than the newest build: `nox -s releases -- sglang`."""
    _cli(session, "releases")


@nox.session
def preflight(session: nox.Session) -> None:
    """The engine's own boot path on the CPU: `nox -s preflight -- [BUILD...] [--profile P]`."""
    _cli(session, "preflight")


@nox.session
def report(session: nox.Session) -> None:
    """The HTML report of images.lock: `nox -s report -- [--out DIR] [--diff A B]`."""
    _cli(session, "report")
