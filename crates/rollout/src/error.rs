//! The one error type of stoke-rollout. Every variant says which request field, prompt or
//! component was wrong, so a caller can print it on one line.

use stoke_model::ModelError;

#[derive(Debug, thiserror::Error)]
pub enum RolloutError {
    #[error("invalid sampling parameter `{field}`: {reason}")]
    InvalidParam { field: &'static str, reason: String },
    #[error("prompt {prompt_index}: {reason}")]
    InvalidPrompt { prompt_index: usize, reason: String },
    #[error("model returned unusable logits: {0}")]
    BadLogits(String),
    #[error("detokenizer failed: {0}")]
    Detokenize(String),
    /// The live weights broke a promise mid-generation: a version went back, or new weights
    /// have another shape than the ones the generation started with.
    #[error("live weights: {0}")]
    LiveWeights(String),
    #[error("model: {0}")]
    Model(#[from] ModelError),
    #[error("tensor operation in the generation engine: {0}")]
    Tensor(#[from] candle_core::Error),
}
