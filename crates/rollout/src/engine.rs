//! The generation engine: batched prefill and KV-cached decoding of many prompts, `n` samples
//! each, with seeded sampling and per-token log-probabilities.
//!
//! What it is: a borrower of a [`Transformer`] that turns a [`GenerationRequest`] into a
//! [`GenerationOutput`]. It holds no state between requests (the KV cache lives for one call).
//! What it is not: a server, a scheduler across requests, or a tokenizer (text goes through the
//! caller's [`Detokenizer`]).
//!
//! How a request runs:
//! 1. Prefill, once per prompt whatever `n` is. A model the fused step runs prefills each prompt
//!    into its own row of a `DecodeCache` (`Transformer::prefill_step`); others take all prompts
//!    in one graph batch, LEFT-padded to the longest (row b's positions start at 0 at its first
//!    real token; padded key slots are masked with `causal_bias(key_valid, q_len)`).
//! 2. Fan-out: each prompt's cache row is replicated `n` times, so the `n` samples of a prompt
//!    (a GRPO group) share the prefill.
//! 3. Decode: one token per live row per step. When rows finish, the cache is compacted to the
//!    live rows, so finished samples cost nothing afterwards. A model that supports it
//!    (`Transformer::supports_fused_decode`: f32 weights, or bf16 with packed weights, no
//!    unmerged LoRA) decodes through the fused step (`Transformer::decode_step`) on a
//!    preallocated `DecodeCache` filled from the prefill's cache; others through `forward` with
//!    the graph's `KvCache` (`STOKE_DECODE=graph` forces that). Both give the same logits up to
//!    f32 summation order.
//!
//! Weights: [`Engine::generate`] uses one borrowed model throughout. [`generate_live`]
//! runs the same loop but asks a [`LiveWeights`] for the newest weights before the prefill and
//! before every decode step (pipeline RL): a sample in progress continues with new weights from
//! its next token, on the KV cache its earlier tokens built under older weights, and every token
//! records the version that produced it. Both paths run `generate_with`, so with weights that
//! never change they give identical results.
//!
//! Invariants:
//! - Sample j of prompt i draws from `SampleStream(seed, first_prompt_number + i, j)` only, so its
//!   tokens do not depend on which other prompts share the batch; batched generation equals
//!   one-by-one generation up to float rounding in the batched matmuls (padding and batch size
//!   change summation blocking, not the maths).
//! - A sample never runs past the model's `max_position_embeddings`: it finishes with `Length`.
//! - Token versions never decrease, and weights that change mid-generation keep the first
//!   weights' config (layers, vocabulary, shapes); either violation is an error, not a guess.

use std::ops::Deref;
use std::sync::Arc;

use candle_core::{DType, Device, IndexOp, Tensor};
use stoke_model::{KvCache, ModelConfig, Transformer, causal_bias};

use crate::error::RolloutError;
use crate::live::{LiveGeneration, LiveWeights};
use crate::request::{
    Completion, FinishReason, GenerationOutput, GenerationRequest, check_prompts,
};
use crate::sampling::{SampleStream, SamplingRule, sample};
use crate::stop::{Detokenizer, StopCriteria};

/// Id written into padded slots. Any valid id works: padded keys are masked and padded queries'
/// outputs are ignored.
const PAD_ID: u32 = 0;

/// Generates with one model. Cheap to build; borrow it for as many requests as you like.
pub struct Engine<'m> {
    model: &'m Transformer,
    device: Device,
}

impl std::fmt::Debug for Engine<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Engine")
            .field("device", &self.device)
            .finish_non_exhaustive()
    }
}

/// The result of prefilling the prompts: one row per prompt.
struct Prefill {
    /// Logits at each prompt's last position.
    last_logits: Vec<Vec<f32>>,
    cache: KvCache,
    /// Which cached key slots are real tokens (false on left padding).
    key_valid: Vec<Vec<bool>>,
}

