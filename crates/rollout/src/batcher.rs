//! Continuous batching: independent requests share the decode steps of one model. Sequences
//! join the running batch when their prompt is prefilled and leave it when they finish, between
//! any two steps (what a server needs; [`crate::Engine::generate`] runs one request at a time).
//!
//! What it is: a synchronous scheduler ([`Batcher`]) that owns the KV cache of every running
//! sequence and advances everything by one [`Batcher::step`]: admit waiting requests, prefill
//! under a token budget, one fused decode step of every running sequence, and report each new
//! token to the request's [`EventSink`] as it is sampled (streaming falls out of this).
//! What it is not: a thread, a queue with back-pressure, or a protocol; the caller (`stoke
//! serve`'s worker) drives `step` in a loop and turns events into responses.
//!
//! Policies:
//! - **Admission** (first come, first served): a request is admitted when its sequences fit in
//!   `max_running` and its worst-case KV cache, `n x (prompt + max_new_tokens)` slots (capped at
//!   the context), fits in what is left of `kv_budget_bytes`. Memory is reserved for the worst
//!   case, so a running sequence never has to be evicted; a request whose worst case exceeds the
//!   whole budget is refused by [`Batcher::submit`]. A request that does not fit waits, and
//!   those behind it wait too (no overtaking, so a large request is never starved).
//! - **Chunked prefill**: a prompt is prefilled in chunks of `prefill_chunk` tokens, and at most
//!   about `prefill_budget` prompt tokens are prefilled per step (at least one chunk when any
//!   request waits), so a long prompt does not stall the running sequences for its whole length.
//!   Each prompt is prefilled on its own, straight into its cache row, by the fused step's
//!   prefill (`Transformer::prefill_step`), at chunk boundaries that depend on its length alone.
//! - **Batch invariance**: a sequence's tokens depend only on its own prompt, parameters and
//!   random stream (`SampleStream(seed, prompt_number, sample)`), never on what else shares its
//!   steps: its prefill runs alone, and every product of a decode step computes each output from
//!   its own row in a fixed order (`stoke_ops::matvec`), whatever the batch.
//! - The `n` samples of a request share one prefill (its KV rows are copied).
//! - Weights may be swapped between steps ([`Batcher::set_weights`]); every token reports the
//!   version that produced it, and sequences in flight continue on their cache (as
//!   [`crate::live`]).
//! - A request whose sink is closed (the client went away) is cancelled at the next step and its
//!   memory released.

use std::collections::{HashMap, VecDeque};
use std::sync::Arc;

use stoke_model::{DecodeCache, Transformer};

use crate::error::RolloutError;
use crate::request::{FinishReason, SamplingParams};
use crate::sampling::{
    LogprobMode, SampleStream, SampledToken, SamplingRule, log_softmax_at, logprob_in_mode,
    rank_of, sample, top_logprobs,
};
use crate::stop::{Detokenizer, StopCriteria};

/// Limits of a [`Batcher`].
#[derive(Debug, Clone, PartialEq)]
pub struct BatchLimits {
    /// Sequences decoded together at most.
    pub max_running: usize,
    /// Bytes of KV cache the running and prefilling sequences may reserve together.
    pub kv_budget_bytes: usize,
    /// Prompt tokens per prefill chunk.
    pub prefill_chunk: usize,
    /// Prompt tokens prefilled per step (at least one chunk runs when a prompt waits).
    pub prefill_budget: usize,
    /// Longest sequence (prompt + generated) a request may reach; at most the model's
    /// `max_position_embeddings`.
    pub max_model_len: usize,
}

impl BatchLimits {
    /// Defaults for `model`: 256 sequences, 4 GiB of KV cache, chunks of 512 tokens, 2048
    /// prompt tokens per step, the model's whole context.
    pub fn for_model(model: &Transformer) -> BatchLimits {
        BatchLimits {
            max_running: 256,
            kv_budget_bytes: 4 << 30,
            prefill_chunk: 512,
            prefill_budget: 2048,
            max_model_len: model.config().max_position_embeddings,
        }
    }
}

