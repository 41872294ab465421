//! Mixture-of-experts routing records and load balancing: what one forward pass routed
//! (`Routing`), the per-expert load and its violation (`ExpertLoad`), HF's auxiliary
//! load-balancing loss, and the two bias rules that balance without a loss term.
//!
//! The bias rules move a per-expert selection bias `b` (added to the router probabilities for
//! the top-k choice only; the gate weights stay the unbiased probabilities, so the bias never
//! enters the gradient):
//! - aux-loss-free (torchtitan's `_update_expert_bias`, DeepSeek-V3 §2.1.2):
//!   `delta_i = coeff * sign(mean(n) - n_i)`, re-centred `delta -= mean(delta)`, `b += delta`;
//! - SMEBU (soft-clamped momentum expert bias updates): the normalized violation
//!   `v_i = (mean(n) - n_i) / mean(n)` is clipped by `f(x) = min(1, max(-1, x))`, scaled by
//!   `lr` and re-centred, `delta_i = lr * (f(v_i) - mean_j f(v_j))`; a momentum buffer smooths
//!   it, `m = beta * m + (1 - beta) * delta`, and `b += m`. Unlike the sign rule, the step
//!   shrinks as the load approaches balance, so the bias stops oscillating around it.
//!
//! Loads are token counts per expert accumulated over the forward passes of one optimizer
//! step (every micro-batch), as torchtitan counts them.

use crate::error::ModelError;
use candle_core::{D, DType, Tensor};

/// What one MoE layer routed in one forward pass: its router logits `[N, E]` (in the autograd
/// graph, for the auxiliary loss), the experts chosen, row-major `[N, k]`, and the layer.
#[derive(Debug, Clone)]
pub struct Routing {
    pub layer: usize,
    pub logits: Tensor,
    pub chosen: Vec<u32>,
    pub top_k: usize,
    /// (token, slot) pairs an expert capacity dropped (0 without a capacity): their token
    /// skipped that expert, and `chosen` still names it.
    pub dropped: u64,
}

impl Routing {
    /// Tokens routed to each of `num_experts` experts (each token counts once per slot).
    pub fn counts(&self, num_experts: usize) -> Vec<u64> {
        let mut counts = vec![0u64; num_experts];
        for &e in &self.chosen {
            if let Some(c) = counts.get_mut(e as usize) {
                *c += 1;
            }
        }
        counts
    }
}

/// HF's auxiliary load-balancing loss (`load_balancing_loss_func`, Switch Transformer eqs. 4-6)
/// over every routed layer: `E * sum_e f_e * P_e`, with `f_e` the slots routed to expert `e`
/// per token and `P_e` the mean router probability of `e`, both pooled over the layers and
/// over the tokens `token_mask` keeps (`[N]`, 1 = a real token; `None`: all). Differentiable
/// through `P` (the counts are constants). The training loss adds `router_aux_loss_coef` times
/// this. Zero routings give a zero loss.
pub fn load_balancing_loss(
    routings: &[Routing],
    num_experts: usize,
    token_mask: Option<&[f32]>,
) -> Result<Option<Tensor>, ModelError> {
    let Some(first) = routings.first() else {
        return Ok(None);
    };
    let device = first.logits.device().clone();
    // f32 as transformers computes it (f64 for f64 models: finite-difference checks).
    let dtype = match first.logits.dtype() {
        DType::F64 => DType::F64,
        _ => DType::F32,
    };
    let mut counts = vec![0f32; num_experts];
    let mut prob_sum: Option<Tensor> = None;
    let mut rows = 0f32;
    for routing in routings {
        let (n, e) = routing.logits.dims2()?;
        if e != num_experts || routing.chosen.len() != n * routing.top_k {
            return Err(ModelError::InvalidArgument(format!(
                "load_balancing_loss: layer {} routed {n} tokens over {e} experts with {} choices \
                 (expected {num_experts} experts, {} choices)",
                routing.layer,
                routing.chosen.len(),
                n * routing.top_k
            )));
        }
        let mask: Vec<f32> = match token_mask {
            Some(m) if m.len() == n => m.to_vec(),
            Some(m) => {
                return Err(ModelError::InvalidArgument(format!(
                    "load_balancing_loss: a token mask of {} entries for {n} tokens",
                    m.len()
                )));
            }
            None => vec![1.0; n],
        };
        for (slot, &expert) in routing.chosen.iter().enumerate() {
            counts[expert as usize] += mask[slot / routing.top_k];
        }
        rows += mask.iter().sum::<f32>();
        let probs = stoke_ops::softmax(&routing.logits.to_dtype(dtype)?, D::Minus1)?;
        let weights = Tensor::from_vec(mask, (n, 1), &device)?.to_dtype(dtype)?;
        let summed = probs.broadcast_mul(&weights)?.sum(0)?;
        prob_sum = Some(match prob_sum {
            Some(total) => (total + summed)?,
            None => summed,
        });
    }
    let Some(prob_sum) = prob_sum else {
        return Ok(None);
    };
    if rows == 0.0 {
        return Ok(None);
    }
    let tokens_per_expert = Tensor::from_vec(
        counts.iter().map(|c| c / rows).collect::<Vec<f32>>(),
        num_experts,
        &device,
    )?
    .to_dtype(dtype)?;
    let loss = (tokens_per_expert * (prob_sum / f64::from(rows))?)?
        .sum_all()?
        .affine(num_experts as f64, 0.0)?;
    Ok(Some(loss))
}

