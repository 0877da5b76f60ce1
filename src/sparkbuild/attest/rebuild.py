"""``sparkbuild verify --rebuild REF@DIGEST``: rebuild a published image from its signed
provenance alone and compare.

Nothing is read from the project's images.lock. The image's signature and its provenance's
must verify with the key; the provenance's pins (:mod:`sparkbuild.attest.pins`) must agree with
its own resolved dependencies. They become the one entry of a scratch lock, and the build runs
``--locked`` and without the cache from them: the upstream commit and PR heads are fetched by
their hashes, each patch of the project's spec must have the pinned sha256, the base is pulled
by its digest, the patched tree and the inputs digest must be the pinned ones. A pin that does
not hold is refused, named. The rebuilt image's id is then compared with the published
manifest's config digest (which pins every layer's uncompressed content); when they differ,
the published config and the layers that differ are fetched and every difference named.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gzip
import json
import os
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import docker.errors
from pydantic import ValidationError

from sparkbuild import lockfile, source
from sparkbuild.attest import pins, statements
from sparkbuild.attest.keys import PublicKey
from sparkbuild.attest.verify import Verification, verify_image
from sparkbuild.errors import NotReproducibleError, RebuildInputError, SparkbuildError
from sparkbuild.image import (
    BuildOptions,
    ImageJob,
    base_config,
    base_image,
    build_image,
    layerdiff,
    render_tags,
    reproducible,
    tags,
)
from sparkbuild.jsontext import JsonObject
from sparkbuild.registry.client import RegistryClient, get_blob
from sparkbuild.settings import Settings
from sparkbuild.spec import Build, load_builds

if TYPE_CHECKING:
    from docker import DockerClient

_T = TypeVar("_T")
_LAYER_LIMIT = 2 * 1024**3  # a differing layer fetched to name its files


@dataclass(frozen=True)
class Rebuild:
    reference: str
    build: str
    published: str  # the published manifest's config digest: the image id
    rebuilt: str
    differences: tuple[layerdiff.Difference, ...]

    @property
    def ok(self) -> bool:
        return self.published == self.rebuilt

    def to_json(self) -> JsonObject:
        return {
            "reference": self.reference,
            "build": self.build,
            "ok": self.ok,
            "published": self.published,
            "rebuilt": self.rebuilt,
            "differences": [d.to_json() for d in self.differences],
        }

    def lines(self) -> str:
        if self.ok:
            return (
                f"{self.reference}: rebuilt from its provenance to the same image "
                f"{self.rebuilt[:19]} (build {self.build})"
            )
        listed = "\n".join(f"  {d.line()}" for d in self.differences[:40])
        return (
            f"{self.reference}: the rebuild gave {self.rebuilt[:19]}, the registry serves "
            f"{self.published[:19]} (build {self.build}); what differs:\n{listed}"
        )


def _trusted(verification: Verification) -> dict[str, Any]:
    """The provenance, once the image's signature and the provenance's verified."""
    needed = ("signature", "attestation:provenance")
    failed = [f for f in verification.findings if f.name in needed and not f.ok]
    provenance = verification.predicates.get("provenance")
    if failed or provenance is None:
        named = "; ".join(f"{f.name}: {f.detail}" for f in failed) or "no verified provenance"
        raise RebuildInputError(
            f"{verification.reference}: nothing to rebuild from ({named})",
            "`sparkbuild verify REF@DIGEST` shows every finding; only a signed provenance is "
            "rebuilt from",
        )
    return dict(provenance)


def pinned_entry(provenance: dict[str, Any], reference: str) -> tuple[str, lockfile.BuildEntry]:
    """The build the provenance names and its pins as a lock entry, checked against the
    provenance's own resolved dependencies."""
    definition = provenance.get("buildDefinition") or {}
    internal = definition.get("internalParameters") or {}
    raw = internal.get(pins.PINS_KEY) if isinstance(internal, dict) else None
    build = (definition.get("externalParameters") or {}).get("build")
    if not isinstance(raw, dict) or not isinstance(build, str):
        raise RebuildInputError(
            f"{reference}: its provenance carries no rebuild pins ({pins.PINS_KEY})",
            "it was published by an older sparkbuild; publish it again to attach them",
        )
    try:
        entry = lockfile.BuildEntry.model_validate(raw)
    except ValidationError as exc:
        raise RebuildInputError(
            f"{reference}: the provenance's rebuild pins are malformed ({exc.error_count()} "
            f"error(s): {exc.errors()[0]['msg']})"
        ) from None
    attested = {
        str(d.get("name")): d.get("digest") or {}
        for d in definition.get("resolvedDependencies") or []
        if isinstance(d, dict)
    }
    for name, digest in statements.dependency_digests(entry).items():
        if attested.get(name, {}) != digest:
            raise RebuildInputError(
                f"{reference}: the provenance pins {name} as {digest or 'nothing'} but lists it "
                f"as {attested.get(name) or 'nothing'}",
                "the provenance contradicts itself; do not trust this image",
            )
    return build, entry


