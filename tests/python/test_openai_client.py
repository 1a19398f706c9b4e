"""The daemon as seen by the official `openai` Python client."""

from __future__ import annotations

import openai
import pytest

from conftest import API_KEY

MESSAGES = [{"role": "user", "content": "What is the capital of France? Answer in one sentence."}]
MAX_TOKENS = 16


def _chat(client: openai.OpenAI, model_id: str, **kw):
    return client.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=MAX_TOKENS, temperature=0, **kw
    )


def test_models_list_contains_the_served_model(client, model_id):
    ids = [m.id for m in client.models.list()]
    assert model_id in ids


def test_chat_completion_returns_text_and_consistent_usage(client, model_id):
    resp = _chat(client, model_id)
    assert len(resp.choices) == 1
    choice = resp.choices[0]
    assert choice.message.role == "assistant"
    assert choice.message.content and choice.message.content.strip()
    assert choice.finish_reason in {"stop", "length"}
    usage = resp.usage
    assert usage is not None
    assert usage.prompt_tokens > 0
    assert 0 < usage.completion_tokens <= MAX_TOKENS
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    if choice.finish_reason == "length":
        assert usage.completion_tokens == MAX_TOKENS


def test_a_repeated_system_prompt_reports_cached_tokens(client, model_id):
    system = " ".join(f"Rule {i}: answer briefly and plainly." for i in range(20))
    answers = []
    for question in ("What is a fan?", "What is a fan for?"):
        resp = client.chat.completions.create(
            model=model_id,
            messages=[{"role": "system", "content": system}, {"role": "user", "content": question}],
            max_tokens=MAX_TOKENS,
            temperature=0,
        )
        answers.append(resp)
    first, second = (r.usage.prompt_tokens_details for r in answers)
    assert first is not None and second is not None
    # The system prompt (all but the last run of the prompt) comes from the first request.
    assert second.cached_tokens > answers[1].usage.prompt_tokens // 2


def test_streaming_chunks_follow_the_openai_shape_and_match_non_stream(client, model_id):
    full = _chat(client, model_id)
    chunks = list(_chat(client, model_id, stream=True, stream_options={"include_usage": True}))
    assert len(chunks) >= 2

    assert chunks[0].choices, "first chunk must carry a choice"
    assert chunks[0].choices[0].delta.role == "assistant"
    assert len({c.id for c in chunks}) == 1, "all chunks of one stream share one id"
    assert all(c.object == "chat.completion.chunk" for c in chunks)

    finish = [c.choices[0].finish_reason for c in chunks if c.choices and c.choices[0].finish_reason]
    assert len(finish) == 1, f"exactly one finish_reason expected, got {finish}"
    assert finish[0] == full.choices[0].finish_reason

    last = chunks[-1]
    assert last.choices == []
    assert last.usage is not None
    assert all(c.usage is None for c in chunks[:-1]), "usage only on the final chunk"
    assert last.usage.prompt_tokens == full.usage.prompt_tokens
    assert last.usage.completion_tokens == full.usage.completion_tokens
    assert last.usage.total_tokens == last.usage.prompt_tokens + last.usage.completion_tokens

    text = "".join(c.choices[0].delta.content or "" for c in chunks if c.choices)
    assert text == full.choices[0].message.content


def test_max_tokens_of_the_wrong_type_is_a_bad_request(client, model_id):
    with pytest.raises(openai.BadRequestError) as exc:
        client.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens="16")
    assert exc.value.status_code == 400
    assert "max_tokens" in str(exc.value), "the error message names the field"


def test_unknown_model_is_not_found(client):
    with pytest.raises(openai.NotFoundError) as exc:
        client.chat.completions.create(model="no-such-model", messages=MESSAGES, max_tokens=4)
    assert exc.value.status_code == 404


def test_legacy_completions_endpoint_returns_text(client, model_id):
    resp = client.completions.create(
        model=model_id, prompt="The capital of France is", max_tokens=8, temperature=0
    )
    assert len(resp.choices) == 1
    assert resp.choices[0].text.strip()
    assert resp.choices[0].finish_reason in {"stop", "length"}
    assert 0 < resp.usage.completion_tokens <= 8


def test_wrong_api_key_is_rejected(auth_base_url, model_id):
    bad = openai.OpenAI(base_url=auth_base_url + "/v1", api_key="wrong", max_retries=0, timeout=60)
    with pytest.raises(openai.AuthenticationError) as exc:
        bad.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=4)
    assert exc.value.status_code == 401


def test_right_api_key_is_accepted(auth_base_url, model_id):
    good = openai.OpenAI(base_url=auth_base_url + "/v1", api_key=API_KEY, max_retries=0, timeout=60)
    assert model_id in [m.id for m in good.models.list()]
    resp = good.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=4, temperature=0)
    assert resp.choices[0].message.content
