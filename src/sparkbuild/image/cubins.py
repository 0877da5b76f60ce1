"""Source-build verification: the built wheels carry CUDA code for the target arch only.

A kernel build that silently keeps its hardcoded targets (sm_90a, sm_100a, ...) costs hours
of nvcc time and memory on a Spark, and one that drops sm_121a builds fine and fails at the
first kernel launch. Neither shows without a GPU, so after a source build sparkbuild lists
the device code in the wheels the image kept (``$SPARKBUILD_WHEELS``, set by the templates)
with ``cuobjdump`` inside the image (CUDA devel images have it; no GPU or driver needed) and
compares it with ``TORCH_CUDA_ARCH_LIST``: every cubin must run on a target arch (sm_120 runs
on sm_121a, sm_90a or sm_100a do not), every target must have cubins, PTX only with ``+PTX``.
An image that fails is removed, so it is never found "up to date" later.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

import docker.errors

from sparkbuild import dockerhost
from sparkbuild.errors import BuildInputError, CubinCheckError
from sparkbuild.image import context
from sparkbuild.jsontext import JsonObject

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.images import Image

WHEELS_ENV = "SPARKBUILD_WHEELS"
HELPER = "list_cubins.py"
_CODE_NAME = re.compile(r"\.(sm_\d+[a-z]?)\.(cubin|ptx)\Z")
_ARCH = re.compile(r"^(\d+)\.(\d+)([a-z]?)\Z")


@dataclass(frozen=True)
class CudaCode:
    """What the wheels carry: ``{wheel: {member: {"elf": [sm_..], "ptx": [sm_..]}}}``."""

    wheels_dir: str
    expected: tuple[str, ...]
    wheels: dict[str, dict[str, dict[str, list[str]]]]

    @property
    def cubin_archs(self) -> list[str]:
        return sorted({a for m in self._members() for a in m["elf"]})

    @property
    def ptx_archs(self) -> list[str]:
        return sorted({a for m in self._members() for a in m["ptx"]})

    def _members(self) -> list[dict[str, list[str]]]:
        return [code for members in self.wheels.values() for code in members.values()]

    def to_json(self) -> JsonObject:
        return {
            "wheels_dir": self.wheels_dir,
            "expected": list(self.expected),
            "wheels": sorted(self.wheels),
            "cubin_archs": self.cubin_archs,
            "ptx_archs": self.ptx_archs,
        }


def expected_archs(arch_list: str) -> tuple[tuple[str, ...], bool]:
    """``TORCH_CUDA_ARCH_LIST`` (e.g. ``12.1a``, ``9.0a;12.1a+PTX``) as cuobjdump names
    (``sm_121a``), and whether PTX is wanted."""
    archs: list[str] = []
    ptx = False
    for raw in re.split(r"[;\s]+", arch_list.strip()):
        if not raw:
            continue
        ptx = ptx or raw.endswith("+PTX")
        entry = raw.removesuffix("+PTX")
        match = _ARCH.match(entry)
        if not match:
            raise BuildInputError(
                f"TORCH_CUDA_ARCH_LIST entry '{entry}' is not of the form MAJOR.MINOR[a|f]",
                'for DGX Spark: `TORCH_CUDA_ARCH_LIST: "12.1a"` in build_args',
            )
        archs.append(f"sm_{match.group(1)}{match.group(2)}{match.group(3)}")
    return tuple(dict.fromkeys(archs)), ptx


def wheels_dir(image: Image) -> str | None:
    """Where the image keeps its built wheels, if its Dockerfile declares it."""
    for item in (image.attrs.get("Config") or {}).get("Env") or []:
        key, _, value = str(item).partition("=")
        if key == WHEELS_ENV and value:
            return value
    return None


def _names_to_archs(names: list[str]) -> list[str]:
    return sorted({m.group(1) for m in map(_CODE_NAME.search, names) if m})


def _text(output: bytes | str | None) -> str:
    """A container's output: bytes from the daemon (the stubs say str)."""
    if isinstance(output, bytes):
        return output.decode(errors="replace")
    return output or ""


