"""`sparkbuild keys` against careless and hostile input (issue 46, medium and low): a key
pair is written whole or not at all, a key's scrypt parameters are bounded before any work,
and the Kubernetes policy refuses a name or an image pattern that would guard nothing.

The keys are real cosign-format keys made by sparkbuild's own code; each hostile key is one
of them with its JSON document edited, as an attacker would hand it over.
"""

from __future__ import annotations

import base64
import json
from pathlib import Path

import pytest
import yaml

from sparkbuild import lockfile
from sparkbuild.attest import keys, policy
from sparkbuild.errors import SigningKeyError
from tests.support.cli import RunCli

PASSPHRASE = "correct horse battery staple"
ENV = {keys.PASSWORD_ENV: PASSPHRASE}
DIGEST = "sha256:" + "cd" * 32


@pytest.fixture(scope="module")
def pair() -> tuple[bytes, bytes]:
    return keys.generate(PASSPHRASE.encode())


def test_generate_beside_another_keys_public_half_leaves_no_private_key(
    run_cli: RunCli, tmp_path: Path, pair: tuple[bytes, bytes]
) -> None:
    """A project with its cosign.pub and no cosign.key: `keys generate` wrote cosign.key,
    then refused to overwrite cosign.pub, leaving a private key that matches no public one."""
    public = tmp_path / "cosign.pub"
    public.write_bytes(pair[1])
    result = run_cli("--project", str(tmp_path), "keys", "generate",
                     "--output-prefix", str(tmp_path / "cosign"), env=ENV)  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "cosign.pub exists; a key is never overwritten" in result.stderr
    assert not (tmp_path / "cosign.key").exists() and public.read_bytes() == pair[1]


@pytest.mark.parametrize("prefix", ["keys/", "", " ", ".", "keys/.."])
def test_a_prefix_that_names_a_directory_or_nothing_is_refused(
    run_cli: RunCli, tmp_path: Path, prefix: str
) -> None:
    """`--output-prefix keys/` wrote keys.key beside the folder; an empty one was an
    internal error."""
    (tmp_path / "keys").mkdir()
    result = run_cli("--project", str(tmp_path), "keys", "generate", "--output-prefix", prefix,
                     cwd=tmp_path, env=ENV)  # fmt: skip
    assert result.exit_code == 2, result.output
    assert "is not a file name prefix" in result.stderr and "internal error" not in result.output
    assert sorted(p.name for p in tmp_path.iterdir()) == ["keys"]
    assert list((tmp_path / "keys").iterdir()) == []


def test_a_prefix_inside_a_directory_writes_there(run_cli: RunCli, tmp_path: Path) -> None:
    (tmp_path / "keys").mkdir()
    result = run_cli("--project", str(tmp_path), "keys", "generate",
                     "--output-prefix", str(tmp_path / "keys" / "cosign"), env=ENV)  # fmt: skip
    assert result.exit_code == 0, result.output
    assert sorted(p.name for p in (tmp_path / "keys").iterdir()) == ["cosign.key", "cosign.pub"]


def _with_params(private_pem: bytes, n: int, r: int, p: int) -> bytes:
    body = json.loads(base64.b64decode(b"".join(private_pem.splitlines()[1:-1])))
    body["kdf"]["params"] = {"N": n, "r": r, "p": p}
    return keys._pem(keys.PRIVATE_PEM, json.dumps(body).encode())


@pytest.mark.parametrize(
    ("n", "r", "p", "message"),
    [
        (2**16, 1, 1, "OpenSSL refuses"),  # OpenSSL: N < 2^(16 r); it raised MemoryError
        (2**17, 1, 1, "OpenSSL refuses"),
        (2**18, 8, 16, "more than four times cosign's own"),  # allowed memory, 52 s of work
        (2**17, 8, 2, "more than four times cosign's own"),
    ],
)
def test_scrypt_parameters_are_bounded_before_any_work(
    pair: tuple[bytes, bytes], n: int, r: int, p: int, message: str
) -> None:
    hostile = _with_params(pair[0], n, r, p)
    with pytest.raises(SigningKeyError, match=message):
        keys.decrypt(hostile, PASSPHRASE.encode(), "hostile key")


def test_cosigns_own_parameters_and_four_times_their_work_still_load(
    pair: tuple[bytes, bytes],
) -> None:
    assert keys.decrypt(pair[0], PASSPHRASE.encode(), "cosign key")
    heavier = _with_params(pair[0], 2**17, 8, 1)  # decrypts to nothing: the passphrase check
    with pytest.raises(SigningKeyError, match="passphrase does not decrypt"):
        keys.decrypt(heavier, PASSPHRASE.encode(), "heavier key")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--image", "ghcr.io/acme/sparkbuild"], "matches no tag or digest"),
        (["--image", "acme/sparkbuild/*"], "names no registry"),
        (["--image", "ghcr.io/Acme/sparkbuild/*"], "upper-case letters in its repository"),
        (["--image", "https://ghcr.io/acme/*"], "is a URL"),
        (["--image", ""], "is empty"),
        (["--image", "ghcr.io/acme/*", "--name", "Bad Name"], "is not a Kubernetes name"),
        (["--image", "ghcr.io/acme/*", "--name", "x" * 64], "is not a Kubernetes name"),
        (["--image", "ghcr.io/acme/*", "--name", "a\n  b: c"], "is not a Kubernetes name"),
    ],
)
def test_a_policy_that_would_guard_nothing_is_refused(
    run_cli: RunCli, tmp_path: Path, pair: tuple[bytes, bytes], args: list[str], message: str
) -> None:
    (tmp_path / "cosign.pub").write_bytes(pair[1])
    result = run_cli("--project", str(tmp_path), "keys", "policy", *args)
    assert result.exit_code == 2, result.output
    assert message in result.stderr and result.stdout == ""


@pytest.mark.parametrize(
    "pattern",
    ["ghcr.io/acme/*", "localhost:5000/acme/sparkbuild:*", "*", "ghcr.io/acme/x@sha256:*",
     "ghcr.io/acme/x:v1.2"],
)  # fmt: skip
def test_patterns_that_can_match_an_image_are_kept(pattern: str) -> None:
    assert policy.pattern_problem(pattern) is None


def test_a_pattern_that_matches_none_of_the_published_images_is_said(
    run_cli: RunCli, tmp_path: Path, pair: tuple[bytes, bytes]
) -> None:
    (tmp_path / "cosign.pub").write_bytes(pair[1])
    record = lockfile.PublishRecord(tag="v1", digest=DIGEST, aliases=["stable"])
    lock = lockfile.LockFile(builds={"b": lockfile.BuildEntry(publish={"ghcr.io/acme/x": record})})
    (tmp_path / "images.lock").write_text(lockfile.dumps(lock))
    assert policy.matches("ghcr.io/acme/*", f"ghcr.io/acme/x@{DIGEST}")
    assert not policy.matches("ghcr.io/acme/x:v?", "ghcr.io/acme/x:stable")
    result = run_cli("--project", str(tmp_path), "keys", "policy",
                     "--image", "ghcr.io/acme/*", "--image", "ghcr.io/other/*")  # fmt: skip
    assert result.exit_code == 0, result.output
    assert "'ghcr.io/other/*' matches none of the 3 image references" in result.stderr
    assert "ghcr.io/acme/*'" not in result.stderr
    rule = yaml.safe_load(result.stdout)["spec"]["rules"][0]["verifyImages"][0]
    assert rule["imageReferences"] == ["ghcr.io/acme/*", "ghcr.io/other/*"]
