"""The publication stage: push a smoke-tested image by digest, move aliases, roll them back.

``publish_build`` pushes the image images.lock pins (its image id) only when the lock records
a passing smoke verdict for that image under every profile the build lists. It gets an
immutable tag ``{version}-sm121-{tree12}`` that never moves, plus moving aliases. The pushed
manifest digest goes into ``builds.<name>.publish`` with a history, which ``rollback_build``
walks back to re-point the aliases at the previous passing digest (a manifest PUT: no layer
moves, the digest stays exact). The lock is written last, so an interrupted run leaves it as it
was and running the command again completes the job.
"""

from sparkbuild.publish.destination import (
    DEFAULT_ALIASES,
    DEFAULT_REPOSITORY,
    Destination,
    plan_destination,
    render_repository,
)
from sparkbuild.publish.push import PublishResult, publish_build
from sparkbuild.publish.rollback import RollbackResult, choose_repository, rollback_build
from sparkbuild.publish.signing import Signing

__all__ = [
    "DEFAULT_ALIASES",
    "DEFAULT_REPOSITORY",
    "Destination",
    "PublishResult",
    "RollbackResult",
    "Signing",
    "choose_repository",
    "plan_destination",
    "publish_build",
    "render_repository",
    "rollback_build",
]
