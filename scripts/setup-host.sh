#!/usr/bin/env bash
# Prepare a Debian/Ubuntu host for sparkbuild builds and tests, idempotently:
#   - install what is missing: docker.io, qemu-user-static, binfmt-support, docker-registry,
#     debootstrap, apache2-utils (htpasswd), chromium and chromium-driver (the report's
#     browser test), skopeo (copies a signed image with its signature, docs/verify.md),
#     openssh-server (the ssh:// cluster test starts its own sshd on 127.0.0.1; the
#     package's own daemon is not started here), cmake and g++ (the tests build llama.cpp's
#     llama-server for the CPU, once per machine); on non-arm64 hosts gcc-aarch64-linux-gnu
#     (the device-code audit's test libraries);
#   - start a Docker daemon when none answers;
#   - on non-arm64 hosts, enable linux/arm64 emulation (binfmt_misc + qemu-aarch64).
# As root it does all of this; as another user it prints the exact commands to run instead.
# Safe to run again: every step checks first and does nothing when it is already done.
set -euo pipefail

DOCKERD_LOG="${SPARKBUILD_DOCKERD_LOG:-/var/log/sparkbuild-dockerd.log}"
SOCKET="/var/run/docker.sock"
ARCH="$(uname -m)"

say() { printf 'setup-host: %s\n' "$*" >&2; }

need_emulation() { [[ "$ARCH" != "aarch64" && "$ARCH" != "arm64" ]]; }

# command -> Debian package providing it. A command already on PATH (e.g. docker-ce's
# dockerd) counts as installed, so a host with Docker's own packages is left alone.
missing_packages() {
    local -a pairs=(
        "dockerd:docker.io"
        "docker-registry:docker-registry"
        "debootstrap:debootstrap"
        "htpasswd:apache2-utils"
        "chromium:chromium"
        "chromedriver:chromium-driver"
        "skopeo:skopeo"
        "sshd:openssh-server"
        "cmake:cmake"
        "g++:g++"
    )
    if need_emulation; then
        pairs+=("qemu-aarch64-static:qemu-user-static" "update-binfmts:binfmt-support")
        # the device-code audit's tests pack nvcc's output into aarch64 shared libraries
        pairs+=("aarch64-linux-gnu-gcc:gcc-aarch64-linux-gnu")
    fi
    local pair cmd pkg
    for pair in "${pairs[@]}"; do
        cmd="${pair%%:*}"
        pkg="${pair#*:}"
        if ! command -v "$cmd" >/dev/null 2>&1 && ! [[ -x "/usr/sbin/$cmd" || -x "/usr/bin/$cmd" ]]; then
            printf '%s\n' "$pkg"
        fi
    done
}

docker_answers() {
    local client
    for client in /usr/bin/docker "$(command -v docker 2>/dev/null || true)"; do
        if [[ -n "$client" && -x "$client" ]] && "$client" version --format '{{.Server.Version}}' >/dev/null 2>&1; then
            return 0
        fi
    done
    return 1
}

binfmt_mounted() { [[ -e /proc/sys/fs/binfmt_misc/status ]]; }

