"""llama-benchy 0.4.0 from PyPI, for format tests: a cached venv and its own results writer.

``write_outputs(DIR)`` feeds timed requests (made here, no engine) through llama-benchy's own
``BenchmarkResults`` and writes what ``--format json``, ``csv`` and ``md`` write, so the tests
read the real format of the real release rather than a copy of it.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from tests.support.cache import build_once, shared_test_cache
from tests.support.pypi import make_venv, sdist_member

LLAMA_BENCHY_VERSION = "0.4.0"

#: Runs llama-benchy's result code on requests with known timestamps:
#: pp 32, tg 16, depth 0 and 64, concurrency 1 and 2, two runs (batches) per cell.
_WRITE = r"""
import sys
from pathlib import Path
from llama_benchy.client import RequestResult
from llama_benchy.results import BenchmarkMetadata, BenchmarkResults

out = Path(sys.argv[1])
results = BenchmarkResults()
results.metadata = BenchmarkMetadata(
    version="0.4.0", timestamp="2026-11-22 01:00:00", latency_mode="none", latency_ms=0.0,
    model="tiny/llama", prefix_caching_enabled=False, max_concurrency=2,
)

def request(start, ttft, itl, tokens):
    first = start + ttft
    stamps = [first + i * itl for i in range(tokens)]
    return RequestResult(start_ts=start, end_ts=stamps[-1] + 0.001, first_token_ts=first,
                         first_response_ts=first, prompt_tokens=32, total_tokens=tokens,
                         token_timestamps=stamps)

for depth in (0, 64):
    for concurrency in (1, 2):
        batches = []
        for run in range(2):
            itl = 0.010 + 0.002 * run  # 100 and 83.3 tok/s per request
            batches.append([request(100.0 * run, 0.050, itl, 16) for _ in range(concurrency)])
        results.add("tiny/llama", 32, 16, depth, concurrency, batches, 0.0, 32)

results.save_report(str(out / "benchy.json"), "json", 2)
results.save_report(str(out / "benchy.csv"), "csv", 2)
results.save_report(str(out / "benchy.md"), "md", 2)
"""


def llama_benchy_python(cache_dir: Path | None = None) -> Path:
    """A venv's python with ``llama-benchy==0.4.0`` (made once, about 20 s)."""
    cache = cache_dir or shared_test_cache()
    venv = build_once(
        cache / f"llama-benchy-{LLAMA_BENCHY_VERSION}",
        lambda venv: make_venv(Path(sys.executable), venv, f"llama-benchy=={LLAMA_BENCHY_VERSION}"),
        f"llama-benchy=={LLAMA_BENCHY_VERSION}\n",
    )
    return venv / "bin" / "python"


def write_outputs(directory: Path) -> dict[str, Path]:
    """llama-benchy's own JSON, CSV and Markdown for the requests in ``_WRITE``."""
    directory.mkdir(parents=True, exist_ok=True)
    subprocess.run(
        [str(llama_benchy_python()), "-c", _WRITE, str(directory)], check=True,
        capture_output=True,
    )  # fmt: skip
    return {kind: directory / f"benchy.{kind}" for kind in ("json", "csv", "md")}


#: llama-benchy's JSON schema is its ``BenchmarkReport`` model's (its scripts/generate_schema.py
#: writes schemas/benchmark_report_schema.json that way; for 0.4.0 the two are the same JSON).
_SCHEMA = r"""
import json, sys
from llama_benchy.results import BenchmarkReport
print(json.dumps(BenchmarkReport.model_json_schema(), indent=2))
"""

#: llama-benchy's own reading of a JSON report (its pydantic model) and its own CSV writer.
_CSV = r"""
import json, sys
from llama_benchy.results import BenchmarkMetadata, BenchmarkReport, BenchmarkResults

report = BenchmarkReport.model_validate(json.loads(open(sys.argv[1]).read()))
results = BenchmarkResults()
results.runs = list(report.benchmarks)
results.model_name = report.model
results.metadata = BenchmarkMetadata(**report.model_dump(exclude={"benchmarks"}))
results.save_report(sys.argv[2], "csv", report.max_concurrency)
"""


def report_schema(directory: Path) -> Path:
    """llama-benchy 0.4.0's JSON schema for its reports, written to ``directory``."""
    done = subprocess.run(
        [str(llama_benchy_python()), "-c", _SCHEMA], check=True, capture_output=True, text=True
    )
    path = directory / "benchmark_report_schema.json"
    path.write_text(done.stdout, encoding="utf-8")
    return path


def csv_of(report_json: Path, out: Path) -> str:
    """The CSV llama-benchy 0.4.0 writes for the JSON report at ``report_json``."""
    subprocess.run(
        [str(llama_benchy_python()), "-c", _CSV, str(report_json), str(out)], check=True,
        capture_output=True,
    )  # fmt: skip
    return out.read_text(encoding="utf-8")


def check_schema(report_json: Path, schema: Path) -> subprocess.CompletedProcess[str]:
    """check-jsonschema (the test extra's) on ``report_json``; the caller reads the result."""
    checker = Path(sys.executable).with_name("check-jsonschema")
    return subprocess.run(
        [str(checker), "--schemafile", str(schema), str(report_json)],
        check=False, capture_output=True, text=True,
    )  # fmt: skip


def sample_json() -> Path:
    """llama-benchy 0.4.0's own sample report (``schemas/sample.json``, from its sdist on
    PyPI; cached): the file its repository ships beside the schema."""
    folder = build_once(
        shared_test_cache() / f"llama-benchy-{LLAMA_BENCHY_VERSION}-sample",
        lambda target: sdist_member(
            llama_benchy_python(), f"llama-benchy=={LLAMA_BENCHY_VERSION}",
            "schemas/sample.json", target / "sample.json",
        ),
        f"llama-benchy=={LLAMA_BENCHY_VERSION} sdist\n",
    )  # fmt: skip
    return folder / "sample.json"
