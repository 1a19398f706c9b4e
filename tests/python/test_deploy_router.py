"""deploy/vllm-router as shipped: the unit's command line, expanded the way systemd expands
it with router.env, starts the real vllm-router in front of a real daemon and answers
through it. A flag that vllm-router does not know, or a variable router.env does not set,
fails here rather than on a gateway.

Needs vllm-router in .venv-router (`make .venv-router`); skipped without it unless
ROUTER_REQUIRE=1.
"""

from __future__ import annotations

import contextlib
import os
import re
import shlex
import socket
import subprocess
import time
import urllib.request
from pathlib import Path
from typing import Iterator

import openai
import pytest

from conftest import REPO, running_daemon

UNIT = REPO / "deploy/vllm-router/inferloop-router.service"
ENV = REPO / "deploy/vllm-router/router.env"
ROUTER = REPO / ".venv-router/bin/vllm-router"


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def env_file(path: Path) -> dict[str, str]:
    """KEY=VALUE lines as systemd's EnvironmentFile= reads them (quotes removed)."""
    out = {}
    for line in path.read_text().splitlines():
        line = line.strip()
        if not line or line.startswith("#"):
            continue
        key, _, value = line.partition("=")
        out[key] = shlex.split(value)[0] if value.strip() else ""
    return out


def exec_start(unit: Path, env: dict[str, str]) -> list[str]:
    """ExecStart= with its continuation lines joined, expanded as systemd does: `${VAR}`
    is one argument, a bare `$VAR` is split on whitespace (and vanishes when empty)."""
    text = unit.read_text().replace("\\\n", " ")
    line = next(l for l in text.splitlines() if l.startswith("ExecStart="))
    argv = []
    for word in shlex.split(line.removeprefix("ExecStart=")):
        whole = re.fullmatch(r"\$(\w+)", word)
        if whole:
            argv += env[whole.group(1)].split()
            continue
        argv.append(re.sub(r"\$\{(\w+)\}", lambda m: env[m.group(1)], word))
    return argv


def test_router_env_names_every_variable_the_unit_uses():
    env = env_file(ENV)
    used = set(re.findall(r"\$\{?(\w+)\}?", UNIT.read_text()))
    assert used <= set(env), used - set(env)
    assert len(env["WORKER_URLS"].split()) == 3


@contextlib.contextmanager
def _router(argv: list[str], tmp_path: Path, ready_path: str) -> Iterator[str]:
    """Runs the router from `argv` until `GET ready_path` answers 200; yields its URL (the
    port is `--port`'s), stops it after. Its log is `router.log` in `tmp_path`."""
    port = argv[argv.index("--port") + 1]
    log = open(tmp_path / "router.log", "w")
    proc = subprocess.Popen(argv, stdout=log, stderr=subprocess.STDOUT)
    try:
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, (tmp_path / "router.log").read_text()[-3000:]
            try:
                with urllib.request.urlopen(url + ready_path, timeout=2) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert time.monotonic() < deadline, (tmp_path / "router.log").read_text()[-3000:]
            time.sleep(0.25)
        yield url
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
        log.close()


def _need_router() -> None:
    if not ROUTER.exists():
        reason = f"{ROUTER} missing (make .venv-router)"
        if os.environ.get("ROUTER_REQUIRE") == "1":
            pytest.fail(f"ROUTER_REQUIRE=1: {reason}")
        pytest.skip(reason)


def test_the_shipped_command_line_serves_through_vllm_router(base_url, model_id, tmp_path):
    _need_router()
    env = env_file(ENV)
    env.update(ROUTER_HOST="127.0.0.1", ROUTER_PORT=str(free_port()), WORKER_URLS=base_url,
               PROMETHEUS_PORT=str(free_port()))
    argv = exec_start(UNIT, env)
    assert argv[0] == "/opt/inferloop-router/bin/vllm-router"
    argv[0] = str(ROUTER)
    with _router(argv, tmp_path, "/v1/models") as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        r = client.chat.completions.create(model=model_id, max_tokens=4, temperature=0,
                                           messages=[{"role": "user", "content": "Say hi."}])
        assert r.usage.completion_tokens == 4
        text = "".join(c.choices[0].delta.content or "" for c in client.chat.completions.create(
            model=model_id, max_tokens=4, temperature=0, stream=True,
            messages=[{"role": "user", "content": "Say hi."}]) if c.choices)
        assert text == r.choices[0].message.content


def _chats_served(url: str) -> float:
    with urllib.request.urlopen(url + "/metrics", timeout=5) as r:
        text = r.read().decode()
    return sum(float(l.rsplit(" ", 1)[1]) for l in text.splitlines()
               if l.startswith('inferloop_requests_total{route="/v1/chat/completions",code="200"}'))


def test_kv_aware_routes_on_the_boxes_kv_events(model_id, tmp_path):
    """Two boxes publishing KV events (--kv-events) behind the real router's kv_aware policy:
    it discovers the publishers, indexes the blocks, and sends a repeated prompt to the box
    that holds it (a lookup hit in its own metrics), not the other one."""
    _need_router()
    kv1, kv2 = free_port(), free_port()
    with running_daemon("--kv-events", f"127.0.0.1:{kv1}") as box1, \
            running_daemon("--kv-events", f"127.0.0.1:{kv2}") as box2:
        prom = free_port()
        argv = [str(ROUTER), "--host", "127.0.0.1", "--port", str(free_port()),
                "--policy", "kv_aware", "--worker-startup-check-interval", "1",
                "--prometheus-port", str(prom), "--log-level", "info",
                "--worker-urls", box1, box2]
        with _router(argv, tmp_path, "/readiness") as url:
            # The subscribers connect as the router starts; give the subscriptions a moment.
            time.sleep(1.0)
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            system = "You are the harbour master's assistant; answer about tides and moorings. " * 12
            before = [_chats_served(box1), _chats_served(box2)]
            for q in ("When is high tide?", "Where can I moor?", "Is the slipway open?"):
                client.chat.completions.create(
                    model=model_id, max_tokens=2, temperature=0,
                    messages=[{"role": "system", "content": system}, {"role": "user", "content": q}])
                time.sleep(0.5)  # the events of a prefill reach the router
            served = [_chats_served(box1) - before[0], _chats_served(box2) - before[1]]
            assert sorted(served) == [0, 3], f"per box {served}; router log in {tmp_path}"
            with urllib.request.urlopen(f"http://127.0.0.1:{prom}/metrics", timeout=5) as r:
                metrics = r.read().decode()
            hits = sum(float(l.rsplit(" ", 1)[1]) for l in metrics.splitlines()
                       if l.startswith('vllm_router_kv_placement_lookups_total{result="hit"}'))
            assert hits >= 2, [l for l in metrics.splitlines() if "kv_" in l]
