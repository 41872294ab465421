//! Every 4xx class of the server, each answered with an OpenAI-style error object that names the
//! field at fault, and the server still serving afterwards: malformed JSON, fields of the wrong
//! type, values out of range, an unknown model, `max_tokens` past the context, token ids outside
//! the vocabulary, unsupported options and unknown fields (refused, never ignored; their neutral
//! values accepted), bodies not sent as JSON (415), unknown routes (404) and methods (405), and a
//! full queue (429 with Retry-After).

mod common;

use std::io::{Read, Write};

use common::*;
use serde_json::{Value, json};

fn expect_error(
    client: &stoke_serve::Client,
    path: &str,
    body: &str,
    status: u16,
    param: Option<&str>,
) -> Value {
    let (got, text) = client.post_raw(path, body).unwrap();
    let answer: Value = serde_json::from_str(&text).unwrap_or(Value::Null);
    assert_eq!(got, status, "{path} {body}: {text}");
    assert!(answer["error"]["message"].is_string(), "{text}");
    assert_eq!(answer["error"]["code"], status);
    if let Some(param) = param {
        assert_eq!(answer["error"]["param"], param, "{text}");
    }
    answer
}

#[test]
fn bad_requests_get_400_naming_the_field_and_the_server_keeps_serving() {
    let (server, client) = start_default();
    let cases: Vec<(&str, String, Option<&str>)> = vec![
        ("/v1/completions", "{not json".into(), None),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": "many"}).to_string(),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "temperature": -1}).to_string(),
            Some("temperature"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "top_p": 0}).to_string(),
            Some("top_p"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "n": 0}).to_string(),
            Some("n"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "model": "gpt-9"}).to_string(),
            Some("model"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "max_tokens": 500}).to_string(),
            Some("max_tokens"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, 2, 999]}).to_string(),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": [1, -2]}).to_string(),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": []}).to_string(),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": {"a": 1}}).to_string(),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": vec![1; 128]}).to_string(),
            Some("prompt"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs": 50}).to_string(),
            Some("logprobs"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop": [""]}).to_string(),
            Some("stop"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "stop_token_ids": [4000]}).to_string(),
            Some("stop_token_ids"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "presence_penalty": 0.5}).to_string(),
            Some("presence_penalty"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logit_bias": {"5": 10}}).to_string(),
            Some("logit_bias"),
        ),
        (
            "/v1/completions",
            json!({"prompt": "x", "logprobs_mode": "odd"}).to_string(),
            Some("logprobs_mode"),
        ),
        (
            "/v1/completions",
            json!({"max_tokens": 3}).to_string(),
            None,
        ),
        (
            "/v1/chat/completions",
            json!({"messages": []}).to_string(),
            Some("messages"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "wizard", "content": "x"}]}).to_string(),
            Some("messages[0]"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "max_completion_tokens": 0})
                .to_string(),
            Some("max_completion_tokens"),
        ),
        (
            "/v1/chat/completions",
            json!({"messages": [{"role": "user", "content": "x"}], "top_logprobs": 2}).to_string(),
            Some("top_logprobs"),
        ),
        (
            "/tokenize",
            json!({"prompt": "x", "messages": []}).to_string(),
            Some("prompt"),
        ),
        (
            "/detokenize",
            json!({"tokens": [99999]}).to_string(),
            Some("tokens"),
        ),
        (
            "/update_weights",
            json!({"path": "/nonexistent/model"}).to_string(),
            Some("path"),
        ),
        ("/update_weights", json!({}).to_string(), Some("path")),
    ];
    for (path, body, param) in &cases {
        expect_error(&client, path, body, 400, *param);
    }
    // Still serving.
    complete(&client, &[1, 2, 3], json!({"max_tokens": 2}));
    server.stop();
}

