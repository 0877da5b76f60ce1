"""``sparkbuild smoke``: boot an engine from an image, a command or a URL and check it.

The stage itself is ``smoke.stage.run_stage``; this module turns the command line into its
frozen options."""

from __future__ import annotations

import click

from sparkbuild.cli import options
from sparkbuild.cli.cluster import write_manifest
from sparkbuild.engines.launch import LaunchSettings
from sparkbuild.settings import Settings
from sparkbuild.smoke.stage import SmokeOptions, SmokeOutputs, run_stage


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
    run_stage(settings, SmokeOptions(launch, outputs, engine_version, deep, reference_url))


COMMANDS: list[click.Command] = [smoke]
