//! The sparse mixture-of-experts MLP of a decoder layer: the router, the top-k choice (with
//! the selection biases, DeepSeek-V3's group limit and an optional expert capacity), the grouped
//! expert computation, and the shared expert.
//!
//! What it is not: the routing statistics, the load-balancing loss or the bias update rules
//! (those are `crate::moe`, which reads the `Routing` this block returns), nor the checkpoint
//! names of the experts (`crate::hf_names::ExpertNames`).
//!
//! Invariants: routing is computed in f32 and ties go to the lower expert index (and to the
//! lower group under a group limit); the balancing biases shift the choice only, never the
//! weights; every step that carries a gradient is a differentiable candle op.

use super::linear::Linear;
use super::ops::gated;
use crate::config::{Activation, ExpertNaming, RouterScore};
use crate::moe::Routing;
use candle_core::{DType, Tensor};
use std::sync::Arc;
use stoke_ops::Precision;

/// One gated MLP (an expert, or Qwen2-MoE's shared expert).
#[derive(Debug, Clone)]
pub(crate) struct Expert {
    pub(crate) gate: Linear,
    pub(crate) up: Linear,
    pub(crate) down: Linear,
}

impl Expert {
    pub(super) fn forward(
        &self,
        x: &Tensor,
        p: Precision,
        act: Activation,
    ) -> candle_core::Result<Tensor> {
        let gate = self.gate.forward(x, p)?;
        let up = self.up.forward(x, p)?;
        self.down.forward(&gated(&gate, &up, act)?, p)
    }
}

/// A sparse mixture-of-experts MLP (see `MoeConfig`).
///
/// Routing: `softmax(x R^T)` over the experts in f32, the top-k per token (ties to the lower
/// index), their probabilities renormalized when the family does. Expert computation is grouped:
/// the (token, slot) pairs are sorted by expert with a counting sort, each expert runs one matmul
/// chain over its contiguous rows, and an index_select puts the rows back to (token, slot)
/// order, where the routing weights scale them and the k slots are summed. Every step is a
/// differentiable candle op, so gradients reach the router (through the weights) and the experts.
#[derive(Debug, Clone)]
pub(crate) struct MoeBlock {
    pub(crate) router: Tensor,
    pub(crate) router_score: RouterScore,
    /// AFMoE's selection bias from the checkpoint (`mlp.expert_bias`, `[experts]`).
    pub(crate) checkpoint_bias: Option<Tensor>,
    pub(crate) experts: Vec<Expert>,
    /// The shared expert and, for Qwen2-MoE, its sigmoid gate's weight `[1, hidden]`.
    pub(crate) shared: Option<(Expert, Option<Tensor>)>,
    pub(crate) top_k: usize,
    pub(crate) renormalize: bool,
    pub(crate) naming: ExpertNaming,
    /// DeepSeek-V3's group-limited choice.
    pub(crate) group_limit: Option<crate::config::GroupLimit>,
    /// The balancing bias added to the router probabilities for the top-k choice only
    /// (`Transformer::set_expert_bias`); training state, not a checkpoint tensor.
    pub(crate) selection_bias: Option<Arc<[f32]>>,
    /// Expert capacity factor (`Transformer::set_expert_capacity`): each expert takes at most
    /// `ceil(factor * tokens * top_k / experts)` of a forward pass's (token, slot) pairs.
    pub(crate) capacity_factor: Option<f64>,
}

