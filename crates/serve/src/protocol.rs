//! The requests of the OpenAI-compatible API, as vLLM accepts them, and their checked form.
//!
//! What it is: serde types for `/v1/completions` and `/v1/chat/completions` bodies (OpenAI's
//! fields plus vLLM's extras: `top_k`, `stop_token_ids`, `ignore_eos`, `prompt_logprobs`,
//! `return_token_ids`, `return_tokens_as_token_ids`, `skip_special_tokens`,
//! `add_generation_prompt`, `continue_final_message`, `chat_template_kwargs`; and stoke's `prompt_number`, the random
//! stream number of the first prompt, which remote rollout uses, with `first_sample` and `turn`
//! for a turn of a multi-turn episode), and [`GenerationSpec`], the validated
//! request the routes hand to the batcher: prompts as token ids, sampling parameters, what to
//! report. What it is not: response shapes (`response.rs`) or HTTP.
//!
//! Validation: a field of the wrong type is a 400 naming its path (`serde_path_to_error`); a
//! value out of range, an unknown model, a prompt past the context or a token id outside the
//! vocabulary is a 400 naming the field.
//!
//! Strictness: every field a request carries is either honoured or refused with a 400 naming it,
//! never silently dropped (as OpenAI does, and unlike vLLM, which ignores unknown fields):
//! - a top-level field that is not a field of these types is refused (`check_known_fields`; the
//!   types' own field lists, read from their `Deserialize` impls, are the allow-list, so the
//!   list cannot drift from what is parsed);
//! - a field stoke knows and does not implement is refused unless it holds its neutral value
//!   (penalties 0, `logit_bias` empty, `best_of == n`, `suffix` empty, `store: false`,
//!   `parallel_tool_calls: true`, `modalities: ["text"]`, `response_format: {"type": "text"}`,
//!   `tool_choice` `"auto"` or `"none"`, ...): `CommonFields::refuse_unimplemented` and
//!   `ChatRequest::refuse_unimplemented`;
//! - `user` and `safety_identifier`, opaque end-user ids, are accepted and change nothing.
//!
//! The table of every field and what the server does with it is in `docs/src/guide/serve.md`.
//!
//! Differences from vLLM, on purpose: an unknown `model` is a 400 (vLLM answers 404); unknown
//! fields are a 400 (vLLM ignores them); the
//! reported log-probs default to the distribution actually sampled from (`logprobs_mode`:
//! `processed_logprobs`; vLLM's default is `raw_logprobs`), which is what RL importance ratios
//! need; `raw_logprobs` is one field away.

use std::collections::BTreeMap;

use axum::http::{HeaderMap, StatusCode, header};
use serde::Deserialize;
use serde_json::Value;
use stoke_rollout::{LogprobMode, LogprobRequest, SamplingParams};
use stoke_tokenizer::chat::{ChatEncoding, ChatMessage, ChatOptions, Role, TemplateValue};
use stoke_tokenizer::error::TokenizerError;
use stoke_tokenizer::hf::Tokenizer;

use crate::error::ApiError;

/// What the routes know of the served model when they check a request.
#[derive(Debug)]
pub struct ModelInfo {
    /// The name clients use in `model` (`--served-model-name`, default the directory name).
    pub name: String,
    pub vocab_size: usize,
    /// Longest prompt + completion.
    pub max_model_len: usize,
    /// Token ids that end a sample unless `ignore_eos` (the model's and tokenizer's eos ids).
    pub eos_token_ids: Vec<u32>,
    /// Largest `logprobs` / `top_logprobs` / `prompt_logprobs` accepted.
    pub max_logprobs: usize,
    /// The log-prob mode of requests that do not choose one.
    pub default_logprobs_mode: LogprobMode,
}

/// A `stop` field: one string or several.
#[derive(Debug, Clone, Deserialize)]
#[serde(untagged)]
pub enum StopField {
    One(String),
    Many(Vec<String>),
}

