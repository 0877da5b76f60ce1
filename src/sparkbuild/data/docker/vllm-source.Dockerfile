# sparkbuild source build of vLLM for DGX Spark (GB10, sm_121a, aarch64, CUDA 13).
# The build context is the patched upstream tree. BASE_IMAGE defaults to the upstream release
# image of the same version (CUDA 13 with torch), pinned by digest in images.lock. sparkbuild
# passes the version-dependent arguments (requirements path, use_existing_torch: see
# sparkbuild/image/source_args.py). vLLM's CMake takes its targets from TORCH_CUDA_ARCH_LIST.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
# The build needs root (system site-packages, apt, /opt); the image ends as the base's own
# USER again, which sparkbuild reads from the base's config (empty: root).
USER root
ARG SPARKBUILD_BASE_USER=
ARG TORCH_CUDA_ARCH_LIST=12.1a
ARG CUDA_VERSION=13.0
ARG ENGINE_VERSION
ARG VLLM_BUILD_REQUIREMENTS=requirements/build/cuda.txt
ARG VLLM_USE_EXISTING_TORCH="tools/use_existing_torch.py --prefix"
ARG MAX_JOBS=
ARG GIB_PER_JOB=11
ARG CCACHE_MAXSIZE=30G
ARG SOURCE_DATE_EPOCH
# No .git in the context: VLLM_VERSION_OVERRIDE is upstream's way to set the version then.
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    FLASHINFER_CUDA_ARCH_LIST=12.1a \
    VLLM_VERSION_OVERRIDE=${ENGINE_VERSION} \
    VLLM_TARGET_DEVICE=cuda \
    CCACHE_DIR=/root/.ccache \
    CCACHE_MAXSIZE=${CCACHE_MAXSIZE} \
    CCACHE_COMPRESS=1 \
    CCACHE_COMPRESSLEVEL=6 \
    SPARKBUILD_WHEELS=/opt/sparkbuild/wheels \
    PIP_NO_CACHE_DIR=0
WORKDIR /workspace/vllm
COPY . .
# Jobs: MAX_JOBS when given, else one per GIB_PER_JOB of memory; NVCC_THREADS=1 so that
# MAX_JOBS alone bounds memory. Torch is held (use_existing_torch strips it from the
# requirements, and a constraints file pins the base's torch stack); vLLM goes in --no-deps.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.ccache \
    set -eux; \
    jobs="${MAX_JOBS:-$(awk -v gib="${GIB_PER_JOB}" -v cpus="$(nproc)" '/MemTotal/ {j=int($2/(gib*1048576)); if (j>cpus) j=cpus; if (j<1) j=1; print j}' /proc/meminfo)}"; \
    export MAX_JOBS="$jobs" NVCC_THREADS=1; \
    command -v ccache || (apt-get update && apt-get install -y --no-install-recommends ccache); \
    ccache --max-size="${CCACHE_MAXSIZE}"; \
    python3 -m pip freeze | grep -iE '^(torch|torchvision|torchaudio|triton|nvidia-[a-z0-9-]+)==' \
        > /tmp/sparkbuild-constraints.txt || true; \
    export PIP_CONSTRAINT=/tmp/sparkbuild-constraints.txt; \
    python3 ${VLLM_USE_EXISTING_TORCH}; \
    python3 -m pip install -r "${VLLM_BUILD_REQUIREMENTS}"; \
    python3 -m pip wheel --no-build-isolation --no-deps -v -w /tmp/wheels .; \
    mkdir -p "${SPARKBUILD_WHEELS}"; \
    cp /tmp/wheels/vllm-*.whl "${SPARKBUILD_WHEELS}/"; \
    python3 -m pip install --no-deps --force-reinstall "${SPARKBUILD_WHEELS}"/vllm-*.whl; \
    python3 -c "import importlib.metadata as m; print('vllm', m.version('vllm'))"
USER ${SPARKBUILD_BASE_USER:-root}
