"""Redaction masks values, never words of our own messages: every message in the source
that names a secret's variable (``HF_TOKEN``, ``SPARKBUILD_REGISTRY_PASSWORD``, ...) reaches
the user as written, and what follows such a name is masked only when it is a value."""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

from sparkbuild import redact
from sparkbuild.attest import keys
from sparkbuild.registry import credentials
from tests.support.cli import RunCli

SRC = Path(__file__).resolve().parents[1] / "src" / "sparkbuild"
SECRET_NAMES = {
    *redact.SECRET_ENV,
    credentials.USER_ENV,
    credentials.PASSWORD_ENV,
    keys.KEY_ENV,
    keys.KEY_FILE_ENV,
    keys.PASSWORD_ENV,
}
# The constants a message may name a variable through: f"set {PASSWORD_ENV}".
CONSTANTS = {
    "KEY_ENV": keys.KEY_ENV,
    "KEY_FILE_ENV": keys.KEY_FILE_ENV,
    "PASSWORD_ENV": credentials.PASSWORD_ENV,
    "USER_ENV": credentials.USER_ENV,
    "REGISTRY_PASSWORD_ENV": redact.REGISTRY_PASSWORD_ENV,
}


def _render(node: ast.JoinedStr) -> str:
    """An f-string as it prints, each named constant filled in; any other field is ``x1``
    (a value no rule mistakes for prose)."""
    parts = []
    for part in node.values:
        if isinstance(part, ast.Constant):
            parts.append(str(part.value))
        elif isinstance(part, ast.FormattedValue):
            name = ast.unparse(part.value).rsplit(".", 1)[-1]
            parts.append(CONSTANTS.get(name, "x1"))
    return "".join(parts)


def _strings(tree: ast.AST) -> Iterator[tuple[int, str]]:
    inside_fstrings = {
        id(part)
        for node in ast.walk(tree)
        if isinstance(node, ast.JoinedStr)
        for part in node.values
    }
    for node in ast.walk(tree):
        if isinstance(node, ast.JoinedStr):
            yield node.lineno, _render(node)
        elif (
            isinstance(node, ast.Constant)
            and isinstance(node.value, str)
            and id(node) not in inside_fstrings
        ):
            yield node.lineno, node.value


def messages_naming_a_secret() -> list[tuple[str, str]]:
    found = []
    for path in sorted(SRC.rglob("*.py")):
        tree = ast.parse(path.read_text(encoding="utf-8"))
        for line, text in _strings(tree):
            if any(name in text for name in SECRET_NAMES):
                found.append((f"{path.relative_to(SRC)}:{line}", text))
    return found


MESSAGES = messages_naming_a_secret()


def test_the_scan_finds_the_messages() -> None:
    where = {w.split(":")[0] for w, _ in MESSAGES}
    assert {"registry/credentials.py", "registry/client.py", "redact.py"} <= where, where
    assert len(MESSAGES) >= 8


@pytest.mark.parametrize(("where", "text"), MESSAGES, ids=[w for w, _ in MESSAGES])
def test_a_message_naming_a_secret_variable_is_printed_as_written(where: str, text: str) -> None:
    assert redact.redact(text) == text, where


@pytest.mark.parametrize(
    ("text", "shown"),
    [
        # our own words and references: kept
        ("env HF_TOKEN: refers to a shell variable", None),
        ("env HF_TOKEN: ${HF_TOKEN}", None),
        ("HF_TOKEN=$HF_TOKEN", None),
        # values: masked, in every form a log or a config echoes them
        ("password: hunter2", "password: ***"),
        ("password=secret", "password=***"),
        ("password:hunter", "password:***"),
        ('{"password": "hunter"}', '{"password": "***"}'),
        ("HF_TOKEN: Hf_live", "HF_TOKEN: ***"),
        ("token=ghp_abcdef123", "token=***"),
    ],
)
def test_values_are_masked_and_words_are_not(text: str, shown: str | None) -> None:
    assert redact.redact(text) == (shown or text)


def test_profile_import_says_the_dropped_token_refers_to_the_shell(
    run_cli: RunCli, tmp_path: Path
) -> None:
    recipe = tmp_path / "recipe.yaml"
    recipe.write_text(
        "model: m\nruntime: vllm\ncommand: vllm serve m\n"
        "env: {HF_TOKEN: '${HF_TOKEN}', KEEP: '1'}\n",
        encoding="utf-8",
    )
    result = run_cli("--project", str(tmp_path), "profile", "import", str(recipe),
                     env={"HF_TOKEN": "hf_reallysecret123"})  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "env HF_TOKEN: refers to a shell variable" in result.stdout, result.stdout
    assert "hf_reallysecret123" not in result.output
