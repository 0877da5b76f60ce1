"""Rolling a publication back: re-point the aliases at an earlier passing digest (a manifest
PUT; no layer moves, the digest stays exact), walking the lock's publication history."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sparkbuild import console
from sparkbuild import lock as lockfile
from sparkbuild.errors import LockError, SparkbuildError, UsageError
from sparkbuild.publish.credentials import Credentials
from sparkbuild.publish.destination import Destination
from sparkbuild.publish.push import SECTION, history_of, move_aliases
from sparkbuild.publish.registry import Registry, RegistryClient
from sparkbuild.settings import Settings
from sparkbuild.spec import Build


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
    history = history_of(record)
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
    destination = Destination(registry, path, str(chosen.get("tag")), aliases)
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
    move_aliases(client, destination, manifest, aliases)

    def mutate(data: lockfile.LockData) -> None:
        entry = data["builds"][build.name][SECTION][repository_key]
        history = history_of(entry)
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
