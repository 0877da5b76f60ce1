"""The publication stage: push a smoke-tested image by digest, move aliases, roll them back.

``publish_build`` pushes the image images.lock pins (its image id) only when the lock records
a passing smoke verdict for that image under every profile the build lists. It gets an
immutable tag ``{version}-sm121-{tree12}`` that never moves, plus moving aliases. The pushed
manifest digest goes into ``builds.<name>.publish`` with a history, which ``rollback_build``
walks back to re-point the aliases at the previous passing digest (a manifest PUT: no layer
moves, the digest stays exact). The lock is written last, so an interrupted run leaves it as it
was and running the command again completes the job.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import docker.errors

from sparkbuild import console, dockerhost, imageref
from sparkbuild import lock as lockfile
from sparkbuild.errors import LockError, SparkbuildError, UsageError
from sparkbuild.preflight.gate import preflight_gate
from sparkbuild.publish import layers, manifests
from sparkbuild.publish.credentials import Credentials
from sparkbuild.publish.registry import Manifest, Registry, RegistryClient
from sparkbuild.settings import Settings
from sparkbuild.spec import Build

SECTION = "publish"
DEFAULT_REPOSITORY = "sparkbuild/{engine}"
DEFAULT_ALIASES = ("{version}-sm121",)
IMMUTABLE_TAG = "{version}-sm121-{tree_short}"


@dataclass(frozen=True)
class Target:
    """One build's destination: ``registry`` + repository path, immutable tag, aliases."""

    registry: Registry
    repository: str
    tag: str
    aliases: tuple[str, ...]

    @property
    def reference(self) -> str:
        return self.registry.reference(self.repository)


@dataclass
class PublishResult:
    build: str
    repository: str
    tag: str
    digest: str
    image_id: str
    verified: bool
    pushed: bool
    aliases: dict[str, str | None] = field(default_factory=dict)  # alias -> digest it left

    def to_json(self) -> dict[str, Any]:
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
        }


@dataclass
class RollbackResult:
    build: str
    repository: str
    from_digest: str
    to_digest: str
    aliases: list[str]

    def to_json(self) -> dict[str, Any]:
        return {
            "build": self.build,
            "repository": self.repository,
            "from": self.from_digest,
            "to": self.to_digest,
            "aliases": self.aliases,
        }


# --- names ------------------------------------------------------------------------------


def _render(template: str, build: Build, tree: str, what: str) -> str:
    try:
        return imageref.render(template, build, tree)
    except imageref.UnknownPlaceholderError as exc:
        raise UsageError(
            f"{what} '{template}' uses an unknown placeholder ({exc})", imageref.placeholder_hint()
        ) from None


def plan_target(
    build: Build,
    tree: str,
    registry: Registry,
    *,
    repository: str = DEFAULT_REPOSITORY,
    aliases: tuple[str, ...] = DEFAULT_ALIASES,
) -> Target:
    tag = _render(IMMUTABLE_TAG, build, tree, "tag")
    rendered = tuple(dict.fromkeys(_render(a, build, tree, "--alias") for a in aliases))
    for name in (tag, *rendered):
        if not imageref.TAG.match(name):
            raise UsageError(f"'{name}' is not a valid tag (letters, digits, '_', '.', '-')")
    if tag in rendered:
        raise UsageError(f"--alias {tag} is the immutable tag; aliases must differ from it")
    path = registry.repository(_render(repository, build, tree, "--repository"))
    return Target(registry, path, tag, rendered)


# --- the lock's view --------------------------------------------------------------------


def pinned_image(settings: Settings, build: Build) -> dict[str, Any]:
    entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name) or {}
    image = entry.get("image")
    if not isinstance(image, dict) or not image.get("image_id") or not image.get("tree"):
        raise LockError(
            f"{build.name}: {settings.lock_file.name} pins no image for it; nothing to publish",
            f"`sparkbuild build {build.name}`, then smoke it with "
            f"`sparkbuild smoke --image IMAGE --profile P --record {build.name}`",
        )
    return image