/// One sample being generated.
struct Sequence {
    prompt_index: usize,
    sample_index: usize,
    stream: SampleStream,
    /// Position of the next token to feed (prompt length + tokens generated so far - 1 for the
    /// newest sampled token, which is fed at this position).
    next_position: usize,
    token_ids: Vec<u32>,
    logprobs: Vec<f32>,
    /// Version of the weights that produced each token.
    token_versions: Vec<u64>,
    finish_reason: Option<FinishReason>,
}

/// Where a generation gets its weights: one borrowed model, or the newest published weights.
#[derive(Clone, Copy)]
pub(crate) enum WeightSource<'w> {
    /// Version 0 throughout.
    Fixed(&'w Transformer),
    Live(&'w dyn LiveWeights),
}

/// The weights of one step: borrowed (fixed) or shared (live; dropped after the step so old
/// weights can be freed while a long generation runs on).
enum StepWeights<'w> {
    Borrowed(&'w Transformer),
    Shared(Arc<Transformer>),
}

impl Deref for StepWeights<'_> {
    type Target = Transformer;
    fn deref(&self) -> &Transformer {
        match self {
            StepWeights::Borrowed(model) => model,
            StepWeights::Shared(model) => model,
        }
    }
}

impl<'w> WeightSource<'w> {
    fn current(&self) -> (StepWeights<'w>, u64) {
        match *self {
            WeightSource::Fixed(model) => (StepWeights::Borrowed(model), 0),
            WeightSource::Live(live) => {
                let (model, version) = live.current();
                (StepWeights::Shared(model), version)
            }
        }
    }
}

/// What every step's weights must share with the weights the generation started with, so the
/// KV cache and the sampled ids stay meaningful. Kept instead of the first weights themselves,
/// which can then be freed once newer ones arrive.
struct WeightLayout {
    config: ModelConfig,
    device: Device,
    dtype: DType,
}

impl WeightLayout {
    fn of(model: &Transformer) -> WeightLayout {
        WeightLayout {
            config: model.config().clone(),
            device: model.device().clone(),
            dtype: model.dtype(),
        }
    }

    /// The weights for the next step, checked against the layout and the previous version.
    fn next_weights<'w>(
        &self,
        source: WeightSource<'w>,
        previous_version: u64,
    ) -> Result<(StepWeights<'w>, u64), RolloutError> {
        let (model, version) = source.current();
        if version < previous_version {
            return Err(RolloutError::LiveWeights(format!(
                "weights went back from version {previous_version} to {version}"
            )));
        }
        if !model.config().same_layout(&self.config) {
            return Err(RolloutError::LiveWeights(format!(
                "version {version} has another model config than the weights the generation \
                 started with (the KV cache cannot carry over)"
            )));
        }
        if !model.device().same_device(&self.device) || model.dtype() != self.dtype {
            return Err(RolloutError::LiveWeights(format!(
                "version {version} is on {:?} as {:?}; the generation started on {:?} as {:?}",
                model.device().location(),
                model.dtype(),
                self.device.location(),
                self.dtype
            )));
        }
        Ok((model, version))
    }
}

impl<'m> Engine<'m> {
    /// Also sets flush-to-zero / denormals-are-zero on this thread and the compute pool
    /// (denormals slow the CPU matmul kernels about tenfold).
    pub fn new(model: &'m Transformer) -> Self {
        stoke_ops::numerics::init_compute_threads();
        Engine {
            model,
            device: model.device().clone(),
        }
    }

    pub fn generate(
        &self,
        request: &GenerationRequest,
        detokenizer: Option<&dyn Detokenizer>,
    ) -> Result<GenerationOutput, RolloutError> {
        let generation = generate_with(WeightSource::Fixed(self.model), request, detokenizer)?;
        Ok(generation.output)
    }

    /// [`Engine::generate`] with self-speculative decoding by the model's first multi-token
    /// prediction module (`crate::speculative`): the same distribution per token and the main
    /// model's log-probabilities, up to two tokens per main-model step. An error for a model
    /// without MTP modules.
    pub fn generate_speculative(
        &self,
        request: &GenerationRequest,
        detokenizer: Option<&dyn Detokenizer>,
    ) -> Result<crate::speculative::SpeculativeOutput, RolloutError> {
        crate::speculative::generate_speculative(self.model, request, detokenizer)
    }
}

