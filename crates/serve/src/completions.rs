//! `POST /v1/completions`: text or token-id prompts continued, answered field for field as vLLM
//! answers (`choices[].text`, `logprobs {tokens, token_logprobs, top_logprobs, text_offset}`,
//! `finish_reason`, `stop_reason`, `prompt_logprobs`, `prompt_token_ids`, `token_ids`, `usage`),
//! plus `weight_versions`: the weight version of every generated token.
//!
//! Echo: the prompt's text comes first, and with `logprobs` the prompt's tokens lead the
//! log-probs (the first with `null`): what lm-eval's `local-completions` reads for
//! log-likelihoods. `max_tokens: 0` with `echo` scores the prompt and generates nothing.
//! Streaming (`stream: true`) sends one SSE chunk per token (text deltas, log-probs), the finish
//! reason with the last, a usage chunk when `stream_options.include_usage`, then `[DONE]`.

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Map, Value, json};
use stoke_rollout::TokenLogprob;
use stoke_tokenizer::hf::Tokenizer;

use crate::app::{App, unix_now};
use crate::error::ApiError;
use crate::generation::{Generation, Update, token_string};
use crate::protocol::{CompletionRequest, check_content_type, parse_request};
use crate::stream::{EventStream, Phase, request_id};

/// The handler.
pub async fn completions(
    State(app): State<Arc<App>>,
    headers: HeaderMap,
    body: Result<Bytes, BytesRejection>,
) -> Response {
    let body = match check_content_type(&headers).and_then(|()| Ok(body?)) {
        Ok(body) => body,
        Err(error) => return error.into_response(),
    };
    match run(app, body).await {
        Ok(response) => response,
        Err(error) => error.into_response(),
    }
}

async fn run(app: Arc<App>, body: Bytes) -> Result<Response, ApiError> {
    let request: CompletionRequest = parse_request(&body)?;
    let spec = request.into_spec(&app.tokenizer, &app.info)?;
    let generation = Generation::start(Arc::clone(&app), spec, None).await?;
    let id = request_id("cmpl");
    let created = unix_now();
    if generation.spec.stream {
        return Ok(stream(generation, id, created));
    }
    let mut generation = generation;
    generation.finish().await?;
    let choices = (0..generation.choices.len())
        .map(|index| choice(&generation, index))
        .collect::<Result<Vec<_>, _>>()?;
    for index in 0..generation.choices.len() {
        let (reason, _) = generation.finish_fields(index);
        app.metrics.count_request("completions", reason);
    }
    Ok(axum::Json(json!({
        "id": id,
        "object": "text_completion",
        "created": created,
        "model": app.info.name,
        "choices": choices,
        "usage": generation.usage(),
        "system_fingerprint": null,
    }))
    .into_response())
}

/// The prompt's text: as given, or its tokens decoded (special tokens kept).
fn prompt_text(generation: &Generation, prompt: usize) -> String {
    let spec = &generation.spec.prompts[prompt];
    spec.text.clone().unwrap_or_else(|| {
        generation
            .app()
            .tokenizer
            .decode(&spec.ids, false)
            .unwrap_or_default()
    })
}

/// `{token: logprob}` of a token's alternatives, the token itself included.
pub fn top_map(tokenizer: &Tokenizer, token: &TokenLogprob, as_ids: bool) -> Value {
    let mut map = Map::new();
    for &(id, logprob) in &token.top {
        map.insert(token_string(tokenizer, id, as_ids), json!(logprob));
    }
    map.insert(
        token_string(tokenizer, token.id, as_ids),
        json!(token.logprob),
    );
    Value::Object(map)
}

