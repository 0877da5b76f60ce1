"""Signing keys in cosign's format: an ECDSA P-256 key pair, the private half encrypted.

The private key is a PEM block ``ENCRYPTED SIGSTORE PRIVATE KEY`` (cosign 1 wrote
``ENCRYPTED COSIGN PRIVATE KEY``; both are read) whose body is a JSON document: the scrypt
parameters and salt, the ``nacl/secretbox`` nonce, and the ciphertext of the key's PKCS #8
DER. The public key is a plain ``PUBLIC KEY`` PEM (SubjectPublicKeyInfo). That is what
``cosign generate-key-pair`` writes and ``cosign sign --key`` reads, so a key made by either
tool works in the other. The cryptography is the ``cryptography`` package's (EC keys,
scrypt) and PyNaCl's (secretbox); nothing is hand-rolled.

The private key and its passphrase are secrets: they are registered with the run's redaction
as soon as they are read, a key file that other users may read is refused, and no message
quotes either.
"""

from __future__ import annotations

import base64
import binascii
import hashlib
import os
import stat
import tempfile
from dataclasses import dataclass, field
from pathlib import Path

import nacl.exceptions
import nacl.secret
import nacl.utils
from cryptography.exceptions import UnsupportedAlgorithm
from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.hazmat.primitives.kdf.scrypt import Scrypt
from pydantic import BaseModel, ConfigDict, Field, ValidationError

from sparkbuild import console, fileio, jsontext
from sparkbuild.errors import (
    KeyPassphraseError,
    KeyPermissionsError,
    SigningKeyError,
    UsageError,
)
from sparkbuild.redact import remember

PRIVATE_PEM = "ENCRYPTED SIGSTORE PRIVATE KEY"
PRIVATE_PEM_TYPES = (PRIVATE_PEM, "ENCRYPTED COSIGN PRIVATE KEY")
PUBLIC_PEM = "PUBLIC KEY"
#: The private key's PEM text (as CI secrets hold it), or a file holding it.
KEY_ENV = "SPARKBUILD_SIGNING_KEY"
KEY_FILE_ENV = "SPARKBUILD_SIGNING_KEY_FILE"
PASSWORD_ENV = "SPARKBUILD_SIGNING_PASSWORD"
#: The public key that `verify`, `rollback`, smoke and bench check images against.
PUBLIC_KEY_ENV = "SPARKBUILD_PUBLIC_KEY"
PUBLIC_KEY_FILE = "cosign.pub"
# cosign's own parameters (go-securesystemslib's `encrypted` defaults).
SCRYPT_N, SCRYPT_R, SCRYPT_P = 32768, 8, 1
# A hostile key file must not make scrypt take gigabytes: 128 * N * r bytes at most 256 MiB.
_MAX_SCRYPT_MEMORY = 256 * 1024 * 1024
# Nor minutes before its passphrase is even checked: scrypt's work grows with N * r * p, and
# cosign's own parameters take about a second; a key may ask for four times that, no more
# (N=2^18 r=8 p=16, within the memory bound, took 52 s).
_MAX_SCRYPT_WORK = 4 * SCRYPT_N * SCRYPT_R * SCRYPT_P
_SALT_BYTES = 32
_KEY_FILE_LIMIT = 64 * 1024
_CURVE = "secp256r1"


