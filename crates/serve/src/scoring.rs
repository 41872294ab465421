//! `stoke serve --task reward`: a sequence classifier (a reward model `stoke rm` trained, or any
//! Hugging Face `*ForSequenceClassification` folder) served over vLLM's scoring routes, so a
//! reward model can run on machines of its own, as reward servers do.
//!
//! Routes:
//! - `POST /classify` (also `/v1/classify`), vLLM's shape. The request carries `input` (a
//!   string, a list of strings, a list of token ids, or a list of such lists) or `messages` (one
//!   conversation, rendered by the model's chat template without a generation prompt, as vLLM's
//!   chat-style classify request). Each row is scored at transformers' token (the last one that
//!   is not `pad_token_id`). The answer is `{id, object: "list", created, model, data: [{index,
//!   label, probs, num_classes}], usage}`. `probs` are the logits through the activation vLLM
//!   applies by default (sigmoid for one label, softmax for several); `"use_activation": false`
//!   (or the older `"activation": false`) returns the raw logits, which is what a reward is.
//! - `POST /pooling` (also `/v1/pooling`): the same inputs; `data: [{index, object: "pooling",
//!   data: [raw logits]}]`.
//! - `GET /v1/models`, `/health`, `/version`. Anything else is a 404 that says what this server
//!   serves.
//!
//! Texts are encoded with special tokens (a folder without tokenizer files takes token ids only) unless `"add_special_tokens": false`. A row longer
//! than the model's context is refused (400 naming `input[i]`) unless the request sets
//! `truncate_prompt_tokens` (`k` keeps the last `k` ids, `-1` the last `max_model_len`, the
//! scored token being the last). Bad requests get a 400 naming the field; the server keeps
//! serving.
//!
//! What it is not: a generator (the generation routes are `server.rs`'s, over `App`), and not
//! batched across requests: one request's rows are scored in batches of [`BATCH`] rows, and
//! requests take turns (the CPU is the bottleneck; a queue would only add latency).

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, PoisonError};

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use candle_core::Device;
use serde::Deserialize;
use serde_json::{Value, json};
use stoke_model::Transformer;
use stoke_tokenizer::chat::ChatOptions;
use stoke_tokenizer::hf::Tokenizer;

use crate::app::{ServeConfig, default_served_model_name, unix_now};
use crate::error::{ApiError, method_not_allowed};
use crate::protocol::parse_body;

/// Rows per forward pass.
pub const BATCH: usize = 16;

/// A loaded reward model and what its routes share.
pub struct ScoreApp {
    pub name: String,
    pub model_dir: std::path::PathBuf,
    model: Transformer,
    /// `None` for a folder without tokenizer files: token-id inputs only.
    tokenizer: Option<Tokenizer>,
    labels: Vec<String>,
    pub max_model_len: usize,
    started: u64,
    /// One request's forward passes at a time.
    busy: Mutex<()>,
    /// Rows scored since start (for tests and logs).
    pub rows_scored: AtomicU64,
}

impl std::fmt::Debug for ScoreApp {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ScoreApp")
            .field("model", &self.name)
            .finish_non_exhaustive()
    }
}

impl ScoreApp {
    /// Loads `config.model_dir`, which must be a sequence classifier with tokenizer files.
    pub fn load(config: &ServeConfig) -> Result<ScoreApp, String> {
        let dir = &config.model_dir;
        if !dir.is_dir() {
            return Err(format!(
                "{} is not a folder (`--task reward` serves a *ForSequenceClassification folder)",
                dir.display()
            ));
        }
        let model =
            Transformer::load(dir, &Device::Cpu).map_err(|e| format!("{}: {e}", dir.display()))?;
        if model.is_token_classifier() {
            return Err(format!(
                "{} is a token classifier (a process reward model); `--task reward` serves \
                 sequence classifiers (reward models)",
                dir.display()
            ));
        }
        let Some(count) = model.config().score_labels else {
            return Err(format!(
                "{} is a causal LM, not a sequence classifier: `--task reward` serves reward \
                 models (`stoke rm` trains one); serve a generator with `--task generate`",
                dir.display()
            ));
        };
        let has_tokenizer = dir.join("tokenizer.json").exists();
        let tokenizer = has_tokenizer
            .then(|| Tokenizer::from_dir(dir).map_err(|e| format!("{}: {e}", dir.display())))
            .transpose()?;
        let labels = label_names(model.config().source_fields.get("id2label"), count);
        let context = model.config().max_position_embeddings;
        let max_model_len = config.max_model_len.unwrap_or(context).min(context);
        let name = config
            .served_model_name
            .clone()
            .unwrap_or_else(|| default_served_model_name(dir));
        Ok(ScoreApp {
            name,
            model_dir: dir.clone(),
            model: model.into_frozen(),
            tokenizer,
            labels,
            max_model_len,
            started: unix_now(),
            busy: Mutex::new(()),
            rows_scored: AtomicU64::new(0),
        })
    }

