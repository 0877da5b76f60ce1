"""Every error sparkbuild raises, in one module (after docker-py's errors.py).

Each reaches the user as one screen: ``error: <what, naming the file/field/build>`` and
``hint: <the next command>``, with exit status 1 (or 2 for bad input), never a traceback.
The command line renders them in one place (``sparkbuild.cli``).

Every :class:`SparkbuildError` subclass is made the same way: ``Class(message, hint=None,
**fields)``, its own fields (if any) keyword-only, with defaults, each stored under its name
and listed in ``FIELDS``. So :meth:`SparkbuildError.rewritten` can make the same error again
(the same class, the same fields) with its text changed: how redaction keeps the type a
handler catches and the fields it reads. A subclass that derives its message from its fields
does so in a named constructor (``GitError.failed``, ``EngineHTTPError.answered``).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import ClassVar, Self

EXIT_FAILURE = 1
EXIT_USAGE = 2
#: Nothing failed, but a check could not be judged here (a preflight ``skip``).
EXIT_SKIPPED = 3


class SparkbuildError(Exception):
    """A failure the user can act on.

    ``hint`` is the next thing to try (ideally a command), in the style of git's porcelain.
    """

    exit_code = EXIT_FAILURE
    FIELDS: ClassVar[tuple[str, ...]] = ()  # a subclass's own keyword-only fields

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def fields(self) -> dict[str, object]:
        """This error's own fields (beyond message and hint), by name."""
        return {name: getattr(self, name) for name in self.FIELDS}

    def rewritten(self, text: Callable[[str], str]) -> Self:
        """The same error (class and fields) with its message, hint and every text in its
        fields passed through ``text`` (say, a redactor); numbers and flags stay as they are."""
        fields = {name: _rewritten(value, text) for name, value in self.fields().items()}
        hint = text(self.hint) if self.hint else self.hint
        return type(self)(text(self.message), hint, **fields)

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class UsageError(SparkbuildError):
    """Bad command-line input or a bad spec/profile file: exit status 2."""

    exit_code = EXIT_USAGE


class SpecError(UsageError):
    """A build spec or smoke profile that does not validate."""


class LockError(SparkbuildError):
    """images.lock is missing, stale, or disagrees with what was asked for."""


class NoPinnedImageError(LockError):
    """A verdict or a publication needs the image images.lock pins, and it pins none."""


class ImageMismatchError(LockError):
    """The image a verdict is about is not the one images.lock pins (or the pin moved while
    the verdict was obtained)."""


class UnknownRefError(SparkbuildError):
    """A spec's ``ref`` is neither a branch nor a tag of its repository."""


class PatchChecksumError(SparkbuildError):
    """A patch file's bytes do not match the ``sha256:`` the spec pins for it."""


class CheckoutDirError(SparkbuildError):
    """``prepare --out DIR`` would overwrite what is not a sparkbuild checkout, or edits."""


class PreflightSetupError(SparkbuildError):
    """Preflight cannot make or reach the interpreter it runs in (venv, image, --python)."""


class ProbeError(SparkbuildError):
    """The preflight probe did not run to a report."""


class UntrustedCacheError(PreflightSetupError):
    """A preflight cache directory others could write (not the user's own, or writable by
    group or others), or a cached item that cannot be removed to be made again: refused,
    never used."""


class GateClosedError(SparkbuildError):
    """Publishing refused: the pinned image lacks a passing verdict (``--force`` overrides,
    recorded unverified)."""


class RemoteError(SparkbuildError):
    """A git remote could not be listed or fetched (after retries where they can help)."""


class UnreachableError(SparkbuildError):
    """A host that cannot be reached at all: its name does not resolve, it refuses the
    connection, or no route leads to it. Not retried, and not asked again in the same run.

    ``url`` is what was asked for and ``cause`` why it failed, so a command that stopped on
    several builds names each URL and its cause once.
    """

    FIELDS = ("url", "cause")

    def __init__(
        self, message: str, hint: str | None = None, *, url: str = "", cause: str = ""
    ) -> None:
        super().__init__(message, hint)
        self.url = url
        self.cause = cause


class RemoteUnreachableError(UnreachableError, RemoteError):
    """A git remote whose host cannot be reached at all (see :class:`UnreachableError`)."""


class AnchorDriftError(SparkbuildError):
    """A source step did not find, in the upstream file, what it must change: the file has
    moved on from the form the step was checked against. The message names the file and
    each expectation not met."""


class MissingContentsError(SparkbuildError):
    """An offline run needs file contents that a partial mirror has not fetched yet."""


class GitNotFoundError(SparkbuildError):
    """No ``git`` can be run (not on PATH, not executable), or it answers with garbage."""


