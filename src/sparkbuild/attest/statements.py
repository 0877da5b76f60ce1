"""The in-toto Statements sparkbuild attaches to a published image: SLSA provenance made
from images.lock, the verdicts the lock holds for the image, and the SBOM.

Each is an in-toto Statement v1 built with the in-toto attestation library (its
``Statement`` and ``ResourceDescriptor``, validated), whose subject is the image's manifest
digest (and, for an index, the platform manifest's). The provenance predicate is the SLSA
Provenance v1 message of the same library. The verdicts predicate is ours
(:data:`VERDICTS_PREDICATE`, documented in docs/verify.md). Predicates go into the JSON as
their models wrote them: protobuf's ``Struct`` would turn every integer into a float.
"""

from __future__ import annotations

import json
import os
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from google.protobuf import json_format
from google.protobuf.struct_pb2 import Struct
from in_toto_attestation.predicates.provenance.v1 import provenance_pb2
from in_toto_attestation.v1.resource_descriptor import ResourceDescriptor
from in_toto_attestation.v1.statement import Statement

from sparkbuild import __version__, lockfile
from sparkbuild.attest import pins

STATEMENT_TYPE = "https://in-toto.io/Statement/v1"
PROVENANCE_PREDICATE = "https://slsa.dev/provenance/v1"
SBOM_PREDICATE = "https://cyclonedx.org/bom"
#: Ours: stable, documented in docs/verify.md ("The verdicts predicate").
VERDICTS_PREDICATE = "https://sparkbuild.dev/attestation/verdicts/v1"
BUILD_TYPE = "https://sparkbuild.dev/buildtypes/image/v1"
LOCAL_BUILDER = "https://sparkbuild.dev/builders/local"
#: The kinds of attestation, by the name the lock and `verify` give them.
KINDS = {
    "sbom": SBOM_PREDICATE,
    "provenance": PROVENANCE_PREDICATE,
    "verdicts": VERDICTS_PREDICATE,
}


@dataclass(frozen=True)
class Subject:
    """What a statement is about: a repository and one or more digests of the image."""

    name: str  # HOST/REPOSITORY
    digests: tuple[str, ...]  # the manifest (or index) digest first, then platform manifests


def statement(subject: Subject, predicate_type: str, predicate: Mapping[str, object]) -> bytes:
    """The Statement's JSON bytes, validated by the in-toto attestation library."""
    subjects = [
        ResourceDescriptor(name=subject.name, digest={"sha256": d.removeprefix("sha256:")}).pb
        for d in subject.digests
    ]
    built = Statement(subjects, predicate_type, predicate or {"empty": True})
    built.validate()
    data = json_format.MessageToDict(built.pb)
    data["predicate"] = predicate
    return json.dumps(data, sort_keys=True, separators=(",", ":")).encode()


# --- provenance ------------------------------------------------------------------------------


def builder_id() -> str:
    """The workflow that ran this (GitHub Actions), else this machine's local builder."""
    server, workflow = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_WORKFLOW_REF")
    if server and workflow:
        return f"{server}/{workflow}"
    return LOCAL_BUILDER


def _invocation() -> str:
    server, repository = os.environ.get("GITHUB_SERVER_URL"), os.environ.get("GITHUB_REPOSITORY")
    run, attempt = os.environ.get("GITHUB_RUN_ID"), os.environ.get("GITHUB_RUN_ATTEMPT", "1")
    if server and repository and run:
        return f"{server}/{repository}/actions/runs/{run}/attempts/{attempt}"
    return ""


def _dependency(name: str, uri: str, digest: dict[str, str], **notes: str | None) -> object:
    annotations = {key: value for key, value in notes.items() if value}
    return ResourceDescriptor(name=name, uri=uri, digest=digest, annotations=annotations).pb


def _git_uri(repo: str, ref: str | None) -> str:
    location = repo if "://" in repo else f"file://{repo}"
    return f"git+{location}@{ref}" if ref else f"git+{location}"


def resolved_dependencies(entry: lockfile.BuildEntry) -> list[Any]:
    """The upstream commit, each PR's head, each patch, the base image, each pinned wheel."""
    source = entry.source or lockfile.SourceSection()
    image = entry.image or lockfile.ImageSection()
    repo = str(source.repo or "")
    found = [_dependency("source", _git_uri(repo, source.ref), {"gitCommit": str(source.commit)})]
    for pr in source.prs:
        digest = {"gitCommit": pr.head} if pr.head else {}
        found.append(
            _dependency(
                f"pr/{pr.number}",
                f"{repo.removesuffix('.git')}/pull/{pr.number}",
                digest,
                status=pr.status,
                diffSha256=pr.diff_sha256,
            )
        )
    for patch in source.patches:
        digest = {"sha256": patch.sha256} if patch.sha256 else {}
        found.append(_dependency(f"patch/{patch.file}", "", digest, status=patch.status))
    if image.base_image and image.base_digest:
        base = image.base_image.split("@", 1)[0]
        found.append(
            _dependency(
                "base-image",
                f"docker://{base}",
                {"sha256": image.base_digest.removeprefix("sha256:")},
            )
        )
    for wheel in entry.requirements or []:
        found.append(
            _dependency(
                f"wheel/{wheel.filename}",
                f"pkg:pypi/{wheel.name}@{wheel.version}",
                {"sha256": wheel.sha256},
            )
        )
    return found


