//! What one forward pass shares across its layers (`ForwardContext`: the config, the RoPE
//! tables, the attention biases, the record sinks, the precision) and what a recorded pass
//! returns (`Record`, `ForwardRecord`).
//!
//! What it is not: state kept between passes. A context is built per pass by `forward` /
//! `mtp_hidden` and dropped with it; the KV cache is the caller's.
//!
//! Invariants: the context is immutable once built except its record sinks (mutexes), so the
//! checkpointed blocks can share it and recompute in the backward pass; `cos`/`sin` and the
//! biases are in the model's dtype on its device.

use crate::config::ModelConfig;
use crate::moe::Routing;
use candle_core::Tensor;
use std::sync::Arc;
use stoke_ops::Precision;

/// Shapes and constants every layer needs during a forward pass (shared by the checkpointed
/// blocks, which recompute in the backward pass).
pub(super) struct ForwardContext {
    pub(super) config: Arc<ModelConfig>,
    pub(super) cos: Tensor,
    pub(super) sin: Tensor,
    /// cos and sin of the sliding-window layers' own RoPE (Gemma 3), when it differs.
    pub(super) local_cos_sin: Option<(Tensor, Tensor)>,
    pub(super) bias: Tensor,
    /// `bias` plus the sliding window's mask, over the same keys (models with sliding layers).
    pub(super) window_bias: Option<Tensor>,
    /// Where MoE layers record what they routed, when the caller asked (`forward_hidden_routed`).
    pub(super) routings: Option<std::sync::Mutex<Vec<Routing>>>,
    /// Where attention layers record each query head's largest logit, when asked
    /// (`forward_hidden_recorded`, MuonClip).
    pub(super) max_logits: Option<std::sync::Mutex<LayerLogits>>,
    pub(super) precision: Precision,
    /// Subtracted from a layer's index to find its slot in the cache (the MTP modules' blocks,
    /// layers `num_hidden_layers + d`, keep their own cache with slot `d`).
    pub(super) cache_offset: usize,
}

/// Per attention layer: the layer and each query head's largest logit.
pub type LayerLogits = Vec<(usize, Vec<f32>)>;

/// What `forward_hidden_recorded` records.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Record {
    /// The MoE layers' routing.
    pub routing: bool,
    /// Each attention layer's per-query-head largest logit.
    pub max_logits: bool,
}

/// What a recorded forward pass saw.
#[derive(Debug, Clone, Default)]
pub struct ForwardRecord {
    pub routings: Vec<Routing>,
    /// Per attention layer (in order): the layer and each query head's largest logit.
    pub max_logits: Vec<(usize, Vec<f32>)>,
}