arm64_enabled() { [[ -f /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] && grep -q '^enabled' /proc/sys/fs/binfmt_misc/qemu-aarch64; }

print_commands() {
    local -a pkgs
    mapfile -t pkgs < <(missing_packages)
    say "not running as root; run these commands (or: sudo $0):"
    if ((${#pkgs[@]})); then
        echo "sudo apt-get update"
        echo "sudo DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends ${pkgs[*]}"
    fi
    # A socket we may not read still means a daemon runs; only its permissions are missing.
    if ! docker_answers && ! [[ -S "$SOCKET" ]]; then
        if [[ -d /run/systemd/system ]]; then
            echo "sudo systemctl start docker"
        else
            echo "sudo setsid dockerd >$DOCKERD_LOG 2>&1 < /dev/null &"
        fi
    fi
    if need_emulation; then
        binfmt_mounted || echo "sudo mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc"
        arm64_enabled || echo "sudo update-binfmts --enable qemu-aarch64"
    fi
    echo "sudo usermod -aG docker $(id -un)   # then log in again, to use docker without sudo"
}

install_packages() {
    local -a pkgs
    mapfile -t pkgs < <(missing_packages)
    if ((${#pkgs[@]} == 0)); then
        say "packages: all present"
        return
    fi
    say "installing: ${pkgs[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${pkgs[@]}"
}

start_docker() {
    if docker_answers; then
        say "docker: daemon answers"
        return
    fi
    if [[ -d /run/systemd/system ]] && command -v systemctl >/dev/null 2>&1; then
        say "docker: systemctl start docker"
        systemctl start docker || true
    fi
    if ! docker_answers; then
        local dockerd
        dockerd="$(command -v dockerd || echo /usr/sbin/dockerd)"
        say "docker: starting $dockerd (log: $DOCKERD_LOG)"
        mkdir -p "$(dirname "$DOCKERD_LOG")"
        setsid "$dockerd" >>"$DOCKERD_LOG" 2>&1 </dev/null &
    fi
    local i
    for i in $(seq 1 60); do
        if [[ -S "$SOCKET" ]] && docker_answers; then
            say "docker: daemon up after ${i}s"
            return
        fi
        sleep 1
    done
    say "docker: the daemon did not answer within 60 s; last lines of $DOCKERD_LOG:"
    tail -n 20 "$DOCKERD_LOG" >&2 || true
    exit 1
}

enable_emulation() {
    if ! need_emulation; then
        say "emulation: not needed on $ARCH"
        return
    fi
    if ! binfmt_mounted; then
        say "emulation: mounting binfmt_misc"
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    if ! arm64_enabled; then
        say "emulation: update-binfmts --enable qemu-aarch64"
        update-binfmts --enable qemu-aarch64
    fi
    if arm64_enabled; then
        say "emulation: linux/arm64 enabled"
    else
        say "emulation: qemu-aarch64 is not registered in /proc/sys/fs/binfmt_misc"
        exit 1
    fi
}

# BuildKit keeps every test build's layers; without a bound its cache grew to 48 GB on a
# 252 GB build host over a few dozen suite runs and filled the disk. Keep the newest layers,
# which are the ones the next run reuses.
bound_build_cache() {
    local keep="${SPARKBUILD_BUILD_CACHE_KEEP:-10GB}"
    if docker builder prune --force --keep-storage "$keep" >/dev/null 2>&1; then
        say "docker: build cache bounded to $keep"
    fi
}

# A full test run writes ~5 GB under the temporary directory and, cold, ~25 GB of caches
# (preflight venvs, root filesystems, the CPU engine). A disk that fills mid-run fails
# twenty minutes in with ENOSPC in unrelated tests, so say it before anything starts.
warn_low_disk() {
    local want_gb="${SPARKBUILD_MIN_FREE_GB:-20}" dir mount free_gb seen=" "
    for dir in "${TMPDIR:-/tmp}" "${XDG_CACHE_HOME:-$HOME/.cache}"; do
        mkdir -p "$dir"
        mount="$(df --output=target "$dir" | tail -1)"
        [[ "$seen" == *" $mount "* ]] && continue
        seen+="$mount "
        free_gb="$(df --output=avail -BG "$dir" | tail -1 | tr -dc '0-9')"
        if (( free_gb < want_gb )); then
            say "disk: only ${free_gb} GB free under $dir (a test run wants ${want_gb} GB);" \
                "old runs' temporary files are under ${TMPDIR:-/tmp}/pytest-of-$(id -un)," \
                "the test caches under ${XDG_CACHE_HOME:-$HOME/.cache}/sparkbuild-tests"
        fi
    done
}

warn_low_disk
if [[ "$(id -u)" != 0 ]]; then
    print_commands
    exit 0
fi
if ! command -v apt-get >/dev/null 2>&1; then
    say "this script supports Debian/Ubuntu (apt-get); install the equivalents of:" \
        "docker.io qemu-user-static binfmt-support docker-registry debootstrap apache2-utils" \
        "chromium chromium-driver"
    exit 1
fi
install_packages
start_docker
bound_build_cache
enable_emulation
say "done"