impl StopField {
    fn into_vec(self) -> Vec<String> {
        match self {
            StopField::One(stop) => vec![stop],
            StopField::Many(stops) => stops,
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StreamOptions {
    #[serde(default)]
    pub include_usage: bool,
    #[serde(default)]
    pub continuous_usage_stats: bool,
}

/// Fields both endpoints share.
#[derive(Debug, Clone, Default, Deserialize)]
pub struct CommonFields {
    pub model: Option<String>,
    pub max_tokens: Option<i64>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<i64>,
    pub n: Option<i64>,
    pub seed: Option<i64>,
    pub stop: Option<StopField>,
    pub stop_token_ids: Option<Vec<u32>>,
    #[serde(default)]
    pub ignore_eos: bool,
    #[serde(default)]
    pub stream: bool,
    pub stream_options: Option<StreamOptions>,
    pub prompt_logprobs: Option<i64>,
    #[serde(default)]
    pub return_token_ids: bool,
    #[serde(default)]
    pub return_tokens_as_token_ids: bool,
    pub skip_special_tokens: Option<bool>,
    /// `processed_logprobs` (default) or `raw_logprobs` (also `processed` / `raw`).
    pub logprobs_mode: Option<String>,
    /// stoke's extension: the number of the first prompt in the random streams (prompt i of the
    /// request samples from stream (seed, prompt_number + i, j)), so a remote rollout that sends
    /// its group id draws the very samples the in-process engine would. Default 0.
    pub prompt_number: Option<u64>,
    /// stoke's extension for multi-turn rollout: sample j draws from stream (seed, prompt_number,
    /// first_sample + j, turn), the in-process engine's stream of turn `turn` of episode
    /// `first_sample + j` of group `prompt_number`. Default 0 (the single-turn streams).
    pub first_sample: Option<u64>,
    pub turn: Option<u64>,
    /// An opaque end-user id (OpenAI's abuse monitoring): accepted, changes nothing.
    pub user: Option<String>,
    /// `{"type": "text"}` (the default); `json_object` and `json_schema` are refused until
    /// structured output is implemented.
    pub response_format: Option<Value>,
    // Known and not implemented: refused when set to anything but their neutral value.
    pub logit_bias: Option<Value>,
    pub presence_penalty: Option<f64>,
    pub frequency_penalty: Option<f64>,
    pub repetition_penalty: Option<f64>,
    pub min_tokens: Option<i64>,
    pub min_p: Option<f64>,
}

/// A `/v1/completions` body (`common` is read from the same object: `parse_request`).
#[derive(Debug, Clone, Deserialize)]
pub struct CompletionRequest {
    pub prompt: Value,
    #[serde(skip)]
    pub common: CommonFields,
    /// Top-N log-probs per token (the sampled token is always included).
    pub logprobs: Option<i64>,
    #[serde(default)]
    pub echo: bool,
    pub suffix: Option<String>,
    pub best_of: Option<i64>,
}

/// A `/v1/chat/completions` body (`common` is read from the same object: `parse_request`).
#[derive(Debug, Clone, Deserialize)]
pub struct ChatRequest {
    pub messages: Vec<Value>,
    #[serde(skip)]
    pub common: CommonFields,
    pub max_completion_tokens: Option<i64>,
    #[serde(default)]
    pub logprobs: bool,
    pub top_logprobs: Option<i64>,
    pub tools: Option<Vec<Value>>,
    pub tool_choice: Option<Value>,
    pub add_generation_prompt: Option<bool>,
    #[serde(default)]
    pub continue_final_message: bool,
    pub chat_template_kwargs: Option<serde_json::Map<String, Value>>,
    #[serde(default)]
    pub echo: bool,
    /// OpenAI's successor of `user`, an opaque end-user id: accepted, changes nothing.
    pub safety_identifier: Option<String>,
    // OpenAI's fields stoke does not implement: refused unless neutral or absent
    // (`ChatRequest::refuse_unimplemented`).
    pub parallel_tool_calls: Option<bool>,
    pub store: Option<bool>,
    pub metadata: Option<serde_json::Map<String, Value>>,
    pub service_tier: Option<String>,
    pub modalities: Option<Vec<String>>,
    pub functions: Option<Vec<Value>>,
    pub function_call: Option<Value>,
    pub audio: Option<Value>,
    pub prediction: Option<Value>,
    pub reasoning_effort: Option<Value>,
    pub web_search_options: Option<Value>,
}

/// A generation request's body must say it is JSON: `Content-Type: application/json`, with
/// parameters allowed (`; charset=utf-8`; a charset other than UTF-8 is refused, JSON is UTF-8).
/// Anything else, or none, is a 415, so a client that sends the wrong thing learns it.
pub fn check_content_type(headers: &HeaderMap) -> Result<(), ApiError> {
    let refuse = |what: String| {
        Err(ApiError::status(
            StatusCode::UNSUPPORTED_MEDIA_TYPE,
            format!("{what}; send the body as JSON with `Content-Type: application/json`"),
        ))
    };
    let Some(value) = headers.get(header::CONTENT_TYPE) else {
        return refuse("the request has no Content-Type".into());
    };
    let Ok(text) = value.to_str() else {
        return refuse("the request's Content-Type is not readable".into());
    };
    let mut parts = text.split(';');
    let media_type = parts.next().unwrap_or_default().trim();
    if !media_type.eq_ignore_ascii_case("application/json") {
        return refuse(format!("the request's Content-Type is {text:?}"));
    }
    for parameter in parts {
        let Some((name, value)) = parameter.split_once('=') else {
            continue;
        };
        let value = value.trim().trim_matches('"');
        if name.trim().eq_ignore_ascii_case("charset")
            && !value.eq_ignore_ascii_case("utf-8")
            && !value.eq_ignore_ascii_case("utf8")
        {
            return refuse(format!(
                "the request's Content-Type is {text:?}, a charset other than UTF-8"
            ));
        }
    }
    Ok(())
}

/// Parses a JSON body into `T`, naming the path of a field of the wrong type.
pub fn parse_body<T: for<'de> Deserialize<'de>>(body: &[u8]) -> Result<T, ApiError> {
    parse_value(&parse_json(body)?)
}

/// A body as JSON; 400 when it is not.
pub fn parse_json(body: &[u8]) -> Result<Value, ApiError> {
    serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request(format!("the request body is not valid JSON: {e}")))
}

/// `value` as `T`; a field of the wrong type is a 400 naming its path.
pub fn parse_value<T: for<'de> Deserialize<'de>>(value: &Value) -> Result<T, ApiError> {
    serde_path_to_error::deserialize(value).map_err(|error| {
        let path = error.path().to_string();
        let inner = error.into_inner();
        if path == "." {
            ApiError::bad_request(format!("the request body does not match the API: {inner}"))
        } else {
            ApiError::invalid(path.clone(), format!("{path}: {inner}"))
        }
    })
}

/// A generation request whose shared fields are read from the same object.
pub trait WithCommon: for<'de> Deserialize<'de> {
    /// The route it is the body of, for error messages.
    const ROUTE: &'static str;
    fn set_common(&mut self, common: CommonFields);
}

impl WithCommon for CompletionRequest {
    const ROUTE: &'static str = "/v1/completions";
    fn set_common(&mut self, common: CommonFields) {
        self.common = common;
    }
}

impl WithCommon for ChatRequest {
    const ROUTE: &'static str = "/v1/chat/completions";
    fn set_common(&mut self, common: CommonFields) {
        self.common = common;
    }
}

/// The JSON field names `T`'s derived `Deserialize` reads: serde hands them to
/// `deserialize_struct`, which this deserializer records and then stops.
pub fn field_names<T: for<'de> Deserialize<'de>>() -> &'static [&'static str] {
    use serde::de::{self, Visitor};

    struct FieldNames<'a>(&'a mut &'static [&'static str]);

    impl<'de> de::Deserializer<'de> for FieldNames<'_> {
        type Error = de::value::Error;

        fn deserialize_any<V: Visitor<'de>>(self, _: V) -> Result<V::Value, Self::Error> {
            Err(de::Error::custom("not a struct"))
        }

        fn deserialize_struct<V: Visitor<'de>>(
            self,
            _name: &'static str,
            fields: &'static [&'static str],
            _: V,
        ) -> Result<V::Value, Self::Error> {
            *self.0 = fields;
            Err(de::Error::custom("field names read"))
        }

        serde::forward_to_deserialize_any! {
            bool i8 i16 i32 i64 i128 u8 u16 u32 u64 u128 f32 f64 char str string bytes
            byte_buf option unit unit_struct newtype_struct seq tuple tuple_struct map enum
            identifier ignored_any
        }
    }

    let mut fields: &'static [&'static str] = &[];
    let _ = T::deserialize(FieldNames(&mut fields));
    fields
}

