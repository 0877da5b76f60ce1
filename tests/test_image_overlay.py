"""Overlay builds of a real SGLang release: real arm64 base, real registry, real BuildKit.

The base image is an arm64 Debian bookworm made with debootstrap, with the `sglang/` tree of
the real 0.5.12 wheel installed into its site-packages, pushed to a loopback registry. The
source is a git repository of real SGLang releases; a patch made here against the real
`tokenizer_manager.py` goes through spec -> prepare_source -> build_image.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    docker_cli,
    push_arm64_base,
    python_in_image,
)
from tests.support.gitrepos import Edit, git
from tests.support.image_project import (
    OverlayEnv,
    build_json,
    load_lock,
    overlay_env,
    overlay_project,
    sparkbuild,
)

pytestmark = [pytest.mark.docker, pytest.mark.upstream]

VERSION = "0.5.12"
BUILD = "sglang-0.5.12-spark"
TOKENIZER = "python/sglang/srt/managers/tokenizer_manager.py"
NEW_FILE = "python/sglang/srt/sparkbuild_marker.py"
DELETED = "python/sglang/README.md"
FIX_OLD = "server_args.speculative_eagle_topk * server_args.speculative_num_steps,"
FIX_NEW = (
    "(server_args.speculative_eagle_topk or 1) * (server_args.speculative_num_steps or 0),"
    "  # sparkbuild-test: None-safe"
)


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OverlayEnv]:
    work = tmp_path_factory.mktemp("image-overlay")
    with overlay_env(work, VERSION, "sparkbuild-tests/sglang") as state:
        yield state


def _project(env: OverlayEnv, name: str, edits: dict[str, Edit], **image: Any) -> Path:
    return overlay_project(
        env,
        name,
        BUILD,
        edits,
        ["sparkbuild-tests/{engine}:{version}-{tree_short}", "sparkbuild-tests/{build}"],
        **image,
    )


def _inspect(reference: str) -> dict[str, Any]:
    out = subprocess.run(
        [docker_cli(), "image", "inspect", reference], capture_output=True, text=True, check=True
    ).stdout
    data: dict[str, Any] = json.loads(out)[0]
    return data


CHECK_IN_IMAGE = f"""
import importlib.util, json, os, platform
site = {BOOKWORM_PYTHON_SITE!r} + "/sglang"
def pyc_ok(rel):
    src = os.path.join(site, rel)
    folder, name = os.path.split(src)
    pyc = os.path.join(folder, "__pycache__", name[:-3] + ".cpython-311.pyc")
    data = open(pyc, "rb").read()
    flags = int.from_bytes(data[4:8], "little")
    return flags == 3 and data[8:16] == importlib.util.source_hash(open(src, "rb").read())
