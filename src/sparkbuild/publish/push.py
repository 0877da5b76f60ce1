"""Publishing: push the image images.lock pins by digest, check what the registry now serves,
move the aliases, and record the publication (written last, so an interrupted run leaves the
lock as it was and running the command again completes the job)."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import docker.errors

from sparkbuild import console, dockerhost, lockfile
from sparkbuild.errors import (
    LocalImageError,
    LockError,
    PlatformError,
    PublishError,
)
from sparkbuild.jsontext import JsonObject
from sparkbuild.preflight.gate import preflight_gate
from sparkbuild.publish import layers
from sparkbuild.publish.destination import Destination
from sparkbuild.publish.gate import (
    cluster_profiles,
    declared_checks,
    smoke_gate,
    smoke_verdicts,
)
from sparkbuild.publish.record import after_push
from sparkbuild.publish.signing import (
    Signing,
    already_signed,
    read_during_push,
    sign_publication,
)
from sparkbuild.registry import manifests
from sparkbuild.registry.address import Manifest
from sparkbuild.registry.client import RegistryClient
from sparkbuild.registry.credentials import Credentials
from sparkbuild.settings import Settings
from sparkbuild.spec import Build

if TYPE_CHECKING:
    from concurrent.futures import Future

    from docker import DockerClient
    from docker.models.images import Image

    from sparkbuild.attest.contents import ImageContents

SECTION = "publish"


@dataclass(frozen=True)
class PublishResult:
    build: str
    repository: str
    tag: str
    digest: str
    image_id: str
    verified: bool
    pushed: bool
    aliases: dict[str, str | None] = field(default_factory=dict)  # alias -> digest it left
    signed: lockfile.SignedRecord | None = None

    def to_json(self) -> JsonObject:
        return {
            "build": self.build,
            "repository": self.repository,
            "tag": self.tag,
            "reference": f"{self.repository}@{self.digest}",
            "digest": self.digest,
            "image_id": self.image_id,
            "verified": self.verified,
            "pushed": self.pushed,
            "aliases": {
                alias: {"from": old, "to": self.digest} for alias, old in self.aliases.items()
            },
            "signed": self.signed.to_json() if self.signed else None,
        }


def publication_record(entry: lockfile.BuildEntry, key: str) -> lockfile.PublishRecord:
    """What the lock records of ``key`` (a repository); an empty record when nothing."""
    return (entry.publish or {}).get(key) or lockfile.PublishRecord()


# --- the local image --------------------------------------------------------------------


def local_image(api: DockerClient, build: Build, image: lockfile.ImageSection) -> Image:
    """The local image with the lock's image id; refuses when the lock and store disagree."""
    image_id = str(image.image_id)
    for tag in image.tags:
        try:
            tagged = api.images.get(tag)
        except docker.errors.ImageNotFound:
            continue
        if tagged.id != image_id:
            raise LockError(
                f"{build.name}: the local image {tag} is {str(tagged.id)[:19]}, but images.lock "
                f"pins {image_id[:19]}; the lock does not describe what was built here",
                f"`sparkbuild build {build.name}` re-pins the current image (then smoke it), or "
                "restore the images.lock that matches it",
            )
    try:
        found = api.images.get(image_id)
    except docker.errors.ImageNotFound:
        raise LocalImageError(
            f"{build.name}: image {image_id[:19]} (pinned in images.lock) is not in the local "
            "docker store",
            f"`sparkbuild build --locked {build.name}` rebuilds it; if the new image id "
            "differs, it needs its own smoke run",
        ) from None
    if found.id != image_id:
        raise LockError(f"{build.name}: local image {found.id} is not the pinned {image_id}")
    arch = dockerhost.platform_arch(str(image.platform or build.image.platform))
    if found.attrs.get("Architecture") != arch:
        raise PlatformError(
            f"{build.name}: image {image_id[:19]} is {found.attrs.get('Architecture')}, not {arch}"
        )
    return found