/// The top-level fields a body of `T` may carry: its own and the shared ones.
pub fn known_fields<T: WithCommon>() -> Vec<&'static str> {
    let mut fields: Vec<&'static str> = field_names::<T>()
        .iter()
        .chain(field_names::<CommonFields>())
        .copied()
        .collect();
    fields.sort_unstable();
    fields.dedup();
    fields
}

/// Refuses (400 naming it) the first top-level field that is not a field of `T`: unknown
/// fields are never silently ignored.
fn check_known_fields<T: WithCommon>(
    object: &serde_json::Map<String, Value>,
) -> Result<(), ApiError> {
    let known = known_fields::<T>();
    let Some(field) = object.keys().find(|key| !known.contains(&key.as_str())) else {
        return Ok(());
    };
    let route = T::ROUTE;
    let reason = if field.starts_with("guided_") || field == "structured_outputs" {
        "structured output (guided decoding) is not implemented yet".to_string()
    } else if let Some(other) = [
        (ChatRequest::ROUTE, field_names::<ChatRequest>()),
        (CompletionRequest::ROUTE, field_names::<CompletionRequest>()),
    ]
    .into_iter()
    .find_map(|(other, fields)| {
        (other != route && fields.contains(&field.as_str())).then_some(other)
    }) {
        format!("it is a field of {other}")
    } else {
        "it is not a field stoke serve knows".to_string()
    };
    Err(ApiError::invalid(
        field.clone(),
        format!(
            "Unrecognized request argument supplied: `{field}` ({reason}); {route} refuses \
             fields it does not honour rather than ignore them"
        ),
    ))
}

/// Parses a completions or chat body: refuses unknown top-level fields, then reads its own
/// fields and the shared ones.
pub fn parse_request<T: WithCommon>(body: &[u8]) -> Result<T, ApiError> {
    let value = parse_json(body)?;
    let Some(object) = value.as_object() else {
        return Err(ApiError::bad_request(
            "the request body must be a JSON object",
        ));
    };
    check_known_fields::<T>(object)?;
    let mut request: T = parse_value(&value)?;
    request.set_common(parse_value(&value)?);
    Ok(request)
}

/// One prompt, as token ids (and its text when it came as text).
#[derive(Debug, Clone, PartialEq)]
pub struct PromptSpec {
    pub ids: Vec<u32>,
    pub text: Option<String>,
}

/// A checked generation request.
#[derive(Debug, Clone)]
pub struct GenerationSpec {
    pub prompts: Vec<PromptSpec>,
    /// Sampling; `max_new_tokens` is at least 1 (a request for 0 tokens generates one, which
    /// is dropped: `generate_nothing`).
    pub params: SamplingParams,
    /// The tokens the user asked to stop on (reported as `stop_reason`), a subset of
    /// `params.stop_token_ids`.
    pub user_stop_token_ids: Vec<u32>,
    pub logprobs: LogprobRequest,
    /// Report generated tokens' log-probs (with `logprobs.top` alternatives).
    pub report_logprobs: bool,
    /// Report `prompt_logprobs` (vLLM's field) with this many alternatives.
    pub report_prompt_logprobs: Option<usize>,
    /// `max_tokens: 0` with `echo`: prompt only.
    pub generate_nothing: bool,
    pub echo: bool,
    pub stream: bool,
    pub include_usage: bool,
    pub return_token_ids: bool,
    pub tokens_as_ids: bool,
    pub skip_special_tokens: bool,
    /// The seed was given (otherwise a random one was drawn).
    pub seeded: bool,
    /// The stream number of `prompts[0]` (`CommonFields::prompt_number`).
    pub first_prompt_number: u64,
    /// `CommonFields::first_sample` and `turn`.
    pub first_sample: u64,
    pub turn: u64,
}

fn positive(
    field: &str,
    value: Option<i64>,
    default: usize,
    max: usize,
) -> Result<usize, ApiError> {
    match value {
        None => Ok(default),
        Some(v) if v >= 1 && (v as u64) <= max as u64 => Ok(v as usize),
        Some(v) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be an integer from 1 to {max}, got {v}"),
        )),
    }
}

fn top_count(field: &str, value: Option<i64>, max: usize) -> Result<Option<usize>, ApiError> {
    match value {
        None => Ok(None),
        Some(v) if v >= 0 && (v as u64) <= max as u64 => Ok(Some(v as usize)),
        Some(v) => Err(ApiError::invalid(
            field,
            format!("`{field}` must be from 0 to {max} (--max-logprobs), got {v}"),
        )),
    }
}

