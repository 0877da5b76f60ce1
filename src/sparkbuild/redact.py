"""The one redaction: secrets kept out of everything sparkbuild prints or records.

Every printer (the consoles, JSON, Markdown, CSV, the engine log file) and every record (the
lock's addresses and labels, bench reports) passes its text through :func:`redact`. It masks
with ``***``:

- the userinfo of an address, with or without a scheme (``https://user:token@host``,
  ``user:token@host``; a bare login such as ``ssh://git@host`` is not a secret);
- credentials in a query string (``?access_token=``, ``&sig=``, ``X-Amz-Signature=``, ...);
- ``Authorization: Basic/Bearer …`` headers and ``password: …``/``token=…`` pairs, as
  registries and daemons echo them;
- every secret the run knows (a registry password from the environment, stdin or docker's
  credential store, registered with :func:`remember`; the value of every environment
  variable with a secret's name), in its usual encodings;
- the value of a secret's name (:func:`is_secret_name`: ``*_TOKEN``, ``*_KEY``,
  ``*_SECRET*``, ``*PASSWORD*``) in ``NAME=value`` and ``NAME: value``, and of an
  ``--api-key``-style flag (``--api-key VALUE``, ``--api-key=VALUE``); argument lists and
  environments that are kept as lists and mappings go through :func:`secret_args` and
  :func:`secret_env`, the same names.

One list of names serves every output: the terminal, the logs, JSON, CSV, the lock, the
report and arena submissions. What follows a name is masked only when it is a value, never a
word of our own messages (``NAME: refers to ...``, ``--api-key KEY``).

Addresses kept as keys or in records (a registry host, a repository URL in the lock) have
their userinfo removed instead (:func:`strip_userinfo`), so what is stored still works.
"""

from __future__ import annotations

import base64
import os
import re
import urllib.parse
from collections.abc import Iterable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from pathlib import Path

from sparkbuild import fileio
from sparkbuild.errors import SparkbuildError

MASK = "***"
# Shorter strings would mask ordinary words; no registry accepts a password this short.
MIN_SECRET_LENGTH = 4
REGISTRY_PASSWORD_ENV = "SPARKBUILD_REGISTRY_PASSWORD"
# Secrets a run may hold in its environment: masked wherever they appear, known or not.
SECRET_ENV = (
    REGISTRY_PASSWORD_ENV,
    "HF_TOKEN",
    "HUGGING_FACE_HUB_TOKEN",
    "SPARKBUILD_SIGNING_PASSWORD",  # the signing key's passphrase (sparkbuild.attest.keys)
    "SPARKBUILD_SIGNING_KEY",  # the signing key's PEM text
)
# A secret's name, as an environment variable or a flag spells it (upper case, ``-`` and
# ``.`` read as ``_``): *_TOKEN, *_KEY, *_SECRET*, *PASSWORD* (and their spellings).
_SECRET_VARIABLE = re.compile(
    r"(?:\A|_)(?:TOKEN|APIKEY|CREDENTIALS?)\Z|_KEY\Z|(?:\A|_)SECRET|PASSWORD|PASSWD|ACCESS_KEY"
)
# A flag's value is a secret only for the engines' own kinds (--api-key, --hf-token,
# --admin-password): sparkbuild's --sign-key and --tlskey take the path of a key file.
_SECRET_FLAG = re.compile(r"(?:\A|_)(?:TOKEN|API_?KEY|ACCESS_KEY|SECRET(?:_KEY)?|PASSWO?R?D)\Z")
# A value found by its name alone (no variable we know) is masked from this length on: a
# name like DEBUG_KEY=true must not mask "true" wherever it is written.
MIN_NAMED_SECRET_LENGTH = 8

