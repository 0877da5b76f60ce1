"""The image stage: a prepared source tree into a labelled linux/arm64 image, via BuildKit.

``build.build_image`` is the entry point: it takes the source stage's ``PreparedSource`` and
an ``ImageJob`` (the frozen ``BuildOptions`` and the host, checked before the source is
prepared). ``tags`` names the image, ``base_image`` pins the base, ``context`` assembles the
build context, ``builder`` drives BuildKit, ``cubins`` checks what a source build compiled.
"""

from sparkbuild.image.build import SECTION, BuildOptions, ImageJob, ImageResult, build_image
from sparkbuild.image.tags import render_tags

__all__ = ["SECTION", "BuildOptions", "ImageJob", "ImageResult", "build_image", "render_tags"]
