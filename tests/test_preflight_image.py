"""Preflight inside an image gives the same checks and verdicts as in the local venv.

The image holds the build's patched SGLang tree (0.5.12 with the reserved-token and
speculative-defaults patches) as its installed package; the interpreter and the release's
dependencies come from the same preflight venv, bind-mounted read-only into the skeleton
image the smoke tests use (no image with torch can be pulled here). The kernel packages are
installed there as in a real image: the folder of the release's pinned wheels that the venv
run used, made a site directory of the container's interpreter (`sitecustomize`), so the
probe finds them as installed distributions and stands in for their binaries where they
are. The probe, the plan and the verdicts are the same; only where it ran differs. A broken
variant of the tree fails the same way in both.
"""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from sparkbuild.preflight import PreflightReport, Where, run_preflight
from sparkbuild.source import prepare_source
from sparkbuild.spec import load_builds
from tests.support.cache import shared_test_cache
from tests.support.preflight_env import Project, venv_root
from tests.support.sglang_releases import download_wheel
from tests.support.smoke_image import engine_mounts, skeleton_image
from tests.test_preflight_releases import DEFAULTS_FIX, GEMMA_NO_COUNTS, TM_FIX, TRANSFORMERS_PIN

pytestmark = [pytest.mark.docker, pytest.mark.upstream]

CHECKS = ("compile", "signals", "flags", "env", "config")


def _image(context: Path, tag: str) -> str:
    (context / "Dockerfile").write_text(
        f"FROM {skeleton_image()}\nCOPY sglang /opt/engine/sglang\nENV PYTHONPATH=/opt/engine\n"
    )
    subprocess.run(
        ["docker", "build", "-q", "-t", tag, str(context)], check=True, capture_output=True
    )
    return tag


def _statuses(report: PreflightReport) -> dict[str, tuple[str, str]]:
    found: dict[str, tuple[str, str]] = {
        c.name: (c.status, c.detail) for c in report.package_checks
    }
    for profile in report.profiles:
        found |= {f"{profile.profile}/{c.name}": (c.status, c.detail) for c in profile.checks}
    return found


@pytest.mark.parametrize("patches", [[TM_FIX, DEFAULTS_FIX], [TM_FIX]], ids=["fixed", "tm-only"])
def test_image_and_venv_give_the_same_verdicts(tmp_path: Path, patches: list[str]) -> None:
    project = Project(tmp_path / "project", tmp_path / "cache")
    project.write_profile("gemma-no-counts", GEMMA_NO_COUNTS)
    project.write_builds(
        {
            "b": {
                "ref": "v0.5.12",
                "platform": "linux/amd64",
                "patches": [{"file": p} for p in patches],
            }
        },
        requirements=[TRANSFORMERS_PIN],
    )
    build = load_builds(project.settings)["b"]
    prepared = prepare_source(build, project.settings)
    wheel = download_wheel("0.5.12", shared_test_cache())
    local = run_preflight(
        project.settings,
        prepared,
        ["gemma-no-counts"],
        Where(venv_root=venv_root(), wheel=wheel, checks=CHECKS),
    )
    venv = Path(local.dependencies["venv"])
    # The build's transformers pin is a layer over the release's venv, which sees torch's.
    release_venv = Path(local.dependencies["venv_layer_over"])
    tree = tmp_path / "context"
    prepared.export(tree)
    (tree / "python" / "sglang").rename(tree / "sglang")
    tag = _image(tree, f"sparkbuild-tests/preflight-{len(patches)}:1")
    torch_base = (release_venv / "lib").glob("python3*/site-packages/sparkbuild-torch.pth")
    torch_site = Path(next(torch_base).read_text().strip())
    torch_venv = torch_site.parents[2]
    kernels = Path(local.dependencies["standins"]["site"])
    kernel_cache = kernels.parents[1]  # links in the site point into the cache's folders
    customize = tmp_path / "customize"
    customize.mkdir()
    (customize / "sitecustomize.py").write_text(f"import site\nsite.addsitedir({str(kernels)!r})\n")
    mounts = [
        *engine_mounts(venv),
        f"{release_venv}:{release_venv}:ro",
        f"{torch_venv}:{torch_venv}:ro",
        f"{kernel_cache}:{kernel_cache}:ro",
        f"{customize}:/sparkbuild-customize:ro",
    ]
    args = (
        *(a for m in mounts for a in ("-v", m)),
        "-e",
        "PYTHONPATH=/sparkbuild-customize:/opt/engine",
    )
    in_image = run_preflight(
        project.settings,
        prepared,
        ["gemma-no-counts"],
        Where(
            image=tag, image_python=str(venv / "bin" / "python"), docker_args=args, checks=CHECKS
        ),
    )
    subprocess.run(["docker", "rmi", "-f", tag], capture_output=True, check=False)
    assert in_image.where == "image" and local.where == "venv"
    assert in_image.image_id and in_image.image_id.startswith("sha256:")
    assert _statuses(in_image) == _statuses(local)
    expected = "pass" if len(patches) == 2 else "fail"
    assert in_image.verdict == local.verdict == expected
