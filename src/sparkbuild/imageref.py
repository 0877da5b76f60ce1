"""Image references: one grammar for repositories, tags and digests, and one tag renderer.

The grammar is the distribution spec's (a path component is lowercase alphanumerics joined
by ``.``, ``_``, ``__`` or dashes; a tag is up to 128 word characters, dots and dashes). The
image stage (spec ``tags:``) and the publish stage (``--repository``, ``--alias``) both
render templates with the same placeholders, so a template means the same in both places.
"""

from __future__ import annotations

import re

from sparkbuild import templates
from sparkbuild.spec import Build

PLACEHOLDERS = ("engine", "version", "tree_short", "build")
DOCKER_HUB = "docker.io"
_COMPONENT_TEXT = r"[a-z0-9]+(?:(?:[._]|__|-+)[a-z0-9]+)*"
_TAG_TEXT = r"[\w][\w.-]{0,127}"
COMPONENT = re.compile(rf"^{_COMPONENT_TEXT}\Z")
TAG = re.compile(rf"^{_TAG_TEXT}\Z")
# [host[:port]/]component(/component)*[:tag]
REFERENCE = re.compile(
    rf"^(?:[a-zA-Z0-9.-]+(?::[0-9]+)?/)?{_COMPONENT_TEXT}(?:/{_COMPONENT_TEXT})*(?::{_TAG_TEXT})?\Z"
)


def placeholder_hint() -> str:
    return "placeholders: " + ", ".join("{" + p + "}" for p in PLACEHOLDERS)


def render(template: str, build: Build, tree: str | None) -> str:
    """``template`` with ``{engine}``, ``{version}``, ``{tree_short}`` and ``{build}`` filled
    (``tree`` None: before the tree is known, ``{tree_short}`` is refused too). Only these
    names: UnknownPlaceholderError names any other field."""
    values = {"engine": build.engine, "version": str(build.version), "build": build.name}
    if tree is not None:
        values["tree_short"] = tree[:12]
    return templates.fill(template, values)


def split_tag(reference: str) -> tuple[str, str]:
    """``name:tag`` into its parts; a reference without a tag means ``latest``."""
    name, sep, tag = reference.rpartition(":")
    if not sep or "/" in tag:
        return reference, "latest"
    return name, tag


def strip_digest(reference: str) -> str:
    return reference.split("@", 1)[0]


def digest_of(reference: str) -> str | None:
    _, sep, digest = reference.partition("@")
    return digest if sep else None


def split_reference(reference: str) -> tuple[str, str]:
    """``(registry host, repository)`` of an image reference, Docker Hub rules included."""
    name = reference.split("@", 1)[0]
    last = name.rsplit("/", 1)[-1]
    if ":" in last:
        name = name[: len(name) - len(last)] + last.split(":", 1)[0]
    first, _, rest = name.partition("/")
    if rest and ("." in first or ":" in first or first == "localhost"):
        return first, rest
    return DOCKER_HUB, name if "/" in name else f"library/{name}"
