"""Publication-test helpers: a tiny SGLang-like project built into a real arm64 image.

The upstream is a one-commit git repository with a two-file ``sglang`` package; the base is
the cached debootstrap arm64 Debian with that package installed, pushed to a loopback
registry. A patch (made with git) changes one file, so the real overlay build runs BuildKit
with a ``RUN`` under emulation in seconds rather than minutes.
"""

from __future__ import annotations

import base64
import contextlib
import hashlib
import shutil
import subprocess
import sys
import zipfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal, NamedTuple

from sparkbuild import lockfile
from sparkbuild.checks import CheckResult
from sparkbuild.settings import Settings
from sparkbuild.smoke import record
from sparkbuild.smoke.runner import SmokeResult
from sparkbuild.spec import load_builds
from tests.support.cli import CliResult, run_cli
from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    LocalRegistry,
    docker_client,
    push_arm64_base,
    remove_images,
    start_registry,
)
from tests.support.gitrepos import tagged_repo
from tests.support.image_project import load_lock, make_patch_file, prepare_and_build, write_spec

VERSION = "0.5.12"
BUILD = "sglang-tiny"
PROFILE = "cpu-reference"
PACKAGE_INIT = 'VERSION = "0.5.12"\nGREETING = "upstream"\n'


#: What pip installs into the test image's site dir besides the engine: (name, version).
EXTRA_DISTRIBUTION = ("sparkbuild-tiny-extra", "1.0.2")


def tiny_upstream(root: Path) -> tuple[Path, Path]:
    """A git repository tagged v0.5.12 and a site-packages dir where pip installed the same
    package as a distribution (``sglang`` 0.5.12, with its dist-info), and one more.

    Returns (repository, site dir holding ``sglang/``).
    """
    repo = root / "upstream"
    package = repo / "python" / "sglang"
    package.mkdir(parents=True)
    (package / "__init__.py").write_text(PACKAGE_INIT)
    (package / "version.py").write_text(f'__version__ = "{VERSION}"\n')
    tagged_repo(repo, f"v{VERSION}", "release")
    wheels = root / "wheels"
    engine = write_wheel(wheels, "sglang", VERSION, {f"sglang/{p.name}": p.read_bytes()
                                                       for p in package.iterdir()})  # fmt: skip
    extra = write_wheel(wheels, *EXTRA_DISTRIBUTION, {"tiny_extra.py": b"ANSWER = 42\n"})
    site = root / "site"
    subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-compile", "--disable-pip-version-check", "--target", str(site), str(engine),
         str(extra)],
        check=True,
    )  # fmt: skip
    return repo, site


def write_wheel(
    directory: Path, name: str, version: str, files: dict[str, bytes], tag: str = "py3-none-any"
) -> Path:
    """A wheel of ``files`` (what pip installs; PEP 427's layout), pure Python unless its
    ``tag`` names a platform (``py3-none-manylinux2014_aarch64``)."""
    directory.mkdir(parents=True, exist_ok=True)
    stem = f"{name.replace('-', '_')}-{version}"
    info = f"{stem}.dist-info"
    purelib = "true" if tag.endswith("-any") else "false"
    files = {
        **files,
        f"{info}/METADATA": f"Metadata-Version: 2.1\nName: {name}\nVersion: {version}\n".encode(),
        f"{info}/WHEEL": f"Wheel-Version: 1.0\nGenerator: sparkbuild-tests\nRoot-Is-Purelib: "
        f"{purelib}\nTag: {tag}\n".encode(),
    }
    rows = [
        f"{path},sha256={_record_hash(data)},{len(data)}" for path, data in sorted(files.items())
    ]
    files[f"{info}/RECORD"] = ("\n".join([*rows, f"{info}/RECORD,,"]) + "\n").encode()
    wheel = directory / f"{stem}-{tag}.whl"
    with zipfile.ZipFile(wheel, "w") as archive:
        for path, data in files.items():
            archive.writestr(path, data)
    return wheel


def _record_hash(data: bytes) -> str:
    return base64.urlsafe_b64encode(hashlib.sha256(data).digest()).rstrip(b"=").decode()


def write_project(
    project: Path,
    repo: Path,
    base_ref: str,
    builds: dict[str, dict[str, Any]],
    greeting: str,
    image_name: str = "sparkbuild-tests/publish-{build}",
) -> None:
    """A project whose builds share one patch that sets GREETING to ``greeting``; its images
    are tagged ``image_name`` (the Docker store is shared: each test module its own name)."""
    patch = project / "patches" / "sglang" / "greeting.patch"
    patch.unlink(missing_ok=True)
    shutil.rmtree(patch.with_name(patch.stem + ".work"), ignore_errors=True)
    make_patch_file(
        repo,
        f"v{VERSION}",
        {"python/sglang/__init__.py": ('"upstream"', f'"{greeting}"')},
        patch,
    )
    write_spec(
        project,
        "sglang",
        {
            "repo": str(repo),
            "package_dir": "python/sglang",
            "base_image": base_ref,
            "tags": [image_name + ":{version}-{tree_short}"],
            "patches": [{"file": "patches/sglang/greeting.patch"}],
            "builds": builds,
        },
    )