#[test]
fn unknown_routes_are_404_and_wrong_methods_405_with_error_objects() {
    let (server, client) = start_default();
    let (status, text) = client.get_text("/v1/nothing").unwrap();
    assert_eq!(status, 404, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["error"]["code"], 404);
    assert_eq!(answer["error"]["type"], "NotFoundError");
    let (status, _, body) = raw(
        &server,
        "POST",
        "/v1/nothing",
        Some("application/json"),
        "{}",
    );
    assert_eq!(status, 404, "{body}");
    assert_eq!(error_of(&body)["code"], 404, "{body}");
    // Every route answers a wrong method with a 405 error object, and `Allow` names the right one.
    for (method, path, allowed) in [
        ("GET", "/v1/completions", "POST"),
        ("GET", "/v1/chat/completions", "POST"),
        ("PUT", "/v1/chat/completions", "POST"),
        ("DELETE", "/v1/completions", "POST"),
        ("POST", "/v1/models", "GET"),
        ("POST", "/health", "GET"),
        ("POST", "/metrics", "GET"),
        ("GET", "/tokenize", "POST"),
        ("GET", "/update_weights", "POST"),
    ] {
        let (status, head, body) = raw(&server, method, path, None, "");
        assert_eq!(status, 405, "{method} {path}: {head}{body}");
        let error = error_of(&body);
        assert_eq!(error["code"], 405, "{method} {path}: {body}");
        assert_eq!(error["type"], "MethodNotAllowedError", "{body}");
        let message = error["message"].as_str().unwrap();
        assert!(
            message.contains(method) && message.contains(path),
            "{message}"
        );
        let allow = format!("allow: {}", allowed.to_ascii_lowercase());
        assert!(head.contains(&allow), "{method} {path}: {head}");
    }
    complete(&client, &[1, 2, 3], json!({"max_tokens": 2}));
    server.stop();
}

/// A raw HTTP/1.1 request with the given Content-Type (or none): (status, lowercased head, body).
fn raw(
    server: &stoke_serve::RunningServer,
    method: &str,
    path: &str,
    content_type: Option<&str>,
    body: &str,
) -> (u16, String, String) {
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    let content_type = content_type
        .map(|t| format!("Content-Type: {t}\r\n"))
        .unwrap_or_default();
    write!(
        stream,
        "{method} {path} HTTP/1.1\r\nHost: x\r\n{content_type}Content-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let (head, body) = answer.split_once("\r\n\r\n").unwrap_or((&answer, ""));
    let status = head
        .split_whitespace()
        .nth(1)
        .and_then(|s| s.parse().ok())
        .unwrap_or(0);
    (status, head.to_ascii_lowercase(), body.to_string())
}

/// The `error` object of an answer's body.
fn error_of(body: &str) -> Value {
    let answer: Value = serde_json::from_str(body).unwrap_or(Value::Null);
    assert!(
        answer["error"]["message"].is_string(),
        "not an error object: {body:?}"
    );
    answer["error"].clone()
}

fn chat_body(extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "max_tokens": 3, "temperature": 0, "seed": 1,
        "messages": [{"role": "user", "content": "What is 2 + 2?"}]});
    merge(&mut body, extra);
    body
}

fn completion_body(extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "prompt": [1, 2, 3], "max_tokens": 3,
        "temperature": 0, "seed": 1});
    merge(&mut body, extra);
    body
}

fn weather_tools() -> Value {
    json!([{"type": "function", "function": {
        "name": "get_weather", "description": "Weather of a city",
        "parameters": {"type": "object", "properties": {"city": {"type": "string"}}}}}])
}