def _counted_verdict(result: Any, image_id: str) -> str:
    """'pass' only for a verified run of ``image_id``; otherwise what the record says."""
    verdict = result.get("verdict") if isinstance(result, dict) else None
    if not verdict:
        return "missing"
    if verdict == "pass" and not (
        result.get("verified") is True and result.get("image_id") == image_id
    ):
        return f"unverified pass ({result.get('target') or 'unknown target'})"
    return str(verdict)


def smoke_verdicts(settings: Settings, build: Build, image_id: str) -> dict[str, str]:
    """profile -> verdict for every profile the build lists: 'pass' (a verified run of this
    image), 'fail', 'missing', or 'unverified pass (TARGET)' (a command or URL run)."""
    entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name) or {}
    section = entry.get("smoke")
    recorded = section.get(image_id) if isinstance(section, dict) else None
    recorded = recorded if isinstance(recorded, dict) else {}
    return {p: _counted_verdict(recorded.get(p), image_id) for p in build.smoke_profiles}


def smoke_gate(settings: Settings, build: Build, image_id: str, *, force: bool) -> bool:
    """Whether the image passed every profile; refuses (or with ``force`` warns) otherwise."""
    short = image_id[:19]
    if not build.smoke_profiles:
        problem = (
            f"{build.name}: the build lists no smoke profiles (`smoke:` in "
            f"{build.spec_file.name}), so nothing proves image {short} works"
        )
        hint = f"add `smoke: [PROFILE]` to build '{build.name}' and record a run"
    else:
        verdicts = smoke_verdicts(settings, build, image_id)
        failing = {p: v for p, v in verdicts.items() if v != "pass"}
        if not failing:
            return True
        listed = ", ".join(f"{p}: {v}" for p, v in failing.items())
        problem = f"{build.name}: image {short} has no passing smoke verdict ({listed})"
        profile = next(iter(failing))
        hint = (
            f"`sparkbuild smoke --image IMAGE --profile {profile} --record {build.name}` "
            "records one (command and URL runs are recorded unverified and do not count)"
        )
    if not force:
        raise SparkbuildError(problem, hint + "; --force publishes anyway, recorded unverified")
    console.warn(f"{problem}\n--force: PUBLISHING AN UNVERIFIED IMAGE; the lock records it as such")
    return False


def _record(settings: Settings, build: Build, key: str) -> dict[str, Any]:
    entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name) or {}
    section = entry.get(SECTION)
    record = section.get(key) if isinstance(section, dict) else None
    return record if isinstance(record, dict) else {}


def _history(record: dict[str, Any]) -> list[dict[str, Any]]:
    return [h for h in record.get("history", []) if isinstance(h, dict) and h.get("digest")]


# --- the local image --------------------------------------------------------------------


def local_image(api: Any, build: Build, image: dict[str, Any]) -> Any:
    """The local image with the lock's image id; refuses when the lock and store disagree."""
    image_id = str(image["image_id"])
    for tag in image.get("tags") or []:
        try:
            tagged = api.images.get(tag)
        except docker.errors.ImageNotFound:
            continue
        if tagged.id != image_id:
            raise LockError(
                f"{build.name}: the local image {tag} is {tagged.id[:19]}, but images.lock pins "
                f"{image_id[:19]}; the lock does not describe what was built here",
                f"`sparkbuild build {build.name}` re-pins the current image (then smoke it), or "
                "restore the images.lock that matches it",
            )
    try:
        found = api.images.get(image_id)
    except docker.errors.ImageNotFound:
        raise SparkbuildError(
            f"{build.name}: image {image_id[:19]} (pinned in images.lock) is not in the local "
            "docker store",
            f"`sparkbuild build --locked {build.name}` rebuilds it; if the new image id "
            "differs, it needs its own smoke run",
        ) from None
    if found.id != image_id:
        raise LockError(f"{build.name}: local image {found.id} is not the pinned {image_id}")
    arch = dockerhost.platform_arch(str(image.get("platform") or build.image.platform))
    if found.attrs.get("Architecture") != arch:
        raise SparkbuildError(
            f"{build.name}: image {image_id[:19]} is {found.attrs.get('Architecture')}, not {arch}"
        )
    return found


