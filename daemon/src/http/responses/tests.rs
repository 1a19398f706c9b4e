//! The Responses API's translation to the chat request and its event order.

use serde_json::{json, Value};

use super::output::Output;
use super::stream::ResponseFramer;
use super::wire::{OutputItem, ResponseObject, ResponsesRequest};
use crate::engine::constraint::Grammar;
use crate::engine::{FinishReason, Timings, Usage};
use crate::http::error::ApiError;
use crate::http::sse::Frames;
use crate::http::validate::{self, Input, InvalidRequest, ValidResponses};
use crate::tools::{Format, ToolChoice};

fn translate(body: Value) -> Result<ValidResponses, InvalidRequest> {
    let wire: ResponsesRequest =
        validate::parse_json(body.to_string().as_bytes()).expect("a well-formed body");
    validate::responses(wire)
}

#[test]
fn speculative_false_opts_a_response_out_of_speculation() {
    let on = translate(json!({"input": "hi"})).expect("valid");
    assert!(on.request.speculative);
    let off = translate(json!({"input": "hi", "speculative": false})).expect("valid");
    assert!(!off.request.speculative);
}

fn param_of(body: Value) -> String {
    match translate(body) {
        Err(InvalidRequest::Field { param, .. }) => param,
        other => panic!("expected a field error, got {other:?}"),
    }
}

fn turns_of(v: &ValidResponses) -> Vec<(String, String)> {
    match &v.request.input {
        Input::Chat(turns) => turns
            .iter()
            .map(|t| (t.role.clone(), t.content.clone()))
            .collect(),
        Input::Text(_) => panic!("a response is always chat"),
    }
}

#[test]
fn a_string_input_with_instructions_is_a_system_and_a_user_turn() {
    let v = translate(json!({"input": "hi", "instructions": "be brief",
                             "max_output_tokens": 7, "temperature": 0.5, "seed": 3}))
    .expect("valid");
    assert_eq!(
        turns_of(&v),
        [
            ("system".into(), "be brief".into()),
            ("user".into(), "hi".into())
        ]
    );
    assert_eq!(v.request.max_tokens, Some(7));
    assert_eq!(v.request.sampling.temperature, 0.5);
    assert_eq!(v.request.sampling.seed, 3);
    assert_eq!(v.echo.instructions.as_deref(), Some("be brief"));
    assert_eq!(v.echo.text, json!({"format": {"type": "text"}}));
}

#[test]
fn leading_developer_messages_join_the_instructions_in_one_system_turn() {
    let v = translate(json!({"instructions": "a", "input": [
        {"type": "message", "role": "developer", "content": [{"type": "input_text", "text": "b"}]},
        {"role": "user", "content": "c"},
    ]}))
    .expect("valid");
    assert_eq!(
        turns_of(&v),
        [
            ("system".into(), "a\n\nb".into()),
            ("user".into(), "c".into())
        ]
    );
}

#[test]
fn a_function_call_round_trip_becomes_an_assistant_call_and_a_tool_turn() {
    let v = translate(json!({
    "tools": [{"type": "function", "name": "get_weather", "parameters":
               {"type": "object", "properties": {"city": {"type": "string"}}}}],
    "input": [
        {"role": "user", "content": "Weather in Paris?"},
        {"type": "function_call", "call_id": "call_1", "name": "get_weather",
         "arguments": "{\"city\":\"Paris\"}"},
        {"type": "function_call_output", "call_id": "call_1", "output": "sunny"},
    ]}))
    .expect("valid");
    let Input::Chat(turns) = &v.request.input else {
        panic!("chat")
    };
    assert_eq!(turns.len(), 3);
    assert_eq!(turns[1].role, "assistant");
    assert_eq!(turns[1].tool_calls[0].id, "call_1");
    assert_eq!(turns[1].tool_calls[0].name, "get_weather");
    assert_eq!(turns[2].role, "tool");
    assert_eq!(turns[2].tool_call_id.as_deref(), Some("call_1"));
    assert_eq!(turns[2].content, "sunny");
    let tools = v.request.tools.as_ref().expect("tools offered");
    assert_eq!(tools.choice, ToolChoice::Auto);
    assert_eq!(tools.tools[0].name, "get_weather");
    assert_eq!(v.echo.tools.len(), 1);
}

#[test]
fn a_named_tool_choice_forces_that_function() {
    let v = translate(json!({"input": "x",
        "tools": [{"type": "function", "name": "f"}],
        "tool_choice": {"type": "function", "name": "f"}}))
    .expect("valid");
    assert_eq!(
        v.request.tools.expect("tools").choice,
        ToolChoice::Named("f".into())
    );
    assert_eq!(
        param_of(
            json!({"input": "x", "tools": [{"type": "function", "name": "f"}],
                        "tool_choice": {"type": "function", "name": "g"}})
        ),
        "tool_choice.name"
    );
}

