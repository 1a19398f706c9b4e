#!/usr/bin/env bash
# Installs what `make image-debian` and `make vm-test` need on a Debian 12 host (root):
# mmdebstrap to build the root, squashfs/e2fs tools to pack it, RAUC to make bundles, and
# the QEMU that boots it. Idempotent: installs only what is missing.
#
#   scripts/install-vm-deps.sh [amd64|arm64]     (default amd64)
#
# arm64 also needs qemu-user-static and binfmt_misc: mmdebstrap runs the arm64 maintainer
# scripts through them (mounted here when it is not).
set -euo pipefail

arch="${1:-amd64}"
PKGS=(mmdebstrap squashfs-tools e2fsprogs arch-test rauc rauc-service dbus openssl python3 curl)
case "$arch" in
amd64) PKGS+=(qemu-system-x86) ;;
arm64) PKGS+=(qemu-user-static binfmt-support qemu-system-arm ipxe-qemu) ;;
*) echo "install-vm-deps: unknown architecture '$arch' (amd64 or arm64)" >&2; exit 2 ;;
esac

log() { echo "install-vm-deps: $*"; }

missing=()
for p in "${PKGS[@]}"; do
    dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q 'install ok installed' || missing+=("$p")
done
if [[ ${#missing[@]} -gt 0 ]]; then
    [[ "$(id -u)" -eq 0 ]] || { echo "install-vm-deps: missing ${missing[*]}; run as root" >&2; exit 1; }
    log "installing: ${missing[*]}"
    export DEBIAN_FRONTEND=noninteractive
    apt-get update -q
    apt-get install -y -q --no-install-recommends "${missing[@]}"
else
    log "all present"
fi

if [[ "$arch" == arm64 ]]; then
    if ! mountpoint -q /proc/sys/fs/binfmt_misc; then
        log "mounting binfmt_misc"
        mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
    fi
    # qemu-user-static registers its handlers through binfmt-support; do it again in case
    # the mount above came after the package's postinst.
    if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
        update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
    fi
    [[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || { echo "install-vm-deps: no qemu-aarch64 binfmt handler" >&2; exit 1; }
fi
log "ok"
