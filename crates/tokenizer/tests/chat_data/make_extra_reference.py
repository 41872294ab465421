"""Extra chat-template references from transformers (tool calls, tool results, tools lists,
empty and whitespace-only contents), beyond fixtures/chat/reference.json, and renderings of
`jinja_features.jinja`, a template that exercises the jinja2 features HF templates use
(namespace, reverse slices, macros, Python string methods, filters, tojson options,
loop.previtem/nextitem, whitespace control; not Python's `%` string formatting, which minijinja
lacks), and message preparation (null keys dropped, reasoning fields aliased, the mask of a
generation block that ends inside a character split over byte-level tokens).

Run from the repository root with the fixtures venv (see fixtures/README.md):
    $VENV/bin/python crates/tokenizer/tests/chat_data/make_extra_reference.py
It writes crates/tokenizer/tests/chat_data/extra_reference.json (deterministic).
"""
import json
import pathlib

import transformers
from transformers import AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[4]
OUT = pathlib.Path(__file__).with_name("extra_reference.json")

WEATHER_TOOL = {
    "type": "function",
    "function": {
        "name": "get_weather",
        "description": "Weather in a city, in °C.",
        "parameters": {
            "type": "object",
            "properties": {"city": {"type": "string"}, "days": {"type": "integer"}},
            "required": ["city"],
        },
    },
}

TOOL_CALL_TURN = [
    {"role": "user", "content": "Weather in Zürich?"},
    {
        "role": "assistant",
        "content": "",
        "tool_calls": [
            {"type": "function", "function": {"name": "get_weather", "arguments": {"zcity": "Zürich", "days": 2, "scale": 1e-07}}}
        ],
    },
    {"role": "tool", "content": "{\"temp\": 3.5}"},
    {"role": "tool", "content": "second result"},
    {"role": "assistant", "content": "It is 3.5 °C."},
]

CASES = [
    ("tool_call_turns", TOOL_CALL_TURN, False, None),
    ("tool_call_turns_gen", TOOL_CALL_TURN[:4], True, None),
    ("tools_listed", [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi"}], True, [WEATHER_TOOL]),
    (
        "empty_and_blank_contents",
        [{"role": "user", "content": "  "}, {"role": "assistant", "content": ""}, {"role": "user", "content": "\n"}, {"role": "assistant", "content": " x "}],
        False,
        None,
    ),
]


FEATURE_CASES = [
    (
        "think_tool_parts",
        [
            {"role": "system", "content": "  Be very brief please.  "},
            {"role": "user", "content": "Q1"},
            {
                "role": "assistant",
                "content": "<think>\nstep one\nstep two\n</think>\n\nA1",
                "tool_calls": [{"type": "function", "function": {"name": "f", "arguments": {"b": 1, "a": [1.5, None, True]}}}],
            },
            {"role": "tool", "content": "42"},
            {"role": "user", "content": [{"type": "text", "text": "part one"}, {"type": "text", "text": "part two"}]},
            {"role": "assistant", "content": "A2"},
        ],
    ),
    ("no_system", [{"role": "user", "content": "only"}]),
]


def feature_cases():
    tok = AutoTokenizer.from_pretrained(str(ROOT / "fixtures" / "tokenizers" / "qwen2"))
    template = (pathlib.Path(__file__).with_name("jinja_features.jinja")).read_text()
    cases = []
    for name, messages in FEATURE_CASES:
        for gen in [False, True]:
            text = tok.apply_chat_template(messages, chat_template=template, tokenize=False, add_generation_prompt=gen)
            cases.append({"name": name, "messages": messages, "add_generation_prompt": gen, "text": text})
    return {"tokenizer_dir": "fixtures/tokenizers/qwen2", "cases": cases}


# Message preparation: null-valued keys are dropped, reasoning fields are aliased.
FIELDS_TEMPLATE = (
    "{% for m in messages %}{{ m.role }}: content {{ m.content is defined }}, "
    "tool_calls {{ m.tool_calls is defined }}, reasoning_content {{ m.reasoning_content | default('-') }}, "
    "thinking {{ m.thinking | default('-') }}, reasoning {{ m.reasoning | default('-') }}\n{% endfor %}"
)
FIELDS_MESSAGES = [
    {"role": "user", "content": "q", "tool_calls": None},
    {"role": "assistant", "content": None, "thinking": "t1"},
    {"role": "assistant", "content": "a", "reasoning": "r2"},
    {"role": "assistant", "content": "a", "reasoning_content": "rc3", "thinking": "t3"},
    {"role": "assistant", "content": "a", "reasoning_content": None, "reasoning": "r4"},
]

# A generation block that ends inside a character split over byte-level tokens.
SPLIT_CHAR_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m.role }}\n{% if m.role == 'assistant' %}"
    "{% generation %}{{ m.content }}{% endgeneration %}{% else %}{{ m.content }}{% endif %}"
    "<|im_end|>\n{% endfor %}"
)
SPLIT_CHAR_MESSAGES = [
    {"role": "user", "content": "hi"},
    {"role": "assistant", "content": "ok 🦀"},
    {"role": "user", "content": "中"},
    {"role": "assistant", "content": "é"},
]