/// Generates `request` with the newest weights of `weights` at every step (see `live.rs`).
/// Also sets flush-to-zero / denormals-are-zero on the compute threads, as `Engine::new` does.
pub fn generate_live(
    weights: &dyn LiveWeights,
    request: &GenerationRequest,
    detokenizer: Option<&dyn Detokenizer>,
) -> Result<LiveGeneration, RolloutError> {
    stoke_ops::numerics::init_compute_threads();
    generate_with(WeightSource::Live(weights), request, detokenizer)
}

/// The generation loop behind [`Engine::generate`] and [`generate_live`] (see the
/// module doc). Callers set up the compute threads first.
pub(crate) fn generate_with(
    source: WeightSource<'_>,
    request: &GenerationRequest,
    detokenizer: Option<&dyn Detokenizer>,
) -> Result<LiveGeneration, RolloutError> {
    let params = &request.params;
    let rule = params.validate()?;
    let stop = StopCriteria::new(
        params.stop_token_ids.clone(),
        params.stop_strings.clone(),
        params.max_new_tokens,
        detokenizer.is_some(),
    )?;

    // 1. Prefill every prompt once, under the weights current now.
    let (first, first_version) = source.current();
    check_prompts(&first, &request.prompts)?;
    request.check_streams()?;
    let layout = WeightLayout::of(&first);
    let max_positions = layout.config.max_position_embeddings;
    let device = layout.device.clone();
    // 2. Fan out n samples per prompt (they share its prefill) and draw each sample's first
    // token.
    let n = params.n;
    let fan_out: Vec<usize> = (0..request.prompts.len())
        .flat_map(|i| std::iter::repeat_n(i, n))
        .collect();
    let (prompt_logits, mut caches, mut kv_cache_bytes) =
        if fused_decode_allowed() && first.supports_fused_decode() {
            // Each prompt into its own row by the fused step's prefill (no padding, and a
            // prompt's tokens do not depend on the other prompts of the request).
            let longest = request.prompts.iter().map(Vec::len).max().unwrap_or(0);
            let capacity = longest + params.max_new_tokens.clamp(1, INITIAL_DECODE_SLOTS);
            let mut cache = first.new_decode_cache(request.prompts.len(), capacity);
            let mut logits = Vec::with_capacity(request.prompts.len());
            for (row, prompt) in request.prompts.iter().enumerate() {
                let positions: Vec<u32> = (0..prompt.len() as u32).collect();
                logits.push(first.prefill_step(
                    &mut cache,
                    row,
                    prompt,
                    &positions,
                    &[prompt.len() - 1],
                )?);
            }
            let bytes = cache.bytes();
            cache.select_rows(&fan_out);
            (logits, Caches::Fused(cache), bytes)
        } else {
            let Prefill {
                last_logits,
                cache,
                key_valid,
            } = prefill(&first, &request.prompts)?;
            let bytes = cache.bytes();
            let caches = Caches::Graph {
                cache: if n == 1 {
                    cache
                } else {
                    cache.select_batch(&fan_out)?
                },
                key_valid: fan_out.iter().map(|&i| key_valid[i].clone()).collect(),
            };
            (last_logits, caches, bytes)
        };
    drop(first);
    kv_cache_bytes = kv_cache_bytes.max(caches.bytes());
    let mut sequences: Vec<Sequence> = fan_out
        .iter()
        .enumerate()
        .map(|(row, &prompt_index)| Sequence {
            prompt_index,
            sample_index: row % n,
            stream: request.stream(prompt_index, row % n),
            next_position: request.prompts[prompt_index].len(),
            token_ids: Vec::new(),
            logprobs: Vec::new(),
            token_versions: Vec::new(),
            finish_reason: None,
        })
        .collect();
    for sequence in &mut sequences {
        let logits = &prompt_logits[sequence.prompt_index];
        advance(sequence, logits, &rule, &stop, detokenizer, max_positions)?;
        sequence.token_versions.push(first_version);
    }

    // 3. Decode. `live` maps cache rows to sequences.
    let vocab = layout.config.vocab_size;
    let mut live: Vec<usize> = (0..sequences.len()).collect();
    let mut version = first_version;
    loop {
        let still_live: Vec<usize> = (0..live.len())
            .filter(|&row| sequences[live[row]].finish_reason.is_none())
            .collect();
        if still_live.is_empty() {
            break;
        }
        if still_live.len() < live.len() {
            caches.keep_rows(&still_live)?;
            live = still_live.iter().map(|&row| live[row]).collect();
        }
        let (model, step_version) = layout.next_weights(source, version)?;
        version = step_version;
        let input: Vec<u32> = live
            .iter()
            .map(|&s| *sequences[s].token_ids.last().unwrap_or(&PAD_ID))
            .collect();
        let positions: Vec<u32> = live
            .iter()
            .map(|&s| sequences[s].next_position as u32)
            .collect();
        let logits = caches.step(&model, input, positions, &device)?;
        kv_cache_bytes = kv_cache_bytes.max(caches.bytes());
        drop(model);
        for (row, &s) in live.iter().enumerate() {
            let sequence = &mut sequences[s];
            sequence.next_position += 1;
            advance(
                sequence,
                &logits[row * vocab..(row + 1) * vocab],
                &rule,
                &stop,
                detokenizer,
                max_positions,
            )?;
            sequence.token_versions.push(version);
        }
    }

    // 4. Assemble per-prompt completions in sample order.
    let prefill_tokens = request.prompts.iter().map(Vec::len).sum();
    let generated_tokens = sequences.iter().map(|s| s.token_ids.len()).sum();
    let mut completions: Vec<Vec<Completion>> = vec![Vec::with_capacity(n); request.prompts.len()];
    let mut token_versions: Vec<Vec<Vec<u64>>> = vec![Vec::with_capacity(n); request.prompts.len()];
    for sequence in sequences {
        let finish_reason = sequence.finish_reason.unwrap_or(FinishReason::Length);
        let text = match detokenizer {
            Some(detokenizer) => {
                Some(stop.final_text(&sequence.token_ids, &finish_reason, detokenizer)?)
            }
            None => None,
        };
        token_versions[sequence.prompt_index].push(sequence.token_versions);
        completions[sequence.prompt_index].push(Completion {
            prompt_index: sequence.prompt_index,
            sample_index: sequence.sample_index,
            token_ids: sequence.token_ids,
            logprobs: sequence.logprobs,
            text,
            finish_reason,
        });
    }
    Ok(LiveGeneration {
        output: GenerationOutput {
            completions,
            prefill_tokens,
            generated_tokens,
            kv_cache_bytes,
        },
        token_versions,
    })
}

