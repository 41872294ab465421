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
use stoke_rollout::{Detokenizer, FinishReason, GenerationRequest, SamplingParams};
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
    /// Completion length in tokens.
    pub tokens: usize,
    /// The completion's token ids where the target returns them (a local model); empty from an
    /// endpoint, which answers with text.
    pub ids: Vec<u32>,
    /// Generation stopped at the token budget, not at a stop token or string.
    pub truncated: bool,
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
    /// `settings.n` completions of each prompt. Prompt `number` (the item's index) selects the
    /// random streams with `settings.seed`, so batching does not change what an item gets.
    fn generate(
        &self,
        prompts: &[GenerateRequest],
        settings: &GenerationFile,
    ) -> Result<Vec<Vec<Sample>>, TargetError>;
}

/// One prompt to complete.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerateRequest {
    pub ids: Vec<u32>,
    /// The item's number: with the task's seed, what its samples depend on.
    pub number: u64,
    /// `settings.max_tokens`, or fewer where the context ends first.
    pub max_tokens: usize,
}

fn stop_token_ids(tokenizer: &Tokenizer, model_eos: &[u32]) -> Vec<u32> {
    let mut ids = model_eos.to_vec();
    ids.extend(tokenizer.eos_token_ids());
    ids.sort_unstable();
    ids.dedup();
    ids
}

/// Positions per fused prefill call when scoring (bounds the logits held at once).
const SCORE_CHUNK: usize = 256;

fn argmax(row: &[f32]) -> usize {
    row.iter()
        .enumerate()
        .fold((0usize, f32::NEG_INFINITY), |b, (i, &v)| {
            if v > b.1 { (i, v) } else { b }
        })
        .0
}

/// A model folder evaluated in this process.
pub struct LocalTarget<'m> {
    pub model: &'m Transformer,
    pub tokenizer: Tokenizer,
    pub name: String,
}

/// Log-prob sum and greedy flag of scored tokens, fed one logits row at a time.
struct Tally {
    total: f64,
    greedy: bool,
}

impl Tally {
    fn new() -> Tally {
        Tally {
            total: 0.0,
            greedy: true,
        }
    }

    fn add(&mut self, row: &[f32], next: u32) {
        self.total += f64::from(stoke_rollout::sampling::log_softmax_at(row, next));
        self.greedy &= argmax(row) == next as usize;
    }
}

/// Longest continuation (after the shared prefix) fed token by token in `score_shared`; longer
/// ones are prefilled one sequence at a time.
const SHARED_TAIL_MAX: usize = 32;

