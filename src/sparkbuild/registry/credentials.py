"""Registry credentials: from the environment, stdin, or docker's own credential store.

Order: ``--password-stdin`` (user from ``--username`` or ``SPARKBUILD_REGISTRY_USER``), then
``SPARKBUILD_REGISTRY_USER`` + ``SPARKBUILD_REGISTRY_PASSWORD``, then what ``docker login``
stored (``$DOCKER_CONFIG/config.json`` or ``~/.docker/config.json``, including
``credsStore`` / ``credHelpers`` helpers), else anonymous. The secret is never part of a
repr, and every secret found is registered with the run's :class:`Redactor`.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import docker.auth
import docker.errors

from sparkbuild.errors import CredentialStoreError, UsageError
from sparkbuild.redact import Redactor

USER_ENV = "SPARKBUILD_REGISTRY_USER"
PASSWORD_ENV = "SPARKBUILD_REGISTRY_PASSWORD"


@dataclass(frozen=True)
class Credentials:
    source: str  # where they came from, safe to print
    username: str | None = None
    password: str | None = field(default=None, repr=False)
    identity_token: str | None = field(default=None, repr=False)

    @property
    def anonymous(self) -> bool:
        return not self.password and not self.identity_token

    def secrets(self) -> list[str]:
        return [s for s in (self.password, self.identity_token) if s]

    def redactor(self) -> Redactor:
        return Redactor(self.secrets(), usernames=[self.username] if self.username else [])

    def daemon_auth(self, server: str) -> dict[str, str] | None:
        """The ``auth_config`` the docker daemon's push endpoint takes."""
        if self.identity_token:
            return {"identitytoken": self.identity_token, "serveraddress": server}
        if self.username and self.password:
            return {"username": self.username, "password": self.password, "serveraddress": server}
        return None

    def describe(self) -> str:
        who = f"user {self.username}" if self.username else "identity token"
        return "anonymous" if self.anonymous else f"{who} from {self.source}"


def from_docker_config(registry_host: str) -> Credentials | None:
    try:
        config = docker.auth.load_config()
        entry: dict[str, object] | None = config.resolve_authconfig(registry_host)
    except docker.errors.DockerException as exc:
        # The helper's own message can quote what it was given; keep only the helper's name.
        raise CredentialStoreError(
            f"docker's credential store failed for {registry_host} ({type(exc).__name__})",
            "check the `credsStore`/`credHelpers` helper in your docker config, or set "
            f"{USER_ENV} and {PASSWORD_ENV}",
        ) from None
    if not entry:
        return None
    source = "docker config"
    # The SDK answers 'Username' from a credential helper and 'username' from config.json.
    fields = {str(key).lower(): value for key, value in entry.items()}
    if fields.get("identitytoken"):
        return Credentials(source, identity_token=str(fields["identitytoken"]))
    username, password = fields.get("username"), fields.get("password")
    if username and password:
        return Credentials(source, username=str(username), password=str(password))
    return None


def resolve(
    registry_host: str, *, username: str | None = None, password_stdin: str | None = None
) -> Credentials:
    """The credentials for ``registry_host`` (e.g. ``ghcr.io``, ``127.0.0.1:5000``)."""
    env_user = os.environ.get(USER_ENV) or None
    env_password = os.environ.get(PASSWORD_ENV) or None
    if password_stdin is not None:
        user = username or env_user
        secret = password_stdin.rstrip("\r\n")
        if not user:
            raise UsageError(
                "--password-stdin needs a user name",
                f"pass --username NAME or set {USER_ENV}",
            )
        if not secret:
            raise UsageError("--password-stdin: nothing was read from stdin")
        return Credentials("--password-stdin", username=user, password=secret)
    if env_password:
        user = username or env_user
        if not user:
            raise UsageError(f"{PASSWORD_ENV} is set but {USER_ENV} is not")
        return Credentials("environment", username=user, password=env_password)
    stored = from_docker_config(registry_host)
    if stored is not None:
        return stored
    return Credentials("nowhere (anonymous)")
