//! What an evaluation runs against: a local model (the rollout engine and the cache-free
//! scorer) or an OpenAI-compatible endpoint (`stoke serve`, vLLM: `/v1/completions` with token
//! ids, `echo` and `logprobs` for log-likelihoods).
//!
//! Both take token ids made by the harness with the model's tokenizer (lm-evaluation-harness's
//! split: the context encoded alone, the continuation as what encoding the whole text adds), so
//! a local folder and a server see exactly the same sequences.

use std::time::Duration;

use candle_core::Device;
use serde_json::{Value, json};
use stoke_model::Transformer;
use stoke_rollout::engine::Engine;
use stoke_rollout::{Detokenizer, GenerationRequest, SamplingParams};
use stoke_tokenizer::hf::Tokenizer;

use crate::task::GenerationFile;

#[derive(Debug, thiserror::Error)]
pub enum TargetError {
    #[error("model: {0}")]
    Model(String),
    #[error("endpoint {url}: {message}")]
    Endpoint { url: String, message: String },
}

/// One sampled completion.
#[derive(Debug, Clone, PartialEq)]
pub struct Sample {
    pub text: String,
    pub tokens: usize,
}

/// A model to evaluate.
pub trait Target {
    /// For the records: the model folder or the URL.
    fn describe(&self) -> String;
    fn tokenizer(&self) -> &Tokenizer;
    /// Longest sequence the model takes.
    fn max_length(&self) -> usize;
    /// For each `(ids, from)`: the summed log-probability of `ids[from..]`, each token given
    /// the ones before it, and whether every one of them was the most likely token. `from >= 1`.
    fn score(&self, sequences: &[(Vec<u32>, usize)]) -> Result<Vec<(f64, bool)>, TargetError>;
    /// `settings.n` completions of `prompt`, sampled with `seed`.
    fn generate(
        &self,
        prompt: &[u32],
        settings: &GenerationFile,
        seed: u64,
    ) -> Result<Vec<Sample>, TargetError>;
}

fn stop_token_ids(tokenizer: &Tokenizer, model_eos: &[u32]) -> Vec<u32> {
    let mut ids = model_eos.to_vec();
    ids.extend(tokenizer.eos_token_ids());
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// A model folder evaluated in this process.
pub struct LocalTarget<'m> {
    pub model: &'m Transformer,
    pub tokenizer: Tokenizer,
    pub name: String,
}

impl Target for LocalTarget<'_> {
    fn describe(&self) -> String {
        self.name.clone()
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn max_length(&self) -> usize {
        self.model.config().max_position_embeddings
    }

    fn score(&self, sequences: &[(Vec<u32>, usize)]) -> Result<Vec<(f64, bool)>, TargetError> {
        sequences
            .iter()
            .map(|(ids, from)| {
                let logits =
                    stoke_rollout::score::full_sequence_logits(self.model, ids, &Device::Cpu)
                        .map_err(|e| TargetError::Model(e.to_string()))?;
                let mut total = 0f64;
                let mut greedy = true;
                for t in (*from).max(1)..ids.len() {
                    let row = &logits[t - 1];
                    total += f64::from(stoke_rollout::sampling::log_softmax_at(row, ids[t]));
                    let best = row
                        .iter()
                        .enumerate()
                        .fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| {
                            if v > b.1 { (i, v) } else { b }
                        })
                        .0;
                    greedy &= best == ids[t] as usize;
                }
                Ok((total, greedy))
            })
            .collect()
    }

    fn generate(
        &self,
        prompt: &[u32],
        settings: &GenerationFile,
        seed: u64,
    ) -> Result<Vec<Sample>, TargetError> {
        let params = SamplingParams {
            max_new_tokens: settings.max_tokens,
            temperature: settings.temperature,
            top_k: Some(settings.top_k).filter(|&k| k > 0),
            top_p: settings.top_p,
            seed,
            n: settings.n,
            stop_token_ids: stop_token_ids(&self.tokenizer, &self.model.config().eos_token_ids),
            stop_strings: settings.stop.clone(),
        };
        let request = GenerationRequest::new(vec![prompt.to_vec()], params);
        let output = Engine::new(self.model)
            .generate(&request, Some(&self.tokenizer as &dyn Detokenizer))
            .map_err(|e| TargetError::Model(e.to_string()))?;
        output
            .completions
            .into_iter()
            .next()
            .unwrap_or_default()
            .into_iter()
            .map(|c| {
                let text = match c.text {
                    Some(text) => text,
                    None => self
                        .tokenizer
                        .decode(&c.token_ids, true)
                        .map_err(|e| TargetError::Model(e.to_string()))?,
                };
                Ok(Sample {
                    text,
                    tokens: c.token_ids.len(),
                })
            })
            .collect()
    }
}

/// An OpenAI-compatible server.
pub struct EndpointTarget {
    base: String,
    model: String,
    tokenizer: Tokenizer,
    max_length: usize,
    agent: ureq::Agent,
}