def record_smoke(lock_path: Path, build: str, profile: str, verdict: str = "pass") -> str:
    """Record a verdict through the smoke stage's own recorder, as `smoke --image … --record`
    does after a container of the pinned image ran (so the verdict is verified)."""
    status: Literal["pass", "fail"] = "pass" if verdict == "pass" else "fail"
    result = SmokeResult(
        image_id=lockfile.pinned_image_id(lock_path, build),
        verdict=status,
        profile=profile,
        engine="sglang",
        model="tiny",
        target_kind="image",
        target="publish-test",
        boot_seconds=1.0,
        accept_len=2.0,
        checks=[CheckResult("boot", status, "recorded by the publish tests", value=1.0)],
    )
    return record.record(lock_path, build, result)


def run_publish_cli(
    project: Path,
    *args: str,
    env: dict[str, str] | None = None,
    stdin: str | None = None,
    docker_config: Path | None = None,
) -> CliResult:
    """The real CLI on ``project``, with registry variables cleared unless given."""
    cleared: dict[str, str | None] = dict.fromkeys(
        ("SPARKBUILD_REGISTRY_USER", "SPARKBUILD_REGISTRY_PASSWORD")
    )
    if docker_config is not None:
        cleared["DOCKER_CONFIG"] = str(docker_config)
    return run_cli(
        "--project",
        str(project),
        "--cache-dir",
        str(project / ".cache"),
        *args,
        input=stdin,
        env={**cleared, **(env or {})},
    )


class Keys(NamedTuple):
    """A key pair `sparkbuild keys generate` wrote."""

    private: Path
    public: Path


def generate_keys(project: Path, prefix: Path, passphrase: str) -> Keys:
    """``sparkbuild keys generate --output-prefix prefix``, checked: it exits 0 and never
    prints the passphrase."""
    result = run_publish_cli(
        project,
        "keys",
        "generate",
        "--output-prefix",
        str(prefix),
        env={"SPARKBUILD_SIGNING_PASSWORD": passphrase},
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    assert passphrase not in result.stdout + result.stderr
    return Keys(prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub"))


@dataclass
class PublishEnv:
    """A built test image, its project, and a registry with htpasswd auth to publish to."""

    registry: LocalRegistry  # the one to publish to (htpasswd auth)
    base_ref: str
    repo: Path
    project: Path
    work: Path
    empty_docker_config: Path
    images: list[str]
    image_name: str = "sparkbuild-tests/publish-{build}"

    @property
    def lock(self) -> Path:
        return self.project / "images.lock"

    def creds_env(self) -> dict[str, str]:
        assert self.registry.auth is not None
        user, password = self.registry.auth
        return {"SPARKBUILD_REGISTRY_USER": user, "SPARKBUILD_REGISTRY_PASSWORD": password}

    def publish(self, *args: str, lock: Path | None = None, **kwargs: Any) -> CliResult:
        kwargs.setdefault("docker_config", self.empty_docker_config)
        options = ["--lock-file", str(lock)] if lock else []
        return run_publish_cli(
            self.project,
            *options,
            "publish",
            BUILD,
            "--registry",
            self.registry.address,
            *args,
            **kwargs,
        )

    def image_section(self) -> dict[str, Any]:
        section: dict[str, Any] = load_lock(self.project)["builds"][BUILD]["image"]
        return section

    def lock_copy(self, name: str) -> Path:
        copy = self.work / f"{name}.lock"
        shutil.copyfile(self.lock, copy)
        return copy


def build_into(env: PublishEnv, greeting: str) -> dict[str, Any]:
    """Build the test image (its patch sets GREETING to ``greeting``); its image section."""
    write_project(
        env.project,
        env.repo,
        env.base_ref,
        {BUILD: {"ref": "v0.5.12", "smoke": [PROFILE]}},
        greeting,
        env.image_name,
    )
    build = load_builds(Settings(project_dir=env.project))[BUILD]
    settings = Settings(project_dir=env.project, cache_dir=env.work / "cache")
    result = prepare_and_build(build, settings)
    env.images.append(result.image_id)
    return env.image_section()


@contextlib.contextmanager
def publish_env(
    work: Path, image_name: str = "sparkbuild-tests/publish-{build}"
) -> Iterator[PublishEnv]:
    """Registries (a base one, an htpasswd one to publish to) and the built test image."""
    docker_client()
    repo, site = tiny_upstream(work)
    empty_config = work / "docker-config-empty"
    empty_config.mkdir()
    with (
        start_registry(work / "base-registry") as base_registry,
        start_registry(work / "registry", auth=True) as registry,
    ):
        base_ref = push_arm64_base(
            base_registry,
            "sparkbuild-tests/tiny-sglang",
            tag="v0.5.12",
            extras={BOOKWORM_PYTHON_SITE: site},
            work_dir=work,
        )
        state = PublishEnv(
            registry, base_ref, repo, work / "project", work, empty_config, [base_ref], image_name
        )
        build_into(state, "first")
        yield state
        remove_images(docker_client(), state.images)