/// vLLM's `prompt_logprobs`: `null`, then per prompt token `{"<id>": {logprob, rank,
/// decoded_token}}` for the token and its alternatives.
pub fn prompt_logprobs_json(
    tokenizer: &Tokenizer,
    scores: &[Option<TokenLogprob>],
    as_ids: bool,
) -> Value {
    Value::Array(
        scores
            .iter()
            .map(|entry| match entry {
                None => Value::Null,
                Some(token) => {
                    let mut map = Map::new();
                    for (rank, &(id, logprob)) in token.top.iter().enumerate() {
                        map.insert(
                            id.to_string(),
                            json!({
                                "logprob": logprob,
                                "rank": rank + 1,
                                "decoded_token": token_string(tokenizer, id, as_ids),
                            }),
                        );
                    }
                    map.insert(
                        token.id.to_string(),
                        json!({
                            "logprob": token.logprob,
                            "rank": token.rank,
                            "decoded_token": token_string(tokenizer, token.id, as_ids),
                        }),
                    );
                    Value::Object(map)
                }
            })
            .collect(),
    )
}

/// Accumulates the `logprobs` object of one choice (or one chunk of it).
struct LogprobsBuilder {
    tokens: Vec<Value>,
    token_logprobs: Vec<Value>,
    top_logprobs: Vec<Value>,
    text_offset: Vec<usize>,
}

impl LogprobsBuilder {
    fn new() -> Self {
        LogprobsBuilder {
            tokens: Vec::new(),
            token_logprobs: Vec::new(),
            top_logprobs: Vec::new(),
            text_offset: Vec::new(),
        }
    }

    /// Adds a token whose string starts at char `offset`; returns the offset after it.
    fn push(&mut self, text: String, logprob: Value, top: Value, offset: usize) -> usize {
        let next = offset + text.chars().count();
        self.tokens.push(json!(text));
        self.token_logprobs.push(logprob);
        self.top_logprobs.push(top);
        self.text_offset.push(offset);
        next
    }

    /// The prompt's tokens (the first without a score).
    fn push_prompt(&mut self, generation: &Generation, prompt: usize, mut offset: usize) -> usize {
        let tokenizer = &generation.app().tokenizer;
        let as_ids = generation.spec.tokens_as_ids;
        let ids = &generation.spec.prompts[prompt].ids;
        let scores = generation.prompt_logprobs[prompt].as_deref().unwrap_or(&[]);
        for (position, &id) in ids.iter().enumerate() {
            let text = token_string(tokenizer, id, as_ids);
            let (logprob, top) = match scores.get(position).and_then(Option::as_ref) {
                Some(score) => {
                    // Alternatives as many as `logprobs` asks (the prompt may carry more).
                    let mut trimmed = score.clone();
                    trimmed.top.truncate(generation.spec.logprobs.top);
                    (json!(score.logprob), top_map(tokenizer, &trimmed, as_ids))
                }
                None => (Value::Null, Value::Null),
            };
            offset = self.push(text, logprob, top, offset);
        }
        offset
    }

    fn push_generated(
        &mut self,
        generation: &Generation,
        token: &TokenLogprob,
        offset: usize,
    ) -> usize {
        let tokenizer = &generation.app().tokenizer;
        let as_ids = generation.spec.tokens_as_ids;
        self.push(
            token_string(tokenizer, token.id, as_ids),
            json!(token.logprob),
            top_map(tokenizer, token, as_ids),
            offset,
        )
    }

    fn build(self) -> Value {
        json!({
            "text_offset": self.text_offset,
            "token_logprobs": self.token_logprobs,
            "tokens": self.tokens,
            "top_logprobs": self.top_logprobs,
        })
    }
}

