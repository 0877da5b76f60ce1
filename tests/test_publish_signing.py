"""Signed, attested publications end to end: a real arm64 image, a real registry
(Distribution 2.8: no referrers API, so the fallback tag), the CLI, and independent readers.

A key pair made by `sparkbuild keys generate` signs a publication; `sparkbuild verify`
passes it; the statements parse with the in-toto attestation library and the SBOM validates
with CycloneDX's own validator; openssl checks the image signature from the registry's bytes;
skopeo copies the image with its signature. Then each bad input fails by name, and nothing is
signed or recorded: a key others may read, a wrong passphrase, a tampered signature, a
statement about another digest, a referrer of another image, a huge or malformed referrers
index. The private key and its passphrase appear in no output and no file written.
"""

from __future__ import annotations

import base64
import json
import os
import subprocess
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import requests
import yaml
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

from sparkbuild.attest import layout
from tests.support.cli import CliResult
from tests.support.docker_env import LocalRegistry, require_command
from tests.support.image_project import load_lock
from tests.support.oci_push import push_blob, push_image, put_manifest
from tests.support.preflight_lock import record_preflight
from tests.support.publish_env import (
    BUILD,
    PROFILE,
    PublishEnv,
    publish_env,
    record_smoke,
    run_publish_cli,
)

pytestmark = [pytest.mark.docker]

PASSPHRASE = "tr0ub4dor-and-3-more-words"
REPOSITORY = "sparkbuild/sglang"


@dataclass
class Keys:
    private: Path
    public: Path


@dataclass
class Signed:
    env: PublishEnv
    keys: Keys
    other: Keys  # another key pair: its signatures must not pass
    outputs: list[str]  # every stdout and stderr of the signing commands

    def sign_env(self, passphrase: str = PASSPHRASE) -> dict[str, str]:
        return {**self.env.creds_env(), "SPARKBUILD_SIGNING_PASSWORD": passphrase}

    def publish(
        self,
        *args: str,
        lock: Path | None = None,
        passphrase: str = PASSPHRASE,
        key: Path | None = None,
    ) -> CliResult:
        result = self.env.publish(
            "--sign-key",
            str(key or self.keys.private),
            *args,
            lock=lock,
            env=self.sign_env(passphrase),
        )
        self.outputs += [result.stdout, result.stderr]
        return result

    def verify(self, reference: str, *args: str, key: Path | None = None) -> CliResult:
        result = run_publish_cli(
            self.env.project,
            "verify",
            reference,
            "--key",
            str(key or self.keys.public),
            *args,
            env=self.env.creds_env(),
            docker_config=self.env.empty_docker_config,
        )
        self.outputs += [result.stdout, result.stderr]
        return result

    def passing_lock(self, name: str) -> Path:
        copy = self.env.lock_copy(name)
        record_smoke(copy, BUILD, PROFILE)
        record_preflight(copy, BUILD, PROFILE)
        return copy


def _generate(env: PublishEnv, prefix: Path) -> Keys:
    result = run_publish_cli(
        env.project,
        "keys",
        "generate",
        "--output-prefix",
        str(prefix),
        env={"SPARKBUILD_SIGNING_PASSWORD": PASSPHRASE},
    )
    assert result.exit_code == 0, result.stdout + result.stderr
    assert PASSPHRASE not in result.stdout + result.stderr
    return Keys(prefix.with_name(prefix.name + ".key"), prefix.with_name(prefix.name + ".pub"))


@pytest.fixture(scope="module")
def signed(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Signed]:
    with publish_env(tmp_path_factory.mktemp("signing")) as env:
        keys = _generate(env, env.work / "keys" / "cosign")
        other = _generate(env, env.work / "keys" / "other")
        yield Signed(env, keys, other, [])


def _output(result: CliResult) -> str:
    return result.stdout + result.stderr