print(json.dumps({{
    "machine": platform.machine(),
    "fixed": {FIX_NEW!r} in open(site + "/srt/managers/tokenizer_manager.py").read(),
    "marker": open(site + "/srt/sparkbuild_marker.py").read(),
    "deleted": not os.path.exists(site + "/README.md"),
    "untouched": os.path.exists(site + "/srt/managers/detokenizer_manager.py"),
    "pyc_tokenizer": pyc_ok("srt/managers/tokenizer_manager.py"),
    "pyc_marker": pyc_ok("srt/sparkbuild_marker.py"),
}}))
"""


def test_overlay_build_labels_skip_and_lock(env: OverlayEnv) -> None:
    edits: dict[str, Edit] = {
        TOKENIZER: (FIX_OLD, FIX_NEW),
        NEW_FILE: 'MARKER = "sparkbuild overlay"\n',
        DELETED: None,
    }
    # This test moves its base tag later on, so it gets a tag of its own.
    moving = env.registry.ref("sparkbuild-tests/sglang", "moving")
    subprocess.run([docker_cli(), "tag", env.base_ref, moving], check=True)
    subprocess.run([docker_cli(), "push", moving], check=True, capture_output=True)
    env.images.append(moving)
    project = _project(env, "overlay", edits, base_image=moving)
    cache = env.work / "cache"

    # Exactly what `nox -s build-sglang -- BUILD` runs.
    first = build_json(sparkbuild(project, cache, "build", "--engine", "sglang", BUILD, "--json"))
    env.images.append(first["image_id"])
    assert first["skipped"] is False
    assert first["platform"] == "linux/arm64"

    image = _inspect(first["image_id"])
    assert (image["Os"], image["Architecture"]) == ("linux", "arm64")
    labels = image["Config"]["Labels"]
    commit = git(env.repo, "rev-parse", f"v{VERSION}^{{commit}}")
    commit_epoch = int(git(env.repo, "log", "-1", "--format=%ct", commit))
    assert labels["org.opencontainers.image.revision"] == commit
    assert labels["org.opencontainers.image.version"] == VERSION
    assert labels["org.opencontainers.image.source"] == str(env.repo)
    assert labels["org.opencontainers.image.created"] == datetime.fromtimestamp(
        commit_epoch, tz=UTC
    ).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert labels["io.sparkbuild.build"] == BUILD
    assert labels["io.sparkbuild.inputs-digest"] == first["inputs_digest"]
    patch_sha = (
        __import__("hashlib")
        .sha256((project / "patches/sglang/fix.patch").read_bytes())
        .hexdigest()
    )
    patches = json.loads(labels["io.sparkbuild.patches"])
    assert patches == [
        {"file": "patches/sglang/fix.patch", "status": "applied", "sha256": patch_sha}
    ]
    assert json.loads(labels["io.sparkbuild.prs"]) == []
    tree = labels["io.sparkbuild.tree"]
    assert first["tags"] == [
        f"sparkbuild-tests/sglang:{VERSION}-{tree[:12]}",
        f"sparkbuild-tests/{BUILD}",
    ]
    assert set(first["tags"]) <= {t.removesuffix(":latest") for t in image["RepoTags"]} | set(
        image["RepoTags"]
    )

    facts = json.loads(python_in_image(first["image_id"], CHECK_IN_IMAGE))
    assert facts == {
        "machine": "aarch64",
        "fixed": True,
        "marker": 'MARKER = "sparkbuild overlay"\n',
        "deleted": True,
        "untouched": True,
        "pyc_tokenizer": True,
        "pyc_marker": True,
    }

    lock = load_lock(project)["builds"][BUILD]
    section = lock["image"]
    repository, _, tag = moving.partition("/")[2].rpartition(":")
    assert section["base_image"] == moving
    assert section["base_digest"] == env.registry.manifest_digest(repository, tag)
    assert section["platform"] == "linux/arm64"
    assert section["inputs_digest"] == first["inputs_digest"]
    assert section["image_id"] == first["image_id"]
    assert section["tags"] == first["tags"]
    assert lock["source"]["tree"] == tree
    started, finished = (datetime.fromisoformat(section[k]) for k in ("started", "finished"))
    assert started.utcoffset() == timedelta(0) and started <= finished

    second = build_json(sparkbuild(project, cache, "build", BUILD, "--json"))
    assert second["skipped"] is True
    assert second["image_id"] == first["image_id"]
    # Up to date: the times stay those of the run that built it, not this one's.
    again = load_lock(project)["builds"][BUILD]["image"]
    assert (again["started"], again["finished"]) == (section["started"], section["finished"])

    # The tag now points elsewhere; --locked still builds from the pinned digest (up to date).
    push_arm64_base(env.registry, "sparkbuild-tests/sglang", tag="moving", work_dir=env.work)
    assert env.registry.manifest_digest(repository, tag) != section["base_digest"]
    locked = build_json(sparkbuild(project, cache, "build", BUILD, "--locked", "--json"))
    assert locked["skipped"] is True
    assert locked["base_digest"] == section["base_digest"]
    assert locked["inputs_digest"] == section["inputs_digest"]

    # A changed patch under --locked: refused, and the lock stays as it was.
    before = (project / "images.lock").read_text()
    patch = project / "patches/sglang/fix.patch"
    patch.write_text(patch.read_text().replace("None-safe", "None-safe!"))
    refused = sparkbuild(project, cache, "build", BUILD, "--locked")
    assert refused.exit_code == 1, refused.stderr
    assert "--locked" in refused.stderr and "fix.patch" in refused.stderr
    assert (project / "images.lock").read_text() == before


def test_overlay_refuses_changes_outside_the_package(env: OverlayEnv) -> None:
    edits: dict[str, Edit] = {
        TOKENIZER: (FIX_OLD, FIX_NEW),
        "sgl-kernel/csrc/spark_fix.cu": "// a kernel change\n",
        "python/pyproject.toml": "[project]\nname = 'sglang'\n",
    }
    project = _project(env, "refuse", edits)
    result = sparkbuild(project, env.work / "cache", "build", BUILD)
    assert result.exit_code == 1
    assert "sgl-kernel/csrc/spark_fix.cu" in result.stderr
    assert "python/pyproject.toml" in result.stderr
    assert "mode: source" in result.stderr
    assert "tokenizer_manager" not in result.stderr
    assert "Traceback" not in result.stderr
    lock = load_lock(project)
    assert "image" not in lock.get("builds", {}).get(BUILD, {})


def test_overlay_syntax_error_fails_the_build_and_keeps_the_lock(env: OverlayEnv) -> None:
    edits: dict[str, Edit] = {
        TOKENIZER: (FIX_OLD, f"{FIX_OLD} ("),
    }
    project = _project(env, "syntax", edits)
    (project / "images.lock").write_text(yaml.safe_dump({"schema": 1, "builds": {}}))
    before = (project / "images.lock").read_text()
    result = sparkbuild(project, env.work / "cache", "--quiet", "build", BUILD)
    assert result.exit_code == 1
    assert "the build failed" in result.stderr
    assert "tokenizer_manager.py" in result.stderr, result.stderr  # from the failing step
    assert "do not compile" in result.stderr
    assert "Traceback" not in result.stderr.split("the build failed")[0]
    assert (project / "images.lock").read_text() == before


def test_missing_base_image_is_reported(env: OverlayEnv) -> None:
    project = _project(
        env,
        "nobase",
        {NEW_FILE: "X = 1\n"},
        base_image=env.registry.ref("sparkbuild-tests/absent", "v0"),
    )
    result = sparkbuild(project, env.work / "cache", "build", BUILD)
    assert result.exit_code == 1
    assert "base image" in result.stderr and "not found" in result.stderr
    assert "sparkbuild-tests/absent" in result.stderr


def test_a_context_cache_others_can_write_is_refused(env: OverlayEnv) -> None:
    """Issue 46, What 3: the build context is made in the cache's ``contexts/``; another
    user who can rename entries there could swap the context the image is built from."""
    project = _project(env, "contexts", {NEW_FILE: "X = 1\n"})
    cache = env.work / "cache-contexts"
    (cache / "contexts").mkdir(parents=True)
    (cache / "contexts").chmod(0o777)
    result = sparkbuild(project, cache, "build", BUILD)
    assert result.exit_code == 1, result.output
    assert f"the context cache {cache / 'contexts'} is writable by group or others" in (
        result.stderr
    )
    assert list((cache / "contexts").iterdir()) == []
    assert "image" not in load_lock(project).get("builds", {}).get(BUILD, {})
