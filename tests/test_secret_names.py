"""Secrets by name and by value (issue 34, What 6): one list of secret-looking names
(``*_TOKEN``, ``*_KEY``, ``*_SECRET*``, ``*PASSWORD*``, ``--api-key``-style flags) shared by
every output: the terminal, the engine's log, JSON, the lock and the arena submission.

The end-to-end case runs the real command line against a small engine on loopback
(``openai_stub``'s server, started by ``bench --command``) that echoes its flags and its
secret-looking environment to its log, as engines do at boot.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
import yaml

from sparkbuild import redact
from sparkbuild.bench import arena
from sparkbuild.bench.record import bench_record
from sparkbuild.engines.profiles import SmokeProfile
from tests.support.cli import RunCli

ROOT = Path(__file__).resolve().parents[1]
API_KEY = "sk-live-Q7x2k9Lm"  # the engine's --api-key, in the profile's args
NAMED = {  # secrets in the environment an engine echoes, none of them known to sparkbuild
    "NGC_API_KEY": "nvapi-H3s9pW2c8z",
    "OPENAI_API_KEY": "sk-proj-R4t6yU8i",
    "AWS_SECRET_ACCESS_KEY": "wJalrXUtnFEMI/K7MDENG",
    "SPARKBUILD_SIGNING_PASSWORD": "pass-Z5x7c9v1",
    "SPARKBUILD_SIGNING_KEY": "-----BEGIN PRIVATE KEY-----MIIEv0wLs",
    "GITHUB_TOKEN": "ghp_J2k4l6m8n0",
}

ENGINE = """\
import http.server, os, sys
sys.path.insert(0, {root!r})
from tests.support.openai_stub import StubEngine, _handler
port = int(sys.argv[sys.argv.index("--port") + 1])
print("starting with", " ".join(sys.argv[1:]), flush=True)
for name in {names!r}:
    print(f"{{name}}={{os.environ.get(name)}}", flush=True)