# scheme://userinfo@ : userinfo ends at the last '@' before the path, query or fragment.
_SCHEME_USERINFO = re.compile(r"(?i)\b([a-z][a-z0-9+.-]*://)([^/?#\s'\"<>]+)@")
# user:secret@host with no scheme, where a word starts; not ``name:tag@sha256:…``.
_BARE_USERINFO = re.compile(
    r"(?:^|(?<=[\s'\"=(<,\[{]))[\w.%+~-]+:[^\s/'\"<>]+@(?=[\w\[])(?![a-z0-9]+:[0-9a-f]{32,})",
    re.M,
)
_SECRET_NAME = (
    r"(?:[\w.-]*[_.-])?(?:access[_-]?token|refresh[_-]?token|id[_-]?token|token|sig|signature"
    r"|password|passwd|pwd|secret|api[_-]?key|apikey|key|auth|authorization|credentials?"
    r"|session(?:[_-]?id)?)"
)
_QUERY_SECRET = re.compile(rf"(?i)([?&;]{_SECRET_NAME}=)([^&#\s'\"<>]+)")
_AUTH_HEADER = re.compile(r"(?i)\b(authorization\s*[:=]\s*(?:basic|bearer)\s+)[^\s\"',}]+")
# A credential has a digit somewhere; "basic implementation-specific" is prose.
_SCHEME_TOKEN = re.compile(
    r"(?i)\b((?:basic|bearer)\s+)(?=[A-Za-z._~+/=-]*\d)[A-Za-z0-9._~+/=-]{16,}"
)
_KEY_VALUE = re.compile(
    r"(?i)(?<![\w-])([\"']?(?:[a-z0-9]+[_-])?(?:password|passwd|secret|token|identitytoken|auth)"
    r"[\"']?\s*[:=]\s*[\"']?)(?!\*\*\*)([^\s\"',}&]+)"
)
# What follows ``NAME_TOKEN`` that is no value: a reference to a variable (``${HF_TOKEN}``,
# ``$HF_TOKEN``), or, after ``: `` (prose, not ``key=value``), a lowercase word of our own
# messages ("env HF_TOKEN: refers to the shell's environment"). A secret the run knows is
# masked whatever its shape (:func:`_mask_forms`).
_REFERENCE = re.compile(r"\$\{?[A-Za-z_][A-Za-z0-9_]*\}?")
# NAME=value, NAME: value (YAML, JSON, an engine echoing its environment), with the name's
# quotes; and --flag VALUE / --flag=VALUE. The callbacks decide by the name.
_NAMED_VALUE = re.compile(
    r"(?<![\w.-])([\"']?([A-Za-z][A-Za-z0-9_.-]*)[\"']?\s*[:=]\s*[\"']?)(?!\*\*\*)([^\s\"',}&]+)"
)
_FLAG_VALUE = re.compile(r"(?<![\w-])(--([A-Za-z][A-Za-z0-9_-]*)(?:=|\s+))(?![-*])([^\s\"',}]+)")
# A placeholder in a hint (--api-key KEY, API_KEY=VALUE), not a value.
_PLACEHOLDER = re.compile(r"[A-Z][A-Z_]*")
_PROSE_WORD = re.compile(r"[a-z]+[.,;!?)]*")
_PROSE_SEPARATOR = re.compile(r":\s+\Z")

_known: set[str] = set()


def _variants(secret: str) -> set[str]:
    """The secret as it may appear after quoting or encoding."""
    forms = {secret, urllib.parse.quote(secret, safe=""), urllib.parse.quote_plus(secret)}
    forms.add(base64.b64encode(secret.encode()).decode())
    return {form for form in forms if len(form) >= MIN_SECRET_LENGTH}


def _is_login(match: re.Match[str]) -> bool:
    """``ssh://git@host``: a login name, not a secret (a token needs ``user:token@``)."""
    return match.group(1).lower() == "ssh://" and ":" not in match.group(2)


def _shapes(text: str) -> str:
    """``text`` with everything shaped like a credential masked."""
    text = _SCHEME_USERINFO.sub(
        lambda m: m.group(0) if _is_login(m) else f"{m.group(1)}{MASK}@", text
    )
    text = _BARE_USERINFO.sub(f"{MASK}@", text)
    text = _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)
    text = _AUTH_HEADER.sub(lambda m: m.group(1) + MASK, text)
    text = _SCHEME_TOKEN.sub(lambda m: m.group(1) + MASK, text)
    text = _KEY_VALUE.sub(_masked_value, text)
    text = _NAMED_VALUE.sub(_masked_named, text)
    return _FLAG_VALUE.sub(_masked_flag, text)


def _masked_value(match: re.Match[str]) -> str:
    key, value = match.group(1), match.group(2)
    prose = _PROSE_SEPARATOR.search(key) and _PROSE_WORD.fullmatch(value)
    return match.group(0) if prose or _REFERENCE.fullmatch(value) else key + MASK


def _normal(name: str) -> str:
    return re.sub(r"[-.]", "_", name.lstrip("-")).upper()


def is_secret_name(name: str) -> bool:
    """Whether ``name`` (``NGC_API_KEY``, ``hf_token``, ``--api-key``) names a secret."""
    normal = _normal(name)
    return normal in SECRET_ENV or bool(_SECRET_VARIABLE.search(normal))


def is_secret_flag(flag: str) -> bool:
    """Whether the value of ``flag`` (``--api-key``, ``--hf-token``; not a key file's path
    as ``--sign-key`` takes) is a secret."""
    return flag.startswith("--") and bool(_SECRET_FLAG.search(_normal(flag)))


def secret_args(args: Sequence[str]) -> list[str]:
    """``args`` with the value of every secret flag masked (``--api-key V``, ``--api-key=V``)."""
    shown: list[str] = []
    for word in args:
        flag, equals, _ = word.partition("=")
        if shown and is_secret_flag(shown[-1]) and not word.startswith("-"):
            shown.append(MASK)
        elif equals and is_secret_flag(flag):
            shown.append(f"{flag}={MASK}")
        else:
            shown.append(redact(word))
    return shown