impl MoeBlock {
    /// The block's output for `x` [N, hidden] and what it routed (layer `layer`).
    pub(super) fn forward(
        &self,
        x: &Tensor,
        p: Precision,
        act: Activation,
        layer: usize,
    ) -> candle_core::Result<(Tensor, Routing)> {
        let (n, hidden) = x.dims2()?;
        let experts = self.experts.len();
        let k = self.top_k;
        let logits = x.matmul(&self.router.t()?)?;
        let probs = match self.router_score {
            RouterScore::Softmax => {
                stoke_ops::softmax(&logits.to_dtype(DType::F32)?, candle_core::D::Minus1)?
            }
            RouterScore::Sigmoid { .. } => {
                stoke_ops::logistic::sigmoid(&logits.to_dtype(DType::F32)?)?
            }
        };
        let values: Vec<f32> = probs.flatten_all()?.to_vec1()?;
        let stored_bias: Option<Vec<f32>> = match &self.checkpoint_bias {
            Some(b) => Some(b.to_dtype(DType::F32)?.to_vec1()?),
            None => None,
        };
        let mut chosen = Vec::with_capacity(n * k);
        let mut order: Vec<usize> = Vec::with_capacity(experts);
        // A balancing bias shifts the choice only (the weights below are the unbiased
        // probabilities).
        let mut scores = vec![0f32; experts];
        for row in values.chunks_exact(experts) {
            scores.copy_from_slice(row);
            for bias in [stored_bias.as_deref(), self.selection_bias.as_deref()]
                .into_iter()
                .flatten()
            {
                for (s, &b) in scores.iter_mut().zip(bias) {
                    *s += b;
                }
            }
            if let Some(limit) = self.group_limit {
                mask_weak_groups(&mut scores, limit);
            }
            order.clear();
            order.extend(0..experts);
            order.sort_by(|&a, &b| scores[b].total_cmp(&scores[a]).then(a.cmp(&b)));
            chosen.extend(order[..k].iter().map(|&e| e as u32));
        }
        let index = Tensor::from_vec(chosen.clone(), (n, k), x.device())?;
        let mut weights = probs.gather(&index, 1)?;
        match self.router_score {
            RouterScore::Softmax if self.renormalize => {
                weights = weights.broadcast_div(&weights.sum_keepdim(1)?)?;
            }
            RouterScore::Softmax => {}
            // AfmoeTokenChoiceRouter, DeepseekV3TopkRouter: the chosen sigmoid scores over their
            // sum (+1e-20) with norm_topk_prob, times route_scale (routed_scaling_factor).
            RouterScore::Sigmoid { route_scale } => {
                if self.renormalize {
                    weights = weights.broadcast_div(&(weights.sum_keepdim(1)? + 1e-20)?)?;
                }
                weights = weights.affine(route_scale, 0.0)?;
            }
        }
        let weights = weights.to_dtype(x.dtype())?;
        // With a capacity, pairs are admitted by slot (every token's first choice before any
        // second choice, GShard's priority), then in token order, until the expert is full.
        let mut kept = vec![true; n * k];
        let mut dropped = 0u64;
        if let Some(factor) = self.capacity_factor {
            let capacity = (factor * (n * k) as f64 / experts as f64).ceil() as usize;
            let mut taken = vec![0usize; experts];
            for slot in 0..k {
                for token in 0..n {
                    let pair = token * k + slot;
                    let e = chosen[pair] as usize;
                    if taken[e] < capacity {
                        taken[e] += 1;
                    } else {
                        kept[pair] = false;
                        dropped += 1;
                    }
                }
            }
        }
        // Counting sort of the kept (token, slot) pairs by expert; a dropped pair reads the zero
        // row appended after them.
        let mut counts = vec![0usize; experts];
        for (&e, _) in chosen.iter().zip(&kept).filter(|(_, k)| **k) {
            counts[e as usize] += 1;
        }
        let mut starts = vec![0usize; experts];
        for e in 1..experts {
            starts[e] = starts[e - 1] + counts[e - 1];
        }
        let admitted: usize = counts.iter().sum();
        let mut next = starts.clone();
        let mut tokens = vec![0u32; admitted];
        let mut sorted_row = vec![admitted as u32; n * k];
        for (pair, &e) in chosen.iter().enumerate() {
            if !kept[pair] {
                continue;
            }
            let at = next[e as usize];
            tokens[at] = (pair / k) as u32;
            sorted_row[pair] = at as u32;
            next[e as usize] += 1;
        }
        let gathered = x.index_select(&Tensor::from_vec(tokens, admitted, x.device())?, 0)?;
        let mut outputs = Vec::new();
        for (e, expert) in self.experts.iter().enumerate() {
            if counts[e] > 0 {
                outputs.push(expert.forward(&gathered.narrow(0, starts[e], counts[e])?, p, act)?);
            }
        }
        if dropped > 0 {
            outputs.push(Tensor::zeros((1, hidden), x.dtype(), x.device())?);
        }
        let sorted = Tensor::cat(&outputs, 0)?;
        let per_slot = sorted
            .index_select(&Tensor::from_vec(sorted_row, n * k, x.device())?, 0)?
            .reshape((n, k, hidden))?;
        let mut out = per_slot.broadcast_mul(&weights.unsqueeze(2)?)?.sum(1)?;
        if let Some((shared, gate)) = &self.shared {
            let shared_out = shared.forward(x, p, act)?;
            out = match gate {
                Some(gate) => {
                    let g = stoke_ops::logistic::sigmoid(&x.matmul(&gate.t()?)?)?;
                    (out + shared_out.broadcast_mul(&g)?)?
                }
                None => (out + shared_out)?,
            };
        }
        Ok((
            out,
            Routing {
                layer,
                logits,
                chosen,
                top_k: k,
                dropped,
            },
        ))
    }
}

