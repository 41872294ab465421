//! `/v1/chat/completions` on the tiny Qwen2 fixture (its chat template has tools): messages are
//! rendered with the template (tools passed to it), log-probs come as `logprobs.content`, `n`
//! and streaming answer like vLLM, and a seeded chat equals the same prompt as a completion.

mod common;

use common::*;
use serde_json::{Value, json};
use stoke_tokenizer::chat::{ChatMessage, ChatOptions, TemplateValue};
use stoke_tokenizer::hf::Tokenizer;

fn messages() -> Value {
    json!([
        {"role": "system", "content": "Be brief."},
        {"role": "user", "content": "What is 2 + 2?"}
    ])
}

fn rendered(tools: Option<Value>) -> Vec<u32> {
    let tokenizer = Tokenizer::from_dir(&fixture_dir()).unwrap();
    let messages: Vec<ChatMessage> = serde_json::from_value(messages()).unwrap();
    let mut options = ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    if let Some(tools) = tools {
        let value: TemplateValue = serde_json::from_value(tools).unwrap();
        options.variables.insert("tools".into(), value);
    }
    tokenizer
        .apply_chat_template(&messages, &options)
        .unwrap()
        .ids
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn messages_are_rendered_with_the_template_and_answered_like_vllm() {
    let (server, client) = start_default();
    let answer = ok(
        &client,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": messages(), "max_tokens": 8, "temperature": 0,
               "logprobs": true, "top_logprobs": 3, "return_token_ids": true}),
    );
    assert_eq!(answer["object"], "chat.completion");
    assert!(answer["id"].as_str().unwrap().starts_with("chatcmpl-"));
    let prompt = rendered(None);
    assert_eq!(ids(&answer["prompt_token_ids"]), prompt);
    let choice = &answer["choices"][0];
    assert_eq!(choice["message"]["role"], "assistant");
    assert!(choice["message"]["content"].is_string());
    assert_eq!(choice["message"]["tool_calls"], json!([]));
    let content = choice["logprobs"]["content"].as_array().unwrap();
    let generated = ids(&choice["token_ids"]);
    assert_eq!(content.len(), generated.len());
    for entry in content {
        assert!(entry["token"].is_string());
        assert!(entry["logprob"].as_f64().unwrap() <= 0.0);
        let bytes = entry["bytes"].as_array().unwrap();
        assert_eq!(bytes.len(), entry["token"].as_str().unwrap().len());
        let top = entry["top_logprobs"].as_array().unwrap();
        assert_eq!(top.len(), 3);
        // Greedy: the token is the most likely one.
        assert_eq!(top[0]["token"], entry["token"]);
    }
    assert_eq!(answer["usage"]["prompt_tokens"], prompt.len());
    assert_eq!(answer["usage"]["completion_tokens"], generated.len());
    // The same prompt as a completion gives the same tokens.
    let completion = complete(
        &client,
        &prompt,
        json!({"max_tokens": 8, "return_token_ids": true}),
    );
    assert_eq!(ids(&completion["choices"][0]["token_ids"]), generated);
    server.stop();
}

#[test]
fn tools_reach_the_template() {
    // The Qwen tool preamble alone is ~500 tokens: a longer context than the fixture's 128.
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.model_dir = fixture_with_context(dir.path(), 1024);
    let (server, client) = start(config);
    let tools = json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}]);
    let answer = ok(
        &client,
        "/v1/chat/completions",
        json!({"messages": messages(), "max_tokens": 2, "tools": tools, "return_token_ids": true}),
    );
    let with_tools = ids(&answer["prompt_token_ids"]);
    assert_eq!(with_tools, rendered(Some(tools.clone())));
    assert_ne!(with_tools, rendered(None));
    // tool_choice "none" renders without them.
    let answer = ok(
        &client,
        "/v1/chat/completions",
        json!({"messages": messages(), "max_tokens": 2, "tools": tools, "tool_choice": "none",
               "return_token_ids": true}),
    );
    assert_eq!(ids(&answer["prompt_token_ids"]), rendered(None));
    // chat_template_kwargs reach the template as its variables (here the same tools); kwargs
    // that are not an object are a 400 naming the field.
    let answer = ok(
        &client,
        "/v1/chat/completions",
        json!({"messages": messages(), "max_tokens": 2, "chat_template_kwargs": {"tools": tools},
               "return_token_ids": true}),
    );
    assert_eq!(
        ids(&answer["prompt_token_ids"]),
        rendered(Some(tools.clone()))
    );
    let (status, error) = client
        .post(
            "/v1/chat/completions",
            &json!({"messages": messages(), "max_tokens": 2, "chat_template_kwargs": "tools"}),
        )
        .unwrap();
    assert_eq!(status, 400, "{error}");
    assert!(
        error["error"]["message"]
            .as_str()
            .unwrap()
            .contains("chat_template_kwargs"),
        "{error}"
    );
    // An earlier assistant tool call with JSON-string arguments renders as the template expects.
    let history = json!([
        {"role": "user", "content": "Weather in Paris?"},
        {"role": "assistant", "content": null, "tool_calls": [{"id": "c1", "type": "function",
            "function": {"name": "get_weather", "arguments": "{\"city\": \"Paris\"}"}}]},
        {"role": "tool", "tool_call_id": "c1", "content": "sunny"}
    ]);
    let answer = ok(
        &client,
        "/tokenize",
        json!({"messages": history.clone(), "add_generation_prompt": true}),
    );
    assert!(answer["count"].as_u64().unwrap() > 10);
    ok(
        &client,
        "/v1/chat/completions",
        json!({"messages": history, "max_tokens": 2, "tools": tools}),
    );
    server.stop();
}

