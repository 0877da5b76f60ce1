"""The signing pieces on their own: cosign's key format, DSSE, the statements (parsed with the
in-toto attestation library), the SBOM (CycloneDX's validator), the registry shapes' bounds,
and the Kyverno policy (against Kyverno's own CRD schema, downloaded from GitHub).

The whole flow, against a real registry and image, is tests/test_publish_signing.py.
"""

from __future__ import annotations

import base64
import json
import urllib.request
from pathlib import Path
from typing import Any

import jsonschema
import pytest
import yaml
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cyclonedx.schema import SchemaVersion
from cyclonedx.validation.json import JsonStrictValidator
from google.protobuf import json_format
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1 import statement_pb2
from in_toto_attestation.v1.statement import Statement

from sparkbuild import lockfile
from sparkbuild.attest import contents, keys, layout, policy, sbom, signing, statements
from sparkbuild.errors import KeyPassphraseError, KeyPermissionsError, SigningKeyError
from tests.support.cache import shared_test_cache

PASSPHRASE = b"correct horse battery staple"
DIGEST = "sha256:" + "ab" * 32


@pytest.fixture(scope="module")
def pair() -> tuple[bytes, bytes]:
    return keys.generate(PASSPHRASE)


def test_a_key_round_trips_and_signs(pair: tuple[bytes, bytes]) -> None:
    private_pem, public_pem = pair
    key = keys.decrypt(private_pem, PASSPHRASE, "test key")
    public = keys.PublicKey(keys.public_from_pem(public_pem, "test"), "test")
    assert key.public_key().public_numbers() == public.key.public_numbers()
    signature = signing.KeySigner(keys.PrivateKey(key, "t")).sign(b"payload")
    assert signing.verify_bytes(public, b"payload", signature)
    assert not signing.verify_bytes(public, b"payl0ad", signature)


def test_cosign_1_keys_are_read_too(pair: tuple[bytes, bytes]) -> None:
    old = pair[0].replace(b"SIGSTORE PRIVATE KEY", b"COSIGN PRIVATE KEY")
    assert isinstance(keys.decrypt(old, PASSPHRASE, "cosign 1 key"), ec.EllipticCurvePrivateKey)


def test_a_wrong_passphrase_and_broken_keys_are_named(pair: tuple[bytes, bytes]) -> None:
    with pytest.raises(KeyPassphraseError, match="passphrase does not decrypt"):
        keys.decrypt(pair[0], b"wrong", "test key")
    with pytest.raises(SigningKeyError, match="not a cosign key"):
        keys.decrypt(b"-----BEGIN PRIVATE KEY-----\nAAAA\n-----END PRIVATE KEY-----\n", b"", "k")
    body = json.loads(base64.b64decode(b"".join(pair[0].splitlines()[1:-1])))
    body["kdf"]["params"]["N"] = 2**30  # 128 GiB of scrypt memory: refused, not run
    hostile = keys._pem(keys.PRIVATE_PEM, json.dumps(body).encode())
    with pytest.raises(SigningKeyError, match="scrypt parameters"):
        keys.decrypt(hostile, PASSPHRASE, "hostile key")
    rsa_free = ec.generate_private_key(ec.SECP384R1())  # another curve: not cosign's
    with pytest.raises(SigningKeyError, match="not an ECDSA P-256 key"):
        keys.decrypt(keys.encrypt(rsa_free, PASSPHRASE), PASSPHRASE, "P-384 key")


def test_a_key_file_others_may_read_is_refused(
    tmp_path: Path, pair: tuple[bytes, bytes], monkeypatch: pytest.MonkeyPatch
) -> None:
    path = tmp_path / "cosign.key"
    keys.write_new(path, pair[0], 0o640)
    with pytest.raises(KeyPermissionsError, match=r"readable by other users \(mode 0640\)"):
        keys.load_private(path, PASSPHRASE)
    path.chmod(0o600)
    assert keys.load_private(path, PASSPHRASE).source == f"signing key {path}"
    with pytest.raises(Exception, match="never overwritten"):
        keys.write_new(path, b"other", 0o600)
    monkeypatch.setenv(keys.KEY_ENV, pair[0].decode())
    assert keys.load_private(None, PASSPHRASE).source == f"signing key ${keys.KEY_ENV}"


