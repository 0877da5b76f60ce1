"""Keeping registry secrets out of everything sparkbuild prints.

Registry and daemon errors can echo what they were sent: an ``Authorization`` header, a
``user:password@host`` URL, the base64 ``auth`` blob of a docker config, a bearer token.
:class:`Redactor` replaces every known secret, and its usual encodings, with ``***``, and
also masks anything that looks like credentials even when the secret itself is not known.
"""

from __future__ import annotations

import base64
import re
import urllib.parse
from collections.abc import Iterable, Iterator
from contextlib import contextmanager

from sparkbuild.errors import SparkbuildError

MASK = "***"
# Shorter strings would mask ordinary words; no registry accepts a password this short.
MIN_SECRET_LENGTH = 4

_AUTH_HEADER = re.compile(r"(?i)\b(authorization\s*[:=]\s*(?:basic|bearer)\s+)[^\s\"',}]+")
_SCHEME_TOKEN = re.compile(r"(?i)\b((?:basic|bearer)\s+)[A-Za-z0-9._~+/=-]{16,}")
_URL_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)[^/\s:@]+:[^/\s@]+@")
_KEY_VALUE = re.compile(
    r"(?i)([\"']?(?:password|passwd|secret|token|access_token|identitytoken|auth)[\"']?"
    r"\s*[:=]\s*[\"']?)([^\s\"',}&]+)"
)


def _variants(secret: str) -> set[str]:
    """The secret as it may appear after quoting or encoding."""
    forms = {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    forms.add(base64.b64encode(secret.encode()).decode())
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


class Redactor:
    """Masks a set of secrets (and ``user:secret`` base64 pairs) in any text."""

    def __init__(self, secrets: Iterable[str | None] = (), usernames: Iterable[str] = ()) -> None:
        self._forms: set[str] = set()
        self._usernames = [u for u in usernames if u]
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | None) -> None:
        if not secret or len(secret) < MIN_SECRET_LENGTH:
            return
        self._forms |= _variants(secret)
        for user in self._usernames:
            pair = f"{user}:{secret}"
            self._forms |= {pair, base64.b64encode(pair.encode()).decode()}

    def __call__(self, text: str) -> str:
        # Longest first, so a secret's base64 form is masked before a substring of it.
        for form in sorted(self._forms, key=len, reverse=True):
            text = text.replace(form, MASK)
        text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)
        text = _SCHEME_TOKEN.sub(lambda m: m.group(1) + MASK, text)
        text = _URL_USERINFO.sub(lambda m: m.group(1) + MASK + "@", text)
        return _KEY_VALUE.sub(lambda m: m.group(1) + MASK, text)

    def error(self, exc: SparkbuildError) -> SparkbuildError:
        """A copy of ``exc`` (same class) with message and hint redacted."""
        clean = type(exc)(self(exc.message), self(exc.hint) if exc.hint else None)
        return clean

    @contextmanager
    def guard(self, what: str) -> Iterator[None]:
        """Re-raise any failure inside as a redacted SparkbuildError, its cause dropped so no
        traceback or chained exception can carry the secret further."""
        try:
            yield
        except SparkbuildError as exc:
            raise self.error(exc) from None
        except (KeyboardInterrupt, SystemExit, GeneratorExit):
            raise
        except Exception as exc:
            detail = self(f"{type(exc).__name__}: {exc}")
            raise SparkbuildError(f"{what} failed: {detail}") from None


def redact(text: str, secrets: Iterable[str | None]) -> str:
    return Redactor(secrets)(text)