/// `response_format`: `{"type": "text"}` (or absent) is what the server does anyway; JSON modes
/// need structured output, not implemented yet; anything else is not a response format.
fn check_response_format(format: Option<&Value>) -> Result<(), ApiError> {
    let field = "response_format";
    let Some(format) = format.filter(|f| !f.is_null()) else {
        return Ok(());
    };
    match format.get("type").and_then(Value::as_str) {
        Some("text") => Ok(()),
        Some(kind @ ("json_object" | "json_schema")) => Err(ApiError::invalid(
            field,
            format!(
                "`response_format` `{kind}` is not supported by stoke serve: structured output \
                 is not implemented yet (it will be, through constrained decoding); only \
                 {{\"type\": \"text\"}} is accepted"
            ),
        )),
        Some(kind) => Err(ApiError::invalid(
            field,
            format!(
                "`response_format.type` must be text, json_object or json_schema, got {kind:?} \
                 (stoke serve accepts only text)"
            ),
        )),
        None => Err(ApiError::invalid(
            field,
            "`response_format` must be an object with a `type` (stoke serve accepts only \
             {\"type\": \"text\"})",
        )),
    }
}

impl CommonFields {
    /// Refuses the fields stoke does not implement when they ask for anything.
    fn refuse_unimplemented(&self) -> Result<(), ApiError> {
        let neutral = |field: &str, value: Option<f64>, neutral: f64| match value {
            Some(v) if v != neutral => Err(ApiError::invalid(
                field,
                format!("`{field}` is not supported by stoke serve (only {neutral})"),
            )),
            _ => Ok(()),
        };
        neutral("presence_penalty", self.presence_penalty, 0.0)?;
        neutral("frequency_penalty", self.frequency_penalty, 0.0)?;
        neutral("repetition_penalty", self.repetition_penalty, 1.0)?;
        neutral("min_p", self.min_p, 0.0)?;
        if let Some(bias) = &self.logit_bias
            && !(bias.is_null() || bias.as_object().is_some_and(|m| m.is_empty()))
        {
            return Err(ApiError::invalid(
                "logit_bias",
                "`logit_bias` is not supported by stoke serve",
            ));
        }
        if self.min_tokens.is_some_and(|v| v != 0) {
            return Err(ApiError::invalid(
                "min_tokens",
                "`min_tokens` is not supported by stoke serve",
            ));
        }
        if self
            .stream_options
            .as_ref()
            .is_some_and(|o| o.continuous_usage_stats)
        {
            return Err(ApiError::invalid(
                "stream_options.continuous_usage_stats",
                "`stream_options.continuous_usage_stats` is not supported by stoke serve (only \
                 `include_usage`: usage in a final chunk)",
            ));
        }
        check_response_format(self.response_format.as_ref())
    }

    fn check_model(&self, info: &ModelInfo) -> Result<(), ApiError> {
        match &self.model {
            Some(name) if name != &info.name => Err(ApiError::invalid(
                "model",
                format!(
                    "The model `{name}` does not exist; this server serves `{}`",
                    info.name
                ),
            )),
            _ => Ok(()),
        }
    }

    fn logprobs_mode(&self, info: &ModelInfo) -> Result<LogprobMode, ApiError> {
        match self.logprobs_mode.as_deref() {
            None => Ok(info.default_logprobs_mode),
            Some("processed_logprobs" | "processed") => Ok(LogprobMode::Processed),
            Some("raw_logprobs" | "raw") => Ok(LogprobMode::Raw),
            Some(other) => Err(ApiError::invalid(
                "logprobs_mode",
                format!(
                    "`logprobs_mode` must be processed_logprobs or raw_logprobs, got {other:?}"
                ),
            )),
        }
    }

    /// The sampling parameters apart from the token budget.
    fn sampling(&self, info: &ModelInfo) -> Result<(SamplingParams, Vec<u32>, bool), ApiError> {
        self.refuse_unimplemented()?;
        let temperature = self.temperature.unwrap_or(1.0);
        if !temperature.is_finite() || !(0.0..=100.0).contains(&temperature) {
            return Err(ApiError::invalid(
                "temperature",
                format!("`temperature` must be from 0 to 100, got {temperature}"),
            ));
        }
        let top_p = self.top_p.unwrap_or(1.0);
        if !(top_p > 0.0 && top_p <= 1.0) {
            return Err(ApiError::invalid(
                "top_p",
                format!("`top_p` must be in (0, 1], got {top_p}"),
            ));
        }
        let top_k = match self.top_k {
            None | Some(-1) | Some(0) => None,
            Some(k) if k > 0 => Some(k as usize),
            Some(k) => {
                return Err(ApiError::invalid(
                    "top_k",
                    format!("`top_k` must be -1 (off) or at least 1, got {k}"),
                ));
            }
        };
        let n = positive("n", self.n, 1, 256)?;
        let user_stop_token_ids = self.stop_token_ids.clone().unwrap_or_default();
        if let Some(&id) = user_stop_token_ids
            .iter()
            .find(|&&id| id as usize >= info.vocab_size)
        {
            return Err(ApiError::invalid(
                "stop_token_ids",
                format!(
                    "token id {id} is outside the vocabulary (size {})",
                    info.vocab_size
                ),
            ));
        }
        let mut stop_token_ids = user_stop_token_ids.clone();
        if !self.ignore_eos {
            stop_token_ids.extend(&info.eos_token_ids);
        }
        stop_token_ids.sort_unstable();
        stop_token_ids.dedup();
        let stop_strings = self
            .stop
            .clone()
            .map(StopField::into_vec)
            .unwrap_or_default();
        if let Some(index) = stop_strings.iter().position(String::is_empty) {
            return Err(ApiError::invalid(
                "stop",
                format!("`stop` entry {index} is an empty string"),
            ));
        }
        let (seed, seeded) = match self.seed {
            Some(seed) => (seed as u64, true),
            None => (rand::random::<u64>(), false),
        };
        Ok((
            SamplingParams {
                max_new_tokens: 1,
                temperature: temperature as f32,
                top_k,
                top_p: top_p as f32,
                seed,
                n,
                stop_token_ids,
                stop_strings,
            },
            user_stop_token_ids,
            seeded,
        ))
    }
}

