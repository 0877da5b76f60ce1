# sparkbuild source build of SGLang for DGX Spark (GB10, sm_121a, aarch64, CUDA 13).
# Follows the community Spark recipe (sm_121a only; FA3, FlashMLA and the sm90 target off;
# one nvcc thread per job as a CMake define; jobs sized by memory; torch held).
# The build context is the patched upstream tree. BASE_IMAGE defaults to the upstream release
# image of the same version (a CUDA 13 devel image with torch), pinned by digest in
# images.lock. sparkbuild passes the version-dependent arguments (kernel directory, wheel name:
# see sparkbuild/image/source_args.py). The kernel CMake's hardcoded gencode lists arrive
# here already pruned to sm_121a, FA3/FlashMLA/sm90 targets removed, by the spec's
# sm121a-prune source step (`steps:`, with `when` ranges; docs/image.md); sparkbuild checks
# the built wheel's cubins either way and fails on any arch but sm_121a.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# The build needs root (system site-packages, apt, /opt); the image ends as the base's own
# USER again, which sparkbuild reads from the base's config (empty: root).
USER root
ARG SPARKBUILD_BASE_USER=
ARG TORCH_CUDA_ARCH_LIST=12.1a
ARG CUDA_VERSION=13.0
ARG ENGINE_VERSION
ARG SGL_KERNEL_DIR=python/sglang/kernels/aot
ARG SGL_KERNEL_WHEEL=sglang_kernel
ARG MAX_JOBS=
ARG GIB_PER_JOB=11
ARG CCACHE_MAXSIZE=30G
ARG SOURCE_DATE_EPOCH
# No .git in the context: setuptools-scm takes the version from here, not 0.0.0.dev0.
# SPARKBUILD_WHEELS: the built wheels stay in the image; sparkbuild lists their cubins.
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    FLASHINFER_CUDA_ARCH_LIST=12.1a \
    SETUPTOOLS_SCM_PRETEND_VERSION=${ENGINE_VERSION} \
    CCACHE_DIR=/root/.ccache \
    CCACHE_MAXSIZE=${CCACHE_MAXSIZE} \
    CCACHE_COMPRESS=1 \
    CCACHE_COMPRESSLEVEL=6 \
    CMAKE_C_COMPILER_LAUNCHER=ccache \
    CMAKE_CXX_COMPILER_LAUNCHER=ccache \
    CMAKE_CUDA_COMPILER_LAUNCHER=ccache \
    SPARKBUILD_WHEELS=/opt/sparkbuild/wheels \
    PIP_NO_CACHE_DIR=0
WORKDIR /sgl-workspace/sglang
COPY . .
# Jobs: MAX_JOBS when given, else one per GIB_PER_JOB of memory (at most one per core).
# Torch and its CUDA stack are held at the base's versions with a constraints file, and the
# engine goes in --no-deps over the base's resolved set, so the kernel ABI stays the base's.
# No `import sgl_kernel` here: BuildKit steps have no GPU driver (libcuda) to load it with.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.ccache \
    set -eux; \
    jobs="${MAX_JOBS:-$(awk -v gib="${GIB_PER_JOB}" -v cpus="$(nproc)" '/MemTotal/ {j=int($2/(gib*1048576)); if (j>cpus) j=cpus; if (j<1) j=1; print j}' /proc/meminfo)}"; \
    export MAX_JOBS="$jobs" CMAKE_BUILD_PARALLEL_LEVEL="$jobs"; \
    command -v ccache || (apt-get update && apt-get install -y --no-install-recommends ccache); \
    ccache --max-size="${CCACHE_MAXSIZE}"; \
    python3 -m pip freeze | grep -iE '^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==' \
        > /tmp/sparkbuild-constraints.txt || true; \
    export PIP_CONSTRAINT=/tmp/sparkbuild-constraints.txt; \
    python3 -m pip install "scikit-build-core>=0.10" "cmake>=3.31" ninja setuptools wheel; \
    cd "${SGL_KERNEL_DIR}"; \
    python3 -m pip wheel --no-build-isolation --no-deps -w /tmp/wheels \
        --config-settings=cmake.define.SGL_KERNEL_COMPILE_THREADS=1 \
        --config-settings=cmake.define.ENABLE_BELOW_SM90=OFF \
        --config-settings=cmake.define.SGL_KERNEL_BUILD_SM90=OFF \
        --config-settings=cmake.define.SGL_KERNEL_ENABLE_FA3=OFF \
        --config-settings=cmake.define.SGL_KERNEL_ENABLE_FLASHMLA=OFF \
        --config-settings=cmake.define.CMAKE_POLICY_VERSION_MINIMUM=3.5 \
        --config-settings=build-dir=/tmp/sgl-kernel-build .; \
    mkdir -p "${SPARKBUILD_WHEELS}"; \
    set -- /tmp/wheels/"${SGL_KERNEL_WHEEL}"-*.whl; \
    if [ ! -f "$1" ]; then \
        echo "sparkbuild: no ${SGL_KERNEL_WHEEL}-*.whl built; got: $(ls /tmp/wheels)" >&2; exit 1; \
    fi; \
    cp "$@" "${SPARKBUILD_WHEELS}/"; \
    python3 -m pip install --no-deps --force-reinstall "$@"; \
    cd /sgl-workspace/sglang/python; \
    python3 -m pip install --no-build-isolation --no-deps .; \
    python3 -c "import importlib.metadata as m; print('sglang', m.version('sglang'))"
USER ${SPARKBUILD_BASE_USER:-root}
