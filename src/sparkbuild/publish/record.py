"""The publish stage's records in images.lock (``builds.<build>.publish.<repository>``): what
a repository's tags point at now, and the digests before."""

from __future__ import annotations

from collections.abc import Sequence

from sparkbuild import lockfile


def after_push(
    before: lockfile.PublishRecord | None,
    publication: lockfile.Publication,
    aliases: Sequence[str],
) -> lockfile.PublishRecord:
    """The record once ``publication`` is pushed and ``aliases`` point at it: its digest
    moves to the end of the history (once)."""
    earlier = before.published() if before else []
    record = lockfile.PublishRecord(
        tag=publication.tag,
        digest=publication.digest,
        image_id=publication.image_id,
        verified=publication.verified,
        aliases=list(aliases),
        history=[*(h for h in earlier if h.digest != publication.digest), publication],
    )
    if publication.signed is not None:  # an unsigned publication keeps its old shape
        record.signed = publication.signed
    return record
