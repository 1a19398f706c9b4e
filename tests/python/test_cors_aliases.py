"""CORS for browser pages (`--cors-origin`) and the unversioned aliases
(`/chat/completions`, `/completions`, `/models`, `/responses`), over plain HTTP against a
daemon started with an API key: the aliases keep the key, a preflight is answered before
it, and every answer to an allowed origin (JSON, SSE, errors) carries the origin."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Iterator

import pytest

from conftest import API_KEY, running_daemon

PAGE = "http://page.lan:8000"


@pytest.fixture(scope="module")
def cors_url() -> Iterator[str]:
    with running_daemon("--api-key", API_KEY, "--cors-origin", PAGE,
                        "--cors-origin", "https://other.lan") as url:
        yield url


def call(url: str, method: str = "GET", body: dict | None = None,
         headers: dict | None = None) -> tuple[int, dict, bytes]:
    data = json.dumps(body).encode() if body is not None else None
    req = urllib.request.Request(url, data=data, method=method, headers=headers or {})
    if data is not None:
        req.add_header("Content-Type", "application/json")
    try:
        with urllib.request.urlopen(req, timeout=120) as r:
            return r.status, {k.lower(): v for k, v in r.headers.items()}, r.read()
    except urllib.error.HTTPError as e:
        return e.code, {k.lower(): v for k, v in e.headers.items()}, e.read()


AUTH = {"Authorization": f"Bearer {API_KEY}"}
CHAT = {"messages": [{"role": "user", "content": "Hi"}], "max_tokens": 3}


def test_preflight_from_an_allowed_origin_is_204_with_methods_and_headers(cors_url):
    status, h, body = call(cors_url + "/v1/chat/completions", "OPTIONS", headers={
        "Origin": PAGE, "Access-Control-Request-Method": "POST",
        "Access-Control-Request-Headers": "authorization, content-type"})
    assert status == 204 and body == b""
    assert h["access-control-allow-origin"] == PAGE
    assert "POST" in h["access-control-allow-methods"]
    allowed = {x.strip().lower() for x in h["access-control-allow-headers"].split(",")}
    assert {"authorization", "content-type"} <= allowed
    assert "origin" in h["vary"].lower()
    assert "access-control-allow-credentials" not in h


def test_a_disallowed_origin_gets_no_cors_headers(cors_url):
    status, h, _ = call(cors_url + "/v1/chat/completions", "OPTIONS", headers={
        "Origin": "http://evil.lan", "Access-Control-Request-Method": "POST"})
    assert status != 204
    assert not any(k.startswith("access-control-") for k in h)
    status, h, _ = call(cors_url + "/v1/models", headers={"Origin": "http://evil.lan", **AUTH})
    assert status == 200 and "access-control-allow-origin" not in h


def test_answers_to_an_allowed_origin_carry_it_json_sse_and_errors(cors_url):
    origin = {"Origin": "https://other.lan"}
    status, h, _ = call(cors_url + "/v1/chat/completions", "POST", CHAT, {**origin, **AUTH})
    assert status == 200 and h["access-control-allow-origin"] == "https://other.lan"
    status, h, body = call(cors_url + "/v1/chat/completions", "POST",
                           {**CHAT, "stream": True}, {**origin, **AUTH})
    assert status == 200 and h["content-type"].startswith("text/event-stream")
    assert h["access-control-allow-origin"] == "https://other.lan"
    assert body.rstrip().endswith(b"data: [DONE]")
    status, h, _ = call(cors_url + "/v1/chat/completions", "POST", CHAT, origin)
    assert status == 401 and h["access-control-allow-origin"] == "https://other.lan"


def test_without_cors_origins_no_cors_headers_are_sent(base_url):
    status, h, _ = call(base_url + "/v1/models", headers={"Origin": PAGE})
    assert status == 200
    assert not any(k.startswith("access-control-") for k in h)


@pytest.mark.parametrize("path, body", [
    ("/chat/completions", CHAT),
    ("/completions", {"prompt": "Hello", "max_tokens": 3}),
    ("/responses", {"input": "Hi", "max_output_tokens": 3}),
    ("/models", None),
])
def test_unversioned_aliases_answer_like_v1_and_keep_the_key(cors_url, path, body):
    method = "GET" if body is None else "POST"
    status, _, _ = call(cors_url + path, method, body)
    assert status == 401
    status, _, alias = call(cors_url + path, method, body, AUTH)
    status_v1, _, v1 = call(cors_url + "/v1" + path, method, body, AUTH)
    assert status == status_v1 == 200
    a, b = json.loads(alias), json.loads(v1)
    assert a["object"] == b["object"]
    if body is None:
        assert a == b
