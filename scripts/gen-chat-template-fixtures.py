#!/usr/bin/env python3
"""Writes daemon/tests/fixtures/chat_templates/expected.json: each template of that folder
rendered by Hugging Face `transformers` for a few conversations. The daemon's renderer must
produce the same text (test `chat_templates_render_as_transformers_does` in daemon/tests/it).

Run once, by hand, when a template or a conversation is added; CI does not run it. It needs
no model weights and no hub access:

    python3 -m venv /tmp/tfvenv && /tmp/tfvenv/bin/pip install transformers jinja2
    /tmp/tfvenv/bin/python scripts/gen-chat-template-fixtures.py
"""

import datetime
import json
import pathlib

from transformers.utils import chat_template_utils
from transformers.utils.chat_template_utils import render_jinja_template

ROOT = pathlib.Path(__file__).resolve().parent.parent
FIXTURES = ROOT / "daemon" / "tests" / "fixtures" / "chat_templates"

# strftime_now reads this fixed instant (UNIX seconds, UTC) on both sides.
NOW = 1_722_000_309  # 2024-07-26 13:25:09 UTC

# Template file, and the bos/eos token texts its tokenizer has.
TEMPLATES = {
    "smollm2.jinja": ("<|im_start|>", "<|im_end|>"),
    "qwen2.5.jinja": ("", "<|im_end|>"),
    "llama3.2.jinja": ("<|begin_of_text|>", "<|eot_id|>"),
    "mistral-nemo.jinja": ("<s>", "</s>"),
    "gemma2.jinja": ("<bos>", "<eos>"),
    "gemma3.jinja": ("<bos>", "<eos>"),
    "phi3.5.jinja": ("<s>", "<|endoftext|>"),
}


def m(role, content):
    return {"role": role, "content": content}


CONVERSATIONS = [
    ("system and user", [m("system", "You are terse."), m("user", "Hi")], True),
    ("user only", [m("user", "Hi")], True),
    (
        "multi-turn",
        [
            m("user", "Name a colour."),
            m("assistant", "Blue."),
            m("user", "Another one, please: 1, 2, 3."),
        ],
        True,
    ),
    (
        "multi-turn without generation prompt",
        [m("system", "Be kind."), m("user", "Hello"), m("assistant", "Hi there!")],
        False,
    ),
    ("whitespace around content", [m("user", "  Hello there!  \n")], True),
    ("empty content", [m("user", "")], True),
]

# With `tools`. The earlier call is the assistant turn's text (the daemon writes calls into
# it in the family's form); the tool turn carries its `tool_call_id`, which templates such as
# Mistral's write themselves.
TOOL_CONVERSATIONS = [
    ("user with tools", [m("user", "Weather in Paris?")], True),
    (
        "tool result",
        [
            m("user", "Weather in Paris?"),
            m("assistant", '{"name": "get_weather", "parameters": {"city": "Paris"}}'),
            {"role": "tool", "content": '{"temp": 21}', "tool_call_id": "abcDEF123"},
        ],
        True,
    ),
]


class FixedClock(datetime.datetime):
    """`transformers`' strftime_now calls `datetime.now()`: make it read NOW, in UTC."""

    @classmethod
    def now(cls, tz=None):
        return datetime.datetime.fromtimestamp(NOW, datetime.timezone.utc)


chat_template_utils.datetime = FixedClock

# Keys in sorted order at every level: the daemon's test builds tools through serde_json,
# whose maps are sorted, and `tojson` writes keys in map order on both sides.
TOOLS = [
    {
        "function": {
            "description": "Get the weather in a city",
            "name": "get_weather",
            "parameters": {
                "properties": {"city": {"description": "City name", "type": "string"}},
                "required": ["city"],
                "type": "object",
            },
        },
        "type": "function",
    }
]


def main():
    out = {"now": NOW, "templates": []}
    for name, (bos, eos) in TEMPLATES.items():
        source = (FIXTURES / name).read_text()
        cases = []
        runs = [(c, None) for c in CONVERSATIONS] + [(c, TOOLS) for c in TOOL_CONVERSATIONS]
        for (title, messages, add_generation_prompt), tools in runs:
            case = {
                "title": title,
                "messages": messages,
                "add_generation_prompt": add_generation_prompt,
            }
            if tools is not None:
                case["tools"] = tools
            try:
                rendered = render_jinja_template(
                    conversations=[messages],
                    tools=tools,
                    chat_template=source,
                    add_generation_prompt=add_generation_prompt,
                    bos_token=bos,
                    eos_token=eos,
                )
                # Older releases return (rendered, generation_indices).
                if isinstance(rendered, tuple):
                    rendered = rendered[0]
                case["expected"] = rendered[0]
            except Exception as e:  # the template's raise_exception
                case["raises"] = str(e)
            cases.append(case)
        out["templates"].append({"file": name, "bos_token": bos, "eos_token": eos, "cases": cases})
    path = FIXTURES / "expected.json"
    path.write_text(json.dumps(out, indent=2, ensure_ascii=False) + "\n")
    print(f"wrote {path}")


if __name__ == "__main__":
    main()