/// What log-probabilities a request wants back.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct LogprobRequest {
    /// Top-N alternatives of every generated token (the token itself is always reported).
    pub top: usize,
    /// The distribution generated tokens' log-probs come from.
    pub mode: LogprobMode,
    /// Log-probs of the prompt's tokens (raw model distribution) with this many alternatives,
    /// when `Some`.
    pub prompt: Option<usize>,
}

/// One request: a prompt (token ids) continued `params.n` times.
#[derive(Debug, Clone, PartialEq)]
pub struct BatchRequest {
    pub prompt_ids: Vec<u32>,
    pub params: SamplingParams,
    /// Selects the random streams: sample j draws from `SampleStream::for_turn(params.seed,
    /// prompt_number, first_sample + j, turn)`, as prompt `prompt_number` of an engine request
    /// would (with `first_sample` and `turn` 0: `SampleStream(seed, prompt_number, j)`), or turn
    /// `turn` of episode `first_sample` of a multi-turn group (`StreamKey`).
    pub prompt_number: u64,
    pub first_sample: u64,
    pub turn: u64,
    pub logprobs: LogprobRequest,
}

/// A token with its log-probability, rank and alternatives.
#[derive(Debug, Clone, PartialEq)]
pub struct TokenLogprob {
    pub id: u32,
    pub logprob: f32,
    /// 1-based rank in the raw distribution.
    pub rank: usize,
    /// The top alternatives (id, log-prob), best first, as many as asked.
    pub top: Vec<(u32, f32)>,
}

/// What a request hears from the batcher, in order.
#[derive(Debug, Clone, PartialEq)]
pub enum BatchEvent {
    /// The prompt was prefilled. With prompt log-probs asked for, entry i scores prompt token i
    /// (entry 0, the first token, has no context and is `None`).
    Prefilled {
        prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    },
    /// Sample `sample` produced a token under weights `version`.
    Token {
        sample: usize,
        token: TokenLogprob,
        version: u64,
    },
    /// Sample `sample` is done.
    Finished { sample: usize, reason: FinishReason },
    /// The request failed; no more events follow.
    Failed(String),
}

/// Where a request's events go. `send` returns false once nobody listens (the request is then
/// cancelled); `is_closed` lets the batcher notice a departed client before it has news.
pub trait EventSink: Send {
    fn send(&self, event: BatchEvent) -> bool;
    fn is_closed(&self) -> bool;
}

/// A request's number within one batcher.
pub type RequestId = u64;

/// How busy the batcher is (for metrics and admission decisions of the caller).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct BatchLoad {
    /// Requests submitted and not yet admitted.
    pub waiting: usize,
    /// Requests whose prompt is being prefilled.
    pub prefilling: usize,
    /// Sequences in the decode batch.
    pub running: usize,
    /// KV cache bytes reserved by admitted requests.
    pub kv_reserved_bytes: usize,
    /// KV cache bytes held by the decode batch.
    pub kv_held_bytes: usize,
}

/// What one step did.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct StepReport {
    pub prefill_tokens: usize,
    /// Sequences in the decode step (0 when none ran).
    pub decoded: usize,
    pub finished_requests: usize,
    pub cancelled_requests: usize,
}

struct RequestState {
    sink: Box<dyn EventSink>,
    prompt_ids: Vec<u32>,
    rule: SamplingRule,
    stop: StopCriteria,
    n: usize,
    seed: u64,
    prompt_number: u64,
    first_sample: u64,
    turn: u64,
    logprobs: LogprobRequest,
    reserved_bytes: usize,
    /// Whether `reserved_bytes` are counted in the batcher's reservation (admitted).
    admitted: bool,
    /// Sequence capacity in KV slots: prompt + max_new_tokens, capped at the context.
    capacity: usize,
    /// Samples not yet finished.
    live: usize,
}

/// A prompt in chunked prefill.
struct Prefill {
    id: RequestId,
    /// One row, room for the whole sequence; copied `n` times when the prompt is in.
    cache: DecodeCache,
    /// Prompt tokens prefilled so far.
    done: usize,
    prompt_logprobs: Option<Vec<Option<TokenLogprob>>>,
    /// Logits at the last prompt position, once the whole prompt is in.
    last_logits: Option<Vec<f32>>,
}

