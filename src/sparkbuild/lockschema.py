"""The shape of images.lock, checked on every load so a damaged lock is one clear error.

Only what sparkbuild reads back is pinned down (commits, hashes, PR numbers, image ids);
each stage may add keys of its own (``extra="allow"``). Validation never changes the data:
:func:`sparkbuild.lockfile.load` returns the plain mapping it read.
"""

from __future__ import annotations

from typing import Annotated, Any

from pydantic import AfterValidator, BaseModel, ConfigDict, Field

from sparkbuild import validate

Sha = Annotated[str, Field(pattern=r"^[0-9a-f]{40}([0-9a-f]{24})?$")]
Sha256 = Annotated[str, Field(pattern=r"^[0-9a-f]{64}$")]
Digest = Annotated[str, Field(pattern=r"^sha256:[0-9a-f]{64}$")]
# Image ids go to docker, never to git or a shell; a plain token is enough.
ImageId = Annotated[str, Field(pattern=r"^[A-Za-z0-9][A-Za-z0-9:._@/-]*$")]
BuildName = Annotated[str, AfterValidator(validate.build_name)]


class _Open(BaseModel):
    model_config = ConfigDict(extra="allow")


class LockedPR(_Open):
    number: int = Field(gt=0)
    when: str | None = None
    status: str | None = None
    head: Sha | None = None
    commits: list[Sha] = []
    diff_sha256: Sha256 | None = None


class LockedPatch(_Open):
    file: str
    when: str | None = None
    status: str | None = None
    sha256: Sha256 | None = None


class SourceSection(_Open):
    engine: str | None = None
    repo: str | None = None
    ref: str | None = None
    commit: Sha | None = None
    version: str | None = None
    spec_digest: Digest | None = None
    tree: Sha | None = None
    prs: list[LockedPR] = []
    patches: list[LockedPatch] = []


class ImageSection(_Open):
    image_id: ImageId | None = None
    tree: Sha | None = None
    inputs_digest: str | None = None
    tags: list[str] = []


class BuildEntry(_Open):
    source: SourceSection | None = None
    image: ImageSection | None = None
    smoke: dict[str, Any] | None = None
    bench: dict[str, Any] | None = None
    publish: dict[str, Any] | None = None


class LockFile(_Open):
    schema_: int = Field(default=1, alias="schema")
    builds: dict[BuildName, BuildEntry] = {}


def check(data: dict[str, Any]) -> None:
    """Raise pydantic's ValidationError when ``data`` is not a well-formed lock."""
    LockFile.model_validate(data)
