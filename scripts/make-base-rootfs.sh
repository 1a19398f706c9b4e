#!/usr/bin/env bash
# Writes a minimal base root filesystem skeleton into DIR (default out/base-rootfs) for
# the example image spec: the directory layout, passwd/group and os-release. It is not
# bootable on its own (no libc, no systemd); a product image starts from the L4T sample
# root filesystem instead. Modes are set explicitly so the umask does not leak in.
set -euo pipefail

dir="${1:-out/base-rootfs}"
rm -rf "$dir"
mkdir -p "$dir"
cd "$dir"

install -d -m 0755 etc usr usr/bin usr/sbin usr/lib usr/share var var/lib var/cache
install -d -m 0700 root
install -d -m 1777 tmp var/tmp
ln -s usr/bin bin
ln -s usr/sbin sbin
ln -s usr/lib lib

printf 'root:x:0:0:root:/root:/bin/sh\nnobody:x:65534:65534:nobody:/nonexistent:/usr/sbin/nologin\n' > etc/passwd
printf 'root:x:0:\nnogroup:x:65534:\n' > etc/group
printf 'root:*:::::::\nnobody:*:::::::\n' > etc/shadow
printf 'inferloop\n' > etc/hostname
cat > etc/os-release <<'OS'
NAME="InferLoop base skeleton"
ID=inferloop-skeleton
PRETTY_NAME="InferLoop base skeleton (not bootable)"
OS
chmod 0644 etc/passwd etc/group etc/hostname etc/os-release
chmod 0640 etc/shadow
echo "make-base-rootfs: wrote $PWD"
