"""`sparkbuild audit IMAGE`: which libraries of an image carry CUDA code that runs on the
Spark's GPU (sm_121), read from the image's files without running it (docs/image.md)."""

from __future__ import annotations

import click
from rich.table import Table

from sparkbuild import console, dockerhost
from sparkbuild.adapters import adapter_type, engine_names
from sparkbuild.cli import options
from sparkbuild.image.audit import DeviceAudit, audit_image
from sparkbuild.image.audit_record import refuse_failures
from sparkbuild.outputs import emit_json
from sparkbuild.settings import Settings

_SHOWN = {"native": "native", "ptx": "PTX only (JIT)", "none": "NONE", "jit": "compiles at run"}


def launch_roots(engine: str | None) -> list[str]:
    """The distributions a launch starts from: the engine's, or every engine's."""
    names = [engine] if engine else engine_names()
    return [d for name in names for d in adapter_type(name).distributions()]


def show(audit: DeviceAudit) -> None:
    table = Table(title=f"device code for {audit.target} in {audit.image_id[:19]}")
    for column in ("library", "version", "verdict", "loaded", "SASS", "PTX", "files"):
        table.add_column(column)
    for lib in audit.libraries:
        table.add_row(
            lib.name,
            lib.version or "",
            _SHOWN[lib.verdict],
            "yes" if lib.loaded else "",
            " ".join(lib.sass),
            " ".join(lib.ptx),
            str(len(lib.files)),
        )
    console.show_table(console.out, table)
    for lib in audit.libraries:
        if lib.compiles:
            console.out.print(f"{lib.name}: {lib.compiles}", markup=False)
    for line in audit.warnings():
        console.warn(line)
    console.info(f"{audit.summary()}; {audit.files_read} files read in {audit.seconds:.0f} s")


@click.command(name="audit")
@click.argument("image")
@click.option(
    "--engine",
    type=click.Choice(engine_names()),
    help="Follow the launch from this engine's distributions [default: every engine's].",
)
@options.json()
@click.pass_obj
def audit_command(settings: Settings, image: str, engine: str | None, as_json: bool) -> None:
    """Read IMAGE's device code (any local image, ours or not) and judge it per library:
    native, PTX only, none, or compiled at run time. Exits 1 when the engine's launch loads
    a library with no code for sm_121."""
    del settings
    with console.status(f"reading the files of {image}") as update:
        audit = audit_image(
            dockerhost.client(),
            image,
            launch_roots(engine),
            progress=lambda n: update(f"{n} files read so far"),
        )
    if as_json:
        emit_json(audit.to_json(), "-")
    else:
        show(audit)
    refuse_failures(audit, image)


COMMANDS: list[click.Command] = [audit_command]