impl LocalTarget<'_> {
    fn model_error(e: impl std::fmt::Display) -> TargetError {
        TargetError::Model(e.to_string())
    }

    /// One sequence: the fused prefill into a cache row (the server's path), in chunks, the
    /// head only at the positions that predict a scored token; or the graph path for models
    /// the fused step does not run.
    fn score_one(&self, ids: &[u32], from: usize) -> Result<(f64, bool), TargetError> {
        let mut tally = Tally::new();
        if !self.model.supports_fused_decode() {
            let logits = stoke_rollout::score::full_sequence_logits(self.model, ids, &Device::Cpu)
                .map_err(Self::model_error)?;
            for t in from..ids.len() {
                tally.add(&logits[t - 1], ids[t]);
            }
            return Ok((tally.total, tally.greedy));
        }
        let vocab = self.model.config().vocab_size;
        let mut cache = self.model.new_decode_cache(1, ids.len());
        for start in (0..ids.len()).step_by(SCORE_CHUNK) {
            let end = (start + SCORE_CHUNK).min(ids.len());
            let positions: Vec<u32> = (start as u32..end as u32).collect();
            let wanted: Vec<usize> = (start..end)
                .filter(|&p| p + 1 >= from && p + 1 < ids.len())
                .map(|p| p - start)
                .collect();
            let logits = self
                .model
                .prefill_step(&mut cache, 0, &ids[start..end], &positions, &wanted)
                .map_err(Self::model_error)?;
            for (&offset, row) in wanted.iter().zip(logits.chunks_exact(vocab)) {
                tally.add(row, ids[start + offset + 1]);
            }
        }
        Ok((tally.total, tally.greedy))
    }

    /// Sequences that share a prefix up to their scored part (a multiple-choice item's context
    /// before each choice): the prefix prefilled once, its cache copied to one row per
    /// sequence, the short continuations fed together as decode steps (rows that are done take
    /// a filler token whose logits are ignored). Same kernels as `score_one`, so the same
    /// numbers below the prefill's GEMM threshold. `None` when there is nothing to share.
    fn score_shared(
        &self,
        sequences: &[(Vec<u32>, usize)],
    ) -> Result<Option<Vec<(f64, bool)>>, TargetError> {
        let Some((first, _)) = sequences.first() else {
            return Ok(Some(Vec::new()));
        };
        let common = sequences
            .iter()
            .map(|(ids, _)| first.iter().zip(ids).take_while(|(a, b)| a == b).count())
            .min()
            .unwrap_or(0);
        let min_from = sequences.iter().map(|s| s.1.max(1)).min().unwrap_or(1);
        let shared = common.min(min_from);
        let longest = sequences.iter().map(|s| s.0.len()).max().unwrap_or(0);
        if sequences.len() < 2 || shared == 0 || longest - shared > SHARED_TAIL_MAX {
            return Ok(None);
        }
        let vocab = self.model.config().vocab_size;
        let mut cache = self.model.new_decode_cache(1, longest + 1);
        let mut last = Vec::new();
        for start in (0..shared).step_by(SCORE_CHUNK) {
            let end = (start + SCORE_CHUNK).min(shared);
            let positions: Vec<u32> = (start as u32..end as u32).collect();
            let wanted = if end == shared {
                vec![end - start - 1]
            } else {
                vec![]
            };
            last = self
                .model
                .prefill_step(&mut cache, 0, &first[start..end], &positions, &wanted)
                .map_err(Self::model_error)?;
        }
        let mut tallies: Vec<Tally> = sequences.iter().map(|_| Tally::new()).collect();
        for ((ids, from), tally) in sequences.iter().zip(&mut tallies) {
            if (*from).max(1) == shared && shared < ids.len() {
                tally.add(&last, ids[shared]);
            }
        }
        cache.select_rows(&vec![0; sequences.len()]);
        // Step t feeds position shared + t; its logits predict position shared + t + 1.
        let mut t = 0;
        while sequences.iter().any(|(ids, _)| shared + t + 1 < ids.len()) {
            let q = shared + t;
            let tokens: Vec<u32> = sequences
                .iter()
                .map(|(ids, _)| ids.get(q).copied().unwrap_or(ids[0]))
                .collect();
            let positions = vec![q as u32; sequences.len()];
            let logits = self
                .model
                .decode_step(&mut cache, &tokens, &positions)
                .map_err(Self::model_error)?;
            for (((ids, from), tally), row) in sequences
                .iter()
                .zip(&mut tallies)
                .zip(logits.chunks_exact(vocab))
            {
                if q + 1 < ids.len() && q + 1 >= (*from).max(1) {
                    tally.add(row, ids[q + 1]);
                }
            }
            t += 1;
        }
        Ok(Some(
            tallies.into_iter().map(|t| (t.total, t.greedy)).collect(),
        ))
    }
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
        if self.model.supports_fused_decode()
            && let Some(scores) = self.score_shared(sequences)?
        {
            return Ok(scores);
        }
        sequences
            .iter()
            .map(|(ids, from)| self.score_one(ids, (*from).max(1)))
            .collect()
    }

    fn generate(
        &self,
        prompts: &[GenerateRequest],
        settings: &GenerationFile,
    ) -> Result<Vec<Vec<Sample>>, TargetError> {
        let stop_tokens = stop_token_ids(&self.tokenizer, &self.model.config().eos_token_ids);
        let engine = Engine::new(self.model);
        let mut out = Vec::with_capacity(prompts.len());
        // One engine call per run of consecutive numbers with the same token budget (the
        // engine numbers prompts first_prompt_number + i).
        let mut start = 0;
        while start < prompts.len() {
            let mut end = start + 1;
            while end < prompts.len()
                && prompts[end].number == prompts[end - 1].number + 1
                && prompts[end].max_tokens == prompts[start].max_tokens
            {
                end += 1;
            }
            let params = SamplingParams {
                max_new_tokens: prompts[start].max_tokens,
                temperature: settings.temperature,
                top_k: Some(settings.top_k).filter(|&k| k > 0),
                top_p: settings.top_p,
                seed: settings.seed,
                n: settings.n,
                stop_token_ids: stop_tokens.clone(),
                stop_strings: settings.stop.clone(),
            };
            let mut request = GenerationRequest::new(
                prompts[start..end].iter().map(|p| p.ids.clone()).collect(),
                params,
            );
            request.first_prompt_number = prompts[start].number;
            let output = engine
                .generate(&request, Some(&self.tokenizer as &dyn Detokenizer))
                .map_err(Self::model_error)?;
            for completions in output.completions {
                out.push(
                    completions
                        .into_iter()
                        .map(|c| {
                            let text = match c.text {
                                Some(text) => text,
                                None => self
                                    .tokenizer
                                    .decode(&c.token_ids, true)
                                    .map_err(Self::model_error)?,
                            };
                            Ok(Sample {
                                text,
                                tokens: c.token_ids.len(),
                                truncated: c.finish_reason == FinishReason::Length,
                                ids: c.token_ids,
                            })
                        })
                        .collect::<Result<Vec<_>, TargetError>>()?,
                );
            }
            start = end;
        }
        Ok(out)
    }
}

/// An OpenAI-compatible server.
pub struct EndpointTarget {
    base: String,
    model: String,
    tokenizer: Tokenizer,
    max_length: usize,
    agent: ureq::Agent,
    timeout: Duration,
    /// Requests in flight at once (`with_concurrency`).
    concurrency: usize,
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
            timeout,
            concurrency: 1,
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

