//! A decoder layer's feed-forward block: one gated MLP (`down(act(gate(x)) * up(x))`) or a
//! mixture of experts (`MoeBlock`).
//!
//! What it is not: the routing itself (`moe_block`) or the activation (`ops::gated`).
//!
//! Invariants: the output has the input's shape [N, hidden]; only the MoE variant reports a
//! `Routing`.

use super::linear::Linear;
use super::moe_block::MoeBlock;
use super::ops::gated;
use crate::config::Activation;
use crate::moe::Routing;
use candle_core::Tensor;
use stoke_ops::Precision;

/// The feed-forward block: one gated MLP, or a mixture of experts.
#[derive(Debug, Clone)]
pub(crate) enum Mlp {
    SwiGlu {
        gate_proj: Linear,
        up_proj: Linear,
        down_proj: Linear,
    },
    Moe(Box<MoeBlock>),
}

impl Mlp {
    /// `down(act(gate(x)) * up(x))`; SwiGLU through the fused op, the other activations as
    /// candle compositions (their backward passes are candle's).
    /// The MLP's output and, for a mixture of experts, what it routed.
    pub(super) fn forward(
        &self,
        x: &Tensor,
        p: Precision,
        act: Activation,
        layer: usize,
    ) -> candle_core::Result<(Tensor, Option<Routing>)> {
        match self {
            Mlp::SwiGlu {
                gate_proj,
                up_proj,
                down_proj,
            } => {
                let gate = gate_proj.forward(x, p)?;
                let up = up_proj.forward(x, p)?;
                Ok((down_proj.forward(&gated(&gate, &up, act)?, p)?, None))
            }
            Mlp::Moe(block) => {
                let (out, routing) = block.forward(x, p, act, layer)?;
                Ok((out, Some(routing)))
            }
        }
    }

    /// The dense MLP's three projections (`None` for a mixture of experts).
    pub(crate) fn dense(&self) -> Option<(&Linear, &Linear, &Linear)> {
        match self {
            Mlp::SwiGlu {
                gate_proj,
                up_proj,
                down_proj,
            } => Some((gate_proj, up_proj, down_proj)),
            Mlp::Moe(_) => None,
        }
    }
}