class GitError(SparkbuildError):
    """A git command failed; ``stderr`` is git's own reason. :func:`sparkbuild.git.run`
    raises it with the command and the reason redacted (URL credentials)."""

    FIELDS = ("command", "returncode", "stderr")

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        command: Sequence[str] = (),
        returncode: int = 1,
        stderr: str = "",
    ) -> None:
        super().__init__(message, hint)
        self.command = list(command)
        self.returncode = returncode
        self.stderr = stderr

    @classmethod
    def failed(cls, command: Sequence[str], returncode: int, stderr: str) -> GitError:
        """``git COMMAND failed (N): STDERR`` (the caller has redacted both)."""
        stderr = stderr.strip()
        message = f"git {' '.join(command)} failed ({returncode}): {stderr}"
        return cls(message, command=command, returncode=returncode, stderr=stderr)


class BuildFailedError(SparkbuildError):
    """The image build ran and failed; ``message`` carries the failing step's last lines."""

    FIELDS = ("log",)

    def __init__(self, message: str, hint: str | None = None, *, log: Sequence[str] = ()) -> None:
        super().__init__(message, hint)
        self.log = list(log)


class CubinCheckError(SparkbuildError):
    """The built wheels carry CUDA code for other archs than the build targets."""


class AuditError(SparkbuildError):
    """An image's device code could not be read, or a library the launch loads has no code
    that runs on the target GPU (sm_121)."""


class CompileCapError(SparkbuildError):
    """A boot kept compiling past the profile's ``expect.compile.max_seconds``."""

    @classmethod
    def over(cls, limit: float, spent: float, what: str) -> CompileCapError:
        return cls(
            f"the boot compiled for {spent:.0f} s, over the profile's cap of {limit:g} s "
            f"(expect.compile.max_seconds): {what}",
            "a second boot of the same image on this host loads what the first compiled; "
            "raise the cap for a first boot, or pin prebuilt kernels (docs/smoke.md, "
            '"Compile cache")',
        )


class DockerUnavailableError(SparkbuildError):
    """This host's Docker cannot do what was asked: no daemon answers, no docker client can run
    BuildKit builds (or buildx is needed), or no emulation runs the platform's binaries."""


class DockerAPIError(SparkbuildError):
    """A Docker endpoint answered a request with an error, or is not a Docker Engine API at
    all (another service at its address answers 404 to ``/info``)."""


class PlatformError(SparkbuildError):
    """A platform that is not ``linux/ARCH``, or an image of another platform than asked for."""


class LocalImageError(SparkbuildError):
    """An image that should be in the local Docker engine is not there."""


class BaseImageError(SparkbuildError):
    """The base image cannot be pinned, or its config cannot be read, from its registry."""


class NotReproducibleError(SparkbuildError):
    """Two builds of the same inputs gave two images (``build --check-reproducible``), or a
    rebuild from a published image's provenance gave another image (``verify --rebuild``);
    every difference is named."""


class RebuildInputError(SparkbuildError):
    """``verify --rebuild`` cannot rebuild from a provenance: it carries no rebuild pins, or
    an input it pins is not what the project or its sources hold (named)."""


class UnpreparedSourceError(SparkbuildError):
    """A build whose PRs or patches do not all apply: there is no tree to build an image of."""


class OverlayScopeError(SparkbuildError):
    """An overlay build whose PRs or patches change files outside the Python package."""


class BrokenInstallError(SparkbuildError):
    """A file sparkbuild ships (a template) is missing from its install."""


class BuildInputError(SparkbuildError):
    """A build argument or build cache reference that is not valid, found while building."""


class RegistryError(SparkbuildError):
    """The registry answered, and the answer was no."""


class CredentialsRejectedError(RegistryError):
    """Authentication failed: wrong or missing credentials (never quoted)."""


class RegistryUnreachableError(UnreachableError):
    """The registry did not answer (after retries), or answered only with server errors, or
    cannot be reached at all (its name does not resolve, it refuses the connection)."""


class CredentialStoreError(SparkbuildError):
    """docker's credential store (a ``credsStore``/``credHelpers`` helper) failed."""


class PublishError(SparkbuildError):
    """A push that did not land, or would publish other bytes than the pinned image."""


class RollbackError(SparkbuildError):
    """No published digest to move the aliases back to, or one they must not move to."""


class SigningKeyError(SparkbuildError):
    """A signing or verification key that cannot be used: missing, unreadable, not in
    cosign's format, or not an ECDSA P-256 key (the key itself is never quoted)."""


class KeyPermissionsError(SigningKeyError):
    """A private key file that other users may read (group or world bits set)."""


class KeyPassphraseError(SigningKeyError):
    """A private key that the passphrase given does not decrypt."""


class SignatureError(SparkbuildError):
    """An image signature that is missing, does not verify with the key, or signs another
    digest: nothing is trusted, signed or recorded from it."""


class AttestationError(SparkbuildError):
    """An attestation that does not verify: a bad envelope or signature, a statement about
    another digest, or one missing."""


class ReferrersError(AttestationError):
    """A referrers index (the API's answer or the fallback tag) that is too large, malformed,
    or lists a manifest that refers to another image."""


class VerificationFailedError(SparkbuildError):
    """``sparkbuild verify`` (or a check before running an image) found a finding that failed;
    each finding was shown by name."""


