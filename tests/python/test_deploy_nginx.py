"""deploy/nginx/inferloop.conf in a real nginx, in front of a real daemon.

The config is used as shipped; only its `server box-N.lan:8080` lines and its `listen` are
replaced by this machine's addresses. It must skip a box that refuses connections, move a
request on from a box that answers 503 before any work (a POST: `non_idempotent`), and pass
a stream through chunk by chunk (`proxy_buffering off`).

Env: NGINX_REQUIRE=1 (set by CI) turns a missing nginx from a skip into a failure.
"""

from __future__ import annotations

import contextlib
import http.server
import os
import re
import shutil
import socket
import subprocess
import threading
import time
from pathlib import Path
from typing import Iterator

import openai
import pytest

from conftest import REPO

CONF = REPO / "deploy/nginx/inferloop.conf"
NGINX = shutil.which("nginx") or ("/usr/sbin/nginx" if Path("/usr/sbin/nginx").exists() else None)


@pytest.fixture(scope="module", autouse=True)
def need_nginx() -> None:
    if NGINX is None:
        reason = "nginx not installed (apt install nginx-light)"
        if os.environ.get("NGINX_REQUIRE") == "1":
            pytest.fail(f"NGINX_REQUIRE=1: {reason}")
        pytest.skip(reason)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def render(servers: list[str], port: int) -> str:
    """The shipped config with these upstream servers and this listen address."""
    text = CONF.read_text()
    lines = [l for l in text.splitlines() if not re.match(r"\s*server box-\d+\.lan:8080", l)]
    text = "\n".join(lines)
    entries = "".join(f"    server {s} max_fails=2 fail_timeout=10s;\n" for s in servers)
    text = text.replace("    keepalive 32;", entries + "    keepalive 32;", 1)
    assert "listen 8080;" in text
    return text.replace("listen 8080;", f"listen 127.0.0.1:{port};", 1)


@contextlib.contextmanager
def nginx(tmp: Path, servers: list[str]) -> Iterator[str]:
    port = free_port()
    (tmp / "inferloop.conf").write_text(render(servers, port))
    user = "user root;\n" if os.geteuid() == 0 else ""
    (tmp / "nginx.conf").write_text(
        f"{user}daemon off;\npid {tmp}/nginx.pid;\nerror_log {tmp}/error.log;\n"
        "events {}\n"
        f"http {{\n  access_log off;\n  client_body_temp_path {tmp}/body;\n"
        f"  proxy_temp_path {tmp}/proxy;\n  include {tmp}/inferloop.conf;\n}}\n")
    check = subprocess.run([NGINX, "-t", "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
                           capture_output=True, text=True)
    assert check.returncode == 0, check.stderr
    proc = subprocess.Popen([NGINX, "-p", str(tmp), "-c", str(tmp / "nginx.conf")],
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 10
        while True:
            with contextlib.suppress(OSError), socket.create_connection(("127.0.0.1", port), 1):
                break
            assert proc.poll() is None and time.monotonic() < deadline, proc.stderr.read()
            time.sleep(0.05)
        yield f"http://127.0.0.1:{port}"
    finally:
        proc.terminate()
        proc.wait(10)


class Busy(http.server.BaseHTTPRequestHandler):
    """A box that is full: 503 with Retry-After to every request, counted."""
    hits = 0

    def do_POST(self) -> None:  # noqa: N802 (the handler's API)
        Busy.hits += 1
        body = (b'{"error":{"message":"busy","type":"server_error","param":null,'
                b'"code":"queue_full"}}')
        self.send_response(503)
        self.send_header("Content-Type", "application/json")
        self.send_header("Retry-After", "1")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args) -> None:
        pass


def box(base_url: str) -> str:
    return base_url.removeprefix("http://")


def test_a_box_that_refuses_connections_is_skipped(base_url, model_id, tmp_path):
    dead = f"127.0.0.1:{free_port()}"
    with nginx(tmp_path, [dead, box(base_url)]) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        for i in range(4):
            r = client.chat.completions.create(
                model=model_id, max_tokens=4, temperature=0,
                messages=[{"role": "user", "content": f"Say {i}."}])
            assert r.choices[0].message.content
        assert [m.id for m in client.models.list()] == [model_id]


def test_a_503_before_any_work_moves_the_post_to_the_next_box(base_url, model_id, tmp_path):
    busy = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Busy)
    threading.Thread(target=busy.serve_forever, daemon=True).start()
    Busy.hits = 0
    try:
        with nginx(tmp_path, [f"127.0.0.1:{busy.server_address[1]}", box(base_url)]) as url:
            client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
            for _ in range(4):
                r = client.completions.create(model=model_id, prompt="One, two,",
                                              max_tokens=3, temperature=0)
                assert r.usage.completion_tokens == 3
    finally:
        busy.shutdown()
        busy.server_close()
    # least_conn tried the busy box first at least once, and nginx moved on each time.
    assert Busy.hits >= 1


def test_a_stream_passes_through_chunk_by_chunk(base_url, model_id, tmp_path):
    with nginx(tmp_path, [box(base_url)]) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="none", max_retries=0)
        t0 = time.monotonic()
        arrivals = []
        stream = client.chat.completions.create(
            model=model_id, max_tokens=48, temperature=0, stream=True,
            messages=[{"role": "user", "content": "Count from one to twenty in words."}])
        for chunk in stream:
            if chunk.choices and chunk.choices[0].delta.content:
                arrivals.append(time.monotonic() - t0)
    # Buffered, the chunks would arrive in one or two bursts (the end, a full buffer);
    # passed through, each token comes on its own, a decode step (~10 ms here) after the
    # last. Counted as gaps, not against the time to the first chunk, which load stretches.
    assert len(arrivals) >= 10, arrivals
    gaps = [b - a for a, b in zip(arrivals, arrivals[1:])]
    assert sum(g > 0.002 for g in gaps) >= 5, arrivals