def secret_env(env: Mapping[str, str]) -> dict[str, str]:
    """``env`` with the value of every secret's name masked, the rest redacted as text."""
    return {k: MASK if is_secret_name(k) else redact(v) for k, v in env.items()}


def remember_secrets(args: Sequence[str], env: Mapping[str, str]) -> None:
    """Mask, from now on, the values ``args`` and ``env`` give secret flags and names (an
    engine's --api-key, a profile's NGC_API_KEY) wherever they are written."""
    for before, word in zip(["", *args], args, strict=False):
        flag, equals, value = word.partition("=")
        if equals and is_secret_flag(flag):
            remember(value)
        elif is_secret_flag(before) and not word.startswith("-"):
            remember(word)
    for name, value in env.items():
        if is_secret_name(name) and not _REFERENCE.fullmatch(value):
            remember(value)


def _is_value(separator: str, value: str) -> bool:
    """Whether ``value``, after a secret's name and ``separator``, is one: not a reference to
    a variable, not a placeholder, and (after ``: `` or a space) not a word of prose."""
    if _REFERENCE.fullmatch(value) or _PLACEHOLDER.fullmatch(value):
        return False
    prose_gap = not separator.strip() or bool(_PROSE_SEPARATOR.search(separator))
    return not (prose_gap and _PROSE_WORD.fullmatch(value))


def _masked_named(match: re.Match[str]) -> str:
    separator = match.string[match.end(2) : match.start(3)]
    if not is_secret_name(match.group(2)) or not _is_value(separator, match.group(3)):
        return match.group(0)
    return match.group(1) + MASK


def _masked_flag(match: re.Match[str]) -> str:
    separator = match.string[match.end(2) : match.start(3)]
    flag = "--" + match.group(2)
    if not is_secret_flag(flag) or not _is_value(separator, match.group(3)):
        return match.group(0)
    return match.group(1) + MASK


def _mask_forms(text: str, forms: Iterable[str]) -> str:
    # Longest first, so a secret's base64 form is masked before a substring of it.
    for form in sorted(forms, key=len, reverse=True):
        text = text.replace(form, MASK)
    return text


def _run_secrets() -> set[str]:
    forms = set(_known)
    for name, value in os.environ.items():
        shortest = MIN_SECRET_LENGTH if name in SECRET_ENV else MIN_NAMED_SECRET_LENGTH
        if len(value) >= shortest and is_secret_name(name):
            forms |= _variants(value)
    return forms


def redact(text: str, secrets: Iterable[str | None] = ()) -> str:
    """``text`` with every known secret (the run's, and ``secrets``) and everything shaped
    like a credential masked. What every printer and record goes through."""
    forms = _run_secrets()
    for secret in secrets:
        if secret and len(secret) >= MIN_SECRET_LENGTH:
            forms |= _variants(secret)
    return _shapes(_mask_forms(text, forms))


def write_redacted(path: Path, text: str, option: str) -> None:
    """A report file (Markdown, CSV, JSON) as every printer writes one: redacted; a full or
    read-only disk is an error naming ``option`` and the file."""
    fileio.write_output(path, redact(text), option)


def strip_userinfo(url: str) -> str:
    """The address without ``user:token@`` and with query secrets masked: what may be kept
    as a key or stored (lock, image labels) and still be used."""
    text = _SCHEME_USERINFO.sub(lambda m: m.group(0) if _is_login(m) else m.group(1), url)
    text = _BARE_USERINFO.sub("", text)
    return _QUERY_SECRET.sub(lambda m: m.group(1) + MASK, text)


def remember(secret: str | None) -> None:
    """Mask ``secret`` in everything this process prints or records from now on."""
    if secret and len(secret) >= MIN_SECRET_LENGTH:
        _known.update(_variants(secret))


def forget_all() -> None:
    """A new command starts with no remembered secrets (tests run many in one process)."""
    _known.clear()


class Redactor:
    """:func:`redact` with a set of secrets (and ``user:secret`` base64 pairs) of its own; the
    secrets are remembered for the rest of the run too."""

    def __init__(self, secrets: Iterable[str | None] = (), usernames: Iterable[str] = ()) -> None:
        self._forms: set[str] = set()
        self._usernames = [u for u in usernames if u]
        for secret in secrets:
            self.add(secret)

    def add(self, secret: str | None) -> None:
        if not secret or len(secret) < MIN_SECRET_LENGTH:
            return
        remember(secret)
        self._forms |= _variants(secret)
        for user in self._usernames:
            pair = f"{user}:{secret}"
            pairs = {pair, base64.b64encode(pair.encode()).decode()}
            self._forms |= pairs
            _known.update(pairs)

    def __call__(self, text: str) -> str:
        return _shapes(_mask_forms(text, self._forms | _run_secrets()))

    def error(self, exc: SparkbuildError) -> SparkbuildError:
        """A copy of ``exc`` (same class, same fields) with its message, hint and the text in
        its fields redacted."""
        return exc.rewritten(self)

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