/// Per-expert load of one layer and how far it is from balance.
#[derive(Debug, Clone, PartialEq)]
pub struct ExpertLoad {
    /// Tokens routed to each expert (one per slot).
    pub counts: Vec<u64>,
}

impl ExpertLoad {
    pub fn mean(&self) -> f64 {
        if self.counts.is_empty() {
            return 0.0;
        }
        self.counts.iter().sum::<u64>() as f64 / self.counts.len() as f64
    }

    /// MaxVio (Wang et al., "Auxiliary-loss-free load balancing"): `(max_i n_i - mean) / mean`;
    /// 0 when balanced, `E - 1` when one expert takes every token.
    pub fn max_violation(&self) -> f64 {
        let mean = self.mean();
        if mean == 0.0 {
            return 0.0;
        }
        let max = self.counts.iter().copied().max().unwrap_or(0) as f64;
        (max - mean) / mean
    }

    /// The mean absolute violation, `mean_i |n_i - mean| / mean`.
    pub fn mean_violation(&self) -> f64 {
        let mean = self.mean();
        if mean == 0.0 {
            return 0.0;
        }
        self.counts
            .iter()
            .map(|&n| (n as f64 - mean).abs())
            .sum::<f64>()
            / self.counts.len() as f64
            / mean
    }

    /// Each expert's share of the slots (sums to 1; all 0 without tokens).
    pub fn fractions(&self) -> Vec<f64> {
        let total = self.counts.iter().sum::<u64>() as f64;
        self.counts
            .iter()
            .map(|&n| if total == 0.0 { 0.0 } else { n as f64 / total })
            .collect()
    }
}

/// A rule that moves the selection bias of one layer's experts from its load.
#[derive(Debug, Clone, PartialEq)]
pub enum BiasRule {
    /// torchtitan / DeepSeek-V3: `coeff * sign(mean - n_i)`, re-centred.
    AuxLossFree { coeff: f64 },
    /// SMEBU: clipped normalized violation, re-centred, with momentum (see the module doc).
    Smebu { lr: f64, momentum: f64 },
}

/// One layer's balancing state: its selection bias and, for SMEBU, the momentum buffer.
#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
pub struct BiasState {
    pub bias: Vec<f32>,
    pub momentum: Vec<f64>,
}

impl BiasState {
    pub fn new(num_experts: usize) -> BiasState {
        BiasState {
            bias: vec![0.0; num_experts],
            momentum: vec![0.0; num_experts],
        }
    }

    /// Applies `rule` for one optimizer step with the load `counts` (a layer whose experts
    /// saw no token is left as it is). Returns the change made to the bias.
    pub fn update(&mut self, rule: &BiasRule, counts: &[u64]) -> Vec<f64> {
        let experts = self.bias.len();
        if counts.len() != experts || experts == 0 {
            return vec![0.0; experts];
        }
        let mean = counts.iter().sum::<u64>() as f64 / experts as f64;
        if mean == 0.0 {
            return vec![0.0; experts];
        }
        let centred = |raw: Vec<f64>| -> Vec<f64> {
            let m = raw.iter().sum::<f64>() / raw.len() as f64;
            raw.into_iter().map(|d| d - m).collect()
        };
        let step = match *rule {
            BiasRule::AuxLossFree { coeff } => centred(
                counts
                    .iter()
                    .map(|&n| coeff * sign(mean - n as f64))
                    .collect(),
            ),
            BiasRule::Smebu { lr, momentum } => {
                let delta = centred(
                    counts
                        .iter()
                        .map(|&n| lr * ((mean - n as f64) / mean).clamp(-1.0, 1.0))
                        .collect(),
                );
                for (m, d) in self.momentum.iter_mut().zip(&delta) {
                    *m = momentum * *m + (1.0 - momentum) * d;
                }
                self.momentum.clone()
            }
        };
        for (b, d) in self.bias.iter_mut().zip(&step) {
            *b = (f64::from(*b) + d) as f32;
        }
        step
    }
}

