//! `POST /v1/chat/completions`: OpenAI messages rendered with the model's chat template (tools
//! passed to it), continued `n` times, answered as vLLM answers: `choices[].message {role,
//! content, tool_calls, reasoning_content}`, `logprobs.content[{token, logprob, bytes,
//! top_logprobs}]`, `finish_reason` (`tool_calls` when calls were parsed), `stop_reason`,
//! `token_ids`, and at the response level `prompt_logprobs` and `prompt_token_ids`; plus
//! `weight_versions` per choice.
//!
//! Tool calls are parsed when the request has `tools` (and `tool_choice` is not `"none"`) and the
//! server has a tool-call parser, named or detected from the template (`tools.rs`); `tools` the
//! template cannot render add a top-level `warnings` array. Streaming sends the role first
//! (with the warnings), content deltas (held back from where a call may start), then the tool
//! calls and the finish reason. The Mistral parser's `[TOOL_CALLS]` is a special token, so with
//! it special tokens are kept in the text unless the request sets `skip_special_tokens` (as vLLM
//! does).

use std::sync::Arc;

use axum::body::Bytes;
use axum::extract::State;
use axum::extract::rejection::BytesRejection;
use axum::http::HeaderMap;
use axum::response::{IntoResponse, Response};
use serde_json::{Value, json};
use stoke_rollout::TokenLogprob;
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::tool_calls::ToolCallParser;

use crate::app::{App, unix_now};
use crate::completions::prompt_logprobs_json;
use crate::error::ApiError;
use crate::generation::{Generation, Update, token_string};
use crate::protocol::{ChatRequest, check_content_type, parse_request};
use crate::stream::{EventStream, Phase, request_id};
use crate::tools;

pub async fn chat_completions(
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
    let request: ChatRequest = parse_request(&body)?;
    let passes_tools = request.wants_tool_calls();
    let tool_parser = app.tools.parser.filter(|_| passes_tools);
    let keep_special_tokens = tool_parser == Some(ToolCallParser::Mistral)
        && request.common.skip_special_tokens.is_none();
    let mut spec = request.into_spec(&app.tokenizer, &app.info)?;
    if keep_special_tokens {
        spec.skip_special_tokens = false;
    }
    let warnings = app.tools.warnings(passes_tools);
    let generation = Generation::start(Arc::clone(&app), spec, tool_parser).await?;
    let id = request_id("chatcmpl");
    let created = unix_now();
    if generation.spec.stream {
        return Ok(stream(generation, id, created, warnings));
    }
    let mut generation = generation;
    generation.finish().await?;
    let mut choices = Vec::with_capacity(generation.choices.len());
    for index in 0..generation.choices.len() {
        let value = choice(&generation, index, &id)?;
        app.metrics
            .count_request("chat", value["finish_reason"].as_str().unwrap_or("stop"));
        choices.push(value);
    }
    let spec = &generation.spec;
    let tokenizer = &app.tokenizer;
    let mut answer = json!({
        "id": id,
        "object": "chat.completion",
        "created": created,
        "model": app.info.name,
        "choices": choices,
        "usage": generation.usage(),
        "prompt_logprobs": match (spec.report_prompt_logprobs, &generation.prompt_logprobs[0]) {
            (Some(_), Some(scores)) => prompt_logprobs_json(tokenizer, scores, spec.tokens_as_ids),
            _ => Value::Null,
        },
        "prompt_token_ids": spec.return_token_ids.then(|| spec.prompts[0].ids.clone()),
        "system_fingerprint": null,
    });
    if !warnings.is_empty() {
        answer["warnings"] = json!(warnings);
    }
    Ok(axum::Json(answer).into_response())
}

/// One `logprobs.content` entry.
fn content_entry(tokenizer: &Tokenizer, token: &TokenLogprob, as_ids: bool) -> Value {
    let entry = |id: u32, logprob: f32| {
        let text = token_string(tokenizer, id, as_ids);
        let bytes: Vec<u8> = text.as_bytes().to_vec();
        json!({"token": text, "logprob": logprob, "bytes": bytes})
    };
    let mut value = entry(token.id, token.logprob);
    value["top_logprobs"] = Value::Array(
        token
            .top
            .iter()
            .map(|&(id, logprob)| entry(id, logprob))
            .collect(),
    );
    value
}

