# sparkbuild overlay: the upstream release image, pinned by digest, with the Python files that
# the build's PRs and patches changed laid over its installed package. sparkbuild fills in the
# build arguments; the build context holds only the overlay (files/, manifest.json, helper).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG SPARKBUILD_PYTHON=python3
ARG SPARKBUILD_INSTALL_DIR=
ARG SOURCE_DATE_EPOCH
# One layer: copy changed files, delete deleted ones, byte-compile what changed, so a syntax
# error fails the build instead of the first server start.
RUN --mount=type=bind,target=/tmp/sparkbuild-overlay \
    "${SPARKBUILD_PYTHON}" /tmp/sparkbuild-overlay/apply_overlay.py
