#!/usr/bin/env bash
# Installs what `make image-debian` and `make vm-test` need on a Debian 12 host (root):
# mmdebstrap + qemu-user-static/binfmt to build an arm64 root, qemu-system-arm to boot it,
# squashfs/e2fs tools to pack it, RAUC to make bundles. Idempotent: installs only what is
# missing, and mounts binfmt_misc when it is not mounted (mmdebstrap runs arm64 maintainer
# scripts through it).
set -euo pipefail

PKGS=(mmdebstrap qemu-user-static binfmt-support qemu-system-arm ipxe-qemu squashfs-tools
      e2fsprogs arch-test rauc rauc-service dbus openssl python3 curl)

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

if ! mountpoint -q /proc/sys/fs/binfmt_misc; then
    log "mounting binfmt_misc"
    mount -t binfmt_misc binfmt_misc /proc/sys/fs/binfmt_misc
fi
# qemu-user-static registers its handlers through binfmt-support; do it again in case the
# mount above came after the package's postinst.
if [[ ! -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]]; then
    update-binfmts --enable qemu-aarch64 >/dev/null 2>&1 || true
fi
[[ -e /proc/sys/fs/binfmt_misc/qemu-aarch64 ]] || { echo "install-vm-deps: no qemu-aarch64 binfmt handler" >&2; exit 1; }
log "ok"
