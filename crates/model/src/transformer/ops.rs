//! The model's two elementwise conventions over stoke-ops: RMSNorm with the family's weight
//! convention (`w` or Gemma's `1 + w`) and the gated activation `act(gate) * up`.
//!
//! What it is not: a layer (no parameters of its own) or a kernel (stoke-ops has those).
//!
//! Invariants: every path that norms or gates in the op composition (attention, MLP, MoE
//! experts, the decoder layer, the final norm, MTP modules) goes through these two functions,
//! so the families differ in one place.

use crate::config::Activation;
use candle_core::Tensor;
use stoke_ops::{rms_norm, swiglu};

/// RMSNorm with the model's weight convention: `norm(x) * w`, or Gemma's `norm(x) * (1 + w)`
/// (the offset is added in the graph, so the gradient reaches `w`).
pub(crate) fn model_rms_norm(
    x: &Tensor,
    weight: &Tensor,
    eps: f64,
    unit_offset: bool,
) -> candle_core::Result<Tensor> {
    if unit_offset {
        rms_norm(x, &weight.affine(1.0, 1.0)?, eps)
    } else {
        rms_norm(x, weight, eps)
    }
}

/// `act(gate) * up`: SwiGLU through the fused op, the other activations as candle compositions.
pub(super) fn gated(gate: &Tensor, up: &Tensor, act: Activation) -> candle_core::Result<Tensor> {
    match act {
        Activation::Silu => swiglu(gate, up),
        Activation::GeluTanh => gate.gelu()? * up,
        Activation::Gelu => gate.gelu_erf()? * up,
        Activation::Relu2 => gate.relu()?.sqr()? * up,
    }
}
