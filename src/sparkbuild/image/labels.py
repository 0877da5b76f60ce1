"""What an image says about itself (OCI + sparkbuild labels) and its inputs digest.

The inputs digest covers everything that decides an image's content: the pinned base, the
platform, the patched tree, the Dockerfile and helper bytes, build arguments and the labels
themselves. Two builds with the same digest produce the same image, so a local image that
carries the digest makes a rebuild unnecessary.
"""

from __future__ import annotations

import hashlib
import json
import os
from collections.abc import Mapping
from datetime import UTC, datetime

from sparkbuild import git
from sparkbuild.errors import UsageError
from sparkbuild.redact import strip_userinfo
from sparkbuild.source import PreparedSource

INPUTS_FORMAT = 1
INPUTS_LABEL = "io.sparkbuild.inputs-digest"
TREE_LABEL = "io.sparkbuild.tree"
BUILD_LABEL = "io.sparkbuild.build"


def source_date_epoch(prepared: PreparedSource) -> int:
    """``SOURCE_DATE_EPOCH`` if set, else the base commit's date: stable across rebuilds."""
    env = os.environ.get("SOURCE_DATE_EPOCH")
    if env:
        try:
            return int(env)
        except ValueError as exc:
            raise UsageError(f"SOURCE_DATE_EPOCH={env!r} is not a number of seconds") from exc
    return int(
        git.text(["log", "-1", "--format=%ct", prepared.base_commit], git_dir=prepared.mirror)
    )


def rfc3339(epoch: int) -> str:
    return datetime.fromtimestamp(epoch, tz=UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def _compact(value: object) -> str:
    return json.dumps(value, sort_keys=True, separators=(",", ":"))


def image_labels(
    prepared: PreparedSource, *, epoch: int, base_ref: str, base_digest: str
) -> dict[str, str]:
    """Every label except the inputs digest (which is computed over these)."""
    build = prepared.build
    prs = [
        {"number": item.number, "status": item.status, "head": item.head}
        for item in prepared.items
        if item.kind == "pr"
    ]
    patches = [
        {"file": item.file, "status": item.status, "sha256": item.sha256}
        for item in prepared.items
        if item.kind == "patch"
    ]
    steps = [
        {"step": item.step, "file": item.file, "status": item.status}
        for item in prepared.items
        if item.kind == "step"
    ]
    labels = {
        "org.opencontainers.image.source": strip_userinfo(build.spec_repo),
        "org.opencontainers.image.revision": prepared.base_commit,
        "org.opencontainers.image.version": str(build.version),
        "org.opencontainers.image.created": rfc3339(epoch),
        "org.opencontainers.image.base.name": base_ref,
        "org.opencontainers.image.base.digest": base_digest,
        TREE_LABEL: prepared.tree,
        "io.sparkbuild.prs": _compact(prs),
        "io.sparkbuild.patches": _compact(patches),
        BUILD_LABEL: build.name,
    }
    if steps:  # only then: the labels (and inputs digest) of other builds stay as they were
        labels["io.sparkbuild.steps"] = _compact(steps)
    return labels


def inputs_digest(parts: Mapping[str, object]) -> str:
    payload = _compact({"format": INPUTS_FORMAT, **parts})
    return "sha256:" + hashlib.sha256(payload.encode()).hexdigest()


def file_digest(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()