def daemon_push(
    api: DockerClient, image: Image, destination: Destination, credentials: Credentials
) -> str | None:
    """Push through the docker daemon; the manifest digest it reports, if it reports one."""
    image.tag(destination.reference, destination.tag)
    auth = credentials.daemon_auth(destination.registry.host)
    digest: str | None = None
    errors: list[str] = []
    with console.status(f"pushing {destination.reference}:{destination.tag}"):
        stream = api.api.push(
            destination.reference, tag=destination.tag, stream=True, decode=True, auth_config=auth
        )
        for event in stream:
            if not isinstance(event, dict):
                continue
            if event.get("error"):
                errors.append(str(event["error"]))
            aux = event.get("aux")
            if isinstance(aux, dict) and aux.get("Digest"):
                digest = str(aux["Digest"])
    if errors:
        message = errors[-1]
        hint = None
        if "unauthorized" in message.lower() or "authentication required" in message.lower():
            hint = f"check the credentials for {destination.registry.host}"
        elif "http response to https client" in message.lower():
            hint = "the daemon must treat this registry as insecure (`insecure-registries`)"
        raise PublishError(
            f"push of {destination.reference}:{destination.tag} failed: {message}", hint
        )
    return digest


def _existing_tag(
    client: RegistryClient, destination: Destination, image_id: str, platform: str
) -> Manifest | None:
    """The manifest the immutable tag already serves, if it is this image; refuses if not."""
    current = client.manifest(destination.repository, destination.tag, push=True)
    if current is None:
        return None
    if not manifests.holds_image(client, destination.repository, current, image_id, platform):
        raise PublishError(
            f"{destination.reference}:{destination.tag} already exists as {current.digest} "
            f"({manifests.describe(current)}), not this build's {platform} image "
            f"{image_id[:19]}; immutable tags never move",
            "the same version and tree built into different content (an unpinned base or a "
            "non-reproducible build); find out why, or remove the tag from the registry by hand",
        )
    return current


def _verify_pushed(
    client: RegistryClient,
    destination: Destination,
    image_id: str,
    reported: str | None,
    platform: str,
) -> Manifest:
    manifest = client.manifest(destination.repository, destination.tag, push=True)
    if manifest is None:
        raise PublishError(
            f"the push reported success, but {destination.reference}:{destination.tag} is not "
            "in the registry",
            "run the same command again",
        )
    if reported and manifest.digest != reported:
        raise PublishError(
            f"{destination.reference}:{destination.tag} resolves to {manifest.digest}, but the "
            f"push reported {reported}; another writer may have replaced it",
            "nothing was recorded; check who else pushes to this repository",
        )
    if not manifests.holds_image(client, destination.repository, manifest, image_id, platform):
        raise PublishError(
            f"{destination.reference}@{manifest.digest} holds {manifests.describe(manifest)}, not "
            f"the pinned {platform} image {image_id}",
            "nothing was recorded; check who else pushes to this repository",
        )
    return manifest


def move_aliases(
    client: RegistryClient, destination: Destination, manifest: Manifest, aliases: tuple[str, ...]
) -> dict[str, str | None]:
    """Point each alias at ``manifest``; alias -> the digest it pointed at before."""
    moved: dict[str, str | None] = {}
    for alias in aliases:
        before = client.manifest_digest(destination.repository, alias, push=True)
        if before != manifest.digest:
            client.put_manifest(destination.repository, alias, manifest)
        moved[alias] = before
    return moved


def _write_publish(
    lock: lockfile.LockHandle,
    build: Build,
    destination: Destination,
    publication: lockfile.Publication,
) -> None:
    def change(entry: lockfile.BuildEntry) -> None:
        current_image = entry.image.image_id if entry.image else None
        if current_image != publication.image_id:  # re-checked under the writer lock
            raise LockError(
                f"{build.name}: images.lock's image changed while publishing; nothing recorded",
                f"run `sparkbuild publish {build.name}` again",
            )
        records = entry.publish or {}
        before = records.get(destination.reference)
        record = after_push(before, publication, destination.aliases)
        entry.publish = {**records, destination.reference: record}

    lock.change(build.name, change)
    lock.write()