def _get(
    registry: LocalRegistry, path: str, accept: str = layout.OCI_MANIFEST
) -> requests.Response:
    response = requests.get(
        f"{registry.url}/v2/{path}", headers={"Accept": accept}, auth=registry.auth, timeout=30
    )
    response.raise_for_status()
    return response


def _publish_case(signed: Signed, case: str, *args: str, **kwargs: Any) -> tuple[CliResult, Path]:
    lock = signed.passing_lock(case)
    result = signed.publish(
        "--repository", f"{case}/{{engine}}", "--no-alias", *args, lock=lock, **kwargs
    )
    return result, lock


def _record(lock: Path, repository: str, registry: LocalRegistry) -> dict[str, Any] | None:
    publish = yaml.safe_load(lock.read_text())["builds"][BUILD].get("publish") or {}
    record: dict[str, Any] | None = publish.get(f"{registry.address}/{repository}")
    return record


def _statement(registry: LocalRegistry, repository: str, referrer: str) -> dict[str, Any]:
    manifest = _get(registry, f"{repository}/manifests/{referrer}").json()
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == layout.DSSE_ENVELOPE
    envelope = _get(registry, f"{repository}/blobs/{layer['digest']}").json()
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    statement: dict[str, Any] = json.loads(base64.b64decode(envelope["payload"]))
    return statement


def test_keys_generate_writes_cosign_keys(signed: Signed) -> None:
    private, public = signed.keys.private, signed.keys.public
    assert oct(private.stat().st_mode & 0o777) == "0o600"
    text = private.read_text()
    assert text.startswith("-----BEGIN ENCRYPTED SIGSTORE PRIVATE KEY-----\n")
    body = json.loads(base64.b64decode("".join(text.splitlines()[1:-1])))
    assert body["kdf"]["name"] == "scrypt" and body["kdf"]["params"] == {"N": 32768, "r": 8, "p": 1}
    assert (
        body["cipher"]["name"] == "nacl/secretbox"
        and len(base64.b64decode(body["cipher"]["nonce"])) == 24
    )
    assert public.read_text().startswith("-----BEGIN PUBLIC KEY-----\n")
    # openssl reads the public key as a P-256 key: a standard SubjectPublicKeyInfo PEM.
    shown = subprocess.run(
        [require_command("openssl"), "pkey", "-pubin", "-in", str(public), "-noout", "-text"],
        capture_output=True,
        text=True,
        check=True,
    )
    assert "prime256v1" in shown.stdout or "P-256" in shown.stdout
    again = run_publish_cli(
        signed.env.project,
        "keys",
        "generate",
        "--output-prefix",
        str(private.with_suffix("")),
        env={"SPARKBUILD_SIGNING_PASSWORD": "x" * 8},
    )
    assert again.exit_code == 2 and "never overwritten" in again.stderr
    assert private.read_text() == text


def test_signed_publish_verifies(signed: Signed) -> None:
    env = signed.env
    record_smoke(env.lock, BUILD, PROFILE)
    record_preflight(env.lock, BUILD, PROFILE)
    result = signed.publish("--json")
    assert result.exit_code == 0, _output(result)
    (payload,) = json.loads(result.stdout)["results"]
    digest = payload["digest"]
    record = _record(env.lock, REPOSITORY, env.registry)
    assert record is not None
    signature = record["signed"]
    assert signature == payload["signed"]
    assert signature["referrers"] == "tag"  # Distribution 2.8 has no referrers API
    assert set(signature["attestations"]) == {"sbom", "provenance", "verdicts"}
    assert signature["sbom_packages"] > 50  # a debootstrap Debian and its Python
    assert record["history"][-1]["signed"] == signature
    assert (
        env.registry.manifest_digest(REPOSITORY, layout.signature_tag(digest))
        == signature["signature"]
    )

    reference = f"{env.registry.address}/{REPOSITORY}@{digest}"
    verified = signed.verify(reference, "--json")
    assert verified.exit_code == 0, _output(verified)
    report = json.loads(verified.stdout)
    assert report["ok"] is True and report["build"] == BUILD
    assert {f["name"] for f in report["findings"]} == {
        "signature",
        "attestation:sbom",
        "attestation:provenance",
        "attestation:verdicts",
        "provenance-lock",
        "verdicts-smoke",
    }
    human = signed.verify(reference)
    assert human.exit_code == 0 and "verified" in human.stdout

    # Another key's view: every signature fails, by name.
    other = signed.verify(reference, "--json", key=signed.other.public)
    assert other.exit_code == 1
    failed = {f["name"]: f for f in json.loads(other.stdout)["findings"] if not f["ok"]}
    assert failed["signature"]["error"] == "SignatureError"
    assert failed["attestation:provenance"]["error"] == "AttestationError"

    # Publishing again changes nothing: the signature verifies, the lock stays byte-equal.
    before = env.lock.read_bytes()
    again = signed.publish()
    assert again.exit_code == 0, _output(again)
    assert env.lock.read_bytes() == before