/// A sequence in the decode batch (row i of the cache is `running[i]`).
struct Running {
    id: RequestId,
    sample: usize,
    stream: SampleStream,
    /// Position at which the newest token is fed.
    next_position: usize,
    token_ids: Vec<u32>,
}

/// The continuous-batching scheduler (see the module doc).
pub struct Batcher {
    model: Arc<Transformer>,
    version: u64,
    detokenizer: Option<Arc<dyn Detokenizer + Send + Sync>>,
    limits: BatchLimits,
    slot_bytes: usize,
    next_id: RequestId,
    requests: HashMap<RequestId, RequestState>,
    waiting: VecDeque<RequestId>,
    prefilling: Vec<Prefill>,
    running: Vec<Running>,
    cache: DecodeCache,
    reserved_bytes: usize,
}

impl std::fmt::Debug for Batcher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Batcher")
            .field("version", &self.version)
            .field("limits", &self.limits)
            .field("load", &self.load())
            .finish_non_exhaustive()
    }
}

impl Batcher {
    /// A batcher over `model` (which must support the fused decode step: f32 CPU weights, or
    /// bf16 with packed weights, and no unmerged LoRA) at weight version `version`.
    pub fn new(
        model: Arc<Transformer>,
        version: u64,
        detokenizer: Option<Arc<dyn Detokenizer + Send + Sync>>,
        limits: BatchLimits,
    ) -> Result<Batcher, RolloutError> {
        check_model(&model)?;
        let c = model.config();
        if limits.max_running == 0 || limits.prefill_chunk == 0 || limits.prefill_budget == 0 {
            return Err(RolloutError::InvalidParam {
                field: "batch limits",
                reason: "max_running, prefill_chunk and prefill_budget must be at least 1".into(),
            });
        }
        if limits.max_model_len < 2 || limits.max_model_len > c.max_position_embeddings {
            return Err(RolloutError::InvalidParam {
                field: "max_model_len",
                reason: format!(
                    "must be between 2 and the model's max_position_embeddings ({}), got {}",
                    c.max_position_embeddings, limits.max_model_len
                ),
            });
        }
        stoke_ops::numerics::init_compute_threads();
        let slot_bytes = c.num_hidden_layers * 2 * c.num_key_value_heads * c.head_dim * 4;
        let cache = model.new_decode_cache(0, 0);
        Ok(Batcher {
            model,
            version,
            detokenizer,
            limits,
            slot_bytes,
            next_id: 0,
            requests: HashMap::new(),
            waiting: VecDeque::new(),
            prefilling: Vec::new(),
            running: Vec::new(),
            cache,
            reserved_bytes: 0,
        })
    }

    pub fn limits(&self) -> &BatchLimits {
        &self.limits
    }

    pub fn model(&self) -> &Arc<Transformer> {
        &self.model
    }

    pub fn version(&self) -> u64 {
        self.version
    }

    /// KV cache bytes of one token slot of one sequence.
    pub fn slot_bytes(&self) -> usize {
        self.slot_bytes
    }