    /// Sends up to `requests` requests at once (at least 1). A server that batches
    /// (`stoke serve`, vLLM) answers them together; results keep the items' order, and each
    /// request carries its own seed, so they do not depend on the setting.
    pub fn with_concurrency(mut self, requests: usize) -> EndpointTarget {
        self.concurrency = requests.max(1);
        self
    }

    /// `work(i)` for every `i < n`, on up to `concurrency` threads, in order; the first error
    /// (by index) if any.
    fn each<T: Send>(
        &self,
        n: usize,
        work: impl Fn(usize) -> Result<T, TargetError> + Sync,
    ) -> Result<Vec<T>, TargetError> {
        let threads = self.concurrency.min(n);
        if threads <= 1 {
            return (0..n).map(work).collect();
        }
        let next = std::sync::atomic::AtomicUsize::new(0);
        let failed = std::sync::atomic::AtomicBool::new(false);
        let mut slots: Vec<Option<Result<T, TargetError>>> = (0..n).map(|_| None).collect();
        let done = std::sync::Mutex::new(Vec::with_capacity(n));
        std::thread::scope(|scope| {
            for _ in 0..threads {
                scope.spawn(|| {
                    loop {
                        // Stop taking new items after a failure; items taken finish.
                        if failed.load(std::sync::atomic::Ordering::Relaxed) {
                            break;
                        }
                        let i = next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        if i >= n {
                            break;
                        }
                        let result = work(i);
                        if result.is_err() {
                            failed.store(true, std::sync::atomic::Ordering::Relaxed);
                        }
                        done.lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner)
                            .push((i, result));
                    }
                });
            }
        });
        for (i, result) in done
            .into_inner()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
        {
            slots[i] = Some(result);
        }
        // In index order: the first error among the items that ran, else every result (no
        // item is skipped without an error before it).
        let mut out = Vec::with_capacity(n);
        for slot in slots {
            match slot {
                Some(Ok(value)) => out.push(value),
                Some(Err(error)) => return Err(error),
                None => break,
            }
        }
        if out.len() < n {
            // Unreachable without a failure (the loop above returned it); kept as an error,
            // never as a short result.
            return Err(self.error("", format!("{} of {n} requests did not run", n - out.len())));
        }
        Ok(out)
    }

    fn error(&self, path: &str, message: String) -> TargetError {
        TargetError::Endpoint {
            url: format!("{}{path}", self.base),
            message,
        }
    }

    fn get(&self, path: &str) -> Result<Value, TargetError> {
        let response = self.agent.get(&format!("{}{path}", self.base)).call();
        self.answer(path, response)
    }

    fn post(&self, path: &str, body: &Value) -> Result<Value, TargetError> {
        let response = self
            .agent
            .post(&format!("{}{path}", self.base))
            .header("Content-Type", "application/json")
            .send(body.to_string());
        self.answer(path, response)
    }

    /// A 200 answer's JSON body; anything else an error naming the URL.
    fn answer(
        &self,
        path: &str,
        response: Result<ureq::http::Response<ureq::Body>, ureq::Error>,
    ) -> Result<Value, TargetError> {
        let transport = |e: ureq::Error| {
            match e {
            ureq::Error::Timeout(_) => self.error(
                path,
                format!(
                    "timed out: no answer within {:.0?} (raise --timeout if the server is only slow)",
                    self.timeout
                ),
            ),
            other => self.error(path, other.to_string()),
        }
        };
        let mut response = response.map_err(transport)?;
        let status = response.status().as_u16();
        let text = response.body_mut().read_to_string().map_err(transport)?;
        if status != 200 {
            return Err(self.error(path, format!("status {status}: {text}")));
        }
        serde_json::from_str(&text).map_err(|e| self.error(path, format!("not JSON ({e}): {text}")))
    }

    /// One prompt's completions; the request's seed is the task's seed plus the item number.
    fn complete(
        &self,
        prompt: &GenerateRequest,
        settings: &GenerationFile,
    ) -> Result<Vec<Sample>, TargetError> {
        let seed = settings.seed.wrapping_add(prompt.number);
        let path = "/v1/completions";
        let mut body = json!({"model": self.model, "prompt": prompt.ids,
            "max_tokens": prompt.max_tokens, "temperature": settings.temperature,
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
                Ok(Sample {
                    text,
                    tokens,
                    ids: Vec::new(),
                    truncated: c["finish_reason"].as_str() == Some("length"),
                })
            })
            .collect()
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
        self.each(sequences.len(), |i| {
            let (ids, from) = &sequences[i];
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
    }

    fn generate(
        &self,
        prompts: &[GenerateRequest],
        settings: &GenerationFile,
    ) -> Result<Vec<Vec<Sample>>, TargetError> {
        self.each(prompts.len(), |i| self.complete(&prompts[i], settings))
    }
}