def _sign(  # noqa: PLR0913 - a publication's parts, as publish_build holds them
    build: Build,
    settings: Settings,
    entry: lockfile.BuildEntry,
    destination: Destination,
    client: RegistryClient,
    manifest: Manifest,
    image: lockfile.ImageSection,
    verified: bool,
    record: lockfile.PublishRecord,
    signing: Signing | None,
    read: Future[ImageContents] | None = None,
) -> lockfile.SignedRecord | None:
    """The publication's signature and attestations, or None when it is not signed."""
    if signing is None:
        return None
    if not verified:
        console.warn(f"{build.name}: NOT SIGNED: the gates refused the image (--force)")
        return None
    before = next((h.signed for h in record.published() if h.digest == manifest.digest), None)
    if already_signed(client, destination, before, manifest.digest, signing):
        return before
    spec, project = build.spec_file.resolve(), settings.project_dir.resolve()
    spec_file = str(spec.relative_to(project)) if spec.is_relative_to(project) else spec.name
    return sign_publication(
        dockerhost.client(),
        client,
        build,
        entry,
        destination,
        manifest,
        image,
        signing,
        spec_file,
        read,
    )


def publish_build(
    build: Build,
    settings: Settings,
    destination_of: Callable[[Build, str], Destination],
    credentials: Credentials,
    *,
    force: bool = False,
    max_layer_size: int | None = None,
    lock: lockfile.LockHandle | None = None,
    signing: Signing | None = None,
) -> PublishResult:
    """Push ``build``'s pinned image to ``destination_of(build, tree)``, move its aliases, lock it.

    ``destination_of`` renders the destination once the lock's tree is known (see
    :func:`plan_destination`). ``lock`` is the command's lock handle (else one is opened):
    the gates read the build's entry from it, and the publication is its one write.
    ``signing``: sign it and attach its attestations after the push (docs/verify.md).
    """
    lock = lock or lockfile.LockHandle.open(settings.lock_file)
    entry = lock.entry(build.name) or lockfile.BuildEntry()
    image = lockfile.pinned_image(entry, build.name, settings.lock_file, "publish")
    image_id = str(image.image_id)
    destination: Destination = destination_of(build, str(image.tree))
    clusters = cluster_profiles(settings, build)
    declared = declared_checks(settings, build)
    verified = smoke_gate(entry, build, image_id, force=force, clusters=clusters, declared=declared)
    verified = preflight_gate(settings, build, image_id, force=force, entry=entry) and verified
    verdicts = smoke_verdicts(entry, build, image_id, clusters, declared)
    record = publication_record(entry, destination.reference)
    rolled_back = {h.digest for h in record.published() if h.rolled_back}
    client = RegistryClient(destination.registry, credentials)
    client.check_access(destination.repository, push=True)
    platform = str(image.platform or build.image.platform)
    manifest = _existing_tag(client, destination, image_id, platform)
    pushed = manifest is None
    read = None
    if manifest is None:
        if signing is not None and verified:  # the SBOM's contents, read while the push runs
            read = read_during_push(image_id)
        api = dockerhost.client()
        local = local_image(api, build, image)
        layers.check_layers(local, max_layer_size, f"{destination.reference}:{destination.tag}")
        reported = daemon_push(api, local, destination, credentials)
        manifest = _verify_pushed(client, destination, image_id, reported, platform)
    else:
        console.info(
            f"{build.name}: {destination.reference}:{destination.tag} is already {manifest.digest}"
        )
    if manifest.digest in rolled_back and not force:
        raise PublishError(
            f"{build.name}: {destination.reference}@{manifest.digest} was rolled back; its aliases "
            "stay where they are",
            "fix the build and publish a new image, or pass --force to move the aliases to it "
            "again",
        )
    signed = _sign(
        build,
        settings,
        entry,
        destination,
        client,
        manifest,
        image,
        verified,
        record,
        signing,
        read,
    )
    moved = move_aliases(client, destination, manifest, destination.aliases)
    publication = lockfile.Publication(
        digest=manifest.digest,
        image_id=image_id,
        tag=destination.tag,
        verified=verified,
        smoke=verdicts,
    )
    if signed is not None:
        publication.signed = signed
    _write_publish(lock, build, destination, publication)
    return PublishResult(
        build=build.name,
        repository=destination.reference,
        tag=destination.tag,
        digest=manifest.digest,
        image_id=image_id,
        verified=verified,
        pushed=pushed,
        aliases=moved,
        signed=signed,
    )
