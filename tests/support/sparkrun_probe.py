"""Asks sparkrun 0.4.2's own code about recipes and submissions; prints one JSON object.

Run only by ``tests/support/sparkrun_peer.py``, with the python of the cached venv that holds
``sparkrun==0.4.2`` (Python >= 3.12), telemetry off and no network. This file is ours: it
calls sparkrun's public functions and reports what they answered, and copies none of them.

``python sparkrun_probe.py REQUESTS.json``, a list of ``{"op": ..., ...}`` answered in one
process (sparkrun's start-up is most of a request's time), one answer each:

* ``render`` ``{path, overrides}``: the recipe as sparkrun loads it (runtime, version,
  builder, node range) and the serve command its runtime generates
  (``get_runtime(runtime).generate_command(recipe, overrides, is_cluster=False)``);
* ``validate`` ``{path}``: every finding of ``validate_recipe`` (what ``sparkrun recipe
  validate`` prints; ``--strict`` fails on warnings);
* ``submission`` ``{path}``: the Arena plugin's ``validate_recipe_for_submission`` on the
  recipe, with a recorder standing in for the terminal: whether it would have asked
  "Continue?" and what it said;
* ``csv`` ``{benchmark_json}``: sparkrun's ``json_to_csv`` of a llama-benchy JSON;
* ``resume`` ``{benchmark_json, args, schedule}``: llama-benchy's task list for a profile
  (``build_task_list``) and which tasks sparkrun's gap detection finds covered by the JSON;
* ``flag_maps``: the vLLM, SGLang and llama-cpp maps from defaults keys to flags (names
  only; llama-cpp's keys it renders its own way and its defaults too), and how its metadata
  shows a runtime;
* ``metadata`` ``{path, ...}``: the submission metadata sparkrun's ``generate_metadata``
  writes for this recipe (no image resolution, hosts pseudonymised).
"""

from __future__ import annotations

import functools
import json
import os
import shlex
import sys
from datetime import datetime
from pathlib import Path
from typing import Any

os.environ.setdefault("SPARKRUN_NO_TELEMETRY", "1")
os.environ.setdefault("HF_HUB_OFFLINE", "1")


@functools.cache
def _variables() -> Any:
    from sparkrun.core.bootstrap import init_sparkrun

    return init_sparkrun()


def _load(path: str) -> Any:
    from sparkrun.core.recipe import Recipe

    return Recipe.load(path)


def render(request: dict[str, Any]) -> dict[str, Any]:
    from sparkrun.core.bootstrap import get_runtime

    variables = _variables()
    recipe = _load(request["path"])
    runtime = get_runtime(recipe.runtime, variables)
    command = runtime.generate_command(recipe, dict(request.get("overrides") or {}), False)
    joined = command.replace("\\\n", " ")
    return {
        "runtime": recipe.runtime,
        "recipe_version": str(recipe.recipe_version),
        "builder": recipe.builder or None,
        "model": recipe.model,
        "command": command,
        "argv": shlex.split(joined),
        "env": {str(k): str(v) for k, v in (recipe.env or {}).items()},
        "defaults": _plain(recipe.defaults),
        "nodes": {"mode": recipe.mode, "min": recipe.min_nodes, "max": recipe.max_nodes},
    }


def _plain(value: Any) -> Any:
    return json.loads(json.dumps(value, default=str))


def _issues(path: str) -> list[dict[str, Any]]:
    from sparkrun.core.validation import validate_recipe

    issues = validate_recipe(_load(path), v=_variables())
    return [{"severity": i.severity, "code": i.code, "message": i.message} for i in issues]


def validate(request: dict[str, Any]) -> dict[str, Any]:
    return {"issues": _issues(request["path"])}


class _Recorder:
    """Stands in for sparkrun's terminal: records what it says and whether it asks."""

    def __init__(self) -> None:
        self.said: list[str] = []
        self.asked: list[str] = []

    def info(self, text: str) -> None:
        self.said.append(str(text))

    def confirm(self, text: str, default: bool = False) -> bool:
        self.asked.append(str(text))
        return False


class _Session:
    def __init__(self) -> None:
        from sparkrun.core.config import SparkrunConfig

        self.config = SparkrunConfig()
        self.variables = _variables()


class _Context:
    def __init__(self) -> None:
        self.sctx = _Session()
        self.emitter = _Recorder()
        self.dry_run = False