def test_a_dsse_envelope_verifies_only_with_its_key(pair: tuple[bytes, bytes]) -> None:
    key = keys.PrivateKey(keys.decrypt(pair[0], PASSPHRASE, "k"), "k")
    envelope = signing.envelope(b'{"_type": "x"}', signing.KeySigner(key))
    assert envelope["payloadType"] == "application/vnd.in-toto+json"
    assert envelope["signatures"][0]["keyid"] == ""
    assert signing.envelope_verifies(signing.open_envelope(envelope), key.public)
    other = keys.PublicKey(ec.generate_private_key(ec.SECP256R1()).public_key(), "other")
    assert not signing.envelope_verifies(signing.open_envelope(envelope), other)
    tampered = {**envelope, "payload": base64.b64encode(b'{"_type": "y"}').decode()}
    assert not signing.envelope_verifies(signing.open_envelope(tampered), key.public)


def _entry() -> lockfile.BuildEntry:
    return lockfile.BuildEntry.model_validate(
        {
            "source": {
                "engine": "sglang",
                "repo": "https://github.com/sgl-project/sglang",
                "ref": "v0.5.12",
                "commit": "1" * 40,
                "version": "0.5.12",
                "spec_digest": DIGEST,
                "tree": "2" * 40,
                "prs": [
                    {"number": 101, "status": "applied", "head": "3" * 40, "diff_sha256": "4" * 64}
                ],
                "patches": [
                    {"file": "patches/sglang/fix.patch", "status": "applied", "sha256": "5" * 64}
                ],
            },
            "image": {
                "image_id": "sha256:" + "6" * 64,
                "base_image": "nvcr.io/x:1",
                "base_digest": "sha256:" + "7" * 64,
                "platform": "linux/arm64",
                "tree": "2" * 40,
            },
            "requirements": [
                {
                    "requirement": "triton==3.4",
                    "name": "triton",
                    "version": "3.4",
                    "filename": "triton-3.4-cp312-none-any.whl",
                    "sha256": "8" * 64,
                }
            ],
            "smoke": {
                "sha256:" + "6" * 64: {
                    "p": {
                        "verdict": "pass",
                        "verified": True,
                        "image_id": "sha256:" + "6" * 64,
                        "target": "image:x",
                    },
                    "q": {"verdict": "pass", "verified": False, "target": "url:http://x"},
                }
            },
        }
    )


def _parse(data: bytes) -> Statement:
    message = json_format.ParseDict(json.loads(data), statement_pb2.Statement())
    statement = Statement.copy_from_pb(message)
    statement.validate()
    return statement


def test_provenance_and_verdicts_parse_with_the_in_toto_library() -> None:
    subject = statements.Subject("ghcr.io/acme/sparkbuild/sglang", (DIGEST,))
    entry = _entry()
    made = statements.statement(
        subject, statements.PROVENANCE_PREDICATE, statements.provenance("b", "builds/x.yaml", entry)
    )
    parsed = _parse(made)
    assert parsed.pb.predicate_type == "https://slsa.dev/provenance/v1"
    provenance = json_format.ParseDict(json.loads(made)["predicate"], provenance_pb2.Provenance())
    dependencies = {
        d.name: dict(d.digest) for d in provenance.build_definition.resolved_dependencies
    }
    assert dependencies == {
        "source": {"gitCommit": "1" * 40},
        "pr/101": {"gitCommit": "3" * 40},
        "patch/patches/sglang/fix.patch": {"sha256": "5" * 64},
        "base-image": {"sha256": "7" * 64},
        "wheel/triton-3.4-cp312-none-any.whl": {"sha256": "8" * 64},
    }
    assert statements.dependency_digests(entry) == dependencies

    verdicts = statements.verdicts("b", entry, "sha256:" + "6" * 64, DIGEST)
    assert list(verdicts["smoke"]) == ["p"]  # the unverified URL run is left out
    assert "target" not in verdicts["smoke"]["p"]
    assert _parse(statements.statement(subject, statements.VERDICTS_PREDICATE, verdicts))


def test_the_provenance_carries_the_build_times_the_lock_recorded_and_never_invents_them() -> None:
    entry = _entry()
    assert entry.image is not None
    metadata = statements.provenance("b", "builds/x.yaml", entry)["runDetails"]["metadata"]
    assert "startedOn" not in metadata and "finishedOn" not in metadata  # an older lock
    entry.image.started, entry.image.finished = "2026-11-25T18:01:02+00:00", "2026-11-25T18:07:09Z"
    made = statements.statement(
        statements.Subject("ghcr.io/acme/sparkbuild/sglang", (DIGEST,)),
        statements.PROVENANCE_PREDICATE,
        statements.provenance("b", "builds/x.yaml", entry),
    )
    _parse(made)
    predicate = json.loads(made)["predicate"]
    assert predicate["runDetails"]["metadata"]["startedOn"] == "2026-11-25T18:01:02Z"
    assert predicate["runDetails"]["metadata"]["finishedOn"] == "2026-11-25T18:07:09Z"
    parsed = json_format.ParseDict(predicate, provenance_pb2.Provenance()).run_details.metadata
    assert parsed.finished_on.ToSeconds() - parsed.started_on.ToSeconds() == 367
    entry.image.finished = None  # one without the other: neither is claimed
    metadata = statements.provenance("b", "builds/x.yaml", entry)["runDetails"]["metadata"]
    assert "startedOn" not in metadata and "finishedOn" not in metadata


