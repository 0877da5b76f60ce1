"""`sparkbuild profile import`: Spark Arena / sparkrun recipes made into smoke profiles.

The recipes in tests/data/recipes/ are our own fixtures, written to mirror real files of
spark-arena/recipe-registry at commit 3075780014 (each names the file it mirrors): GitHub is
not reachable from the machines the suite runs on. The github-marked test at the end imports
the real files at that commit where GitHub answers. That the imported profile passes
preflight against the real CPU vLLM is tests/test_recipe_preflight.py.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild.bench.claims import load_claims
from sparkbuild.engines.profiles import load_profile
from sparkbuild.engines.recipes import import_recipe
from sparkbuild.errors import UsageError
from sparkbuild.settings import Settings
from sparkbuild.templates import MAX_EXPANDED
from tests.support.cli import RunCli

RECIPES = Path(__file__).parent / "data" / "recipes"
QWEN_MTP = RECIPES / "qwen3.6-27b-fp8-mtp-vllm.yaml"
MINIMAX_2X = RECIPES / "minimax-m2.7-nvfp4-2x-vllm.yaml"
SGLANG_2X = RECIPES / "minimax-m3-nvfp4-2x-sglang.yaml"
NO_COMMAND = RECIPES / "qwen3-8b-no-command-vllm.yaml"


def _import(run_cli: RunCli, project: Path, *args: str) -> Any:
    return run_cli("--project", str(project), "profile", "import", *args)


def _profile(project: Path, name: str) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load((project / "smoke" / f"{name}.yaml").read_text())
    return data


def test_a_real_format_vllm_recipe_becomes_a_profile_that_loads(
    run_cli: RunCli, tmp_path: Path
) -> None:
    result = _import(run_cli, tmp_path, str(QWEN_MTP), "--engine-version", "0.32.0")
    assert result.exit_code == 0, result.output
    name = QWEN_MTP.stem
    data = _profile(tmp_path, name)
    # Flags rendered from the command with the defaults; host, port and -tp/-pp 1 are gone.
    assert data["args"] == [
        "--max-model-len", "262144", "--max-num-batched-tokens", "32768",
        "--trust-remote-code", "--gpu-memory-utilization", "0.8", "--enable-auto-tool-choice",
        "--tool-call-parser", "qwen3_coder", "--reasoning-parser", "qwen3",
        "--kv-cache-dtype", "fp8", "--load-format", "instanttensor",
        "--attention-backend", "flashinfer",
        "--speculative-config", '{"method": "mtp", "num_speculative_tokens": 2}',
        "--enable-prefix-caching",
    ]  # fmt: skip
    assert data["env"] == {"VLLM_MARLIN_USE_ATOMIC_ADD": "1"}
    assert data["expect"] == {"speculation": True}
    assert "parallel" not in data  # one engine on one Spark: the default layout
    recipe = data["recipe"]
    assert recipe["container"] == "ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest"
    assert recipe["sha256"] == hashlib.sha256(QWEN_MTP.read_bytes()).hexdigest()
    assert recipe["runtime"] == "vllm-distributed"
    assert recipe["not_carried"] == [
        "--chat-template unsloth.jinja",
        "mods: mods/fix-qwen3-coder-next, mods/fix-qwen3.5-chat-template",
    ]
    # Reported, not dropped silently: on the screen and in the file's header.
    assert "dropped  mods: mods/fix-qwen3-coder-next" in result.stdout
    assert "dropped  --chat-template unsloth.jinja" in result.stdout
    text = (tmp_path / "smoke" / f"{name}.yaml").read_text()
    assert "# Not carried: mods: mods/fix-qwen3-coder-next" in text
    settings = Settings(project_dir=tmp_path, cache_dir=tmp_path / "cache")
    loaded_name, profile = load_profile(settings, name)
    assert loaded_name == name and profile.recipe is not None
    assert profile.model == "Qwen/Qwen3.6-27B-FP8" and profile.expect.speculation


@pytest.mark.parametrize(
    ("version", "kept", "said"),
    [
        ("0.17.0", False, "vLLM would fail loading the weights"),
        ("0.32.0", True, None),
        (None, True, "not checked: the engine version is not known"),
    ],
)
def test_a_load_format_the_release_lacks_is_dropped_and_said(
    version: str | None, kept: bool, said: str | None
) -> None:
    from packaging.version import Version

    imported = import_recipe(QWEN_MTP, engine_version=Version(version) if version else None)
    assert ("instanttensor" in imported.profile["args"]) is kept
    notes = [n for n in imported.notes if n.item == "--load-format instanttensor"]
    if said is None:
        assert notes == []
    else:
        assert len(notes) == 1 and said in notes[0].detail
        assert notes[0].status == ("carried" if kept else "dropped")


def test_tensor_parallel_becomes_the_parallel_layout(run_cli: RunCli, tmp_path: Path) -> None:
    result = _import(run_cli, tmp_path, str(MINIMAX_2X), "--name", "minimax-2x", "--json")
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    layout = {"nodes": 2, "tp": 2, "ep": 1, "pp": 1, "launcher": "mp"}
    assert payload["parallel"] == layout
    data = _profile(tmp_path, "minimax-2x")
    assert data["parallel"] == layout
    assert not {"-tp", "-pp", "--host", "--port"} & set(data["args"])
    assert data["args"][:4] == ["--trust-remote-code", "--gpu-memory-utilization", "0.85",
                                "--max-model-len"]  # fmt: skip
    assert data["expect"] == {"speculation": False}


def test_an_sglang_recipe_keeps_its_flags_and_reports_docker_settings() -> None:
    imported = import_recipe(SGLANG_2X)
    profile = imported.profile
    assert profile["engine"] == "sglang"
    assert profile["model"] == "sparkarena/Minimax-M3-v0-NVFP4-REAP25"
    assert profile["args"] == [
        "--mem-fraction-static", "0.81", "--context-length", "32768",
        "--moe-runner-backend", "triton", "--trust-remote-code",
        "--cuda-graph-bs", "1", "2", "4", "8",
    ]  # fmt: skip
    assert imported.parallel == {"nodes": 2, "tp": 2, "ep": 1, "pp": 1, "launcher": "native"}
    assert [(n.item, n.status) for n in imported.dropped] == [("executor_config.user", "dropped")]


def test_a_recipe_without_a_command_renders_the_keys_sparkrun_knows() -> None:
    imported = import_recipe(NO_COMMAND)
    # In sparkrun's order: its flag map's, not the recipe's.
    assert imported.profile["args"] == [
        "--gpu-memory-utilization", "0.9", "--max-model-len", "32768",
        "--enable-prefix-caching", "--trust-remote-code",
    ]  # fmt: skip
    (dropped,) = imported.dropped
    assert dropped.item == "defaults.compilation_level"


def test_overrides_win_over_defaults_as_sparkruns_do(run_cli: RunCli, tmp_path: Path) -> None:
    result = _import(
        run_cli, tmp_path, str(QWEN_MTP), "--name", "short", "-o", "max_model_len=8192",
        "--model", "${SPARKBUILD_CPU_MODEL}",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    data = _profile(tmp_path, "short")
    assert data["args"][:2] == ["--max-model-len", "8192"]
    assert data["model"] == "${SPARKBUILD_CPU_MODEL}"
    assert "changed  model: Qwen/Qwen3.6-27B-FP8 replaced by --model" in result.stdout


def test_a_figure_makes_a_claims_file_bench_reads(run_cli: RunCli, tmp_path: Path) -> None:
    result = _import(
        run_cli, tmp_path, str(MINIMAX_2X), "--name", "mm", "--figure", "decode_tps=38.5",
        "--figure", "ttft_ms=900-1100", "--cell", "pp=2048,tg=128,depth=0,c=1",
        "--claim-url", "https://user:secret@spark-arena.example/board", "--claim-date", "2026-06",
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    path = tmp_path / "claims" / "mm.yaml"
    (claim,) = load_claims(path)
    assert claim.setup_name == "mm" and claim.setup.profile == "mm"
    assert claim.setup.flags == _profile(tmp_path, "mm")["args"]
    assert claim.setup.image == "ghcr.io/spark-arena/dgx-vllm-eugr-nightly:latest"
    assert claim.setup.hardware == "2x DGX Spark (GB10), TP=2"
    assert claim.claim.decode_tps == 38.5 and claim.claim.ttft_ms == (900.0, 1100.0)
    assert (claim.claim.cell.pp, claim.claim.cell.concurrency) == (2048, 1)
    assert "secret" not in path.read_text() and claim.url == "https://spark-arena.example/board"


@pytest.mark.parametrize(
    ("recipe", "args", "message"),
    [
        ('recipe_version: "3"\nmodel: m\n', [], "recipe_version '3': sparkrun 0.4.2 reads "
         "versions 1 and 2"),
        ('include: "@official/qwen3.6-27b-fp8-mtp-vllm"\n', [], "include "
         "'@official/qwen3.6-27b-fp8-mtp-vllm' is a registry recipe"),
        ("include: ../elsewhere\nmodel: m\n", [], "include '../elsewhere' is not a sibling"),
        ("include: recipe\nmodel: m\n", [], "include loops: recipe.yaml -> recipe.yaml"),
        ("include: nowhere\nmodel: m\n", [], "include 'nowhere': no nowhere.yaml or"),
        ("model: m\ndefaults: {tensor_parallel: 2}\nenv: {R: '{launch.node_rank}'}\n", [],
         "env R: {launch.node_rank} is each of the 2 nodes has its own"),
        ("model: m\nenv: {P: '{launch.model_path}'}\n", [], "env P: {launch.model_path} is the "
         "prepared model directory"),
        ("model: m\nenv: {P: '{config.missing}'}\n", [], "env P: {config.missing} needs a "
         "scalar defaults.missing"),
        ("model: m\nruntime: trtllm\ncommand: trtllm-serve {model}\n", [],
         "runtime 'trtllm': sparkbuild launches vLLM, llama.cpp and SGLang only"),
        ("model: m\ncommand: vllm serve {model} --max-model-len {max_len}\n", [],
         "command placeholders with no value: {max_len}"),
        ("model: m\ncommand: vllm serve {model} && rm -rf /\n", [],
         "the recipe's command uses the shell ('&')"),
        ("model: m\ncommand: vllm serve {model} --seed $(date +%s)\n", [],
         "the recipe's command uses the shell"),
        ("model: m\ncommand: |\n  vllm serve {model}\n  echo done\n", [],
         "several lines without '\\' continuations"),
        # bash splits a word at ';' (issue 46: 'a;touch' passed as one argument).
        ("model: m\ncommand: vllm serve {model} --x a;touch /tmp/x\n", [],
         "the recipe's command uses the shell (';')"),
        ('model: m\ncommand: vllm serve {model} --x "$(id)"\n', [],
         "uses the shell: an expansion in double quotes ('$(')"),
        # The model is a field, blank or not (a llama-cpp v1 one was written; issue 46).
        ("model: ' '\n", [], "model: Value error, blank"),
        ("recipe_version: 1\nruntime: llama-cpp\nmodel: ' '\n", [], "model: Value error, blank"),
        # The node range sparkrun reads, against the layout the command runs (issue 42).
        ("model: m\nmin_nodes: 2\n", [], "min_nodes 2: sparkrun runs the recipe on at least 2"),
        ("model: m\ncluster_only: true\n", [], "cluster_only True: sparkrun runs the recipe on "
         "at least 2"),
        ("model: m\nmode: solo\ndefaults: {tensor_parallel: 2}\n", [], "mode solo: sparkrun "
         "runs the recipe on one host, and its layout is 2 ranks"),
        ("model: m\nmax_nodes: 1\ndefaults: {tensor_parallel: 2}\n", [], "max_nodes 1: "
         "sparkrun runs the recipe on one host"),
        ("model: m\nmax_nodes: 2\ndefaults: {tensor_parallel: 4}\n", [], "max_nodes 2: the "
         "layout needs 4 nodes, and sparkrun refuses to run the recipe on more than 2"),
        ("model: m\nmode: both\n", [], "mode 'both': sparkrun reads 'auto', 'solo' or 'cluster'"),
        ("model: m\ndefaults: {tensor_parallel: 2}\ncommand: vllm serve {model}\n", [],
         "defaults.tensor_parallel is 2, which sparkrun places the recipe by"),
        ("model: m\ncommand: bash start.sh {model}\n", [],
         "does not start a vllm server ('bash start.sh m'"),
        ("model: m\ndefaults: {a: '{b}', b: '{a}'}\ncommand: vllm serve {model} --x {a}\n", [],
         "a defaults value refers to itself"),
        ("a: &x [1, 2]\nb: *x\nmodel: m\n", [], "aliases (*x) are not allowed"),
        ("model: m\nmodel: n\n", [], "duplicate key 'model'"),
        ("model: m\n", ["--name", "../escape"], "profile name '../escape'"),
        ("model: m\n", ["--cell", "pp=1"], "--cell and --claim-* describe a --figure"),
        ("model: m\n", ["--figure", "speed=3"], "--figure 'speed=3' is not METRIC=VALUE"),
        ("model: m\n", ["-o", "no equals"], "-o 'no equals' is not KEY=VALUE"),
    ],
)  # fmt: skip
def test_what_cannot_become_a_profile_is_refused_by_name(
    run_cli: RunCli, tmp_path: Path, recipe: str, args: list[str], message: str
) -> None:
    path = tmp_path / "recipe.yaml"
    path.write_text(recipe, encoding="utf-8")
    result = _import(run_cli, tmp_path / "project", str(path), *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr
    assert "Traceback" not in result.output
    assert not (tmp_path / "project" / "smoke").exists()  # nothing half-written


def test_an_existing_profile_is_kept_without_force(run_cli: RunCli, tmp_path: Path) -> None:
    (tmp_path / "smoke").mkdir()
    mine = tmp_path / "smoke" / f"{QWEN_MTP.stem}.yaml"
    mine.write_text("engine: vllm\nmodel: mine\n")
    refused = _import(run_cli, tmp_path, str(QWEN_MTP))
    assert refused.exit_code == 2 and "exists" in refused.stderr
    assert mine.read_text() == "engine: vllm\nmodel: mine\n"
    assert _import(run_cli, tmp_path, str(QWEN_MTP), "--force").exit_code == 0
    assert _profile(tmp_path, QWEN_MTP.stem)["model"] == "Qwen/Qwen3.6-27B-FP8"


def test_an_env_value_from_the_shell_is_dropped_not_expanded(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("model: m\nenv: {HF_TOKEN: '${HF_TOKEN}', KEEP: '1'}\n", encoding="utf-8")
    imported = import_recipe(path)
    assert imported.profile["env"] == {"KEEP": "1"}
    assert [n.item for n in imported.dropped] == ["env HF_TOKEN"]


def test_a_bad_size_names_the_recipe_flag(tmp_path: Path) -> None:
    path = tmp_path / "r.yaml"
    path.write_text("model: m\ncommand: vllm serve {model} -tp two\n", encoding="utf-8")
    with pytest.raises(UsageError, match="tp size 'two' is not a positive whole number"):
        import_recipe(path)


# --- the real files, where GitHub answers -----------------------------------------------------

REGISTRY = "https://raw.githubusercontent.com/spark-arena/recipe-registry/{commit}/{path}"
COMMIT = "307578001460733fcb9335d0e84f8d3e38e40552"
REAL = [
    "official-recipes/qwen3.6/vllm/qwen3.6-27b-fp8-mtp-vllm.yaml",
    "official-recipes/qwen3.6/vllm/qwen3.6-35b-a3b-fp8-vllm.yaml",
    "official-recipes/minimax-m2.7/minimax-m2.7-nvfp4-vllm.yaml",
    "official-recipes/qwen3-coder-next/vllm/qwen3-coder-next-int4-autoround-vllm.yaml",
    "experimental-recipes/minimax-m3/minimax-m3-v0-nvfp4-2x-reap25.yaml",
]


@pytest.mark.github
@pytest.mark.parametrize("path", REAL)
def test_the_real_registry_recipes_import(tmp_path: Path, path: str) -> None:
    with urllib.request.urlopen(REGISTRY.format(commit=COMMIT, path=path), timeout=60) as response:
        local = tmp_path / Path(path).name
        local.write_bytes(response.read())
    imported = import_recipe(local)
    assert imported.profile["args"] and imported.source.container
    assert not any(w.startswith("{") and w.endswith("}") for w in imported.profile["args"])


# Each ends the comment line it lands in, if nothing escapes it, and says what a profile
# must never hold: the host's root mounted, or a shell as the launcher.
INJECTIONS = (
    "x\ncontainer:\n  mounts: ['/:/host:rw']",
    "x\r\ncontainer: {launcher: [sh, -c, 'touch /tmp/pwned']}",
    "x\x85container: {mounts: ['/:/host:rw']}",
    "x\u2028container: {mounts: ['/:/host:rw']}",
    "x\n---\ncontainer: &a {mounts: ['/:/host:rw']}\nexpect: *a",
    "# x: y\n#",
)
# The recipe fields an import writes into the profile (its data or its comment), each one
# set to the injection. The file name reaches the comment too: tested below.
HOSTILE_FIELDS: dict[str, Any] = {
    "container": "{}",
    "description": "{}",
    "model_revision": "{}",
    "mods": ["{}"],
    "pre_exec": ["{}"],
    "env": {"HOSTILE": "{}"},
    "executor_config": {"{}": "yes"},
    "runtime_config": {"{}": 1},
    "{}": "an unknown top-level key",
    "metadata": {"description": "{}"},
}


def _hostile_recipe(path: Path, field: str, text: str) -> Path:
    recipe: dict[str, Any] = yaml.safe_load(NO_COMMAND.read_text())
    value = HOSTILE_FIELDS[field]
    filled = json.loads(json.dumps(value).replace('"{}"', json.dumps(text)))
    recipe[text if field == "{}" else field] = filled
    if field == "executor_config":
        recipe[field] = {text: "yes"}
    if field == "runtime_config":
        recipe[field] = {text: 1}
    path.write_text(yaml.safe_dump(recipe, allow_unicode=True))
    return path


def _read_back(written: Path) -> dict[str, Any]:
    data: dict[str, Any] = yaml.safe_load(written.read_text(encoding="utf-8"))
    return data


@pytest.mark.parametrize("text", INJECTIONS, ids=range(len(INJECTIONS)))
@pytest.mark.parametrize("field", list(HOSTILE_FIELDS))
def test_no_recipe_field_writes_the_profile_it_is_imported_into(
    run_cli: RunCli, tmp_path: Path, field: str, text: str
) -> None:
    """Issue 34, critical: a newline in a recipe field ended the header comment and wrote
    YAML of its own (the host's root mounted, a shell as launcher). Whatever a field holds,
    the written profile reads back as exactly the profile the import made."""
    recipe = _hostile_recipe(tmp_path / "hostile.yaml", field, text)
    imported = import_recipe(recipe)
    result = _import(run_cli, tmp_path, str(recipe), "--name", "hostile")
    assert result.exit_code == 0, result.output
    data = _read_back(tmp_path / "smoke" / "hostile.yaml")
    assert imported.parallel is None and data == imported.profile
    assert set(data.get("container", {})) <= {"gpus", "ipc", "shm_size"}, data
    settings = Settings(project_dir=tmp_path, cache_dir=tmp_path / "cache")
    _, profile = load_profile(settings, "hostile")
    assert profile.recipe is not None and profile.recipe.sha256 == imported.source.sha256


@pytest.mark.parametrize("text", INJECTIONS, ids=range(len(INJECTIONS)))
def test_a_recipe_file_name_stays_in_the_comment_of_profile_and_claims(
    run_cli: RunCli, tmp_path: Path, text: str
) -> None:
    """The recipe's file name is written in the profile's and the claims file's comments."""
    folder = tmp_path / "recipes"
    folder.mkdir()
    recipe = folder / f"{text.replace('/', '_')}.yaml"
    recipe.write_bytes(NO_COMMAND.read_bytes())
    imported = import_recipe(recipe, name="hostile")
    result = _import(
        run_cli, tmp_path, str(recipe), "--name", "hostile", "--figure", "decode_tps=10"
    )
    assert result.exit_code == 0, result.output
    assert _read_back(tmp_path / "smoke" / "hostile.yaml") == imported.profile
    claims = _read_back(tmp_path / "claims" / "hostile.yaml")
    assert set(claims) == {"source", "date", "setups", "claims"}, claims
    assert load_claims(tmp_path / "claims" / "hostile.yaml")


def test_defaults_that_repeat_each_other_are_refused_naming_the_limit(tmp_path: Path) -> None:
    """Issue 34, high: eight defaults of a few bytes each, each repeating the next eight
    times, made a command of 8**7 bytes (and, ten deep, gigabytes) from a 200-byte recipe.
    The one template expander stops at its size limit, saying so."""
    names = "abcdefgh"
    defaults = {n: ("{" + names[i + 1] + "}") * 8 if i + 1 < len(names) else "x"
                for i, n in enumerate(names)}  # fmt: skip
    recipe = tmp_path / "bomb.yaml"
    command = "vllm serve {model} --x {a}"
    recipe.write_text(yaml.safe_dump({"model": "m", "defaults": defaults, "command": command}))
    assert recipe.stat().st_size < 300
    with pytest.raises(UsageError) as raised:
        import_recipe(recipe)
    assert f"expands past {MAX_EXPANDED} bytes (the limit)" in raised.value.message
    assert raised.value.hint == "fix the defaults values"


@pytest.mark.parametrize("step", ["fchmod", "fsync", "replace"])
def test_an_interrupted_import_leaves_the_previous_profile_and_no_scratch(
    run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch, step: str
) -> None:
    """Issue 34, What 4: outputs are written to a temporary file and renamed. Ctrl-C (a real
    SIGINT) before each step leaves the previous profile whole and nothing beside it."""
    assert _import(run_cli, tmp_path, str(NO_COMMAND), "--name", "p").exit_code == 0
    profile = tmp_path / "smoke" / "p.yaml"
    before = profile.read_text()
    owner: Any = os
    original = getattr(owner, step)

    def stop(*args: Any, **kwargs: Any) -> Any:
        os.kill(os.getpid(), signal.SIGINT)
        return original(*args, **kwargs)

    handler = signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        with monkeypatch.context() as patch:
            patch.setattr(owner, step, stop)
            result = _import(run_cli, tmp_path, str(QWEN_MTP), "--name", "p", "--force")
    finally:
        signal.signal(signal.SIGINT, handler)
    assert result.exit_code == 130, result.output
    assert profile.read_text() == before
    assert sorted(p.name for p in profile.parent.iterdir()) == ["p.yaml"]


def test_the_node_range_is_read_in_every_version_and_named(tmp_path: Path) -> None:
    """`mode`, `min_nodes`, `max_nodes` of a version 2 recipe are sparkrun's topology, said
    with the layout (`mode` was described as an unknown runtime_config key)."""
    path = tmp_path / "two.yaml"
    path.write_text(
        "recipe_version: '2'\nmodel: org/m\nmode: cluster\nmin_nodes: 2\nmax_nodes: 4\n"
        "defaults: {tensor_parallel: 2}\n"
    )
    imported = import_recipe(path)
    assert imported.parallel is not None and imported.parallel["nodes"] == 2
    notes = {n.item: (n.status, n.detail) for n in imported.notes}
    assert notes["mode cluster, min_nodes 2, max_nodes 4"] == (
        "carried",
        "sparkrun runs it on 2 to 4 nodes; the profile's layout on 2",
    )
    assert not any("runtime_config" in detail for _status, detail in notes.values())


def test_the_launchers_own_flags_are_left_to_it(tmp_path: Path) -> None:
    """SGLang's --enable-metrics: the launcher adds it to every launch, so the profile need
    not hold it (and its export writes it, so sparkrun runs it too)."""
    path = tmp_path / "metrics.yaml"
    path.write_text(
        "model: org/m\nruntime: sglang\n"
        "command: python3 -m sglang.launch_server --model-path {model} --enable-metrics\n"
    )
    imported = import_recipe(path)
    assert imported.profile["args"] == []
    (note,) = [n for n in imported.notes if n.item == "--enable-metrics"]
    assert (note.status, note.detail) == (
        "replaced",
        "sparkbuild's launcher adds it to every SGLang launch",
    )