#[test]
fn text_format_json_schema_is_the_same_grammar_as_chat() {
    let schema = json!({"type": "object", "properties": {"a": {"type": "integer"}}});
    let v = translate(json!({"input": "x", "text": {"format":
        {"type": "json_schema", "name": "thing", "schema": schema, "strict": true}}}))
    .expect("valid");
    assert_eq!(v.request.grammar, Some(Grammar::JsonSchema(schema)));
    assert_eq!(v.echo.text["format"]["name"], "thing");
    let v = translate(json!({"input": "x", "text": {"format": {"type": "json_object"}}}))
        .expect("valid");
    assert_eq!(
        v.request.grammar,
        Some(Grammar::JsonSchema(json!({"type": "object"})))
    );
    assert_eq!(
        param_of(json!({"input": "x", "text": {"format": {"type": "json_schema", "schema": {}}}})),
        "text.format.name"
    );
}

#[test]
fn metadata_is_echoed_and_held_to_string_pairs() {
    let v = translate(json!({"input": "x", "metadata": {"k": "v"}})).expect("valid");
    assert_eq!(v.echo.metadata.get("k"), Some(&json!("v")));
    assert_eq!(
        param_of(json!({"input": "x", "metadata": {"k": 1}})),
        "metadata.k"
    );
}

#[test]
fn what_a_stateless_server_cannot_do_is_refused_by_its_field() {
    let cases = [
        (
            json!({"input": "x", "previous_response_id": "resp_1"}),
            "previous_response_id",
        ),
        (json!({"input": "x", "store": true}), "store"),
        (json!({"input": "x", "background": true}), "background"),
        (
            json!({"input": "x", "conversation": "conv_1"}),
            "conversation",
        ),
        (
            json!({"input": "x", "tools": [{"type": "web_search"}]}),
            "tools[0].type",
        ),
        (
            json!({"input": "x", "tools": [{"type": "function", "name": "f"},
                                        {"type": "file_search", "vector_store_ids": []}]}),
            "tools[1].type",
        ),
        (
            json!({"input": [{"role": "user", "content": [
            {"type": "input_image", "image_url": "http://x/y.png"}]}]}),
            "input[0].content[0].type",
        ),
        (
            json!({"input": [{"type": "function_call_output", "call_id": "c",
                           "output": [{"type": "input_file", "file_id": "f"}]}]}),
            "input[0].output[0].type",
        ),
        (
            json!({"input": [{"type": "item_reference", "id": "msg_1"}]}),
            "input[0].type",
        ),
        (
            json!({"input": "x", "include": ["message.output_text.logprobs"]}),
            "include",
        ),
        (json!({}), "input"),
    ];
    for (body, param) in cases {
        assert_eq!(param_of(body.clone()), param, "{body}");
    }
}

#[test]
fn what_codex_sends_beside_its_input_is_accepted() {
    let v = translate(
        json!({"model": "m", "input": "x", "stream": true, "store": false,
        "reasoning": {"summary": "auto"}, "include": ["reasoning.encrypted_content"],
        "prompt_cache_key": "k", "parallel_tool_calls": true, "tool_choice": "auto",
        "client_metadata": {"a": "b"},
        "tools": [{"type": "function", "name": "exec_command", "strict": false,
                   "parameters": {"type": "object", "properties": {}}}]}),
    )
    .expect("valid");
    assert!(v.request.stream);
    assert_eq!(v.request.model.as_deref(), Some("m"));
}

fn kinds(events: &[Value]) -> Vec<String> {
    events
        .iter()
        .map(|e| e["type"].as_str().unwrap_or_default().to_string())
        .collect()
}

#[test]
fn text_is_one_message_item_opened_filled_and_closed_in_order() {
    let mut out = Output::new(None);
    out.push("Hel");
    out.push("lo");
    let items = out.finish(false);
    let events = out.take_events();
    assert_eq!(
        kinds(&events),
        [
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
        ]
    );
    assert_eq!(events[4]["text"], "Hello");
    let OutputItem::Message { content, id, .. } = &items[0] else {
        panic!("a message")
    };
    assert_eq!(content[0].text, "Hello");
    assert!(events[1..events.len() - 1]
        .iter()
        .all(|e| e["item_id"] == json!(id)));
    assert_eq!(events[events.len() - 1]["item"]["id"], json!(id));
}

