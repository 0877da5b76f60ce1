"""What must hold before an image is published: the lock pins it, and every profile the
build lists has a verified passing smoke verdict for that exact image id. A profile that
declares ``parallel.nodes > 1`` counts only a cluster verdict whose every node ran that id."""

from __future__ import annotations

from collections.abc import Collection, Mapping, Sequence

from sparkbuild import console, lockfile
from sparkbuild.errors import GateClosedError, SparkbuildError
from sparkbuild.settings import Settings
from sparkbuild.spec import Build


def _counted_verdict(
    result: lockfile.SmokeRecord | None,
    image_id: str,
    cluster: bool = False,
    declared: Sequence[str] = (),
) -> str:
    """'pass' only for a verified run of ``image_id`` (on a cluster profile: a run on its
    cluster with every node on that id) that passed every deep check the profile declares;
    otherwise what the record says."""
    if result is None or not result.verdict:
        return "missing"
    if result.verdict != "pass":
        return result.verdict
    unproven = [check for check in declared if result.checks.get(check) != "pass"]
    if unproven:
        shown = ", ".join(f"{c} {result.checks.get(c, 'not run')}" for c in unproven)
        return f"pass without the declared deep checks ({shown})"
    if not result.image_verified(image_id):
        return f"unverified pass ({result.target or 'unknown target'})"
    if (cluster or result.nodes) and not result.every_node_ran(image_id):
        why = "not a cluster run" if not result.nodes else "a node ran another image"
        return f"unverified pass ({why})"
    return result.verdict


def cluster_profiles(settings: Settings, build: Build) -> frozenset[str]:
    """The build's profiles that declare more than one node (a profile that does not load
    is none: the smoke run of it fails on its own)."""
    from sparkbuild.engines.profiles import load_profile

    found = set()
    for name in build.smoke_profiles:
        try:
            _, profile = load_profile(settings, name, need_model=False)
        except SparkbuildError:
            continue
        if profile.parallel.nodes > 1:
            found.add(name)
    return frozenset(found)


def declared_checks(settings: Settings, build: Build) -> dict[str, tuple[str, ...]]:
    """The deep checks each of the build's profiles declares (``expect.lossless``, ...):
    publish counts a pass only with each of them passed."""
    from sparkbuild.engines.profiles import load_profile

    found = {}
    for name in build.smoke_profiles:
        try:
            _, profile = load_profile(settings, name, need_model=False)
        except SparkbuildError:
            continue
        if profile.expect.declared_deep():
            found[name] = profile.expect.declared_deep()
    return found


def smoke_verdicts(
    entry: lockfile.BuildEntry | None,
    build: Build,
    image_id: str,
    clusters: Collection[str] = (),
    declared: Mapping[str, Sequence[str]] | None = None,
) -> dict[str, str]:
    """profile -> verdict for every profile the build lists: 'pass' (a verified run of this
    image), 'fail', 'missing', 'unverified pass (WHY)' (a command or URL run, or a cluster
    profile without a run whose every node ran this image), or 'pass without the declared
    deep checks (...)'. ``clusters``: the profiles that declare more than one node;
    ``declared``: the deep checks each profile declares."""
    recorded = ((entry.smoke if entry else None) or {}).get(image_id) or {}
    demands = declared or {}
    return {
        p: _counted_verdict(recorded.get(p), image_id, p in clusters, demands.get(p, ()))
        for p in build.smoke_profiles
    }


def smoke_gate(
    entry: lockfile.BuildEntry | None,
    build: Build,
    image_id: str,
    *,
    force: bool,
    clusters: Collection[str] = (),
    declared: Mapping[str, Sequence[str]] | None = None,
) -> bool:
    """Whether the image passed every profile; refuses (or with ``force`` warns) otherwise."""
    short = image_id[:19]
    if not build.smoke_profiles:
        problem = (
            f"{build.name}: the build lists no smoke profiles (`smoke:` in "
            f"{build.spec_file.name}), so nothing proves image {short} works"
        )
        hint = f"add `smoke: [PROFILE]` to build '{build.name}' and record a run"
    else:
        verdicts = smoke_verdicts(entry, build, image_id, clusters, declared)
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
        raise GateClosedError(problem, hint + "; --force publishes anyway, recorded unverified")
    console.warn(f"{problem}\n--force: PUBLISHING AN UNVERIFIED IMAGE; the lock records it as such")
    return False