/// The message and finish reason of a finished choice: tool calls parsed when asked.
fn message(
    generation: &Generation,
    index: usize,
    id: &str,
) -> Result<(Value, &'static str), ApiError> {
    let text = generation.final_text(index)?;
    let (finish_reason, _) = generation.finish_fields(index);
    let (message, has_calls) =
        tools::assistant_message(generation.tool_parser, &text, &format!("{id}-tool-{index}"));
    Ok((
        message,
        if has_calls {
            "tool_calls"
        } else {
            finish_reason
        },
    ))
}

fn choice(generation: &Generation, index: usize, id: &str) -> Result<Value, ApiError> {
    let spec = &generation.spec;
    let choice = &generation.choices[index];
    let tokenizer = &generation.app().tokenizer;
    let (message, finish_reason) = message(generation, index, id)?;
    let (_, stop_reason) = generation.finish_fields(index);
    let logprobs = if spec.report_logprobs {
        json!({"content": choice
            .logprobs
            .iter()
            .map(|t| content_entry(tokenizer, t, spec.tokens_as_ids))
            .collect::<Vec<_>>()})
    } else {
        Value::Null
    };
    Ok(json!({
        "index": index,
        "message": message,
        "logprobs": logprobs,
        "finish_reason": finish_reason,
        "stop_reason": stop_reason,
        "token_ids": spec.return_token_ids.then(|| choice.token_ids.clone()),
        "weight_versions": choice.versions,
    }))
}

fn stream(generation: Generation, id: String, created: u64, warnings: Vec<String>) -> Response {
    let model = generation.app().info.name.clone();
    EventStream::spawn(generation, move |generation, phase, out| {
        let chunk = |choices: Vec<Value>| {
            json!({
                "id": id,
                "object": "chat.completion.chunk",
                "created": created,
                "model": model,
                "choices": choices,
            })
        };
        let spec_as_ids = generation.spec.tokens_as_ids;
        match phase {
            Phase::Start => {
                let choices = (0..generation.choices.len())
                    .map(|index| {
                        json!({
                            "index": index,
                            "delta": {"role": "assistant", "content": ""},
                            "logprobs": null,
                            "finish_reason": null,
                        })
                    })
                    .collect();
                let mut first = chunk(choices);
                if generation.spec.return_token_ids {
                    first["prompt_token_ids"] = json!(generation.spec.prompts[0].ids);
                }
                if !warnings.is_empty() {
                    first["warnings"] = json!(warnings);
                }
                out.push(first);
            }
            Phase::End => {
                if generation.spec.include_usage {
                    let mut usage = chunk(Vec::new());
                    usage["usage"] = generation.usage();
                    out.push(usage);
                }
            }
            Phase::Update(Update::Prefilled { .. }) => {}
            Phase::Update(Update::Token {
                choice,
                token,
                text,
                finished,
            }) => {
                if finished {
                    let mut delta = json!({});
                    if !text.is_empty() {
                        delta["content"] = json!(text);
                    }
                    let (_, finish_reason) = message(generation, choice, &id)?;
                    let (_, stop_reason) = generation.finish_fields(choice);
                    if finish_reason == "tool_calls" {
                        let (message, _) = message(generation, choice, &id)?;
                        let calls: Vec<Value> = message["tool_calls"]
                            .as_array()
                            .cloned()
                            .unwrap_or_default()
                            .into_iter()
                            .enumerate()
                            .map(|(i, mut call)| {
                                call["index"] = json!(i);
                                call
                            })
                            .collect();
                        delta["tool_calls"] = Value::Array(calls);
                    }
                    generation
                        .app()
                        .metrics
                        .count_request("chat", finish_reason);
                    let all = &generation.choices[choice].versions;
                    let mut body = json!({
                        "index": choice,
                        "delta": delta,
                        "logprobs": null,
                        "finish_reason": finish_reason,
                        "stop_reason": stop_reason,
                    });
                    let versions = out.versions(choice, all, all.len());
                    if !versions.is_empty() {
                        body["weight_versions"] = json!(versions);
                    }
                    out.push(chunk(vec![body]));
                    return Ok(());
                }
                let spec = &generation.spec;
                if text.is_empty() && !spec.report_logprobs && !spec.return_token_ids {
                    return Ok(());
                }
                let entry = &generation.choices[choice];
                let tokenizer = &generation.app().tokenizer;
                let logprobs = if spec.report_logprobs {
                    json!({"content": [content_entry(tokenizer, &entry.logprobs[token], spec_as_ids)]})
                } else {
                    Value::Null
                };
                let mut body = json!({
                    "index": choice,
                    "delta": {"content": text},
                    "logprobs": logprobs,
                    "finish_reason": null,
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