def submission(request: dict[str, Any]) -> dict[str, Any]:
    from sparkrun.plugins.sparkarena.integration import validate_recipe_for_submission

    context = _Context()
    error = None
    try:
        validate_recipe_for_submission(_load(request["path"]), context=context)
    except Exception as exc:  # sparkrun's BenchmarkFailed: the gate refused
        error = f"{type(exc).__name__}: {exc}"
    return {"said": context.emitter.said, "asked": context.emitter.asked, "error": error}


def to_csv(request: dict[str, Any]) -> dict[str, Any]:
    from sparkrun.benchmarking.llama_benchy import json_to_csv

    data = json.loads(Path(request["benchmark_json"]).read_text(encoding="utf-8"))
    return {"csv": json_to_csv(data)}


def resume(request: dict[str, Any]) -> dict[str, Any]:
    from sparkrun.core.bootstrap import get_benchmarking_framework

    framework = get_benchmarking_framework("llama-benchy", _variables())
    tasks = framework.build_task_list(dict(request["args"]), request.get("schedule"))
    data = json.loads(Path(request["benchmark_json"]).read_text(encoding="utf-8"))
    covered = framework.consolidated_coverage_keys(framework.consolidate_per_task_results([data]))
    keys = [list(framework.task_coverage_key(task)) for task in tasks]
    return {
        "tasks": keys,
        "covered": [key for key in keys if tuple(key) in covered],
        "missing": [key for key in keys if tuple(key) not in covered],
    }


def metadata(request: dict[str, Any]) -> dict[str, Any]:
    from sparkrun.benchmarking.base import BenchmarkExecution

    recipe = _load(request["path"])
    execution = BenchmarkExecution(
        success=True,
        start_time=datetime.fromisoformat(request["start"]),
        end_time=datetime.fromisoformat(request["end"]),
        recipe=recipe,
        overrides={},
        cluster_id=request["cluster_id"],
        host_list=list(request["hosts"]),
        container_image=request.get("container"),
        image_context_known=True,
        runtime_info=dict(request.get("runtime_info") or {}),
        profile=request.get("profile"),
        benchmark_args=request.get("args"),
        framework_name=request.get("framework", "llama-benchy"),
        category=request.get("category", "performance"),
    )
    if request.get("pinned"):  # the image as sparkrun records one it resolved to a digest
        execution.container_image_sha = request["container"]
        execution.container_image_sha_pinned = True
    return {"metadata": _plain(execution.generate_metadata(resolve_image=False))}


def flag_maps(request: dict[str, Any]) -> dict[str, Any]:
    from sparkrun.core import validation
    from sparkrun.runtimes import _vllm_common, llama_cpp, sglang
    from sparkrun.utils.runtime_display import RUNTIME_DISPLAY

    return {
        "runtime_display": dict(RUNTIME_DISPLAY),
        "read_keys": {k: list(v) for k, v in validation._FLAG_ALIASES.items()},
        "read_key_reasons": list(validation.SPARKRUN_READ_CONFIG_KEYS),
        "vllm": {
            "flags": dict(_vllm_common.VLLM_FLAG_MAP),
            "booleans": sorted(_vllm_common.VLLM_BOOL_FLAGS),
            "negatable": sorted(_vllm_common.VLLM_NEGATABLE_BOOL_FLAGS),
        },
        "sglang": {
            "flags": dict(sglang._SGLANG_FLAG_MAP),
            "booleans": sorted(sglang._SGLANG_BOOL_FLAGS),
            "negatable": [],
        },
        "llamacpp": {
            "flags": dict(llama_cpp.LlamaCppRuntime().serve_flag_map()),
            "booleans": sorted(llama_cpp._LLAMA_CPP_BOOL_FLAGS),
            "negatable": [],
            "special": sorted(llama_cpp._LLAMA_CPP_SPECIAL_KEYS),
            "defaults": dict(llama_cpp._LLAMA_CPP_DEFAULTS),
        },
    }


OPS = {
    "render": render,
    "validate": validate,
    "submission": submission,
    "csv": to_csv,
    "resume": resume,
    "metadata": metadata,
    "flag_maps": flag_maps,
}


def answer(request: dict[str, Any]) -> dict[str, Any]:
    try:
        return OPS[request["op"]](request)
    except Exception as exc:  # sparkrun refused the input: say how, as data
        return {"error": f"{type(exc).__name__}: {exc}"}


def main() -> None:
    from sparkrun import __version__

    requests = json.loads(Path(sys.argv[1]).read_text(encoding="utf-8"))
    print(json.dumps({"sparkrun": __version__, "answers": [answer(r) for r in requests]}))


if __name__ == "__main__":
    main()