DPKG_STATUS = """Package: libc6
Status: install ok installed
Architecture: arm64
Source: glibc
Version: 2.36-9+deb12u10
Description: GNU C Library
 continuation line: not a field

Package: removed-one
Status: deinstall ok config-files
Version: 1.0
"""


def test_the_sbom_validates_and_names_the_engines_pedigree() -> None:
    packages = contents.parse_dpkg_status(DPKG_STATUS)
    assert [p.name for p in packages] == ["libc6"] and packages[0].source == "glibc"
    dist = contents.distribution(
        "/usr/lib/python3/dist-packages",
        {
            "METADATA": b"Name: Torch_Thing\nVersion: 2.1\n\n",
            "RECORD": b"torch_thing/__init__.py,sha256=abc,10\ntorch_thing.dist-info/RECORD,,\n",
        },
    )
    assert dist is not None and dist.hashed_files == 1
    found = contents.ImageContents("debian", "12", tuple(packages), (dist,))
    made = sbom.build_sbom(found, "b", _entry(), "ghcr.io/acme/sparkbuild/sglang", DIGEST)
    text = json.dumps(made.document)
    assert JsonStrictValidator(SchemaVersion.V1_6).validate_str(text) is None
    assert made.packages == 2
    purls = {c["bom-ref"]: c.get("purl") for c in made.document["components"]}
    assert (
        purls["deb:libc6:arm64"]
        == "pkg:deb/debian/libc6@2.36-9%2Bdeb12u10?arch=arm64&distro=debian-12"
    )
    assert purls["pypi:/usr/lib/python3/dist-packages:torch-thing"] == "pkg:pypi/torch-thing@2.1"
    engine = next(c for c in made.document["components"] if c["bom-ref"] == "engine")
    assert [p["type"] for p in engine["pedigree"]["patches"]] == ["cherry-pick", "unofficial"]
    assert engine["pedigree"]["ancestors"][0]["purl"] == "pkg:github/sgl-project/sglang@" + "1" * 40
    assert _parse(
        statements.statement(
            statements.Subject("x", (DIGEST,)), statements.SBOM_PREDICATE, made.document
        )
    )


def test_registry_shapes_are_bounded() -> None:
    entry = {"mediaType": layout.OCI_MANIFEST, "digest": DIGEST, "size": 10}
    assert (
        len(
            layout.parse_index(
                json.dumps({"schemaVersion": 2, "manifests": [entry] * 256}).encode()
            ).manifests
        )
        == 256
    )
    for bad in (
        {"schemaVersion": 2, "manifests": [entry] * 257},
        {"schemaVersion": 2, "manifests": [{**entry, "digest": "sha256:short"}]},
        {"schemaVersion": 2, "manifests": [{**entry, "artifactType": 12}]},
    ):
        with pytest.raises(ValueError):
            layout.parse_index(json.dumps(bad).encode())
    descriptor = layout.Descriptor(media_type=layout.DSSE_ENVELOPE, digest=DIGEST, size=1)
    manifest = layout.attestation_manifest(
        descriptor, descriptor, "https://x", "2026-01-01T00:00:00Z"
    )
    shown = json.loads(layout.to_bytes(manifest))
    assert (
        shown["artifactType"] == layout.ATTESTATION_ARTIFACT
        and shown["subject"]["digest"] == DIGEST
    )
    assert shown["config"] == {
        "mediaType": "application/vnd.oci.empty.v1+json",
        "size": 2,
        "data": "e30=",
        "digest": "sha256:44136fa355b3678a1146ad16f7e8649e94fb4fc21fe77e8310c060f61caaff8a",
    }
    assert layout.signature_tag(DIGEST) == "sha256-" + "ab" * 32 + ".sig"


