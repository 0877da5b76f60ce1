"""The device-code audit as the build runs it: after every build (overlay and source), once
per image id, failing the build on a library the launch loads with no sm_121 code, and
the compact record images.lock keeps (``builds.<name>.image.device_code``)."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING, cast

from sparkbuild import console
from sparkbuild.adapters import adapter_type
from sparkbuild.errors import AuditError
from sparkbuild.image.audit import DeviceAudit, Library, audit_image
from sparkbuild.jsontext import JsonObject

if TYPE_CHECKING:
    from docker import DockerClient

    from sparkbuild.spec import Build

FORMAT = 1
#: Files kept per library in the lock: those that do not run natively first (a library of
#: cubins, flashinfer-cubin's, ships thousands; ``sparkbuild audit IMAGE`` lists them all).
KEPT_FILES = 20


def refuse_failures(audit: DeviceAudit, what: str) -> None:
    """An AuditError naming each library and file the launch loads with no target code."""
    failures = audit.failures()
    if failures:
        raise AuditError(
            f"{what}: the launch loads device code with nothing for {audit.target}:\n  "
            + "\n  ".join(failures),
            "rebuild the library for sm_121 (TORCH_CUDA_ARCH_LIST 12.1a, or 12.0f), or take "
            "it from a release that ships sm_120/sm_121 code; `sparkbuild audit IMAGE` lists "
            "every file",
        )


def lock_record(audit: DeviceAudit) -> JsonObject:
    """What the lock keeps: per library its verdict, code and files (paths and verdicts)."""
    return {
        "format": FORMAT,
        "image_id": audit.image_id,
        "target": audit.target,
        "counts": dict(audit.counts()),
        "roots": list(audit.roots),
        "nvcc": bool(audit.nvcc),
        "libraries": [
            {
                "name": lib.name,
                "version": lib.version,
                "kind": lib.kind,
                "verdict": lib.verdict,
                "loaded": lib.loaded,
                "sass": lib.sass,
                "ptx": lib.ptx,
                "compiles": lib.compiles,
                "files": _kept_files(lib),
                "native_files": sum(1 for f in lib.files if f.verdict == "native"),
            }
            for lib in audit.libraries
        ],
        "warnings": list(audit.warnings()),
    }


def _kept_files(lib: Library) -> list[JsonObject]:
    ordered = sorted(lib.files, key=lambda f: (f.verdict == "native", f.path))
    return [
        {"path": f.path, "verdict": f.verdict, "loaded": f.loaded} for f in ordered[:KEPT_FILES]
    ]


def recorded_for(previous: Mapping[str, object] | None, image_id: str) -> JsonObject | None:
    """The lock's record when it is of this very image in this format (no second read)."""
    if not previous or previous.get("image_id") != image_id or previous.get("format") != FORMAT:
        return None
    return cast(JsonObject, dict(previous))  # the lock's own, written from lock_record


def audit_build(
    api: DockerClient, build: Build, image_id: str, previous: Mapping[str, object] | None
) -> JsonObject:
    """Every build's image audited (or its record of this image reused), the lock record;
    an image that fails is removed, so it is never found up to date later."""
    kept = recorded_for(previous, image_id)
    if kept is not None:
        return kept
    roots = adapter_type(build.engine).distributions()
    with console.status(f"{build.name}: reading the image's device code") as update:
        audit = audit_image(
            api, image_id, roots, progress=lambda n: update(f"{n} files read so far")
        )
    try:
        refuse_failures(audit, build.name)
    except AuditError as failure:
        api.images.remove(image_id, force=True)
        hint = f"{failure.hint}; the image was removed and images.lock was not changed"
        raise AuditError(failure.message, hint) from None
    for line in audit.warnings():
        console.warn(f"{build.name}: device code: {line}")
    console.info(f"{build.name}: device code: {audit.summary()}")
    return lock_record(audit)
