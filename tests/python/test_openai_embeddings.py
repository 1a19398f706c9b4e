"""`/v1/embeddings` through the official client (`embeddings.create`: a string, a list,
token ids, base64, the 400s that name the field, auth) and LangChain's `OpenAIEmbeddings`
(`embed_query`, `embed_documents`), plus a sanity property on the default model: a
sentence is closer to its paraphrase than to an unrelated sentence."""

from __future__ import annotations

import base64
import json
import math
import socket
import struct
import urllib.error
import urllib.request

import openai
import pytest

from conftest import API_KEY

PARAPHRASES = [
    # (sentence, its paraphrase, an unrelated sentence)
    ("The cat sat on the mat.", "A cat was sitting on the mat.",
     "The stock market fell sharply today."),
    ("How do I bake bread at home?", "What is the way to make bread in my own kitchen?",
     "The train leaves the station at noon."),
    ("The weather is sunny and warm today.", "Today it is warm and sunny outside.",
     "He plays the violin in an orchestra."),
    ("I lost my keys somewhere in the house.", "Somewhere in the house I have lost my keys.",
     "Photosynthesis converts light into chemical energy."),
]


def post(base_url: str, path: str, body: dict, key: str | None = None) -> tuple[int, dict]:
    req = urllib.request.Request(
        base_url + path,
        data=json.dumps(body).encode(),
        headers={"Content-Type": "application/json",
                 **({"Authorization": f"Bearer {key}"} if key else {})},
    )
    try:
        with urllib.request.urlopen(req, timeout=60) as resp:
            return resp.status, json.loads(resp.read())
    except urllib.error.HTTPError as e:
        return e.code, json.loads(e.read())


def norm(v: list[float]) -> float:
    return math.sqrt(sum(x * x for x in v))


def cosine(a: list[float], b: list[float]) -> float:
    return sum(x * y for x, y in zip(a, b)) / (norm(a) * norm(b))


def close(a: list[float], b: list[float], tol: float = 1e-5) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= tol for x, y in zip(a, b))


@pytest.fixture(scope="module")
def dim(base_url, model_id) -> int:
    status, body = post(base_url, "/v1/embeddings", {"model": model_id, "input": "size"})
    assert status == 200, body
    return len(body["data"][0]["embedding"])


def test_a_string_answers_one_normalised_vector_with_usage(client, model_id, dim):
    resp = client.embeddings.create(model=model_id, input="The quick brown fox.")
    assert resp.object == "list" and resp.model == model_id
    assert len(resp.data) == 1
    d = resp.data[0]
    assert d.object == "embedding" and d.index == 0
    assert len(d.embedding) == dim > 0
    assert abs(norm(d.embedding) - 1.0) < 1e-4
    assert resp.usage.prompt_tokens > 0
    assert resp.usage.total_tokens == resp.usage.prompt_tokens


def test_a_list_answers_in_order_and_each_equals_its_own_request(client, model_id):
    texts = ["first input", "a second, longer input sentence", "third"]
    resp = client.embeddings.create(model=model_id, input=texts)
    assert [d.index for d in resp.data] == [0, 1, 2]
    alone = [client.embeddings.create(model=model_id, input=t) for t in texts]
    for d, a in zip(resp.data, alone):
        assert close(d.embedding, a.data[0].embedding)
    assert resp.usage.prompt_tokens == sum(a.usage.prompt_tokens for a in alone)
    # Different texts, different vectors.
    assert not close(resp.data[0].embedding, resp.data[1].embedding, 1e-3)


def test_token_ids_embed_like_the_text_they_spell(base_url, client, model_id):
    text = "Embeddings from token ids."
    status, tok = post(base_url, "/tokenize", {"content": text, "add_special": True})
    assert status == 200, tok
    ids = tok["tokens"]
    from_text = client.embeddings.create(model=model_id, input=text)
    flat = client.embeddings.create(model=model_id, input=ids)
    nested = client.embeddings.create(model=model_id, input=[ids, ids[:3]])
    assert flat.usage.prompt_tokens == len(ids) == from_text.usage.prompt_tokens
    assert close(flat.data[0].embedding, from_text.data[0].embedding)
    assert close(nested.data[0].embedding, flat.data[0].embedding)
    assert len(nested.data) == 2
    assert nested.usage.prompt_tokens == len(ids) + 3


def test_base64_is_the_float_vector_as_little_endian_f32(base_url, client, model_id):
    body = {"model": model_id, "input": "base64 or float"}
    status, floats = post(base_url, "/v1/embeddings", {**body, "encoding_format": "float"})
    assert status == 200, floats
    status, b64 = post(base_url, "/v1/embeddings", {**body, "encoding_format": "base64"})
    assert status == 200, b64
    raw = base64.b64decode(b64["data"][0]["embedding"])
    decoded = list(struct.unpack(f"<{len(raw) // 4}f", raw))
    f = floats["data"][0]["embedding"]
    assert len(decoded) == len(f)
    assert close(decoded, f, 1e-6)
    # Asked for explicitly, the client hands the string back as it came.
    explicit = client.embeddings.create(model=model_id, input=body["input"],
                                        encoding_format="base64")
    assert explicit.data[0].embedding == b64["data"][0]["embedding"]
    # Unasked, the client requests base64 itself and decodes it: the same vector again.
    default = client.embeddings.create(model=model_id, input=body["input"])
    assert close(default.data[0].embedding, f, 1e-6)


