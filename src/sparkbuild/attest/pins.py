"""What a rebuild needs, as the provenance carries it: the lock entry's pins of one image.

``sparkbuild verify --rebuild`` rebuilds a published image from its signed provenance alone:
the source section (upstream commit, PR heads, patch hashes, the patched tree), the image
section (base digest, platform, mode, inputs digest, image id, ``SOURCE_DATE_EPOCH``, the
builder and the canonical form) and the pinned wheels. Local facts (tags, build times, the
local repository digest) are left out.
"""

from __future__ import annotations

from sparkbuild import lockfile

PINS_KEY = "lockEntry"
_LOCAL = ("tags", "repo_digest", "started", "finished", "differences")


def rebuild_pins(entry: lockfile.BuildEntry) -> dict[str, object]:
    """The entry's source, image and requirements sections, without local facts."""
    pins: dict[str, object] = {}
    if entry.source is not None:
        pins["source"] = entry.source.to_json()
    if entry.image is not None:
        image = entry.image.to_json()
        pins["image"] = {key: value for key, value in image.items() if key not in _LOCAL}
    if entry.requirements:
        pins["requirements"] = [wheel.to_json() for wheel in entry.requirements]
    return pins


def internal_parameters(entry: lockfile.BuildEntry) -> dict[str, object]:
    """The provenance's rebuild facts: how it was built, whether a second build matched, and
    the pins (:data:`PINS_KEY`)."""
    image = entry.image or lockfile.ImageSection()
    found: dict[str, object] = {PINS_KEY: rebuild_pins(entry)}
    if image.builder:
        found["builder"] = dict(image.builder)
    if image.reproducible is not None:
        found["reproducible"] = image.reproducible
    if image.source_date_epoch is not None:
        found["sourceDateEpoch"] = image.source_date_epoch
    return found
