"""skopeo with sigstore support, as the tests' independent verifier of our signatures.

Debian 12's skopeo (1.9.3) is built with sigstore compiled out: it answers "Debian-local
change: sigstore disabled" to `--sign-by-sigstore-private-key` and to any sigstore signature
a `sigstoreSigned` policy must check. Debian 13's (trixie, 1.18) is built with it, but needs
glibc 2.38, newer than bookworm's.

- `sigstore_skopeo()` is the host's skopeo when it signs and verifies sigstore signatures
  (a probe on a tiny `dir:` image), else skopeo from a trixie root filesystem (`debootstrap
  --variant=minbase --include=ca-certificates,netavark,skopeo`, once per machine, cached in
  the shared test cache), imported as a local Docker image and run with `--network=host`
  (the tests' registry listens on loopback).
- The container sees each path the caller names at the same path, so policy files, key
  paths inside them and `dir:` targets need no translation.
"""

from __future__ import annotations

import gzip
import hashlib
import io
import json
import os
import shutil
import subprocess
import tarfile
import tempfile
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from filelock import FileLock

from sparkbuild.attest import keys
from tests.support.cache import shared_test_cache
from tests.support.docker_env import debian_arm64_rootfs, docker_cli

__all__ = [
    "SKOPEO_IMAGE",
    "KeyFiles",
    "NoSigstoreSkopeoError",
    "Skopeo",
    "accept_anything_policy",
    "host_skopeo_has_sigstore",
    "sign_copy",
    "sigstore_policy",
    "sigstore_skopeo",
    "skopeo_image",
    "write_dir_image",
    "write_key_files",
]

# skopeo's containers-common depends on the virtual container-network-stack, which
# debootstrap does not resolve: netavark (17 MB, no services) is the smallest provider.
TRIXIE_PACKAGES = ("ca-certificates", "netavark", "skopeo")
# deb.debian.org rather than the host's apt mirror, which may carry only bookworm.
TRIXIE_MIRROR = "http://deb.debian.org/debian"
SKOPEO_IMAGE = "sparkbuild-tests/skopeo-trixie:v1"
_LABEL = "org.sparkbuild.test=skopeo-trixie"
# The identity the probe signs its `dir:` image for (a `dir:` path names no repository).
_PROBE_NAME = "sparkbuild.invalid/skopeo-probe:latest"


@dataclass(frozen=True)
class Skopeo:
    """One way to run skopeo: on this host (``image`` None) or in a local Docker image."""

    program: str
    where: str
    image: str | None = None

    def command(self, *args: str, paths: Sequence[Path] = ()) -> list[str]:
        """skopeo's argv; in a container, each of ``paths`` is mounted at the same path."""
        if self.image is None:
            return [self.program, *args]
        mounts = [f"--volume={p}:{p}" for p in sorted({str(Path(p).resolve()) for p in paths})]
        user = f"--user={os.getuid()}:{os.getgid()}"
        run = [docker_cli(), "run", "--rm", "--network=host", user, "--env=HOME=/tmp"]
        return [*run, *mounts, self.image, self.program, *args]

    def run(
        self, *args: str, paths: Sequence[Path] = (), timeout: float = 300
    ) -> subprocess.CompletedProcess[str]:
        return subprocess.run(
            self.command(*args, paths=paths),
            capture_output=True,
            text=True,
            check=False,
            timeout=timeout,
        )


@dataclass(frozen=True)
class KeyFiles:
    """A key pair in cosign's format and the private key's passphrase, as files."""

    private: Path
    public: Path
    passphrase: Path


class NoSigstoreSkopeoError(Exception):
    """Neither this host's skopeo nor trixie's in a local image can check sigstore signatures."""


def sigstore_skopeo() -> Skopeo:
    """The host's skopeo if it has sigstore, else trixie's in a local image (built once)."""
    program = shutil.which("skopeo")
    if program is not None and host_skopeo_has_sigstore(host := Skopeo(program, "this host")):
        return host
    try:
        image = skopeo_image()
    except (AssertionError, subprocess.SubprocessError) as exc:
        host_state = "has no sigstore" if program else "is not installed"
        raise NoSigstoreSkopeoError(
            f"this host's skopeo {host_state}, and Debian trixie's could not be made "
            f"into {SKOPEO_IMAGE}: {str(exc)[-300:]}"
        ) from exc
    return Skopeo("skopeo", f"Debian trixie's skopeo in {SKOPEO_IMAGE}", image)


def host_skopeo_has_sigstore(skopeo: Skopeo) -> bool:
    """Sign a tiny `dir:` image with a fresh key in cosign's format, then copy it under a
    policy requiring that key's sigstore signature: both succeed only where sigstore is
    built in (Debian 12's skopeo refuses the first, "sigstore disabled")."""
    with tempfile.TemporaryDirectory(prefix="skopeo-probe-") as tmp:
        work = Path(tmp)
        write_dir_image(work / "image")
        key = write_key_files(work, "probe-passphrase")
        anything = accept_anything_policy(work / "anything.json")
        source, dest = f"dir:{work / 'image'}", f"dir:{work / 'signed'}"
        signed = sign_copy(skopeo, key, anything, source, dest, "--sign-identity", _PROBE_NAME)
        identity = {"type": "exactReference", "dockerReference": _PROBE_NAME}
        policy = sigstore_policy(work / "policy.json", key.public, {}, identity)
        source, dest = f"dir:{work / 'signed'}", f"dir:{work / 'copy'}"
        copied = skopeo.run("--policy", str(policy), "copy", source, dest, paths=[work])
    return signed.returncode == 0 and copied.returncode == 0


