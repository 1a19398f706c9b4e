#!/usr/bin/env bash
# The two update bundles `make vm-test` installs inside the VM, built from the VM spec with
# only what each case needs changed (the Debian base comes from the builder's cache, so
# both reuse slot A's tree):
#   good.raucb  version 1.1.0
#   bad.raucb   version 1.0.1 whose model pin is wrong: inferloopd refuses the weights
#               (exit 3), so the post-boot health check fails and rolls back
#
#   scripts/vm-bundles.sh SPEC OUTDIR KEYDIR
set -euo pipefail

spec="$1"
out="$2"
keys="$3"
ROOT="$(cd "$(dirname "$0")/.." && pwd)"
BIN="${INFERLOOP_IMAGE:-$ROOT/target/release/inferloop-image}"
spec_dir="$(cd "$(dirname "$spec")" && pwd)"
mkdir -p "$out"

variant() {
	local name="$1" version="$2" sha="${3:-}"
	local s="$out/$name.toml"
	# The copy lives elsewhere: its relative paths become absolute.
	sed -e "s|\"\\.\\./|\"$spec_dir/../|g" \
		-e "s|^version = \"[^\"]*\"|version = \"$version\"|" "$spec" >"$s"
	if [[ -n "$sha" ]]; then
		sed -i "s|^sha256 = \"[0-9a-f]*\"|sha256 = \"$sha\"|" "$s"
	fi
	local t=$SECONDS
	"$BIN" build --spec "$s" --out "$out/image-$name" --no-tarball \
		--base-cache "$ROOT/out/debian-cache"
	"$BIN" bundle --spec "$s" --image "$out/image-$name" --format verity \
		--cert "$keys/signing.cert.pem" --key "$keys/signing.key.pem" \
		--keyring "$keys/ca.cert.pem" --out "$out/$name.raucb" --force
	echo "vm-bundles: $name.raucb ($version) in $((SECONDS - t)) s, $(stat -c %s "$out/$name.raucb") bytes"
}

variant good 1.1.0
variant bad 1.0.1 "$(printf '0%.0s' $(seq 64))"