def dependency_digests(entry: lockfile.BuildEntry) -> dict[str, dict[str, str]]:
    """name -> digest of each resolved dependency, as the provenance of ``entry`` lists them."""
    found = {}
    for pb in resolved_dependencies(entry):
        found[str(pb.name)] = {str(k): str(v) for k, v in pb.digest.items()}
    return found


def _struct(values: dict[str, str]) -> Struct:
    struct = Struct()
    struct.update({key: value for key, value in values.items() if value})
    return struct


def provenance(build: str, spec_file: str, entry: lockfile.BuildEntry) -> dict[str, Any]:
    """The SLSA Provenance v1 predicate of ``build``'s image, from its lock entry. Its
    ``runDetails.metadata`` has ``startedOn``/``finishedOn`` when the lock recorded the
    image's build times (never made up: an older lock's provenance has neither)."""
    source = entry.source or lockfile.SourceSection()
    image = entry.image or lockfile.ImageSection()
    definition = provenance_pb2.BuildDefinition(
        build_type=BUILD_TYPE,
        external_parameters=_struct(
            {"build": build, "specFile": spec_file, "specDigest": str(source.spec_digest or "")}
        ),
        internal_parameters=_struct(
            {
                "platform": str(image.platform or ""),
                "mode": str(image.mode or ""),
                "tree": str(image.tree or source.tree or ""),
                "inputsDigest": str(image.inputs_digest or ""),
                "imageId": str(image.image_id or ""),
            }
        ),
        resolved_dependencies=resolved_dependencies(entry),
    )
    metadata = provenance_pb2.BuildMetadata(invocation_id=_invocation())
    times = image.build_times()
    if times is not None:
        metadata.started_on.FromDatetime(times[0].astimezone(UTC))
        metadata.finished_on.FromDatetime(times[1].astimezone(UTC))
    run = provenance_pb2.RunDetails(
        builder=provenance_pb2.Builder(
            id=builder_id(), version={"sparkbuild": __version__, **(image.builder or {})}
        ),
        metadata=metadata,
    )
    message = provenance_pb2.Provenance(build_definition=definition, run_details=run)
    predicate: dict[str, Any] = json_format.MessageToDict(message)
    # Beside the Struct (which would make every integer a float): what a rebuild needs.
    predicate["buildDefinition"].setdefault("internalParameters", {}).update(
        pins.internal_parameters(entry)
    )
    return predicate


# --- verdicts --------------------------------------------------------------------------------


def _smoke(records: dict[str, lockfile.SmokeRecord], image_id: str) -> dict[str, object]:
    """Only verified runs of this very image (as publish's gate counts them)."""
    kept: dict[str, object] = {}
    for profile, record in records.items():
        if record.verified is not True or record.image_id != image_id:
            continue
        data = record.to_json()
        data.pop("target", None)  # a command line or URL: not the image's business
        kept[profile] = data
    return kept


def _preflight(runs: dict[str, lockfile.PreflightRun], image_id: str) -> dict[str, object]:
    """Only runs inside this very image (the only preflight publish counts)."""
    return {
        key: run.to_json()
        for key, run in runs.items()
        if run.where == "image" and run.image_id == image_id
    }


def _bench(records: dict[str, lockfile.BenchRecord]) -> dict[str, object]:
    return {
        profile: {
            "label": record.label,
            "harness": record.harness,
            "created": record.created,
            "runs": record.runs,
            "cells": [cell.to_json() for cell in record.cells],
            **({"hosts": record.hosts.to_json()} if record.hosts else {}),
        }
        for profile, record in records.items()
    }


def verdicts(build: str, entry: lockfile.BuildEntry, image_id: str, digest: str) -> dict[str, Any]:
    """What the lock verified about ``image_id``: preflight in the image, verified smoke
    verdicts, and the bench summaries measured on it."""
    return {
        "build": build,
        "image": {"digest": digest, "imageId": image_id},
        "preflight": _preflight(entry.preflight or {}, image_id),
        "smoke": _smoke((entry.smoke or {}).get(image_id) or {}, image_id),
        "bench": _bench((entry.bench or {}).get(image_id) or {}),
        "sparkbuild": __version__,
    }


def passing_profiles(predicate: Mapping[str, object], profiles: Iterable[str]) -> dict[str, str]:
    """profile -> the smoke verdict a verdicts predicate holds for it ('missing' if none)."""
    smoke = predicate.get("smoke")
    smoke = smoke if isinstance(smoke, dict) else {}
    found = {}
    for profile in profiles:
        record = smoke.get(profile)
        verdict = record.get("verdict") if isinstance(record, dict) else None
        found[profile] = str(verdict) if verdict else "missing"
    return found


def now() -> datetime:
    return datetime.now(tz=UTC)
