"""Preflight of an engine that is a built program, not a Python package (its adapter's
``preflight`` is a :class:`~sparkbuild.adapters.BinaryPreflight`).

There is no Python boot path to run; the program itself is asked, on the CPU, inside the
built image (``--image``/``--in-image``: ``docker run``, no GPU, no network) or as a given
binary (``--server PATH``):

* ``version`` (the build): the version the program says it was built as is the build's;
* ``flags`` (each profile): the program's own flag parser takes the profile's launch line
  (the adapter's serve arguments, the model swapped for an empty file): it gets past the
  parser to the model load, and does not refuse a flag;
* ``model`` (each profile): the profile's model file, when it is one on this machine, is a
  readable header of the engine's format naming an architecture the release's tree knows,
  and the program loads it on the CPU (a hub model cannot be read here: a skip saying so).

What the CPU cannot show (kernels on the GPU, memory, speed) is the adapter's ``cannot``,
written into the version check's detail of every report.
"""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import tempfile
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path

from sparkbuild import git
from sparkbuild.adapters import BinaryPreflight, adapter_for, adapter_type
from sparkbuild.adapters.versions import parse_version
from sparkbuild.checks import CheckResult
from sparkbuild.engines.profiles import load_profile
from sparkbuild.errors import PreflightSetupError
from sparkbuild.preflight.gguf import GGUFError, read_header
from sparkbuild.preflight.report import PreflightReport, ProfileResult
from sparkbuild.preflight.where import image_id_of
from sparkbuild.settings import Settings
from sparkbuild.source import PreparedSource

#: A model larger than this is read (its header) but not loaded on this CPU.
LOAD_LIMIT_BYTES = 4 << 30
#: The longest a program may take to answer one question here.
ANSWER_S = 120.0
_MOUNT = "/sparkbuild-model"


@dataclass(frozen=True)
class Program:
    """Where the engine's program runs: a local binary, or inside a built image."""

    facts: BinaryPreflight
    binary: Path | None = None
    image: str | None = None
    image_id: str | None = None  # the image's id, for the lock (publish counts image runs)
    docker: str = "docker"

    @property
    def where(self) -> str:
        return "server" if self.binary is not None else "image"

    def run(
        self,
        args: Sequence[str],
        *,
        model: Path | None = None,
        stop_at: re.Pattern[str] | None = None,
    ) -> tuple[int | None, str]:
        """(exit status, output) of the program with ``args`` (``{model}`` in them: the
        path of ``model``, mounted read-only into an image); with ``stop_at``, the program
        is stopped once its output shows it (exit status None)."""
        path = _MOUNT if self.image is not None else str(model or "")
        argv = [a.replace("{model}", path) for a in args]
        if self.image is None:
            assert self.binary is not None
            return _watch([str(self.binary), *argv], stop_at)
        name = f"sparkbuild-preflight-{uuid.uuid4().hex[:12]}"
        mounts = ["-v", f"{model}:{_MOUNT}:ro"] if model is not None else []
        command = [self.docker, "run", "--rm", "--name", name, "--network", "none", *mounts]
        # By its id: the image that runs is the one the lock records, even if its tag moves.
        command += ["--entrypoint", self.facts.server, self.image_id or self.image, *argv]
        try:
            return _watch(command, stop_at)
        finally:
            subprocess.run(
                [self.docker, "rm", "-f", name], capture_output=True, check=False, timeout=60
            )


def _watch(command: list[str], stop_at: re.Pattern[str] | None) -> tuple[int | None, str]:
    """Run ``command`` to its end, or until its output shows ``stop_at``, then stop it;
    never longer than :data:`ANSWER_S`."""
    with tempfile.TemporaryFile("w+", encoding="utf-8", errors="replace") as out:
        try:
            process = subprocess.Popen(
                command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True
            )
        except OSError as exc:
            raise PreflightSetupError(
                f"cannot run {command[0]}: {exc}", "check --server, or that Docker runs"
            ) from None
        deadline = time.monotonic() + ANSWER_S
        while process.poll() is None and time.monotonic() < deadline:
            out.seek(0)
            if stop_at is not None and stop_at.search(out.read()):
                break
            time.sleep(0.2)
        code = process.poll()
        if code is None:
            os.killpg(process.pid, signal.SIGKILL)
            process.wait()
        out.seek(0)
        return code, out.read()[-20000:]


def _last_line(text: str) -> str:
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


# --- the checks -----------------------------------------------------------------------------


def version_check(program: Program, expected: str) -> CheckResult:
    """The version the program says it was built as is the build's."""
    facts = program.facts
    _, output = program.run(facts.version_args)
    match = facts.version.search(output)
    if match is None:
        return CheckResult(
            "version",
            "fail",
            f"{facts.server} {' '.join(facts.version_args)} named no version: {_last_line(output)}",
        )
    found = match.group("version")
    said = f"{facts.server} says {found}; the CPU cannot show {facts.cannot}"
    if parse_version(found) != parse_version(expected):
        return CheckResult("version", "fail", f"{said}: the build is {expected}", value=found)
    return CheckResult("version", "pass", said, value=found)


