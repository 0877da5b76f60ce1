"""`sparkbuild profile export`: a smoke profile and a build's image (by digest) become a
sparkrun recipe. Held against sparkrun 0.4.2's own validator (no finding at all, as
`sparkrun recipe validate --strict` wants) and renderer (the engine command the profile
launches, flag for flag), and read back by `profile import`.
"""

from __future__ import annotations

import json
import re
import subprocess
from collections import Counter
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild import lockfile
from sparkbuild.adapters import adapter_type
from sparkbuild.engines.profiles import SmokeProfile
from sparkbuild.engines.recipe_command import ours
from sparkbuild.engines.recipe_writer import (
    RecipeSpec,
    export_recipe,
    flag_groups,
    recipe_document,
    recipe_yaml,
)
from sparkbuild.engines.recipes import import_recipe
from sparkbuild.errors import UsageError
from sparkbuild.yamlfile import load_model
from tests.support.cli import RunCli
from tests.support.sparkrun_peer import Sparkrun, sparkrun_or_skip

ROOT = Path(__file__).resolve().parents[1]
SMOKE = ROOT / "smoke"
DIGEST = "sha256:" + "cd" * 32
IMAGE_ID = "sha256:" + "ab" * 32
REPO = "127.0.0.1:5000/sparkbuild/vllm"
MODEL = "Qwen/Qwen3-8B"  # for profiles whose model comes from the environment


def _profile(name: str) -> SmokeProfile:
    return load_model(SMOKE / f"{name}.yaml", SmokeProfile)


def shipped() -> list[str]:
    return sorted(p.stem for p in SMOKE.glob("*.yaml"))


#: A smoke record of a run of the image itself (verified), and of a URL (nothing shows which
#: image answered).
VERIFIED = {"verified": True, "image_id": IMAGE_ID, "target": "image:sparkbuild/vllm:0.33"}
UNVERIFIED = {"verified": False, "target": "url:http://127.0.0.1:8000"}


def _lock(project: Path, *, publish: dict[str, Any] | None = None, smoke: str | None = None,
          how: dict[str, object] = VERIFIED) -> None:  # fmt: skip
    entry: dict[str, Any] = {"image": {"image_id": IMAGE_ID}}
    if publish is not None:
        entry["publish"] = publish
    if smoke is not None:
        entry["smoke"] = {IMAGE_ID: {"qwen3.6-35b-a3b-mtp-vllm": {"verdict": smoke, **how}}}
    lock = lockfile.LockFile.model_validate({"schema": lockfile.SCHEMA, "builds": {"b": entry}})
    (project / "images.lock").write_text(lockfile.dumps(lock), encoding="utf-8")


def _export(run_cli: RunCli, project: Path, *args: str) -> Any:
    return run_cli("--project", str(project), "profile", "export", *args)


def test_a_profile_becomes_a_recipe_running_the_builds_published_digest(
    run_cli: RunCli, tmp_path: Path
) -> None:
    (tmp_path / "smoke").mkdir()
    (tmp_path / "smoke" / "qwen3.6-35b-a3b-mtp-vllm.yaml").write_bytes(
        (SMOKE / "qwen3.6-35b-a3b-mtp-vllm.yaml").read_bytes()
    )
    _lock(tmp_path, publish={REPO: {"tag": "0.33-spark", "digest": DIGEST}}, smoke="pass")
    out = tmp_path / "recipe.yaml"
    result = _export(run_cli, tmp_path, "qwen3.6-35b-a3b-mtp-vllm", "--build", "b",
                     "--out", str(out))  # fmt: skip
    assert result.exit_code == 0, result.output
    recipe = yaml.safe_load(out.read_text())
    assert recipe["container"] == f"{REPO}@{DIGEST}"
    assert recipe["runtime"] == "vllm"
    assert recipe["metadata"]["sparkbuild"] == {
        "profile": "qwen3.6-35b-a3b-mtp-vllm", "build": "b", "image_id": IMAGE_ID,
        "smoke": {"verdict": "pass", "verified": True},
    }  # fmt: skip
    assert (recipe.get("min_nodes", 1), recipe["max_nodes"]) == (1, 1)  # what smoke ran
    # The flags sparkrun's map knows are tunable defaults, referenced by placeholder.
    assert recipe["defaults"]["max_model_len"] == 32768
    assert recipe["defaults"]["speculative_config"] == (
        '{"method":"mtp","num_speculative_tokens":3}'
    )
    assert "--max-model-len {max_model_len}" in recipe["command"]
    assert "--speculative-config '{speculative_config}'" in recipe["command"]
    assert "warning" not in result.stderr
    # Read back, it is the profile's launch.
    again = import_recipe(out)
    assert again.profile["args"] == _profile("qwen3.6-35b-a3b-mtp-vllm").args
    assert again.profile["expect"]["speculation"] is True


