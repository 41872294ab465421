//! Shared helpers of the server tests: a server on a loopback port over a fixture model (stopped
//! when the test ends), and a blocking client.

#![allow(dead_code)]

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde_json::{Value, json};
use stoke_model::Transformer;
use stoke_serve::{Client, RunningServer, ServeConfig};

/// The tiny Qwen2 fixture: random weights, a Qwen chat template with tools, 128 positions.
pub fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

pub fn load_fixture() -> Transformer {
    Transformer::load(&fixture_dir(), &Device::Cpu).expect("fixture loads")
}

pub fn config() -> ServeConfig {
    let mut config = ServeConfig::new(fixture_dir());
    config.port = 0;
    config.served_model_name = Some("tiny".into());
    config.kv_cache_bytes = 256 << 20;
    config
}

pub fn start(config: ServeConfig) -> (RunningServer, Client) {
    let server = RunningServer::start(config).expect("server starts");
    let client = Client::new(&server.url());
    (server, client)
}

pub fn start_default() -> (RunningServer, Client) {
    start(config())
}

/// POST that must answer 200.
pub fn ok(client: &Client, path: &str, body: Value) -> Value {
    let (status, answer) = client.post(path, &body).expect("the server answers");
    assert_eq!(status, 200, "{path} {body}: {answer}");
    answer
}

/// A completion of token ids (greedy unless said otherwise).
pub fn complete(client: &Client, prompt: &[u32], extra: Value) -> Value {
    let mut body = json!({"model": "tiny", "prompt": prompt, "max_tokens": 12, "temperature": 0});
    merge(&mut body, extra);
    ok(client, "/v1/completions", body)
}

pub fn merge(body: &mut Value, extra: Value) {
    if let (Some(body), Value::Object(extra)) = (body.as_object_mut(), extra) {
        for (key, value) in extra {
            body.insert(key, value);
        }
    }
}

/// A streamed request's events (up to `[DONE]`).
pub fn stream(client: &Client, path: &str, body: Value) -> Vec<Value> {
    let mut events = Vec::new();
    let status = client
        .post_stream(path, &body, |event| {
            events.push(event);
            true
        })
        .expect("the stream answers");
    assert_eq!(status, 200, "{events:?}");
    events
}

/// A copy of the fixture with every weight scaled, in `dir` (tokenizer files copied).
pub fn scaled_copy(dir: &Path, factor: f64) -> Transformer {
    let model = load_fixture();
    let copy = model.snapshot().unwrap();
    for (_, var) in copy.parameters() {
        let scaled = (var.as_tensor() * factor).unwrap();
        var.set(&scaled).unwrap();
    }
    copy.save_with_tokenizer(dir, Some(&fixture_dir()))
        .expect("the copy saves");
    Transformer::load(dir, &Device::Cpu).unwrap()
}

/// A copy of the fixture whose context is `positions` long (RoPE needs no change), in `dir`.
pub fn fixture_with_context(dir: &Path, positions: usize) -> PathBuf {
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["max_position_embeddings"] = json!(positions);
    std::fs::write(&path, config.to_string()).unwrap();
    dir.to_path_buf()
}

/// A randomly initialized model with the fixture's tokenizer, large enough (8 layers, hidden
/// 256, 8192 positions) that a long generation is still running when a test looks.
pub fn slow_model(dir: &Path) -> PathBuf {
    let text = std::fs::read_to_string(fixture_dir().join("config.json")).unwrap();
    let mut config: Value = serde_json::from_str(&text).unwrap();
    for (key, value) in [
        ("hidden_size", 256),
        ("intermediate_size", 512),
        ("num_hidden_layers", 8),
        ("num_attention_heads", 4),
        ("num_key_value_heads", 2),
        ("max_position_embeddings", 8192),
    ] {
        config[key] = json!(value);
    }
    config["layer_types"] = json!(vec!["full_attention"; 8]);
    let config =
        stoke_model::ModelConfig::from_json_str(&config.to_string(), &dir.join("config.json"))
            .unwrap();
    let model = Transformer::init(config, &Device::Cpu, 7).unwrap();
    model
        .save_with_tokenizer(dir, Some(&fixture_dir()))
        .unwrap();
    dir.to_path_buf()
}

/// A metric's value in the /metrics text.
pub fn metric(client: &Client, name: &str) -> f64 {
    let (status, text) = client.get_text("/metrics").unwrap();
    assert_eq!(status, 200);
    text.lines()
        .find_map(|line| {
            let rest = line.strip_prefix(name)?;
            let value = rest.strip_prefix(' ')?;
            value.trim().parse().ok()
        })
        .unwrap_or_else(|| panic!("metric {name} not in {text}"))
}

/// Waits (up to 60 s: CI machines run several test binaries at once) until `check` holds.
pub fn eventually(mut check: impl FnMut() -> bool, what: &str) {
    let start = std::time::Instant::now();
    while start.elapsed() < std::time::Duration::from_secs(60) {
        if check() {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(20));
    }
    panic!("timed out waiting for {what}");
}

/// A copy of the fixture in `dir` whose chat template is `template`.
pub fn fixture_with_template(dir: &Path, template: &str) -> PathBuf {
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let path = dir.join("tokenizer_config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    config["chat_template"] = json!(template);
    std::fs::write(&path, config.to_string()).unwrap();
    dir.to_path_buf()
}
