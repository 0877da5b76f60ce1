"""dgxarley 0.0.64 from PyPI: its repetition detectors and the texts its own tests label.

dgxarley (a DGX Spark peer's toolbox) ships ``integration/repetition_detector.py`` and
``integration/streaming_repetition_guard.py``; its sdist's ``tests/test_base.py`` feeds them
labelled texts (clean prose, short and long loops, a loop after a preamble, near-identical
DNS records that must not count). We never copy that code or those texts: a cached venv
holds the released package (it declares Python >= 3.14; its wheel runs on pyenv's 3.13 with
``--ignore-requires-python``, as ENVIRONMENT.md records), and :func:`labelled_texts` runs
its own tests there with a small pytest plugin (``dgxarley_record.py``) that records every
text a test hands to a detector and the detector's verdict. dgxarley's tests pass, so each
verdict is the label its authors gave that text.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import tarfile
from dataclasses import dataclass
from pathlib import Path

from tests.support.cache import build_once, shared_test_cache

__all__ = ["DGXARLEY_VERSION", "Labelled", "dgxarley_python", "labelled_texts"]

DGXARLEY_VERSION = "0.0.64"
_PYTHON = Path.home() / ".pyenv" / "versions" / "3.13.0" / "bin" / "python"
_HERE = Path(__file__).resolve().parent


@dataclass(frozen=True)
class Labelled:
    """One text a dgxarley test gave one of its detectors, and that detector's verdict."""

    test: str  # the dgxarley test function
    detector: str  # detect_repetition, detect_loops, ..., RepetitionGuard
    text: str
    repetitive: bool  # the detector's verdict (what the test asserts)
    detail: str  # the detector's own words: severity, hit, stop reason


def _run(argv: list[str], what: str, cwd: Path | None = None) -> str:
    done = subprocess.run(argv, capture_output=True, text=True, check=False, cwd=cwd)
    if done.returncode != 0:
        tail = "\n".join((done.stdout + done.stderr).splitlines()[-30:])
        raise RuntimeError(f"{what} failed (exit {done.returncode}): {' '.join(argv)}\n{tail}")
    return done.stdout


def _make_venv(venv: Path) -> None:
    _run([str(_PYTHON), "-m", "venv", str(venv)], "creating the dgxarley venv")
    pip = [str(venv / "bin" / "python"), "-m", "pip", "--disable-pip-version-check", "-q"]
    package = f"dgxarley=={DGXARLEY_VERSION}"
    _run([*pip, "install", "--ignore-requires-python", package, "pytest"], f"pip install {package}")
    sdist = venv / "sdist"
    _run([*pip, "download", "--no-deps", "--no-binary", ":all:", "--ignore-requires-python",
          "-d", str(sdist), package], f"pip download the {package} sdist")  # fmt: skip
    (archive,) = sdist.glob("*.tar.gz")
    with tarfile.open(archive) as tar:
        member = tar.getmember(f"dgxarley-{DGXARLEY_VERSION}/tests/test_base.py")
        member.name = "test_base.py"
        tar.extract(member, venv / "tests", filter="data")


def dgxarley_venv(cache_dir: Path | None = None) -> Path:
    """A venv with dgxarley and pytest, and the sdist's ``tests/test_base.py`` beside it."""
    cache = cache_dir or shared_test_cache()
    return build_once(cache / f"dgxarley-{DGXARLEY_VERSION}-py3.13", _make_venv, "v1\n")


def dgxarley_python(cache_dir: Path | None = None) -> Path:
    return dgxarley_venv(cache_dir) / "bin" / "python"


def labelled_texts(out_dir: Path, cache_dir: Path | None = None) -> list[Labelled]:
    """Run dgxarley's own tests in its venv, recording what its detectors were given."""
    venv = dgxarley_venv(cache_dir)
    records = out_dir / "dgxarley-labelled.json"
    # The plugin goes on the path alone: tests/support itself would shadow the package.
    shutil.copy(_HERE / "dgxarley_record.py", out_dir / "dgxarley_record.py")
    env_plugin = ["-p", "dgxarley_record"]
    argv = [str(venv / "bin" / "python"), "-m", "pytest", "-q", "-p", "no:cacheprovider",
            *env_plugin, "-k", "ngram or sentence or loop or detect_repetition or guard",
            str(venv / "tests" / "test_base.py")]  # fmt: skip
    done = subprocess.run(
        argv, capture_output=True, text=True, check=False, cwd=out_dir,
        env={"PYTHONPATH": str(out_dir), "DGXARLEY_RECORD": str(records), "PATH": "/usr/bin:/bin"},
    )  # fmt: skip
    if done.returncode != 0:  # dgxarley's own tests must pass: their asserts are the labels
        raise RuntimeError(f"dgxarley's tests failed:\n{done.stdout[-3000:]}{done.stderr[-2000:]}")
    return [Labelled(**item) for item in json.loads(records.read_text(encoding="utf-8"))]