def message_cases():
    tok = AutoTokenizer.from_pretrained(str(ROOT / "fixtures" / "tokenizers" / "qwen2"))
    fields_text = tok.apply_chat_template(FIELDS_MESSAGES, chat_template=FIELDS_TEMPLATE, tokenize=False)
    masked = tok.apply_chat_template(
        SPLIT_CHAR_MESSAGES, chat_template=SPLIT_CHAR_TEMPLATE, return_dict=True, return_assistant_tokens_mask=True
    )
    return {
        "tokenizer_dir": "fixtures/tokenizers/qwen2",
        "fields": {"template": FIELDS_TEMPLATE, "messages": FIELDS_MESSAGES, "text": fields_text},
        "split_char_mask": {
            "template": SPLIT_CHAR_TEMPLATE,
            "messages": SPLIT_CHAR_MESSAGES,
            "input_ids": list(masked["input_ids"]),
            "assistant_masks": list(masked["assistant_masks"]),
        },
    }


def main():
    out = {"transformers_version": transformers.__version__, "tokenizers": {}}
    for name in ["qwen2", "llama3"]:
        tok_dir = ROOT / "fixtures" / "tokenizers" / name
        tok = AutoTokenizer.from_pretrained(str(tok_dir))
        generation = (tok_dir / "chat_template_generation.jinja").read_text()
        kwargs = {"date_string": "26 Jul 2024"} if name == "llama3" else {}
        cases = []
        for case_name, messages, gen, tools in CASES:
            try:
                text = tok.apply_chat_template(messages, tools=tools, tokenize=False, add_generation_prompt=gen, **kwargs)
                ids = tok.apply_chat_template(messages, tools=tools, tokenize=True, add_generation_prompt=gen, return_dict=True, **kwargs)["input_ids"]
                masked = tok.apply_chat_template(
                    messages, tools=tools, chat_template=generation, add_generation_prompt=gen,
                    return_dict=True, return_assistant_tokens_mask=True, **kwargs,
                )
            except Exception as err:  # recorded: the Rust side must fail too
                cases.append({"name": case_name, "messages": messages, "tools": tools, "add_generation_prompt": gen,
                              "template_kwargs": kwargs, "error": f"{type(err).__name__}: {err}"})
                continue
            cases.append({
                "name": case_name, "messages": messages, "tools": tools, "add_generation_prompt": gen,
                "template_kwargs": kwargs, "text": text, "input_ids": list(ids),
                "generation_text": tok.decode(masked["input_ids"]),
                "assistant_masks": list(masked["assistant_masks"]),
            })
        out["tokenizers"][name] = {"tokenizer_dir": f"fixtures/tokenizers/{name}", "cases": cases}
    out["jinja_features"] = feature_cases()
    out["message_preparation"] = message_cases()
    OUT.write_text(json.dumps(out, ensure_ascii=False) + "\n")


if __name__ == "__main__":
    main()
