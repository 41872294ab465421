//! The typed request and response of the generation engine.
//!
//! What it is: plain records. A request holds prompts as token ids and one [`SamplingParams`]
//! shared by all of them; a response holds, per prompt, `n` [`Completion`]s. Besides
//! `SamplingParams::validate`, the check of a request's prompts against a model
//! (`check_prompts`) is here, shared by the plain and the speculative loop. What it is not:
//! text handling (prompts are already tokenized; text comes back only when the caller supplies a
//! [`crate::Detokenizer`]).
//!
//! Invariants of a [`Completion`]: `token_ids.len() == logprobs.len()`; `token_ids` includes the
//! final stop token when the sequence ended on one (the model must learn to emit it), `text`
//! never includes it, and `text` ends just before a matched stop string (the stop string itself is
//! NOT included in `text`, while the tokens that produced it ARE in `token_ids`).

use serde::Serialize;
use stoke_model::Transformer;

use crate::error::RolloutError;
use crate::sampling::{SampleStream, SamplingRule};

/// How to sample continuations. `temperature` 0 is greedy decoding.
#[derive(Debug, Clone, PartialEq)]
pub struct SamplingParams {
    /// Upper bound on generated tokens per sample (>= 1).
    pub max_new_tokens: usize,
    pub temperature: f32,
    /// Keep only the k most likely tokens; None (or 0) disables.
    pub top_k: Option<usize>,
    /// Nucleus sampling mass in (0, 1]; 1 disables.
    pub top_p: f32,
    /// Base seed; sample j of prompt i draws from stream (seed, first_prompt_number + i, j).
    pub seed: u64,
    /// Samples per prompt (>= 1). They share one prefill of the prompt.
    pub n: usize,
    /// Token ids that end a sample (typically the model's EOS ids); the id is kept in the output.
    pub stop_token_ids: Vec<u32>,
    /// Strings that end a sample when they appear in its decoded text, also across token
    /// boundaries. Needs a detokenizer.
    pub stop_strings: Vec<String>,
}

impl Default for SamplingParams {
    fn default() -> Self {
        SamplingParams {
            max_new_tokens: 256,
            temperature: 1.0,
            top_k: None,
            top_p: 1.0,
            seed: 0,
            n: 1,
            stop_token_ids: Vec::new(),
            stop_strings: Vec::new(),
        }
    }
}

impl SamplingParams {
    /// Checks every field and returns the per-token sampling rule.
    pub fn validate(&self) -> Result<SamplingRule, RolloutError> {
        if self.max_new_tokens == 0 {
            return Err(RolloutError::InvalidParam {
                field: "max_new_tokens",
                reason: "must be at least 1".into(),
            });
        }
        if self.n == 0 {
            return Err(RolloutError::InvalidParam {
                field: "n",
                reason: "must be at least 1".into(),
            });
        }
        if let Some(index) = self.stop_strings.iter().position(String::is_empty) {
            return Err(RolloutError::InvalidParam {
                field: "stop_strings",
                reason: format!("entry {index} is empty"),
            });
        }
        SamplingRule::new(self.temperature, self.top_k, self.top_p)
    }
}

/// A batch of prompts to continue under one set of sampling parameters.
#[derive(Debug, Clone, PartialEq)]
pub struct GenerationRequest {
    /// Each prompt as token ids; none may be empty.
    pub prompts: Vec<Vec<u32>>,
    pub params: SamplingParams,
    /// The caller's number for `prompts[0]` (prompt i is number `first_prompt_number + i`). It
    /// selects the random streams, so splitting a batch into several requests (or running prompts
    /// one at a time) with matching numbers gives identical samples.
    pub first_prompt_number: u64,
    /// Per prompt, the random streams to draw from instead of the numbering above (multi-turn
    /// episodes: each continuation names its episode's group, sample and turn, whatever other
    /// continuations share the call). None: prompt i is number `first_prompt_number + i`.
    pub streams: Option<Vec<StreamKey>>,
}

/// Which random streams a prompt's samples draw from: sample s of the prompt draws from
/// `SampleStream::for_turn(seed, prompt_number, first_sample + s, turn)`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StreamKey {
    pub prompt_number: u64,
    pub first_sample: u64,
    pub turn: u64,
}