/// One finished choice of a non-streaming answer.
fn choice(generation: &Generation, index: usize) -> Result<Value, ApiError> {
    let spec = &generation.spec;
    let choice = &generation.choices[index];
    let prompt = choice.prompt;
    let mut text = if spec.echo {
        prompt_text(generation, prompt)
    } else {
        String::new()
    };
    text.push_str(&generation.final_text(index)?);
    let generated = generation.reported_tokens(index);
    let logprobs = if spec.report_logprobs {
        let mut builder = LogprobsBuilder::new();
        let mut offset = 0;
        if spec.echo {
            offset = builder.push_prompt(generation, prompt, offset);
        }
        for token in &choice.logprobs[..generated] {
            offset = builder.push_generated(generation, token, offset);
        }
        builder.build()
    } else {
        Value::Null
    };
    let (finish_reason, stop_reason) = generation.finish_fields(index);
    let tokenizer = &generation.app().tokenizer;
    Ok(json!({
        "index": index,
        "text": text,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "prompt_logprobs": match (spec.report_prompt_logprobs, &generation.prompt_logprobs[prompt]) {
            (Some(_), Some(scores)) => prompt_logprobs_json(tokenizer, scores, spec.tokens_as_ids),
            _ => Value::Null,
        },
        "prompt_token_ids": spec.return_token_ids.then(|| spec.prompts[prompt].ids.clone()),
        "token_ids": spec.return_token_ids.then(|| choice.token_ids[..generated].to_vec()),
        "weight_versions": &choice.versions[..generated],
    }))
}

/// The SSE answer.
fn stream(generation: Generation, id: String, created: u64) -> Response {
    let model = generation.app().info.name.clone();
    EventStream::spawn(generation, move |generation, phase, out| {
        let chunk = |choices: Vec<Value>| {
            json!({
                "id": id,
                "object": "text_completion",
                "created": created,
                "model": model,
                "choices": choices,
            })
        };
        match phase {
            Phase::Start => {}
            Phase::End => {
                // The end: usage when asked.
                if generation.spec.include_usage {
                    let mut usage = chunk(Vec::new());
                    usage["usage"] = generation.usage();
                    out.push(usage);
                }
            }
            Phase::Update(Update::Prefilled { prompt }) => {
                if !generation.spec.echo {
                    return Ok(());
                }
                let n = generation.spec.params.n;
                let mut choices = Vec::new();
                for index in prompt * n..(prompt + 1) * n {
                    let logprobs = if generation.spec.report_logprobs {
                        let mut builder = LogprobsBuilder::new();
                        let end = builder.push_prompt(generation, prompt, 0);
                        out.set_offset(index, end);
                        builder.build()
                    } else {
                        Value::Null
                    };
                    choices.push(json!({
                        "index": index,
                        "text": prompt_text(generation, prompt),
                        "logprobs": logprobs,
                        "finish_reason": null,
                        "stop_reason": null,
                    }));
                }
                out.push(chunk(choices));
            }
            Phase::Update(Update::Token {
                choice,
                token,
                text,
                finished,
            }) => {
                let spec = &generation.spec;
                if finished {
                    let (finish_reason, stop_reason) = generation.finish_fields(choice);
                    generation
                        .app()
                        .metrics
                        .count_request("completions", finish_reason);
                    let all = &generation.choices[choice].versions;
                    let reported = generation.reported_tokens(choice);
                    let mut body = json!({
                        "index": choice,
                        "text": text,
                        "logprobs": null,
                        "finish_reason": finish_reason,
                        "stop_reason": stop_reason,
                    });
                    let versions = out.versions(choice, all, reported);
                    if !versions.is_empty() {
                        body["weight_versions"] = json!(versions);
                    }
                    out.push(chunk(vec![body]));
                    return Ok(());
                }
                if spec.generate_nothing {
                    return Ok(());
                }
                let entry = &generation.choices[choice];
                let logprobs = if spec.report_logprobs {
                    let mut builder = LogprobsBuilder::new();
                    let offset = out.offset(choice);
                    let next = builder.push_generated(generation, &entry.logprobs[token], offset);
                    out.set_offset(choice, next);
                    builder.build()
                } else {
                    Value::Null
                };
                if text.is_empty() && !spec.report_logprobs && !spec.return_token_ids {
                    return Ok(());
                }
                let mut body = json!({
                    "index": choice,
                    "text": text,
                    "logprobs": logprobs,
                    "finish_reason": null,
                    "stop_reason": null,
                    "weight_versions": out.versions(choice, &entry.versions, token + 1),
                });
                if spec.return_token_ids {
                    body["token_ids"] = json!([entry.token_ids[token]]);
                }
                out.push(chunk(vec![body]));
            }
        }
        Ok(())
    })
}
