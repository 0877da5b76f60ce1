"""Rolling a publication back: re-point the aliases at an earlier passing digest (a manifest
PUT; no layer moves, the digest stays exact), walking the lock's publication history."""

from __future__ import annotations

from dataclasses import dataclass, field

from sparkbuild import console, lockfile
from sparkbuild.attest.keys import PUBLIC_KEY_ENV, PublicKey
from sparkbuild.attest.verify import require_signature
from sparkbuild.errors import LockError, RollbackError, SignatureError, UsageError
from sparkbuild.jsontext import JSON, Fields
from sparkbuild.publish.destination import Destination
from sparkbuild.publish.push import move_aliases
from sparkbuild.registry.address import Registry
from sparkbuild.registry.client import RegistryClient
from sparkbuild.registry.credentials import Credentials
from sparkbuild.settings import Settings
from sparkbuild.spec import Build


@dataclass(frozen=True)
class RollbackResult(Fields):
    build: str
    repository: str
    from_digest: str = field(metadata={JSON: "from"})
    to_digest: str = field(metadata={JSON: "to"})
    aliases: list[str]


def published_repositories(entry: lockfile.BuildEntry | None) -> dict[str, lockfile.PublishRecord]:
    records = (entry.publish if entry else None) or {}
    return {key: record for key, record in records.items() if record.digest}


def choose_repository(
    entry: lockfile.BuildEntry | None,
    build: Build,
    registry: Registry | None,
    repository: str | None,
) -> str:
    """The published repository (``HOST/PATH``) a rollback acts on."""
    known = published_repositories(entry)
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
    build: Build, key: str, record: lockfile.PublishRecord, to_digest: str | None, force: bool
) -> lockfile.Publication:
    history = record.published()
    current = str(record.digest)
    if to_digest is not None:
        match = [h for h in history if h.digest == to_digest]
        if not match:
            listed = "\n  ".join(f"{h.digest} ({h.tag})" for h in history)
            raise UsageError(
                f"{build.name}: {to_digest} is not in the publication history of {key}",
                f"published digests:\n  {listed}",
            )
        chosen = match[-1]
        if not chosen.verified and not force:
            raise RollbackError(
                f"{build.name}: {to_digest} was published without a passing smoke verdict",
                "pass --force to move the aliases to it anyway",
            )
        return chosen
    position = max((i for i, h in enumerate(history) if h.digest == current), default=len(history))
    for earlier in reversed(history[:position]):
        if earlier.digest != current and earlier.verified and not earlier.rolled_back:
            return earlier
    raise RollbackError(
        f"{build.name}: {key} has no earlier published digest that passed smoke (current: "
        f"{current})",
        "images.lock's publish history is the record; `git log -p images.lock` shows older "
        "ones, which `--to DIGEST` accepts once they are in the history",
    )


def _check_signed(
    client: RegistryClient,
    repository: str,
    digest: str,
    chosen: lockfile.Publication,
    public: PublicKey | None,
    what: str,
) -> None:
    """With a key, the aliases move only to a digest it signed; without one, a digest that
    was published signed is not moved to unchecked."""
    if public is not None:
        require_signature(client, repository, digest, public, what)
    elif chosen.signed is not None:
        raise SignatureError(
            f"{what} was published signed, and no public key is configured to check it",
            f"pass --key PUB (or set {PUBLIC_KEY_ENV}, or commit the project's cosign.pub)",
        )


def rollback_build(
    build: Build,
    settings: Settings,
    repository_key: str,
    credentials: Credentials,
    *,
    to_digest: str | None = None,
    force: bool = False,
    lock: lockfile.LockHandle | None = None,
    public: PublicKey | None = None,
) -> RollbackResult:
    """Move the aliases of ``repository_key`` back to an earlier passing digest.

    ``lock`` is the command's lock handle (else one is opened); the new state is its one
    write. ``public``: the project's key; the aliases move only to a digest it signed."""
    lock = lock or lockfile.LockHandle.open(settings.lock_file)
    record = published_repositories(lock.entry(build.name))[repository_key]
    aliases = tuple(record.aliases)
    if not aliases:
        raise RollbackError(
            f"{build.name}: {repository_key} was published without aliases; nothing to move",
            "users pull the immutable tags; point them at the digest you want",
        )
    chosen = _rollback_choice(build, repository_key, record, to_digest, force)
    current = str(record.digest)
    host, _, path = repository_key.partition("/")
    registry = Registry.parse(host)
    destination = Destination(registry, path, str(chosen.tag), aliases)
    client = RegistryClient(registry, credentials)
    client.check_access(path, push=True)
    manifest = client.manifest(path, str(chosen.digest), push=True)
    if manifest is None:
        raise RollbackError(
            f"{repository_key}@{chosen.digest} is gone from the registry",
            "pick another digest with --to, or publish again",
        )
    what = f"{build.name}: {repository_key}@{manifest.digest}"
    _check_signed(client, path, manifest.digest, chosen, public, what)
    for alias in aliases:
        now = client.manifest_digest(path, alias, push=True)
        if now not in (current, manifest.digest):
            console.warn(f"{repository_key}:{alias} pointed at {now}, not the recorded {current}")
    move_aliases(client, destination, manifest, aliases)

    def change(entry: lockfile.BuildEntry) -> None:
        now = (entry.publish or {}).get(repository_key)
        if now is None:  # re-checked under the writer lock
            raise LockError(
                f"{build.name}: images.lock's record of {repository_key} went away while "
                "rolling back; nothing recorded",
                f"restore images.lock and run `sparkbuild rollback {build.name}` again",
            )
        history = now.published()
        order = {item.digest: index for index, item in enumerate(history)}
        backwards = order.get(manifest.digest, -1) < order.get(current, -1)
        for item in history:
            # Only a step back marks the digest left behind; moving forward (--to) does not.
            if item.digest == current and backwards:
                item.rolled_back = True
            if item.digest == manifest.digest:
                item.unset("rolled_back")
        now.digest = manifest.digest
        now.image_id = chosen.image_id
        now.tag = chosen.tag
        now.verified = bool(chosen.verified)

    lock.change(build.name, change)
    lock.write()
    return RollbackResult(build.name, repository_key, current, manifest.digest, list(aliases))
