"""``build --check-reproducible``: build a second time and compare.

The second build runs without BuildKit's cache, from a build context written again in another
directory, untagged, after the first; its canonical form (:mod:`sparkbuild.image.reproducible`)
is computed and never loaded. The same image id means the build is reproducible; otherwise
both canonical forms are compared file by file (:mod:`sparkbuild.image.layerdiff`) and every
difference is named, most useful first. The second build's own image is removed either way.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import docker.errors

from sparkbuild import console, lockfile
from sparkbuild.errors import NotReproducibleError
from sparkbuild.image import layerdiff, reproducible
from sparkbuild.jsontext import JsonObject

if TYPE_CHECKING:
    from docker import DockerClient
    from docker.models.images import Image

#: How many differences the lock and the summary keep (the JSON has them all).
SUMMARY_LINES = 20


@dataclass(frozen=True)
class ReproducibleCheck:
    first: str  # the image id of the build that was kept
    second: str  # the image id the second build's canonical form would have
    differences: tuple[layerdiff.Difference, ...]

    @property
    def reproducible(self) -> bool:
        return self.first == self.second

    def summary(self) -> list[str]:
        lines = [d.line() for d in self.differences[:SUMMARY_LINES]]
        more = len(self.differences) - SUMMARY_LINES
        return [*lines, f"... and {more} more"] if more > 0 else lines

    def to_json(self) -> JsonObject:
        return {
            "reproducible": self.reproducible,
            "first": self.first,
            "second": self.second,
            "differences": [d.to_json() for d in self.differences],
        }


def check(
    api: DockerClient,
    first: Image,
    build_again: Callable[[], Image],
    base: reproducible.BaseFacts,
    epoch: int,
    work_root: Path,
) -> ReproducibleCheck:
    """Build again (``build_again``) and compare with ``first`` (in its canonical form)."""
    first_id = str(first.id)
    with console.status("checking reproducibility: building again without the cache"):
        again = build_again()
    again_id = str(again.id)
    with reproducible.workdir(work_root) as work:
        try:
            second = reproducible.canonicalise(api, again, base, epoch, work / "second")
        finally:
            if again_id != first_id:
                with contextlib.suppress(docker.errors.APIError):
                    api.images.remove(again_id, noprune=False)
        if second.image_id == first_id:
            return ReproducibleCheck(first_id, second.image_id, ())
        kept = reproducible.canonicalise(api, first, base, epoch, work / "first")
        found = layerdiff.differences(kept, second)
    return ReproducibleCheck(first_id, second.image_id, tuple(found))


def record_into(
    section: lockfile.ImageSection,
    *,
    check: ReproducibleCheck | None,
    builder: dict[str, str] | None,
    pinned: lockfile.ImageSection | None,
) -> None:
    """The image section's builder and reproducibility: this run's, else (an image up to date)
    what the lock recorded for this very image."""
    same = pinned is not None and pinned.image_id == section.image_id
    if builder is None and same and pinned is not None and pinned.builder:
        builder = pinned.builder
    if builder is not None:
        section.builder = builder
    if check is not None:
        section.reproducible = check.reproducible
        section.differences = check.summary()
    elif same and pinned is not None and pinned.reproducible is not None:
        section.reproducible = pinned.reproducible
        section.differences = list(pinned.differences)


def not_reproducible(build: str, check: ReproducibleCheck) -> NotReproducibleError:
    listed = "\n  ".join(check.summary())
    return NotReproducibleError(
        f"{build}: not reproducible: a second build without the cache gave {check.second[:19]}, "
        f"not {check.first[:19]}; what differs, most useful first:\n  {listed}",
        "make the named files the same on every build (SOURCE_DATE_EPOCH is set in every "
        "step; no clock, random or host values); images.lock records `reproducible: false` "
        "with this list (docs/image.md, 'Reproducible images')",
    )