/// torch.sign: -1, 0 or 1.
fn sign(x: f64) -> f64 {
    if x > 0.0 {
        1.0
    } else if x < 0.0 {
        -1.0
    } else {
        0.0
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_aux_loss_free_rule_takes_hand_computed_steps() {
        // Loads 10, 2, 6, 6 (mean 6): signs +-1 for experts 0 and 1, 0 for the balanced two;
        // delta = 0.01 * [-1, 1, 0, 0], already centred.
        let mut state = BiasState::new(4);
        let rule = BiasRule::AuxLossFree { coeff: 0.01 };
        let step = state.update(&rule, &[10, 2, 6, 6]);
        assert_eq!(step, vec![-0.01, 0.01, 0.0, 0.0]);
        // Loads 9, 1, 1, 1 (mean 3): raw [-1, 1, 1, 1] * 0.01, mean 0.005, centred
        // [-0.015, 0.005, 0.005, 0.005].
        let step = state.update(&rule, &[9, 1, 1, 1]);
        let expected = [-0.015, 0.005, 0.005, 0.005];
        for (got, want) in step.iter().zip(expected) {
            assert!((got - want).abs() < 1e-12, "{step:?}");
        }
        let bias: Vec<f64> = state.bias.iter().map(|&b| f64::from(b)).collect();
        for (got, want) in bias.iter().zip([-0.025, 0.015, 0.005, 0.005]) {
            assert!((got - want).abs() < 1e-7, "{bias:?}");
        }
        // The bias stays centred.
        assert!(bias.iter().sum::<f64>().abs() < 1e-7);
    }

    #[test]
    fn smebu_clips_the_violation_and_smooths_with_momentum() {
        let mut state = BiasState::new(4);
        let rule = BiasRule::Smebu {
            lr: 0.1,
            momentum: 0.5,
        };
        // Loads 20, 0, 2, 2 (mean 6): v = [-14/6, 1, 4/6, 4/6] -> clipped [-1, 1, 2/3, 2/3],
        // mean 1/3, centred * 0.1 = [-0.1333.., 0.0666.., 0.0333.., 0.0333..]; momentum
        // 0.5 from 0 halves it.
        let step = state.update(&rule, &[20, 0, 2, 2]);
        let delta = [-4.0 / 30.0, 2.0 / 30.0, 1.0 / 30.0, 1.0 / 30.0];
        for (got, want) in step.iter().zip(delta) {
            assert!((got - 0.5 * want).abs() < 1e-12, "{step:?}");
        }
        // Balanced loads: delta 0, the momentum still moves the bias by half its last step.
        let step = state.update(&rule, &[6, 6, 6, 6]);
        for (got, want) in step.iter().zip(delta) {
            assert!((got - 0.25 * want).abs() < 1e-12, "{step:?}");
        }
        let bias: Vec<f64> = state.bias.iter().map(|&b| f64::from(b)).collect();
        for (got, want) in bias.iter().zip(delta) {
            assert!((got - 0.75 * want).abs() < 1e-7, "{bias:?}");
        }
        // A layer that saw no token keeps its state.
        let before = state.clone();
        assert_eq!(state.update(&rule, &[0, 0, 0, 0]), vec![0.0; 4]);
        assert_eq!(state, before);
    }

    #[test]
    fn violation_statistics() {
        let load = ExpertLoad {
            counts: vec![10, 2, 6, 6],
        };
        assert_eq!(load.mean(), 6.0);
        assert!((load.max_violation() - 4.0 / 6.0).abs() < 1e-12);
        assert!((load.mean_violation() - 8.0 / 4.0 / 6.0).abs() < 1e-12);
        assert_eq!(
            ExpertLoad {
                counts: vec![8, 0, 0, 0]
            }
            .max_violation(),
            3.0
        );
    }
}
