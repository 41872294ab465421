//! `ParamKind` and `classify`: which optimizer rule a named parameter gets.
//!
//! What it is: a pure function of a Hugging Face parameter name and its shape. Embeddings and the
//! output head are told apart by name, norms and biases by rank (< 2), everything else of rank 2
//! is a hidden weight matrix.
//! What it is not: a place that knows hyperparameters; `optimizer.rs` maps kinds to rules
//! (Muon only for `Matrix`; no weight decay on `Embedding` and `NormOrBias`).
//! Invariant: the decision depends on nothing but `(name, shape)`, so a resumed run classifies
//! every parameter exactly as the run that wrote the checkpoint.

use serde::{Deserialize, Serialize};

/// Which optimizer rule a parameter gets.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ParamKind {
    /// A rank-2 hidden weight (attention and MLP projections): Muon when Muon is chosen.
    Matrix,
    /// The token embedding table (`*embed_tokens*`): AdamW without weight decay.
    Embedding,
    /// The unembedding (`lm_head*`): AdamW with weight decay.
    OutputHead,
    /// Norm weights, biases and any other tensor of rank < 2: AdamW without weight decay.
    NormOrBias,
}

impl ParamKind {
    /// Whether decoupled weight decay applies to this kind (the usual recipe exempts embeddings,
    /// norm gains and biases: decaying them towards zero fights their role).
    pub fn takes_weight_decay(self) -> bool {
        matches!(self, ParamKind::Matrix | ParamKind::OutputHead)
    }
}

/// Decides a parameter's kind from its HF name and shape:
/// `*embed_tokens*` -> Embedding, `lm_head*` -> OutputHead, rank < 2 (norm weights, biases) or a
/// name ending in `.bias` -> NormOrBias, other rank >= 2 -> Matrix (a rank > 2 tensor, absent from the Llama family, is
/// treated by Muon as the matrix `[dim0, product of the rest]`, as Keller Jordan's Muon does
/// for convolution filters).
pub fn classify(name: &str, shape: &[usize]) -> ParamKind {
    let leaf = name.rsplit('.').next().unwrap_or(name);
    let is_lm_head = name.starts_with("lm_head") || name.contains(".lm_head");
    if name.contains("embed_tokens") {
        ParamKind::Embedding
    } else if is_lm_head {
        ParamKind::OutputHead
    } else if shape.len() < 2 || leaf == "bias" {
        ParamKind::NormOrBias
    } else {
        ParamKind::Matrix
    }
}