    /// Checks `request` and queues it. Errors name the field at fault; nothing is queued then.
    pub fn submit(
        &mut self,
        request: BatchRequest,
        sink: Box<dyn EventSink>,
    ) -> Result<RequestId, RolloutError> {
        let BatchRequest {
            prompt_ids,
            params,
            prompt_number,
            first_sample,
            turn,
            logprobs,
        } = request;
        let rule = params.validate()?;
        let stop = StopCriteria::new(
            params.stop_token_ids.clone(),
            params.stop_strings.clone(),
            params.max_new_tokens,
            self.detokenizer.is_some(),
        )?;
        let vocab = self.model.config().vocab_size;
        if prompt_ids.is_empty() {
            return Err(RolloutError::InvalidPrompt {
                prompt_index: 0,
                reason: "is empty (a prompt needs at least one token)".into(),
            });
        }
        if let Some(&id) = prompt_ids.iter().find(|&&id| id as usize >= vocab) {
            return Err(RolloutError::InvalidPrompt {
                prompt_index: 0,
                reason: format!("token id {id} is outside the vocabulary (size {vocab})"),
            });
        }
        let max_len = self.limits.max_model_len;
        if prompt_ids.len() >= max_len {
            return Err(RolloutError::InvalidPrompt {
                prompt_index: 0,
                reason: format!(
                    "has {} tokens, leaving no room for a generated token in the context of {max_len}",
                    prompt_ids.len()
                ),
            });
        }
        if params.n > self.limits.max_running {
            return Err(RolloutError::InvalidParam {
                field: "n",
                reason: format!(
                    "{} samples exceed the {} sequences decoded together",
                    params.n, self.limits.max_running
                ),
            });
        }
        let capacity = (prompt_ids.len() + params.max_new_tokens).min(max_len);
        let reserved_bytes = params.n * capacity * self.slot_bytes;
        if reserved_bytes > self.limits.kv_budget_bytes {
            return Err(RolloutError::InvalidParam {
                field: "max_new_tokens",
                reason: format!(
                    "{} samples of up to {capacity} tokens need {} MiB of KV cache; the budget \
                     is {} MiB",
                    params.n,
                    reserved_bytes >> 20,
                    self.limits.kv_budget_bytes >> 20
                ),
            });
        }
        let id = self.next_id;
        self.next_id += 1;
        self.requests.insert(
            id,
            RequestState {
                sink,
                prompt_ids,
                rule,
                stop,
                n: params.n,
                seed: params.seed,
                prompt_number,
                first_sample,
                turn,
                logprobs,
                reserved_bytes,
                admitted: false,
                capacity,
                live: params.n,
            },
        );
        self.waiting.push_back(id);
        Ok(id)
    }

    /// Cancels request `id` wherever it is; its sink hears nothing more.
    pub fn cancel(&mut self, id: RequestId) {
        if let Some(state) = self.requests.remove(&id) {
            self.release(id, &state);
        }
    }

    /// New weights for the next steps (the same config; checked).
    pub fn set_weights(
        &mut self,
        model: Arc<Transformer>,
        version: u64,
    ) -> Result<(), RolloutError> {
        check_model(&model)?;
        if !model.config().same_layout(self.model.config()) {
            return Err(RolloutError::LiveWeights(format!(
                "version {version} has another model config than the served model ({})",
                config_difference(model.config(), self.model.config())
            )));
        }
        self.model = model;
        self.version = version;
        Ok(())
    }

    /// Whether there is nothing to do.
    pub fn is_idle(&self) -> bool {
        self.requests.is_empty()
    }

    pub fn load(&self) -> BatchLoad {
        BatchLoad {
            waiting: self.waiting.len(),
            prefilling: self.prefilling.len(),
            running: self.running.len(),
            kv_reserved_bytes: self.reserved_bytes,
            kv_held_bytes: self.cache.bytes(),
        }
    }

    /// One scheduling step: drop cancelled requests, admit, prefill under the budget, decode
    /// every running sequence once. Errors of one request fail that request (its sink hears
    /// `Failed`); an error of the decode step itself fails every running request.
    pub fn step(&mut self) -> StepReport {
        let mut report = StepReport {
            cancelled_requests: self.reap(),
            ..StepReport::default()
        };
        self.admit();
        report.prefill_tokens = self.prefill();
        report.finished_requests += self.start_prefilled();
        let (decoded, finished) = self.decode();
        report.decoded = decoded;
        report.finished_requests += finished;
        report
    }