def write_key_files(directory: Path, passphrase: str) -> KeyFiles:
    """A fresh key pair (as `sparkbuild keys generate` makes it) and its passphrase file."""
    private_pem, public_pem = keys.generate(passphrase.encode())
    files = KeyFiles(directory / "cosign.key", directory / "cosign.pub", directory / "pass")
    keys.write_new(files.private, private_pem, 0o600)
    files.public.write_bytes(public_pem)
    keys.write_new(files.passphrase, passphrase.encode(), 0o600)
    return files


def sign_copy(
    skopeo: Skopeo,
    key: KeyFiles,
    policy: Path,
    source: str,
    dest: str,
    *copy_args: str,
    registries: Path | None = None,
) -> subprocess.CompletedProcess[str]:
    """`skopeo copy` signing the copy with ``key``'s sigstore (cosign-format) private key;
    ``registries`` is a registries.d directory (where to store the signature)."""
    options = ["--policy", str(policy)]
    if registries is not None:
        options += ["--registries.d", str(registries)]
    sign = ["--sign-by-sigstore-private-key", str(key.private)]
    sign += ["--sign-passphrase-file", str(key.passphrase)]
    paths = [policy.parent, key.private.parent, key.passphrase.parent]
    paths += [Path(r.removeprefix("dir:")).parent for r in (source, dest) if r.startswith("dir:")]
    paths += [registries] if registries is not None else []
    return skopeo.run(*options, "copy", *sign, *copy_args, source, dest, paths=paths)


def sigstore_policy(
    path: Path,
    public: Path,
    transports: Mapping[str, Mapping[str, Sequence[Mapping[str, str]]]],
    identity: dict[str, str] | None = None,
) -> Path:
    """A containers-policy.json requiring a sigstore signature by ``public`` by default (for
    ``identity``, else the image's own repository), with ``transports`` (transport -> scope
    -> requirements) as given."""
    requirement = {
        "type": "sigstoreSigned",
        "keyPath": str(public),
        "signedIdentity": identity or {"type": "matchRepository"},
    }
    path.write_text(json.dumps({"default": [requirement], "transports": transports}))
    return path


def accept_anything_policy(path: Path) -> Path:
    """A containers-policy.json that accepts every image (for copies that only sign)."""
    path.write_text(json.dumps({"default": [{"type": "insecureAcceptAnything"}]}))
    return path


def skopeo_image() -> str:
    """`SKOPEO_IMAGE` in the local Docker engine: trixie minbase with skopeo, imported once."""
    cli = docker_cli()
    with FileLock(str(shared_test_cache() / "skopeo-trixie-image.lock")):
        present = subprocess.run(
            [cli, "image", "inspect", SKOPEO_IMAGE], capture_output=True, check=False
        )
        if present.returncode == 0:
            return SKOPEO_IMAGE
        rootfs = debian_arm64_rootfs(TRIXIE_PACKAGES, "amd64", suite="trixie", mirror=TRIXIE_MIRROR)
        imported = subprocess.run(
            [cli, "import", "--change", f"LABEL {_LABEL}", str(rootfs), SKOPEO_IMAGE],
            capture_output=True,
            text=True,
            check=False,
            timeout=600,
        )
    if imported.returncode != 0:
        raise AssertionError(f"docker import of {rootfs} failed: {imported.stderr}")
    return SKOPEO_IMAGE


def write_dir_image(path: Path) -> None:
    """A one-layer image in skopeo's `dir:` layout (blobs named by their hex digest)."""
    path.mkdir()
    layer_tar = io.BytesIO()
    with tarfile.open(fileobj=layer_tar, mode="w"):
        pass
    layer = gzip.compress(layer_tar.getvalue(), mtime=0)
    diff_id = "sha256:" + hashlib.sha256(layer_tar.getvalue()).hexdigest()
    config = json.dumps(
        {
            "architecture": "amd64",
            "os": "linux",
            "rootfs": {"type": "layers", "diff_ids": [diff_id]},
        }
    ).encode()
    manifest = {
        "schemaVersion": 2,
        "mediaType": "application/vnd.oci.image.manifest.v1+json",
        "config": _descriptor(path, "application/vnd.oci.image.config.v1+json", config),
        "layers": [_descriptor(path, "application/vnd.oci.image.layer.v1.tar+gzip", layer)],
    }
    (path / "manifest.json").write_text(json.dumps(manifest))
    (path / "version").write_text("Directory Transport Version: 1.1\n")


def _descriptor(directory: Path, media_type: str, data: bytes) -> dict[str, object]:
    """Store ``data`` as a `dir:` blob and describe it."""
    hex_digest = hashlib.sha256(data).hexdigest()
    (directory / hex_digest).write_bytes(data)
    return {"mediaType": media_type, "digest": f"sha256:{hex_digest}", "size": len(data)}