def list_code(
    api: DockerClient, image: Image, platform: str
) -> dict[str, dict[str, dict[str, list[str]]]]:
    script = context.packaged(HELPER).read_text()
    try:
        done = dockerhost.run_once(
            api,
            image.id or "",
            ["python3", "-c", script],
            entrypoint=[],
            network_disabled=True,
            platform=platform,
        )
    except docker.errors.DockerException as exc:
        raise CubinCheckError(
            f"could not run the built image to list its CUDA code ({exc})",
            "check that the Docker daemon can run the image's platform (`docker run`)",
        ) from None
    if done.status != 0:
        stderr = _text(done.stderr).strip()[-500:]
        raise CubinCheckError(
            f"listing the CUDA code of the built wheels failed (exit {done.status}): {stderr}",
            "the image needs python3 and cuobjdump (CUDA devel images have both)",
        )
    output = done.stdout
    try:
        report = json.loads(output)
    except ValueError:
        raise CubinCheckError(
            f"listing the CUDA code gave no report: {output[-300:]!r}",
            "run the image and check that python3 works in it",
        ) from None
    return {
        wheel: {
            member: {"elf": _names_to_archs(code["elf"]), "ptx": _names_to_archs(code["ptx"])}
            for member, code in members.items()
        }
        for wheel, members in report["wheels"].items()
    }


_SM = re.compile(r"^sm_(\d+)(\d)([af]?)\Z")


def runs_on(cubin: str, target: str) -> bool:
    """Whether a cubin for ``cubin`` (e.g. sm_120) runs on a ``target`` GPU (e.g. sm_121a).

    CUDA's rules: plain and family (``f``) cubins run on the same major version at the same
    or a higher minor; arch-specific (``a``) cubins only on exactly that arch.
    """
    have, want = _SM.match(cubin), _SM.match(target)
    if not have or not want:
        return cubin == target
    if have.group(1) != want.group(1):
        return False
    if have.group(3) == "a":
        return have.group(2) == want.group(2)
    return int(have.group(2)) <= int(want.group(2))


def problems(code: CudaCode, ptx_wanted: bool) -> list[str]:
    targets = code.expected
    found: list[str] = []
    if not code.wheels:
        found.append(f"no wheel in {code.wheels_dir}")
    elif not code.cubin_archs:
        found.append(f"no CUDA device code in the wheels in {code.wheels_dir}")
    for wheel, members in sorted(code.wheels.items()):
        for member, listed in sorted(members.items()):
            waste = [a for a in listed["elf"] if not any(runs_on(a, t) for t in targets)]
            if waste:
                found.append(f"{wheel}: {member}: cubins for {', '.join(sorted(waste))}")
            ptx = sorted(set(listed["ptx"]) - (set(targets) if ptx_wanted else set()))
            if ptx:
                found.append(f"{wheel}: {member}: PTX for {', '.join(ptx)}")
    missing = [t for t in targets if not any(runs_on(a, t) for a in code.cubin_archs)]
    if code.cubin_archs and missing:
        found.append(f"no cubins that run on {', '.join(missing)} in any wheel")
    return found


def verify(api: DockerClient, image: Image, platform: str, arch_list: str) -> CudaCode | None:
    """Check the image's wheels; None when the image declares no wheels to check."""
    folder = wheels_dir(image)
    if folder is None:
        return None
    expected, ptx_wanted = expected_archs(arch_list)
    code = CudaCode(folder, expected, list_code(api, image, platform))
    found = problems(code, ptx_wanted)
    if found:
        raise CubinCheckError(
            f"the built wheels carry CUDA code that does not run on {', '.join(expected)} "
            f"(TORCH_CUDA_ARCH_LIST={arch_list}):\n  " + "\n  ".join(found),
            "prune the kernel build's arch list (the sm121a-prune step under `steps:` in the "
            "spec, with a `when` range covering this release; `sparkbuild patches BUILD` shows "
            "what it changed) or fix TORCH_CUDA_ARCH_LIST; the image was removed and "
            "images.lock was not changed",
        )
    return code