    /// Cancels every request whose sink is closed; returns how many. `step` does this first;
    /// call it alone to free a departed client's memory while not stepping (paused).
    pub fn reap(&mut self) -> usize {
        let closed: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, state)| state.sink.is_closed())
            .map(|(&id, _)| id)
            .collect();
        for &id in &closed {
            self.cancel(id);
        }
        closed.len()
    }

    /// Forgets every trace of request `id` (its state already removed).
    fn release(&mut self, id: RequestId, state: &RequestState) {
        if state.admitted {
            self.reserved_bytes -= state.reserved_bytes;
        }
        self.waiting.retain(|&w| w != id);
        self.prefilling.retain(|p| p.id != id);
        let keep: Vec<usize> = (0..self.running.len())
            .filter(|&row| self.running[row].id != id)
            .collect();
        if keep.len() < self.running.len() {
            self.keep_rows(&keep);
        }
    }

    fn keep_rows(&mut self, rows: &[usize]) {
        self.cache.select_rows(rows);
        let mut old: Vec<Option<Running>> = std::mem::take(&mut self.running)
            .into_iter()
            .map(Some)
            .collect();
        self.running = rows
            .iter()
            .map(|&row| old[row].take().expect("rows are kept once each"))
            .collect();
    }

    fn admit(&mut self) {
        let mut sequences = self.running.len()
            + self
                .prefilling
                .iter()
                .map(|p| self.requests[&p.id].n)
                .sum::<usize>();
        while let Some(&id) = self.waiting.front() {
            let Some(state) = self.requests.get_mut(&id) else {
                self.waiting.pop_front();
                continue;
            };
            if sequences + state.n > self.limits.max_running
                || self.reserved_bytes + state.reserved_bytes > self.limits.kv_budget_bytes
            {
                break;
            }
            sequences += state.n;
            state.admitted = true;
            self.reserved_bytes += state.reserved_bytes;
            self.waiting.pop_front();
            let state = &self.requests[&id];
            self.prefilling.push(Prefill {
                id,
                cache: self.model.new_decode_cache(1, state.capacity),
                done: 0,
                prompt_logprobs: state.logprobs.prompt.map(|_| vec![None]),
                last_logits: None,
            });
        }
    }

    /// Prefills chunks, oldest prompt first, until the step's budget is spent. Returns the
    /// prompt tokens prefilled.
    fn prefill(&mut self) -> usize {
        let mut spent = 0;
        let mut failed = Vec::new();
        'prompts: for prefill in &mut self.prefilling {
            let state = &self.requests[&prefill.id];
            let total = state.prompt_ids.len();
            while prefill.done < total {
                let chunk = (total - prefill.done).min(self.limits.prefill_chunk);
                if spent > 0 && spent + chunk > self.limits.prefill_budget {
                    break 'prompts;
                }
                if let Err(error) = prefill_chunk(&self.model, state, prefill, chunk) {
                    failed.push((prefill.id, error.to_string()));
                    continue 'prompts;
                }
                spent += chunk;
            }
        }
        for (id, error) in failed {
            self.fail(id, error);
        }
        spent
    }

    fn fail(&mut self, id: RequestId, error: String) {
        if let Some(state) = self.requests.remove(&id) {
            state.sink.send(BatchEvent::Failed(error));
            self.release(id, &state);
        }
    }

    /// Moves prompts whose prefill is complete into the decode batch: samples every sample's
    /// first token and copies the prompt's KV rows. Returns the requests that finished at once.
    fn start_prefilled(&mut self) -> usize {
        let mut finished = 0;
        let ready: Vec<usize> = (0..self.prefilling.len())
            .filter(|&i| self.prefilling[i].last_logits.is_some())
            .collect();
        for index in ready.into_iter().rev() {
            let prefill = self.prefilling.remove(index);
            let id = prefill.id;
            match self.start_request(prefill) {
                Ok(true) => finished += 1,
                Ok(false) => {}
                Err(error) => self.fail(id, error.to_string()),
            }
        }
        finished
    }

    /// Returns whether the request already finished (every sample done on its first token).
    fn start_request(&mut self, prefill: Prefill) -> Result<bool, RolloutError> {
        let id = prefill.id;
        let Some(logits) = prefill.last_logits.as_deref() else {
            return Ok(false);
        };
        let detokenizer = self.detokenizer.clone();
        let (version, max_positions) = (self.version, self.limits.max_model_len);
        let state = self
            .requests
            .get_mut(&id)
            .expect("a prefilling request has state");
        let mut joining = Vec::new();
        if state.sink.send(BatchEvent::Prefilled {
            prompt_logprobs: prefill.prompt_logprobs.clone(),
        }) {
            let prompt_len = state.prompt_ids.len();
            for sample_index in 0..state.n {
                let mut stream = SampleStream::for_turn(
                    state.seed,
                    state.prompt_number,
                    state.first_sample + sample_index as u64,
                    state.turn,
                );
                let mut token_ids = Vec::new();
                let (token, reason) = advance(
                    state,
                    logits,
                    &mut stream,
                    &mut token_ids,
                    prompt_len,
                    max_positions,
                    detokenizer.as_deref().map(|d| d as &dyn Detokenizer),
                )?;
                let open = state.sink.send(BatchEvent::Token {
                    sample: sample_index,
                    token,
                    version,
                });
                if let Some(reason) = reason {
                    state.sink.send(BatchEvent::Finished {
                        sample: sample_index,
                        reason,
                    });
                    state.live -= 1;
                } else if open {
                    joining.push(Running {
                        id,
                        sample: sample_index,
                        stream,
                        next_position: prompt_len,
                        token_ids,
                    });
                }
            }
        }
        if state.live == 0 || state.sink.is_closed() {
            let done = state.live == 0;
            self.cancel(id);
            return Ok(done);
        }
        let mut rows_cache = prefill.cache;
        rows_cache.select_rows(&vec![0; joining.len()]);
        self.cache
            .append(rows_cache)
            .map_err(RolloutError::LiveWeights)?;
        self.running.extend(joining);
        Ok(false)
    }

    /// One decode step of every running sequence. Returns (sequences decoded, requests finished).
    fn decode(&mut self) -> (usize, usize) {
        let rows = self.running.len();
        if rows == 0 {
            return (0, 0);
        }
        let tokens: Vec<u32> = self
            .running
            .iter()
            .map(|r| *r.token_ids.last().expect("a running sequence has a token"))
            .collect();
        let positions: Vec<u32> = self
            .running
            .iter()
            .map(|r| r.next_position as u32)
            .collect();
        let logits = match self.model.decode_step(&mut self.cache, &tokens, &positions) {
            Ok(logits) => logits,
            Err(error) => {
                let ids: Vec<RequestId> = self.running.iter().map(|r| r.id).collect();
                for id in ids {
                    self.fail(id, format!("decode step: {error}"));
                }
                return (rows, 0);
            }
        };
        let vocab = self.model.config().vocab_size;
        let max_positions = self.limits.max_model_len;
        let detokenizer = self.detokenizer.clone();
        let mut keep = Vec::with_capacity(rows);
        let mut failed = Vec::new();
        let mut finished_requests = 0;
        for (row, running) in self.running.iter_mut().enumerate() {
            let Some(state) = self.requests.get_mut(&running.id) else {
                continue;
            };
            running.next_position += 1;
            let outcome = advance(
                state,
                &logits[row * vocab..(row + 1) * vocab],
                &mut running.stream,
                &mut running.token_ids,
                running.next_position,
                max_positions,
                detokenizer.as_deref().map(|d| d as &dyn Detokenizer),
            );
            let (token, reason) = match outcome {
                Ok(outcome) => outcome,
                Err(error) => {
                    failed.push((running.id, error.to_string()));
                    continue;
                }
            };
            let open = state.sink.send(BatchEvent::Token {
                sample: running.sample,
                token,
                version: self.version,
            });
            match reason {
                Some(reason) => {
                    state.sink.send(BatchEvent::Finished {
                        sample: running.sample,
                        reason,
                    });
                    state.live -= 1;
                    if state.live == 0 {
                        finished_requests += 1;
                    }
                }
                None if open => keep.push(row),
                None => {}
            }
        }
        if keep.len() < rows {
            self.keep_rows(&keep);
        }
        let done: Vec<RequestId> = self
            .requests
            .iter()
            .filter(|(_, s)| s.live == 0)
            .map(|(&id, _)| id)
            .collect();
        for id in done {
            if let Some(state) = self.requests.remove(&id) {
                self.release(id, &state);
            }
        }
        for (id, error) in failed {
            self.fail(id, error);
        }
        (rows, finished_requests)
    }
}