/// Decode slots the fused cache starts with past the prompt; it doubles when full.
const INITIAL_DECODE_SLOTS: usize = 256;

/// `STOKE_DECODE=graph` keeps decoding on the tensor graph (A/B checks, benchmarks); otherwise a
/// model that supports it (`Transformer::supports_fused_decode`) decodes through the fused step.
fn fused_decode_allowed() -> bool {
    stoke_ops::dispatch::decode_path() == stoke_ops::dispatch::DecodePath::Fused
}

/// The decode loop's KV cache: the fused step's preallocated one, or the graph's.
enum Caches {
    Fused(stoke_model::DecodeCache),
    Graph {
        cache: KvCache,
        /// Which cached key slots are real tokens, per row.
        key_valid: Vec<Vec<bool>>,
    },
}

impl Caches {
    fn bytes(&self) -> usize {
        match self {
            Caches::Fused(cache) => cache.bytes(),
            Caches::Graph { cache, .. } => cache.bytes(),
        }
    }

    /// Keeps rows `rows` (strictly increasing: finished rows are dropped).
    fn keep_rows(&mut self, rows: &[usize]) -> Result<(), RolloutError> {
        match self {
            Caches::Fused(cache) => cache.select_rows(rows),
            Caches::Graph { cache, key_valid } => {
                *cache = cache.select_batch(rows)?;
                *key_valid = rows.iter().map(|&row| key_valid[row].clone()).collect();
            }
        }
        Ok(())
    }

