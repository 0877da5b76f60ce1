# sparkbuild source build of vLLM for DGX Spark (GB10, sm_121a, aarch64, CUDA 13).
# The build context is the patched upstream tree. BASE_IMAGE is a CUDA 13 devel image with
# PyTorch for CUDA 13 (pinned by digest by sparkbuild). ccache and the pip cache persist
# across builds in BuildKit cache mounts.
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
ARG TORCH_CUDA_ARCH_LIST=12.1a
ARG CUDA_VERSION=13.0
ARG MAX_JOBS=
ARG SOURCE_DATE_EPOCH
ENV TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST} \
    CCACHE_DIR=/root/.ccache \
    VLLM_TARGET_DEVICE=cuda \
    PIP_NO_CACHE_DIR=0
WORKDIR /workspace/vllm
COPY . .
# MAX_JOBS: sparkbuild passes one from the builder's memory; a remote builder computes its own
# (one job per 8 GiB, at most one per core) when the argument is empty. NVCC_THREADS stays 1
# so that MAX_JOBS alone bounds memory.
RUN --mount=type=cache,target=/root/.cache/pip \
    --mount=type=cache,target=/root/.ccache \
    set -eux; \
    jobs="${MAX_JOBS:-$(awk -v cpus="$(nproc)" '/MemTotal/ {j=int($2/8388608); if (j>cpus) j=cpus; if (j<1) j=1; print j}' /proc/meminfo)}"; \
    export MAX_JOBS="$jobs" NVCC_THREADS=1; \
    command -v ccache || (apt-get update && apt-get install -y --no-install-recommends ccache); \
    python3 use_existing_torch.py; \
    python3 -m pip install -r requirements/build.txt; \
    python3 -m pip install --no-build-isolation -v .; \
    python3 -c "import vllm; print('vllm', vllm.__version__)"
