"""The compile cache on the real vLLM CPU engine, which compiles the model with torch
inductor when it does not run eager (its warm-up: 45 s here, loaded): a boot whose compile
outruns the profile's cap is stopped naming what was compiling; a first boot with a fresh
cache compiles and the smoke JSON shows its compile phase (vLLM's compile lines, the files
and bytes the cache gained, 42 files of inductor's); the second boot of the same engine with
the same cache compiles nothing (its warm-up: 8 s)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from sparkbuild.engines.compile_cache import cache_key
from tests.support.smoke_cli import CPU_REFERENCE, run_smoke_cli, write_profile
from tests.support.vllm_cpu import tiny_llama, vllm_server_command

pytestmark = pytest.mark.engine


def _compiled_args() -> list[str]:
    """The CPU reference's flags without --enforce-eager: vLLM compiles (inductor)."""
    args = yaml.safe_load(CPU_REFERENCE.read_text(encoding="utf-8"))["args"]
    return [a for a in args if a != "--enforce-eager"]


# vLLM CPU 0.32 saves an AOT artifact of the compiled model but cannot load it ("Compiling
# model again due to a load failure ... 'function' object has no attribute
# 'finalize_loading'"): every boot compiles again. Without AOT, torch's own FX graph cache
# (TORCHINDUCTOR_CACHE_DIR, in the compile cache) serves the second boot.
NO_AOT = {"VLLM_USE_AOT_COMPILE": "0"}


def test_first_boot_compiles_and_the_second_loads_from_the_cache(tmp_path: Path) -> None:
    launcher, model = vllm_server_command(), tiny_llama()
    cache = tmp_path / "cache"
    env = {"SPARKBUILD_CACHE_DIR": str(cache)}
    write_profile(tmp_path, "compiled", args=_compiled_args(), env=NO_AOT)
    cap = {"compile": {"max_seconds": 1}}
    write_profile(tmp_path, "capped", args=_compiled_args(), env=NO_AOT, expect=cap)
    common = ("--command", launcher, "--model", str(model))

    capped = run_smoke_cli(tmp_path, *common, "--profile", "capped", env=env)
    assert capped.returncode == 1, capped.explain()
    boot = capped.check("boot")
    assert boot["status"] == "fail", capped.explain()
    assert "over the profile's cap of 1 s (expect.compile.max_seconds)" in boot["detail"]
    assert "last compile line:" in boot["detail"] and "compilation" in boot["detail"], boot

    lock = tmp_path / "images.lock"
    lock.write_text(
        yaml.safe_dump({"schema": 1, "builds": {"tiny": {"image": {"image_id": "sha256:current"}}}})
    )
    record = ("--record", "tiny")
    first = run_smoke_cli(
        tmp_path, *common, "--profile", "compiled", "--fresh-compile-cache", *record, env=env
    )
    assert first.result is not None and first.check("boot")["status"] == "pass", first.explain()
    compiled = first.result["compile"]
    assert compiled["first_boot"] and compiled["fresh"], compiled
    assert compiled["files_added"] > 0 and compiled["bytes_added"] > 0, compiled
    # vLLM keeps inductor's output inside its own compile cache (VLLM_CACHE_ROOT: "engine")
    assert any(part.startswith(("engine", "inductor")) for part in compiled["compiled"]), compiled
    assert any("Warming up model for the compilation" in line for line in compiled["lines"])

    second = run_smoke_cli(tmp_path, *common, "--profile", "compiled", *record, env=env)
    assert second.result is not None and second.check("boot")["status"] == "pass"
    again = second.result["compile"]
    assert not again["first_boot"] and again["cache"] == compiled["cache"]
    assert (again["files_added"], again["bytes_added"], again["compiled"]) == (0, 0, []), again
    # The lock keeps the first boot's compiling beside the latest's: the report shows both.
    kept = yaml.safe_load(lock.read_text())["builds"]["tiny"]["smoke"]["sha256:current"]
    phases = kept["compiled"]["compile"]
    assert phases["first_boot"]["files_added"] == compiled["files_added"] > 0, phases
    assert phases["latest"]["files_added"] == 0, phases
    key = cache_key(None, launcher)
    assert compiled["cache"] == key and (cache / "compile-cache" / key / "inductor").is_dir()