#[test]
fn every_field_the_server_does_not_honour_is_refused_naming_it() {
    let (server, client) = start_default();
    let chat = "/v1/chat/completions";
    let completions = "/v1/completions";
    let named = json!({"type": "function", "function": {"name": "get_weather"}});
    // (route, extra fields, the param named, words the message must hold)
    let cases: Vec<(&str, Value, &str, &str)> = vec![
        (
            chat,
            json!({"response_format": {"type": "bogus"}}),
            "response_format",
            "bogus",
        ),
        (
            chat,
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
            "structured output is not implemented yet",
        ),
        (
            chat,
            json!({"response_format": {"type": "json_schema", "json_schema": {"name": "x", "schema": {}}}}),
            "response_format",
            "structured output is not implemented yet",
        ),
        (
            chat,
            json!({"response_format": "json"}),
            "response_format",
            "type",
        ),
        (
            chat,
            json!({"tools": weather_tools(), "tool_choice": "required"}),
            "tool_choice",
            "required",
        ),
        (
            chat,
            json!({"tools": weather_tools(), "tool_choice": named}),
            "tool_choice",
            "named function",
        ),
        (
            chat,
            json!({"tools": weather_tools(), "tool_choice": "sometimes"}),
            "tool_choice",
            "sometimes",
        ),
        (
            chat,
            json!({"tools": weather_tools(), "parallel_tool_calls": false}),
            "parallel_tool_calls",
            "parallel_tool_calls",
        ),
        (
            chat,
            json!({"guided_json": {"type": "object"}}),
            "guided_json",
            "structured output",
        ),
        (
            chat,
            json!({"guided_choice": ["a", "b"]}),
            "guided_choice",
            "structured output",
        ),
        (
            chat,
            json!({"structured_outputs": {"regex": "a+"}}),
            "structured_outputs",
            "structured output",
        ),
        (
            chat,
            json!({"frobnicate": true}),
            "frobnicate",
            "frobnicate",
        ),
        (chat, json!({"prompt": "x"}), "prompt", "/v1/completions"),
        (chat, json!({"best_of": 1}), "best_of", "/v1/completions"),
        (chat, json!({"store": true}), "store", "store"),
        (
            chat,
            json!({"metadata": {"run": "a"}}),
            "metadata",
            "metadata",
        ),
        (
            chat,
            json!({"service_tier": "flex"}),
            "service_tier",
            "flex",
        ),
        (
            chat,
            json!({"modalities": ["text", "audio"]}),
            "modalities",
            "text",
        ),
        (
            chat,
            json!({"audio": {"voice": "alloy", "format": "wav"}}),
            "audio",
            "audio",
        ),
        (
            chat,
            json!({"prediction": {"type": "content", "content": "4"}}),
            "prediction",
            "prediction",
        ),
        (
            chat,
            json!({"reasoning_effort": "low"}),
            "reasoning_effort",
            "chat_template_kwargs",
        ),
        (
            chat,
            json!({"web_search_options": {}}),
            "web_search_options",
            "web search",
        ),
        (
            chat,
            json!({"functions": [{"name": "f", "parameters": {}}]}),
            "functions",
            "tools",
        ),
        (
            chat,
            json!({"function_call": {"name": "f"}}),
            "function_call",
            "function_call",
        ),
        (
            chat,
            json!({"logit_bias": {"5": 10}}),
            "logit_bias",
            "logit_bias",
        ),
        (
            chat,
            json!({"presence_penalty": 0.5}),
            "presence_penalty",
            "presence_penalty",
        ),
        (
            chat,
            json!({"frequency_penalty": 1.0}),
            "frequency_penalty",
            "frequency_penalty",
        ),
        (chat, json!({"echo": true}), "echo", "echo"),
        (
            chat,
            json!({"stream": true, "stream_options": {"include_usage": true, "continuous_usage_stats": true}}),
            "stream_options.continuous_usage_stats",
            "continuous_usage_stats",
        ),
        (chat, json!({"verbosity": "low"}), "verbosity", "verbosity"),
        (
            completions,
            json!({"response_format": {"type": "json_object"}}),
            "response_format",
            "structured output is not implemented yet",
        ),
        (
            completions,
            json!({"guided_regex": "[0-9]+"}),
            "guided_regex",
            "structured output",
        ),
        (completions, json!({"suffix": "end"}), "suffix", "suffix"),
        (completions, json!({"best_of": 3}), "best_of", "best_of"),
        (
            completions,
            json!({"messages": []}),
            "messages",
            "/v1/chat/completions",
        ),
        (
            completions,
            json!({"max_completion_tokens": 3}),
            "max_completion_tokens",
            "/v1/chat/completions",
        ),
        (
            completions,
            json!({"tools": weather_tools()}),
            "tools",
            "/v1/chat/completions",
        ),
        (
            completions,
            json!({"frobnicate": 1}),
            "frobnicate",
            "frobnicate",
        ),
        (
            completions,
            json!({"presence_penalty": 0.5}),
            "presence_penalty",
            "presence_penalty",
        ),
    ];
    for (path, extra, param, words) in cases {
        let body = if path == chat {
            chat_body(extra)
        } else {
            completion_body(extra)
        };
        let answer = expect_error(&client, path, &body.to_string(), 400, Some(param));
        let message = answer["error"]["message"].as_str().unwrap();
        assert!(message.contains(words), "{path} {body}: {message}");
        assert_eq!(answer["error"]["type"], "BadRequestError");
        // Streaming requests are refused the same way, before any event.
        let mut streamed = body.clone();
        streamed["stream"] = json!(true);
        expect_error(&client, path, &streamed.to_string(), 400, Some(param));
    }
    // Still serving.
    ok(&client, chat, chat_body(json!({})));
    complete(&client, &[1, 2, 3], json!({"max_tokens": 2}));
    server.stop();
}

