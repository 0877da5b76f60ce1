"""Runs inside the image build (the image's own python3, as root): lay the overlay over the
package.

Reads manifest.json beside it: the package name, an optional install dir, the files to write
(under files/, relative to the package directory) and the files to delete. The package is
located as the image's own user (SPARKBUILD_RUN_AS, the base's USER) from the WORKDIR, the way
the engine imports it; an install dir that is not that location fails the build, since an
overlay there would change nothing the engine runs. Written files keep the owner of the file
they replace (or of their directory). Changed .py files are byte-compiled with hash-checked
pycs; any syntax error fails the build. Every failure is one `sparkbuild overlay: error:` line
plus a `sparkbuild overlay: hint:` line, which sparkbuild turns into its own error message.
Kept compatible with Python 3.9+: it runs under whatever the base ships.
"""

from __future__ import annotations

import glob
import json
import os
import py_compile
import shutil
import subprocess
import sys
from typing import Any, NoReturn

HERE = os.path.dirname(os.path.abspath(__file__))
PREFIX = "sparkbuild overlay: "
LOCATE = """
import importlib.util, json, sys
spec = importlib.util.find_spec(sys.argv[1])
found = list(spec.submodule_search_locations or []) if spec is not None else []
print(json.dumps(found))
"""


def fail(message: str, hint: str = "") -> NoReturn:
    sys.stderr.write(PREFIX + "error: " + message + "\n")
    if hint:
        sys.stderr.write(PREFIX + "hint: " + hint + "\n")
    sys.exit(1)


def resolve_user(spec: str) -> tuple[int, int, str] | None:
    """(uid, gid, home) for a Dockerfile USER value; None for root or no USER."""
    import grp
    import pwd

    name, _, group = spec.partition(":")
    if not name or name in ("root", "0"):
        return None
    try:
        entry = pwd.getpwuid(int(name)) if name.isdigit() else pwd.getpwnam(name)
        uid, gid, home = entry.pw_uid, entry.pw_gid, entry.pw_dir
    except KeyError:
        if not name.isdigit():
            fail(
                f"the base image's USER {spec!r} is not in its /etc/passwd",
                "check the base image; sparkbuild restores the base's USER after the overlay",
            )
        uid, gid, home = int(name), int(name), "/"
    if group:
        gid = int(group) if group.isdigit() else grp.getgrnam(group).gr_gid
    return uid, gid, home


def imported_from(package: str, run_as: str) -> list[str]:
    """The directories ``package`` is imported from, as the image's user would import it."""
    user = resolve_user(run_as)
    cmd = [sys.executable, "-c", LOCATE, package]
    if user is None:
        output = subprocess.run(cmd, capture_output=True, text=True, cwd=os.getcwd(), check=False)
    else:
        uid, gid, home = user
        env = dict(os.environ, HOME=home)
        output = subprocess.run(
            cmd,
            capture_output=True,
            text=True,
            cwd=os.getcwd(),
            env=env,
            user=uid,
            group=gid,
            extra_groups=[],
            check=False,
        )
    if output.returncode != 0:
        fail(f"locating package {package!r} failed: {output.stderr.strip()[-500:]}")
    return [os.path.realpath(path) for path in json.loads(output.stdout)]


def choose_install_dir(manifest: dict[str, Any], run_as: str) -> str:
    package = manifest["package"]
    who = f"user {run_as}" if run_as else "root"
    found = imported_from(package, run_as)
    wanted = os.environ.get("SPARKBUILD_INSTALL_DIR") or manifest.get("install_dir")
    if not found:
        fail(
            f"{sys.executable} (as {who}, from {os.getcwd()}) cannot import package "
            f"{package!r} in the base image",
            "check package_dir and base_image in the build spec: the overlay only replaces "
            "files of a package the image already imports",
        )
    if not wanted:
        return found[0]
    if os.path.realpath(wanted) not in found:
        fail(
            f"install_dir {wanted} is not where {sys.executable} (as {who}) imports "
            f"{package!r} from ({', '.join(found)})",
            f"set `install_dir: {found[0]}` in the build spec, or remove it to use that location",
        )
    return wanted


def drop_pycs(path: str) -> None:
    folder = os.path.join(os.path.dirname(path), "__pycache__")
    stem = os.path.splitext(os.path.basename(path))[0]
    for pyc in glob.glob(os.path.join(folder, stem + ".*.pyc")):
        os.remove(pyc)


def owner_for(target: str) -> tuple[int, int]:
    """Who should own ``target``: the file it replaces, else its nearest existing parent."""
    probe = target
    while not os.path.lexists(probe):
        probe = os.path.dirname(probe)
    info = os.lstat(probe)
    return info.st_uid, info.st_gid


def write_file(install_dir: str, rel: str, epoch: str) -> None:
    target = os.path.join(install_dir, rel)
    uid, gid = owner_for(target)
    parent = os.path.dirname(target)
    if not os.path.isdir(parent):
        os.makedirs(parent)
        os.chown(parent, uid, gid)
    shutil.copyfile(os.path.join(HERE, "files", rel), target)
    os.chmod(target, 0o644)
    os.chown(target, uid, gid)
    if epoch:
        os.utime(target, (int(epoch), int(epoch)))
    drop_pycs(target)


def compile_changed(install_dir: str, files: list[str]) -> int:
    errors: list[str] = []
    compiled = 0
    for rel in files:
        if not rel.endswith(".py"):
            continue
        target = os.path.join(install_dir, rel)
        try:
            cfile = py_compile.compile(
                target,
                doraise=True,
                invalidation_mode=py_compile.PycInvalidationMode.CHECKED_HASH,
            )
        except py_compile.PyCompileError as exc:
            errors.append(exc.msg)
            continue
        compiled += 1
        if cfile:
            uid, gid = owner_for(target)
            os.chown(os.path.dirname(cfile), uid, gid)
            os.chown(cfile, uid, gid)
    for message in errors:
        sys.stderr.write(message.rstrip() + "\n")
    if errors:
        fail(
            f"{len(errors)} changed file(s) do not compile",
            "fix the patch or PR that changed them (the compiler's message is above)",
        )
    return compiled


def main() -> None:
    with open(os.path.join(HERE, "manifest.json")) as handle:
        manifest = json.load(handle)
    run_as = os.environ.get("SPARKBUILD_RUN_AS", "")
    install_dir = choose_install_dir(manifest, run_as)
    epoch = os.environ.get("SOURCE_DATE_EPOCH", "")
    for rel in manifest["deleted"]:
        target = os.path.join(install_dir, rel)
        if os.path.lexists(target):
            os.remove(target)
        drop_pycs(target)
    for rel in manifest["files"]:
        write_file(install_dir, rel, epoch)
    compiled = compile_changed(install_dir, manifest["files"])
    print(
        f"{PREFIX}{install_dir}: wrote {len(manifest['files'])}, "
        f"deleted {len(manifest['deleted'])}, compiled {compiled}"
    )


if __name__ == "__main__":
    try:
        main()
    except OSError as exc:  # one error path: no traceback in the build log
        fail(
            f"{exc.filename or ''}: {exc.strerror or exc}".lstrip(": "),
            "check install_dir and the base image's file permissions",
        )
