//! Generation with live weights (pipeline RL, as in PipelineRL and AReaL): the weights may be
//! replaced while a generation runs, and a sample in progress continues with the newest weights
//! from its next token.
//!
//! What it is: the [`LiveWeights`] seam (whoever publishes weights implements it; the pipeline's
//! weight store does) and the [`LiveGeneration`] record (the engine's output plus the version of
//! every token). The entry point, [`crate::generate_live`], and the loop are the engine's
//! (`engine.rs`), shared with [`crate::Engine::generate`], which is the fixed-weights case; the
//! semantics below are what that loop promises a `LiveWeights`.
//! What it is not: a publisher or a store of weights, nor a policy for when to take new weights
//! (it always takes the newest at each step).
//!
//! Semantics, per step:
//! - [`LiveWeights::current`] is asked once before the prefill and once before every decode step;
//!   all rows of a step use the answer, and every token sampled from that step's logits records
//!   its version.
//! - The KV cache of earlier tokens is kept across a switch, not recomputed: the keys and values
//!   of tokens before the switch come from the older weights, as in PipelineRL's in-flight
//!   updates. The first token of every sample comes from the prefill's weights.
//! - Versions never decrease within a generation, and new weights must have the same config,
//!   device and dtype as the first ones; otherwise the generation fails with
//!   [`crate::RolloutError::LiveWeights`].
//! - Random streams are those of [`crate::Engine::generate`], so with weights that never change
//!   the output is identical to it, bit for bit.

use std::sync::Arc;

use stoke_model::Transformer;

use crate::request::GenerationOutput;

/// A source of the newest weights. Implementations must be cheap to ask (it is asked every
/// decode step) and must never answer with a lower version than before.
pub trait LiveWeights: Sync {
    /// The newest weights and their version.
    fn current(&self) -> (Arc<Transformer>, u64);
}

/// Weights that never change: one model at one version (for callers that hold an
/// `Arc<Transformer>` and want the live API, e.g. to get `token_versions`).
#[derive(Debug, Clone)]
pub struct FixedWeights {
    pub model: Arc<Transformer>,
    pub version: u64,
}

impl LiveWeights for FixedWeights {
    fn current(&self) -> (Arc<Transformer>, u64) {
        (Arc::clone(&self.model), self.version)
    }
}

/// The engine's output plus, per token, the version of the weights that produced it.
#[derive(Debug, Clone, PartialEq)]
pub struct LiveGeneration {
    pub output: GenerationOutput,
    /// `token_versions[prompt][sample][t]`: the version of the weights whose logits token `t` of
    /// that completion was drawn from; same shape as `output.completions[prompt][sample]
    /// .token_ids`, non-decreasing along `t`.
    pub token_versions: Vec<Vec<Vec<u64>>>,
}
