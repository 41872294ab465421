//! Scoring: the log-probability a model gives each next token of a known sequence (teacher
//! forcing), computed in one forward pass without a KV cache.
//!
//! What it is: the single-sequence scorer behind `stoke score` and the reference the engine's
//! tests compare against. What it is not: the batched reference/old-policy scorer of the RL
//! trainer (that one needs gradients and lives with the objectives).
//!
//! Invariant: `next_token_logprobs(ids)[i] = log softmax(logits at position i)[ids[i + 1]]`, the
//! plain model distribution (no temperature), so the result has `ids.len() - 1` entries.

use candle_core::{DType, Device, Tensor};
use stoke_model::{Transformer, causal_bias};

use crate::error::RolloutError;
use crate::sampling::log_softmax_at;

/// Log p(ids[i+1] | ids[..=i]) for every i. `ids` must be non-empty, inside the vocabulary and
/// no longer than `max_position_embeddings`.
pub fn next_token_logprobs(
    model: &Transformer,
    ids: &[u32],
    device: &Device,
) -> Result<Vec<f32>, RolloutError> {
    let logits = full_sequence_logits(model, ids, device)?;
    Ok(ids
        .windows(2)
        .zip(&logits)
        .map(|(pair, row)| log_softmax_at(row, pair[1]))
        .collect())
}

/// Logits at every position of `ids` (one row per position), from a cache-free forward pass with
/// positions 0..len.
pub fn full_sequence_logits(
    model: &Transformer,
    ids: &[u32],
    device: &Device,
) -> Result<Vec<Vec<f32>>, RolloutError> {
    check_sequence(model, ids)?;
    let len = ids.len();
    let input = Tensor::from_vec(ids.to_vec(), (1, len), device)?;
    let positions = Tensor::from_vec((0..len as u32).collect::<Vec<u32>>(), (1, len), device)?;
    let bias = causal_bias(&[vec![true; len]], len, device)?;
    let logits = model.forward(&input, &positions, &bias, None)?;
    Ok(logits.squeeze(0)?.to_dtype(DType::F32)?.to_vec2::<f32>()?)
}

fn check_sequence(model: &Transformer, ids: &[u32]) -> Result<(), RolloutError> {
    let config = model.config();
    let invalid = |reason: String| RolloutError::InvalidPrompt {
        prompt_index: 0,
        reason,
    };
    if ids.is_empty() {
        return Err(invalid("the sequence is empty".into()));
    }
    if let Some((position, &id)) = ids
        .iter()
        .enumerate()
        .find(|(_, id)| **id as usize >= config.vocab_size)
    {
        return Err(invalid(format!(
            "token id {id} at position {position} is outside the vocabulary (vocab_size = {})",
            config.vocab_size
        )));
    }
    if ids.len() > config.max_position_embeddings {
        return Err(invalid(format!(
            "{} tokens exceed max_position_embeddings = {}",
            ids.len(),
            config.max_position_embeddings
        )));
    }
    Ok(())
}