    /// Raw logits `[labels]` of each row.
    pub fn score_rows(&self, rows: &[Vec<u32>]) -> Result<Vec<Vec<f32>>, String> {
        let _turn = self.busy.lock().unwrap_or_else(PoisonError::into_inner);
        let mut out = Vec::with_capacity(rows.len());
        for chunk in rows.chunks(BATCH) {
            let refs: Vec<&[u32]> = chunk.iter().map(Vec::as_slice).collect();
            let scores: Vec<Vec<f32>> = self
                .model
                .score_sequences(&refs)
                .and_then(|t| Ok(t.to_vec2::<f32>()?))
                .map_err(|e| format!("scoring: {e}"))?;
            out.extend(scores);
        }
        self.rows_scored
            .fetch_add(rows.len() as u64, Ordering::Relaxed);
        Ok(out)
    }
}

/// `id2label`'s names in index order; `LABEL_i` where the config names none.
fn label_names(id2label: Option<&Value>, count: usize) -> Vec<String> {
    (0..count)
        .map(|i| {
            id2label
                .and_then(|m| m.get(i.to_string()))
                .and_then(Value::as_str)
                .map_or_else(|| format!("LABEL_{i}"), str::to_string)
        })
        .collect()
}

/// The router of a reward server.
pub fn router(app: Arc<ScoreApp>) -> Router {
    Router::new()
        .route("/classify", post(classify))
        .route("/v1/classify", post(classify))
        .route("/pooling", post(pooling))
        .route("/v1/pooling", post(pooling))
        .route("/v1/models", get(models))
        .route("/health", get(|| async { StatusCode::OK }))
        .route(
            "/version",
            get(|| async { axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})) }),
        )
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(|| async {
            ApiError::status(
                StatusCode::NOT_FOUND,
                "no such route: this server serves a reward model (`--task reward`); POST \
                 /classify or /pooling",
            )
            .into_response()
        })
        .layer(DefaultBodyLimit::max(64 << 20))
        .with_state(app)
}

async fn models(State(app): State<Arc<ScoreApp>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": app.name,
            "object": "model",
            "created": app.started,
            "owned_by": "stoke",
            "root": app.model_dir.display().to_string(),
            "parent": null,
            "max_model_len": app.max_model_len,
            "task": "reward",
            "num_labels": app.labels.len(),
            "permission": [],
        }],
    }))
    .into_response()
}

/// The fields `/classify` and `/pooling` share.
#[derive(Deserialize)]
struct ScoreRequest {
    model: Option<String>,
    input: Option<Value>,
    messages: Option<Vec<Value>>,
    use_activation: Option<bool>,
    activation: Option<bool>,
    add_special_tokens: Option<bool>,
    truncate_prompt_tokens: Option<i64>,
}

/// A parsed request: its rows of ids and whether to apply the activation.
struct Rows {
    ids: Vec<Vec<u32>>,
    activation: bool,
}