#[test]
fn honoured_fields_and_neutral_values_of_refused_ones_are_accepted_and_change_nothing() {
    let (server, client) = start_default();
    let chat = "/v1/chat/completions";
    let plain = ok(&client, chat, chat_body(json!({})));
    let neutral = json!({
        "user": "user-1234", "safety_identifier": "hash", "n": 1, "logprobs": false,
        "stream": false, "store": false, "metadata": {}, "service_tier": "auto",
        "modalities": ["text"], "parallel_tool_calls": true, "response_format": {"type": "text"},
        "presence_penalty": 0, "frequency_penalty": 0.0, "logit_bias": {}, "functions": [],
        "function_call": "none", "audio": null, "prediction": null, "reasoning_effort": null,
        "web_search_options": null, "echo": false, "top_logprobs": 0, "stop": [],
        "max_completion_tokens": 3, "tool_choice": "none", "top_k": -1, "ignore_eos": false,
    });
    let answer = ok(&client, chat, chat_body(neutral));
    assert_eq!(
        answer["choices"][0]["message"]["content"], plain["choices"][0]["message"]["content"],
        "{answer}"
    );
    // tool_choice "auto" is accepted (with tools it renders them: `chat.rs`, `tools.rs`; the
    // fixture's 128 positions leave no room for them here).
    ok(&client, chat, chat_body(json!({"tool_choice": "auto"})));
    // An honoured field still does what it says: logprobs with top_logprobs.
    let answer = ok(
        &client,
        chat,
        chat_body(json!({"logprobs": true, "top_logprobs": 2, "user": "u"})),
    );
    assert_eq!(
        answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
            .as_array()
            .unwrap()
            .len(),
        2,
        "{answer}"
    );
    // Completions: the same for its fields.
    let plain = complete(&client, &[1, 2, 3], json!({"max_tokens": 3, "seed": 1}));
    let answer = complete(
        &client,
        &[1, 2, 3],
        json!({"max_tokens": 3, "seed": 1, "user": "u", "response_format": {"type": "text"},
               "echo": false, "best_of": 1, "n": 1, "suffix": "", "presence_penalty": 0,
               "frequency_penalty": 0, "logit_bias": {}, "stream": false,
               "stream_options": {"include_usage": false}}),
    );
    assert_eq!(answer["choices"][0]["text"], plain["choices"][0]["text"]);
    // What stoke's own clients send (remote rollout, remote reference, eval, judge, RLAIF,
    // `stoke chat`) is all honoured.
    complete(
        &client,
        &[1, 2, 3],
        json!({"n": 2, "top_p": 1.0, "top_k": 5, "stop_token_ids": [2], "logprobs": 0,
               "return_token_ids": true, "logprobs_mode": "processed_logprobs",
               "prompt_number": 3, "first_sample": 0, "turn": 0, "stop": ["x"]}),
    );
    complete(
        &client,
        &[1, 2, 3],
        json!({"prompt_logprobs": 0, "temperature": 1.0, "echo": true, "max_tokens": 0}),
    );
    ok(
        &client,
        chat,
        chat_body(json!({"messages": [{"role": "user", "content": "Hi"},
                                      {"role": "assistant", "content": "Score:"}],
                         "logprobs": true, "top_logprobs": 5, "continue_final_message": true,
                         "add_generation_prompt": false, "max_tokens": 2})),
    );
    stream(&client, chat, chat_body(json!({"stream": true})));
    server.stop();
}