/// The token budget: `max_tokens` if given (checked against the context), else `default`.
/// Returns (max_new_tokens, generate_nothing).
fn token_budget(
    field: &str,
    max_tokens: Option<i64>,
    default: Option<usize>,
    longest_prompt: usize,
    echo: bool,
    info: &ModelInfo,
) -> Result<(usize, bool), ApiError> {
    let room = info.max_model_len.saturating_sub(longest_prompt);
    let context_error = |requested: usize| {
        ApiError::invalid(
            field,
            format!(
                "This model's maximum context length is {} tokens. However, you requested {} \
                 tokens ({longest_prompt} in the prompt, {requested} in the completion). Please \
                 reduce the prompt or `{field}`.",
                info.max_model_len,
                longest_prompt + requested
            ),
        )
    };
    if room == 0 {
        return Err(ApiError::invalid(
            "prompt",
            format!(
                "the prompt has {longest_prompt} tokens; this model's maximum context length is \
                 {} tokens, leaving no room for a completion",
                info.max_model_len
            ),
        ));
    }
    match max_tokens {
        None => Ok((default.unwrap_or(room).min(room), false)),
        Some(0) if echo => Ok((1, true)),
        Some(v) if v < 1 => Err(ApiError::invalid(
            field,
            format!("`{field}` must be at least 1 (0 only with `echo`), got {v}"),
        )),
        Some(v) if v as u64 > room as u64 => Err(context_error(v as usize)),
        Some(v) => Ok((v as usize, false)),
    }
}

/// The prompts of a completions request as token ids.
fn completion_prompts(
    prompt: &Value,
    tokenizer: &Tokenizer,
    info: &ModelInfo,
) -> Result<Vec<PromptSpec>, ApiError> {
    let shape_error = || {
        ApiError::invalid(
            "prompt",
            "`prompt` must be a string, a list of strings, a list of token ids or a list of \
             lists of token ids",
        )
    };
    let encode = |text: &str| -> Result<PromptSpec, ApiError> {
        let ids = tokenizer
            .encode(text, true)
            .map_err(|e| ApiError::invalid("prompt", format!("tokenizing the prompt: {e}")))?;
        Ok(PromptSpec {
            ids,
            text: Some(text.to_string()),
        })
    };
    let ids_of = |value: &Value| -> Option<Vec<u32>> {
        value
            .as_array()?
            .iter()
            .map(|v| v.as_u64().and_then(|id| u32::try_from(id).ok()))
            .collect()
    };
    let prompts = match prompt {
        Value::String(text) => vec![encode(text)?],
        Value::Array(items) if items.is_empty() => {
            return Err(ApiError::invalid("prompt", "`prompt` is an empty list"));
        }
        Value::Array(items) if items.iter().all(Value::is_string) => items
            .iter()
            .map(|item| encode(item.as_str().unwrap_or_default()))
            .collect::<Result<_, _>>()?,
        Value::Array(items) if items.iter().all(Value::is_number) => vec![PromptSpec {
            ids: ids_of(prompt).ok_or_else(shape_error)?,
            text: None,
        }],
        Value::Array(items) if items.iter().all(Value::is_array) => items
            .iter()
            .map(|item| {
                Ok(PromptSpec {
                    ids: ids_of(item).ok_or_else(shape_error)?,
                    text: None,
                })
            })
            .collect::<Result<_, ApiError>>()?,
        _ => return Err(shape_error()),
    };
    for (index, prompt) in prompts.iter().enumerate() {
        if prompt.ids.is_empty() {
            return Err(ApiError::invalid(
                "prompt",
                format!("prompt {index} is empty (it needs at least one token)"),
            ));
        }
        if let Some(&id) = prompt
            .ids
            .iter()
            .find(|&&id| id as usize >= info.vocab_size)
        {
            return Err(ApiError::invalid(
                "prompt",
                format!(
                    "prompt {index}: token id {id} is outside the vocabulary (size {})",
                    info.vocab_size
                ),
            ));
        }
    }
    Ok(prompts)
}

impl CompletionRequest {
    pub fn into_spec(
        self,
        tokenizer: &Tokenizer,
        info: &ModelInfo,
    ) -> Result<GenerationSpec, ApiError> {
        let common = &self.common;
        common.check_model(info)?;
        if self.suffix.as_deref().is_some_and(|s| !s.is_empty()) {
            return Err(ApiError::invalid(
                "suffix",
                "`suffix` is not supported by stoke serve",
            ));
        }
        let (mut params, user_stop_token_ids, seeded) = common.sampling(info)?;
        if let Some(best_of) = self.best_of
            && best_of as usize != params.n
        {
            return Err(ApiError::invalid(
                "best_of",
                "`best_of` other than `n` is not supported by stoke serve",
            ));
        }
        let prompts = completion_prompts(&self.prompt, tokenizer, info)?;
        let longest = prompts.iter().map(|p| p.ids.len()).max().unwrap_or(0);
        let (max_new_tokens, generate_nothing) = token_budget(
            "max_tokens",
            common.max_tokens,
            Some(16),
            longest,
            self.echo,
            info,
        )?;
        params.max_new_tokens = max_new_tokens;
        let top = top_count("logprobs", self.logprobs, info.max_logprobs)?;
        let prompt_top = top_count("prompt_logprobs", common.prompt_logprobs, info.max_logprobs)?;
        let logprobs = LogprobRequest {
            top: top.unwrap_or(0),
            mode: common.logprobs_mode(info)?,
            // Echo with log-probs needs the prompt's log-probs (first entry null).
            prompt: match (prompt_top, self.echo && top.is_some()) {
                (Some(p), _) => Some(p.max(top.unwrap_or(0))),
                (None, true) => top,
                (None, false) => None,
            },
        };
        Ok(GenerationSpec {
            prompts,
            params,
            user_stop_token_ids,
            logprobs,
            report_logprobs: top.is_some(),
            report_prompt_logprobs: prompt_top,
            generate_nothing,
            echo: self.echo,
            stream: common.stream,
            include_usage: common
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            return_token_ids: common.return_token_ids,
            tokens_as_ids: common.return_tokens_as_token_ids,
            skip_special_tokens: common.skip_special_tokens.unwrap_or(true),
            seeded,
            first_prompt_number: common.prompt_number.unwrap_or(0),
            first_sample: common.first_sample.unwrap_or(0),
            turn: common.turn.unwrap_or(0),
        })
    }
}

