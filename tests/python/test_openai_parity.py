"""OpenAI parity through the official client: logprobs, logit_bias, refused fields, and
llama-server's /tokenize and /detokenize."""

from __future__ import annotations

import json
import math
import urllib.error
import urllib.request

import openai
import pytest

MESSAGES = [{"role": "user", "content": "Name a color."}]


def _post(base_url: str, path: str, body: dict) -> dict:
    req = urllib.request.Request(
        base_url + path,
        data=json.dumps(body).encode(),
        headers={"content-type": "application/json"},
        method="POST",
    )
    with urllib.request.urlopen(req, timeout=30) as resp:
        return json.loads(resp.read())


def _check_entries(entries, top_n: int) -> None:
    assert entries
    for e in entries:
        assert e.logprob <= 0
        assert bytes(e.bytes).decode("utf-8", "replace") == e.token
        assert len(e.top_logprobs) == top_n
        assert sum(math.exp(t.logprob) for t in e.top_logprobs) <= 1 + 1e-4
        # Temperature 0 and no penalties: the sampled token is the most likely one.
        assert e.top_logprobs[0].token == e.token
        assert e.top_logprobs[0].logprob == pytest.approx(e.logprob, abs=1e-5)


def test_chat_logprobs_whole_and_streamed(client, model_id):
    kw = dict(model=model_id, messages=MESSAGES, max_tokens=8, temperature=0,
              logprobs=True, top_logprobs=5)
    resp = client.chat.completions.create(**kw)
    entries = resp.choices[0].logprobs.content
    _check_entries(entries, 5)
    assert "".join(e.token for e in entries) == resp.choices[0].message.content
    streamed = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].logprobs and chunk.choices[0].logprobs.content:
            streamed.extend(chunk.choices[0].logprobs.content)
    _check_entries(streamed, 5)
    assert [e.token for e in streamed] == [e.token for e in entries]


def test_completion_logprobs_whole_and_streamed(client, model_id):
    kw = dict(model=model_id, prompt="1, 2, 3, 4,", max_tokens=6, temperature=0, logprobs=3)
    resp = client.completions.create(**kw)
    lp = resp.choices[0].logprobs
    assert len(lp.tokens) == len(lp.token_logprobs) == len(lp.top_logprobs) == 6
    assert "".join(lp.tokens) == resp.choices[0].text
    assert lp.text_offset[0] == 0
    for token, own, top in zip(lp.tokens, lp.token_logprobs, lp.top_logprobs):
        assert own <= 0
        assert top[token] == pytest.approx(own)
        assert sum(math.exp(v) for v in top.values()) <= 1 + 1e-4
    streamed = []
    for chunk in client.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].logprobs:
            streamed.extend(chunk.choices[0].logprobs.tokens)
    assert streamed == lp.tokens


def _first_token_id(client, model_id, base_url) -> tuple[str, int]:
    resp = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=1, temperature=0, logprobs=True
    )
    first = resp.choices[0].logprobs.content[0].token
    ids = _post(base_url, "/tokenize", {"content": first, "parse_special": False})["tokens"]
    assert len(ids) == 1, (first, ids)
    return first, ids[0]


@pytest.mark.parametrize("stream", [False, True])
def test_a_banned_token_never_appears(client, model_id, base_url, stream):
    first, token_id = _first_token_id(client, model_id, base_url)
    kw = dict(model=model_id, messages=MESSAGES, max_tokens=12, temperature=0,
              logprobs=True, logit_bias={str(token_id): -100})
    if stream:
        tokens = [
            e.token
            for c in client.chat.completions.create(stream=True, **kw)
            if c.choices and c.choices[0].logprobs and c.choices[0].logprobs.content
            for e in c.choices[0].logprobs.content
        ]
    else:
        resp = client.chat.completions.create(**kw)
        tokens = [e.token for e in resp.choices[0].logprobs.content]
    assert tokens and first not in tokens


def test_plus_100_forces_a_token(client, model_id, base_url):
    token_id = _post(base_url, "/tokenize", {"content": " banana"})["tokens"][0]
    piece = _post(base_url, "/detokenize", {"tokens": [token_id]})["content"]
    resp = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=3, temperature=0,
        logit_bias={str(token_id): 100},
    )
    assert resp.choices[0].message.content == piece * 3


@pytest.mark.parametrize(
    "field,value",
    [
        ("n", 64),
        ("audio", {"voice": "alloy", "format": "wav"}),
        ("modalities", ["text", "audio"]),
        ("prediction", {"type": "content", "content": "x"}),
        ("web_search_options", {}),
        ("service_tier", "flex"),
        ("store", True),
        ("reasoning_effort", "low"),
        ("logit_bias", {"not-a-token": 1}),
        ("top_logprobs", 3),
    ],
)
def test_unsupported_chat_fields_are_bad_requests_naming_the_field(client, model_id, field, value):
    with pytest.raises(openai.BadRequestError) as err:
        client.chat.completions.create(
            model=model_id, messages=MESSAGES, max_tokens=2, extra_body={field: value}
        )
    assert err.value.body["param"] == field
    assert f"`{field}`" in err.value.body["message"]


@pytest.mark.parametrize("field,value", [("best_of", 2), ("suffix", "The end."), ("n", 64)])
def test_unsupported_completion_fields_are_bad_requests_naming_the_field(
    client, model_id, field, value
):
    with pytest.raises(openai.BadRequestError) as err:
        client.completions.create(model=model_id, prompt="Hi", max_tokens=2, **{field: value})
    assert err.value.body["param"] == field


def test_harmless_fields_are_served(client, model_id):
    resp = client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=2, user="u-1", store=False,
        metadata={"k": "v"}, service_tier="auto", seed=1,
    )
    assert resp.choices[0].message.content is not None


def test_tokenize_detokenize_round_trip(base_url):
    text = "Hello, world! Ünïcödé 🤗"
    ids = _post(base_url, "/tokenize", {"content": text})["tokens"]
    assert all(isinstance(i, int) for i in ids)
    assert _post(base_url, "/detokenize", {"tokens": ids})["content"] == text
    pieces = _post(base_url, "/tokenize", {"content": text, "with_pieces": True})["tokens"]
    assert [p["id"] for p in pieces] == ids
    with pytest.raises(urllib.error.HTTPError) as err:
        _post(base_url, "/detokenize", {"tokens": [1, 10**9]})
    assert err.value.code == 400
    assert json.loads(err.value.read())["error"]["param"] == "tokens[1]"