/// The config.json fields in which `new` differs from `old`, for error messages.
fn config_difference(new: &stoke_model::ModelConfig, old: &stoke_model::ModelConfig) -> String {
    let (new, old) = (new.to_hf_json(), old.to_hf_json());
    let fields: Vec<String> = match (new.as_object(), old.as_object()) {
        (Some(new), Some(old)) => new
            .keys()
            .chain(old.keys())
            .filter(|key| new.get(*key) != old.get(*key))
            .map(|key| {
                format!(
                    "{key}: {} instead of {}",
                    new.get(key).map_or("absent".into(), ToString::to_string),
                    old.get(key).map_or("absent".into(), ToString::to_string)
                )
            })
            .collect(),
        _ => Vec::new(),
    };
    if fields.is_empty() {
        "a difference config.json does not show".into()
    } else {
        let mut fields = fields;
        fields.dedup();
        fields.join(", ")
    }
}

fn check_model(model: &Transformer) -> Result<(), RolloutError> {
    if !model.supports_fused_decode() {
        return Err(RolloutError::InvalidParam {
            field: "model",
            reason: "continuous batching needs the fused decode step: f32 CPU weights (or bf16 \
                     with packed weights) and no unmerged LoRA adapters"
                .into(),
        });
    }
    Ok(())
}

