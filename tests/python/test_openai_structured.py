"""Structured output and tool calls through the official client: a json_schema reply that
parses and validates (pydantic, as `client.chat.completions.parse` uses it), a forced tool
call whose arguments validate, whole and streamed, and a schema the server cannot enforce
refused by name. Against the native backend (`make test-native`), which has no constrained
decoding, the same requests must be 400s naming the field instead."""

from __future__ import annotations

import json
import os
from typing import Literal

import openai
import pydantic
import pytest

from conftest import REPO, running_daemon


class Person(pydantic.BaseModel):
    model_config = pydantic.ConfigDict(extra="forbid")
    name: str = pydantic.Field(max_length=40)
    age: int = pydantic.Field(ge=0, le=150)
    city: Literal["Paris", "London", "Tokyo"]


class GetWeather(pydantic.BaseModel):
    """Current weather in a city."""

    model_config = pydantic.ConfigDict(extra="forbid")
    city: str = pydantic.Field(max_length=30)
    unit: Literal["celsius", "fahrenheit"]


MESSAGES = [{"role": "user", "content": "Describe a person who lives in a big city."}]

NATIVE = "native" in os.environ.get("INFERLOOPD_ARGS", "")
needs_llama = pytest.mark.skipif(
    NATIVE, reason="constrained decoding needs the llama.cpp backend (native answers 400)"
)


def _person_format() -> dict:
    return {
        "type": "json_schema",
        "json_schema": {"name": "person", "strict": True, "schema": Person.model_json_schema()},
    }


@needs_llama
def test_json_schema_reply_validates_whole_and_streamed(client, model_id):
    kw = dict(model=model_id, messages=MESSAGES, max_tokens=96, temperature=0,
              response_format=_person_format())
    resp = client.chat.completions.create(**kw)
    assert resp.choices[0].finish_reason == "stop"
    whole = resp.choices[0].message.content
    Person.model_validate_json(whole)
    parts = []
    for chunk in client.chat.completions.create(stream=True, **kw):
        if chunk.choices and chunk.choices[0].delta.content:
            parts.append(chunk.choices[0].delta.content)
    streamed = "".join(parts)
    Person.model_validate(json.loads(streamed))
    assert streamed == whole


@needs_llama
def test_parse_helper_returns_the_pydantic_object(client, model_id):
    parse = getattr(client.chat.completions, "parse", None) or client.beta.chat.completions.parse
    resp = parse(model=model_id, messages=MESSAGES, max_tokens=96, temperature=0,
                 response_format=Person)
    assert isinstance(resp.choices[0].message.parsed, Person)


@needs_llama
def test_json_object_reply_is_an_object(client, model_id):
    resp = client.chat.completions.create(
        model=model_id, max_tokens=64, temperature=0,
        messages=[{"role": "user", "content": "Reply with a JSON object about a cat."}],
        response_format={"type": "json_object"},
    )
    text = resp.choices[0].message.content
    if resp.choices[0].finish_reason == "stop":
        assert isinstance(json.loads(text), dict)
    else:
        assert text.startswith("{")


@needs_llama
def test_unenforceable_schema_is_a_400_naming_it(client, model_id):
    schema = {"type": "object", "if": {"properties": {"a": {"const": 1}}},
              "then": {"required": ["b"]}}
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id, messages=MESSAGES, max_tokens=4,
            response_format={"type": "json_schema",
                             "json_schema": {"name": "x", "schema": schema}},
        )
    assert e.value.body["param"] == "response_format.json_schema.schema"
    assert '"if"' in e.value.body["message"]


WEATHER_MESSAGES = [{"role": "user", "content": "What is the weather like in Paris today?"}]


def _weather_kw(model_id: str) -> dict:
    return dict(
        model=model_id, messages=WEATHER_MESSAGES, max_tokens=96, temperature=0,
        tools=[openai.pydantic_function_tool(GetWeather, name="get_weather")],
        tool_choice={"type": "function", "function": {"name": "get_weather"}},
        parallel_tool_calls=False,
    )


