"""The Responses API through the official client: `responses.create` whole and streamed
(OpenAI's typed events, in order, numbered), a function-call round trip
(function_call -> function_call_output -> answer), `responses.parse` with a pydantic
model, and the 400s that name what a stateless server cannot do."""

from __future__ import annotations

import json
import os
from typing import Literal

import openai
import pydantic
import pytest

NATIVE = "native" in os.environ.get("INFERLOOPD_ARGS", "")
needs_llama = pytest.mark.skipif(
    NATIVE, reason="constrained decoding needs the llama.cpp backend (native answers 400)"
)

WEATHER_TOOL = {
    "type": "function",
    "name": "get_weather",
    "description": "Current weather in a city.",
    "parameters": {
        "type": "object",
        "properties": {"city": {"type": "string", "maxLength": 30}},
        "required": ["city"],
        "additionalProperties": False,
    },
    "strict": True,
}


class City(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=40)
    country: Literal["France", "Japan", "Peru"]


def test_create_whole_answers_a_message_with_usage_and_echoes(client, model_id):
    resp = client.responses.create(
        model=model_id,
        instructions="Answer in one short sentence.",
        input="What is the capital of France?",
        max_output_tokens=24,
        temperature=0,
        metadata={"run": "pytest"},
    )
    assert resp.object == "response" and resp.id.startswith("resp_")
    assert resp.status in ("completed", "incomplete")
    if resp.status == "incomplete":
        assert resp.incomplete_details.reason == "max_output_tokens"
    assert [o.type for o in resp.output] == ["message"]
    assert resp.output[0].role == "assistant"
    assert resp.output_text.strip()
    assert resp.metadata == {"run": "pytest"}
    assert resp.instructions == "Answer in one short sentence."
    assert resp.max_output_tokens == 24
    u = resp.usage
    assert u.input_tokens > 10 and 0 < u.output_tokens <= 24
    assert u.total_tokens == u.input_tokens + u.output_tokens
    assert u.input_tokens_details.cached_tokens >= 0


def test_a_repeated_prompt_reports_cached_input_tokens(client, model_id):
    kw = dict(model=model_id, input="Name three colours, please, and nothing else at all.",
              instructions="You are a terse assistant. " * 8, max_output_tokens=4, temperature=0)
    client.responses.create(**kw)
    again = client.responses.create(**kw)
    assert again.usage.input_tokens_details.cached_tokens > 0


def test_streamed_events_come_in_order_with_sequence_numbers(client, model_id):
    events = list(client.responses.create(
        model=model_id, input="Say hello.", max_output_tokens=12, temperature=0, stream=True))
    kinds = [e.type for e in events]
    assert kinds[:4] == ["response.created", "response.in_progress",
                         "response.output_item.added", "response.content_part.added"]
    assert kinds[-4:-1] == ["response.output_text.done", "response.content_part.done",
                            "response.output_item.done"]
    assert kinds[-1] in ("response.completed", "response.incomplete")
    assert set(kinds[4:-4]) == {"response.output_text.delta"}
    assert [e.sequence_number for e in events] == list(range(len(events)))
    text = "".join(e.delta for e in events if e.type == "response.output_text.delta")
    done = next(e for e in events if e.type == "response.output_text.done")
    assert text and done.text == text
    final = events[-1].response
    assert final.output_text == text
    assert final.usage.output_tokens > 0
    assert events[0].response.status == "in_progress"


@needs_llama
def test_a_function_call_round_trip_ends_in_an_answer(client, model_id):
    question = {"role": "user", "content": "What is the weather in Paris?"}
    first = client.responses.create(
        model=model_id, input=[question], tools=[WEATHER_TOOL], tool_choice="required",
        max_output_tokens=64, temperature=0)
    calls = [o for o in first.output if o.type == "function_call"]
    assert calls, first.output
    call = calls[0]
    assert call.name == "get_weather" and call.call_id
    args = json.loads(call.arguments)
    assert isinstance(args.get("city"), str)
    second = client.responses.create(
        model=model_id,
        input=[question,
               {"type": "function_call", "call_id": call.call_id, "name": call.name,
                "arguments": call.arguments},
               {"type": "function_call_output", "call_id": call.call_id,
                "output": json.dumps({"city": args["city"], "sky": "sunny", "celsius": 21})}],
        tools=[WEATHER_TOOL], tool_choice="none", max_output_tokens=32, temperature=0)
    assert [o.type for o in second.output] == ["message"]
    assert second.output_text.strip()
    # The call and the tool's answer were part of the prompt.
    alone = client.responses.create(model=model_id, input=[question], tools=[WEATHER_TOOL],
                                    tool_choice="none", max_output_tokens=1, temperature=0)
    assert second.usage.input_tokens > alone.usage.input_tokens + 10


@needs_llama
def test_a_streamed_function_call_sends_argument_events(client, model_id):
    events = list(client.responses.create(
        model=model_id, input="Weather in Tokyo?", tools=[WEATHER_TOOL],
        tool_choice={"type": "function", "name": "get_weather"},
        max_output_tokens=64, temperature=0, stream=True))
    kinds = [e.type for e in events]
    added = next(e for e in events if e.type == "response.output_item.added")
    assert added.item.type == "function_call" and added.item.name == "get_weather"
    done = next(e for e in events if e.type == "response.function_call_arguments.done")
    deltas = "".join(e.delta for e in events
                     if e.type == "response.function_call_arguments.delta"
                     and e.item_id == done.item_id)
    assert done.item_id == added.item.id and done.arguments == deltas
    json.loads(done.arguments)
    assert kinds.index("response.function_call_arguments.done") < kinds.index(
        "response.output_item.done")
    assert events[-1].response.output[0].type == "function_call"


@needs_llama
def test_parse_with_a_pydantic_model_returns_the_model(client, model_id):
    resp = client.responses.parse(
        model=model_id, input="Describe a big city in one JSON object.", text_format=City,
        max_output_tokens=64, temperature=0)
    assert isinstance(resp.output_parsed, City)
    assert resp.output_parsed.country in ("France", "Japan", "Peru")


@pytest.mark.parametrize(
    "extra, param",
    [
        ({"previous_response_id": "resp_123"}, "previous_response_id"),
        ({"store": True}, "store"),
        ({"background": True}, "background"),
        ({"tools": [{"type": "web_search"}]}, "tools[0].type"),
        ({"tools": [{"type": "file_search", "vector_store_ids": ["vs_1"]}]}, "tools[0].type"),
        ({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "https://example.com/a.png"}]}]},
         "input[0].content[0].type"),
    ],
)
def test_what_needs_state_or_other_modalities_is_a_400_naming_the_field(
        client, model_id, extra, param):
    kw = {"model": model_id, "input": "hi", "max_output_tokens": 4, **extra}
    with pytest.raises(openai.BadRequestError) as e:
        client.responses.create(**kw)
    assert e.value.status_code == 400
    assert e.value.param == param
    assert e.value.type == "invalid_request_error"
    assert param.split("[")[0].split(".")[0] in e.value.message