def test_statements_parse_with_the_in_toto_and_cyclonedx_libraries(signed: Signed) -> None:
    env = signed.env
    record = _record(env.lock, REPOSITORY, env.registry)
    assert record is not None, "test_signed_publish_verifies publishes first"
    digest, attestations = record["digest"], record["signed"]["attestations"]
    parsed = {}
    for kind, referrer in attestations.items():
        data = _statement(env.registry, REPOSITORY, referrer)
        message = json_format.ParseDict(data, statement_pb2.Statement())
        statement = Statement.copy_from_pb(message)
        statement.validate()
        assert [s.digest["sha256"] for s in statement.pb.subject][0] == digest.removeprefix(
            "sha256:"
        )
        parsed[kind] = data
    sbom = parsed["sbom"]["predicate"]
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(json.dumps(sbom)) is None
    purls = [c.get("purl", "") for c in sbom["components"]]
    assert any(p.startswith("pkg:deb/debian/libc6@") for p in purls)
    assert any(p.startswith("pkg:deb/debian/python3") for p in purls)
    engine = next(c for c in sbom["components"] if c["bom-ref"] == "engine")
    (patch,) = engine["pedigree"]["patches"]
    assert patch["type"] == "unofficial" and "greeting.patch" in patch["diff"]["url"]
    locked = load_lock(env.project)["builds"][BUILD]
    names = {p["name"]: p["value"] for p in engine["properties"]}
    assert (
        names["sparkbuild:patch:patches/sglang/greeting.patch:sha256"]
        == locked["source"]["patches"][0]["sha256"]
    )
    assert engine["pedigree"]["commits"][0]["uid"] == locked["source"]["commit"]

    provenance = json_format.ParseDict(
        parsed["provenance"]["predicate"], provenance_pb2.Provenance()
    )
    assert provenance.build_definition.build_type.startswith("https://")
    assert provenance.build_definition.external_parameters["build"] == BUILD
    dependencies = {
        d.name: dict(d.digest) for d in provenance.build_definition.resolved_dependencies
    }
    assert dependencies["source"] == {"gitCommit": locked["source"]["commit"]}
    assert dependencies["base-image"]["sha256"] == locked["image"]["base_digest"].removeprefix(
        "sha256:"
    )
    assert provenance.run_details.builder.version["sparkbuild"]

    verdicts = parsed["verdicts"]["predicate"]
    assert (
        verdicts["smoke"][PROFILE]["verdict"] == "pass" and verdicts["smoke"][PROFILE]["verified"]
    )
    assert verdicts["image"]["imageId"] == locked["image"]["image_id"]