fn read_rows(app: &ScoreApp, body: &[u8]) -> Result<Rows, ApiError> {
    let request: ScoreRequest = parse_body(body)?;
    if let Some(name) = request.model.as_deref()
        && name != app.name
    {
        return Err(ApiError::invalid(
            "model",
            format!(
                "The model `{name}` does not exist; this server serves `{}`",
                app.name
            ),
        ));
    }
    let special = request.add_special_tokens.unwrap_or(true);
    let (field, mut ids) = match (&request.input, &request.messages) {
        (Some(input), None) => ("input", input_rows(app, input, special)?),
        (None, Some(messages)) => ("messages", vec![conversation_row(app, messages)?]),
        _ => {
            return Err(ApiError::invalid(
                "input",
                "give exactly one of `input` and `messages`",
            ));
        }
    };
    let keep = match request.truncate_prompt_tokens {
        None => None,
        Some(-1) => Some(app.max_model_len),
        Some(k) if k >= 1 => Some((k as usize).min(app.max_model_len)),
        Some(k) => {
            return Err(ApiError::invalid(
                "truncate_prompt_tokens",
                format!("must be -1 or at least 1, got {k}"),
            ));
        }
    };
    let vocab = app.model.config().vocab_size;
    for (i, row) in ids.iter_mut().enumerate() {
        if row.is_empty() {
            return Err(ApiError::invalid(
                format!("{field}[{i}]"),
                format!("{field}[{i}] encodes to no token"),
            ));
        }
        if let Some(&id) = row.iter().find(|&&id| id as usize >= vocab) {
            return Err(ApiError::invalid(
                format!("{field}[{i}]"),
                format!("{field}[{i}]: token id {id} is past the vocabulary of {vocab}"),
            ));
        }
        match keep {
            Some(k) if row.len() > k => {
                row.drain(..row.len() - k);
            }
            _ if row.len() > app.max_model_len => {
                return Err(ApiError::invalid(
                    format!("{field}[{i}]"),
                    format!(
                        "{field}[{i}] is {} tokens, past the model's {} (set \
                         truncate_prompt_tokens to keep the last ones)",
                        row.len(),
                        app.max_model_len
                    ),
                ));
            }
            _ => {}
        }
    }
    Ok(Rows {
        ids,
        activation: request
            .use_activation
            .or(request.activation)
            .unwrap_or(true),
    })
}

/// `input`: a string, a list of strings, a list of ids, or a list of lists of ids.
fn input_rows(app: &ScoreApp, input: &Value, special: bool) -> Result<Vec<Vec<u32>>, ApiError> {
    let encode = |text: &str, at: String| -> Result<Vec<u32>, ApiError> {
        if text.is_empty() {
            return Err(ApiError::invalid(at.clone(), format!("{at} is empty")));
        }
        tokenizer(app, &at)?
            .encode(text, special)
            .map_err(|e| ApiError::invalid(at.clone(), format!("{at}: {e}")))
    };
    let id_list = |items: &[Value], at: String| -> Result<Vec<u32>, ApiError> {
        items
            .iter()
            .enumerate()
            .map(|(j, v)| {
                v.as_u64()
                    .and_then(|id| u32::try_from(id).ok())
                    .ok_or_else(|| {
                        ApiError::invalid(at.clone(), format!("{at}[{j}] is not a token id: {v}"))
                    })
            })
            .collect()
    };
    match input {
        Value::String(text) => Ok(vec![encode(text, "input".into())?]),
        Value::Array(items) if items.first().is_some_and(Value::is_number) => {
            Ok(vec![id_list(items, "input".into())?])
        }
        Value::Array(items) => items
            .iter()
            .enumerate()
            .map(|(i, item)| match item {
                Value::String(text) => encode(text, format!("input[{i}]")),
                Value::Array(ids) => id_list(ids, format!("input[{i}]")),
                other => Err(ApiError::invalid(
                    format!("input[{i}]"),
                    format!("input[{i}] is neither a string nor a list of token ids: {other}"),
                )),
            })
            .collect(),
        other => Err(ApiError::invalid(
            "input",
            format!("`input` must be a string or a list, got {other}"),
        )),
    }
}

