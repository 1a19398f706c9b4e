"""A real agent that speaks only the Responses API: the Codex CLI (`@openai/codex`, pinned
in the Makefile's `codex-cli` target) in `exec` mode, pointed at the box as a custom
provider. Its first request carries ~4,600 tokens of instructions and tool definitions, so
the daemon serves a context of 8192. A turn must complete and print the model's answer
after the `codex` line, with no protocol error in Codex's output.

Codex's default request also offers a built-in `web_search` tool and a `namespace` tool
group, which this server refuses by name (400); the invocation turns both off, as a user
pointing Codex at a local model does.

Env: CODEX_REQUIRE=1 (set by CI) turns a missing Codex CLI from a skip into a failure; CODEX_BIN (default out/codex/node_modules/.bin/codex), CODEX_TRANSCRIPT (where the
transcript is saved, default out/codex/transcript.txt), CODEX_TIMEOUT_S (default 1500).
"""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from pathlib import Path

import pytest

from conftest import REPO, model_path, running_daemon

CODEX_VERSION = "0.169.0"
PROMPT = "Say hello in one short sentence."
# On a loaded 2-core machine a turn over ~4,600 prompt tokens takes minutes.
TIMEOUT_S = float(os.environ.get("CODEX_TIMEOUT_S", "1500"))
# What Codex prints when the wire does not match what it expects.
PROTOCOL_ERRORS = ("stream disconnected", "error sending request", "unexpected status",
                   "failed to parse", "invalid type", "missing field", "unknown variant",
                   "stream error", "ERROR:")


def unavailable(reason: str):
    if os.environ.get("CODEX_REQUIRE") == "1":
        pytest.fail(f"CODEX_REQUIRE=1: {reason}")
    pytest.skip(reason)


def codex_binary() -> Path:
    path = Path(os.environ.get("CODEX_BIN") or REPO / "out/codex/node_modules/.bin/codex")
    if path.is_file():
        return path
    npm = shutil.which("npm")
    if npm is None:
        unavailable("the Codex CLI is not installed and npm is not on PATH "
                    "(run `make codex-cli` where the npm registry is reachable)")
    result = subprocess.run(
        [npm, "install", "--no-audit", "--no-fund", "--prefix", str(REPO / "out/codex"),
         f"@openai/codex@{CODEX_VERSION}"], capture_output=True, text=True, timeout=600)
    if not path.is_file():
        unavailable(f"`npm install @openai/codex@{CODEX_VERSION}` failed (status "
                    f"{result.returncode}): {result.stderr.strip()[-400:]}")
    return path


@pytest.mark.skipif(
    "native" in os.environ.get("INFERLOOPD_ARGS", ""),
    reason="one Codex turn takes minutes: it runs once, against the default backend (make pytest)")
def test_codex_exec_completes_a_turn_against_the_box():
    codex = codex_binary()
    model = model_path().name.removesuffix(".gguf")
    with running_daemon(ctx=8192) as url, \
            tempfile.TemporaryDirectory(prefix="codex-home-", dir=REPO / "out") as home, \
            tempfile.TemporaryDirectory(prefix="codex-work-") as work:
        argv = [
            str(codex), "exec", "--skip-git-repo-check",
            "-c", "model_provider=box",
            "-c", 'model_providers.box.name="box"',
            "-c", f'model_providers.box.base_url="{url}/v1"',
            "-c", 'model_providers.box.wire_api="responses"',
            "-c", 'model_providers.box.env_key="BOX_KEY"',
            "-c", 'web_search="disabled"',
            "--disable", "multi_agent",
            "-m", model, PROMPT,
        ]
        env = {**os.environ, "CODEX_HOME": home, "BOX_KEY": "unused", "NO_COLOR": "1"}
        done = subprocess.run(argv, cwd=work, env=env, stdin=subprocess.DEVNULL,
                              capture_output=True, text=True, timeout=TIMEOUT_S)
    out = done.stdout + done.stderr
    transcript = Path(os.environ.get("CODEX_TRANSCRIPT") or REPO / "out/codex/transcript.txt")
    transcript.parent.mkdir(parents=True, exist_ok=True)
    transcript.write_text(f"$ {' '.join(argv)}\n# exit status {done.returncode}\n"
                          f"--- stdout ---\n{done.stdout}--- stderr ---\n{done.stderr}")
    assert done.returncode == 0, out
    for marker in PROTOCOL_ERRORS:
        assert marker not in out, f"{marker!r} in Codex's output:\n{out}"
    lines = out.splitlines()
    assert "codex" in lines, out
    answer = [l for l in lines[lines.index("codex") + 1:] if l.strip()]
    assert answer and not answer[0].startswith(("tokens used", "warning")), out
