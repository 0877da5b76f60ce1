"""Runs inside a built source image: list the CUDA code in the wheels the build produced.

For every wheel in $SPARKBUILD_WHEELS, every shared object in it is unpacked to a scratch
directory and listed with `cuobjdump --list-elf --list-ptx`. Prints one JSON document:
{"cuobjdump": path, "wheels": {wheel: {member: {"elf": [...], "ptx": [...]}}}}; a shared
object without device code has empty lists. No GPU or driver is needed.
Kept compatible with Python 3.9+: it runs under whatever the image ships.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import tempfile
import zipfile
from typing import Any

NO_DEVICE_CODE = "does not contain device code"


def find_cuobjdump() -> str:
    homes = [os.environ.get("CUDA_HOME", ""), os.environ.get("CUDA_PATH", ""), "/usr/local/cuda"]
    candidates = [shutil.which("cuobjdump") or ""]
    candidates += [os.path.join(home, "bin", "cuobjdump") for home in homes if home]
    candidates += glob.glob(
        os.path.join(
            sys.prefix, "lib", "python3*", "*-packages", "nvidia", "cu*", "bin", "cuobjdump"
        )
    )
    for candidate in candidates:
        if candidate and os.access(candidate, os.X_OK):
            return candidate
    sys.stderr.write("cuobjdump not found (PATH, CUDA_HOME, /usr/local/cuda)\n")
    sys.exit(3)


def list_code(cuobjdump: str, path: str) -> dict[str, list[str]]:
    result = subprocess.run(
        [cuobjdump, "--list-elf", "--list-ptx", path], capture_output=True, text=True, check=False
    )
    listed: dict[str, list[str]] = {"elf": [], "ptx": []}
    if result.returncode != 0:
        if NO_DEVICE_CODE in result.stdout + result.stderr:
            return listed
        sys.stderr.write(f"cuobjdump failed on {path}: {result.stderr.strip()}\n")
        sys.exit(4)
    for line in result.stdout.splitlines():
        kind, _, name = line.partition(":")
        if kind.startswith("ELF file"):
            listed["elf"].append(name.strip())
        elif kind.startswith("PTX file"):
            listed["ptx"].append(name.strip())
    return listed


def main() -> None:
    folder = os.environ.get("SPARKBUILD_WHEELS", "")
    cuobjdump = find_cuobjdump()
    report: dict[str, Any] = {"cuobjdump": cuobjdump, "wheels": {}}
    for wheel in sorted(glob.glob(os.path.join(folder, "*.whl"))):
        members: dict[str, Any] = {}
        with zipfile.ZipFile(wheel) as archive, tempfile.TemporaryDirectory() as tmp:
            for name in archive.namelist():
                base = os.path.basename(name)
                if base.endswith(".so") or ".so." in base:
                    members[name] = list_code(cuobjdump, archive.extract(name, tmp))
        report["wheels"][os.path.basename(wheel)] = members
    print(json.dumps(report))


if __name__ == "__main__":
    main()