/// One conversation through the chat template, with no generation prompt after it.
fn conversation_row(app: &ScoreApp, messages: &[Value]) -> Result<Vec<u32>, ApiError> {
    let messages = messages
        .iter()
        .enumerate()
        .map(|(i, m)| {
            serde_json::from_value(m.clone()).map_err(|e| {
                ApiError::invalid(format!("messages[{i}]"), format!("messages[{i}]: {e}"))
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tokenizer = tokenizer(app, "messages")?;
    if tokenizer.chat_template().is_none() {
        return Err(ApiError::invalid(
            "messages",
            "the model has no chat template; send `input` instead",
        ));
    }
    let options = ChatOptions {
        add_generation_prompt: false,
        variables: Default::default(),
    };
    tokenizer
        .apply_chat_template(&messages, &options)
        .map(|encoding| encoding.ids)
        .map_err(|e| ApiError::invalid("messages", e.to_string()))
}

/// The tokenizer texts need; a 400 naming `field` when the folder has none.
fn tokenizer<'a>(app: &'a ScoreApp, field: &str) -> Result<&'a Tokenizer, ApiError> {
    app.tokenizer.as_ref().ok_or_else(|| {
        ApiError::invalid(
            field,
            format!(
                "{field}: {} has no tokenizer files; send token ids",
                app.model_dir.display()
            ),
        )
    })
}

/// Scores `rows` off the async threads.
async fn score(app: &Arc<ScoreApp>, rows: Vec<Vec<u32>>) -> Result<Vec<Vec<f32>>, ApiError> {
    let app = Arc::clone(app);
    tokio::task::spawn_blocking(move || app.score_rows(&rows))
        .await
        .map_err(|e| ApiError::internal(format!("scoring: {e}")))?
        .map_err(ApiError::internal)
}

/// vLLM's default activation: sigmoid for one label, softmax for several.
fn activate(logits: &[f32]) -> Vec<f32> {
    if logits.len() == 1 {
        return vec![1.0 / (1.0 + (-logits[0]).exp())];
    }
    let max = logits.iter().copied().fold(f32::NEG_INFINITY, f32::max);
    let exps: Vec<f32> = logits.iter().map(|v| (v - max).exp()).collect();
    let sum: f32 = exps.iter().sum();
    exps.iter().map(|e| e / sum).collect()
}

fn usage(rows: &[Vec<u32>]) -> Value {
    let tokens: usize = rows.iter().map(Vec::len).sum();
    json!({
        "prompt_tokens": tokens,
        "total_tokens": tokens,
        "completion_tokens": 0,
        "prompt_tokens_details": null,
    })
}

fn request_id(prefix: &str) -> String {
    format!("{prefix}-{:032x}", rand::random::<u128>())
}

async fn classify(State(app): State<Arc<ScoreApp>>, body: Bytes) -> Response {
    let result = async {
        let rows = read_rows(&app, &body)?;
        let usage = usage(&rows.ids);
        let logits = score(&app, rows.ids).await?;
        let data: Vec<Value> = logits
            .iter()
            .enumerate()
            .map(|(index, logits)| {
                let best = logits
                    .iter()
                    .enumerate()
                    .max_by(|a, b| a.1.total_cmp(b.1))
                    .map_or(0, |(i, _)| i);
                let probs = if rows.activation {
                    activate(logits)
                } else {
                    logits.clone()
                };
                json!({
                    "index": index,
                    "label": app.labels.get(best),
                    "probs": probs,
                    "num_classes": logits.len(),
                })
            })
            .collect();
        Ok::<Value, ApiError>(json!({
            "id": request_id("classify"),
            "object": "list",
            "created": unix_now(),
            "model": app.name,
            "data": data,
            "usage": usage,
        }))
    }
    .await;
    respond(result)
}

async fn pooling(State(app): State<Arc<ScoreApp>>, body: Bytes) -> Response {
    let result = async {
        let rows = read_rows(&app, &body)?;
        let usage = usage(&rows.ids);
        let logits = score(&app, rows.ids).await?;
        let data: Vec<Value> = logits
            .into_iter()
            .enumerate()
            .map(|(index, logits)| json!({"index": index, "object": "pooling", "data": logits}))
            .collect();
        Ok::<Value, ApiError>(json!({
            "id": request_id("pool"),
            "object": "list",
            "created": unix_now(),
            "model": app.name,
            "data": data,
            "usage": usage,
        }))
    }
    .await;
    respond(result)
}

fn respond(result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(value) => axum::Json(value).into_response(),
        Err(error) => error.into_response(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn labels_and_activations_follow_vllm() {
        let names = label_names(Some(&json!({"0": "bad", "1": "good"})), 2);
        assert_eq!(names, vec!["bad", "good"]);
        assert_eq!(label_names(None, 1), vec!["LABEL_0"]);
        let one = activate(&[0.0]);
        assert!((one[0] - 0.5).abs() < 1e-7);
        let two = activate(&[0.0, 2.0f32.ln()]);
        assert!((two[0] - 1.0 / 3.0).abs() < 1e-6 && (two[1] - 2.0 / 3.0).abs() < 1e-6);
    }
}
