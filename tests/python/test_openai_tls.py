"""The official `openai` client over HTTPS: a daemon serving `--tls-cert`/`--tls-key` signed
by a throwaway CA (made with `openssl`), reached with that CA and refused without it."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import Iterator

import httpx
import openai
import pytest

from conftest import running_daemon

KEY = "k-tls"


def _openssl(cwd: Path, args: str) -> None:
    subprocess.run(["openssl", *args.split()], cwd=cwd, check=True, capture_output=True)


@pytest.fixture(scope="module")
def certs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    d = tmp_path_factory.mktemp("tls")
    ec = "-newkey ec -pkeyopt ec_paramgen_curve:P-256 -nodes"
    _openssl(d, f"req -x509 {ec} -keyout ca.key -out ca.pem -days 2 -subj /CN=test-CA "
                "-addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign")
    (d / "server.ext").write_text(
        "basicConstraints=CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth\nsubjectAltName=IP:127.0.0.1,DNS:localhost\n")
    _openssl(d, f"req {ec} -keyout server.key -out server.csr -subj /CN=localhost")
    _openssl(d, "x509 -req -in server.csr -CA ca.pem -CAkey ca.key -CAcreateserial -days 2 "
                "-extfile server.ext -out server.pem")
    return d


@pytest.fixture(scope="module")
def https_url(certs: Path) -> Iterator[str]:
    with running_daemon("--tls-cert", str(certs / "server.pem"), "--tls-key",
                        str(certs / "server.key"), "--api-key", KEY,
                        ca_file=str(certs / "ca.pem")) as url:
        yield url


def test_the_openai_client_with_the_ca_talks_https(https_url: str, certs: Path) -> None:
    assert https_url.startswith("https://127.0.0.1:")
    ca = ssl.create_default_context(cafile=str(certs / "ca.pem"))
    http_client = httpx.Client(verify=ca, timeout=120)
    client = openai.OpenAI(base_url=https_url + "/v1", api_key=KEY, max_retries=0,
                           http_client=http_client)
    models = client.models.list()
    assert [m.id for m in models.data]
    out = client.chat.completions.create(
        model=models.data[0].id, max_tokens=4,
        messages=[{"role": "user", "content": "Say hi."}])
    # Sampled: the model may end its answer ("Hi!") before the 4 tokens run out.
    finish = out.choices[0].finish_reason
    tokens = out.usage.completion_tokens
    assert (finish, tokens) == ("length", 4) or (finish == "stop" and 1 <= tokens < 4), \
        (finish, tokens)
    stream = client.chat.completions.create(
        model=models.data[0].id, max_tokens=4, stream=True,
        messages=[{"role": "user", "content": "Say hi."}])
    assert "".join(c.choices[0].delta.content or "" for c in stream if c.choices)


def test_without_the_ca_the_certificate_is_refused(https_url: str) -> None:
    client = openai.OpenAI(base_url=https_url + "/v1", api_key=KEY, max_retries=0, timeout=30)
    with pytest.raises(openai.APIConnectionError):
        client.models.list()