def test_openssl_checks_the_signature_and_skopeo_copies_it(signed: Signed) -> None:
    env = signed.env
    record = _record(env.lock, REPOSITORY, env.registry)
    assert record is not None, "test_signed_publish_verifies publishes first"
    digest = record["digest"]
    manifest = _get(env.registry, f"{REPOSITORY}/manifests/{layout.signature_tag(digest)}").json()
    (layer,) = manifest["layers"]
    assert layer["mediaType"] == "application/vnd.dev.cosign.simplesigning.v1+json"
    payload = _get(env.registry, f"{REPOSITORY}/blobs/{layer['digest']}").content
    assert json.loads(payload)["critical"]["image"]["docker-manifest-digest"] == digest
    work = env.work / "openssl"
    work.mkdir(exist_ok=True)
    (work / "payload").write_bytes(payload)
    (work / "sig").write_bytes(
        base64.b64decode(layer["annotations"]["dev.cosignproject.cosign/signature"])
    )
    openssl = require_command("openssl")
    check = [openssl, "dgst", "-sha256", "-signature", str(work / "sig"), str(work / "payload")]
    ok = subprocess.run(
        [*check[:2], "-verify", str(signed.keys.public), *check[2:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert ok.returncode == 0 and "Verified OK" in ok.stdout, ok.stderr
    wrong = subprocess.run(
        [*check[:2], "-verify", str(signed.other.public), *check[2:]],
        capture_output=True,
        text=True,
        check=False,
    )
    assert wrong.returncode != 0

    # `skopeo copy` with sigstore attachments (docs/verify.md) keeps the signature.
    skopeo = require_command("skopeo")
    copied = _skopeo(
        env,
        skopeo,
        "copy",
        "--preserve-digests",
        f"docker://{env.registry.address}/{REPOSITORY}@{digest}",
        f"docker://{env.registry.address}/mirror/sglang:copy",
    )
    assert copied.returncode == 0, copied.stderr
    assert env.registry.manifest_digest("mirror/sglang", layout.signature_tag(digest)) is not None


def _skopeo(env: PublishEnv, skopeo: str, *args: str) -> subprocess.CompletedProcess[str]:
    registries = env.work / "registries.d"
    registries.mkdir(exist_ok=True)
    (registries / "sparkbuild.yaml").write_text(
        yaml.safe_dump({"default-docker": {"use-sigstore-attachments": True}})
    )
    assert env.registry.auth is not None
    creds = ":".join(env.registry.auth)
    policy = env.work / "accept-anything.json"
    policy.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    return subprocess.run(
        [
            skopeo,
            "--policy",
            str(policy),
            "--registries.d",
            str(registries),
            *args[:1],
            "--src-creds",
            creds,
            "--dest-creds",
            creds,
            "--src-tls-verify=false",
            "--dest-tls-verify=false",
            *args[1:],
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=300,
    )


def _nothing_signed(signed: Signed, case: str, lock: Path, digest: str | None = None) -> None:
    assert _record(lock, f"{case}/sglang", signed.env.registry) is None
    if digest is not None:
        tag = layout.signature_tag(digest)
        assert signed.env.registry.manifest_digest(f"{case}/sglang", tag) is None


def test_a_key_others_may_read_or_a_wrong_passphrase_is_refused(signed: Signed) -> None:
    exposed = signed.env.work / "keys" / "exposed.key"
    exposed.write_bytes(signed.keys.private.read_bytes())
    exposed.chmod(0o644)
    result, lock = _publish_case(signed, "exposed", key=exposed)
    assert result.exit_code == 1, _output(result)
    assert "readable by other users" in result.stderr and "chmod 600" in result.stderr
    _nothing_signed(signed, "exposed", lock)
    assert signed.env.registry.manifest_digest("exposed/sglang", "0.5.12-sm121") is None

    wrong, lock = _publish_case(signed, "wrong-passphrase", passphrase="not-" + PASSPHRASE)
    assert wrong.exit_code == 1, _output(wrong)
    assert "passphrase does not decrypt" in wrong.stderr
    _nothing_signed(signed, "wrong-passphrase", lock)
