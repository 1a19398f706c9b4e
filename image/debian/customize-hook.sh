#!/bin/sh
# mmdebstrap --customize-hook: runs on the host after every package is installed. $1 is
# the root; INFERLOOP_KEEP_MODULES names the kernel modules to keep (their dependencies
# are kept too), every other module is deleted and depmod rerun. The initrd was built with
# MODULES=list from modules this keeps, so it stays valid.
set -eu
root="$1"
keep="${INFERLOOP_KEEP_MODULES:-}"
# modprobe and depmod of the root being built (kmod is a required package), run through
# qemu-user: the build host needs no kmod of its own.
kmod() { chroot "$root" "$@"; }

for kdir in "$root"/usr/lib/modules/*; do
	[ -d "$kdir" ] || continue
	kver=$(basename "$kdir")
	if [ -n "$keep" ]; then
		list=$(mktemp)
		for m in $keep; do
			# Built-in or absent modules print nothing useful; that is fine.
			kmod /usr/sbin/modprobe -S "$kver" --show-depends "$m" 2>/dev/null || true
		done | sed -n 's/^insmod \([^ ]*\).*/\1/p' | xargs -r -n1 basename | sort -u > "$list"
		# An empty list means modprobe itself failed: deleting every module would give a
		# root that cannot mount its own disks.
		[ -s "$list" ] || { echo "customize-hook: no module of '$keep' found for $kver" >&2; exit 1; }
		find "$kdir/kernel" -type f -name '*.ko*' | while read -r f; do
			grep -qxF "$(basename "$f")" "$list" || rm -f "$f"
		done
		find "$kdir/kernel" -depth -type d -empty -delete
		rm -f "$list"
		kmod /usr/sbin/depmod "$kver"
	fi
done

# A DHCP client on every wired interface (systemd-networkd, part of systemd).
mkdir -p "$root/etc/systemd/network"
printf '[Match]\nType=ether\n\n[Network]\nDHCP=ipv4\n' > "$root/etc/systemd/network/20-wired.network"
chroot "$root" systemctl enable systemd-networkd.service >/dev/null 2>&1
printf 'inferloop\n' > "$root/etc/hostname"
# Maintenance jobs that write to the root (apt, dpkg backups, e2scrub snapshots) would fail
# on a read-only image and leave the system degraded.
chroot "$root" systemctl mask apt-daily.timer apt-daily-upgrade.timer dpkg-db-backup.timer \
	e2scrub_all.timer e2scrub_reap.service >/dev/null 2>&1

# The root is read-only at run time: systemd cannot create a unit's StateDirectory= there
# (systemd-logind's systemd/linger, say), so every one the packages' units name exists
# already. Writable state lives on /data.
sed -n 's/^StateDirectory=//p' "$root"/usr/lib/systemd/system/*.service | tr ' ' '\n' |
	while read -r d; do [ -n "$d" ] && mkdir -p "$root/var/lib/$d"; done

# The exact package set, for the manifest (hashed like every file) and for rebuilding.
mkdir -p "$root/usr/share/inferloop"
chroot "$root" dpkg-query -W -f '${Package}=${Version} ${Architecture}\n' | LC_ALL=C sort \
	> "$root/usr/share/inferloop/debian-packages.txt"

# Nothing host- or time-dependent: apt caches, logs, the resolver the build used.
rm -rf "$root"/var/lib/apt/lists/* "$root"/var/cache/apt/* "$root"/var/cache/debconf/*-old \
	"$root"/var/cache/ldconfig/aux-cache "$root"/var/log/* "$root"/etc/resolv.conf
: > "$root/etc/machine-id"
