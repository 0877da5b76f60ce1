"""A build's pins become a small layer venv over its release's venv (preflight/venv.py).

The suite's preflight venvs are cached, so a warm run never makes a layer; this test makes
one, in a temporary root, over a release venv of one small pin (a real wheel from PyPI),
not a real release's set. Every venv there sees the shared torch venv: the test cache's
one is linked in, never installed again.
"""

from __future__ import annotations

import json
import subprocess
import tempfile
from pathlib import Path

import pytest

from sparkbuild.preflight.deps import TORCH, DependencySet, requirement_name
from sparkbuild.preflight.venv import ensure_torch_base, ensure_venv, venv_dir
from tests.support.preflight_env import venv_root

RELEASE_PIN = "zipp==3.23.0"
BUILD_PINS = ("iniconfig==2.3.0", "zipp==4.1.0")  # one changed, one added


def _shared_torch_venv() -> Path:
    with tempfile.TemporaryDirectory() as tmp:
        constraints = Path(tmp) / "constraints.txt"
        constraints.write_text("\n".join(TORCH) + "\n", encoding="utf-8")
        site = ensure_torch_base(venv_root(), constraints)
    return site.parents[2]  # <venv>/lib/python3.X/site-packages


def _versions(python: Path, *names: str) -> dict[str, str]:
    code = "import importlib.metadata as m, json, sys; "
    code += "print(json.dumps({n: m.version(n) for n in sys.argv[1:]}))"
    done = subprocess.run([python, "-c", code, *names], capture_output=True, text=True, check=True)
    return dict(json.loads(done.stdout))


@pytest.mark.parametrize(
    ("line", "name"),
    [
        ("Mistral_Common>=1.11.0", "mistral-common"),
        ("flashinfer_python[cu13]==0.6.9 ; platform_machine == 'aarch64'", "flashinfer-python"),
        ("torch (>=2.9)", "torch"),
        ("sgl-kernel @ https://example.invalid/sgl_kernel.whl", "sgl-kernel"),
    ],
)
def test_requirement_names_are_canonical_whatever_the_line_adds(line: str, name: str) -> None:
    """One name for a package however a wheel's Requires-Dist or a build's pin writes it:
    the layer's constraints and the unavailable modules both match on it."""
    assert requirement_name(line) == name


# The torch venv (the test cache's, made once per machine) and the pins' wheels from PyPI.
@pytest.mark.upstream
def test_build_pins_are_a_layer_over_the_release_venv_and_win(tmp_path: Path) -> None:
    torch_venv = _shared_torch_venv()
    (tmp_path / torch_venv.name).symlink_to(torch_venv, target_is_directory=True)
    release = DependencySet("sglang", "0.5.12", (RELEASE_PIN,), ())
    build = DependencySet("sglang", "0.5.12", BUILD_PINS, ())

    layer = ensure_venv(tmp_path, build, release)

    release_dir = venv_dir(tmp_path, release)
    assert release_dir.name == f"sglang-0.5.12-m2-{release.digest.removeprefix('sha256:')[:16]}"
    assert layer.layer_over == release_dir
    assert layer.path.name.endswith(f"-over-{release.digest.removeprefix('sha256:')[:8]}")
    manifest = json.loads((layer.path / "sparkbuild-preflight.json").read_text())
    assert manifest["layer_over"] == str(release_dir)
    assert manifest["unavailable"] == [] and layer.unavailable == ()
    # The layer holds only what the build's pins change: the release's venv is reached
    # through its .pth, not copied.
    site = next((layer.path / "lib").glob("python3*/site-packages"))
    assert (site / "sparkbuild-layer.pth").is_file() and not list(site.glob("zipp-3.*"))
    # In the layer the build's pins import; the release's venv keeps its own version.
    assert _versions(layer.python, "zipp", "iniconfig") == {"zipp": "4.1.0", "iniconfig": "2.3.0"}
    where = "import zipp; print(zipp.__file__)"
    done = subprocess.run([layer.python, "-c", where], capture_output=True, text=True, check=True)
    assert done.stdout.startswith(str(layer.path)), done.stdout
    release_python = release_dir / "bin" / "python"
    assert _versions(release_python, "zipp") == {"zipp": "3.23.0"}
    # Both see the shared torch venv behind them (the layer through its release's venv).
    torch_site = "import importlib.util as u; print(u.find_spec('torch').origin)"
    for python in (release_python, layer.python):
        done = subprocess.run(
            [python, "-c", torch_site], capture_output=True, text=True, check=False
        )
        assert torch_venv.name in done.stdout, (python, done.stdout, done.stderr[-500:])
    # Asked again, the cached layer is returned as it is.
    again = ensure_venv(tmp_path, build, release)
    assert again == layer