class _Params(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    n: int = Field(alias="N", ge=2)
    r: int = Field(ge=1, le=64)
    p: int = Field(ge=1, le=16)


class _Kdf(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    params: _Params
    salt: str


class _Cipher(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)
    name: str
    nonce: str


class EncryptedKey(BaseModel):
    """The JSON body of cosign's encrypted private key."""

    model_config = ConfigDict(extra="forbid", strict=True)
    kdf: _Kdf
    cipher: _Cipher
    ciphertext: str


@dataclass(frozen=True)
class PrivateKey:
    """A decrypted signing key and where it came from (safe to print: a path or a variable)."""

    key: ec.EllipticCurvePrivateKey = field(repr=False)
    source: str

    @property
    def public(self) -> PublicKey:
        return PublicKey(self.key.public_key(), self.source)


@dataclass(frozen=True)
class PublicKey:
    key: ec.EllipticCurvePublicKey
    source: str

    def pem(self) -> bytes:
        return self.key.public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        )

    @property
    def fingerprint(self) -> str:
        """``sha256:`` of the key's DER: what the lock and messages name a key by."""
        der = self.key.public_bytes(
            serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo
        )
        return "sha256:" + hashlib.sha256(der).hexdigest()


# --- the PEM and JSON envelope -----------------------------------------------------------------


def _pem(kind: str, body: bytes) -> bytes:
    lines = base64.encodebytes(body).decode("ascii")
    return f"-----BEGIN {kind}-----\n{lines}-----END {kind}-----\n".encode("ascii")


def _unpem(text: bytes, kinds: tuple[str, ...], source: str) -> bytes:
    """The body of the first PEM block of one of ``kinds``; a SigningKeyError otherwise."""
    content = text.decode("ascii", errors="replace")
    for kind in kinds:
        begin, end = f"-----BEGIN {kind}-----", f"-----END {kind}-----"
        start = content.find(begin)
        stop = content.find(end, start + len(begin))
        if start >= 0 and stop > start:
            try:
                return base64.b64decode("".join(content[start + len(begin) : stop].split()))
            except binascii.Error:
                break
    raise SigningKeyError(
        f"{source} is not a cosign key (no valid {' or '.join(kinds)} PEM block)",
        "make one with `sparkbuild keys generate` (or `cosign generate-key-pair`)",
    )


def _b64(data: bytes) -> str:
    return base64.b64encode(data).decode("ascii")


def _unb64(text: str, what: str, source: str) -> bytes:
    try:
        return base64.b64decode(text, validate=True)
    except binascii.Error:
        raise SigningKeyError(f"{source}: the key's {what} is not base64") from None


def _derive(passphrase: bytes, salt: bytes, params: _Params) -> bytes:
    kdf = Scrypt(
        salt=salt, length=nacl.secret.SecretBox.KEY_SIZE, n=params.n, r=params.r, p=params.p
    )
    return kdf.derive(passphrase)


def encrypt(key: ec.EllipticCurvePrivateKey, passphrase: bytes) -> bytes:
    """``key`` as cosign's encrypted private key PEM."""
    der = key.private_bytes(
        serialization.Encoding.DER,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    params = _Params(N=SCRYPT_N, r=SCRYPT_R, p=SCRYPT_P)
    salt = os.urandom(_SALT_BYTES)
    nonce = nacl.utils.random(nacl.secret.SecretBox.NONCE_SIZE)
    box = nacl.secret.SecretBox(_derive(passphrase, salt, params))
    document = EncryptedKey(
        kdf=_Kdf(name="scrypt", params=params, salt=_b64(salt)),
        cipher=_Cipher(name="nacl/secretbox", nonce=_b64(nonce)),
        ciphertext=_b64(box.encrypt(der, nonce).ciphertext),
    )
    body = jsontext.dumps(document.model_dump(by_alias=True)).encode()
    return _pem(PRIVATE_PEM, body)


def _document(text: bytes, source: str) -> EncryptedKey:
    body = _unpem(text, PRIVATE_PEM_TYPES, source)
    try:
        document = EncryptedKey.model_validate(jsontext.loads(body))
    except (ValueError, ValidationError):
        raise SigningKeyError(
            f"{source}: the encrypted key is not cosign's JSON document (kdf, cipher, ciphertext)",
            "make a new key with `sparkbuild keys generate`",
        ) from None
    params = document.kdf.params
    if document.kdf.name != "scrypt" or document.cipher.name != "nacl/secretbox":
        raise SigningKeyError(
            f"{source}: unsupported key encryption {document.kdf.name}/{document.cipher.name} "
            "(cosign keys use scrypt and nacl/secretbox)"
        )
    why = _scrypt_problem(params)
    if why is not None:
        raise SigningKeyError(
            f"{source}: scrypt parameters N={params.n} r={params.r} p={params.p} are not a "
            f"cosign key's: {why}",
            "make a new key with `sparkbuild keys generate` (or `cosign generate-key-pair`)",
        )
    return document


def _scrypt_problem(params: _Params) -> str | None:
    """Why scrypt would not, or should not, run with ``params``: OpenSSL's own limits (it
    refuses them after the work is set up), and sparkbuild's bounds on memory and time."""
    n, r, p = params.n, params.r, params.p
    if n & (n - 1):
        return "N is not a power of two"
    if 128 * n * r > _MAX_SCRYPT_MEMORY:
        return "more than 256 MiB of memory"
    if r < 16 and n >= 1 << (16 * r):  # OpenSSL: N < 2^(128 r / 8)
        return f"N must be below 2^{16 * r} for r={r} (OpenSSL refuses it)"
    if n * r * p > _MAX_SCRYPT_WORK:
        return (
            f"N*r*p is {n * r * p}, more than four times cosign's own "
            f"(N={SCRYPT_N} r={SCRYPT_R} p={SCRYPT_P}): it would take minutes"
        )
    return None


def decrypt(text: bytes, passphrase: bytes, source: str) -> ec.EllipticCurvePrivateKey:
    """The private key in ``text`` (cosign's encrypted PEM), decrypted with ``passphrase``."""
    document = _document(text, source)
    salt = _unb64(document.kdf.salt, "salt", source)
    nonce = _unb64(document.cipher.nonce, "nonce", source)
    sealed = _unb64(document.ciphertext, "ciphertext", source)
    if len(nonce) != nacl.secret.SecretBox.NONCE_SIZE:
        raise SigningKeyError(f"{source}: the key's nonce is not 24 bytes")
    try:
        secret = _derive(passphrase, salt, document.kdf.params)
    except (MemoryError, ValueError) as exc:  # OpenSSL refused what the bounds let through
        raise SigningKeyError(f"{source}: scrypt refused the key's parameters: {exc}") from None
    box = nacl.secret.SecretBox(secret)
    try:
        der = box.decrypt(sealed, nonce)
    except nacl.exceptions.CryptoError:
        raise KeyPassphraseError(
            f"{source}: the passphrase does not decrypt this key",
            f"set {PASSWORD_ENV} to the passphrase the key was made with",
        ) from None
    return _ec_private(der, source)


def _ec_private(der: bytes, source: str) -> ec.EllipticCurvePrivateKey:
    try:
        key = serialization.load_der_private_key(der, password=None)
    except (ValueError, TypeError, UnsupportedAlgorithm):
        raise SigningKeyError(f"{source}: the decrypted key is not a PKCS #8 key") from None
    if not isinstance(key, ec.EllipticCurvePrivateKey) or key.curve.name != _CURVE:
        raise SigningKeyError(
            f"{source}: not an ECDSA P-256 key",
            "sparkbuild signs with ECDSA P-256, as cosign's own key pairs are",
        )
    return key


# --- reading keys --------------------------------------------------------------------------


def _read_key_file(path: Path, what: str) -> bytes:
    try:
        return fileio.read_bytes(path, limit=_KEY_FILE_LIMIT)
    except OSError as exc:
        raise SigningKeyError(
            f"{what} {path}: cannot read: {fileio.reason(exc)}",
            "make a key pair with `sparkbuild keys generate`",
        ) from None


def check_private_file(path: Path) -> None:
    """Refuse a private key file that the group or other users may read or write."""
    try:
        mode = stat.S_IMODE(path.stat().st_mode)
    except OSError as exc:
        raise SigningKeyError(f"signing key {path}: {fileio.reason(exc)}") from None
    if mode & 0o077:
        raise KeyPermissionsError(
            f"signing key {path} is readable by other users (mode {mode:04o}); it was not used",
            f"`chmod 600 {path}`, and consider the key exposed if others could read it",
        )


def passphrase_from_env(prompt: bool = False) -> bytes:
    """The passphrase from ``SPARKBUILD_SIGNING_PASSWORD`` (or typed, on a terminal)."""
    value = os.environ.get(PASSWORD_ENV)
    if value is None and prompt and console.interactive():
        import click

        value = str(click.prompt("passphrase for the signing key", hide_input=True))
    if value is None:
        raise SigningKeyError(
            f"no passphrase for the signing key: {PASSWORD_ENV} is not set",
            f"export {PASSWORD_ENV} (a CI secret), or run on a terminal to type it",
        )
    remember(value)
    return value.encode()


def load_private(path: Path | None, passphrase: bytes) -> PrivateKey:
    """The signing key from ``path``, else ``SPARKBUILD_SIGNING_KEY_FILE``, else the PEM text
    in ``SPARKBUILD_SIGNING_KEY``."""
    text: bytes
    if path is None and os.environ.get(KEY_FILE_ENV):
        path = Path(os.environ[KEY_FILE_ENV])
    if path is not None:
        check_private_file(path)
        text, source = _read_key_file(path, "signing key"), f"signing key {path}"
    elif os.environ.get(KEY_ENV):
        text, source = os.environ[KEY_ENV].encode(), f"signing key ${KEY_ENV}"
    else:
        raise UsageError(
            "no signing key: pass --sign-key FILE, or set "
            f"{KEY_FILE_ENV} (a file) or {KEY_ENV} (the PEM text)",
            "`sparkbuild keys generate` makes a key pair",
        )
    _remember_key_text(text)
    return PrivateKey(decrypt(text, passphrase, source), source)


def configured_private(path: Path | None) -> bool:
    """Whether a signing key is configured (an option, or either environment variable)."""
    return path is not None or bool(os.environ.get(KEY_FILE_ENV) or os.environ.get(KEY_ENV))


def _remember_key_text(text: bytes) -> None:
    decoded = text.decode("ascii", errors="replace")
    remember(decoded.strip())
    for line in decoded.splitlines():
        if not line.startswith("-----"):
            remember(line.strip())


def load_public(path: Path) -> PublicKey:
    text = _read_key_file(path, "public key")
    return PublicKey(public_from_pem(text, f"public key {path}"), str(path))


def public_from_pem(text: bytes, source: str) -> ec.EllipticCurvePublicKey:
    der = _unpem(text, (PUBLIC_PEM,), source)
    try:
        key = serialization.load_der_public_key(der)
    except (ValueError, UnsupportedAlgorithm):
        raise SigningKeyError(f"{source}: not a SubjectPublicKeyInfo public key") from None
    if not isinstance(key, ec.EllipticCurvePublicKey) or key.curve.name != _CURVE:
        raise SigningKeyError(f"{source}: not an ECDSA P-256 public key")
    return key


def configured_public(path: Path | None, project_dir: Path) -> PublicKey | None:
    """The verification key: ``path``, else ``SPARKBUILD_PUBLIC_KEY``, else the project's
    ``cosign.pub``; None when none is configured."""
    if path is None and os.environ.get(PUBLIC_KEY_ENV):
        path = Path(os.environ[PUBLIC_KEY_ENV])
    if path is None and (project_dir / PUBLIC_KEY_FILE).is_file():
        path = project_dir / PUBLIC_KEY_FILE
    return load_public(path) if path is not None else None


# --- making a key pair ---------------------------------------------------------------------


def generate(passphrase: bytes) -> tuple[bytes, bytes]:
    """A new key pair: (encrypted private PEM, public PEM)."""
    key = ec.generate_private_key(ec.SECP256R1())
    return encrypt(key, passphrase), PublicKey(key.public_key(), "new").pem()


def key_paths(prefix: str) -> tuple[Path, Path]:
    """``PREFIX.key`` and ``PREFIX.pub``, neither there yet; a prefix that is empty or names
    a directory (``keys/``, ``.``) is refused: ``keys/`` would have written ``keys.key``
    beside it."""
    path = Path(prefix)
    if not prefix.strip() or prefix.endswith(("/", os.sep)) or path.name in ("", ".", ".."):
        raise UsageError(
            f"--output-prefix {prefix!r} is not a file name prefix",
            "pass DIR/NAME, e.g. --output-prefix keys/cosign (writes keys/cosign.key and "
            "keys/cosign.pub)",
        )
    private, public = path.with_name(path.name + ".key"), path.with_name(path.name + ".pub")
    for made in (private, public):
        _refuse_existing(made)
    return private, public


def write_pair(private: Path, private_pem: bytes, public: Path, public_pem: bytes) -> None:
    """The private key (0600) and its public key, both or neither: both paths are checked
    free first, and the private key is removed again if the public one cannot be written (a
    ``cosign.key`` left beside another key's ``cosign.pub`` would sign for no one)."""
    for path in (private, public):
        _refuse_existing(path)
    write_new(private, private_pem, 0o600)
    try:
        write_new(public, public_pem, 0o644)
    except BaseException:
        private.unlink(missing_ok=True)
        raise


def _refuse_existing(path: Path) -> None:
    if path.exists() or path.is_symlink():
        raise UsageError(
            f"{path} exists; a key is never overwritten",
            "move it aside, or pass another --output-prefix",
        )


def write_new(path: Path, data: bytes, mode: int) -> None:
    """Write ``data`` to ``path`` (which must not exist) with ``mode`` from the start."""
    _refuse_existing(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, temporary = tempfile.mkstemp(prefix=f".{path.name}.", dir=path.parent)  # mode 0600
    try:
        os.fchmod(fd, mode)
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.link(temporary, path)  # fails if path appeared meanwhile: never replaces a key
    finally:
        Path(temporary).unlink(missing_ok=True)