engine = StubEngine(url=f"http://127.0.0.1:{{port}}")
http.server.ThreadingHTTPServer(("127.0.0.1", port), _handler(engine)).serve_forever()
"""


@pytest.mark.parametrize("name", sorted(NAMED))
def test_the_value_of_every_secret_looking_variable_is_masked(
    monkeypatch: pytest.MonkeyPatch, name: str
) -> None:
    """Only three names were masked by value; an engine echoing NGC_API_KEY's value put it
    in the log and on the terminal."""
    monkeypatch.setenv(name, NAMED[name])
    assert redact.redact(f"engine: loaded {NAMED[name]} from the environment") == (
        "engine: loaded *** from the environment"
    )


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        (f"vllm serve m --api-key {API_KEY} --port 8000", "vllm serve m --api-key *** --port 8000"),
        (f"--api-key={API_KEY}", "--api-key=***"),
        ("--hf-token hf_abc123def", "--hf-token ***"),
        ("NGC_API_KEY=nvapi-1234abcd", "NGC_API_KEY=***"),
        ("OPENAI_API_KEY: sk-proj-99", "OPENAI_API_KEY: ***"),
        ('{"api_key": "abc123"}', '{"api_key": "***"}'),
        # words of our own messages and hints, and values that are not secrets, stay
        ("pass --api-key KEY to the engine", None),
        ("--api-key to the engine", None),
        ("--sign-key keys/release.pem", None),  # a key file's path
        ("--max-num-batched-tokens 8192", None),
        ("TOKENIZERS_PARALLELISM=false", None),
        ("NGC_API_KEY=${NGC_API_KEY}", None),
        ("NGC_API_KEY: refers to a shell variable", None),
    ],
)
def test_secret_names_mask_their_values_in_text(text: str, shown: str | None) -> None:
    assert redact.redact(text) == (shown or text)


def test_argument_lists_and_environments_share_the_names() -> None:
    args = ["--api-key", API_KEY, "--port", "1", "--hf-token=hf_abc123", "--sign-key", "k.pem"]
    assert redact.secret_args(args) == [
        "--api-key", "***", "--port", "1", "--hf-token=***", "--sign-key", "k.pem",
    ]  # fmt: skip
    env = {**NAMED, "TOKENIZERS_PARALLELISM": "false", "VLLM_CPU_KVCACHE_SPACE": "1"}
    assert redact.secret_env(env) == {
        **dict.fromkeys(NAMED, "***"), "TOKENIZERS_PARALLELISM": "false",
        "VLLM_CPU_KVCACHE_SPACE": "1",
    }  # fmt: skip


def _engine_command(tmp_path: Path) -> str:
    script = tmp_path / "engine.py"
    script.write_text(ENGINE.format(root=str(ROOT), names=sorted(NAMED)), encoding="utf-8")
    return f"{sys.executable} {script}"


def test_an_engines_api_key_and_environment_reach_no_output(
    run_cli: RunCli, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """bench --command with a profile whose args hold ``--api-key VALUE``, under an
    environment of secrets the engine echoes: the terminal, --json, the engine's log, the
    report files and the arena submission hold none of the values."""
    project = tmp_path / "project"
    (project / "smoke").mkdir(parents=True)
    profile = {
        "engine": "vllm", "model": "stub-model", "prompts": ["prose"],
        "args": ["--api-key", API_KEY],
        "expect": {"max_tokens": 4, "speculation": False, "finish": "length",
                   "repetition": None},
    }  # fmt: skip
    (project / "smoke" / "stub.yaml").write_text(yaml.safe_dump(profile), encoding="utf-8")
    log = tmp_path / "engine.log"
    for name, value in NAMED.items():
        monkeypatch.setenv(name, value)
    result = run_cli(
        "--project", str(project), "bench", "--command", _engine_command(tmp_path),
        "--profile", "stub", "--pp", "16", "--tg", "4", "-c", "1", "--runs", "1",
        "--no-warmup", "--log", str(log), "--arena", str(tmp_path / "arena"),
        "--markdown", str(tmp_path / "run.md"), "--json-file", str(tmp_path / "run.json"),
    )  # fmt: skip

    assert result.exit_code == 0, result.output
    assert "starting with" in log.read_text() and "--api-key ***" in log.read_text()
    written = [log, tmp_path / "run.md", tmp_path / "run.json"]
    written += [p for p in (tmp_path / "arena").rglob("*") if p.is_file()]
    texts = {str(p): p.read_text(encoding="utf-8") for p in written}
    texts["output"] = result.output
    for where, text in texts.items():
        for secret in [API_KEY, *NAMED.values()]:
            assert secret not in text, f"{secret} in {where}"
    recipe = yaml.safe_load((tmp_path / "arena" / "recipes" / "recipe.yaml").read_text())
    assert "--api-key" in recipe["command"] or "api_key" in str(recipe["defaults"])


def test_the_lock_and_the_submission_mask_a_reports_api_key(tmp_path: Path) -> None:
    """A report written before the names were shared (its args as they ran) is masked again
    where it is recorded: the lock's engine_args and the arena submission."""
    from tests.test_bench_arena import _report

    report = _report()
    engine = report.engine.model_copy(
        update={"args": [*report.engine.args, "--api-key", API_KEY],
                "env": {**report.engine.env, "NGC_API_KEY": NAMED["NGC_API_KEY"]}}
    )  # fmt: skip
    report = report.model_copy(update={"engine": engine})

    assert bench_record(report).engine_args[-2:] == ["--api-key", "***"]
    submission = arena.write_submission(
        tmp_path / "sub", report, "cpu", SmokeProfile(engine="vllm", model="tiny/llama")
    )
    for path in submission.files.values():
        text = path.read_text(encoding="utf-8")
        assert API_KEY not in text and NAMED["NGC_API_KEY"] not in text, path