def _kyverno_schema() -> dict[str, Any]:
    """Kyverno's ClusterPolicy CRD at a pinned release, cached: its v1 schema, with unknown
    fields refused as the API server's structural pruning would drop them."""
    path = shared_test_cache() / "kyverno" / "v1.13.4-clusterpolicies.yaml"
    if not path.exists():
        url = (
            "https://raw.githubusercontent.com/kyverno/kyverno/v1.13.4/config/crds/kyverno/"
            "kyverno.io_clusterpolicies.yaml"
        )
        with urllib.request.urlopen(url, timeout=60) as response:
            data = response.read()
        path.parent.mkdir(parents=True, exist_ok=True)
        path.with_suffix(".tmp").write_bytes(data)
        path.with_suffix(".tmp").replace(path)
    crd = yaml.safe_load(path.read_text())
    version = next(v for v in crd["spec"]["versions"] if v["name"] == "v1")
    schema: dict[str, Any] = version["schema"]["openAPIV3Schema"]

    def strict(node: Any) -> None:
        if isinstance(node, dict):
            if node.get("properties") and not node.get("x-kubernetes-preserve-unknown-fields"):
                node.setdefault("additionalProperties", False)
            for value in node.values():
                strict(value)
        elif isinstance(node, list):
            for value in node:
                strict(value)

    strict(schema)
    return schema


@pytest.mark.github
def test_the_kyverno_policy_validates_against_kyvernos_crd(pair: tuple[bytes, bytes]) -> None:
    public = keys.PublicKey(keys.public_from_pem(pair[1], "t"), "t")
    text = policy.render(policy.kyverno_policy(public, ["ghcr.io/acme/sparkbuild/*"], "p"))
    document = yaml.safe_load(text)
    validator = jsonschema.Draft7Validator(_kyverno_schema())
    assert [e.message for e in validator.iter_errors(document)] == []
    (rule,) = document["spec"]["rules"][0]["verifyImages"]
    assert rule["attestors"][0]["entries"][0]["keys"]["publicKeys"] == pair[1].decode()
    assert [a["type"] for a in rule["attestations"]] == [
        statements.PROVENANCE_PREDICATE,
        statements.VERDICTS_PREDICATE,
    ]
    broken = {**document, "spec": {**document["spec"], "validationFailureAction": "Sometimes"}}
    assert list(validator.iter_errors(broken))  # the schema does refuse what Kyverno refuses


def test_keys_policy_prints_yaml_a_library_reads(tmp_path: Path, pair: tuple[bytes, bytes]) -> None:
    from tests.support.cli import run_cli

    (tmp_path / "cosign.pub").write_bytes(pair[1])
    result = run_cli("--project", str(tmp_path), "keys", "policy", "--image", "ghcr.io/acme/*")
    assert result.exit_code == 0, result.stderr
    document = yaml.safe_load(result.stdout)
    assert document["kind"] == "ClusterPolicy"
    assert serialization.load_pem_public_key(
        document["spec"]["rules"][0]["verifyImages"][0]["attestors"][0]["entries"][0]["keys"][
            "publicKeys"
        ].encode()
    )


def test_the_sbom_graph_and_validation_are_the_librarys_in_linear_time() -> None:
    """build_sbom makes the dependency graph directly and validates with a linear
    ``uniqueItems`` (the library's register_dependency and jsonschema's pairwise check took
    seconds on a real image's 700 components): the same graph, the same verdicts."""
    from cyclonedx.model.bom import Bom
    from cyclonedx.model.component import Component
    from cyclonedx.output.json import JsonV1Dot6

    packages = tuple(contents.OsPackage(f"p{i}", "1.0", "arm64", None) for i in range(40))
    found = contents.ImageContents("debian", "12", packages, ())
    made = sbom.build_sbom(found, "b", _entry(), "ghcr.io/acme/sparkbuild/sglang", DIGEST)
    root = Component(name="image", bom_ref="image")
    parts = [Component(name=c["name"], bom_ref=c["bom-ref"]) for c in made.document["components"]]
    library = Bom(components=parts)
    library.metadata.component = root
    library.register_dependency(root, parts)
    expected = json.loads(JsonV1Dot6(library).output_as_string())["dependencies"]
    assert made.document["dependencies"] == expected
    validator = sbom._validator()
    assert list(validator.iter_errors(made.document)) == []
    twice = {**made.document, "components": [*made.document["components"]] * 2}
    assert [e.validator for e in validator.iter_errors(twice)] == ["uniqueItems"]
    numbers = {"type": "array", "uniqueItems": True}
    assert not validator.evolve(schema=numbers).is_valid([1, 1.0])  # the same JSON number
    assert validator.evolve(schema=numbers).is_valid([1, True, "1"])
