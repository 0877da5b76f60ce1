# sparkbuild source build of llama.cpp's llama-server for DGX Spark (GB10, sm_121a, aarch64,
# CUDA 13). The build context is the patched upstream tree at a bNNNN release. BASE_IMAGE is a
# CUDA 13 devel image (no torch: llama.cpp needs the toolkit only), pinned by digest in
# images.lock. sparkbuild passes CMAKE_CUDA_ARCHITECTURES (the adapter's: 121a-real) and the
# release as ENGINE_VERSION.
#
# As upstream's .devops/cuda.Dockerfile: GGML_BACKEND_DL, so the CUDA backend is a library
# loaded at start and the same binary runs on a CPU without a GPU (sparkbuild's preflight asks
# it its version, its flag parser and a model load there); GGML_CPU_ALL_VARIANTS for the
# Grace CPU. No .git in the context, so the build number is given (the server reports it in
# --version and /props). The UI is not built (no node here; upstream fetches a prebuilt one).
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
USER root
ARG SPARKBUILD_BASE_USER=
ARG CMAKE_CUDA_ARCHITECTURES=121a-real
ARG CUDA_VERSION=13.0
ARG ENGINE_VERSION
ARG MAX_JOBS=
ARG GIB_PER_JOB=11
ARG CCACHE_MAXSIZE=30G
ARG SOURCE_DATE_EPOCH
ENV CCACHE_DIR=/root/.ccache \
    CCACHE_MAXSIZE=${CCACHE_MAXSIZE} \
    CCACHE_COMPRESS=1
WORKDIR /workspace/llama.cpp
COPY . .
# Jobs: MAX_JOBS when given, else one per GIB_PER_JOB of memory (nvcc on sm_121a peaks at
# several GiB per job), at most one per CPU.
RUN --mount=type=cache,target=/root/.ccache \
    set -eux; \
    jobs="${MAX_JOBS:-$(awk -v gib="${GIB_PER_JOB}" -v cpus="$(nproc)" '/MemTotal/ {j=int($2/(gib*1048576)); if (j>cpus) j=cpus; if (j<1) j=1; print j}' /proc/meminfo)}"; \
    apt-get update; \
    apt-get install -y --no-install-recommends cmake ninja-build ccache libssl-dev libgomp1; \
    rm -rf /var/lib/apt/lists/*; \
    cmake -S . -B build -G Ninja \
        -DCMAKE_BUILD_TYPE=Release \
        -DCMAKE_C_COMPILER_LAUNCHER=ccache -DCMAKE_CXX_COMPILER_LAUNCHER=ccache \
        -DCMAKE_CUDA_COMPILER_LAUNCHER=ccache \
        -DGGML_CUDA=ON -DCMAKE_CUDA_ARCHITECTURES="${CMAKE_CUDA_ARCHITECTURES}" \
        -DGGML_NATIVE=OFF -DGGML_BACKEND_DL=ON -DGGML_CPU_ALL_VARIANTS=ON \
        -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_USE_PREBUILT_UI=OFF \
        -DLLAMA_BUILD_NUMBER="${ENGINE_VERSION}" -DLLAMA_BUILD_COMMIT=sparkbuild \
        -DCMAKE_EXE_LINKER_FLAGS=-Wl,--allow-shlib-undefined; \
    cmake --build build --target llama-server -j "${jobs}"; \
    mkdir -p /opt/llama.cpp; \
    cp build/bin/llama-server /opt/llama.cpp/; \
    find build -name '*.so*' -exec cp -P {} /opt/llama.cpp/ \; ; \
    echo /opt/llama.cpp > /etc/ld.so.conf.d/llama-cpp.conf; \
    ldconfig; \
    ln -sf /opt/llama.cpp/llama-server /usr/local/bin/llama-server; \
    /opt/llama.cpp/llama-server --version
USER ${SPARKBUILD_BASE_USER:-root}