/// Tool-call `arguments` arrive as JSON strings (OpenAI); templates expect objects (vLLM parses
/// them the same way before rendering).
fn prepare_message(index: usize, mut message: Value) -> Result<ChatMessage, ApiError> {
    let field = format!("messages[{index}]");
    if let Some(calls) = message.get_mut("tool_calls").and_then(Value::as_array_mut) {
        for call in calls {
            let arguments = call
                .get_mut("function")
                .and_then(|f| f.get_mut("arguments"));
            if let Some(arguments) = arguments
                && let Some(text) = arguments.as_str()
                && let Ok(parsed) = serde_json::from_str::<Value>(text)
            {
                *arguments = parsed;
            }
        }
    }
    serde_json::from_value(message)
        .map_err(|e| ApiError::invalid(field.clone(), format!("{field}: {e}")))
}

/// `continue_final_message` (vLLM's and transformers' rule): the conversation rendered with its
/// final assistant message left open, i.e. the text cut right after that message's content,
/// so the model continues it (a judge prefilled with `Score:`, a partial answer).
fn open_final_message(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    rendered: &str,
) -> Result<ChatEncoding, ApiError> {
    let field = "continue_final_message";
    let last = messages
        .last()
        .filter(|m| m.role == Role::Assistant)
        .ok_or_else(|| {
            ApiError::invalid(
                field,
                "`continue_final_message` needs a final assistant message",
            )
        })?;
    let content = last
        .content
        .as_ref()
        .map(|c| c.joined_text())
        .unwrap_or_default();
    let stripped = content.trim();
    if stripped.is_empty() {
        return Err(ApiError::invalid(
            field,
            "the final assistant message to continue is empty",
        ));
    }
    let at = rendered.rfind(stripped).ok_or_else(|| {
        ApiError::invalid(
            field,
            "the chat template does not render the final message's text as it is",
        )
    })?;
    // Trailing whitespace the template kept is kept (a prefix ending in a space); one the
    // template trimmed is not invented.
    let kept = content.trim_start();
    let end = if rendered[at..].starts_with(kept) {
        at + kept.len()
    } else {
        at + stripped.len()
    };
    let text = rendered[..end].to_string();
    let ids = tokenizer
        .encode(&text, false)
        .map_err(|e| ApiError::invalid(field, e.to_string()))?;
    let assistant_mask = vec![false; ids.len()];
    Ok(ChatEncoding {
        text,
        ids,
        assistant_mask,
    })
}

/// A 400 for a conversation the chat template cannot render. When the template itself fails
/// (it raises, or errors on a message it does not expect), the answer names the first message
/// at which rendering `messages[..=i]` fails, `messages[i] (role R): ...`, rather than a line of
/// the template; otherwise (or when every prefix renders) it names `messages` as a whole.
fn render_error(
    tokenizer: &Tokenizer,
    messages: &[ChatMessage],
    options: &ChatOptions,
    error: TokenizerError,
) -> ApiError {
    if let TokenizerError::Template { .. } = error
        && let Ok(template) = tokenizer.chat_template_for(options)
    {
        let prefix_options = ChatOptions {
            add_generation_prompt: false,
            variables: options.variables.clone(),
        };
        let failing = (0..messages.len()).find_map(|i| {
            match template.render_text(&messages[..=i], &prefix_options) {
                Err(TokenizerError::Template { mut message, .. }) => {
                    // Where in the template is no help to a client; which message is.
                    if let Some(at) = message.rfind(" (template line ") {
                        message.truncate(at);
                    }
                    Some((i, message))
                }
                _ => None,
            }
        });
        if let Some((index, message)) = failing {
            let field = format!("messages[{index}]");
            let role = messages[index].role.as_str();
            return ApiError::invalid(
                field.clone(),
                format!(
                    "{field} (role {role}): the chat template `{}` cannot render it: {message}",
                    template.name()
                ),
            );
        }
    }
    ApiError::invalid("messages", format!("rendering the chat template: {error}"))
}

fn template_value(field: &str, value: &Value) -> Result<TemplateValue, ApiError> {
    serde_json::from_value(value.clone())
        .map_err(|e| ApiError::invalid(field, format!("`{field}`: {e}")))
}

/// A refusal of a field stoke knows and does not implement.
fn unsupported(field: &str, detail: &str) -> ApiError {
    ApiError::invalid(
        field,
        format!("`{field}` is not supported by stoke serve{detail}"),
    )
}