impl GenerationRequest {
    pub fn new(prompts: Vec<Vec<u32>>, params: SamplingParams) -> Self {
        GenerationRequest {
            prompts,
            params,
            first_prompt_number: 0,
            streams: None,
        }
    }

    /// The random stream of sample `sample` of prompt `prompt_index`.
    pub fn stream(&self, prompt_index: usize, sample: usize) -> SampleStream {
        match self
            .streams
            .as_ref()
            .and_then(|keys| keys.get(prompt_index))
        {
            Some(key) => SampleStream::for_turn(
                self.params.seed,
                key.prompt_number,
                key.first_sample + sample as u64,
                key.turn,
            ),
            None => SampleStream::new(
                self.params.seed,
                self.first_prompt_number + prompt_index as u64,
                sample as u64,
            ),
        }
    }

    /// Fails when `streams` is given with a length other than the prompts'.
    pub(crate) fn check_streams(&self) -> Result<(), RolloutError> {
        match &self.streams {
            Some(keys) if keys.len() != self.prompts.len() => Err(RolloutError::InvalidParam {
                field: "streams",
                reason: format!(
                    "{} stream keys for {} prompts",
                    keys.len(),
                    self.prompts.len()
                ),
            }),
            _ => Ok(()),
        }
    }
}

/// Why a sample stopped.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum FinishReason {
    /// The last generated token is one of `stop_token_ids`.
    Eos { token_id: u32 },
    /// `stop` appeared in the decoded text; the text is cut just before it.
    StopString { stop: String },
    /// `max_new_tokens` were generated.
    Length,
}

/// One sampled continuation of one prompt.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Completion {
    /// Index of the prompt in the request.
    pub prompt_index: usize,
    /// Which of the `n` samples of that prompt this is.
    pub sample_index: usize,
    pub token_ids: Vec<u32>,
    /// `logprobs[t]` is the log-probability of `token_ids[t]` under the distribution it was drawn
    /// from (after temperature, top-k, top-p and renormalization; for greedy decoding, under the
    /// unmodified model distribution; see `sampling`).
    pub logprobs: Vec<f32>,
    /// The decoded continuation, present when the engine was given a detokenizer.
    pub text: Option<String>,
    pub finish_reason: FinishReason,
}

/// The engine's answer: `completions[i]` holds the `n` samples of prompt i, in sample order.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct GenerationOutput {
    pub completions: Vec<Vec<Completion>>,
    /// Prompt tokens processed by the prefill (each prompt once, whatever `n` is).
    pub prefill_tokens: usize,
    /// Tokens sampled over all completions.
    pub generated_tokens: usize,
    /// The largest KV cache the call held (bytes): the prefill's, then the decode cache.
    pub kv_cache_bytes: usize,
}

/// Fails on a request without prompts, or a prompt that is empty, holds an id outside the
/// model's vocabulary or leaves no room below `max_position_embeddings`.
pub(crate) fn check_prompts(model: &Transformer, prompts: &[Vec<u32>]) -> Result<(), RolloutError> {
    let config = model.config();
    if prompts.is_empty() {
        return Err(RolloutError::InvalidParam {
            field: "prompts",
            reason: "the request has no prompts".into(),
        });
    }
    for (prompt_index, prompt) in prompts.iter().enumerate() {
        if prompt.is_empty() {
            return Err(RolloutError::InvalidPrompt {
                prompt_index,
                reason: "is empty (a prompt needs at least one token, e.g. BOS)".into(),
            });
        }
        if let Some(&id) = prompt.iter().find(|&&id| id as usize >= config.vocab_size) {
            return Err(RolloutError::InvalidPrompt {
                prompt_index,
                reason: format!(
                    "token id {id} is outside the vocabulary (size {})",
                    config.vocab_size
                ),
            });
        }
        if prompt.len() >= config.max_position_embeddings {
            return Err(RolloutError::InvalidPrompt {
                prompt_index,
                reason: format!(
                    "has {} tokens, leaving no room below max_position_embeddings = {}",
                    prompt.len(),
                    config.max_position_embeddings
                ),
            });
        }
    }
    Ok(())
}