#[test]
fn streamed_chat_sends_the_role_then_content_then_the_finish_reason() {
    let (server, client) = start_default();
    let body = json!({"messages": messages(), "max_tokens": 12, "temperature": 1.0, "seed": 4,
                      "n": 2, "ignore_eos": true});
    let whole = ok(&client, "/v1/chat/completions", body.clone());
    let mut streamed = body;
    streamed["stream"] = json!(true);
    streamed["stream_options"] = json!({"include_usage": true});
    let events = stream(&client, "/v1/chat/completions", streamed);
    assert_eq!(events[0]["object"], "chat.completion.chunk");
    for index in 0..2 {
        let deltas: Vec<&Value> = events
            .iter()
            .flat_map(|e| e["choices"].as_array().unwrap())
            .filter(|c| c["index"] == index)
            .collect();
        assert_eq!(deltas[0]["delta"]["role"], "assistant");
        let text: String = deltas
            .iter()
            .filter_map(|c| c["delta"]["content"].as_str())
            .collect();
        assert_eq!(
            text,
            whole["choices"][index]["message"]["content"]
                .as_str()
                .unwrap()
        );
        assert_eq!(deltas.last().unwrap()["finish_reason"], "length");
    }
    assert_eq!(events.last().unwrap()["usage"], whole["usage"]);
    server.stop();
}

#[test]
fn a_final_assistant_message_is_continued_when_asked() {
    let (server, client) = start_default();
    let mut conversation = messages();
    conversation
        .as_array_mut()
        .unwrap()
        .push(json!({"role": "assistant", "content": "The answer is"}));
    let answer = ok(
        &client,
        "/v1/chat/completions",
        json!({"model": "tiny", "messages": conversation, "max_tokens": 2, "temperature": 0,
               "continue_final_message": true, "add_generation_prompt": false,
               "return_token_ids": true}),
    );
    // transformers' rule: the rendering with the final message, cut right after its text.
    let tokenizer = Tokenizer::from_dir(&fixture_dir()).unwrap();
    let parsed: Vec<ChatMessage> = serde_json::from_value(conversation.clone()).unwrap();
    let full = tokenizer
        .apply_chat_template(&parsed, &ChatOptions::default())
        .unwrap()
        .text;
    let end = full.rfind("The answer is").unwrap() + "The answer is".len();
    let expected = tokenizer.encode(&full[..end], false).unwrap();
    assert_eq!(ids(&answer["prompt_token_ids"]), expected);
    assert!(
        !full[end..].is_empty(),
        "the template closes the turn after the text"
    );
    // Both flags, or no final assistant message: a 400 naming the field.
    for (body_messages, generation_prompt) in [(conversation.clone(), true), (messages(), false)] {
        let (status, body) = client
            .post(
                "/v1/chat/completions",
                &json!({"model": "tiny", "messages": body_messages, "max_tokens": 2,
                        "continue_final_message": true,
                        "add_generation_prompt": generation_prompt}),
            )
            .unwrap();
        assert_eq!(status, 400, "{body}");
        assert_eq!(body["error"]["param"], "continue_final_message", "{body}");
    }
    server.stop();
}
