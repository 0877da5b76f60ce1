# sparkbuild test data: a source-mode Dockerfile shaped like sparkbuild's sglang-source
# template, for the spark_kernel extension (CUDA 13 nvcc from PyPI in the base image).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TORCH_CUDA_ARCH_LIST=12.1a
ARG CUDA_VERSION=13.0
ARG MAX_JOBS=
ARG SOURCE_DATE_EPOCH
# sparkbuild checks the cubins of the wheels kept here after the build.
ENV SPARKBUILD_WHEELS=/opt/sparkbuild/wheels
WORKDIR /src
COPY . .
# The thread count is a CMake cache variable (-D), as for sgl-kernel; jobs come from MAX_JOBS.
# FA3 and below-sm90 off as in the sglang template (FA3 is forced on regardless here).
RUN set -eux; \
    export CMAKE_BUILD_PARALLEL_LEVEL="${MAX_JOBS:-1}"; \
    python3 -m pip wheel --no-build-isolation --no-deps --no-index -w /tmp/wheels \
        --config-settings=cmake.define.SGL_KERNEL_COMPILE_THREADS=1 \
        --config-settings=cmake.define.ENABLE_BELOW_SM90=OFF \
        --config-settings=cmake.define.SGL_KERNEL_ENABLE_FA3=OFF \
        --config-settings=build-dir=/tmp/spark-kernel-build .; \
    mkdir -p "$SPARKBUILD_WHEELS"; \
    cp /tmp/wheels/spark_kernel-*.whl "$SPARKBUILD_WHEELS"/; \
    python3 -m pip install --no-deps --no-index --break-system-packages \
        "$SPARKBUILD_WHEELS"/spark_kernel-*.whl
