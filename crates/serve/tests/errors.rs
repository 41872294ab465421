//! Every 4xx class of the server, each answered with an OpenAI-style error object that names the
//! field at fault, and the server still serving afterwards: malformed JSON, fields of the wrong
//! type, values out of range, an unknown model, `max_tokens` past the context, token ids outside
//! the vocabulary, unsupported options, unknown routes and methods, and a full queue (429 with
//! Retry-After).

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
fn unknown_routes_are_404_and_wrong_methods_405() {
    let (server, client) = start_default();
    let (status, text) = client.get_text("/v1/nothing").unwrap();
    assert_eq!(status, 404, "{text}");
    let answer: Value = serde_json::from_str(&text).unwrap();
    assert_eq!(answer["error"]["code"], 404);
    let (status, _) = client.get_text("/v1/completions").unwrap();
    assert_eq!(status, 405);
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
