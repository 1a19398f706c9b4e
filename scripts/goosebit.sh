#!/usr/bin/env bash
# goosebit (a hawkBit-DDI rollout server, PyPI) for the fleet tests and demo.
#
#   scripts/goosebit.sh install          venv at $GOOSEBIT_VENV (default .venv-goosebit), once
#   scripts/goosebit.sh start DIR PORT   database + artifacts in DIR, serve on 127.0.0.1:PORT
#                                        (foreground; the Python harness runs it in the background)
#
# Settings go in as GOOSEBIT_* variables (poll_time, max_concurrent_updates, ...); the
# database is created with `aerich upgrade` from goosebit's own migrations before each start
# (a no-op when it exists).
set -euo pipefail

cd "$(dirname "${BASH_SOURCE[0]}")/.."
VERSION=0.2.12
VENV="${GOOSEBIT_VENV:-$PWD/.venv-goosebit}"
PY="${GOOSEBIT_PYTHON:-python3.11}"

install() {
    if [[ -f "$VENV/.installed-$VERSION" ]]; then
        return
    fi
    command -v "$PY" >/dev/null || { echo "goosebit.sh: needs $PY (goosebit requires Python >= 3.11)" >&2; exit 1; }
    rm -rf "$VENV"
    "$PY" -m venv "$VENV"
    "$VENV/bin/python" -m pip install --disable-pip-version-check -q "goosebit==$VERSION"
    touch "$VENV/.installed-$VERSION"
}

start() {
    local dir="$1" port="$2"
    install
    mkdir -p "$dir/artifacts"
    dir="$(cd "$dir" && pwd)"
    local migrations
    migrations="$("$VENV/bin/python" -c 'import goosebit, pathlib; print(pathlib.Path(goosebit.__file__).parent / "db" / "migrations")')"
    cat >"$dir/pyproject.toml" <<TOML
[tool.aerich]
tortoise_orm = "goosebit.db.config.TORTOISE_CONF"
location = "$migrations"
src_folder = "./."
TOML
    export GOOSEBIT_DB_URI="sqlite:///$dir/db.sqlite3"
    export GOOSEBIT_ARTIFACTS_DIR="$dir/artifacts"
    # One key across restarts, so admin tokens survive the server-restart test.
    if [[ ! -f "$dir/secret.key" ]]; then
        "$VENV/bin/python" -c 'import secrets; print(secrets.token_urlsafe(32))' >"$dir/secret.key"
    fi
    export GOOSEBIT_SECRET_KEY="$(cat "$dir/secret.key")"
    (cd "$dir" && "$VENV/bin/aerich" upgrade >/dev/null)
    cd "$dir"
    exec "$VENV/bin/python" -m uvicorn goosebit:app --host 127.0.0.1 --port "$port" --log-level warning
}

case "${1:-}" in
install) install ;;
start) [[ $# -eq 3 ]] || { echo "usage: $0 start DIR PORT" >&2; exit 2; }; start "$2" "$3" ;;
*) echo "usage: $0 install | start DIR PORT" >&2; exit 2 ;;
esac
