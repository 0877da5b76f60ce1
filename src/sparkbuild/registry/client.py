"""A small client for the registry HTTP API v2: manifests by tag or digest, nothing else.

Layers travel through the docker daemon's push; everything after that (checking a tag,
moving an alias) is a manifest GET/HEAD/PUT here, so an alias is re-pointed without moving a
byte of layer data and keeps the exact digest. Handles Basic and Bearer (token service)
challenges, retries transient failures with tenacity, and names the URL when it gives up.
"""

from __future__ import annotations

import re
from typing import Any, NoReturn

import requests
from tenacity import RetryError, Retrying, retry_if_exception_type

from sparkbuild import imageref, jsontext, net, retries
from sparkbuild.console import clipped, plural
from sparkbuild.errors import (
    CredentialsRejectedError,
    RegistryError,
    RegistryUnreachableError,
)
from sparkbuild.registry.address import (
    DIGEST,
    Manifest,
    PutManifest,
    Registry,
    checked_reference,
    checked_repository,
    sha256_digest,
)
from sparkbuild.registry.credentials import PASSWORD_ENV, USER_ENV, Credentials
from sparkbuild.settings import env_seconds

MANIFEST_TYPES = (
    "application/vnd.oci.image.index.v1+json",
    "application/vnd.docker.distribution.manifest.list.v2+json",
    "application/vnd.oci.image.manifest.v1+json",
    "application/vnd.docker.distribution.manifest.v2+json",
)
#: The whole of one exchange with the registry or its token service (each attempt).
TIMEOUT_ENV = "SPARKBUILD_NET_TIMEOUT"
_TIMEOUT_S = 60.0
#: distribution's own limit for a manifest; an image config is far smaller than a blob cap.
MANIFEST_LIMIT = 4 * net.MIB
BLOB_LIMIT = 16 * net.MIB
_CHALLENGE_PARAM = re.compile(r'(\w+)="([^"]*)"')


class _TransientError(Exception):
    """A 5xx/429 answer or a connection failure: worth another attempt."""

    def __init__(self, detail: str) -> None:
        super().__init__(detail)
        self.detail = detail


def _json_object(body: bytes) -> dict[str, object] | None:
    """``body`` as a JSON object, or None for anything else (garbage, a list, NaN)."""
    try:
        data = jsontext.loads(body)
    except ValueError:
        return None
    return data if isinstance(data, dict) else None


_ERRORS_SHOWN = 400  # characters of a registry's own error list an error message quotes


def _shown(body: bytes) -> str:
    """A few bytes of what a registry sent, printable, for an error message."""
    text = body[:80].decode(errors="replace")
    return repr("".join(c if c.isprintable() else "?" for c in text))


def _errors_of(response: requests.Response) -> str:
    """The registry's own error codes/messages (distribution's JSON error body)."""
    errors = (_json_object(response.content) or {}).get("errors")
    if isinstance(errors, list):
        parts = [
            f"{e.get('code', '?')}: {e.get('message', '')}".strip()
            for e in errors
            if isinstance(e, dict)
        ]
        if parts:  # the registry's text: a thousand errors make one bounded message
            return clipped("; ".join(parts), _ERRORS_SHOWN)
    return _shown(response.content) if response.content.strip() else str(response.reason)


def _challenge(response: requests.Response) -> tuple[str, dict[str, str]]:
    header = response.headers.get("WWW-Authenticate", "")
    scheme, _, params = header.partition(" ")
    return scheme.lower(), dict(_CHALLENGE_PARAM.findall(params))


