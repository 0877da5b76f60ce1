"""How often, and for how long, a network operation is tried: one policy for git remotes and
registries, bounded whatever the environment asks.

``SPARKBUILD_NET_ATTEMPTS`` and ``SPARKBUILD_NET_BACKOFF`` tune it (tests set them low); a
value beyond :data:`MAX_ATTEMPTS` or :data:`MAX_BACKOFF_SCALE` is refused by name, since
``SPARKBUILD_NET_ATTEMPTS=1000000000`` would retry a dead server for days.
"""

from __future__ import annotations

from tenacity import Retrying, stop_after_attempt, stop_after_delay, wait_exponential
from tenacity.retry import retry_base

from sparkbuild.settings import env_number

MAX_ATTEMPTS = 20
MAX_BACKOFF_SCALE = 10.0
#: The longest all attempts of one operation may take together.
MAX_RETRY_SECONDS = 900.0
ATTEMPTS_ENV = "SPARKBUILD_NET_ATTEMPTS"
BACKOFF_ENV = "SPARKBUILD_NET_BACKOFF"


def attempts(default: int) -> int:
    """Tries of one network operation: ``SPARKBUILD_NET_ATTEMPTS``, 1 to :data:`MAX_ATTEMPTS`."""
    return max(int(env_number(ATTEMPTS_ENV, str(default), int, MAX_ATTEMPTS)), 1)


def retrying(retry: retry_base, default_attempts: int) -> Retrying:
    """tenacity's ``Retrying`` with the bounds: capped attempts, exponential backoff of at most
    30 s per wait (times the scale), and all of it within :data:`MAX_RETRY_SECONDS`."""
    scale = env_number(BACKOFF_ENV, "1", float, MAX_BACKOFF_SCALE)
    return Retrying(
        stop=stop_after_attempt(attempts(default_attempts)) | stop_after_delay(MAX_RETRY_SECONDS),
        wait=wait_exponential(multiplier=scale, min=0, max=30 * scale),
        retry=retry,
        reraise=False,
    )


__all__ = ["MAX_ATTEMPTS", "attempts", "retrying"]
