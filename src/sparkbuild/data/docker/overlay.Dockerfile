# sparkbuild overlay: the upstream release image, pinned by digest, with the Python files that
# the build's PRs and patches changed laid over its installed package. sparkbuild fills in the
# build arguments; the build context holds only the overlay (files/, manifest.json, helper).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG SPARKBUILD_PYTHON=python3
ARG SPARKBUILD_INSTALL_DIR=
# The base's own USER, read from its config by sparkbuild: the overlay is applied as root
# (the package usually belongs to root even when the image runs as another user), then the
# image runs as that user again, exactly like the upstream release.
ARG SPARKBUILD_BASE_USER=
ARG SOURCE_DATE_EPOCH
USER root
# One layer: copy changed files, delete deleted ones, byte-compile what changed, so a syntax
# error fails the build instead of the first server start. The package is located as the
# base's user, from its WORKDIR, the way the engine will import it.
RUN --mount=type=bind,target=/tmp/sparkbuild-overlay \
    SPARKBUILD_RUN_AS="${SPARKBUILD_BASE_USER}" \
    "${SPARKBUILD_PYTHON}" /tmp/sparkbuild-overlay/apply_overlay.py
USER ${SPARKBUILD_BASE_USER:-root}