@needs_llama
def test_forced_tool_call_arguments_validate_whole_and_streamed(client, model_id):
    resp = client.chat.completions.create(**_weather_kw(model_id))
    choice = resp.choices[0]
    assert choice.finish_reason == "tool_calls"
    assert choice.message.content is None
    (call,) = choice.message.tool_calls
    assert call.id.startswith("call_") and call.type == "function"
    assert call.function.name == "get_weather"
    GetWeather.model_validate_json(call.function.arguments)

    calls: dict[int, dict] = {}
    finish = None
    for chunk in client.chat.completions.create(stream=True, **_weather_kw(model_id)):
        if not chunk.choices:
            continue
        c = chunk.choices[0]
        finish = c.finish_reason or finish
        for d in c.delta.tool_calls or []:
            acc = calls.setdefault(d.index, {"id": d.id, "name": None, "arguments": ""})
            if d.function and d.function.name:
                acc["name"] = d.function.name
            if d.function and d.function.arguments:
                acc["arguments"] += d.function.arguments
    assert finish == "tool_calls"
    assert list(calls) == [0]
    assert calls[0]["id"].startswith("call_") and calls[0]["name"] == "get_weather"
    GetWeather.model_validate_json(calls[0]["arguments"])
    assert calls[0]["arguments"] == call.function.arguments


@needs_llama
def test_tool_result_round_trip(client, model_id):
    first = client.chat.completions.create(**_weather_kw(model_id))
    call = first.choices[0].message.tool_calls[0]
    messages = WEATHER_MESSAGES + [
        first.choices[0].message.model_dump(exclude_none=True),
        {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21, "sky": "sunny"}'},
    ]
    kw = _weather_kw(model_id)
    kw.update(messages=messages, tool_choice="none", max_tokens=24)
    resp = client.chat.completions.create(**kw)
    assert isinstance(resp.choices[0].message.content, str)
    assert not resp.choices[0].message.tool_calls


@needs_llama
@pytest.mark.parametrize(
    "template, id_ok",
    [
        ("llama3.2", lambda i: i.startswith("call_")),
        # Mistral's template requires 9 alphanumerics back as `tool_call_id`.
        ("mistral-nemo", lambda i: len(i) == 9 and i.isalnum()),
    ],
)
def test_family_tool_call_forms_round_trip(template, id_ok, model_id):
    """The same client code against the Llama 3 and Mistral forms (the default model given
    those families' templates): a forced call that validates, whole and streamed, and the
    call and its result sent back through the family's template."""
    path = REPO / "daemon/tests/fixtures/chat_templates" / f"{template}.jinja"
    with running_daemon("--chat-template", str(path)) as url:
        client = openai.OpenAI(base_url=url + "/v1", api_key="unused", max_retries=0, timeout=60)
        first = client.chat.completions.create(**_weather_kw(model_id))
        assert first.choices[0].finish_reason == "tool_calls"
        (call,) = first.choices[0].message.tool_calls
        assert id_ok(call.id) and call.function.name == "get_weather"
        GetWeather.model_validate_json(call.function.arguments)

        args = ""
        for chunk in client.chat.completions.create(stream=True, **_weather_kw(model_id)):
            for d in (chunk.choices[0].delta.tool_calls or []) if chunk.choices else []:
                assert d.index == 0
                args += (d.function.arguments or "") if d.function else ""
        assert args == call.function.arguments

        messages = WEATHER_MESSAGES + [
            first.choices[0].message.model_dump(exclude_none=True),
            {"role": "tool", "tool_call_id": call.id, "content": '{"temp": 21}'},
        ]
        kw = _weather_kw(model_id)
        kw.update(messages=messages, tool_choice="none", max_tokens=8)
        resp = client.chat.completions.create(**kw)
        assert isinstance(resp.choices[0].message.content, str)


@pytest.mark.skipif(not NATIVE, reason="the llama.cpp backend enforces these")
def test_native_backend_refuses_constrained_requests_naming_the_field(client, model_id):
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(
            model=model_id, messages=MESSAGES, max_tokens=4, response_format=_person_format()
        )
    assert e.value.body["param"] == "response_format"
    with pytest.raises(openai.BadRequestError) as e:
        client.chat.completions.create(**_weather_kw(model_id))
    assert e.value.body["param"] == "tool_choice"
