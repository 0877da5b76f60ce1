"""Refuse, before any byte moves, an image with a layer larger than the registry accepts.

GHCR rejects layers over 10 GB, and it does so at the end of a long upload, after the other
layers went up. The local store knows each layer's size (``docker history``), so the check
runs before the push, names the layer by the step that made it, and says what to do. The
sizes are uncompressed: the pushed (gzip) layer is smaller, so the check errs on the safe
side; ``--max-layer-size`` raises or sets the limit for other registries.
"""

from __future__ import annotations

import os
import re
from dataclasses import dataclass
from typing import TYPE_CHECKING

from sparkbuild.errors import PublishError, UsageError

if TYPE_CHECKING:
    from docker.models.images import Image

# Registries with a documented per-layer limit (bytes).
REGISTRY_LAYER_LIMITS = {"ghcr.io": 10 * 1000**3}
LIMIT_ENV = "SPARKBUILD_MAX_LAYER_SIZE"
_UNITS = {
    "": 1,
    "b": 1,
    "kb": 1000,
    "mb": 1000**2,
    "gb": 1000**3,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}
_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*\Z")


@dataclass(frozen=True)
class Layer:
    number: int  # 1 = the bottom layer, as `docker history` lists them from the end
    size: int
    created_by: str


def parse_size(text: str, *, what: str = "--max-layer-size") -> int:
    match = _SIZE.match(text)
    unit = match.group(2).lower() if match else ""
    if not match or unit not in _UNITS:
        raise UsageError(
            f"{what} {text!r} is not a size",
            "for example 10GB (GHCR's limit), 512MB or 2GiB",
        )
    return int(float(match.group(1)) * _UNITS[unit])


def human(size: int) -> str:
    for unit, factor in (("GB", 1000**3), ("MB", 1000**2), ("kB", 1000)):
        if size >= factor:
            return f"{size / factor:.2f} {unit}"
    return f"{size} B"


def limit_for(registry_host: str, option: str | None) -> int | None:
    """The limit to enforce: the option, else the environment, else the registry's own."""
    if option:
        return parse_size(option)
    if os.environ.get(LIMIT_ENV):
        return parse_size(os.environ[LIMIT_ENV], what=LIMIT_ENV)
    return REGISTRY_LAYER_LIMITS.get(registry_host)


def layers(image: Image) -> list[Layer]:
    """The image's layers that hold files, bottom first, with the step that made each."""
    history = list(reversed(image.history()))
    found: list[Layer] = []
    for entry in history:
        size = int(entry.get("Size") or 0)
        if size > 0:
            created_by = " ".join(str(entry.get("CreatedBy") or "?").split())
            found.append(Layer(len(found) + 1, size, created_by))
    return found


def check_layers(image: Image, limit: int | None, reference: str) -> None:
    if limit is None:
        return
    over = [layer for layer in layers(image) if layer.size > limit]
    if not over:
        return
    listed = "\n  ".join(
        f"layer {layer.number}: {human(layer.size)}, made by: {layer.created_by[:160]}"
        for layer in over
    )
    raise PublishError(
        f"{reference}: {len(over)} layer(s) exceed the registry's limit of {human(limit)} "
        f"(uncompressed sizes; nothing was pushed):\n  {listed}",
        "split the step that made it: build in a separate stage and COPY only what the image "
        "needs, and delete build trees and caches in the same RUN (source templates keep "
        "ccache and pip caches in cache mounts); if the registry takes larger layers, pass "
        f"--max-layer-size (or set {LIMIT_ENV})",
    )
