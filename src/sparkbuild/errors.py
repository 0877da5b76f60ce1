"""Every error sparkbuild raises, in one module (after docker-py's errors.py).

Each reaches the user as one screen: ``error: <what, naming the file/field/build>`` and
``hint: <the next command>``, with exit status 1 (or 2 for bad input), never a traceback.
The command line renders them in one place (``sparkbuild.cli``).
"""

from __future__ import annotations

from collections.abc import Sequence

EXIT_FAILURE = 1
EXIT_USAGE = 2


class SparkbuildError(Exception):
    """A failure the user can act on.

    ``hint`` is the next thing to try (ideally a command), in the style of git's porcelain.
    """

    exit_code = EXIT_FAILURE

    def __init__(self, message: str, hint: str | None = None) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint

    def __str__(self) -> str:
        return self.message if not self.hint else f"{self.message}\nhint: {self.hint}"


class UsageError(SparkbuildError):
    """Bad command-line input or a bad spec/profile file: exit status 2."""

    exit_code = EXIT_USAGE


class SpecError(UsageError):
    """A build spec or smoke profile that does not validate."""


class LockError(SparkbuildError):
    """images.lock is missing, stale, or disagrees with what was asked for."""


class RemoteError(SparkbuildError):
    """A git remote could not be listed or fetched (after retries where they can help)."""


class AnchorDriftError(SparkbuildError):
    """A source step did not find, in the upstream file, what it must change: the file has
    moved on from the form the step was checked against."""

    def __init__(self, path: str, expected: Sequence[str]) -> None:
        self.path = path
        self.expected = list(expected)
        super().__init__(
            f"anchor drift in {path}: expected " + "; expected ".join(self.expected),
            "check the step against this release's file and narrow the step's `when` (or "
            "adjust its expectations) in the spec; `sparkbuild prepare BUILD` shows the tree",
        )


class MissingContentsError(SparkbuildError):
    """An offline run needs file contents that a partial mirror has not fetched yet."""


class GitError(SparkbuildError):
    """A git command failed; ``stderr`` is git's own reason (URL credentials redacted)."""

    def __init__(self, args: Sequence[str], returncode: int, stderr: str) -> None:
        from sparkbuild.validate import redact_url  # validate imports nothing of ours

        self.args_ = list(args)
        self.returncode = returncode
        self.stderr = redact_url(stderr.strip())
        shown = redact_url(" ".join(args))
        super().__init__(f"git {shown} failed ({returncode}): {self.stderr}")


class BuildFailedError(SparkbuildError):
    """The image build ran and failed; ``message`` carries the failing step's last lines."""

    def __init__(self, message: str, hint: str | None = None, log: list[str] | None = None):
        super().__init__(message, hint)
        self.log = log or []


class CubinCheckError(SparkbuildError):
    """The built wheels carry CUDA code for other archs than the build targets."""


class RegistryError(SparkbuildError):
    """The registry answered, and the answer was no."""


class CredentialsRejectedError(RegistryError):
    """Authentication failed: wrong or missing credentials (never quoted)."""


class EngineHTTPError(SparkbuildError):
    """A request the engine answered with an error status, with a malformed body, or did not
    answer at all. Smoke turns it into a failed check; elsewhere it reaches the user."""

    def __init__(
        self, what: str, status: int | None, body: str = "", *, timed_out: bool = False
    ) -> None:
        self.what = what
        self.status = status
        self.body = body[:500]
        self.timed_out = timed_out
        shown = f"HTTP {status}" if status is not None else "no response"
        super().__init__(
            f"{what}: {shown}{': ' + self.body if self.body else ''}",
            "check that the URL points at a running engine of the profile's kind",
        )


class CalibrationError(SparkbuildError):
    """The engine's tokenizer could not be made to give the requested prompt length."""


class EngineGoneError(SparkbuildError):
    """The engine stopped answering in the middle of a bench sweep."""


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
