"""`sparkbuild profile export`: a smoke profile and a build's image (by digest) become a
sparkrun recipe. Held against sparkrun 0.4.2's own validator (no finding at all, as
`sparkrun recipe validate --strict` wants) and renderer (the engine command the profile
launches, flag for flag), and read back by `profile import`.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path
from typing import Any

import pytest
import yaml

from sparkbuild import lockfile
from sparkbuild.engines.profiles import SmokeProfile
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


def _lock(project: Path, *, publish: dict[str, Any] | None = None, smoke: str | None = None
          ) -> None:  # fmt: skip
    entry: dict[str, Any] = {"image": {"image_id": IMAGE_ID}}
    if publish is not None:
        entry["publish"] = publish
    if smoke is not None:
        entry["smoke"] = {IMAGE_ID: {"qwen3.6-35b-a3b-mtp-vllm": {"verdict": smoke}}}
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
        "smoke": "pass",
    }  # fmt: skip
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
    assert yaml.safe_load(payload["text"])["metadata"]["sparkbuild"]["smoke"] == "fail"
    assert "no passing smoke verdict on build b's image (fail)" in result.stderr


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


def _engine_words(profile: SmokeProfile) -> list[str]:
    """What the launcher adds for the layout, then the profile's own flags."""
    layout = profile.parallel
    sizes = {"vllm": ["-tp", "-pp"], "sglang": ["--tp-size", "--pp-size"]}[profile.engine]
    words = [sizes[0], str(layout.tp)] if layout.tp > 1 else []
    words += [sizes[1], str(layout.pp)] if layout.pp > 1 else []
    words += profile.args
    if layout.ep > 1:
        words += (
            ["--enable-expert-parallel"]
            if profile.engine == "vllm"
            else ["--ep-size", str(layout.ep)]
        )
    return words


@pytest.mark.upstream
def test_sparkrun_validates_and_renders_every_exported_profile(
    exported: dict[str, Path], tmp_path: Path
) -> None:
    sparkrun: Sparkrun = sparkrun_or_skip(tmp_path)
    names = list(exported)
    answers = sparkrun.ask(
        [{"op": op, "path": str(exported[n])} for n in names for op in ("validate", "render")]
    )
    assert len(names) >= 19
    for name, validated, rendered in zip(names, answers[::2], answers[1::2], strict=True):
        assert validated == {"issues": []}, (name, validated)
        profile = _profile(name)
        argv = rendered["argv"]
        prefix = {
            "vllm": ["vllm", "serve"],
            "sglang": ["python3", "-m", "sglang.launch_server", "--model-path"],
        }[profile.engine]
        assert argv[: len(prefix) + 1] == [*prefix, rendered["model"]], name
        groups = flag_groups(argv[len(prefix) + 1 :])
        words = [w for g in groups if g[0] not in ("--host", "--port") for w in g]
        if profile.engine == "vllm":  # sparkrun names the served model when we do not
            assert words[-2] == "--served-model-name"
            words = words[:-2]
        assert words == _engine_words(profile), name
        assert rendered["env"] == profile.env


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
