"""``sparkbuild smoke``: boot an engine from an image, a command or a URL and check it."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import click
from packaging.version import Version

from sparkbuild import console, fileio, lockfile
from sparkbuild.adapters import EngineAdapter, adapter_for
from sparkbuild.adapters.versions import VERSION_LABEL, parse_version
from sparkbuild.cli import check_writable, emit_json, options
from sparkbuild.cli.cluster import write_manifest
from sparkbuild.engines.boot_prep import BootPrep, before_boot
from sparkbuild.engines.cluster import load_cluster
from sparkbuild.engines.cluster_target import node_pin
from sparkbuild.engines.compile_cache import CompileCache
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
from sparkbuild.settings import Settings
from sparkbuild.smoke import record as smoke_record
from sparkbuild.smoke import report
from sparkbuild.smoke.deep.plan import DeepPlan, ReferenceSource
from sparkbuild.smoke.deep.plan import reference_url as checked_reference_url
from sparkbuild.smoke.runner import SmokeResult, expecting, run_smoke


def _default_log_path(settings: Settings, profile: str) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    relative = f".sparkbuild/smoke-logs/{profile}-{stamp}.log"
    return fileio.project_output(settings.project_dir, relative, "--log FILE")


@click.command("smoke")
@options.launch(
    profile={"required": True},
    boot_timeout={"help": "Override the profile's expect.boot_timeout_s."},
    request_timeout={
        "help": "Override the profile's expect.request_timeout_s (per request; a timeout ends "
        "the run, since a hung engine answers no further request)."
    },
    log={"help": "Keep the engine's full log here [default: .sparkbuild/smoke-logs/]."},
)
@options.json()
@options.json_file(help="Write the result as JSON to FILE as well (the table still prints).")
@options.record(
    help="Record the verdict in images.lock under BUILD's current image id "
    "(verified only for --image runs)."
)
@options.engine_version(
    help="The engine version under test (default: the image's "
    "org.opencontainers.image.version label); picks the NaN switch that version reads."
)
@options.print_manifest()
@options.deep()
@options.reference_url()
@click.pass_obj
def smoke(  # noqa: PLR0913 - click passes each option as a parameter
    settings: Settings,
    launch: LaunchSettings,
    as_json: bool,
    json_file: str | None,
    record_build: str | None,
    engine_version: str | None = None,
    manifest_path: str | None = None,
    deep: bool = False,
    reference_url: str | None = None,
) -> None:
    """Boot an engine and check boot, acceptance length, NaNs, output and errors.

    With --deep (or what the profile declares), also lossless speculation against a second
    boot without it, a long generation, acceptance per draft position, burn-in rounds, a
    long prompt and the chat path.

    With --cluster, the image runs across the cluster's nodes on the engine's own multi-node
    runtime; every node must hold the same image id, and every rank must join.

    Exit status 0 when every check passes or is skipped, 1 on a failed check, 2 on bad usage.
    """
    if manifest_path is not None:
        write_manifest(settings, launch, manifest_path, engine_version)
        return
    json_path = options.json_destination(as_json, json_file)
    outputs = SmokeOutputs(json_path=json_path, record_build=record_build)
    name, profile, adapter, make, prep, cache = _prepare(settings, launch, outputs, engine_version)
    target = make(profile, launch.log_path or _default_log_path(settings, name))
    plan = _deep_plan(settings, launch, profile, make, name, deep, reference_url)
    with stop_on_signals(), console.activity(f"smoke {name}: starting {target.kind}") as now:
        result = run_smoke(
            target,
            adapter,
            profile,
            name,
            progress=now.stage,
            waiting=now.detail,
            deep=plan,
            compile_cache=cache,
        )
    result = dataclasses.replace(result, before_boot=prep.to_json())
    _report(settings, result, name, outputs)


@dataclass(frozen=True)
class SmokeOutputs:
    """Where the verdict goes besides the table."""

    json_path: str | None = None  # '-': stdout (--json), else --json-file FILE
    record_build: str | None = None  # --record BUILD


#: Makes the run's target for a profile and a log path (the reference boot makes a second).
MakeTarget = Callable[[SmokeProfile, Path | None], Target]


def _prepare(
    settings: Settings, launch: LaunchSettings, outputs: SmokeOutputs, engine_version: str | None
) -> tuple[str, SmokeProfile, EngineAdapter, MakeTarget, BootPrep, CompileCache | None]:
    """The profile (with smoke's overrides), adapter, how to make the target and the compile
    cache it mounts (the run measures it); everything
    that can fail is checked here, before a long boot (the memory fit and the page cache too:
    lossless's reference boot runs after the engine under test is stopped, so one fit holds
    for both)."""
    choice = launch.choice
    choice.kind()
    assert launch.profile is not None  # smoke's --profile is required
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
        version=_engine_version(engine_version, choice.image, cluster is not None),
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

        return name, profile, adapter, on_cluster, prep, None

    cache = compile_cache_for(launch, settings.cache_dir)

    def on_one_box(served: SmokeProfile, logs: Path | None) -> Target:
        logs = None if choice.url else logs
        return make_target(choice, served, adapter, logs, stage="smoke", compile_cache=cache)

    return name, profile, adapter, on_one_box, prep, cache


def _deep_plan(
    settings: Settings,
    launch: LaunchSettings,
    profile: SmokeProfile,
    make: MakeTarget,
    name: str,
    everything: bool,
    reference_url: str | None,
) -> DeepPlan | None:
    """The deep checks to run (``--deep``: all), and how lossless gets its reference: a
    second target like the first with the adapter's flags without speculation."""
    if reference_url is not None:
        reference_url = checked_reference_url(reference_url)
    boot = None
    if launch.choice.url is None:
        log = launch.log_path or _default_log_path(settings, name)
        reference_log = log.with_name(f"{log.stem}-reference{log.suffix}")

        def boot(args: Sequence[str]) -> Target:
            return make(profile.model_copy(update={"args": list(args)}), reference_log)

    store = settings.project_dir / ".sparkbuild" / "smoke-references"
    source = ReferenceSource(boot=boot, url=reference_url, store=store)
    return DeepPlan.of(profile.expect, everything, source)


def _report(settings: Settings, result: SmokeResult, name: str, outputs: SmokeOutputs) -> None:
    """Record, write and show the verdict; a failed verdict ends in an error (exit 1)."""
    json_path, record_build = outputs.json_path, outputs.record_build
    if record_build:  # first: the verdict is what the run was for; outputs come after
        image_id = smoke_record.record(settings.lock_file, record_build, result)
        console.info(f"recorded {result.verdict} for {record_build} ({image_id[:19]}) / {name}")
        if not result.verified and result.target_kind == "cluster":
            console.warn(
                f"recorded as unverified: not every node ran {image_id[:19]} (see the nodes "
                f"above), so `sparkbuild publish {record_build}` does not count it"
            )
        elif not result.verified:
            console.warn(
                f"recorded as unverified: a {result.target_kind} run does not show which image "
                f"ran, so `sparkbuild publish {record_build}` does not count it; "
                f"`sparkbuild smoke --image IMAGE --profile {name} --record {record_build}` does"
            )
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


def _engine_version(given: str | None, image: str | None, remote: bool = False) -> Version | None:
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


COMMANDS: list[click.Command] = [smoke]
