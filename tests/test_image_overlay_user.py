"""Overlay builds onto a base image that runs as a non-root user (real arm64 base, real
registry, real BuildKit, real SGLang 0.5.12 files).

The base is arm64 Debian with SGLang's package in root-owned site-packages and `USER spark`,
the layout of an image that installs as root and then drops privileges. The overlay must be
applied as root, the image must run as `spark` again, an `install_dir` that is not where
`spark`'s python3 imports the package from must fail with sparkbuild's own error, and a patch
that also adds tests and docs outside the package must build (those files left out, and the
status detail saying so).
"""

from __future__ import annotations

import json
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from tests.support.docker_env import (
    BOOKWORM_PYTHON_SITE,
    docker_client,
    python_in_image,
)
from tests.support.gitrepos import Edit
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
BUILD = "sglang-0.5.12-nonroot"
TOKENIZER = "python/sglang/srt/managers/tokenizer_manager.py"
FIX_OLD = "server_args.speculative_eagle_topk * server_args.speculative_num_steps,"
FIX_NEW = (
    "(server_args.speculative_eagle_topk or 1) * (server_args.speculative_num_steps or 0),"
    "  # sparkbuild-test: non-root base"
)
NEW_MODULE = "python/sglang/srt/sparkbuild_user_marker.py"
TEST_FILE = "test/srt/test_sparkbuild_user.py"
DOC_FILE = "docs/sparkbuild_user.md"
# A user that owns nothing of the package: the upstream layout that broke the overlay.
NON_ROOT_SETUP = """\
RUN echo 'spark:x:1000:1000::/home/spark:/bin/sh' >> /etc/passwd \\
    && echo 'spark:x:1000:' >> /etc/group \\
    && mkdir -p /home/spark && chown spark:spark /home/spark
USER spark
WORKDIR /home/spark
"""


@pytest.fixture(scope="module")
def env(tmp_path_factory: pytest.TempPathFactory) -> Iterator[OverlayEnv]:
    work = tmp_path_factory.mktemp("overlay-user")
    with overlay_env(
        work, VERSION, "sparkbuild-tests/sglang-nonroot", setup=NON_ROOT_SETUP
    ) as state:
        yield state


def _project(env: OverlayEnv, name: str, edits: dict[str, Edit], **image: Any) -> Path:
    return overlay_project(env, name, BUILD, edits, ["sparkbuild-tests/{build}"], **image)


CHECK_AS_DEFAULT_USER = f"""
import json, os, pwd
site = {BOOKWORM_PYTHON_SITE!r} + "/sglang"
marker = site + "/srt/sparkbuild_user_marker.py"
print(json.dumps({{
    "user": pwd.getpwuid(os.getuid()).pw_name,
    "fixed": {FIX_NEW!r} in open(site + "/srt/managers/tokenizer_manager.py").read(),
    "marker_owner": pwd.getpwuid(os.stat(marker).st_uid).pw_name,
    "imported": __import__("importlib.util").util.find_spec("sglang").submodule_search_locations[0],
    "tests_or_docs_in_image": [
        p for p in ("/test", "/docs", site + "/../test") if os.path.exists(p)
    ],
}}))
"""


def test_non_root_base_gets_the_overlay_and_keeps_its_user(env: OverlayEnv) -> None:
    edits: dict[str, Edit] = {
        TOKENIZER: (FIX_OLD, FIX_NEW),
        NEW_MODULE: "MARKER = 1\n",
        TEST_FILE: "def test_marker() -> None:\n    assert True\n",
        DOC_FILE: "# sparkbuild user test\n",
    }
    project = _project(env, "nonroot", edits)
    cache = env.work / "cache"

    patches = json.loads(sparkbuild(project, cache, "patches", BUILD, "--json").stdout)
    (item,) = patches["builds"][0]["items"]
    assert item["status"] == "applied"
    assert "2 test/doc file(s) outside python/sglang are not in the overlay image" in item["detail"]
    assert DOC_FILE in item["detail"] and TEST_FILE in item["detail"]

    result = build_json(sparkbuild(project, cache, "build", BUILD, "--json"))
    env.images.append(result["image_id"])
    config = docker_client().images.get(result["image_id"]).attrs["Config"]
    assert config["User"] == "spark"
    assert config["WorkingDir"] == "/home/spark"

    stdout = python_in_image(result["image_id"], CHECK_AS_DEFAULT_USER)
    facts = json.loads(stdout)
    assert facts == {
        "user": "spark",
        "fixed": True,
        "marker_owner": "root",  # the owner of the directory it was written into
        "imported": f"{BOOKWORM_PYTHON_SITE}/sglang",
        "tests_or_docs_in_image": [],
    }
    assert load_lock(project)["builds"][BUILD]["image"]["image_id"] == result["image_id"]


def test_install_dir_that_python_does_not_import_from_fails_cleanly(env: OverlayEnv) -> None:
    project = _project(
        env,
        "wrong-install-dir",
        {NEW_MODULE: "MARKER = 2\n"},
        install_dir="/usr/lib/python3/dist-packages",
    )
    result = sparkbuild(project, env.work / "cache", "--quiet", "build", BUILD)
    assert result.exit_code == 1, result.stderr
    assert "overlay: install_dir /usr/lib/python3/dist-packages is not where" in result.stderr
    assert "(as user spark)" in result.stderr
    assert f"hint: set `install_dir: {BOOKWORM_PYTHON_SITE}/sglang`" in result.stderr
    assert "images.lock was not changed" in result.stderr
    assert "Traceback" not in result.stderr
    assert "image" not in load_lock(project).get("builds", {}).get(BUILD, {})


def test_a_package_the_base_does_not_import_fails_cleanly(env: OverlayEnv) -> None:
    # Same tree, another package directory: the base image has no `sglangx` to overlay.
    project = _project(
        env, "not-imported", {"python/sglangx/x.py": "X = 1\n"}, package_dir="python/sglangx"
    )
    result = sparkbuild(project, env.work / "cache", "--quiet", "build", BUILD)
    assert result.exit_code == 1, result.stderr
    assert "cannot import package 'sglangx'" in result.stderr
    assert "(as user spark, from /home/spark)" in result.stderr
    assert "Traceback" not in result.stderr
