"""Runs inside the image build (the image's own python3): lay the overlay over the package.

Reads manifest.json beside it: the package name, an optional install dir, the files to write
(under files/, relative to the package directory) and the files to delete. Changed .py files
are byte-compiled with hash-checked pycs; any syntax error fails the build.
Kept compatible with old Python 3 releases: it runs under whatever the base image ships.
"""

import glob
import importlib.util
import json
import os
import py_compile
import shutil
import sys
from typing import NoReturn

HERE = os.path.dirname(os.path.abspath(__file__))


def fail(message: str) -> NoReturn:
    sys.stderr.write("sparkbuild overlay: error: " + message + "\n")
    sys.exit(1)


def locate(package: str) -> str:
    spec = importlib.util.find_spec(package)
    if spec is None or not spec.submodule_search_locations:
        fail(
            f"package {package!r} is not installed for {sys.executable} in the base image; "
            "set install_dir in the build spec"
        )
    return next(iter(spec.submodule_search_locations))


def drop_pycs(path: str) -> None:
    folder = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.splitext(os.path.basename(path))[0]
    for pyc in glob.glob(os.path.join(folder, stem + ".*.pyc")):
        os.remove(pyc)


def main() -> None:
    with open(os.path.join(HERE, "manifest.json")) as handle:
        manifest = json.load(handle)
    install_dir = os.environ.get("SPARKBUILD_INSTALL_DIR") or manifest.get("install_dir")
    install_dir = install_dir or locate(manifest["package"])
    if not os.path.isdir(install_dir):
        fail(f"install dir {install_dir} does not exist in the base image")
    epoch = os.environ.get("SOURCE_DATE_EPOCH")
    for rel in manifest["deleted"]:
        target = os.path.join(install_dir, rel)
        if os.path.lexists(target):
            os.remove(target)
        drop_pycs(target)
    for rel in manifest["files"]:
        target = os.path.join(install_dir, rel)
        parent = os.path.dirname(target)
        if not os.path.isdir(parent):
            os.makedirs(parent)
        shutil.copyfile(os.path.join(HERE, "files", rel), target)
        os.chmod(target, 0o644)
        if epoch:
            os.utime(target, (int(epoch), int(epoch)))
        drop_pycs(target)
    errors: list[str] = []
    for rel in manifest["files"]:
        if rel.endswith(".py"):
            try:
                py_compile.compile(
                    os.path.join(install_dir, rel),
                    doraise=True,
                    invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
                )
            except py_compile.PyCompileError as exc:
                errors.append(exc.msg)
    for message in errors:
        sys.stderr.write(message.rstrip() + "\n")
    if errors:
        fail(f"{len(errors)} changed file(s) do not compile")
    compiled = sum(1 for rel in manifest["files"] if rel.endswith(".py"))
    print(
        f"sparkbuild overlay: {install_dir}: wrote {len(manifest['files'])}, "
        f"deleted {len(manifest['deleted'])}, compiled {compiled}"
    )


if __name__ == "__main__":
    main()
