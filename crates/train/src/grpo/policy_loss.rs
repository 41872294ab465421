//! Per-token policy-gradient losses over log-probabilities, as candle tensors differentiable
//! w.r.t. the current policy's log-probs.
//!
//! Inputs: current log-probs `[B, T]`, old (behaviour) log-probs `[B, T]`, advantages `[B]`
//! (one per completion) or `[B, T]` (one per token: on-policy distillation,
//! `opd::token_advantages`), mask `[B, T]` (1 for completion tokens that count). The importance ratio is
//! - token level: `rho_bt = exp(cur_bt - old_bt)`;
//! - sequence level (GSPO, TRL `importance_sampling_level="sequence"`):
//!   `rho_b = exp( sum_t(m_bt (cur_bt - old_bt)) / max(sum_t m_bt, 1) )`, one ratio per
//!   completion (the geometric mean of its token ratios), gradient flowing to every token.
//!
//! Losses (per token, before masking and aggregation):
//! - clipped surrogate (PPO, with DAPO clip-higher): `-min(rho A, clip(rho, 1 - eps_low, 1 + eps_high) A)`;
//!   defaults `eps_low = 0.2`, `eps_high = 0.2` (DAPO uses 0.28); GSPO is this at sequence level
//!   (its paper uses far smaller epsilons, e.g. 3e-4 / 4e-4);
//! - CISPO (MiniMax-M1): `-sg(min(rho, max_ratio)) A log pi_cur`, the clipped IS weight detached,
//!   so every token keeps a gradient; default `max_ratio = 5` (TRL's `epsilon_high` for cispo).
//!
//! Clip fractions follow TRL's metrics: a token (or, at sequence level, a completion) is
//! low-clipped when `rho < 1 - eps_low` and `A < 0`, high-clipped when `rho > 1 + eps_high` and
//! `A > 0` (the cases where the clip removes the gradient); CISPO counts `rho > max_ratio, A > 0`.
//!
//! What this is not: no aggregation (see `aggregation`), no KL, no mismatch correction.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use super::GrpoError;

/// Whether the importance ratio is per token or per completion. Default: token.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RatioLevel {
    #[default]
    Token,
    Sequence,
}

/// The policy loss. Default: clipped surrogate, token level, `eps_low = eps_high = 0.2`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PolicyLoss {
    Clipped {
        #[serde(default = "default_epsilon")]
        epsilon_low: f64,
        #[serde(default = "default_epsilon")]
        epsilon_high: f64,
        #[serde(default)]
        level: RatioLevel,
    },
    Cispo {
        #[serde(default = "default_cispo_max_ratio")]
        max_ratio: f64,
        #[serde(default)]
        level: RatioLevel,
    },
}

fn default_epsilon() -> f64 {
    0.2
}

fn default_cispo_max_ratio() -> f64 {
    5.0
}

impl Default for PolicyLoss {
    fn default() -> Self {
        PolicyLoss::Clipped {
            epsilon_low: default_epsilon(),
            epsilon_high: default_epsilon(),
            level: RatioLevel::Token,
        }
    }
}

/// Fractions of the counted tokens (token level) or completions (sequence level) whose ratio
/// was clipped in the direction that removes the gradient. CISPO reports only `high`.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct ClipFractions {
    pub low: f64,
    pub high: f64,
    /// Low or high.
    pub region: f64,
}

/// The per-token loss `[B, T]` (unmasked; sequence-level values broadcast over `T`) and figures.
#[derive(Debug)]
pub struct PolicyLossOutput {
    pub per_token_loss: Tensor,
    pub clip: ClipFractions,
}

impl PolicyLoss {
    /// GSPO: the clipped surrogate on the sequence-level ratio.
    pub fn gspo(epsilon_low: f64, epsilon_high: f64) -> PolicyLoss {
        PolicyLoss::Clipped {
            epsilon_low,
            epsilon_high,
            level: RatioLevel::Sequence,
        }
    }

    pub fn validate(&self) -> Result<(), GrpoError> {
        match *self {
            PolicyLoss::Clipped {
                epsilon_low,
                epsilon_high,
                ..
            } => {
                if !(epsilon_low.is_finite() && (0.0..1.0).contains(&epsilon_low)) {
                    return Err(GrpoError::config(
                        "policy.epsilon_low",
                        format!("must be in [0, 1), got {epsilon_low}"),
                    ));
                }
                if !(epsilon_high.is_finite() && epsilon_high >= 0.0) {
                    return Err(GrpoError::config(
                        "policy.epsilon_high",
                        format!("must be finite and >= 0, got {epsilon_high}"),
                    ));
                }
            }
            PolicyLoss::Cispo { max_ratio, .. } => {
                if !(max_ratio.is_finite() && max_ratio > 0.0) {
                    return Err(GrpoError::config(
                        "policy.max_ratio",
                        format!("must be finite and > 0, got {max_ratio}"),
                    ));
                }
            }
        }
        Ok(())
    }

