"""`n` > 1 through the official `openai` client: several choices, whole and streamed, from
one evaluation of the prompt."""

from __future__ import annotations

import json
import urllib.request
from collections import defaultdict
from typing import Iterator

import openai
import pytest

from conftest import running_daemon

N = 4
MAX_TOKENS = 12
# Long enough that evaluating it once or four times is plain in the timings.
MESSAGES = [
    {"role": "system", "content": "You are a poet who writes short, vivid lines about the sea."},
    {"role": "user", "content": "Write one line about waves breaking on a rocky shore at dawn."},
]


@pytest.fixture(scope="module")
def four_slots() -> Iterator[str]:
    with running_daemon(slots=N) as url:
        yield url


@pytest.fixture
def client4(four_slots: str) -> openai.OpenAI:
    return openai.OpenAI(base_url=four_slots + "/v1", api_key="unused", max_retries=0, timeout=120)


def _metric(base_url: str, name: str) -> float:
    with urllib.request.urlopen(base_url + "/metrics", timeout=10) as resp:
        for line in resp.read().decode().splitlines():
            if line.startswith(name + " "):
                return float(line.split()[1])
    raise AssertionError(f"{name} not in /metrics")


def test_four_choices_whole_share_one_prompt_evaluation(client4, four_slots, model_id):
    hits = _metric(four_slots, "inferloop_prefix_cache_hit_tokens_total")
    raw = client4.chat.completions.with_raw_response.create(
        model=model_id, messages=MESSAGES, max_tokens=MAX_TOKENS, n=N, seed=11, temperature=0.9,
    )
    resp = raw.parse()
    assert [c.index for c in resp.choices] == list(range(N))
    for c in resp.choices:
        assert c.message.role == "assistant" and c.message.content
        assert c.finish_reason in {"stop", "length"}
    assert len({c.message.content for c in resp.choices}) > 1, "choices sampled alike"
    usage = resp.usage
    assert usage.completion_tokens <= N * MAX_TOKENS
    assert usage.total_tokens == usage.prompt_tokens + usage.completion_tokens
    # The prompt is evaluated once: every later choice reuses all of it but its last token.
    timings = json.loads(raw.text)["timings"]
    prompt = usage.prompt_tokens
    assert timings["prompt_n"] < 2 * prompt, timings
    assert timings["cache_n"] >= (N - 1) * (prompt - 1), timings
    gained = _metric(four_slots, "inferloop_prefix_cache_hit_tokens_total") - hits
    assert gained >= (N - 1) * (prompt - 1), gained
    # Each choice is reproducible on its own: choice i is what `n` = 1 draws with seed + i.
    again = client4.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=MAX_TOKENS, n=N, seed=11, temperature=0.9,
    )
    assert [c.message.content for c in again.choices] == [c.message.content for c in resp.choices]


def test_four_choices_streamed_interleave_with_their_indexes(client4, model_id):
    whole = client4.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=MAX_TOKENS, n=N, seed=5, temperature=0.9,
    )
    stream = client4.chat.completions.create(
        model=model_id, messages=MESSAGES, max_tokens=MAX_TOKENS, n=N, seed=5, temperature=0.9,
        stream=True, stream_options={"include_usage": True},
    )
    text: dict[int, str] = defaultdict(str)
    finish: dict[int, str] = {}
    usage = None
    ids = set()
    for chunk in stream:
        ids.add(chunk.id)
        if chunk.usage is not None:
            assert not chunk.choices
            usage = chunk.usage
        for c in chunk.choices:
            assert c.index not in finish, f"choice {c.index} sent text after finishing"
            text[c.index] += c.delta.content or ""
            if c.finish_reason is not None:
                finish[c.index] = c.finish_reason
    assert len(ids) == 1
    assert sorted(finish) == list(range(N))
    assert [text[i] for i in range(N)] == [c.message.content for c in whole.choices]
    assert usage is not None and usage.prompt_tokens == whole.usage.prompt_tokens
    assert usage.completion_tokens == whole.usage.completion_tokens


def test_more_choices_than_slots_is_a_bad_request_naming_n(client4, model_id):
    with pytest.raises(openai.BadRequestError) as err:
        client4.chat.completions.create(model=model_id, messages=MESSAGES, max_tokens=2, n=N + 1)
    assert err.value.body["param"] == "n"