def _spec_build(settings: Settings, name: str, reference: str) -> Build:
    builds = load_builds(settings)
    if name not in builds:
        raise RebuildInputError(
            f"{reference}: its provenance names build {name!r}, which {settings.builds_dir} "
            "does not define",
            "run it in a checkout of the project that published the image",
        )
    return builds[name]


@contextlib.contextmanager
def _epoch(value: int | None) -> Iterator[None]:
    before = os.environ.get("SOURCE_DATE_EPOCH")
    if value is not None:
        os.environ["SOURCE_DATE_EPOCH"] = str(value)
    try:
        yield
    finally:
        if before is None:
            os.environ.pop("SOURCE_DATE_EPOCH", None)
        else:
            os.environ["SOURCE_DATE_EPOCH"] = before


Published = tuple[str, dict[str, Any], list[str]]  # config digest, config, layer blob digests


def _published_config(
    client: RegistryClient, repository: str, digest: str, platform: str
) -> Published:
    """(config digest, config, layer blob digests) of the image the registry serves."""
    manifest = client.manifest(repository, digest)
    if manifest is None:
        raise RebuildInputError(f"{client.registry.host}/{repository}@{digest} is not served")
    body = json.loads(manifest.body)
    if "manifests" in body:
        os_name, _, arch = platform.partition("/")
        chosen = next(
            (
                m["digest"]
                for m in body["manifests"]
                if (m.get("platform") or {}).get("architecture") == arch
                and (m.get("platform") or {}).get("os") == os_name
            ),
            None,
        )
        single = client.manifest(repository, str(chosen)) if chosen else None
        if single is None:
            raise RebuildInputError(f"{repository}@{digest} has no {platform} image")
        body = json.loads(single.body)
    config_digest = str((body.get("config") or {}).get("digest") or "")
    config = json.loads(get_blob(client, repository, config_digest))
    layers = [str(layer.get("digest")) for layer in body.get("layers") or []]
    return config_digest, config, layers


def _published_canonical(
    client: RegistryClient,
    repository: str,
    published: Published,
    rebuilt: reproducible.Canonical,
    work: Path,
) -> reproducible.Canonical:
    """The published image as a canonical form, fetching only the layers that differ."""
    config_digest, config, blobs = published
    diff_ids = reproducible.base_facts(config).diff_ids
    steps = [
        str(s.get("created_by") or "")
        for s in config.get("history") or []
        if isinstance(s, dict) and not s.get("empty_layer")
    ]
    layers = []
    for index, diff_id in enumerate(diff_ids):
        same = index < len(rebuilt.layers) and rebuilt.layers[index].diff_id == diff_id
        path = None
        if not same and index >= rebuilt.base_layers and index < len(blobs):
            path = work / f"published-{index}.tar"
            data = get_blob(client, repository, blobs[index], limit=_LAYER_LIMIT)
            path.write_bytes(gzip.decompress(data) if data[:2] == b"\x1f\x8b" else data)
        step = steps[index] if index < len(steps) else ""
        layers.append(reproducible.Layer(diff_id, step, path))
    return reproducible.Canonical(config_digest, config, tuple(layers), rebuilt.base_layers, False)