    fn level(&self) -> RatioLevel {
        match *self {
            PolicyLoss::Clipped { level, .. } | PolicyLoss::Cispo { level, .. } => level,
        }
    }

    /// The importance ratio: `[B, T]` at token level, `[B, 1]` at sequence level.
    pub fn ratio(
        &self,
        current_logprobs: &Tensor,
        old_logprobs: &Tensor,
        mask: &Tensor,
    ) -> Result<Tensor, GrpoError> {
        let log_ratio = (current_logprobs - old_logprobs)?;
        let log_weight = match self.level() {
            RatioLevel::Token => log_ratio,
            RatioLevel::Sequence => {
                let tokens = mask.sum_keepdim(1)?.clamp(1.0, f64::INFINITY)?;
                ((log_ratio * mask)?.sum_keepdim(1)? / tokens)?
            }
        };
        Ok(log_weight.exp()?)
    }

    /// Per-token loss for `advantages` `[B]` or `[B, T]`; see the module doc for the formulas.
    pub fn per_token(
        &self,
        current_logprobs: &Tensor,
        old_logprobs: &Tensor,
        advantages: &Tensor,
        mask: &Tensor,
    ) -> Result<PolicyLossOutput, GrpoError> {
        let (batch, len) = current_logprobs.dims2()?;
        let ratio = self.ratio(current_logprobs, old_logprobs, mask)?;
        let advantages = match advantages.rank() {
            1 => advantages.unsqueeze(1)?,
            _ => advantages.clone(),
        };
        // Where the clip fractions are counted: tokens at token level, completions at sequence level.
        let count_mask = match self.level() {
            RatioLevel::Token => mask.clone(),
            RatioLevel::Sequence => Tensor::ones((batch, 1), mask.dtype(), mask.device())?,
        };
        let positive = advantages.gt(0.0)?;
        let negative = advantages.lt(0.0)?;
        let (per_token, clip) = match *self {
            PolicyLoss::Clipped {
                epsilon_low,
                epsilon_high,
                ..
            } => {
                let clipped = ratio.clamp(1.0 - epsilon_low, 1.0 + epsilon_high)?;
                let unclipped_term = ratio.broadcast_mul(&advantages)?;
                let clipped_term = clipped.broadcast_mul(&advantages)?;
                let loss = unclipped_term.minimum(&clipped_term)?.neg()?;
                let low = ratio.lt(1.0 - epsilon_low)?.broadcast_mul(&negative)?;
                let high = ratio.gt(1.0 + epsilon_high)?.broadcast_mul(&positive)?;
                let region = (&low + &high)?;
                let clip = ClipFractions {
                    low: masked_fraction(&low, &count_mask)?,
                    high: masked_fraction(&high, &count_mask)?,
                    region: masked_fraction(&region, &count_mask)?,
                };
                (loss, clip)
            }
            PolicyLoss::Cispo { max_ratio, .. } => {
                let weight = ratio.clamp(f64::NEG_INFINITY, max_ratio)?.detach();
                let loss = weight
                    .broadcast_mul(&advantages)?
                    .broadcast_mul(current_logprobs)?
                    .neg()?;
                let high = ratio.gt(max_ratio)?.broadcast_mul(&positive)?;
                let fraction = masked_fraction(&high, &count_mask)?;
                let clip = ClipFractions {
                    low: 0.0,
                    high: fraction,
                    region: fraction,
                };
                (loss, clip)
            }
        };
        let per_token_loss = per_token.broadcast_as((batch, len))?.contiguous()?;
        Ok(PolicyLossOutput {
            per_token_loss,
            clip,
        })
    }
}

/// `sum(flags * mask) / max(sum(mask), 1)` with `flags` a u8 0/1 tensor broadcastable to `mask`.
fn masked_fraction(flags: &Tensor, mask: &Tensor) -> Result<f64, GrpoError> {
    let flags = flags.to_dtype(DType::F64)?;
    let mask = mask.to_dtype(DType::F64)?;
    let hit = flags.broadcast_mul(&mask)?.sum_all()?.to_scalar::<f64>()?;
    let total = mask.sum_all()?.to_scalar::<f64>()?;
    Ok(hit / total.max(1.0))
}