def daemon_push(api: Any, image: Any, target: Target, credentials: Credentials) -> str | None:
    """Push through the docker daemon; the manifest digest it reports, if it reports one."""
    image.tag(target.reference, target.tag)
    auth = credentials.daemon_auth(target.registry.host)
    digest: str | None = None
    errors: list[str] = []
    with console.status(f"pushing {target.reference}:{target.tag}"):
        stream = api.api.push(
            target.reference, tag=target.tag, stream=True, decode=True, auth_config=auth
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
            hint = f"check the credentials for {target.registry.host}"
        elif "http response to https client" in message.lower():
            hint = "the daemon must treat this registry as insecure (`insecure-registries`)"
        raise SparkbuildError(f"push of {target.reference}:{target.tag} failed: {message}", hint)
    return digest


# --- publish ----------------------------------------------------------------------------


def _existing_tag(
    client: RegistryClient, target: Target, image_id: str, platform: str
) -> Manifest | None:
    """The manifest the immutable tag already serves, if it is this image; refuses if not."""
    current = client.manifest(target.repository, target.tag, push=True)
    if current is None:
        return None
    if not manifests.holds_image(client, target.repository, current, image_id, platform):
        raise SparkbuildError(
            f"{target.reference}:{target.tag} already exists as {current.digest} "
            f"({manifests.describe(current)}), not this build's {platform} image "
            f"{image_id[:19]}; immutable tags never move",
            "the same version and tree built into different content (an unpinned base or a "
            "non-reproducible build); find out why, or remove the tag from the registry by hand",
        )
    return current


def _verify_pushed(
    client: RegistryClient, target: Target, image_id: str, reported: str | None, platform: str
) -> Manifest:
    manifest = client.manifest(target.repository, target.tag, push=True)
    if manifest is None:
        raise SparkbuildError(
            f"the push reported success, but {target.reference}:{target.tag} is not in the "
            "registry",
            "run the same command again",
        )
    if reported and manifest.digest != reported:
        raise SparkbuildError(
            f"{target.reference}:{target.tag} resolves to {manifest.digest}, but the push "
            f"reported {reported}; another writer may have replaced it",
            "nothing was recorded; check who else pushes to this repository",
        )
    if not manifests.holds_image(client, target.repository, manifest, image_id, platform):
        raise SparkbuildError(
            f"{target.reference}@{manifest.digest} holds {manifests.describe(manifest)}, not "
            f"the pinned {platform} image {image_id}",
            "nothing was recorded; check who else pushes to this repository",
        )
    return manifest


def move_aliases(
    client: RegistryClient, target: Target, manifest: Manifest, aliases: tuple[str, ...]
) -> dict[str, str | None]:
    """Point each alias at ``manifest``; alias -> the digest it pointed at before."""
    moved: dict[str, str | None] = {}
    for alias in aliases:
        before = client.manifest_digest(target.repository, alias, push=True)
        if before != manifest.digest:
            client.put_manifest(target.repository, alias, manifest)
        moved[alias] = before
    return moved


def _history_entry(
    manifest: Manifest, image_id: str, tag: str, verified: bool, verdicts: dict[str, str]
) -> dict[str, Any]:
    return {
        "digest": manifest.digest,
        "image_id": image_id,
        "tag": tag,
        "verified": verified,
        "smoke": verdicts,
    }


def _write_publish(
    settings: Settings,
    build: Build,
    target: Target,
    entry: dict[str, Any],
) -> None:
    def mutate(data: lockfile.LockData) -> None:
        build_entry = data["builds"].setdefault(build.name, {})
        current_image = (build_entry.get("image") or {}).get("image_id")
        if current_image != entry["image_id"]:  # re-checked under the writer lock
            raise LockError(
                f"{build.name}: images.lock's image changed while publishing; nothing recorded",
                f"run `sparkbuild publish {build.name}` again",
            )
        section = build_entry.setdefault(SECTION, {})
        record = section.setdefault(target.reference, {})
        history = [h for h in _history(record) if h["digest"] != entry["digest"]]
        record.update(
            {
                "tag": entry["tag"],
                "digest": entry["digest"],
                "image_id": entry["image_id"],
                "verified": entry["verified"],
                "aliases": list(target.aliases),
                "history": [*history, entry],
            }
        )

    lockfile.update(settings.lock_file, mutate)


def publish_build(
    build: Build,
    settings: Settings,
    target_of: Any,
    credentials: Credentials,
    *,
    force: bool = False,
    max_layer_size: int | None = None,
) -> PublishResult:
    """Push ``build``'s pinned image to ``target_of(build, tree)``, move its aliases, lock it.

    ``target_of`` renders the destination once the lock's tree is known (see
    :func:`plan_target`).
    """
    image = pinned_image(settings, build)
    image_id = str(image["image_id"])
    target: Target = target_of(build, str(image["tree"]))
    verified = smoke_gate(settings, build, image_id, force=force)
    verified = preflight_gate(settings, build, image_id, force=force) and verified
    verdicts = smoke_verdicts(settings, build, image_id)
    record = _record(settings, build, target.reference)
    rolled_back = {h["digest"] for h in _history(record) if h.get("rolled_back")}
    client = RegistryClient(target.registry, credentials)
    client.check_access(target.repository, push=True)
    platform = str(image.get("platform") or build.image.platform)
    manifest = _existing_tag(client, target, image_id, platform)
    pushed = manifest is None
    if manifest is None:
        api = dockerhost.client()
        local = local_image(api, build, image)
        layers.check_layers(local, max_layer_size, f"{target.reference}:{target.tag}")
        reported = daemon_push(api, local, target, credentials)
        manifest = _verify_pushed(client, target, image_id, reported, platform)
    else:
        console.info(f"{build.name}: {target.reference}:{target.tag} is already {manifest.digest}")
    if manifest.digest in rolled_back and not force:
        raise SparkbuildError(
            f"{build.name}: {target.reference}@{manifest.digest} was rolled back; its aliases "
            "stay where they are",
            "fix the build and publish a new image, or pass --force to move the aliases to it "
            "again",
        )
    moved = move_aliases(client, target, manifest, target.aliases)
    entry = _history_entry(manifest, image_id, target.tag, verified, verdicts)
    _write_publish(settings, build, target, entry)
    return PublishResult(
        build=build.name,
        repository=target.reference,
        tag=target.tag,
        digest=manifest.digest,
        image_id=image_id,
        verified=verified,
        pushed=pushed,
        aliases=moved,
    )


# --- rollback ---------------------------------------------------------------------------


def published_repositories(settings: Settings, build: Build) -> dict[str, dict[str, Any]]:
    entry = lockfile.build_entry(lockfile.load(settings.lock_file), build.name) or {}
    section = entry.get(SECTION)
    if not isinstance(section, dict):
        return {}
    return {str(k): v for k, v in section.items() if isinstance(v, dict) and v.get("digest")}


def choose_repository(
    settings: Settings, build: Build, registry: Registry | None, repository: str | None
) -> str:
    """The published repository (``HOST/PATH``) a rollback acts on."""
    known = published_repositories(settings, build)
    if not known:
        raise LockError(
            f"{build.name}: images.lock records no publication of it; nothing to roll back",
            f"`sparkbuild publish {build.name} --registry REG` publishes it",
        )
    candidates = list(known)
    if registry is not None:
        prefix = registry.reference(registry.namespace) if registry.namespace else registry.host
        candidates = [k for k in candidates if k == prefix or k.startswith(prefix + "/")]
    if repository is not None and registry is not None:
        wanted = registry.reference(registry.repository(repository))
        candidates = [k for k in candidates if k == wanted]
    if len(candidates) == 1:
        return candidates[0]
    listed = ", ".join(sorted(known))
    if not candidates:
        raise UsageError(f"{build.name} was never published there; it was published to: {listed}")
    raise UsageError(
        f"{build.name} was published to several repositories: {listed}",
        "name one with --registry (and --repository)",
    )


def _rollback_choice(
    build: Build, key: str, record: dict[str, Any], to_digest: str | None, force: bool
) -> dict[str, Any]:
    history = _history(record)
    current = str(record["digest"])
    if to_digest is not None:
        match = [h for h in history if h["digest"] == to_digest]
        if not match:
            listed = "\n  ".join(f"{h['digest']} ({h.get('tag')})" for h in history)
            raise UsageError(
                f"{build.name}: {to_digest} is not in the publication history of {key}",
                f"published digests:\n  {listed}",
            )
        chosen = match[-1]
        if not chosen.get("verified") and not force:
            raise SparkbuildError(
                f"{build.name}: {to_digest} was published without a passing smoke verdict",
                "pass --force to move the aliases to it anyway",
            )
        return chosen
    position = max(
        (i for i, h in enumerate(history) if h["digest"] == current), default=len(history)
    )
    for earlier in reversed(history[:position]):
        if (
            earlier["digest"] != current
            and earlier.get("verified")
            and not earlier.get("rolled_back")
        ):
            return dict(earlier)
    raise SparkbuildError(
        f"{build.name}: {key} has no earlier published digest that passed smoke (current: "
        f"{current})",
        "images.lock's publish history is the record; `git log -p images.lock` shows older "
        "ones, which `--to DIGEST` accepts once they are in the history",
    )


def rollback_build(
    build: Build,
    settings: Settings,
    repository_key: str,
    credentials: Credentials,
    *,
    to_digest: str | None = None,
    force: bool = False,
) -> RollbackResult:
    """Move the aliases of ``repository_key`` back to an earlier passing digest."""
    record = published_repositories(settings, build)[repository_key]
    aliases = tuple(str(a) for a in record.get("aliases") or [])
    if not aliases:
        raise SparkbuildError(
            f"{build.name}: {repository_key} was published without aliases; nothing to move",
            "users pull the immutable tags; point them at the digest you want",
        )
    chosen = _rollback_choice(build, repository_key, record, to_digest, force)
    current = str(record["digest"])
    host, _, path = repository_key.partition("/")
    registry = Registry.parse(host)
    target = Target(registry, path, str(chosen.get("tag")), aliases)
    client = RegistryClient(registry, credentials)
    client.check_access(path, push=True)
    manifest = client.manifest(path, str(chosen["digest"]), push=True)
    if manifest is None:
        raise SparkbuildError(
            f"{repository_key}@{chosen['digest']} is gone from the registry",
            "pick another digest with --to, or publish again",
        )
    for alias in aliases:
        now = client.manifest_digest(path, alias, push=True)
        if now not in (current, manifest.digest):
            console.warn(f"{repository_key}:{alias} pointed at {now}, not the recorded {current}")
    move_aliases(client, target, manifest, aliases)

    def mutate(data: lockfile.LockData) -> None:
        entry = data["builds"][build.name][SECTION][repository_key]
        history = _history(entry)
        order = {item["digest"]: index for index, item in enumerate(history)}
        backwards = order.get(manifest.digest, -1) < order.get(current, -1)
        for item in history:
            # Only a step back marks the digest left behind; moving forward (--to) does not.
            if item["digest"] == current and backwards:
                item["rolled_back"] = True
            if item["digest"] == manifest.digest:
                item.pop("rolled_back", None)
        entry.update(
            {
                "digest": manifest.digest,
                "image_id": chosen.get("image_id"),
                "tag": chosen.get("tag"),
                "verified": bool(chosen.get("verified")),
            }
        )

    lockfile.update(settings.lock_file, mutate)
    return RollbackResult(build.name, repository_key, current, manifest.digest, list(aliases))


__all__ = [
    "DEFAULT_ALIASES",
    "DEFAULT_REPOSITORY",
    "PublishResult",
    "RollbackResult",
    "Target",
    "choose_repository",
    "plan_target",
    "publish_build",
    "rollback_build",
]