#[test]
fn generation_bodies_must_be_sent_as_json() {
    let (server, client) = start_default();
    let body = completion_body(json!({})).to_string();
    let chat = chat_body(json!({})).to_string();
    for (path, body) in [("/v1/completions", &body), ("/v1/chat/completions", &chat)] {
        for content_type in [
            None,
            Some("text/plain"),
            Some("text/plain; charset=utf-8"),
            Some("application/x-www-form-urlencoded"),
            Some("application/json; charset=latin-1"),
            Some("application/jsonl"),
        ] {
            let (status, _, answer) = raw(&server, "POST", path, content_type, body);
            assert_eq!(status, 415, "{path} {content_type:?}: {answer}");
            let error = error_of(&answer);
            assert_eq!(error["code"], 415);
            assert!(
                error["message"]
                    .as_str()
                    .unwrap()
                    .contains("application/json"),
                "{answer}"
            );
        }
        for content_type in [
            "application/json",
            "application/json; charset=utf-8",
            "Application/JSON;charset=\"UTF-8\"",
        ] {
            let (status, _, answer) = raw(&server, "POST", path, Some(content_type), body);
            assert_eq!(status, 200, "{path} {content_type}: {answer}");
        }
    }
    // Still serving.
    complete(&client, &[1, 2, 3], json!({"max_tokens": 2}));
    server.stop();
}

#[test]
fn a_full_queue_answers_429_with_retry_after() {
    let mut config = config();
    config.max_queue = 2;
    let (server, client) = start(config);
    ok(&client, "/pause", json!({}));
    // Two requests wait (paused); the third finds the queue full.
    let url = server.url();
    let waiting: Vec<_> = (0..2)
        .map(|i| {
            let url = url.clone();
            std::thread::spawn(move || {
                let client = stoke_serve::Client::new(&url);
                client
                    .post(
                        "/v1/completions",
                        &json!({"prompt": [1, 2, i + 3], "max_tokens": 2}),
                    )
                    .unwrap()
                    .0
            })
        })
        .collect();
    eventually(
        || metric(&client, "stoke:num_requests_waiting") >= 2.0,
        "two waiting requests",
    );
    // Raw HTTP, to see the headers.
    let body = json!({"prompt": [1, 2], "max_tokens": 2}).to_string();
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    let mut answer = String::new();
    stream.read_to_string(&mut answer).unwrap();
    let head = answer
        .split("\r\n\r\n")
        .next()
        .unwrap()
        .to_ascii_lowercase();
    assert!(head.starts_with("http/1.1 429"), "{answer}");
    assert!(head.contains("retry-after: 1"), "{answer}");
    assert!(answer.contains("RateLimitError"), "{answer}");
    ok(&client, "/resume", json!({}));
    for handle in waiting {
        assert_eq!(handle.join().unwrap(), 200);
    }
    // Room again.
    complete(&client, &[1, 2, 3], json!({"max_tokens": 2}));
    server.stop();
}
