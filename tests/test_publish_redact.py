"""Secrets stay out of output; credentials come from the places docker users expect;
registry addresses, tags and aliases are named as documented. No registry needed here."""

from __future__ import annotations

import base64
import json
import os
import stat
from pathlib import Path

import pytest

from sparkbuild.errors import SparkbuildError, UsageError
from sparkbuild.publish import plan_destination
from sparkbuild.redact import MASK, Redactor, redact
from sparkbuild.registry.address import Registry
from sparkbuild.registry.credentials import Credentials, resolve
from sparkbuild.settings import Settings
from sparkbuild.spec import load_builds
from tests.support.image_project import write_spec

SECRET = "s3cr3t/p@ss+word=="


def test_known_secrets_are_masked_in_every_encoding() -> None:
    redactor = Redactor([SECRET], usernames=["alice"])
    basic = base64.b64encode(f"alice:{SECRET}".encode()).decode()
    text = (
        f"plain {SECRET}; quoted s3cr3t%2Fp%40ss%2Bword%3D%3D; "
        f"b64 {base64.b64encode(SECRET.encode()).decode()}; header Basic {basic}"
    )
    cleaned = redactor(text)
    assert SECRET not in cleaned and "s3cr3t" not in cleaned and basic not in cleaned
    assert cleaned.count(MASK) >= 4
    assert redact("nothing secret here", [SECRET]) == "nothing secret here"


def test_credential_shapes_are_masked_even_when_the_secret_is_unknown() -> None:
    redactor = Redactor()
    samples = {
        "Authorization: Bearer eyJhbGciOiJSUzI1NiJ9.payload.sig": "eyJhbGci",
        "GET https://bob:hunter22@registry.example/v2/": "hunter22",
        '{"password": "hunter22", "user": "bob"}': "hunter22",
        "token=ghp_abcdefghijklmnop&scope=x": "ghp_abcdefghijklmnop",
        "identitytoken: AAAAbbbbCCCC": "AAAAbbbbCCCC",
    }
    for text, secret in samples.items():
        cleaned = redactor(text)
        assert secret not in cleaned, cleaned
        assert MASK in cleaned
    ordinary = "unauthorized: authentication required (registry 127.0.0.1:5000)"
    assert redactor(ordinary) == ordinary


def test_short_strings_are_not_treated_as_secrets() -> None:
    assert Redactor(["ab", None, ""])("ab cd") == "ab cd"


def test_guard_turns_any_failure_into_a_redacted_error() -> None:
    redactor = Redactor([SECRET])
    with pytest.raises(SparkbuildError) as info, redactor.guard("pushing"):
        raise RuntimeError(f"daemon said: bad auth {SECRET}")
    assert SECRET not in str(info.value) and "pushing failed" in info.value.message
    assert info.value.__cause__ is None and info.value.__suppress_context__

    with pytest.raises(UsageError) as usage, redactor.guard("x"):
        raise UsageError(f"bad {SECRET}", f"hint {SECRET}")
    assert SECRET not in usage.value.message and usage.value.hint == f"hint {MASK}"


def test_credentials_never_show_their_secret() -> None:
    creds = Credentials("environment", username="alice", password=SECRET)
    assert SECRET not in repr(creds) and SECRET not in creds.describe()
    assert creds.daemon_auth("ghcr.io") == {
        "username": "alice",
        "password": SECRET,
        "serveraddress": "ghcr.io",
    }


@pytest.fixture
def clean_env(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> Path:
    for name in ("SPARKBUILD_REGISTRY_USER", "SPARKBUILD_REGISTRY_PASSWORD"):
        monkeypatch.delenv(name, raising=False)
    config = tmp_path / "docker-config"
    config.mkdir()
    monkeypatch.setenv("DOCKER_CONFIG", str(config))
    return config


def test_credential_sources_in_order(clean_env: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve("ghcr.io").anonymous
    auth = base64.b64encode(b"stored:stored-pass").decode()
    (clean_env / "config.json").write_text(json.dumps({"auths": {"ghcr.io": {"auth": auth}}}))
    stored = resolve("ghcr.io")
    assert (stored.username, stored.password, stored.source) == (
        "stored",
        "stored-pass",
        "docker config",
    )
    monkeypatch.setenv("SPARKBUILD_REGISTRY_USER", "env-user")
    monkeypatch.setenv("SPARKBUILD_REGISTRY_PASSWORD", "env-pass")
    assert resolve("ghcr.io").username == "env-user"
    piped = resolve("ghcr.io", password_stdin="piped-pass\n")
    assert (piped.username, piped.password) == ("env-user", "piped-pass")
    monkeypatch.delenv("SPARKBUILD_REGISTRY_USER")
    with pytest.raises(UsageError):
        resolve("ghcr.io")  # a password without a user


def test_credentials_from_a_docker_credential_helper(
    clean_env: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A real helper program speaking docker's credential-helper protocol (`get` on stdin)."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    helper = bin_dir / "docker-credential-sparkbuildtest"
    helper.write_text(
        "#!/bin/sh\n"
        '[ "$1" = get ] || exit 1\n'
        "read -r server\n"
        'printf \'{"ServerURL":"%s","Username":"helper-user","Secret":"helper-pass"}\' '
        '"$server"\n'
    )
    helper.chmod(helper.stat().st_mode | stat.S_IXUSR)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    (clean_env / "config.json").write_text(json.dumps({"credsStore": "sparkbuildtest"}))
    found = resolve("ghcr.io")
    assert (found.username, found.password) == ("helper-user", "helper-pass")


def test_registry_addresses() -> None:
    ghcr = Registry.parse("ghcr.io/acme")
    assert (ghcr.host, ghcr.namespace, ghcr.api_base) == ("ghcr.io", "acme", "https://ghcr.io")
    local = Registry.parse("127.0.0.1:5000")
    assert (local.namespace, local.api_base) == ("", "http://127.0.0.1:5000")
    assert Registry.parse("localhost:5000/a/b").scheme == "http"
    hub = Registry.parse("acme")
    assert (hub.host, hub.namespace, hub.api_base) == (
        "docker.io",
        "acme",
        "https://registry-1.docker.io",
    )
    assert ghcr.reference(ghcr.repository("sparkbuild/sglang")) == "ghcr.io/acme/sparkbuild/sglang"
    with pytest.raises(UsageError):
        Registry.parse("ghcr.io/Acme")


def test_immutable_tag_and_aliases(tmp_path: Path) -> None:
    write_spec(
        tmp_path,
        "sglang",
        {"repo": "x", "package_dir": "python/sglang", "builds": {"s": {"ref": "v0.5.12"}}},
    )
    build = load_builds(Settings(project_dir=tmp_path))["s"]
    tree = "0123456789abcdef0123"
    registry = Registry.parse("ghcr.io/acme")
    destination = plan_destination(build, tree, registry, aliases=("{version}-sm121", "latest"))
    assert destination.reference == "ghcr.io/acme/sparkbuild/sglang"
    assert destination.tag == "0.5.12-sm121-0123456789ab"
    assert destination.aliases == ("0.5.12-sm121", "latest")
    custom = plan_destination(build, tree, registry, repository="spark-{engine}", aliases=())
    assert custom.reference == "ghcr.io/acme/spark-sglang" and custom.aliases == ()
    with pytest.raises(UsageError):
        plan_destination(build, tree, registry, aliases=("{nope}",))
    with pytest.raises(UsageError):
        plan_destination(build, tree, registry, aliases=("{version}-sm121-{tree_short}",))
