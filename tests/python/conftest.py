"""Fixtures that run the real inferloopd binary for the OpenAI-client tests.

The daemon is started on port 0 and the bound address is read from its
`listening on http://ADDR` log line, so parallel runs never race for a port.

Env: INFERLOOPD (binary, default target/release/inferloopd),
INFERLOOP_TEST_MODEL (GGUF, default models/SmolLM2-135M-Instruct.Q4_1.gguf),
INFERLOOPD_ARGS (extra `serve` flags for every daemon, e.g. "--backend native").
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import signal
import ssl
import subprocess
import threading
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Iterator

import openai
import pytest

REPO = Path(__file__).resolve().parents[2]
API_KEY = "secret"
READY_TIMEOUT_S = 60.0
STOP_TIMEOUT_S = 10.0

_LISTEN_RE = re.compile(r"listening on (https?://[A-Za-z0-9._\-:\[\]]+)")
_ANSI_RE = re.compile(r"\x1b\[[0-9;]*[A-Za-z]")


def _resolve(env_var: str, default: str) -> Path:
    path = Path(os.environ.get(env_var) or default)
    if path.is_absolute():
        return path
    in_cwd = Path.cwd() / path
    return (in_cwd if in_cwd.exists() else REPO / path).resolve()


def daemon_binary() -> Path:
    return _resolve("INFERLOOPD", "target/release/inferloopd")


def model_path() -> Path:
    return _resolve("INFERLOOP_TEST_MODEL", "models/SmolLM2-135M-Instruct.Q4_1.gguf")


class Daemon:
    """One inferloopd process; its stderr is drained into memory by a thread."""

    def __init__(self, extra_args: list[str], ctx: int = 1024, slots: int = 2,
                 ca_file: str | None = None) -> None:
        # HTTPS daemons (`--tls-cert`) are polled through the CA that signed their cert.
        self._tls = ssl.create_default_context(cafile=ca_file) if ca_file else None
        binary, model = daemon_binary(), model_path()
        if not binary.is_file():
            pytest.fail(f"daemon binary {binary} not found: run `make build` or set INFERLOOPD")
        if not model.is_file():
            pytest.fail(f"model {model} not found: run `make model` or set INFERLOOP_TEST_MODEL")
        self.argv = [
            str(binary), "serve",
            "--model", str(model),
            "--host", "127.0.0.1",
            "--port", "0",
            "--slots", str(slots),
            "--ctx", str(ctx),
            "--threads", "2",
            *shlex.split(os.environ.get("INFERLOOPD_ARGS", "")),
            *extra_args,
        ]
        # INFERLOOP_* variables set what the flags leave unset; a stray one in the
        # caller's environment (say INFERLOOP_API_KEY) must not change the test.
        env = {k: v for k, v in os.environ.items() if not k.startswith("INFERLOOP_")}
        env["NO_COLOR"] = "1"
        self.base_url: str | None = None
        self._lines: list[str] = []
        self._bound = threading.Event()
        self.proc = subprocess.Popen(
            self.argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            text=True,
            errors="replace",
            env=env,
        )
        self._reader = threading.Thread(target=self._drain_stderr, daemon=True)
        self._reader.start()

    def _drain_stderr(self) -> None:
        assert self.proc.stderr is not None
        for line in self.proc.stderr:
            self._lines.append(line)
            if self.base_url is None:
                m = _LISTEN_RE.search(_ANSI_RE.sub("", line))
                if m:
                    self.base_url = m.group(1).rstrip("/")
                    self._bound.set()

    def stderr(self, last: int = 100) -> str:
        return "".join(self._lines[-last:])

    def wait_ready(self, timeout: float = READY_TIMEOUT_S) -> str:
        deadline = time.monotonic() + timeout
        last_status = "no `listening on` line yet"
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self._reader.join(timeout=2)
                pytest.fail(
                    f"inferloopd exited with status {self.proc.returncode} before it was ready\n"
                    f"argv: {' '.join(self.argv)}\n--- stderr ---\n{self.stderr()}"
                )
            if self.base_url is None:
                self._bound.wait(0.1)
                continue
            try:
                with urllib.request.urlopen(self.base_url + "/readyz", timeout=2,
                                            context=self._tls) as resp:
                    if resp.status == 200:
                        return self.base_url
                    last_status = f"/readyz returned {resp.status}"
            except urllib.error.HTTPError as e:
                last_status = f"/readyz returned {e.code}"
            except OSError as e:
                last_status = f"/readyz: {e}"
            time.sleep(0.1)
        self.stop(check=False)
        pytest.fail(
            f"inferloopd not ready within {timeout:.0f} s ({last_status})\n"
            f"argv: {' '.join(self.argv)}\n--- stderr ---\n{self.stderr()}"
        )

    def stop(self, check: bool = True) -> None:
        """SIGTERM, then SIGKILL after STOP_TIMEOUT_S. With `check`, a daemon
        that needed the kill or exited non-zero fails the run: exit code 0 on
        SIGTERM is part of the daemon's contract."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=STOP_TIMEOUT_S)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
                self._reader.join(timeout=2)
                if check:
                    pytest.fail(
                        f"inferloopd did not exit within {STOP_TIMEOUT_S:.0f} s of SIGTERM\n"
                        f"--- stderr ---\n{self.stderr()}"
                    )
                return
        self._reader.join(timeout=2)
        if check and self.proc.returncode != 0:
            pytest.fail(
                f"inferloopd exited with status {self.proc.returncode} after SIGTERM (want 0)\n"
                f"--- stderr ---\n{self.stderr()}"
            )


@contextlib.contextmanager
def running_daemon(*extra_args: str, ctx: int = 1024, slots: int = 2,
                   ca_file: str | None = None) -> Iterator[str]:
    """Start inferloopd, wait for /readyz, yield its base URL, stop it."""
    daemon = Daemon(list(extra_args), ctx=ctx, slots=slots, ca_file=ca_file)
    try:
        url = daemon.wait_ready()
    except BaseException:
        daemon.stop(check=False)
        raise
    try:
        yield url
    finally:
        daemon.stop()


@pytest.fixture(scope="session")
def base_url() -> Iterator[str]:
    """Base URL (no /v1) of a daemon shared by the whole session."""
    with running_daemon() as url:
        yield url


@pytest.fixture(scope="session")
def auth_base_url() -> Iterator[str]:
    """Base URL of a second daemon started with `--api-key secret`."""
    with running_daemon("--api-key", API_KEY) as url:
        yield url


@pytest.fixture(scope="session")
def model_id() -> str:
    # The daemon names the model after its file.
    return model_path().name.removesuffix(".gguf")


@pytest.fixture
def client(base_url: str) -> openai.OpenAI:
    # No retries: a retried request would hide a daemon error or double the wait.
    return openai.OpenAI(base_url=base_url + "/v1", api_key="unused", max_retries=0, timeout=60)
