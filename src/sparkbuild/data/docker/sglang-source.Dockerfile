# sparkbuild source build of SGLang for DGX Spark (GB10, sm_121a, aarch64, CUDA 13).
# The build context is the patched upstream tree. BASE_IMAGE is a CUDA 13 devel image with
# PyTorch for CUDA 13 (pinned by digest by sparkbuild). Hours on a Spark; ccache and the pip
# cache persist across builds in BuildKit cache mounts.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TORCH_CUDA_ARCH_LIST=12.1a
ARG CUDA_VERSION=13.0
ARG MAX_JOBS=
ARG SOURCE_DATE_EPOCH
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    CCACHE_DIR=/root/.ccache \
    CMAKE_C_COMPILER_LAUNCHER=ccache \
    CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    CMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    PIP_NO_CACHE_DIR=0
WORKDIR /sgl-workspace/sglang
COPY . .
# MAX_JOBS: sparkbuild passes one from the builder's memory; a remote builder computes its own
# (one job per 8 GiB, at most one per core) when the argument is empty.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.ccache \
    set -eux; \
    jobs="${MAX_JOBS:-$(awk -v cpus="$(nproc)" '/MemTotal/ {j=int($2/8388608); if (j>cpus) j=cpus; if (j<1) j=1; print j}' /proc/meminfo)}"; \
    export MAX_JOBS="$jobs" CMAKE_BUILD_PARALLEL_LEVEL="$jobs" SGL_KERNEL_COMPILE_THREADS="$jobs"; \
    command -v ccache || (apt-get update && apt-get install -y --no-install-recommends ccache); \
    python3 -m pip install --upgrade pip scikit-build-core cmake ninja setuptools wheel; \
    cd sgl-kernel; \
    python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/wheels \
        -Ccmake.define.SGL_KERNEL_ENABLE_SM100A=OFF \
        -Ccmake.define.CMAKE_CUDA_ARCHITECTURES=121a \
        -Cbuild-dir=/tmp/sgl-kernel-build .; \
    python3 -m pip install --no-deps /tmp/wheels/sgl_kernel-*.whl; \
    cd ../python; \
    python3 -m pip install --no-build-isolation ".[all]"; \
    python3 -c "import sglang, sgl_kernel; print('sglang', sglang.__version__)"
