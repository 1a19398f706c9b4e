#!/usr/bin/env bash
# Installs vllm-router into /opt/inferloop-router and the gateway unit and its config.
#
#   deploy/vllm-router/install.sh                 # from PyPI
#   deploy/vllm-router/install.sh --wheels DIR    # offline, from wheels downloaded before with
#                                                 # pip download -d DIR vllm-router==0.1.17
#
# Then edit /etc/inferloop/router.env (WORKER_URLS) and:
#   systemctl enable --now inferloop-router
set -euo pipefail

VERSION="0.1.17"
PREFIX="/opt/inferloop-router"
here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"

[[ $(id -u) -eq 0 ]] || { echo "install.sh: run as root" >&2; exit 1; }
pip_args=("vllm-router==$VERSION")
if [[ "${1:-}" == "--wheels" ]]; then
    [[ -d "${2:-}" ]] || { echo "install.sh: --wheels needs a directory" >&2; exit 2; }
    pip_args=(--no-index --find-links "$2" "vllm-router==$VERSION")
fi

python3 -m venv "$PREFIX"
"$PREFIX/bin/pip" install --disable-pip-version-check -q "${pip_args[@]}"
"$PREFIX/bin/vllm-router" --help >/dev/null

install -D -m 0644 "$here/inferloop-router.service" /etc/systemd/system/inferloop-router.service
if [[ ! -e /etc/inferloop/router.env ]]; then
    install -D -m 0600 "$here/router.env" /etc/inferloop/router.env
    echo "install.sh: edit /etc/inferloop/router.env (WORKER_URLS), then: systemctl enable --now inferloop-router"
fi
systemctl daemon-reload 2>/dev/null || true
