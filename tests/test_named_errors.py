"""Errors are named: the stages below raise SparkbuildError subclasses from errors.py, each
still rendered as one message and hint with the same exit code."""

from __future__ import annotations

import ast
import collections.abc
import inspect
import os
import pickle
import socket
import typing
from pathlib import Path

import pytest

from sparkbuild import dockerhost, errors, git
from sparkbuild.bump.write import _inside
from sparkbuild.errors import (
    BuildInputError,
    BumpError,
    DockerUnavailableError,
    PlatformError,
    RegistryUnreachableError,
    SparkbuildError,
    UsageError,
)
from sparkbuild.image import builder, cubins
from sparkbuild.redact import MASK, Redactor, redact
from sparkbuild.registry.address import Registry
from sparkbuild.registry.client import RegistryClient
from sparkbuild.registry.credentials import Credentials
from sparkbuild.settings import Settings

PACKAGE = Path(__file__).resolve().parents[1] / "src" / "sparkbuild"
NAMED = [
    "image/",
    "publish/",
    "registry/",
    "bump/",
    "engines/",
    "bench/",
    "spec.py",
    "validate.py",
    "settings.py",
    "dockerhost.py",
    "imageref.py",
    "requirements.py",
    "source/scope.py",
]
# Wraps whatever an unknown failure was, redacted: the base class is the honest name.
GENERIC = {("registry/redact.py", "guard")}


def _bare_raises(path: Path) -> list[tuple[int, str]]:
    """(line, function) of each ``raise SparkbuildError(...)`` in ``path``."""
    tree = ast.parse(path.read_text(encoding="utf-8"))
    found = []
    for function in ast.walk(tree):
        if not isinstance(function, ast.FunctionDef | ast.AsyncFunctionDef):
            continue
        for node in ast.walk(function):
            if not isinstance(node, ast.Raise) or not isinstance(node.exc, ast.Call):
                continue
            if isinstance(node.exc.func, ast.Name) and node.exc.func.id == "SparkbuildError":
                found.append((node.lineno, function.name))
    return found


def test_no_bare_sparkbuild_error_in_these_stages() -> None:
    bare = []
    for listed in NAMED:
        paths = (
            sorted((PACKAGE / listed).rglob("*.py")) if listed.endswith("/") else [PACKAGE / listed]
        )
        for path in paths:
            relative = path.relative_to(PACKAGE).as_posix()
            bare += [
                f"{relative}:{line} ({function})"
                for line, function in _bare_raises(path)
                if (relative, function) not in GENERIC
            ]
    assert bare == [], "raise a named subclass from errors.py instead"


def test_every_named_error_is_a_sparkbuild_error_with_message_and_hint() -> None:
    """Every class takes (message, hint), its own fields keyword-only with defaults."""
    for name in dir(errors):
        cls = getattr(errors, name)
        if not (isinstance(cls, type) and issubclass(cls, SparkbuildError)):
            continue
        made = cls("the message naming the build", "the next command")
        expected_exit = (
            errors.EXIT_USAGE if issubclass(cls, errors.UsageError) else errors.EXIT_FAILURE
        )
        if cls is errors.VerdictSkippedError:  # nothing failed: a status of its own
            expected_exit = errors.EXIT_SKIPPED
        assert (made.message, made.hint, made.exit_code) == (
            "the message naming the build",
            "the next command",
            expected_exit,
        ), name
        redacted = Redactor(["secret-value"]).error(cls("a secret-value here", None))
        assert type(redacted) is cls and redacted.message == "a *** here", name


SECRET = "s3cret-Token-42"
TEXT = f"from https://alice:{SECRET}@registry.example/v2 with token={SECRET}"


def _error_classes() -> list[type[SparkbuildError]]:
    return [
        cls
        for cls in vars(errors).values()
        if isinstance(cls, type) and issubclass(cls, SparkbuildError)
    ]


def _sample(annotation: object) -> object:
    """A value of a field's type, any text in it carrying the secret."""
    options = set(typing.get_args(annotation)) or {annotation}
    if str in options:
        return TEXT
    if bool in options:
        return True
    if int in options:
        return 7
    if typing.get_origin(annotation) is collections.abc.Sequence:
        return [TEXT, "a plain line"]
    raise AssertionError(f"no sample for a field of type {annotation}")


