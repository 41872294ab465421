//! AdamW (Loshchilov & Hutter): Adam moments with decoupled weight decay, one parameter at a time.
//!
//! What it is: the configuration record `AdamWConfig`, the per-parameter state (first and second
//! moments, f32, same length as the parameter) and the fused update, written to follow
//! `torch.optim.AdamW`'s single-tensor path operation by operation (so the golden fixture from
//! PyTorch matches to f32 rounding):
//!
//! ```text
//! p  <- p * (1 - lr * wd)
//! m  <- m + (1 - beta1) * (g - m)                 (torch: exp_avg.lerp_(g, 1 - beta1))
//! v  <- v * beta2 + (1 - beta2) * g * g
//! p  <- p - lr / (1 - beta1^t) * m / (sqrt(v) / sqrt(1 - beta2^t) + eps)
//! ```
//! What it is not: the owner of step counts or parameter groups (`optimizer.rs` decides which
//! parameters get weight decay and counts steps), nor of state files (`state.rs`).
//! Invariant: scalars are computed in f64 and rounded to f32 once, as PyTorch does with Python
//! floats; all per-element arithmetic is f32.

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use crate::error::OptimError;
use crate::inplace::CHUNK;

/// AdamW hyperparameters (file format and runtime record; `validate` checks ranges).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AdamWConfig {
    /// Peak learning rate (the schedule's factor multiplies it).
    pub lr: f64,
    pub beta1: f64,
    pub beta2: f64,
    pub eps: f64,
    /// Decoupled weight decay, applied as `p *= 1 - lr * weight_decay` (only to parameter kinds
    /// that take it, see `ParamKind::takes_weight_decay`).
    pub weight_decay: f64,
    /// How the two moments are stored: "f32" (default, PyTorch's AdamW exactly) or "int8"
    /// (8-bit blockwise floats with stochastic rounding, a quarter of the memory; see
    /// `quantized.rs`).
    #[serde(default, skip_serializing_if = "MomentFormat::is_f32")]
    pub moments: MomentFormat,
}

/// The storage of AdamW's moments.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MomentFormat {
    #[default]
    F32,
    Int8,
}

impl MomentFormat {
    pub fn is_f32(&self) -> bool {
        *self == MomentFormat::F32
    }
}

impl Default for AdamWConfig {
    /// The GPT-3 / Llama recipe: betas (0.9, 0.95), eps 1e-8, weight decay 0.1; lr 6e-4 is
    /// GPT-3 Small's (125M) peak, a reasonable start for the small models stoke trains on CPU.
    fn default() -> Self {
        AdamWConfig {
            lr: 6e-4,
            beta1: 0.9,
            beta2: 0.95,
            eps: 1e-8,
            weight_decay: 0.1,
            moments: MomentFormat::F32,
        }
    }
}

impl AdamWConfig {
    /// Checks every field's range; `prefix` names where the record sits (e.g. `muon.adamw`).
    pub fn validate(&self, prefix: &str) -> Result<(), OptimError> {
        check_range(
            prefix,
            "lr",
            self.lr,
            0.0,
            f64::INFINITY,
            "a finite number >= 0",
        )?;
        check_range(prefix, "beta1", self.beta1, 0.0, 1.0, "in [0, 1)")?;
        check_range(prefix, "beta2", self.beta2, 0.0, 1.0, "in [0, 1)")?;
        if !(self.eps.is_finite() && self.eps > 0.0) {
            return Err(invalid(prefix, "eps", self.eps, "a finite number > 0"));
        }
        check_range(
            prefix,
            "weight_decay",
            self.weight_decay,
            0.0,
            f64::INFINITY,
            ">= 0",
        )
    }
}

/// `lo <= value < hi` and finite, else an `InvalidConfig` naming `prefix.field`.
pub(crate) fn check_range(
    prefix: &str,
    field: &str,
    value: f64,
    lo: f64,
    hi: f64,
    expected: &str,
) -> Result<(), OptimError> {
    if value.is_finite() && value >= lo && value < hi {
        Ok(())
    } else {
        Err(invalid(prefix, field, value, expected))
    }
}

pub(crate) fn invalid(prefix: &str, field: &str, value: f64, expected: &str) -> OptimError {
    let field = if prefix.is_empty() {
        field.to_string()
    } else {
        format!("{prefix}.{field}")
    };
    OptimError::InvalidConfig {
        field,
        reason: format!("{value} is not {expected}"),
    }
}

/// One parameter's AdamW moments (f32, zero-initialised like PyTorch's lazily created state).
#[derive(Clone, Debug, PartialEq)]
pub(crate) struct AdamWState {
    pub exp_avg: Vec<f32>,
    pub exp_avg_sq: Vec<f32>,
}

impl AdamWState {
    pub fn zeros(len: usize) -> Self {
        AdamWState {
            exp_avg: vec![0.0; len],
            exp_avg_sq: vec![0.0; len],
        }
    }
}

/// The f32 scalars of one AdamW update, derived from the config, the scheduled lr, the weight
/// decay that applies to this parameter and the 1-based step number.
#[derive(Clone, Copy, Debug)]
pub(crate) struct AdamWScalars {
    pub decay: f32,
    pub one_minus_beta1: f32,
    pub beta2: f32,
    pub one_minus_beta2: f32,
    pub step_size: f32,
    pub bias_correction2_sqrt: f32,
    pub eps: f32,
}

impl AdamWScalars {
    pub fn new(config: &AdamWConfig, lr: f64, weight_decay: f64, step: u64) -> Self {
        let t = step as f64;
        let bias_correction1 = 1.0 - config.beta1.powf(t);
        let bias_correction2 = 1.0 - config.beta2.powf(t);
        AdamWScalars {
            decay: (1.0 - lr * weight_decay) as f32,
            one_minus_beta1: (1.0 - config.beta1) as f32,
            beta2: config.beta2 as f32,
            one_minus_beta2: (1.0 - config.beta2) as f32,
            step_size: (lr / bias_correction1) as f32,
            bias_correction2_sqrt: bias_correction2.sqrt() as f32,
            eps: config.eps as f32,
        }
    }
}

/// One fused AdamW update of `param` from `grad`, parallel over chunks.
pub(crate) fn adamw_update(
    param: &mut [f32],
    grad: &[f32],
    state: &mut AdamWState,
    s: &AdamWScalars,
) {
    let s = *s;
    param
        .par_chunks_mut(CHUNK)
        .zip(grad.par_chunks(CHUNK))
        .zip(state.exp_avg.par_chunks_mut(CHUNK))
        .zip(state.exp_avg_sq.par_chunks_mut(CHUNK))
        .for_each(|(((p, g), m), v)| {
            for (((p, &g), m), v) in p.iter_mut().zip(g).zip(m.iter_mut()).zip(v.iter_mut()) {
                *m += s.one_minus_beta1 * (g - *m);
                *v = *v * s.beta2 + s.one_minus_beta2 * g * g;
                let denom = v.sqrt() / s.bias_correction2_sqrt + s.eps;
                *p = *p * s.decay - s.step_size * (*m / denom);
            }
        });
}