/// DeepSeek-V3's group limit on one token's choice scores: each group of
/// `experts / groups` is scored by the sum of its two best scores, and every expert outside
/// the `topk_groups` best groups gets -inf (ties to the lower group, as the expert order).
pub(crate) fn mask_weak_groups(scores: &mut [f32], limit: crate::config::GroupLimit) {
    let size = scores.len() / limit.groups;
    let group_score = |g: usize| {
        let (mut first, mut second) = (f32::NEG_INFINITY, f32::NEG_INFINITY);
        for &s in &scores[g * size..(g + 1) * size] {
            if s > first {
                second = first;
                first = s;
            } else if s > second {
                second = s;
            }
        }
        if size == 1 { first } else { first + second }
    };
    let group_scores: Vec<f32> = (0..limit.groups).map(group_score).collect();
    let mut order: Vec<usize> = (0..limit.groups).collect();
    order.sort_by(|&a, &b| group_scores[b].total_cmp(&group_scores[a]).then(a.cmp(&b)));
    for &g in &order[limit.topk_groups..] {
        scores[g * size..(g + 1) * size].fill(f32::NEG_INFINITY);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// DeepSeek-V3's group limit, by hand: groups of 2 scored by their two scores' sum
    /// (1.0, 0.95, 1.0, 0.6); the best 2 (groups 0 and 2) stay, the others are masked.
    #[test]
    fn the_group_limit_keeps_the_best_groups_by_their_top_two_sum() {
        let mut scores = [0.9f32, 0.1, 0.5, 0.45, 0.2, 0.8, 0.3, 0.3];
        let limit = crate::config::GroupLimit {
            groups: 4,
            topk_groups: 2,
        };
        mask_weak_groups(&mut scores, limit);
        let inf = f32::NEG_INFINITY;
        assert_eq!(scores, [0.9, 0.1, inf, inf, 0.2, 0.8, inf, inf]);
        // Groups of 4 scored by their best two only (not the sum of all four).
        let mut scores = [0.5f32, 0.5, 0.0, 0.0, 0.4, 0.4, 0.4, 0.4];
        mask_weak_groups(
            &mut scores,
            crate::config::GroupLimit {
                groups: 2,
                topk_groups: 1,
            },
        );
        assert_eq!(scores, [0.5, 0.5, 0.0, 0.0, inf, inf, inf, inf]);
    }
}
