"""A second boot of the same engine with the compile cache, against the first, in one run.

The vLLM CPU engine with the CPU reference profile's flags but without --enforce-eager, so
it compiles the model with torch inductor. `sparkbuild smoke --command ...` boots it twice
with one cache directory: the first boot with `--fresh-compile-cache` (an empty cache:
the first boot of an image on a host), the second as is. Prints each boot's time (as smoke
measured it), the compile phase the smoke JSON gives (vLLM's own compile seconds, the files
and bytes the cache gained) and the ratio second/first. The second boot should compile
nothing and be the faster.

    python benchmarks/bench_compile_cache.py
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

import yaml

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO))

from tests.support.vllm_cpu import tiny_llama, vllm_server_command  # noqa: E402


def _profile(project: Path) -> None:
    data = yaml.safe_load((REPO / "smoke" / "cpu-reference.yaml").read_text(encoding="utf-8"))
    data["args"] = [a for a in data["args"] if a != "--enforce-eager"]
    # vLLM CPU 0.32 cannot load the AOT artifact it saves (every boot compiles again, see
    # tests/test_smoke_compile_cache.py); without it torch's FX graph cache serves later boots.
    data["env"]["VLLM_USE_AOT_COMPILE"] = "0"
    data["expect"] = {k: v for k, v in data.get("expect", {}).items() if k == "max_tokens"}
    (project / "smoke").mkdir(parents=True)
    (project / "smoke" / "compiled.yaml").write_text(yaml.safe_dump(data), encoding="utf-8")


def _boot(project: Path, cache: Path, launcher: str, model: Path, *extra: str) -> dict[str, Any]:
    out = project / "result.json"
    argv = [
        *(sys.executable, "-m", "sparkbuild", "--project", str(project), "smoke"),
        *("--command", launcher, "--profile", "compiled", "--model", str(model)),
        *("--json-file", str(out), *extra),
    ]
    env = {**os.environ, "SPARKBUILD_CACHE_DIR": str(cache)}
    done = subprocess.run(argv, env=env, capture_output=True, text=True, check=False)
    if not out.exists():
        raise SystemExit(f"smoke wrote no result:\n{done.stderr[-3000:]}")
    result: dict[str, Any] = json.loads(out.read_text(encoding="utf-8"))
    out.unlink()
    return result


def _line(name: str, result: dict[str, Any]) -> str:
    phase = result["compile"] or {}
    return (
        f"{name}: boot {result['boot_seconds']:.1f} s, verdict {result['verdict']}; "
        f"vLLM compile {phase.get('seconds')} s; cache +{phase.get('files_added')} files, "
        f"+{phase.get('bytes_added', 0) / 1e6:.1f} MB ({', '.join(phase.get('compiled', []))})"
    )


def main() -> None:
    launcher, model = vllm_server_command(), tiny_llama()
    with tempfile.TemporaryDirectory(prefix="bench-compile-cache-") as tmp:
        project, cache = Path(tmp) / "project", Path(tmp) / "cache"
        _profile(project)
        first = _boot(project, cache, launcher, model, "--fresh-compile-cache")
        second = _boot(project, cache, launcher, model)
    print(_line("first boot (empty cache)", first))
    print(_line("second boot (same cache)", second))
    ratio = second["boot_seconds"] / first["boot_seconds"]
    print(f"second/first boot: {ratio:.2f}")


if __name__ == "__main__":
    main()
