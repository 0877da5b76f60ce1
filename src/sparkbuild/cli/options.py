"""Options shared by the commands (after pip's cmdoptions): each defined once here.

An option is a factory: ``@options.image()`` adds ``--image`` with its name, type and help.
A command passes ``help=`` only where it describes the same option in its own words (what
``--url`` is for differs between smoke and bench), and ``required``/``default``/``multiple``
only where its contract differs (smoke needs a profile; bench gives streams 30 minutes).

Each contract is the same on every command that takes it:

- ``--json`` is a flag: the machine-readable result goes to stdout, instead of the human
  output. ``--json-file FILE`` (smoke, bench, bench compare, preflight: the runs whose table
  is worth keeping) writes the same JSON to FILE and keeps the human output;
  ``json_destination`` makes the two one value.
- ``--record BUILD`` stores the verdict in images.lock under BUILD.
- ``--locked`` uses only what images.lock pins and fails when anything differs.
- The launch options (``--image``/``--command``/``--url``, ``--cluster``, ``--profile``,
  ``--model``, ``--gpus``, the timeouts, ``--log``) are one group, ``LAUNCH``: smoke and bench
  list it with ``@launch(...)``, in one order, and take its values as one frozen
  ``LaunchSettings`` (``@launch_settings``).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

import click

from sparkbuild.errors import UsageError

if TYPE_CHECKING:
    from _typeshed import DataclassInstance

F = TypeVar("F", bound=Callable[..., Any])
R = TypeVar("R")
G = TypeVar("G", bound="DataclassInstance")
#: What ``click.option`` returns: it adds one option to a command.
Decorator = Callable[[Callable[..., Any]], Callable[..., Any]]


class FiniteFloat(click.FloatRange):
    """A float range that also refuses NaN and infinity: ``--boot-timeout nan`` would
    otherwise wait forever, and ``inf`` is never a bound."""

    name = "finite float"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if isinstance(number, float) and not math.isfinite(number):
            self.fail(f"{value!r} is not a finite number.", param, ctx)
        return number


SECONDS = FiniteFloat(min=1)


def _option(*decls: str, **attrs: object) -> Callable[..., Callable[[F], F]]:
    """One shared option: ``decls`` and ``attrs`` as click takes them, overridable per use."""

    def option(**overrides: Any) -> Callable[[F], F]:
        return click.option(*decls, **{**attrs, **overrides})

    option.__doc__ = f"The shared ``{decls[0]}`` option."
    return option


# Where the engine runs: exactly one of --image, --command, --url (engines.launch.TargetChoice).
image = _option("--image", metavar="IMAGE", help="Run the engine in a container of IMAGE.")
command = _option(
    "--command",
    "command",
    metavar="CMD",
    help="Run the engine as a local process: its launcher, e.g. "
    "'python -m vllm.entrypoints.openai.api_server' (model, port and the "
    "profile's args are appended unless CMD contains {port}).",
)
url = _option(
    "--url", metavar="URL", help="Check an engine that is already running (no boot check)."
)
gpus = _option(
    "--gpus",
    metavar="VALUE",
    help="docker --gpus value for --image (default: the profile's, 'all'); 'none' for none.",
)
cluster = _option(
    "--cluster",
    metavar="NAME|FILE",
    help="Run --image across the nodes of clusters/NAME.yaml (or FILE): Docker endpoints, "
    "or Kubernetes when the cluster has a kubernetes: target (docs/cluster.md).",
)
print_manifest = _option(
    "--print-manifest",
    "manifest_path",
    metavar="FILE",
    help="With --cluster: write the Kubernetes LeaderWorkerSet this run would apply to FILE "
    "('-': stdout) and stop, for deploying it with GitOps.",
)

# What it serves and how long it may take.
profile = _option(
    "--profile",
    "-p",
    "profile_name",
    metavar="NAME|FILE",
    help="A profile in smoke/ (by name) or a profile file.",
)
model = _option("--model", metavar="PATH|ID", help="Serve this model instead of the profile's.")
engine_version = _option(
    "--engine-version",
    metavar="VERSION",
    help="The engine release that runs the profile (for what differs by release).",
)
boot_timeout = _option("--boot-timeout", type=SECONDS, metavar="SECONDS")
request_timeout = _option("--request-timeout", type=SECONDS, metavar="SECONDS")
log = _option("--log", "log_path", type=click.Path(dir_okay=False, path_type=Path))
force = _option(
    "--force",
    is_flag=True,
    help="Boot even when the memory estimate says the engine does not fit a DGX Spark.",
)
drop_caches = _option(
    "--drop-caches/--no-drop-caches",
    default=None,
    help="Drop the page cache on each node before the boot [default: on for --image on a "
    "DGX Spark, off for --command].",
)
fresh_compile_cache = _option(
    "--fresh-compile-cache",
    is_flag=True,
    help="Start the image's compile cache on this host empty (a first boot's compile, "
    "measured again) [default: keep it, so a later boot compiles nothing].",
)
memory_floor = _option(
    "--memory-floor",
    metavar="GIB|N%|off",
    help="Stop the engine at once when a node's MemAvailable falls under this (GiB, "
    "512MiB, a share such as 5%, or off) [default: the profile's expect.memory_floor; on a "
    "DGX Spark the larger of 6 GiB and 5% of memory; elsewhere none].",
)
allow_host_drift = _option(
    "--allow-host-drift",
    is_flag=True,
    help="Run a cluster whose nodes differ in NVIDIA driver or kernel (the verdict says so).",
)

# The deep checks (smoke only; docs/smoke.md, "Deep checks").
deep = _option(
    "--deep",
    is_flag=True,
    help="Run every deep check (lossless, long-output, acceptance-per-position, burn-in, "
    "long-context, chat), not only those the profile declares; costs a second boot.",
)
reference_url = _option(
    "--reference-url",
    metavar="URL",
    help="For lossless: the same engine and model already running without speculation "
    "(instead of booting one; the only way with --url).",
)


# Signing and verifying (docs/verify.md).
public_key = _option(
    "--key",
    "key_path",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="PUB",
    help="The public key images must be signed with [env SPARKBUILD_PUBLIC_KEY; default: "
    "the project's cosign.pub].",
)
sign_key = _option(
    "--sign-key",
    "sign_key",
    type=click.Path(dir_okay=False, path_type=Path),
    metavar="FILE",
    help="Sign with this cosign private key, passphrase in SPARKBUILD_SIGNING_PASSWORD [env "
    "SPARKBUILD_SIGNING_KEY_FILE, or the PEM text in SPARKBUILD_SIGNING_KEY].",
)
#: smoke's and bench's --key: the same option, about the image a run starts.
run_key = functools.partial(
    public_key,
    help="With --image: refuse to run unless every node's copy of the image was pulled by a "
    "registry digest that this public key signed (docs/verify.md).",
)


#: The launch group in its --help order: where the engine runs, what it serves, how long
#: booting and each request may take, where its log goes, what happens before the boot on a
#: DGX Spark (the memory fit, the page cache).
LAUNCH: dict[str, Callable[..., Decorator]] = {
    "image": image,
    "command": command,
    "url": url,
    "cluster": cluster,
    "key": run_key,
    "profile": profile,
    "model": model,
    "gpus": gpus,
    "boot_timeout": boot_timeout,
    "request_timeout": request_timeout,
    "log": log,
    "force": force,
    "drop_caches": drop_caches,
    "fresh_compile_cache": fresh_compile_cache,
    "memory_floor": memory_floor,
    "allow_host_drift": allow_host_drift,
}


def launch(
    *, serves: Sequence[Decorator] = (), **overrides: Mapping[str, object]
) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """The launch group on a command, its values handed over as one ``launch: LaunchSettings``.

    ``overrides`` gives a command's own words or contract per option, by its name in
    ``LAUNCH`` (``profile={"required": True}``); ``serves`` are the command's own options
    about what is served (bench's ``--engine``), listed after ``--model``.
    """
    unknown = sorted(set(overrides) - set(LAUNCH))
    if unknown:
        raise TypeError(f"not launch options: {', '.join(unknown)}")
    decorators: list[Decorator] = []
    for name, option in LAUNCH.items():
        decorators.append(option(**overrides.get(name, {})))
        if name == "model":
            decorators.extend(serves)

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        return stack(decorators, launch_settings(function))

    return decorate


def stack(decorators: Sequence[Decorator], function: Callable[..., R]) -> Callable[..., R]:
    """``decorators`` on ``function`` as if written above it in this order: a group's
    options, listed in --help in the group's order."""
    decorated: Callable[..., Any] = function
    for decorator in reversed(decorators):
        decorated = decorator(decorated)
    return decorated


def launch_settings(function: Callable[..., R]) -> Callable[..., R]:
    """Hands the launch options' values to the command as one ``launch: LaunchSettings``.

    The options stay where each command lists them (its --help order); this collects their
    values, so the command takes the group's frozen object instead of ten parameters.
    """

    @functools.wraps(function)
    def with_launch(  # noqa: PLR0913 - click passes each launch option as a parameter
        *args: object,
        image: str | None,
        command: str | None,
        url: str | None,
        gpus: str | None,
        profile_name: str | None,
        model: str | None,
        boot_timeout: float | None,
        request_timeout: float | None,
        log_path: Path | None,
        engine: str | None = None,  # bench's --engine (the engine at --url)
        cluster: str | None = None,  # --cluster, on the commands that list it
        key_path: Path | None = None,  # --key, on the commands that list it
        force: bool = False,  # --force: boot whatever the memory estimate says
        drop_caches: bool | None = None,  # --drop-caches/--no-drop-caches
        fresh_compile_cache: bool = False,  # --fresh-compile-cache
        memory_floor: str | None = None,  # --memory-floor
        allow_host_drift: bool = False,  # --allow-host-drift
        **rest: object,
    ) -> R:
        # Here, not at the top: engines (requests, pydantic) load only for the commands that
        # launch one, not for `sparkbuild patches`.
        from sparkbuild.engines.launch import LaunchSettings, TargetChoice

        if url and drop_caches:  # nothing is started at a URL, so nothing would be dropped
            raise UsageError(
                "--drop-caches with --url: sparkbuild starts no engine there, so it drops "
                "no page cache before it",
                "drop it on the engine's host before you start the engine (as root: "
                "`sync; echo 3 > /proc/sys/vm/drop_caches`), and leave --drop-caches out",
            )
        launch = LaunchSettings(
            TargetChoice(
                image=image, command=command, url=url, gpus=gpus, cluster=cluster, key=key_path
            ),
            profile=profile_name,
            model=model,
            engine=engine,
            boot_timeout_s=boot_timeout,
            request_timeout_s=request_timeout,
            log_path=log_path,
            force=force,
            drop_caches=drop_caches,
            fresh_compile_cache=fresh_compile_cache,
            memory_floor=memory_floor,
            allow_host_drift=allow_host_drift,
        )
        return function(*args, launch=launch, **rest)

    return with_launch


def grouped(parameter: str, group: type[G]) -> Callable[[Callable[..., R]], Callable[..., R]]:
    """Hands the values of the options named as the frozen dataclass ``group``'s fields to the
    command as one ``parameter`` (a field with a default may be an option the command lacks)."""
    names = [field.name for field in dataclasses.fields(group)]

    def decorate(function: Callable[..., R]) -> Callable[..., R]:
        @functools.wraps(function)
        def with_group(*args: object, **values: object) -> R:
            mine = {name: values.pop(name) for name in names if name in values}
            return function(*args, **{parameter: group(**mine)}, **values)

        return with_group

    return decorate


# What becomes of the result.
json = _option("--json", "as_json", is_flag=True, help="Machine-readable output on stdout.")
json_file = _option("--json-file", metavar="FILE")
record = _option("--record", "record_build", metavar="BUILD")
locked = _option(
    "--locked", is_flag=True, help="Use only what images.lock pins; fail if anything differs."
)


def json_destination(as_json: bool, json_file: str | None = None) -> str | None:
    """Where ``--json`` and ``--json-file`` send the JSON: ``-`` (stdout), a file, or None."""
    if as_json and json_file is not None:
        raise UsageError(
            "--json and --json-file both given", "pass one: --json for stdout, --json-file FILE"
        )
    return "-" if as_json else json_file