impl ChatRequest {
    /// Refuses the chat fields stoke does not implement unless they hold their neutral value
    /// (the table in `docs/src/guide/serve.md`).
    fn refuse_unimplemented(&self) -> Result<(), ApiError> {
        match self.tool_choice.as_ref() {
            None | Some(Value::Null) => {}
            Some(Value::String(choice)) if choice == "auto" || choice == "none" => {}
            Some(Value::String(choice)) if choice == "required" => {
                return Err(unsupported(
                    "tool_choice",
                    " as \"required\": forcing a tool call needs constrained decoding, not \
                     implemented yet; \"auto\" and \"none\" are supported",
                ));
            }
            Some(Value::Object(choice)) if choice.get("type").and_then(Value::as_str).is_some() => {
                return Err(unsupported(
                    "tool_choice",
                    " as a named function or tool set: forcing a tool call needs constrained \
                     decoding, not implemented yet; \"auto\" and \"none\" are supported",
                ));
            }
            Some(other) => {
                return Err(ApiError::invalid(
                    "tool_choice",
                    format!(
                        "`tool_choice` must be \"auto\", \"none\", \"required\" or a named \
                         function, got {other}"
                    ),
                ));
            }
        }
        if self.parallel_tool_calls == Some(false) {
            return Err(unsupported(
                "parallel_tool_calls",
                " as false: every call the model writes is returned (only true is accepted)",
            ));
        }
        if self.functions.as_ref().is_some_and(|f| !f.is_empty()) {
            return Err(unsupported(
                "functions",
                " (deprecated by OpenAI): pass them as `tools`",
            ));
        }
        match self.function_call.as_ref() {
            None | Some(Value::Null) => {}
            Some(Value::String(call)) if call == "none" || call == "auto" => {}
            Some(_) => {
                return Err(unsupported(
                    "function_call",
                    " (deprecated by OpenAI): only \"none\" or \"auto\"; use `tools`",
                ));
            }
        }
        if self.store == Some(true) {
            return Err(unsupported(
                "store",
                " as true: completions are not stored (only false is accepted)",
            ));
        }
        if self.metadata.as_ref().is_some_and(|m| !m.is_empty()) {
            return Err(unsupported(
                "metadata",
                ": completions are not stored, so there is nothing to tag (only {} is accepted)",
            ));
        }
        if let Some(tier) = &self.service_tier
            && tier != "auto"
            && tier != "default"
        {
            return Err(unsupported(
                "service_tier",
                &format!(" as {tier:?}: there is one tier (\"auto\" or \"default\")"),
            ));
        }
        if let Some(modalities) = &self.modalities
            && modalities.iter().any(|m| m != "text")
        {
            return Err(unsupported(
                "modalities",
                ": the server generates text only (only [\"text\"] is accepted)",
            ));
        }
        let absent = |field: &str, value: &Option<Value>, detail: &str| match value {
            Some(v) if !v.is_null() => Err(unsupported(field, detail)),
            _ => Ok(()),
        };
        absent("audio", &self.audio, ": the server generates text only")?;
        absent(
            "prediction",
            &self.prediction,
            " (predicted outputs are not implemented)",
        )?;
        absent(
            "reasoning_effort",
            &self.reasoning_effort,
            ": a template that reads one takes it through `chat_template_kwargs`",
        )?;
        absent(
            "web_search_options",
            &self.web_search_options,
            ": the server has no web search",
        )?;
        Ok(())
    }

    /// Whether the response should parse tool calls out of the generated text.
    pub fn wants_tool_calls(&self) -> bool {
        self.tools.as_ref().is_some_and(|t| !t.is_empty())
            && !matches!(
                self.tool_choice.as_ref().and_then(Value::as_str),
                Some("none")
            )
    }