class RegistryClient:
    def __init__(self, registry: Registry, credentials: Credentials) -> None:
        self.registry = registry
        self.credentials = credentials
        self._session = net.Session(
            deadline_s=env_seconds(TIMEOUT_ENV, _TIMEOUT_S), max_body=MANIFEST_LIMIT
        )
        self._session.headers["User-Agent"] = "sparkbuild"
        self._basic = False
        self._tokens: dict[str, str] = {}

    # --- transport -----------------------------------------------------------------------

    def _retrying(self) -> Retrying:
        return retries.retrying(retry_if_exception_type(_TransientError), default_attempts=5)

    def _raw(self, method: str, url: str, **kwargs: Any) -> requests.Response:
        """One HTTP exchange (bounded: see :mod:`sparkbuild.net`), retried while the registry
        is overloaded or does not answer; not when it cannot be reached at all (its name does
        not resolve, it refuses the connection), which is not asked again in this run."""
        earlier = retries.unreachable(url)
        if earlier is not None:
            raise self._unreachable(method, url, earlier, again=True)
        try:
            for attempt in self._retrying():
                with attempt:
                    try:
                        response = self._session.request(method, url, **kwargs)
                    except net.DeadlineExceeded as exc:
                        raise _TransientError(str(exc)) from None
                    except (requests.ConnectionError, requests.Timeout) as exc:
                        cause = retries.unreachable_cause(str(exc))
                        if cause is not None:
                            retries.remember_unreachable(url, cause)
                            raise self._unreachable(method, url, cause, again=False) from None
                        raise _TransientError(type(exc).__name__) from None
                    except requests.RequestException as exc:  # too large, a foreign redirect
                        raise RegistryError(
                            f"registry {self.registry.host}: {exc}",
                            "check the --registry address; do not publish through a server "
                            "that answers this way",
                        ) from None
                    if response.status_code >= 500 or response.status_code == 429:
                        raise _TransientError(f"HTTP {response.status_code} {response.reason}")
                    return response
        except RetryError as exc:
            last = exc.last_attempt.exception()
            detail = last.detail if isinstance(last, _TransientError) else str(last)
            raise RegistryUnreachableError(
                f"registry unreachable: {method} {url} failed "
                f"{plural(exc.last_attempt.attempt_number, 'time')} (last: {detail})",
                "check the --registry address and your network; the registry may be down "
                "(SPARKBUILD_NET_ATTEMPTS sets the number of attempts)",
            ) from None
        raise AssertionError("unreachable")  # pragma: no cover - Retrying always returns/raises

    def _unreachable(
        self, method: str, url: str, cause: str, *, again: bool
    ) -> RegistryUnreachableError:
        when = "found earlier in this run; not asked again" if again else "not retried"
        host = self.registry.host
        return RegistryUnreachableError(
            f"registry unreachable: {method} {url}: {host} {cause} ({when})",
            "check the --registry address and this host's network and DNS",
            url=url,
            cause=f"{host} {cause}",
        )

    def _auth_headers(self, scope: str) -> dict[str, str]:
        token = self._tokens.get(scope)
        return {"Authorization": f"Bearer {token}"} if token else {}

    def _request(  # noqa: PLR0913 - one HTTP request's options, each by name
        self,
        method: str,
        path: str,
        *,
        repository: str | None,
        push: bool = False,
        headers: dict[str, str] | None = None,
        data: bytes | None = None,
        max_body: int = MANIFEST_LIMIT,
        redirects: net.Redirects = "same-host",
        params: dict[str, str] | None = None,
        url: str | None = None,
    ) -> requests.Response:
        if repository is not None:
            checked_repository(repository)
        url = url or f"{self.registry.api_base}/v2/{path}"
        scope = f"repository:{repository}:{'pull,push' if push else 'pull'}" if repository else ""
        for attempt in range(2):
            response = self._raw(
                method,
                url,
                headers={**(headers or {}), **self._auth_headers(scope)},
                data=data,
                params=params,
                auth=self._basic_auth(),
                max_body=max_body,
                redirects=redirects,
            )
            if response.status_code != 401:
                return self._check_denied(response, repository, push)
            if attempt == 1:
                break
            # Answer the challenge (a cached token may have expired: fetch a fresh one).
            scheme, params = _challenge(response)
            if scheme == "basic":
                self._need_credentials()
                self._basic = True
            elif scheme == "bearer":
                self._tokens[scope] = self._fetch_token(params, scope)
            else:
                raise RegistryError(
                    f"registry {self.registry.host} asks for unsupported authentication "
                    f"'{scheme or '?'}'"
                )
        self._rejected()

    def _basic_auth(self) -> tuple[str, str] | None:
        creds = self.credentials
        if self._basic and creds.username and creds.password:
            return (creds.username, creds.password)
        return None

    def _need_credentials(self) -> None:
        if self.credentials.anonymous or not self.credentials.username:
            raise CredentialsRejectedError(
                f"registry {self.registry.host} requires credentials and none were found",
                f"`docker login {self.registry.host}`, or set {USER_ENV} and {PASSWORD_ENV} "
                "(or pipe the password to --password-stdin)",
            )

    def _rejected(self) -> NoReturn:
        raise CredentialsRejectedError(
            f"registry {self.registry.host} rejected the credentials "
            f"({self.credentials.describe()})",
            f"check the user name and password/token; `docker login {self.registry.host}` or "
            f"{USER_ENV} / {PASSWORD_ENV} set them (the password is never shown)",
        )

    def _check_denied(
        self, response: requests.Response, repository: str | None, push: bool
    ) -> requests.Response:
        if response.status_code == 403:
            action = "push to" if push else "read"
            # repository None is the /v2/ version check: access to the registry itself
            what = repository or "this registry"
            raise RegistryError(
                f"registry {self.registry.host} denied access: {self.credentials.describe()} "
                f"may not {action} {what} ({_errors_of(response)})",
                "grant the account write access to the repository (for GHCR, a token with "
                "`write:packages`, or `packages: write` in the workflow)",
            )
        return response

    def _fetch_token(self, params: dict[str, str], scope: str) -> str:
        realm = params.get("realm")
        if not realm:
            raise RegistryError(
                f"registry {self.registry.host} sent a Bearer challenge without realm"
            )
        query = {"service": params.get("service", ""), "scope": scope or params.get("scope", "")}
        creds = self.credentials
        if creds.identity_token:
            form = {**query, "grant_type": "refresh_token", "refresh_token": creds.identity_token}
            response = self._raw(
                "POST", realm, data={**form, "client_id": "sparkbuild"}, redirects="none"
            )
        else:
            auth = (creds.username, creds.password) if creds.username and creds.password else None
            response = self._raw("GET", realm, params=query, auth=auth, redirects="none")
        if response.status_code in (401, 403):
            if creds.anonymous:
                self._need_credentials()
            self._rejected()
        if not response.ok:
            raise RegistryError(
                f"token service {realm} answered HTTP {response.status_code} "
                f"({_errors_of(response)})"
            )
        body = _json_object(response.content)
        token = body and (body.get("token") or body.get("access_token"))
        if not token or not isinstance(token, str):
            got = "no token" if body else f"not a JSON object: {_shown(response.content)}"
            raise RegistryError(f"token service {realm} returned {got}")
        return str(token)

    # --- API -----------------------------------------------------------------------------

    def check_access(self, repository: str, *, push: bool) -> None:
        """Authenticate now (and for a push, obtain a push token) so bad credentials fail
        before any layer moves."""
        response = self._request("GET", "", repository=None)
        if response.status_code == 404:
            raise RegistryError(
                f"{self.registry.api_base} is not a registry (no /v2/ endpoint)",
                "check the --registry address",
            )
        if push or self._tokens:
            # A token service may accept the login but refuse the repository scope.
            self.manifest_digest(repository, "sparkbuild-access-check", push=push)

    def manifest(
        self,
        repository: str,
        reference: str,
        *,
        push: bool = False,
        max_body: int = MANIFEST_LIMIT,
    ) -> Manifest | None:
        """The manifest ``repository:reference`` (tag or digest), or None when absent.

        Fetched by digest, its bytes must hash to that digest (else a RegistryError naming
        the registry, the digest and what came back): what is used is what was asked for.
        ``max_body`` caps what is read (a referrers index or a signature is far smaller
        than an image's manifest may be)."""
        reference = checked_reference(repository, reference)
        response = self._request(
            "GET",
            f"{repository}/manifests/{reference}",
            repository=repository,
            push=push,
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
            max_body=max_body,
        )
        if response.status_code == 404:
            return None
        self._expect_ok(response, f"GET manifest {repository}:{reference}")
        digest = sha256_digest(response.content)
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        if DIGEST.match(reference) and digest != reference:
            raise RegistryError(
                f"registry {self.registry.host} served {repository}@{reference} with other "
                f"bytes: {len(response.content)} bytes ({media_type or 'no media type'}) that "
                f"hash to {digest}",
                "the registry or a proxy in between altered the manifest; nothing was used or "
                "recorded; do not publish through it",
            )
        served = response.headers.get("Docker-Content-Digest")
        if served and served != digest:
            raise RegistryError(
                f"registry served manifest {repository}:{reference} with digest {served}, but "
                f"its bytes hash to {digest}",
                "the registry or a proxy in between altered the manifest; do not publish "
                "through it",
            )
        body = _json_object(response.content)
        if body is None:
            raise RegistryError(
                f"registry {self.registry.host} served manifest {repository}:{reference} as "
                f"{len(response.content)} bytes that are not a JSON object: "
                f"{_shown(response.content)}",
                "check the --registry address: it may not be a container registry",
            )
        if media_type not in MANIFEST_TYPES:
            media_type = str(body.get("mediaType") or media_type)
        return Manifest(response.content, media_type, digest)

    def manifest_digest(self, repository: str, reference: str, *, push: bool = False) -> str | None:
        """The digest ``repository:reference`` resolves to now, or None when absent."""
        reference = checked_reference(repository, reference)
        response = self._request(
            "HEAD",
            f"{repository}/manifests/{reference}",
            repository=repository,
            push=push,
            headers={"Accept": ", ".join(MANIFEST_TYPES)},
        )
        if response.status_code == 404:
            return None
        self._expect_ok(response, f"HEAD manifest {repository}:{reference}")
        served = response.headers.get("Docker-Content-Digest")
        if served:
            return served
        manifest = self.manifest(repository, reference, push=push)
        return manifest.digest if manifest else None

    def put_manifest(self, repository: str, tag: str, manifest: Manifest) -> str:
        """Point ``repository:tag`` at ``manifest`` (same bytes, so the same digest)."""
        if not imageref.TAG.match(tag):
            raise RegistryError(
                f"{tag!r} is not a tag (in {repository})",
                "a tag is letters, digits, '_', '.', '-', at most 128 characters",
            )
        response = self._request(
            "PUT",
            f"{repository}/manifests/{tag}",
            repository=repository,
            push=True,
            headers={"Content-Type": manifest.media_type},
            data=manifest.body,
        )
        self._expect_ok(response, f"PUT manifest {repository}:{tag}")
        served = response.headers.get("Docker-Content-Digest") or manifest.digest
        if served != manifest.digest:
            raise RegistryError(
                f"registry stored {repository}:{tag} as {served}, expected {manifest.digest}",
                "the registry rewrote the manifest; the alias does not point at the published "
                "image",
            )
        return served

    def put_manifest_bytes(
        self, repository: str, reference: str, media_type: str, body: bytes
    ) -> PutManifest:
        """PUT ``body`` as ``repository:reference`` (a tag, or its own digest); what the
        registry stored, and the ``OCI-Subject`` it answered with (a registry that serves
        the referrers API names the subject it indexed)."""
        reference = checked_reference(repository, reference)
        digest = sha256_digest(body)
        if DIGEST.match(reference) and reference != digest:
            raise RegistryError(f"manifest bytes hash to {digest}, not {reference}")
        response = self._request(
            "PUT",
            f"{repository}/manifests/{reference}",
            repository=repository,
            push=True,
            headers={"Content-Type": media_type},
            data=body,
        )
        self._expect_ok(response, f"PUT manifest {repository}:{reference}")
        served = response.headers.get("Docker-Content-Digest") or digest
        if served != digest:
            raise RegistryError(
                f"registry stored {repository}:{reference} as {served}, expected {digest}",
                "the registry rewrote the manifest; do not publish through it",
            )
        return PutManifest(digest, response.headers.get("OCI-Subject"))

    def blob_exists(self, repository: str, digest: str, *, push: bool = False) -> bool:
        response = self._request(
            "HEAD",
            f"{repository}/blobs/{checked_reference(repository, digest)}",
            repository=repository,
            push=push,
            redirects="content",
        )
        if response.status_code == 404:
            return False
        self._expect_ok(response, f"HEAD blob {repository}@{digest}")
        return True

    def put_blob(self, repository: str, data: bytes) -> str:
        """Upload ``data`` (small: a payload, an envelope, a config) in one request; its
        digest. Nothing is sent when the registry already holds it."""
        digest = sha256_digest(data)
        if self.blob_exists(repository, digest, push=True):
            return digest
        started = self._request(
            "POST", f"{repository}/blobs/uploads/", repository=repository, push=True
        )
        self._expect_ok(started, f"POST blob upload {repository}")
        location = self._upload_location(started, repository)
        response = self._request(
            "PUT",
            "",
            repository=repository,
            push=True,
            headers={"Content-Type": "application/octet-stream"},
            data=data,
            params={"digest": digest},
            url=location,
        )
        self._expect_ok(response, f"PUT blob {repository}@{digest}")
        return digest

    def _upload_location(self, response: requests.Response, repository: str) -> str:
        """Where the upload goes on: the registry's own address, never another host."""
        location = response.headers.get("Location", "")
        if location.startswith("/"):
            location = self.registry.api_base + location
        if not location.startswith(self.registry.api_base + "/"):
            raise RegistryError(
                f"registry {self.registry.host} sent the upload of {repository} elsewhere "
                f"({location[:80]!r})",
                "do not publish through a registry or proxy that redirects uploads",
            )
        return location

    def referrers(self, repository: str, digest: str, artifact_type: str) -> bytes | None:
        """The referrers API's index for ``digest`` (filtered by ``artifact_type`` where the
        registry filters), or None when the registry does not serve the API (404, or an
        answer that is not an index, as GHCR's redirect is)."""
        response = self._request(
            "GET",
            f"{repository}/referrers/{checked_reference(repository, digest)}",
            repository=repository,
            headers={"Accept": "application/vnd.oci.image.index.v1+json"},
            params={"artifactType": artifact_type},
            redirects="none",
        )
        media_type = response.headers.get("Content-Type", "").split(";")[0].strip()
        if response.status_code != 200 or media_type != "application/vnd.oci.image.index.v1+json":
            return None
        return response.content

    def _expect_ok(self, response: requests.Response, what: str) -> None:
        if not response.ok:
            raise RegistryError(
                f"{what} on {self.registry.host}: HTTP {response.status_code} "
                f"({_errors_of(response)})"
            )


def get_blob(
    client: RegistryClient, repository: str, digest: str, *, limit: int = BLOB_LIMIT
) -> bytes:
    """A small blob (an image config) by digest, checked against its digest.

    Registries hand blobs out from storage on other hosts (S3, a CDN): a redirect there is
    followed, without credentials, since the bytes are hashed anyway."""
    if not DIGEST.match(digest):
        checked_reference(repository, digest)
    response = client._request(
        "GET",
        f"{repository}/blobs/{digest}",
        repository=repository,
        max_body=limit,
        redirects="content",
    )
    client._expect_ok(response, f"GET blob {repository}@{digest}")
    got = sha256_digest(response.content)
    if got != digest:
        raise RegistryError(
            f"registry {client.registry.host} served blob {repository}@{digest} with other "
            f"bytes: {len(response.content)} bytes that hash to {got}",
            "the registry or a proxy in between altered it; do not build from it",
        )
    return response.content