#[test]
fn a_call_is_a_function_call_item_with_argument_deltas() {
    let mut out = Output::new(Some(Format::Hermes));
    for piece in [
        "<tool_call>\n{\"name\": \"get_weather\", ",
        "\"arguments\": {\"city\": ",
        "\"Paris\"}}\n</tool_call>",
    ] {
        out.push(piece);
    }
    let items = out.finish(false);
    let events = out.take_events();
    let k = kinds(&events);
    assert_eq!(
        k.first().map(String::as_str),
        Some("response.output_item.added")
    );
    assert!(k[1..k.len() - 2]
        .iter()
        .all(|e| e == "response.function_call_arguments.delta"));
    assert_eq!(
        &k[k.len() - 2..],
        [
            "response.function_call_arguments.done",
            "response.output_item.done"
        ]
    );
    let OutputItem::FunctionCall {
        name,
        arguments,
        call_id,
        ..
    } = &items[0]
    else {
        panic!("a function call: {items:?}")
    };
    assert_eq!(name, "get_weather");
    assert_eq!(arguments, r#"{"city": "Paris"}"#);
    assert!(call_id.starts_with("call_"));
    assert_eq!(
        events[events.len() - 2]["arguments"],
        r#"{"city": "Paris"}"#
    );
}

#[test]
fn an_empty_output_is_still_one_empty_message() {
    let mut out = Output::new(None);
    let items = out.finish(false);
    assert_eq!(items.len(), 1);
    assert_eq!(kinds(&out.take_events()).len(), 5);
}

fn framer() -> ResponseFramer {
    let v = translate(json!({"input": "x"})).expect("valid");
    ResponseFramer::new(
        ResponseObject::new("resp_1".into(), 1, "m".into(), v.echo),
        None,
    )
}

fn events_of(bytes: &[u8]) -> Vec<Value> {
    std::str::from_utf8(bytes)
        .expect("utf8")
        .split("\n\n")
        .filter(|f| !f.is_empty())
        .map(|f| {
            let mut lines = f.lines();
            let event = lines.next().and_then(|l| l.strip_prefix("event: "));
            let data = lines.next().and_then(|l| l.strip_prefix("data: "));
            let v: Value = serde_json::from_str(data.expect("data line")).expect("json");
            assert_eq!(Some(v["type"].as_str().expect("type")), event);
            v
        })
        .collect()
}

#[test]
fn a_stream_runs_created_to_completed_with_consecutive_sequence_numbers() {
    let mut f = framer();
    let mut all = events_of(&f.opening());
    all.extend(events_of(&f.text("Hi", &[])));
    let usage = Usage {
        prompt_tokens: 5,
        completion_tokens: 1,
        total_tokens: 6,
        ..Usage::default()
    };
    all.extend(events_of(&f.closing(
        FinishReason::Stop,
        usage,
        Timings::default(),
    )));
    assert_eq!(
        kinds(&all),
        [
            "response.created",
            "response.in_progress",
            "response.output_item.added",
            "response.content_part.added",
            "response.output_text.delta",
            "response.output_text.done",
            "response.content_part.done",
            "response.output_item.done",
            "response.completed",
        ]
    );
    for (i, e) in all.iter().enumerate() {
        assert_eq!(e["sequence_number"], json!(i));
    }
    let done = &all[all.len() - 1]["response"];
    assert_eq!(done["status"], "completed");
    assert_eq!(done["usage"]["input_tokens"], 5);
    assert_eq!(done["usage"]["input_tokens_details"]["cached_tokens"], 0);
    assert_eq!(done["output"][0]["content"][0]["text"], "Hi");
}

#[test]
fn a_stream_cut_by_the_token_limit_ends_incomplete() {
    let mut f = framer();
    f.text("Hi", &[]);
    let last = events_of(&f.closing(FinishReason::Length, Usage::default(), Timings::default()));
    let end = last.last().expect("an end event");
    assert_eq!(end["type"], "response.incomplete");
    assert_eq!(
        end["response"]["incomplete_details"]["reason"],
        "max_output_tokens"
    );
}

#[test]
fn a_failed_stream_sends_error_then_response_failed() {
    let mut f = framer();
    f.text("Hi", &[]);
    let e = ApiError::internal("boom");
    let events = events_of(&f.failure(&e));
    assert_eq!(kinds(&events), ["error", "response.failed"]);
    assert_eq!(events[0]["message"], "boom");
    assert_eq!(events[1]["response"]["status"], "failed");
    assert_eq!(events[1]["response"]["error"]["code"], "server_error");
}

#[test]
fn openais_labels_are_accepted_and_an_unknown_field_is_refused_by_name() {
    translate(json!({"input": "x", "user": "u", "safety_identifier": "s",
        "prompt_cache_retention": "24h", "stream_options": {"include_obfuscation": false},
        "reasoning": {"effort": "low"}}))
    .expect("labels");
    let wire = validate::parse_json::<super::wire::ResponsesRequest>(
        json!({"input": "x", "cache_prompt": true})
            .to_string()
            .as_bytes(),
    );
    match wire {
        Err(InvalidRequest::Field { param, .. }) => assert_eq!(param, "cache_prompt"),
        other => panic!("expected a field error, got {other:?}"),
    }
}