    pub fn into_spec(
        self,
        tokenizer: &Tokenizer,
        info: &ModelInfo,
    ) -> Result<GenerationSpec, ApiError> {
        let common = &self.common;
        common.check_model(info)?;
        self.refuse_unimplemented()?;
        let continue_final = self.continue_final_message;
        if continue_final && self.add_generation_prompt == Some(true) {
            return Err(ApiError::invalid(
                "continue_final_message",
                "`continue_final_message` and `add_generation_prompt` cannot both be true",
            ));
        }
        if self.echo {
            return Err(ApiError::invalid(
                "echo",
                "`echo` is not supported for chat by stoke serve",
            ));
        }
        if self.messages.is_empty() {
            return Err(ApiError::invalid("messages", "`messages` is empty"));
        }
        let messages = self
            .messages
            .iter()
            .enumerate()
            .map(|(i, m)| prepare_message(i, m.clone()))
            .collect::<Result<Vec<_>, _>>()?;
        let mut variables = BTreeMap::new();
        if let Some(kwargs) = &self.chat_template_kwargs {
            for (key, value) in kwargs {
                variables.insert(
                    key.clone(),
                    template_value(&format!("chat_template_kwargs.{key}"), value)?,
                );
            }
        }
        if let Some(tools) = &self.tools
            && !tools.is_empty()
            && self.wants_tool_calls()
        {
            variables.insert(
                "tools".to_string(),
                template_value("tools", &Value::Array(tools.clone()))?,
            );
        }
        let options = ChatOptions {
            add_generation_prompt: !continue_final && self.add_generation_prompt.unwrap_or(true),
            variables,
        };
        let mut encoding = tokenizer
            .apply_chat_template(&messages, &options)
            .map_err(|e| render_error(tokenizer, &messages, &options, e))?;
        if continue_final {
            encoding = open_final_message(tokenizer, &messages, &encoding.text)?;
        }
        let encoding = encoding;
        if encoding.ids.is_empty() {
            return Err(ApiError::invalid(
                "messages",
                "the rendered conversation is empty",
            ));
        }
        let prompts = vec![PromptSpec {
            ids: encoding.ids,
            text: Some(encoding.text),
        }];
        let (mut params, user_stop_token_ids, seeded) = common.sampling(info)?;
        let (field, max_tokens) = match (self.max_completion_tokens, common.max_tokens) {
            (Some(v), _) => ("max_completion_tokens", Some(v)),
            (None, v) => ("max_tokens", v),
        };
        let (max_new_tokens, _) =
            token_budget(field, max_tokens, None, prompts[0].ids.len(), false, info)?;
        params.max_new_tokens = max_new_tokens;
        let top = if self.logprobs {
            Some(top_count("top_logprobs", self.top_logprobs, info.max_logprobs)?.unwrap_or(0))
        } else if self.top_logprobs.is_some_and(|v| v > 0) {
            return Err(ApiError::invalid(
                "top_logprobs",
                "`top_logprobs` needs `logprobs: true`",
            ));
        } else {
            None
        };
        let prompt_top = top_count("prompt_logprobs", common.prompt_logprobs, info.max_logprobs)?;
        Ok(GenerationSpec {
            prompts,
            params,
            user_stop_token_ids,
            logprobs: LogprobRequest {
                top: top.unwrap_or(0),
                mode: common.logprobs_mode(info)?,
                prompt: prompt_top,
            },
            report_logprobs: top.is_some(),
            report_prompt_logprobs: prompt_top,
            generate_nothing: false,
            echo: false,
            stream: common.stream,
            include_usage: common
                .stream_options
                .as_ref()
                .is_some_and(|o| o.include_usage),
            return_token_ids: common.return_token_ids,
            tokens_as_ids: common.return_tokens_as_token_ids,
            skip_special_tokens: common.skip_special_tokens.unwrap_or(true),
            seeded,
            first_prompt_number: common.prompt_number.unwrap_or(0),
            first_sample: common.first_sample.unwrap_or(0),
            turn: common.turn.unwrap_or(0),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every field of OpenAI's chat request the Python SDK can send, each honoured or refused
    /// by name (the table in docs/src/guide/serve.md); the others are refused as unknown.
    const OPENAI_CHAT_FIELDS: &[&str] = &[
        "model",
        "messages",
        "max_tokens",
        "max_completion_tokens",
        "temperature",
        "top_p",
        "n",
        "stream",
        "stream_options",
        "stop",
        "seed",
        "presence_penalty",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "top_logprobs",
        "user",
        "safety_identifier",
        "tools",
        "tool_choice",
        "parallel_tool_calls",
        "response_format",
        "service_tier",
        "store",
        "metadata",
        "modalities",
        "audio",
        "prediction",
        "reasoning_effort",
        "web_search_options",
        "function_call",
        "functions",
    ];

    const OPENAI_COMPLETION_FIELDS: &[&str] = &[
        "model",
        "prompt",
        "best_of",
        "echo",
        "frequency_penalty",
        "logit_bias",
        "logprobs",
        "max_tokens",
        "n",
        "presence_penalty",
        "seed",
        "stop",
        "stream",
        "stream_options",
        "suffix",
        "temperature",
        "top_p",
        "user",
    ];

    #[test]
    fn the_field_lists_come_from_the_types_and_cover_openais_fields() {
        let chat = known_fields::<ChatRequest>();
        let completions = known_fields::<CompletionRequest>();
        for field in OPENAI_CHAT_FIELDS {
            assert!(chat.contains(field), "chat lacks {field}");
        }
        for field in OPENAI_COMPLETION_FIELDS {
            assert!(completions.contains(field), "completions lacks {field}");
        }
        // The skipped `common` is not a field; the shared ones are on both routes.
        assert!(!chat.contains(&"common") && !completions.contains(&"common"));
        for field in ["prompt_number", "top_k", "logprobs_mode", "stop_token_ids"] {
            assert!(
                chat.contains(&field) && completions.contains(&field),
                "{field}"
            );
        }
        for field in [
            "guided_json",
            "structured_outputs",
            "verbosity",
            "prompt_cache_key",
        ] {
            assert!(
                !chat.contains(&field) && !completions.contains(&field),
                "{field}"
            );
        }
        assert!(!completions.contains(&"messages") && !chat.contains(&"prompt"));
    }

    #[test]
    fn unknown_fields_are_refused_by_name_with_a_hint() {
        let refused = |body: Value| -> ApiError {
            parse_request::<ChatRequest>(body.to_string().as_bytes()).unwrap_err()
        };
        let error = refused(serde_json::json!({"messages": [], "guided_json": {}}));
        assert_eq!(error.param.as_deref(), Some("guided_json"));
        assert!(error.message.contains("structured output"), "{error}");
        let error = refused(serde_json::json!({"messages": [], "suffix": "x"}));
        assert_eq!(error.param.as_deref(), Some("suffix"));
        assert!(error.message.contains("/v1/completions"), "{error}");
        let error = refused(serde_json::json!({"messages": [], "zzz": 1}));
        assert_eq!(error.param.as_deref(), Some("zzz"));
        assert!(
            parse_request::<ChatRequest>(br#"{"messages": [], "user": "u", "top_k": 3}"#).is_ok()
        );
        assert!(
            parse_request::<CompletionRequest>(br#"{"prompt": "x", "echo": true, "user": "u"}"#)
                .is_ok()
        );
    }

    #[test]
    fn only_json_bodies_are_taken() {
        let with = |value: Option<&str>| {
            let mut headers = HeaderMap::new();
            if let Some(value) = value {
                headers.insert(header::CONTENT_TYPE, value.parse().unwrap());
            }
            check_content_type(&headers).map_err(|e| e.status.as_u16())
        };
        assert_eq!(with(Some("application/json")), Ok(()));
        assert_eq!(with(Some("application/json; charset=utf-8")), Ok(()));
        assert_eq!(with(Some("APPLICATION/JSON ;Charset=\"UTF8\"")), Ok(()));
        assert_eq!(with(None), Err(415));
        assert_eq!(with(Some("text/plain")), Err(415));
        assert_eq!(with(Some("application/json-seq")), Err(415));
        assert_eq!(with(Some("application/json; charset=iso-8859-1")), Err(415));
    }
}
