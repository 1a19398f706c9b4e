#!/bin/sh
# mmdebstrap --essential-hook: runs on the host after the essential packages, before the
# kernel and the rest are installed. $1 is the root being built.
set -eu
root="$1"
mkdir -p "$root/etc/initramfs-tools/conf.d" "$root/etc/initramfs-tools/hooks"
# MODULES=list: only the modules named by hooks, not every driver of the build host.
printf 'MODULES=list\nCOMPRESS=zstd\n' > "$root/etc/initramfs-tools/conf.d/inferloop"
install -m 0755 "$(dirname "$0")/initramfs-hook" "$root/etc/initramfs-tools/hooks/inferloop"
