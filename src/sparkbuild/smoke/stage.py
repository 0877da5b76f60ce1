"""The smoke stage's entry point: ``run_stage`` takes frozen ``SmokeOptions`` (how the engine
is launched, where the verdict goes, which deep checks run) and returns the ``SmokeResult``.

Everything that can fail is checked before the boot (:func:`prepare`): the profile, the
outputs, the cluster and its pin, the lock's image for ``--record``, the memory fit and the
page cache. The verdict is recorded first (it is what the run was for), then written and
shown; a verdict that is not a pass ends in ``VerdictFailedError``.
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

from packaging.version import Version

from sparkbuild import console, fileio, lockfile
from sparkbuild.adapters import EngineAdapter, adapter_for
from sparkbuild.adapters.versions import VERSION_LABEL, parse_version
from sparkbuild.engines.boot_prep import BootPrep, before_boot
from sparkbuild.engines.cluster import load_cluster
from sparkbuild.engines.cluster_target import node_pin
from sparkbuild.engines.compile_cache import CompileCache
from sparkbuild.engines.host_record import earlier_verdicts
from sparkbuild.engines.host_watch import choose_floor
from sparkbuild.engines.host_watch import prepare as prepare_hosts
from sparkbuild.engines.launch import (
    LaunchSettings,
    check_cluster_size,
    check_single_box,
    cluster_target,
    compile_cache_for,
    make_target,
    where_to_look,
)
from sparkbuild.engines.profiles import SmokeProfile, load_profile
from sparkbuild.engines.targets import Target, image_labels, local_image_id, stop_on_signals
from sparkbuild.errors import LocalImageError, UsageError, VerdictFailedError
from sparkbuild.outputs import check_writable, emit_json
from sparkbuild.settings import Settings
from sparkbuild.smoke import record as smoke_record
from sparkbuild.smoke import report
from sparkbuild.smoke.deep.plan import DeepPlan, ReferenceSource
from sparkbuild.smoke.deep.plan import reference_url as checked_reference_url
from sparkbuild.smoke.runner import SmokeResult, Watched, expecting, run_smoke

#: Makes the run's target for a profile and a log path (the reference boot makes a second).
MakeTarget = Callable[[SmokeProfile, Path | None], Target]


@dataclass(frozen=True)
class SmokeOutputs:
    """Where the verdict goes besides the table."""

    json_path: str | None = None  # '-': stdout (--json), else --json-file FILE
    record_build: str | None = None  # --record BUILD


@dataclass(frozen=True)
class SmokeOptions:
    """One smoke run, as the command line (or a caller) asked for it."""

    launch: LaunchSettings
    outputs: SmokeOutputs = SmokeOutputs()
    engine_version: str | None = None  # --engine-version (default: the image's label)
    deep: bool = False  # --deep: every deep check, not only those the profile declares
    reference_url: str | None = None  # --reference-url: lossless's reference engine


@dataclass(frozen=True)
class SmokeRun:
    """The engine to check and how, all of it checked before the boot."""

    name: str
    profile: SmokeProfile
    adapter: EngineAdapter
    make: MakeTarget
    prep: BootPrep
    deep: DeepPlan | None
    cache: CompileCache | None = None  # the compile cache the target mounts (measured)


def run_stage(settings: Settings, options: SmokeOptions) -> SmokeResult:
    """Check, boot (or reach) the engine, run the checks, then record, write and show the
    verdict; raises ``VerdictFailedError`` when it is not a pass."""
    run = prepare(settings, options)
    launch = options.launch
    target = run.make(run.profile, launch.log_path or default_log_path(settings, run.name))
    floor = choose_floor(launch.memory_floor, run.profile.expect.memory_floor, run.prep.spark)
    host = prepare_hosts(target, floor, allow_drift=launch.allow_host_drift)
    with stop_on_signals(), console.activity(f"smoke {run.name}: starting {target.kind}") as now:
        result = run_smoke(
            target,
            run.adapter,
            run.profile,
            run.name,
            progress=now.stage,
            waiting=now.detail,
            deep=run.deep,
            watched=Watched(run.cache, host),
        )
    result = dataclasses.replace(result, before_boot=run.prep.to_json())
    if (options.outputs.record_build or launch.choice.key) and result.host and result.host.nodes:
        lock = lockfile.load(settings.lock_file)  # the image's verdicts, held against this host
        for line in earlier_verdicts(lock, result.image_id, result.host.nodes[0]):
            console.warn(line)
    finish(settings, result, run.name, options.outputs)
    return result


def default_log_path(settings: Settings, profile: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    relative = f".sparkbuild/smoke-logs/{profile}-{stamp}.log"
    return fileio.project_output(settings.project_dir, relative, "--log FILE")


def prepare(settings: Settings, options: SmokeOptions) -> SmokeRun:
    """The profile (with smoke's overrides), adapter, target maker, the compile cache it
    mounts (the run measures it) and deep plan; everything
    that can fail is checked here, before a long boot (the memory fit and the page cache too:
    lossless's reference boot runs after the engine under test is stopped, so one fit holds
    for both)."""
    launch, outputs = options.launch, options.outputs
    choice = launch.choice
    choice.kind()
    if launch.profile is None:
        raise UsageError("smoke needs --profile (engine, model and serve flags)")
    name, profile = load_profile(
        settings, launch.profile, model=launch.model, need_model=choice.url is None
    )
    profile = expecting(profile, launch)
    check_writable(outputs.json_path, "--json")  # fail before a long boot, not after it
    check_writable(launch.log_path, "--log")
    cluster = load_cluster(settings, choice.cluster) if choice.cluster else None
    if cluster is not None:  # before any node is asked anything
        check_cluster_size(profile, len(cluster[1].nodes), cluster[0])
    pin = node_pin(cluster[1], choice.image) if cluster and choice.image else None
    if outputs.record_build:
        tested_id = pin or (local_image_id(choice.image) if choice.image else None)
        if pin and cluster and cluster[1].kubernetes is not None:
            tested_id = lockfile.digest_image_id(settings.lock_file, outputs.record_build, pin)
        lockfile.check_pinned_image(
            settings.lock_file, outputs.record_build, tested_id, "smoke run"
        )
    adapter = adapter_for(
        profile.engine,
        version=engine_version(options.engine_version, choice.image, cluster is not None),
        request_timeout_s=profile.expect.request_timeout_s,
    )
    if cluster is None:
        check_single_box(profile, name)
    prep = before_boot(name, profile, launch, adapter.version, cluster)
    if cluster is not None:
        assert pin is not None
        spec = cluster

        def on_cluster(served: SmokeProfile, logs: Path | None) -> Target:
            return cluster_target(choice, served, adapter, logs, "smoke", spec, pin)

        make: MakeTarget = on_cluster
        cache = None
    else:
        cache = compile_cache_for(launch, settings.cache_dir)

        def on_one_box(served: SmokeProfile, logs: Path | None) -> Target:
            logs = None if choice.url else logs
            return make_target(choice, served, adapter, logs, stage="smoke", compile_cache=cache)

        make = on_one_box
    deep = deep_plan(settings, options, profile, make, name)
    return SmokeRun(name, profile, adapter, make, prep, deep, cache)


def deep_plan(
    settings: Settings,
    options: SmokeOptions,
    profile: SmokeProfile,
    make: MakeTarget,
    name: str,
) -> DeepPlan | None:
    """The deep checks to run (``--deep``: all), and how lossless gets its reference: a
    second target like the first with the adapter's flags without speculation."""
    launch = options.launch
    reference_url = options.reference_url
    if reference_url is not None:
        reference_url = checked_reference_url(reference_url)
    boot = None
    if launch.choice.url is None:
        log = launch.log_path or default_log_path(settings, name)
        reference_log = log.with_name(f"{log.stem}-reference{log.suffix}")

        def boot(args: Sequence[str]) -> Target:
            return make(profile.model_copy(update={"args": list(args)}), reference_log)

    store = settings.project_dir / ".sparkbuild" / "smoke-references"
    source = ReferenceSource(boot=boot, url=reference_url, store=store)
    return DeepPlan.of(profile.expect, options.deep, source)


def finish(settings: Settings, result: SmokeResult, name: str, outputs: SmokeOutputs) -> None:
    """Record, write and show the verdict; a failed verdict ends in an error (exit 1)."""
    json_path, record_build = outputs.json_path, outputs.record_build
    if record_build:  # first: the verdict is what the run was for; outputs come after
        _record(settings, result, name, record_build)
    if json_path:
        emit_json(result.to_json(), json_path)
    if json_path != "-":
        report.render(result, console.out)
    if result.verdict != "pass":
        failed = [c.name for c in result.checks if c.status == "fail"]
        first = (
            "the diagnosis above names the remedy"
            if result.diagnoses
            else "the checks above say what was wrong"
        )
        raise VerdictFailedError(
            f"smoke {name}: {result.verdict}" + (f" ({', '.join(failed)})" if failed else ""),
            f"{first}; {where_to_look(result.target_kind, result.log_file)}",
        )


def _record(settings: Settings, result: SmokeResult, name: str, build: str) -> None:
    image_id = smoke_record.record(settings.lock_file, build, result)
    console.info(f"recorded {result.verdict} for {build} ({image_id[:19]}) / {name}")
    if not result.verified and result.target_kind == "cluster":
        console.warn(
            f"recorded as unverified: not every node ran {image_id[:19]} (see the nodes "
            f"above), so `sparkbuild publish {build}` does not count it"
        )
    elif not result.verified:
        console.warn(
            f"recorded as unverified: a {result.target_kind} run does not show which image "
            f"ran, so `sparkbuild publish {build}` does not count it; "
            f"`sparkbuild smoke --image IMAGE --profile {name} --record {build}` does"
        )


def engine_version(given: str | None, image: str | None, remote: bool = False) -> Version | None:
    """``--engine-version``, else the image's OCI version label (sparkbuild images carry it;
    a cluster's image may be on its nodes only, then the label is not read here)."""
    if given is not None:
        version = parse_version(given)
        if version is None:
            raise UsageError(f"--engine-version {given!r} is not a version such as 0.5.12")
        return version
    if image is None:
        return None
    try:
        return parse_version(image_labels(image).get(VERSION_LABEL))
    except LocalImageError:
        if remote:
            return None
        raise