def _with_fields(cls: type[SparkbuildError]) -> SparkbuildError:
    """``cls`` made as the contract says, every one of its own fields set."""
    signature = inspect.signature(cls.__init__)
    hints = typing.get_type_hints(cls.__init__)
    own = [p.name for p in signature.parameters.values() if p.kind is p.KEYWORD_ONLY]
    assert tuple(own) == cls.FIELDS, f"{cls.__name__}: its keyword-only fields are its FIELDS"
    return cls(TEXT, f"hint: {TEXT}", **{name: _sample(hints[name]) for name in own})


def _expected(value: object) -> object:
    """What redaction makes of a field: its text redacted, the rest as it was."""
    if isinstance(value, str):
        return redact(value, [SECRET])
    return [_expected(item) for item in value] if isinstance(value, list) else value


@pytest.mark.parametrize("cls", _error_classes(), ids=lambda cls: cls.__name__)
def test_every_error_keeps_its_class_and_fields_through_redaction_and_reraising(
    cls: type[SparkbuildError],
) -> None:
    made = _with_fields(cls)
    redactor = Redactor([SECRET])
    with pytest.raises(SparkbuildError) as guarded, redactor.guard("publishing"):
        raise made
    for clean in (redactor.error(made), guarded.value):
        assert type(clean) is cls and clean.exit_code == made.exit_code
        assert (clean.message, clean.hint) == (_expected(made.message), _expected(made.hint))
        assert clean.fields() == {name: _expected(v) for name, v in made.fields().items()}
        assert SECRET not in str(clean) and SECRET not in repr(clean.fields())
    copied = pickle.loads(pickle.dumps(made))  # as a worker process re-raises it
    assert type(copied) is cls and copied.fields() == made.fields()
    assert (copied.message, copied.hint) == (made.message, made.hint)


def test_a_git_error_says_the_command_and_gits_reason(tmp_path: Path) -> None:
    with pytest.raises(errors.GitError) as failed:
        git.run(["ls-remote", f"https://alice:{SECRET}@127.0.0.1:9/nothing.git"], cwd=tmp_path)
    error = failed.value
    assert error.message.startswith(f"git ls-remote https://{MASK}@127.0.0.1:9/nothing.git ")
    assert error.command == ["ls-remote", f"https://{MASK}@127.0.0.1:9/nothing.git"]
    assert error.returncode == 128 and error.stderr and SECRET not in str(error.fields())


def test_docker_and_platform_errors_are_named(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    with pytest.raises(PlatformError) as platform:
        dockerhost.platform_arch("arm64")
    assert platform.value.exit_code == 1 and "linux/ARCH" in platform.value.message
    empty = tmp_path / "binfmt_misc"
    empty.mkdir()
    foreign = "linux/arm64" if os.uname().machine == "x86_64" else "linux/amd64"
    with pytest.raises(DockerUnavailableError):
        dockerhost.check_can_run(foreign, binfmt_dir=empty)
    monkeypatch.setenv("DOCKER_HOST", f"unix://{tmp_path}/no.sock")
    with pytest.raises(DockerUnavailableError) as daemon:
        dockerhost.client(timeout=5)
    assert daemon.value.hint == dockerhost.SETUP_HINT


def test_build_inputs_and_bump_writes_are_named(tmp_path: Path) -> None:
    with pytest.raises(UsageError):  # exit 2: the option is wrong, before any work
        builder.check_cache_ref("ref,type=local", "--cache-to")
    with pytest.raises(BuildInputError):
        cubins.expected_archs("12.x")
    with pytest.raises(BumpError) as outside:
        _inside(Settings(project_dir=tmp_path), "../elsewhere.patch")
    assert "outside the project" in outside.value.message


def test_an_unreachable_registry_is_named(monkeypatch: pytest.MonkeyPatch) -> None:
    with socket.socket() as probe:  # a loopback port nothing listens on
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    monkeypatch.setenv("SPARKBUILD_NET_ATTEMPTS", "1")
    client = RegistryClient(Registry.parse(f"127.0.0.1:{port}"), Credentials("test"))
    with pytest.raises(RegistryUnreachableError) as unreachable:
        client.manifest("x/y", "latest")
    assert f"127.0.0.1:{port}" in unreachable.value.message