/// Runs the next `chunk` prompt tokens of `prefill` through the model (the fused step's
/// prefill, into the request's cache row), scores them when prompt log-probs are wanted, and
/// keeps the last position's logits when the prompt is complete.
fn prefill_chunk(
    model: &Transformer,
    state: &RequestState,
    prefill: &mut Prefill,
    chunk: usize,
) -> Result<(), RolloutError> {
    let past = prefill.done;
    let ids = &state.prompt_ids[past..past + chunk];
    let positions: Vec<u32> = (past as u32..(past + chunk) as u32).collect();
    let total = state.prompt_ids.len();
    let last = past + chunk == total;
    let scoring = prefill.prompt_logprobs.is_some();
    // Logits of every position when the prompt is scored, else of the last one only.
    let wanted: Vec<usize> = if scoring {
        (0..chunk).collect()
    } else if last {
        vec![chunk - 1]
    } else {
        Vec::new()
    };
    let logits = model.prefill_step(&mut prefill.cache, 0, ids, &positions, &wanted)?;
    let vocab = model.config().vocab_size;
    if let (Some(scores), Some(top)) = (prefill.prompt_logprobs.as_mut(), state.logprobs.prompt) {
        // Every position of the chunk predicts the next prompt token (the last one of the
        // prompt predicts the first generated token, scored by sampling instead).
        for (offset, row) in logits.chunks_exact(vocab).enumerate() {
            let position = past + offset;
            if let Some(&next) = state.prompt_ids.get(position + 1) {
                scores.push(Some(TokenLogprob {
                    id: next,
                    logprob: log_softmax_at(row, next),
                    rank: rank_of(row, next),
                    top: top_logprobs(row, &SamplingRule::GREEDY, LogprobMode::Raw, top),
                }));
            }
        }
    }
    if last {
        prefill.last_logits = logits.chunks_exact(vocab).last().map(<[f32]>::to_vec);
    }
    prefill.done += chunk;
    Ok(())
}

/// Samples the next token of a sequence from `logits` and says whether the sequence finished.
/// `fed_position` is the position the sampled token would be fed at.
fn advance(
    state: &RequestState,
    logits: &[f32],
    stream: &mut SampleStream,
    token_ids: &mut Vec<u32>,
    fed_position: usize,
    max_positions: usize,
    detokenizer: Option<&dyn Detokenizer>,
) -> Result<(TokenLogprob, Option<FinishReason>), RolloutError> {
    let sampled: SampledToken = sample(logits, &state.rule, stream)?;
    token_ids.push(sampled.id);
    let mode = state.logprobs.mode;
    let token = TokenLogprob {
        id: sampled.id,
        logprob: logprob_in_mode(logits, &state.rule, mode, sampled),
        rank: rank_of(logits, sampled.id),
        top: top_logprobs(logits, &state.rule, mode, state.logprobs.top),
    };
    let mut reason = state.stop.check(token_ids, detokenizer)?;
    if reason.is_none() && fed_position >= max_positions {
        reason = Some(FinishReason::Length);
    }
    Ok((token, reason))
}