def test_dimensions_must_be_the_models_own(client, model_id, dim):
    ok = client.embeddings.create(model=model_id, input="exact size", dimensions=dim)
    assert len(ok.data[0].embedding) == dim
    with pytest.raises(openai.BadRequestError) as e:
        client.embeddings.create(model=model_id, input="smaller please", dimensions=dim // 2)
    assert e.value.body["param"] == "dimensions"
    assert str(dim) in e.value.body["message"]


@pytest.mark.parametrize(
    "body, param",
    [
        ({"input": ""}, "input"),
        ({"input": []}, "input"),
        ({"input": ["fine", ""]}, "input[1]"),
        ({"input": [[1, 2], []]}, "input[1]"),
        ({"input": [1, 99999999]}, "input[1]"),
        ({"input": [[1], [2, -1]]}, "input[1][1]"),
        ({"input": "x", "encoding_format": "int8"}, "encoding_format"),
        ({"input": "x", "temperature": 0.5}, None),
    ],
)
def test_bad_inputs_are_400s_in_openais_shape_naming_the_field(base_url, model_id, body, param):
    status, err = post(base_url, "/v1/embeddings", {"model": model_id, **body})
    assert status == 400, err
    assert err["error"]["type"] == "invalid_request_error"
    if param is not None:
        assert err["error"]["param"] == param, err


def test_an_input_longer_than_the_context_is_context_length_exceeded(base_url, model_id):
    # The shared daemon serves a context of 1024 tokens.
    status, err = post(base_url, "/v1/embeddings", {"model": model_id, "input": [7] * 1500})
    assert status == 400, err
    assert err["error"]["code"] == "context_length_exceeded"
    assert err["error"]["param"] == "input"
    status, err = post(base_url, "/v1/embeddings",
                       {"model": model_id, "input": ["ok", "word " * 3000]})
    assert status == 400, err
    assert err["error"]["code"] == "context_length_exceeded"
    assert err["error"]["param"] == "input[1]"


def test_an_unknown_model_is_404(client):
    with pytest.raises(openai.NotFoundError) as e:
        client.embeddings.create(model="no-such-model", input="hi")
    assert e.value.body["code"] == "model_not_found"


def test_the_api_key_guards_both_paths(auth_base_url, model_id):
    body = {"model": model_id, "input": "guarded"}
    for path in ("/v1/embeddings", "/embeddings"):
        status, err = post(auth_base_url, path, body)
        assert status == 401, (path, err)
        status, err = post(auth_base_url, path, body, key="wrong")
        assert status == 401, (path, err)
        status, ok = post(auth_base_url, path, body, key=API_KEY)
        assert status == 200, (path, ok)
        assert ok["object"] == "list"
    bad = openai.OpenAI(base_url=auth_base_url + "/v1", api_key="wrong", max_retries=0)
    with pytest.raises(openai.AuthenticationError):
        bad.embeddings.create(model=model_id, input="guarded")
    good = openai.OpenAI(base_url=auth_base_url + "/v1", api_key=API_KEY, max_retries=0)
    assert len(good.embeddings.create(model=model_id, input="guarded").data) == 1


def test_requests_are_counted_by_route(base_url, client, model_id):
    client.embeddings.create(model=model_id, input="counted")
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:
        text = resp.read().decode()
    assert 'inferloop_requests_total{route="/v1/embeddings",code="200"}' in text


def test_a_sentence_is_closer_to_its_paraphrase_than_to_an_unrelated_one(client, model_id):
    for s, para, other in PARAPHRASES:
        e = client.embeddings.create(model=model_id, input=[s, para, other]).data
        near = cosine(e[0].embedding, e[1].embedding)
        far = cosine(e[0].embedding, e[2].embedding)
        assert near > far, (s, near, far)


@pytest.fixture
def loopback_only(monkeypatch):
    """Refuses any connection off this machine: LangChain must not reach the internet
    (tiktoken's download, telemetry)."""
    real = socket.socket.connect

    def connect(self, address):
        host = address[0] if isinstance(address, tuple) else address
        if isinstance(host, str) and host not in ("127.0.0.1", "::1", "localhost"):
            raise OSError(f"test blocks a connection to {address!r}")
        return real(self, address)

    monkeypatch.setattr(socket.socket, "connect", connect)


def test_langchain_openai_embeddings(base_url, client, model_id, loopback_only):
    langchain_openai = pytest.importorskip("langchain_openai")
    emb = langchain_openai.OpenAIEmbeddings(
        model=model_id,
        base_url=base_url + "/v1",
        api_key="unused",
        # Send strings, not tiktoken's token ids (which would need a download).
        check_embedding_ctx_length=False,
        max_retries=0,
    )
    q = emb.embed_query("What is the capital of France?")
    docs = emb.embed_documents(["Paris is the capital of France.", "Bananas are yellow."])
    assert len(docs) == 2 and all(len(d) == len(q) for d in docs)
    assert abs(norm(q) - 1.0) < 1e-4
    direct = client.embeddings.create(model=model_id, input="What is the capital of France?")
    assert close(q, direct.data[0].embedding, 1e-5)
