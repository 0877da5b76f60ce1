"""A registry's address (``--registry HOST[/NAMESPACE]``), the names and references that
go into its URLs, checked, and the manifests that travel through :mod:`.client`."""

from __future__ import annotations

import hashlib
import ipaddress
import json
import re
from dataclasses import dataclass

from sparkbuild import console, imageref
from sparkbuild.errors import RegistryError, UsageError
from sparkbuild.redact import redact, remember, strip_userinfo
from sparkbuild.registry.credentials import PASSWORD_ENV, USER_ENV

_DOCKER_HUB_API = "registry-1.docker.io"
# HOST[:PORT]: DNS labels joined by dots, or a bracketed IPv6 address; nothing else (no space,
# path, userinfo or second colon ends up as the registry's host, its lock key or a URL).
_LABEL = r"[A-Za-z0-9](?:[A-Za-z0-9-]*[A-Za-z0-9])?"
_HOST = re.compile(rf"(?:{_LABEL}(?:\.{_LABEL})*|\[[0-9A-Fa-f:.]+\])(?::(?P<port>[0-9]{{1,5}}))?\Z")
DIGEST = re.compile(r"^sha256:[0-9a-f]{64}\Z")


def _is_loopback(host: str) -> bool:
    name = host.rsplit(":", 1)[0] if host.count(":") == 1 else host
    name = name.strip("[]")
    if name == "localhost":
        return True
    try:
        return ipaddress.ip_address(name).is_loopback
    except ValueError:
        return False


def _check_host(value: str, host: str) -> None:
    match = _HOST.match(host)
    if match is None or int(match.group("port") or 1) not in range(1, 65536):
        raise UsageError(
            f"--registry {value!r}: {host!r} is not a registry host",
            "give HOST[:PORT] (a name, an IPv4 address or [IPv6], a port 1-65535), then "
            "the namespace: --registry ghcr.io/my-org or --registry 127.0.0.1:5000",
        )


@dataclass(frozen=True)
class Registry:
    """Where to publish: ``--registry HOST[/NAMESPACE]``, e.g. ``ghcr.io/acme``."""

    host: str
    namespace: str
    scheme: str

    @classmethod
    def parse(cls, value: str) -> Registry:
        text = value.strip().rstrip("/")
        scheme = None
        for prefix in ("https://", "http://"):
            if text.startswith(prefix):
                scheme, text = prefix[:-3], text[len(prefix) :]
        first, _, rest = text.partition("/")
        userinfo, at, first = first.rpartition("@")
        if at:  # user:pass@host: never part of the host, the lock's key or a message
            remember(userinfo.partition(":")[2])
            console.warn(
                f"--registry: the credentials in {redact(value)!r} are ignored; give them with "
                f"{USER_ENV} and {PASSWORD_ENV}, --password-stdin or `docker login`"
            )
            value = strip_userinfo(value)
            text = f"{first}/{rest}" if rest else first
        if "." in first or ":" in first or first == "localhost":
            host, namespace = first, rest
        else:  # `docker push user/x` means Docker Hub
            host, namespace = imageref.DOCKER_HUB, text
        for component in filter(None, namespace.split("/")):
            if not imageref.COMPONENT.match(component):
                raise UsageError(
                    f"--registry {value!r}: '{component}' is not a valid repository path "
                    "component (lowercase letters, digits, '.', '_', '-')",
                    "for example: --registry ghcr.io/my-org",
                )
        if not host:
            raise UsageError(f"--registry {value!r} names no registry host")
        _check_host(value, host)
        return cls(
            host, namespace.strip("/"), scheme or ("http" if _is_loopback(host) else "https")
        )

    @property
    def api_base(self) -> str:
        host = _DOCKER_HUB_API if self.host == imageref.DOCKER_HUB else self.host
        return f"{self.scheme}://{host}"

    def repository(self, name: str) -> str:
        """The repository path inside the registry, e.g. ``acme/sparkbuild/sglang``."""
        path = f"{self.namespace}/{name}" if self.namespace else name
        for component in path.split("/"):
            if not imageref.COMPONENT.match(component):
                raise UsageError(
                    f"repository '{path}': '{component}' is not a valid path component",
                    "repository names are lowercase letters, digits, '.', '_', '-', "
                    "separated by '/'",
                )
        return path

    def reference(self, repository: str) -> str:
        """``HOST/REPOSITORY``: what docker and users call it."""
        return f"{self.host}/{repository}"


@dataclass(frozen=True)
class Manifest:
    body: bytes
    media_type: str
    digest: str

    @property
    def config_digest(self) -> str | None:
        """The image config digest (= the local image id) of a single-image manifest."""
        try:
            data = json.loads(self.body)
        except ValueError:
            return None
        config = data.get("config") if isinstance(data, dict) else None
        digest = config.get("digest") if isinstance(config, dict) else None
        return str(digest) if digest else None


@dataclass(frozen=True)
class PutManifest:
    digest: str
    subject: str | None  # the OCI-Subject header: the registry indexed a referrer


def checked_reference(repository: str, reference: str) -> str:
    """``reference`` if it is a tag or a sha256 digest: what may go into a manifest URL (a
    digest or alias read from a lock or an index is data, never a path)."""
    if DIGEST.match(reference) or imageref.TAG.match(reference):
        return reference
    raise RegistryError(
        f"{reference!r} is neither a tag nor a sha256 digest (in {repository})",
        "a tag is letters, digits, '_', '.', '-'; a digest is sha256: and 64 hex digits",
    )


def checked_repository(repository: str) -> str:
    """``repository`` if each path component is one the distribution grammar allows (no
    ``..``, no empty part): it goes into URLs."""
    if all(imageref.COMPONENT.match(part) for part in repository.split("/")):
        return repository
    raise RegistryError(
        f"{repository!r} is not a repository path",
        "repository names are lowercase letters, digits, '.', '_', '-', separated by '/'",
    )


def sha256_digest(data: bytes) -> str:
    return "sha256:" + hashlib.sha256(data).hexdigest()
