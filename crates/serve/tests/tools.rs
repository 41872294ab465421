//! Tools on templates that do not write them (regressions from a SmolLM2 report: a chatml
//! template, an exact Hermes block answered as plain content with `tool_calls: []`, and the
//! request's `tools` dropped without a word): a named `tool_call_parser` parses calls whatever the
//! template says, `tools` a template cannot render come back with a `warnings` entry, and a tool
//! message a template rejects is a 400 naming the message's index and role.

mod common;

use common::*;
use serde_json::{Value, json};
use stoke_serve::ToolCallSetting;
use stoke_serve::tools::{ToolSupport, assistant_message};
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::tool_calls::ToolCallParser;

/// SmolLM2-135M-Instruct's chat template: chatml, no tools.
const SMOLLM2_TEMPLATE: &str = "{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}{{ '<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n' }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// A template that, like many, raises on a role it does not know.
const NO_TOOL_ROLE_TEMPLATE: &str = "{% for message in messages %}{% if message['role'] not in ['system', 'user', 'assistant'] %}{{ raise_exception('Only system, user and assistant roles are supported!') }}{% endif %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n'}}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

const HERMES_BLOCK: &str =
    "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";

fn tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

fn chat(extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "max_tokens": 2, "temperature": 0,
        "messages": [{"role": "user", "content": "Weather in Paris?"}]});
    merge(&mut body, extra);
    body
}

#[test]
fn a_hermes_block_under_the_smollm2_template_is_parsed_with_the_hermes_parser() {
    let dir = tempfile::tempdir().unwrap();
    let tokenizer = Tokenizer::from_dir(&fixture_with_template(dir.path(), SMOLLM2_TEMPLATE))
        .expect("the copy loads");
    // `auto` finds no format in a chatml template: the block stays text, as before.
    let auto = ToolSupport::new(ToolCallSetting::Auto, &tokenizer);
    assert_eq!(auto.parser, None);
    let (message, has_calls) = assistant_message(auto.parser, HERMES_BLOCK, "c");
    assert!(!has_calls);
    assert_eq!(message["content"], HERMES_BLOCK);
    // `--tool-call-parser hermes` parses it whatever the template says.
    let setting: ToolCallSetting = "hermes".parse().unwrap();
    let hermes = ToolSupport::new(setting, &tokenizer);
    assert_eq!(hermes.parser, Some(ToolCallParser::Hermes));
    let (message, has_calls) = assistant_message(hermes.parser, HERMES_BLOCK, "c");
    assert!(has_calls);
    assert_eq!(message["content"], Value::Null);
    assert_eq!(
        message["tool_calls"],
        json!([{"id": "c-0", "type": "function",
                "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}])
    );
}

#[test]
fn the_fixture_qwen_template_is_detected_as_hermes() {
    let tokenizer = Tokenizer::from_dir(&fixture_dir()).unwrap();
    let support = ToolSupport::new(ToolCallSetting::Auto, &tokenizer);
    assert_eq!(support.parser, Some(ToolCallParser::Hermes));
    assert!(support.template_renders_tools);
    let none = ToolSupport::new(ToolCallSetting::None, &tokenizer);
    assert_eq!(none.parser, None);
}

#[test]
fn tools_a_template_cannot_render_come_back_with_a_warning() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.model_dir = fixture_with_template(dir.path(), SMOLLM2_TEMPLATE);
    config.tool_call_parser = ToolCallSetting::Parser(ToolCallParser::Hermes);
    let (_server, client) = start(config);
    for _ in 0..2 {
        // Every answer says so, not only the first (the log line is once per server).
        let answer = ok(
            &client,
            "/v1/chat/completions",
            chat(json!({"tools": tools()})),
        );
        let warnings = answer["warnings"].as_array().expect("a warnings array");
        assert_eq!(warnings.len(), 1, "{answer}");
        assert!(
            warnings[0].as_str().unwrap().contains("`tools`"),
            "{answer}"
        );
        assert!(answer["choices"][0]["message"].is_object());
    }
    let streamed = stream(
        &client,
        "/v1/chat/completions",
        chat(json!({"tools": tools(), "stream": true})),
    );
    assert_eq!(streamed[0]["warnings"].as_array().map(Vec::len), Some(1));
    // Without tools (or with tool_choice "none") nothing was dropped: no warning.
    let plain = ok(&client, "/v1/chat/completions", chat(json!({})));
    assert!(plain.get("warnings").is_none(), "{plain}");
    let none = ok(
        &client,
        "/v1/chat/completions",
        chat(json!({"tools": tools(), "tool_choice": "none"})),
    );
    assert!(none.get("warnings").is_none(), "{none}");
}

#[test]
fn tools_the_fixture_template_renders_bring_no_warning() {
    // The Qwen tool preamble alone is ~500 tokens: a longer context than the fixture's 128.
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.model_dir = fixture_with_context(dir.path(), 1024);
    let (_server, client) = start(config);
    let answer = ok(
        &client,
        "/v1/chat/completions",
        chat(json!({"tools": tools()})),
    );
    assert!(answer.get("warnings").is_none(), "{answer}");
}

#[test]
fn a_tool_message_the_template_rejects_is_a_400_naming_its_index_and_role() {
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.model_dir = fixture_with_template(dir.path(), NO_TOOL_ROLE_TEMPLATE);
    let (_server, client) = start(config);
    let messages = json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": "Checking."},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"},
    ]);
    let (status, answer) = client
        .post("/v1/chat/completions", &chat(json!({"messages": messages})))
        .unwrap();
    assert_eq!(status, 400, "{answer}");
    assert_eq!(answer["error"]["param"], "messages[3]", "{answer}");
    let message = answer["error"]["message"].as_str().unwrap();
    assert!(
        message.starts_with("messages[3] (role tool): "),
        "{message}"
    );
    assert!(
        message.contains("Only system, user and assistant roles are supported!"),
        "{message}"
    );
    assert!(!message.contains("template line"), "{message}");
    // The server keeps serving.
    let answer = ok(&client, "/v1/chat/completions", chat(json!({})));
    assert_eq!(answer["object"], "chat.completion");
}