impl EndpointTarget {
    /// Connects to `url` (`http://host:port`, a trailing `/v1` accepted), asks `/v1/models`
    /// for the served model (the first unless `model` is given) and its context length;
    /// `tokenizer` must be the served model's. `timeout` bounds every request.
    pub fn connect(
        url: &str,
        model: Option<&str>,
        tokenizer: Tokenizer,
        timeout: Duration,
    ) -> Result<EndpointTarget, TargetError> {
        let base = url
            .trim_end_matches('/')
            .trim_end_matches("/v1")
            .to_string();
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_connect(Some(Duration::from_secs(10)))
            .timeout_global(Some(timeout))
            .build()
            .into();
        let mut target = EndpointTarget {
            base,
            model: String::new(),
            tokenizer,
            max_length: 0,
            agent,
        };
        let models = target.get("/v1/models")?;
        let data = models["data"].as_array().cloned().unwrap_or_default();
        let entry = match model {
            Some(name) => data
                .iter()
                .find(|m| m["id"] == name)
                .cloned()
                .ok_or_else(|| {
                    target.error("/v1/models", format!("the server does not serve `{name}`"))
                })?,
            None => data
                .first()
                .cloned()
                .ok_or_else(|| target.error("/v1/models", "the server lists no model".into()))?,
        };
        target.model = entry["id"].as_str().unwrap_or_default().to_string();
        target.max_length = entry["max_model_len"].as_u64().unwrap_or(2048) as usize;
        Ok(target)
    }

    fn error(&self, path: &str, message: String) -> TargetError {
        TargetError::Endpoint {
            url: format!("{}{path}", self.base),
            message,
        }
    }

    fn get(&self, path: &str) -> Result<Value, TargetError> {
        let url = format!("{}{path}", self.base);
        let mut response = self
            .agent
            .get(&url)
            .call()
            .map_err(|e| self.error(path, e.to_string()))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| self.error(path, e.to_string()))?;
        if status != 200 {
            return Err(self.error(path, format!("status {status}: {text}")));
        }
        serde_json::from_str(&text).map_err(|e| self.error(path, format!("not JSON ({e}): {text}")))
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, TargetError> {
        let url = format!("{}{path}", self.base);
        let mut response = self
            .agent
            .post(&url)
            .header("Content-Type", "application/json")
            .send(body.to_string())
            .map_err(|e| self.error(path, e.to_string()))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| self.error(path, e.to_string()))?;
        if status != 200 {
            return Err(self.error(path, format!("status {status}: {text}")));
        }
        serde_json::from_str(&text).map_err(|e| self.error(path, format!("not JSON ({e}): {text}")))
    }
}

impl Target for EndpointTarget {
    fn describe(&self) -> String {
        format!("{} ({})", self.base, self.model)
    }

    fn tokenizer(&self) -> &Tokenizer {
        &self.tokenizer
    }

    fn max_length(&self) -> usize {
        self.max_length
    }

    fn score(&self, sequences: &[(Vec<u32>, usize)]) -> Result<Vec<(f64, bool)>, TargetError> {
        let path = "/v1/completions";
        sequences
            .iter()
            .map(|(ids, from)| {
                let answer = self.post(
                    path,
                    &json!({"model": self.model, "prompt": ids, "max_tokens": 1,
                            "temperature": 0.0, "echo": true, "logprobs": 1}),
                )?;
                let logprobs = &answer["choices"][0]["logprobs"];
                let values = logprobs["token_logprobs"].as_array();
                let tops = logprobs["top_logprobs"].as_array();
                let (Some(values), Some(tops)) = (values, tops) else {
                    return Err(self.error(path, "the answer has no echoed log-probs".into()));
                };
                if values.len() < ids.len() || tops.len() < ids.len() {
                    return Err(self.error(
                        path,
                        format!(
                            "{} echoed log-probs for a prompt of {} tokens",
                            values.len(),
                            ids.len()
                        ),
                    ));
                }
                let mut total = 0f64;
                let mut greedy = true;
                for t in (*from).max(1)..ids.len() {
                    let value = values[t].as_f64().ok_or_else(|| {
                        self.error(path, format!("prompt log-prob {t} is not a number"))
                    })?;
                    total += value;
                    let best = tops[t]
                        .as_object()
                        .map(|m| {
                            m.values()
                                .filter_map(Value::as_f64)
                                .fold(f64::NEG_INFINITY, f64::max)
                        })
                        .unwrap_or(f64::NEG_INFINITY);
                    greedy &= value >= best;
                }
                Ok((total, greedy))
            })
            .collect()
    }

    fn generate(
        &self,
        prompt: &[u32],
        settings: &GenerationFile,
        seed: u64,
    ) -> Result<Vec<Sample>, TargetError> {
        let path = "/v1/completions";
        let mut body = json!({"model": self.model, "prompt": prompt,
            "max_tokens": settings.max_tokens, "temperature": settings.temperature,
            "top_p": settings.top_p, "n": settings.n, "seed": seed});
        if settings.top_k > 0 {
            body["top_k"] = json!(settings.top_k);
        }
        if !settings.stop.is_empty() {
            body["stop"] = json!(settings.stop);
        }
        let answer = self.post(path, &body)?;
        let mut choices = answer["choices"].as_array().cloned().unwrap_or_default();
        choices.sort_by_key(|c| c["index"].as_u64().unwrap_or(0));
        if choices.len() != settings.n {
            return Err(self.error(
                path,
                format!("{} choices for n = {}", choices.len(), settings.n),
            ));
        }
        choices
            .iter()
            .map(|c| {
                let text = c["text"].as_str().unwrap_or_default().to_string();
                let tokens = self
                    .tokenizer
                    .encode(&text, false)
                    .map_err(|e| self.error(path, format!("tokenizing a completion: {e}")))?
                    .len();
                Ok(Sample { text, tokens })
            })
            .collect()
    }
}