def test_an_unchecked_image_is_exported_with_a_warning(run_cli: RunCli, tmp_path: Path) -> None:
    _lock(tmp_path, publish={REPO: {"digest": DIGEST}}, smoke="fail")
    result = _export(run_cli, tmp_path, str(SMOKE / "qwen3.6-35b-a3b-mtp-vllm.yaml"),
                     "--build", "b", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    payload = json.loads(result.stdout)
    assert payload["container"] == f"{REPO}@{DIGEST}" and payload["recipe"] is None
    assert yaml.safe_load(payload["text"])["metadata"]["sparkbuild"]["smoke"] == {
        "verdict": "fail", "verified": True,
    }  # fmt: skip
    assert "no passing smoke verdict on build b's image (fail)" in result.stderr


def test_an_unverified_pass_is_written_as_one(run_cli: RunCli, tmp_path: Path) -> None:
    """A pass of a run against a URL shows nothing of which image answered: the recipe says
    so, and the export warns (it wrote `smoke: pass`, silently)."""
    _lock(tmp_path, publish={REPO: {"digest": DIGEST}}, smoke="pass", how=UNVERIFIED)
    result = _export(run_cli, tmp_path, str(SMOKE / "qwen3.6-35b-a3b-mtp-vllm.yaml"),
                     "--build", "b", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    origin = yaml.safe_load(json.loads(result.stdout)["text"])["metadata"]["sparkbuild"]
    assert origin["smoke"] == {"verdict": "pass", "verified": False}
    assert "smoke pass on build b's image is unverified (a url run" in result.stderr


@pytest.mark.parametrize(
    ("publish", "found"),
    [(None, None), ({REPO: {"digest": DIGEST}}, "b")],
)
def test_an_image_named_by_digest_gets_its_builds_verdict_or_a_warning(
    run_cli: RunCli, tmp_path: Path, publish: dict[str, Any] | None, found: str | None
) -> None:
    """--image: the lock's build of that digest gives the verdict; with none, the recipe is
    written with the warning the docs promise (it was written silently)."""
    if publish is not None:
        _lock(tmp_path, publish=publish, smoke="pass")
    result = _export(run_cli, tmp_path, str(SMOKE / "qwen3.6-35b-a3b-mtp-vllm.yaml"),
                     "--image", f"{REPO}@{DIGEST}", "--json")  # fmt: skip
    assert result.exit_code == 0, result.output
    origin = yaml.safe_load(json.loads(result.stdout)["text"])["metadata"]["sparkbuild"]
    if found is None:
        assert "build" not in origin
        assert f"the image {REPO}@{DIGEST} has no smoke verdict of profile" in result.stderr
    else:
        assert origin["build"] == found and origin["smoke"]["verdict"] == "pass"
        assert "warning" not in result.stderr


@pytest.mark.parametrize(
    ("lock", "args", "message"),
    [
        (None, ["--build", "nope"], "build 'nope' is not in"),
        ({}, ["--build", "b"], "build b has no image in a registry"),
        ({REPO: {"digest": DIGEST}, "ghcr.io/me/vllm": {"digest": DIGEST}}, ["--build", "b"],
         "published to 2 repositories: 127.0.0.1:5000/sparkbuild/vllm, ghcr.io/me/vllm"),
        ({}, ["--image", f"{REPO}:latest"], "is not a reference by digest"),
        ({}, ["--image", f"repo//name@{DIGEST}"], "is not a reference by digest"),
        ({}, [], "pass --build BUILD or --image"),
        ({}, ["--image", f"{REPO}@{DIGEST}", "--model", "./models/local"],
         "'./models/local' is neither a hub id"),
        ({}, ["--image", f"{REPO}@{DIGEST}", "--model", "${HOME}/m"], "not one plain shell word"),
    ],
)  # fmt: skip
def test_what_cannot_become_a_recipe_is_refused_by_name(
    run_cli: RunCli, tmp_path: Path, lock: dict[str, Any] | None, args: list[str], message: str
) -> None:
    if lock is not None:
        _lock(tmp_path, publish=lock)
    out = tmp_path / "r.yaml"
    result = _export(run_cli, tmp_path, str(SMOKE / "qwen3.6-35b-a3b-mtp-vllm.yaml"), *args,
                     "--out", str(out))  # fmt: skip
    assert result.exit_code == 2, result.output
    assert message in result.stderr and "Traceback" not in result.output
    assert not out.exists()


def test_an_existing_recipe_is_kept_without_force(run_cli: RunCli, tmp_path: Path) -> None:
    out = tmp_path / "r.yaml"
    out.write_text("mine\n")
    args = [str(SMOKE / "cpu-reference.yaml"), "--image", f"{REPO}@{DIGEST}", "--model",
            "Qwen/Qwen3-0.6B", "--out", str(out)]  # fmt: skip
    refused = _export(run_cli, tmp_path, *args)
    assert refused.exit_code == 2 and "exists" in refused.stderr and out.read_text() == "mine\n"
    assert _export(run_cli, tmp_path, *args, "--force").exit_code == 0
    assert yaml.safe_load(out.read_text())["model"] == "Qwen/Qwen3-0.6B"


# --- every shipped profile, held against sparkrun 0.4.2 --------------------------------------


@pytest.fixture(scope="module")
def exported(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Every shipped profile as a recipe of the same image."""
    root = tmp_path_factory.mktemp("exported")
    paths: dict[str, Path] = {}
    for name in shipped():
        profile = _profile(name)
        model = MODEL if "${" in profile.model else None
        document = export_recipe(name, profile, f"{REPO}@{DIGEST}", model=model)
        paths[name] = root / f"{name}.yaml"
        paths[name].write_text(recipe_yaml(document), encoding="utf-8")
    return paths


def _launched(profile: SmokeProfile) -> list[str]:
    """The engine words of the profile's launch past the model: the layout's sizes, the
    flags of the launcher's own command past its bind address and port (``serve_args``:
    SGLang's --enable-metrics, then the profile's flags), the expert-parallel flag."""
    adapter = adapter_type(profile.engine)
    layout, facts = profile.parallel, adapter.recipes
    words: list[str] = []
    for key, size in (("tensor_parallel", layout.tp), ("pipeline_parallel", layout.pp)):
        words += [facts.rendered_keys[key], str(size)] if size > 1 else []
    served = adapter().serve_args(MODEL, "0.0.0.0", 8000, profile.args)
    words += served[served.index("--port") + 2 :]
    if layout.ep > 1:
        words += [w.replace("{ep}", str(layout.ep)) for w in facts.expert_parallel_args]
    return words


def _without_ours(profile: SmokeProfile, words: list[str]) -> list[str]:
    """``words`` less the flags that differ by design (the one list, recipe_command.ours)."""
    by_design = {o.flag for o in ours(adapter_type(profile.engine))}
    return [w for g in flag_groups(words) if g[0] not in by_design for w in g]


def _groups(profile: SmokeProfile) -> Counter[tuple[str, ...]]:
    """The launch's flag groups in any order, a parallel size of 1 (the default) left out."""
    sizes = adapter_type(profile.engine).recipes.parallel_flags
    groups = [tuple(g) for g in flag_groups(_launched(profile))]
    return Counter(g for g in groups if not (g[0] in sizes and g[1:] == ("1",)))


@pytest.mark.upstream
def test_sparkrun_validates_and_renders_every_exported_profile(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    """sparkrun runs what smoke ran, flag for flag (the launcher's own flags too: 6 SGLang
    profiles ran with --enable-metrics and were exported without it), and the recipe
    imports back as the profile."""
    sparkrun: Sparkrun = sparkrun_or_skip(tmp_path)
    names = list(exported)
    answers = sparkrun.ask(
        [{"op": op, "path": str(exported[n])} for n in names for op in ("validate", "render")]
    )
    assert len(names) >= 21
    assert {_profile(n).engine for n in names} == {"llamacpp", "sglang", "vllm"}
    for name, validated, rendered in zip(names, answers[::2], answers[1::2], strict=True):
        assert validated == {"issues": []}, (name, validated)
        profile = _profile(name)
        prefix = adapter_type(profile.engine).recipes.export_command.split()[:-1]
        argv = rendered["argv"]
        assert argv[: len(prefix) + 1] == [*prefix, rendered["model"]], name
        theirs = _without_ours(profile, argv[len(prefix) + 1 :])
        assert theirs == _without_ours(profile, _launched(profile)), name
        assert rendered["env"] == profile.env
        assert rendered["nodes"]["min"] == rendered["nodes"]["max"] == profile.parallel.nodes
        back = import_recipe(exported[name])  # the same launch (the launcher's flags aside)
        again = profile.model_copy(update={"args": back.profile["args"]})
        assert _groups(again) == _groups(profile), name
        assert back.profile["env"] == profile.env
        assert (back.parallel or {}).get("nodes", 1) == profile.parallel.nodes
        assert back.profile["expect"]["speculation"] == bool(profile.expect.speculation)


@pytest.mark.upstream
def test_the_check_fails_on_a_recipe_sparkrun_would_question(tmp_path: Path) -> None:
    """The validator above is not blind: a hardcoded length and an unknown key are found."""
    sparkrun: Sparkrun = sparkrun_or_skip(tmp_path)
    document = export_recipe("q", _profile("qwen3.6-35b-a3b-mtp-vllm"), f"{REPO}@{DIGEST}")
    document["command"] = document["command"].replace("{max_model_len}", "32768")
    del document["defaults"]["max_model_len"]
    document["defaults"]["lm_head_dtype"] = "bf16"
    bad = tmp_path / "bad.yaml"
    bad.write_text(recipe_yaml(document), encoding="utf-8")
    issues = sparkrun.one({"op": "validate", "path": str(bad)})["issues"]
    assert sorted(i["code"] for i in issues) == ["hardcoded-serve-flag", "unmapped-config-key"]


# --- a model a shell would run (sparkrun writes it into the serve command unquoted) ----------

#: Models that a shell splits or runs: each would execute on every node sparkrun starts.
HOSTILE_MODELS = [
    "/models/m;touch /tmp/pwned;#",
    "/models/`touch /tmp/pwned`",
    "/models/m\ntouch /tmp/pwned",
    "/models/m$(touch /tmp/pwned)",
    "/models/m|tee /tmp/pwned",
    "/models/a model",
    "/models/m'x",
    "/models/m{x}",
]


def _hostile_recipe(path: Path, model: str) -> Path:
    document = {
        "recipe_version": "2",
        "model": model,
        "runtime": "vllm",
        "container": f"{REPO}@{DIGEST}",
        "defaults": {"port": 8000, "host": "0.0.0.0"},
        "command": "vllm serve {model} \\\n  --host {host} \\\n  --port {port}\n",
    }
    path.write_text(yaml.safe_dump(document, sort_keys=False), encoding="utf-8")
    return path


@pytest.mark.parametrize("model", HOSTILE_MODELS)
def test_a_model_a_shell_would_run_is_never_exported(
    run_cli: RunCli, tmp_path: Path, model: str
) -> None:
    out = tmp_path / "r.yaml"
    by_flag = _export(run_cli, tmp_path, str(SMOKE / "cpu-reference.yaml"), "--image",
                      f"{REPO}@{DIGEST}", "--model", model, "--out", str(out))  # fmt: skip
    assert by_flag.exit_code == 2, by_flag.output
    assert "--model" in by_flag.stderr and "not one plain shell word" in by_flag.stderr
    profile = yaml.safe_load((SMOKE / "cpu-reference.yaml").read_text(encoding="utf-8"))
    (tmp_path / "hostile.yaml").write_text(yaml.safe_dump({**profile, "model": model}))
    by_profile = _export(run_cli, tmp_path, str(tmp_path / "hostile.yaml"), "--image",
                         f"{REPO}@{DIGEST}", "--out", str(out))  # fmt: skip
    assert by_profile.exit_code == 2, by_profile.output
    assert "the profile's model" in by_profile.stderr and "Traceback" not in by_profile.output
    assert not out.exists()


@pytest.mark.parametrize("model", HOSTILE_MODELS)
def test_a_downloaded_recipe_whose_model_a_shell_would_run_is_not_imported(
    run_cli: RunCli, tmp_path: Path, model: str
) -> None:
    recipe = _hostile_recipe(tmp_path / "downloaded.yaml", model)
    out = tmp_path / "profile.yaml"
    result = run_cli("--project", str(tmp_path), "profile", "import", str(recipe),
                     "--out", str(out))  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "model" in result.stderr and "not one plain shell word" in result.stderr
    assert "Traceback" not in result.output and not out.exists()


@pytest.mark.upstream
def test_sparkruns_renderer_would_run_the_model_as_shell_code(tmp_path: Path) -> None:
    """Why the two refusals above matter: sparkrun 0.4.2 renders such a recipe, and a shell
    running its command runs the model's second command (here: it creates a file)."""
    sparkrun: Sparkrun = sparkrun_or_skip(tmp_path)
    marker = tmp_path / "ran"
    recipe = _hostile_recipe(tmp_path / "downloaded.yaml", f"/models/m;touch {marker};#")
    rendered = sparkrun.one({"op": "render", "path": str(recipe)})
    subprocess.run(["bash", "-c", rendered["command"]], env={"PATH": "/usr/bin:/bin"},
                   capture_output=True, check=False, timeout=30)  # fmt: skip
    assert marker.exists(), rendered["command"]
    with pytest.raises(UsageError, match="not one plain shell word"):
        import_recipe(recipe)


def test_no_recipe_writer_takes_a_model_a_shell_would_run() -> None:
    """``bench --arena`` writes its recipe through the same writer as ``profile export``."""
    spec = RecipeSpec(engine="vllm", runtime="vllm", model=HOSTILE_MODELS[0], args=[])
    with pytest.raises(UsageError, match=r"the recipe's model .* not one plain shell word"):
        recipe_document(spec)
    assert recipe_document(RecipeSpec("vllm", "vllm", "/models/m-1.5_b", []))["model"]


# --- values sparkrun would change, and values the shell would split ------------------------


def _cpu(args: list[str], env: dict[str, str] | None = None) -> SmokeProfile:
    return _profile("cpu-reference").model_copy(update={"args": args, "env": env or {}})


@pytest.mark.parametrize(
    ("args", "env", "held"),
    [
        (["--api-key", "key-{port}"], {}, "'{port}'"),
        (["--chat-template", "{{ messages }}"], {}, "'{{'"),
        ([], {"SEED": "{config.seed}"}, "'{config.'"),
        ([], {"SEED": "{{launch.node_rank}}"}, "'{{launch.'"),
    ],
)
def test_a_value_sparkrun_would_fill_is_refused(
    args: list[str], env: dict[str, str], held: str
) -> None:
    """sparkrun fills ``{key}`` in a command, collapses doubled braces once one is there, and
    fills ``{config.*}``/``{launch.*}`` in env: the engine would get another value than the
    profile's (the export wrote them as they were)."""
    with pytest.raises(UsageError, match=f"holds {re.escape(held)}, which sparkrun fills"):
        export_recipe("p", _cpu(args, env), f"{REPO}@{DIGEST}", model="Qwen/Qwen3-0.6B")


def test_a_flag_value_with_a_line_break_reimports(tmp_path: Path) -> None:
    """A quoted line break is one argument to bash; the import refused the exported recipe
    as 'several lines'."""
    profile = _cpu(["--response-role", "line one\nline two", "--max-model-len", "512"])
    path = tmp_path / "r.yaml"
    path.write_text(recipe_yaml(export_recipe("p", profile, f"{REPO}@{DIGEST}",
                                              model="Qwen/Qwen3-0.6B")))  # fmt: skip
    assert import_recipe(path).profile["args"] == profile.args


@pytest.mark.upstream
def test_sparkrun_fills_a_literal_placeholder_and_keeps_a_line_break(tmp_path: Path) -> None:
    """What the refusal above guards against, and what the line-break export relies on, as
    sparkrun 0.4.2 renders them."""
    sparkrun: Sparkrun = sparkrun_or_skip(tmp_path)
    spec = RecipeSpec(engine="vllm", runtime="vllm", model="Qwen/Qwen3-0.6B",
                      args=["--api-key", "key-{port}", "--response-role", "a\nb"])  # fmt: skip
    path = tmp_path / "literal.yaml"
    path.write_text(recipe_yaml(recipe_document(spec)))
    argv = sparkrun.one({"op": "render", "path": str(path)})["argv"]
    assert argv[argv.index("--api-key") + 1] == "key-8000"
    assert argv[argv.index("--response-role") + 1] == "a\nb"