    /// One decode step of every row; the logits, `[rows, vocab]` row-major.
    fn step(
        &mut self,
        model: &Transformer,
        input: Vec<u32>,
        positions: Vec<u32>,
        device: &Device,
    ) -> Result<Vec<f32>, RolloutError> {
        match self {
            Caches::Fused(cache) => {
                if !model.supports_fused_decode() {
                    return Err(RolloutError::LiveWeights(
                        "new weights cannot continue a fused decode (unpacked bf16 weights or \
                         LoRA adapters)"
                            .into(),
                    ));
                }
                if cache.len() == cache.capacity() {
                    cache.reserve(cache.capacity() * 2);
                }
                Ok(model.decode_step(cache, &input, &positions)?)
            }
            Caches::Graph { cache, key_valid } => {
                // A decode step: few rows, no gradient (see `stoke_ops::linear::Decoding`).
                let _decoding = stoke_ops::linear::Decoding::begin();
                let rows = input.len();
                for valid in key_valid.iter_mut() {
                    valid.push(true);
                }
                let input = Tensor::from_vec(input, (rows, 1), device)?;
                let positions = Tensor::from_vec(positions, (rows, 1), device)?;
                let bias = causal_bias(key_valid, 1, device)?;
                let logits = model.forward(&input, &positions, &bias, Some(cache))?;
                Ok(logits
                    .i((.., 0, ..))?
                    .to_dtype(DType::F32)?
                    .flatten_all()?
                    .to_vec1::<f32>()?)
            }
        }
    }
}

/// Samples the next token of `sequence` from `logits` and records whether it finished.
fn advance(
    sequence: &mut Sequence,
    logits: &[f32],
    rule: &SamplingRule,
    stop: &StopCriteria,
    detokenizer: Option<&dyn Detokenizer>,
    max_positions: usize,
) -> Result<(), RolloutError> {
    let token = sample(logits, rule, &mut sequence.stream)?;
    sequence.token_ids.push(token.id);
    sequence.logprobs.push(token.logprob);
    sequence.finish_reason = stop.check(&sequence.token_ids, detokenizer)?;
    // The newest token would be fed at `next_position`; past the model's range it cannot be.
    if sequence.finish_reason.is_none() && sequence.next_position >= max_positions {
        sequence.finish_reason = Some(FinishReason::Length);
    }
    Ok(())
}

/// Runs all prompts through the model once, left-padded. Returns each prompt's last-position
/// logits, the cache (one row per prompt) and the key-validity mask of the cached slots.
fn prefill(model: &Transformer, prompts: &[Vec<u32>]) -> Result<Prefill, RolloutError> {
    let device = model.device();
    let batch = prompts.len();
    let width = prompts.iter().map(Vec::len).max().unwrap_or(0);
    let mut ids = Vec::with_capacity(batch * width);
    let mut positions = Vec::with_capacity(batch * width);
    let mut key_valid = Vec::with_capacity(batch);
    for prompt in prompts {
        let padding = width - prompt.len();
        ids.extend(std::iter::repeat_n(PAD_ID, padding).chain(prompt.iter().copied()));
        positions.extend((0..width).map(|slot| slot.saturating_sub(padding) as u32));
        key_valid.push(
            (0..width)
                .map(|slot| slot >= padding)
                .collect::<Vec<bool>>(),
        );
    }
    let ids = Tensor::from_vec(ids, (batch, width), device)?;
    let positions = Tensor::from_vec(positions, (batch, width), device)?;
    let bias = causal_bias(&key_valid, width, device)?;
    let mut cache = KvCache::new(model.config().num_hidden_layers);
    // Only the last position's logits are needed: the LM head runs on one row per prompt.
    let hidden = model.forward_hidden(&ids, &positions, &bias, Some(&mut cache))?;
    let last_hidden = hidden.i((.., width - 1, ..))?.contiguous()?;
    let last = model
        .lm_logits(&last_hidden)?
        .to_dtype(DType::F32)?
        .to_vec2::<f32>()?;
    Ok(Prefill {
        last_logits: last,
        cache,
        key_valid,
    })
}
