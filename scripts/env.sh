# shellcheck shell=bash
# Shared settings for the project's scripts. Sourced, never run.
#
# Every path the harness writes outside the repository lives under $SOFTROCE_CACHE, so a fresh
# clone reuses what an earlier run installed (the kernel, virtme-ng) and nothing is downloaded twice.

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)
export SOFTROCE_CACHE=${SOFTROCE_CACHE:-${XDG_CACHE_HOME:-$HOME/.cache}/rdma-rs/softroce}

# The default build needs no libclang (rdma-verbs-sys's bindings are checked in). Only the optional
# `rdma-sys` feature does: rdma-sys 0.3.0 generates its bindings with bindgen 0.59, which panics on
# the headers as parsed by libclang 16 and newer, and clang-sys picks the newest libclang it finds.
# `rdma_sys_env CMD...` runs CMD with LLVM 14 (Debian 12's default) or 15 pinned, unless the caller
# chose a libclang already.
rdma_sys_env() {
    local path=${LIBCLANG_PATH:-} v
    if [ -z "$path" ]; then
        for v in 14 15; do
            if [ -e "/usr/lib/llvm-$v/lib/libclang.so" ] || [ -e "/usr/lib/llvm-$v/lib/libclang-$v.so.1" ]; then
                path=/usr/lib/llvm-$v/lib
                break
            fi
        done
    fi
    [ -n "$path" ] || die "the rdma-sys feature needs libclang 14 or 15 (apt install libclang-14-dev)"
    LIBCLANG_PATH=$path "$@"
}

# Pinned tool versions.
VIRTME_NG_VERSION=1.42
BINDGEN_VERSION=0.73.2

VENV="$SOFTROCE_CACHE/venv"
KERNEL_DIR="$SOFTROCE_CACHE/kernel"
VNG="$VENV/bin/vng"

# The guest kernels, by series: Debian 12's own (6.1, the default) and the 6.12 that Debian 12's
# security suite carries (source package linux-signed-6.12-amd64, bookworm-security). Each is the
# package its meta-package depends on, unpacked under $KERNEL_DIR and found through a link.
# SOFTROCE_KERNEL picks the one scripts/softroce boots.
KERNELS=(6.1 6.12)
SOFTROCE_KERNEL=${SOFTROCE_KERNEL:-6.1}
kernel_meta() {
    case $1 in
    6.1) echo linux-image-amd64 ;;
    6.12) echo linux-image-6.12-amd64 ;;
    *) die "unknown guest kernel '$1' (known: ${KERNELS[*]})" ;;
    esac
}
# The link to the unpacked tree: 6.1's keeps its first name, so existing caches stay valid.
kernel_link() {
    case $1 in
    6.1) echo "$KERNEL_DIR/current" ;;
    *) echo "$KERNEL_DIR/$1" ;;
    esac
}

log() { printf '==> %s\n' "$*" >&2; }
die() { printf 'error: %s\n' "$*" >&2; exit 1; }

need_root() {
    [ "$(id -u)" = 0 ] || die "$1 needs root (it installs Debian packages and builds network devices in the VM); run it with sudo"
}
