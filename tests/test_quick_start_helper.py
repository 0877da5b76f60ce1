"""The quick start's engine helper (``tests/support/vllm_cpu.py``) talks while it waits and
fails loudly: a failure is one ``error:`` line, exit status 1 and no traceback, and the
README's ``eval`` line then stops a ``set -e`` script instead of exporting nothing."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

from tests.support.cache import build_once

ROOT = Path(__file__).resolve().parents[1]
HELPER = ROOT / "tests" / "support" / "vllm_cpu.py"

HOLD_THE_LOCK = """
import sys, time
from pathlib import Path
sys.path.insert(0, sys.argv[2])
from tests.support.cache import build_once

def build(path: Path) -> None:
    print("holding", flush=True)
    time.sleep(4)
    path.mkdir()

build_once(Path(sys.argv[1]), build)
"""


def test_a_wait_on_another_install_says_whose(tmp_path: Path) -> None:
    target = tmp_path / "venv"
    holder = subprocess.Popen(
        [sys.executable, "-c", HOLD_THE_LOCK, str(target), str(ROOT)],
        stdout=subprocess.PIPE, text=True,
    )  # fmt: skip
    try:
        assert holder.stdout is not None and holder.stdout.readline().strip() == "holding"
        told: list[str] = []
        began = time.monotonic()

        made = build_once(target, lambda path: path.mkdir(), say=told.append)

        waited = time.monotonic() - began
    finally:
        holder.wait(timeout=30)
    assert made == target and holder.returncode == 0
    assert told == [f"waiting for another install of venv (PID {holder.pid}) to finish"]
    assert waited > 1  # it did wait for the holder, which made the directory
    assert not Path(f"{target}.owner").exists()


def test_an_install_that_needs_no_wait_says_nothing(tmp_path: Path) -> None:
    told: list[str] = []
    build_once(tmp_path / "venv", lambda path: path.mkdir(), say=told.append)
    assert told == []


def _helper_env(cache: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("SPARKBUILD_")}
    return {**env, "SPARKBUILD_TEST_CACHE": str(cache)}


def test_a_failed_helper_exits_1_with_one_error_and_no_traceback(tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    cache.write_text("a file where the cache directory should be\n")

    done = subprocess.run(
        [sys.executable, str(HELPER)], env=_helper_env(cache), cwd=ROOT,
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip

    assert done.returncode == 1, done.stderr
    assert done.stdout == ""  # nothing for eval to export
    assert done.stderr.startswith("error: the vLLM CPU engine could not be prepared:")
    assert "Traceback" not in done.stderr
    assert "hint:" in done.stderr


def test_the_readme_line_stops_a_set_e_script_when_the_helper_fails(tmp_path: Path) -> None:
    readme = (ROOT / "README.md").read_text()
    line = next(x for x in readme.splitlines() if x.startswith("eval") and "vllm_cpu.py" in x)
    cache = tmp_path / "cache"
    cache.write_text("not a directory\n")
    env = {**_helper_env(cache), "PATH": f"{Path(sys.executable).parent}:{os.environ['PATH']}"}

    done = subprocess.run(
        ["bash", "-c", f"set -e\n{line}\necho went-on"], env=env, cwd=ROOT,
        capture_output=True, text=True, check=False, timeout=120,
    )  # fmt: skip

    assert done.returncode != 0
    assert "went-on" not in done.stdout
    assert "error: the vLLM CPU engine could not be prepared" in done.stderr