def rebuild_published(
    settings: Settings,
    client: RegistryClient,
    repository: str,
    digest: str,
    public: PublicKey,
) -> Rebuild:
    """Verify, rebuild from the provenance's pins, compare (see the module's docstring)."""
    verification = verify_image(client, repository, digest, public)
    reference = verification.reference
    name, entry = pinned_entry(_trusted(verification), reference)
    build = _spec_build(settings, name, reference)
    image = entry.image or lockfile.ImageSection()
    platform = str(image.platform or build.image.platform)
    published = _published_config(client, repository, digest, platform)
    with reproducible.workdir(settings.cache_dir / "rebuild") as work:
        scratch = dataclasses.replace(settings, lock_path=work / "images.lock")
        lockfile.write_atomic(
            scratch.lock_file, lockfile.dumps(lockfile.LockFile(builds={name: entry}))
        )
        options = BuildOptions(locked=True, no_cache=True, platform=platform)
        with _epoch(image.source_date_epoch):
            job = _refusing(reference, lambda: ImageJob.start(build, scratch, options))
            prepared = _refusing(
                reference,
                lambda: source.prepare_source(build, scratch, locked=True, lock=job.lock.lock),
            )
            kept = _tagged(job.api, render_tags(build, prepared.tree))
            result = _refusing(reference, lambda: build_image(prepared, job))
        if result.image_id == published[0]:
            return Rebuild(reference, name, published[0], result.image_id, ())
        base = base_image.pinned(str(image.base_image), str(image.base_digest))
        facts = reproducible.base_facts(base_config.full_config(base, platform))
        epoch = int(image.source_date_epoch or 0)
        rebuilt = reproducible.canonicalise(
            job.api, job.api.images.get(result.image_id), facts, epoch, work
        )
        theirs = _published_canonical(client, repository, published, rebuilt, work)
        found = layerdiff.differences(theirs, rebuilt)
        _restore(job.api, result.image_id, kept)
    return Rebuild(reference, name, published[0], result.image_id, tuple(found))


def _tagged(api: DockerClient, names: tuple[str, ...]) -> dict[str, str | None]:
    """The image each of the build's tags names now (None: no such tag)."""
    found: dict[str, str | None] = {}
    for name in names:
        try:
            found[name] = str(api.images.get(name).id)
        except docker.errors.ImageNotFound:
            found[name] = None
    return found


def _restore(api: DockerClient, rebuilt: str, kept: dict[str, str | None]) -> None:
    """A rebuild that differs leaves the store as it was: its image goes, the tags it took
    go back to the images they named."""
    with contextlib.suppress(docker.errors.APIError):
        api.images.remove(rebuilt, force=True)
    for name, image_id in kept.items():
        if image_id is not None:
            with contextlib.suppress(docker.errors.APIError):
                tags.ensure_tags(api.images.get(image_id), (name,))


def _refusing(reference: str, action: Callable[[], _T]) -> _T:
    """``action``, its failure named as a refusal to rebuild: here the "lock" is the
    provenance's pins, so a lock's hint would send the user the wrong way."""
    try:
        return action()
    except SparkbuildError as exc:
        if isinstance(exc, NotReproducibleError):
            raise
        raise RebuildInputError(
            f"{reference}: refused to rebuild from its provenance: {exc.message}",
            "the provenance pins an input that differs from what the project or its sources "
            "hold (named above); rebuild in a checkout of the revision that published the "
            "image, or do not trust it",
        ) from None
