#!/usr/bin/env python3
"""Writes the fuzz targets' seed inputs into fuzz/seeds/<target>/ from the repository's own
fixtures and test inputs: the chat templates under daemon/tests/fixtures, the DDI replies of
ota/tests/it/ddi.rs, and small request bodies, model outputs and GGUF files in the shapes
the unit tests use. The seeds are committed; libFuzzer's growing corpora live in
fuzz/corpus/ (ignored). Run from anywhere: python3 fuzz/seeds.py
"""

import json
import re
import struct
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SEEDS = ROOT / "fuzz" / "seeds"


def write(target, name, data):
    d = SEEDS / target
    d.mkdir(parents=True, exist_ok=True)
    if isinstance(data, str):
        data = data.encode()
    (d / name).write_bytes(data)


def request_body():
    tools = [{"type": "function", "function": {
        "name": "get_weather", "description": "The weather in a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}},
                       "required": ["city"]}}}]
    bodies = {
        "chat-min": {"model": "SmolLM2-135M-Instruct.Q4_1",
                     "messages": [{"role": "user", "content": "Say hello"}], "max_tokens": 32},
        "chat-sampling": {"messages": [{"role": "system", "content": "Be brief."},
                                       {"role": "user", "content": [{"type": "text", "text": "Hi"}]}],
                          "temperature": 0.7, "top_p": 0.9, "top_k": 40, "min_p": 0.05,
                          "seed": 7, "stop": ["\n\n", "END"], "n": 2, "logprobs": True,
                          "top_logprobs": 3, "logit_bias": {"42": -100},
                          "presence_penalty": 0.5, "frequency_penalty": 0.2,
                          "stream": True, "stream_options": {"include_usage": True}},
        "chat-tools": {"messages": [
            {"role": "user", "content": "Weather in Paris?"},
            {"role": "assistant", "content": None, "tool_calls": [
                {"id": "call_1", "type": "function",
                 "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
            {"role": "tool", "tool_call_id": "call_1", "content": "18 C, sunny"}],
            "tools": tools, "tool_choice": {"type": "function", "function": {"name": "get_weather"}},
            "parallel_tool_calls": False},
        "chat-schema": {"messages": [{"role": "user", "content": "A person as JSON"}],
                        "response_format": {"type": "json_schema", "json_schema": {
                            "name": "person", "strict": True, "schema": {
                                "type": "object", "properties": {"name": {"type": "string"},
                                                                 "age": {"type": "integer"}},
                                "required": ["name", "age"]}}},
                        "max_completion_tokens": 64},
        "chat-llama-ext": {"messages": [{"role": "user", "content": "x"}], "n_predict": 8,
                           "grammar": "root ::= \"yes\" | \"no\"", "speculative": False},
        "completion": {"prompt": "Once upon a time", "max_tokens": 16, "echo": True,
                       "logprobs": 2, "stop": "\n", "suffix": None},
        "completion-list": {"prompt": ["One prompt"], "temperature": 0, "best_of": 1},
        "responses": {"model": "SmolLM2-135M-Instruct.Q4_1", "instructions": "Be brief.",
                      "input": [{"role": "user", "content": [{"type": "input_text", "text": "Hi"}]},
                                {"type": "function_call", "call_id": "c1", "name": "get_weather",
                                 "arguments": "{\"city\":\"Paris\"}"},
                                {"type": "function_call_output", "call_id": "c1", "output": "sunny"}],
                      "tools": [{"type": "function", "name": "get_weather",
                                 "parameters": tools[0]["function"]["parameters"]}],
                      "text": {"format": {"type": "json_schema", "name": "x",
                                          "schema": {"type": "object"}}},
                      "max_output_tokens": 50, "stream": True, "metadata": {"k": "v"},
                      "store": False},
        "responses-text": {"input": "Say hi", "temperature": 0.2},
        "embeddings": {"input": ["first text", "second"], "encoding_format": "base64",
                       "dimensions": 576},
        "embeddings-tokens": {"input": [[1, 2, 3], [4, 5]], "model": "m"},
    }
    for name, body in bodies.items():
        write("request_body", name + ".json", json.dumps(body))
    write("request_body", "duplicate-key.json", '{"model":"a","model":"b","messages":[]}')


def template():
    chat = ["system", "You are helpful.", "user", "What is 2+2?", "assistant",
            "{\"name\": \"calc\", \"arguments\": {\"x\": 2}}", "tool", "4", "user", "  thanks \n"]
    tools = json.dumps([{"type": "function", "function": {
        "name": "calc", "parameters": {"type": "object", "properties": {"x": {"type": "number"}}}}}])
    for path in sorted((ROOT / "daemon/tests/fixtures/chat_templates").glob("*.jinja")):
        source = path.read_text()
        write("template", path.stem, "\0".join([source, tools] + chat))
        write("template", path.stem + "-plain", "\0".join([source, ""] + chat[2:4]))
    # Hostile shapes the renderer must bound: loops past the fuel, a huge string, deep
    # recursion, and a raise.
    hostile = {
        "loops": "{% for i in range(100000) %}{% for j in range(100000) %}x{% endfor %}{% endfor %}",
        "repeat": "{{ 'abc' * 100000000 }}",
        "recursion": "{% macro f(n) %}{{ f(n + 1) }}{% endmacro %}{{ f(0) }}",
        "raise": "{{ raise_exception('no system role') }}",
        "methods": "{% for m in messages %}{{ m.content.strip().upper().split(' ') | tojson }}"
                   "{{ m['role'] | title }}{{ strftime_now('%d %b %Y') }}{% endfor %}",
    }
    for name, source in hostile.items():
        write("template", "hostile-" + name, "\0".join([source, ""] + chat[2:4]))


def tool_calls():
    # First byte: the form (0 Hermes, 1 Llama 3, 2 Mistral) and the piece sizes' seed.
    texts = [
        (0, "Let me look.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": "
            "{\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", "
            "\"arguments\": {}}\n</tool_call>"),
        (0, "<tool_call>{\"arguments\": {\"x\": 1}, \"name\": \"f\"}</tool_call>"),
        (0, "<tool_call>{\"name\":\"f\",\"arguments\":\"{\\\"a\\\":1}\"}</tool_call>"),
        (0, "Hello <tool"),
        (1, "{\"name\": \"get_weather\", \"parameters\": {\"city\": \"Paris\"}}"),
        (1, "<|python_tag|>{\"name\": \"a\", \"parameters\": {}}; {\"name\": \"b\", \"parameters\": {\"n\": [1, 2]}}"),
        (1, "Sure, here is JSON: {\"name\": \"x\"}"),
        (2, "Checking.[TOOL_CALLS][{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}, \"id\": \"abc123def\"}]"),
        (2, "[{\"name\": \"f\", \"arguments\": {}}, {\"arguments\": {\"é\": \"<\"}, \"name\": \"g\"}]"),
        (2, "an array [1, 2] and a partial [TOOL_CA"),
    ]
    for i, (form, text) in enumerate(texts):
        write("tool_calls", f"{i:02}", bytes([form + 3 * (i % 5)]) + text.encode())


def sse():
    pieces = ["Hel", "lo", " wor", "ld\n", "\"quoted\"", " é", "\u2028"]
    calls = ["<tool_call>\n{\"name\": \"get_", "weather\", \"arguments\": {\"city\": ",
             "\"Paris\"}}\n</tool_call>"]
    llama = ["{\"name\": \"f\", ", "\"parameters\": {\"a\": [1, ", "2]}}"]
    sep = b"\xff"
    text = sep.join(p.encode() for p in pieces)
    # Flags: bits 0-1 the route, 2-3 the tools' form, 4 usage, 5 length, 6 failure, 7 logprobs.
    write("sse", "chat-text", bytes([0x10]) + text)
    write("sse", "completion-logprobs", bytes([0x01 | 0x80]) + text + sep + b"\xe2\x82")
    write("sse", "responses-text", bytes([0x02]) + text)
    write("sse", "chat-hermes", bytes([0x04]) + sep.join(p.encode() for p in calls))
    write("sse", "responses-hermes", bytes([0x06]) + sep.join(p.encode() for p in calls))
    write("sse", "chat-llama3-length", bytes([0x08 | 0x20]) + sep.join(p.encode() for p in llama))
    write("sse", "chat-failure", bytes([0x40]) + text)


def gguf():
    def string(s):
        b = s.encode()
        return struct.pack("<Q", len(b)) + b

    def build(kv, tensors, version=3, alignment=32):
        b = b"GGUF" + struct.pack("<IQQ", version, len(tensors), len(kv))
        for key, ty, value in kv:
            b += string(key) + struct.pack("<I", ty) + value
        offset = 0
        sizes = []
        for name, dims, ty, nbytes in tensors:
            b += string(name) + struct.pack("<I", len(dims))
            b += b"".join(struct.pack("<Q", d) for d in dims)
            b += struct.pack("<IQ", ty, offset)
            sizes.append(nbytes)
            offset += -(-nbytes // alignment) * alignment
        start = -(-len(b) // alignment) * alignment
        b += b"\0" * (start - len(b))
        data = bytearray()
        for n in sizes:
            data += bytes((i * 37) % 251 for i in range(n))
            data += b"\0" * (-(-len(data) // alignment) * alignment - len(data))
        return b + bytes(data[: offset - (-(-sizes[-1] // alignment) * alignment - sizes[-1])]) if sizes else b

    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "a", "b", "ab", " the"]
    arr = struct.pack("<IQ", 8, len(tokens)) + b"".join(string(t) for t in tokens)
    scores = struct.pack("<IQ", 6, 3) + struct.pack("<3f", 0.0, -1.5, 2.0)
    nested = struct.pack("<IQ", 9, 2) + struct.pack("<IQ", 4, 2) + struct.pack("<2I", 1, 2) \
        + struct.pack("<IQ", 0, 1) + b"\x07"
    kv = [
        ("general.architecture", 8, string("llama")),
        ("general.alignment", 4, struct.pack("<I", 32)),
        ("llama.block_count", 4, struct.pack("<I", 1)),
        ("llama.context_length", 4, struct.pack("<I", 8192)),
        ("llama.embedding_length", 4, struct.pack("<I", 32)),
        ("llama.feed_forward_length", 4, struct.pack("<I", 64)),
        ("llama.attention.head_count", 4, struct.pack("<I", 4)),
        ("llama.attention.head_count_kv", 4, struct.pack("<I", 2)),
        ("llama.rope.freq_base", 6, struct.pack("<f", 10000.0)),
        ("tokenizer.ggml.tokens", 9, arr),
        ("tokenizer.ggml.scores", 9, scores),
        ("tokenizer.ggml.eos_token_id", 4, struct.pack("<I", 2)),
        ("x.nested", 9, nested),
        ("x.bool", 7, b"\x01"),
        ("x.i64", 11, struct.pack("<q", -5)),
        ("x.f64", 12, struct.pack("<d", 0.5)),
    ]
    tensors = [
        ("token_embd.weight", [32, 7], 8, 7 * 34),  # Q8_0: 32 per 34-byte block
        ("output_norm.weight", [32], 0, 32 * 4),  # F32
        ("blk.0.attn_q.weight", [32, 32], 3, 32 * 20),  # Q4_1: 20-byte blocks
    ]
    # No .gguf extension: the repository ignores *.gguf (model weights are never committed).
    write("gguf", "llama-tiny", build(kv, tensors))
    write("gguf", "header-only", build(kv[:3], []))
    write("gguf", "v2", build(kv[:1], tensors[1:2], version=2))


def ddi():
    source = (ROOT / "ota/tests/it/ddi.rs").read_text()
    for i, body in enumerate(re.findall(r'r#"(\{.*?\})"#', source, re.S)):
        write("ddi", f"ddi-{i:02}.json", body)
    write("ddi", "cancel.json", json.dumps({"id": "5", "cancelAction": {"stopId": "5"}}))
    write("ddi", "numeric-id.json", json.dumps({"id": 7, "deployment": {"chunks": [{
        "artifacts": [{"filename": "../../etc/passwd",
                       "_links": {"download": {"href": "http://x/a"}}}]}]}}))
    write("ddi", "sleep.txt", "10000:59:59")


if __name__ == "__main__":
    for f in (request_body, template, tool_calls, sse, gguf, ddi):
        f()
    for d in sorted(SEEDS.iterdir()):
        print(f"{d.name}: {len(list(d.iterdir()))} seeds")
