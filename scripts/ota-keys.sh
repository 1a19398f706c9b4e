#!/usr/bin/env bash
# Development PKI for RAUC bundles: a CA (the keyring a device trusts) and a code-signing
# certificate it issued (what `inferloop-image bundle` signs with).
#
#   scripts/ota-keys.sh [--force] [OUTDIR]      (default OUTDIR: out/ota-keys)
#
# Writes OUTDIR/ca.cert.pem (install as the keyring), OUTDIR/ca.key.pem,
# OUTDIR/signing.cert.pem and OUTDIR/signing.key.pem. Existing keys are kept unless --force:
# a new CA would lock out every device that trusts the old one. Each run on a new OUTDIR
# makes an unrelated CA (tests use that for "untrusted signer").
#
# RAUC 1.8 with `check-purpose=codesign` refuses a signer without extendedKeyUsage
# codeSigning ("unsuitable certificate purpose"), so the signing cert carries it.
set -euo pipefail

force=0
out=""
for arg in "$@"; do
  case "$arg" in
    --force) force=1 ;;
    -h|--help) sed -n '2,13p' "$0" | sed 's/^# \{0,1\}//'; exit 0 ;;
    -*) echo "ota-keys.sh: unknown option $arg" >&2; exit 2 ;;
    *)
      if [[ -n "$out" ]]; then echo "ota-keys.sh: one OUTDIR only" >&2; exit 2; fi
      out="$arg" ;;
  esac
done
out="${out:-out/ota-keys}"
# Dev keys live for 10 years so a forgotten test box still verifies; a product CA is
# managed elsewhere (see docs/images-and-ota.md, "Updating a device: RAUC A/B").
days="${OTA_KEYS_DAYS:-3650}"

command -v openssl >/dev/null || { echo "ota-keys.sh: openssl not found (apt-get install openssl)" >&2; exit 1; }

files=(ca.cert.pem ca.key.pem signing.cert.pem signing.key.pem)
present=0
for f in "${files[@]}"; do [[ -e "$out/$f" ]] && present=$((present + 1)); done
if (( present == ${#files[@]} && force == 0 )); then
  echo "ota-keys: keeping the existing keys in $out (--force makes new ones)"
  exit 0
fi
if (( present > 0 && force == 0 )); then
  echo "ota-keys.sh: $out holds only some of ${files[*]}; remove them or pass --force" >&2
  exit 1
fi

mkdir -p "$out"
work="$(mktemp -d "$out/.ota-keys.XXXXXX")"
trap 'rm -rf "$work"' EXIT

cat > "$work/openssl.cnf" <<'CNF'
[req]
distinguished_name = dn
prompt = no
[dn]
[ca_ext]
basicConstraints = critical, CA:TRUE
keyUsage = critical, keyCertSign, cRLSign
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid:always
[signing_ext]
basicConstraints = critical, CA:FALSE
keyUsage = critical, digitalSignature
extendedKeyUsage = critical, codeSigning
subjectKeyIdentifier = hash
authorityKeyIdentifier = keyid, issuer
CNF

# A random suffix in the subject tells two development CAs apart in `rauc info`.
tag="$(openssl rand -hex 4)"
umask 077
openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -config "$work/openssl.cnf" -extensions ca_ext -days "$days" \
  -subj "/O=InferLoop development/CN=InferLoop development CA $tag" \
  -keyout "$work/ca.key.pem" -out "$work/ca.cert.pem" 2>/dev/null
openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
  -config "$work/openssl.cnf" \
  -subj "/O=InferLoop development/CN=InferLoop development signing $tag" \
  -keyout "$work/signing.key.pem" -out "$work/signing.csr.pem" 2>/dev/null
openssl x509 -req -in "$work/signing.csr.pem" -days "$days" \
  -CA "$work/ca.cert.pem" -CAkey "$work/ca.key.pem" -set_serial "0x$(openssl rand -hex 8)" \
  -extfile "$work/openssl.cnf" -extensions signing_ext \
  -out "$work/signing.cert.pem" 2>/dev/null
# OpenSSL 3.0 knows no "codesign" verify purpose (RAUC registers its own), so check the
# chain and the extension separately.
openssl verify -CAfile "$work/ca.cert.pem" "$work/signing.cert.pem" >/dev/null \
  && openssl x509 -in "$work/signing.cert.pem" -noout -ext extendedKeyUsage | grep -q "Code Signing" \
  || { echo "ota-keys.sh: the new signing certificate does not verify or lacks codeSigning" >&2; exit 1; }
chmod 644 "$work/ca.cert.pem" "$work/signing.cert.pem"
for f in "${files[@]}"; do mv -f "$work/$f" "$out/$f"; done

cat <<MSG
ota-keys: wrote $out/{ca.cert.pem,ca.key.pem,signing.cert.pem,signing.key.pem}

  !!!  DEVELOPMENT KEYS, NEVER SHIP THEM  !!!
  Anyone with $out/signing.key.pem can sign an update every device with
  $out/ca.cert.pem in its keyring will install. Use your own PKI (an offline CA,
  the signing key in an HSM or PKCS#11 token) for devices that leave your desk.
MSG
