//! What happens around requests: a seeded request's tokens alone and among 32 concurrent ones
//! are the same; a client that disconnects cancels its sequences and frees their cache;
//! `/pause` holds decoding and `/resume` continues it; `/update_weights` swaps weights between
//! decode steps (log-probs then equal the new checkpoint's, a request running across the swap
//! finishes and reports both versions, the checksum route follows); the small routes answer.

mod common;

use std::io::{BufRead, BufReader, Write};

use candle_core::Device;
use common::*;
use serde_json::{Value, json};
use stoke_rollout::score::next_token_logprobs;
use stoke_serve::weights_checksum;

fn token_ids(answer: &Value, choice: usize) -> Vec<u64> {
    answer["choices"][choice]["token_ids"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect()
}

#[test]
fn a_seeded_request_is_the_same_alone_and_among_32_concurrent_requests() {
    let (server, client) = start_default();
    let probe = json!({"prompt": [5, 6, 7, 8], "max_tokens": 30, "temperature": 1.0, "top_p": 0.9,
                       "seed": 2024, "n": 2, "ignore_eos": true, "return_token_ids": true,
                       "logprobs": 1});
    let alone = ok(&client, "/v1/completions", probe.clone());
    let url = server.url();
    let handles: Vec<_> = (0..32u64)
        .map(|i| {
            let url = url.clone();
            let body = if i == 17 {
                probe.clone()
            } else {
                json!({"prompt": (0..(2 + i * 3 % 40)).map(|t| (t * 13 + i) % 290).collect::<Vec<_>>(),
                       "max_tokens": 5 + (i * 11) % 60, "temperature": 0.8, "seed": i,
                       "n": 1 + i % 3, "ignore_eos": true})
            };
            std::thread::spawn(move || {
                std::thread::sleep(std::time::Duration::from_millis(i * 3));
                let client = stoke_serve::Client::new(&url);
                client.post("/v1/completions", &body).unwrap()
            })
        })
        .collect();
    let answers: Vec<(u16, Value)> = handles.into_iter().map(|h| h.join().unwrap()).collect();
    for (status, answer) in &answers {
        assert_eq!(*status, 200, "{answer}");
    }
    let among = &answers[17].1;
    for choice in 0..2 {
        assert_eq!(token_ids(among, choice), token_ids(&alone, choice));
        assert_eq!(
            among["choices"][choice]["logprobs"]["token_logprobs"],
            alone["choices"][choice]["logprobs"]["token_logprobs"]
        );
    }
    // The batch really ran together.
    let (_, text) = client.get_text("/metrics").unwrap();
    assert!(text.contains("stoke:batch_size_bucket"), "{text}");
    server.stop();
}

/// Sends a raw HTTP request and returns the connection.
fn raw_post(server: &stoke_serve::RunningServer, body: &Value) -> std::net::TcpStream {
    let body = body.to_string();
    let mut stream = std::net::TcpStream::connect(server.addr).unwrap();
    write!(
        stream,
        "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {}\r\n\r\n{body}",
        body.len()
    )
    .unwrap();
    stream
}

#[test]
fn a_client_that_disconnects_frees_its_sequences() {
    // A slower model and a long generation, so the request still runs when the test looks.
    let dir = tempfile::tempdir().unwrap();
    let mut config = config();
    config.model_dir = slow_model(dir.path());
    let (server, client) = start(config);
    let stream = raw_post(
        &server,
        &json!({"prompt": [1, 2, 3], "max_tokens": 8000, "n": 2, "temperature": 1.0,
                "ignore_eos": true, "stream": true}),
    );
    let mut reader = BufReader::new(stream.try_clone().unwrap());
    // Read until the first token arrives, hold decoding, then hang up.
    let mut line = String::new();
    loop {
        line.clear();
        reader.read_line(&mut line).unwrap();
        if line.starts_with("data:") {
            break;
        }
    }
    ok(&client, "/pause", json!({}));
    // The worker publishes its load after the step it is in.
    eventually(
        || {
            metric(&client, "stoke:num_requests_running") == 2.0
                && metric(&client, "stoke:kv_cache_usage_perc") > 0.0
        },
        "both samples in the decode batch",
    );
    drop(reader);
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(stream);
    eventually(
        || {
            metric(&client, "stoke:num_requests_running") == 0.0
                && metric(&client, "stoke:kv_cache_usage_perc") == 0.0
        },
        "the streaming request's sequences to leave the batch",
    );
    // A non-streaming client that gives up is cancelled too (here while decoding runs).
    ok(&client, "/resume", json!({}));
    let stream = raw_post(
        &server,
        &json!({"prompt": [1, 2, 3], "max_tokens": 8000, "ignore_eos": true}),
    );
    eventually(
        || metric(&client, "stoke:num_requests_running") == 1.0,
        "the request to run",
    );
    stream.shutdown(std::net::Shutdown::Both).unwrap();
    drop(stream);
    eventually(
        || {
            metric(&client, "stoke:num_requests_running") == 0.0
                && metric(&client, "stoke:kv_cache_usage_perc") == 0.0
        },
        "the abandoned request to be reaped",
    );
    complete(&client, &[1, 2, 3], json!({"max_tokens": 3}));
    server.stop();
}

#[test]
fn pause_holds_decoding_and_resume_continues_it() {
    let (server, client) = start_default();
    ok(&client, "/pause", json!({}));
    let (_, paused) = client.get("/is_paused").unwrap();
    assert_eq!(paused["is_paused"], true);
    let url = server.url();
    let waiting = std::thread::spawn(move || {
        stoke_serve::Client::new(&url)
            .post(
                "/v1/completions",
                &json!({"prompt": [4, 5], "max_tokens": 5}),
            )
            .unwrap()
    });
    std::thread::sleep(std::time::Duration::from_millis(300));
    assert!(!waiting.is_finished(), "a paused server answered");
    ok(&client, "/resume", json!({}));
    let (status, answer) = waiting.join().unwrap();
    assert_eq!(status, 200, "{answer}");
    let (_, paused) = client.get("/is_paused").unwrap();
    assert_eq!(paused["is_paused"], false);
    server.stop();
}

/// Tokens of the request that runs across a weight swap.
const LONG: usize = 1500;

#[test]
fn update_weights_swaps_between_steps_and_reports_versions() {
    // The fixture with a 2,048-token context, so the long request below generates 1,500 tokens:
    // long enough to be seen running and still running at the swap on a loaded machine (100
    // tokens of this tiny model could finish between two polls).
    let context = tempfile::tempdir().unwrap();
    let mut served = config();
    served.model_dir = fixture_with_context(context.path(), 2048);
    let (server, client) = start(served);
    let dir = tempfile::tempdir().unwrap();
    let new_model = scaled_copy(dir.path(), 0.7);
    // The same architecture as the served copy (update_weights refuses another config).
    std::fs::copy(
        context.path().join("config.json"),
        dir.path().join("config.json"),
    )
    .unwrap();
    let (_, before) = client.get("/weights/checksum").unwrap();
    assert_eq!(before["version"], 0);
    assert_eq!(
        before["checksum"],
        weights_checksum(&load_fixture()).unwrap()
    );

    // A long request that runs across the swap.
    let url = server.url();
    let running = std::thread::spawn(move || {
        let client = stoke_serve::Client::new(&url);
        let mut versions = Vec::new();
        let mut finished = false;
        client
            .post_stream(
                "/v1/completions",
                // No token ids asked: chunks of tokens without text are skipped, and their
                // versions come with the next chunk, so all 1,500 still arrive.
                &json!({"prompt": [9, 8, 7], "max_tokens": LONG, "ignore_eos": true, "stream": true}),
                |event| {
                    for choice in event["choices"].as_array().unwrap() {
                        if let Some(v) = choice["weight_versions"].as_array() {
                            versions.extend(v.iter().map(|x| x.as_u64().unwrap()));
                        }
                        finished |= !choice["finish_reason"].is_null();
                    }
                    true
                },
            )
            .unwrap();
        (versions, finished)
    });
    eventually(
        || metric(&client, "stoke:num_requests_running") >= 1.0,
        "the long request to start",
    );
    let answer = ok(
        &client,
        "/update_weights",
        json!({"path": dir.path().display().to_string(), "version": 5}),
    );
    assert_eq!(answer["version"], 5);
    let (versions, finished) = running.join().unwrap();
    assert!(finished);
    assert_eq!(versions.len(), LONG);
    assert!(versions.windows(2).all(|w| w[0] <= w[1]), "{versions:?}");
    assert_eq!(versions[0], 0);
    assert_eq!(*versions.last().unwrap(), 5, "{versions:?}");

    // Log-probs now equal the new checkpoint's.
    let prompt = [3u32, 14, 15, 92, 65];
    let answer = complete(
        &client,
        &prompt,
        json!({"max_tokens": 1, "echo": true, "logprobs": 0}),
    );
    let want = next_token_logprobs(&new_model, &prompt, &Device::Cpu).unwrap();
    let got = answer["choices"][0]["logprobs"]["token_logprobs"]
        .as_array()
        .unwrap();
    for (i, want) in want.iter().enumerate() {
        let got = got[i + 1].as_f64().unwrap() as f32;
        assert!(
            (got - want).abs() <= 1e-5,
            "token {}: {got} vs {want}",
            i + 1
        );
    }
    assert_eq!(answer["choices"][0]["weight_versions"], json!([5]));
    let (_, after) = client.get("/weights/checksum").unwrap();
    assert_eq!(after["version"], 5);
    assert_eq!(after["checksum"], weights_checksum(&new_model).unwrap());
    assert_ne!(after["checksum"], before["checksum"]);
    // An older version is refused.
    let (status, _) = client
        .post(
            "/update_weights",
            &json!({"path": dir.path().display().to_string(), "version": 2}),
        )
        .unwrap();
    assert_eq!(status, 400);
    server.stop();
}

#[test]
fn the_small_routes_answer() {
    let (server, client) = start_default();
    let (status, text) = client.get_text("/health").unwrap();
    assert_eq!((status, text.as_str()), (200, ""));
    let (_, models) = client.get("/v1/models").unwrap();
    assert_eq!(models["object"], "list");
    assert_eq!(models["data"][0]["id"], "tiny");
    assert_eq!(models["data"][0]["max_model_len"], 128);
    let (status, version) = client.get("/version").unwrap();
    assert_eq!(status, 200);
    assert_eq!(version["version"], env!("CARGO_PKG_VERSION"));
    let tokens = ok(&client, "/tokenize", json!({"prompt": "Hello world"}));
    let ids = tokens["tokens"].clone();
    assert_eq!(tokens["count"], ids.as_array().unwrap().len());
    let text = ok(&client, "/detokenize", json!({"tokens": ids}));
    assert_eq!(text["prompt"], "Hello world");
    complete(
        &client,
        &[1, 2, 3],
        json!({"max_tokens": 3, "ignore_eos": true}),
    );
    let (status, metrics) = client.get_text("/metrics").unwrap();
    assert_eq!(status, 200);
    for name in [
        "stoke:request_success_total",
        "stoke:prompt_tokens_total",
        "stoke:generation_tokens_total",
        "stoke:num_requests_running",
        "stoke:num_requests_waiting",
        "stoke:time_to_first_token_seconds_bucket",
        "stoke:inter_token_latency_seconds_bucket",
        "stoke:e2e_request_latency_seconds_bucket",
        "stoke:batch_size_bucket",
    ] {
        assert!(metrics.contains(name), "{name} missing from {metrics}");
    }
    assert_eq!(metric(&client, "stoke:generation_tokens_total"), 3.0);
    server.stop();
}