class EngineHTTPError(SparkbuildError):
    """A request the engine answered with an error status, with a malformed body, or did not
    answer at all. Smoke turns it into a failed check; elsewhere it reaches the user."""

    FIELDS = ("what", "status", "body", "timed_out")
    HINT = "check that the URL points at a running engine of the profile's kind"

    def __init__(
        self,
        message: str,
        hint: str | None = None,
        *,
        what: str = "",
        status: int | None = None,
        body: str = "",
        timed_out: bool = False,
    ) -> None:
        super().__init__(message, hint)
        self.what = what
        self.status = status
        self.body = body
        self.timed_out = timed_out

    @classmethod
    def answered(
        cls, what: str, status: int | None, body: str = "", *, timed_out: bool = False
    ) -> EngineHTTPError:
        """``WHAT: HTTP STATUS: BODY`` (``no response`` without a status; the body cut)."""
        body = body[:500]
        shown = f"HTTP {status}" if status is not None else "no response"
        message = f"{what}: {shown}{': ' + body if body else ''}"
        return cls(message, cls.HINT, what=what, status=status, body=body, timed_out=timed_out)


class CalibrationError(SparkbuildError):
    """The engine's tokenizer could not be made to give the requested prompt length."""


class EngineGoneError(SparkbuildError):
    """The engine stopped answering in the middle of a bench sweep."""


# Raised by the command line (sparkbuild.cli) once a stage has returned or failed.


class BuildsFailedError(SparkbuildError):
    """Some of several builds failed; each was reported as it failed, and the others ran."""


class ItemsDoNotApplyError(SparkbuildError):
    """PRs or patches of a build are in conflict, missing or invalid, so its source does not
    prepare (and nothing is locked, built or preflighted from it)."""


class RequirementsClashError(SparkbuildError):
    """A build's ``requirements:`` pin a package differently from the release's own pins."""


class VerdictFailedError(SparkbuildError):
    """A check ran and did not pass (a smoke or preflight verdict): the run worked, the
    engine or the build did not."""


class VerdictSkippedError(SparkbuildError):
    """Nothing failed, but a check could not run here (a preflight ``skip``): exit status 3,
    so a script can tell "not judged" from "failed"."""

    exit_code = EXIT_SKIPPED


class EngineUnreachableError(SparkbuildError):
    """An engine URL could not be asked what it serves."""


class SweepIncompleteError(SparkbuildError):
    """A bench sweep stopped before every cell was measured (the finished cells are kept)."""


class NothingMeasuredError(SparkbuildError):
    """A bench sweep's cells hold no figure (every request failed): no submission is made."""


class NothingToCompareError(SparkbuildError):
    """Two bench reports share no cell, so there is nothing to set side by side."""


class BumpNotReadyError(SparkbuildError):
    """``bump`` could not carry every item to the new release; conflict reports say why."""


class OutputError(SparkbuildError):
    """An output file or directory could not be written (a full or read-only disk)."""


class FileSystemError(SparkbuildError):
    """A file or directory sparkbuild needs could not be read or written: a read-only or
    full disk, a directory where a file belongs, a file where a directory belongs."""


class InternalError(SparkbuildError):
    """A bug in sparkbuild: any other exception, rendered as one screen, not a traceback."""


class EngineContainerError(SparkbuildError):
    """An engine's container could not be started, or has no published port to reach."""


class ClusterImageError(SparkbuildError):
    """A cluster node holds another image than the one under test, or cannot get it."""


class EngineBootError(SparkbuildError):
    """The engine exited, or never became ready, before a bench sweep could start."""


class PlotError(SparkbuildError):
    """``--plot`` cannot draw: no cell has a figure to plot."""


class MissingExtraError(UsageError):
    """An option needs an optional extra that is not installed (``--plot``: matplotlib):
    a usage error, exit 2, raised before any work starts."""


class RequirementError(SparkbuildError):
    """An extra requirement (spec ``requirements:``) has no wheel pip can download for the
    image, or pip returned another file than asked for."""


class BumpError(SparkbuildError):
    """``sparkbuild bump`` cannot carry a change, or cannot write the files it planned."""


class ReportError(UsageError):
    """``sparkbuild report`` cannot do what was asked: a ``BUILD@WHERE`` that names no lock
    or build, or an output directory that holds something other than a report."""


class TemplateTooLargeError(UsageError):
    """A template whose values hold placeholders expands past a limit (its size, or the
    number of fills): a few hundred bytes of recipe would otherwise make gigabytes."""


class UnknownPlaceholderError(ValueError):
    """A tag or repository template names a placeholder that does not exist. Internal: the
    image and publish stages turn it into a SpecError or UsageError naming the field."""


class BadYAMLError(Exception):
    """Why a YAML text was refused, and on which line (1-based) when known. Internal: the
    spec, profile and lock loaders turn it into an error naming their file."""

    def __init__(self, problem: str, line: int | None = None) -> None:
        super().__init__(problem)
        self.problem = problem
        self.line = line


def _rewritten(value: object, text: Callable[[str], str]) -> object:
    """A field's value with each string in it (itself, or a list's items) through ``text``."""
    if isinstance(value, str):
        return text(value)
    if isinstance(value, list | tuple):
        return type(value)(_rewritten(item, text) for item in value)
    return value
