"""Errors that reach the user as a message and a next step, never as a traceback."""

from __future__ import annotations

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