def flags_check(program: Program, serve: Sequence[str], scratch: Path) -> CheckResult:
    """The program's own parser on the launch line ``serve`` (its model an empty file)."""
    facts = program.facts
    empty = scratch / "empty-model"
    empty.write_bytes(b"")
    code, output = program.run(serve, model=empty, stop_at=facts.parsed)
    refused = facts.refused.search(output)
    if refused is not None:
        return CheckResult("flags", "fail", f"{facts.server} refused: {refused.group('why')}")
    if facts.parsed.search(output):
        return CheckResult(
            "flags",
            "pass",
            f"{facts.server}'s parser took all {len(serve)} words and began loading the model",
        )
    ended = "did not answer in time" if code is None else f"exited {code}"
    return CheckResult(
        "flags", "fail", f"{facts.server} {ended} before loading a model: {_last_line(output)}"
    )


def model_check(
    program: Program, path: Path, known: frozenset[str], serve: Sequence[str]
) -> CheckResult:
    """The profile's model file: a header the engine reads, an architecture the release
    knows, and the program loading it on the CPU."""
    facts = program.facts
    try:
        header = read_header(path)
    except (GGUFError, OSError) as exc:
        return CheckResult("model", "fail", f"{path}: {exc}")
    arch = header.architecture
    if arch is None or arch not in known:
        return CheckResult(
            "model",
            "fail",
            f"{path.name}: architecture {arch!r} is not one this release "
            f"knows ({facts.architectures} names {len(known)})",
        )
    said = f"{path.name}: {facts.model_format} v{header.version}, {arch}, {header.tensors} tensors"
    if path.stat().st_size > LOAD_LIMIT_BYTES:
        return CheckResult("model", "pass", f"{said}; not loaded here (over 4 GiB)")
    _, output = program.run([*serve, *facts.cpu_args], model=path, stop_at=facts.loaded)
    if facts.loaded.search(output):
        return CheckResult("model", "pass", f"{said}; {facts.server} loaded it on the CPU")
    return CheckResult(
        "model", "fail", f"{said}; {facts.server} did not load it: {_last_line(output)}"
    )


def known_architectures(prepared: PreparedSource, facts: BinaryPreflight) -> frozenset[str]:
    """The architecture names the prepared tree's :attr:`BinaryPreflight.architectures`
    file writes."""
    text = git.run(
        ["show", f"{prepared.tree}:{facts.architectures}"], git_dir=prepared.mirror
    ).stdout.decode("utf-8", errors="replace")
    return frozenset(m.group("name") for m in facts.architecture.finditer(text))


# --- the stage ------------------------------------------------------------------------------


def program_of(facts: BinaryPreflight, image: str | None, server: Path | None) -> Program:
    if image is None and server is None:
        raise PreflightSetupError(
            f"{facts.server} is a built program: preflight asks it on the CPU, in the built "
            "image or as a given binary",
            "pass --in-image, --image IMAGE or --server PATH (a CPU build of the program)",
        )
    if image is None:
        return Program(facts, binary=server)
    if shutil.which("docker") is None:
        raise PreflightSetupError(f"no docker client to run {image}", "install Docker")
    return Program(facts, image=image, image_id=image_id_of(image, "docker"))


def run_binary_preflight(
    settings: Settings,
    prepared: PreparedSource,
    profile_names: list[str],
    program: Program,
) -> PreflightReport:
    """Preflight one prepared build of a built-program engine (see the module)."""
    build = prepared.build
    facts = program.facts
    known = known_architectures(prepared, facts)
    version = version_check(program, str(build.version))
    profiles = []
    with tempfile.TemporaryDirectory(prefix="sparkbuild-preflight-") as scratch:
        for name in profile_names:
            shown, profile = load_profile(settings, name, need_model=False)
            adapter = adapter_for(profile.engine, version=build.version)
            serve = adapter.serve_args("{model}", "127.0.0.1", 0, profile.args)
            flags = flags_check(program, serve, Path(scratch))
            model = Path(profile.model).expanduser()
            if model.is_file():
                checks: tuple[CheckResult, ...] = (flags, model_check(program, model, known, serve))
            else:  # what the CPU cannot show, said; not a check that could not run
                note = f"; {profile.model} is no file here, so its header and load are not read"
                checks = (replace(flags, detail=flags.detail + note),)
            profiles.append(ProfileResult(shown, checks))
    return PreflightReport(
        build=build.name,
        engine=build.engine,
        version=str(build.version),
        where=program.where,
        tree=prepared.tree,
        deps_digest="",
        package_checks=(version,),
        profiles=tuple(profiles),
        image_id=program.image_id,
        versions={build.engine: version.value} if version.value else {},
    )


def binary_facts(engine: str) -> BinaryPreflight | None:
    facts = adapter_type(engine).preflight
    return facts if isinstance(facts, BinaryPreflight) else None
