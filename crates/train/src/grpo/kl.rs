//! KL divergence to the reference policy, estimated per token from log-probabilities of the
//! tokens the rollout sampled (Schulman, "Approximating KL Divergence", 2020).
//!
//! With `log_r = ref_logprob - current_logprob` (so `r = p_ref / p_current` for a token drawn from
//! the current policy), the estimators of `KL(current || ref)` are
//! - k1 = `-log_r` (unbiased, high variance, can be negative);
//! - k2 = `log_r^2 / 2` (biased, low variance, always >= 0);
//! - k3 = `(r - 1) - log_r = exp(log_r) - log_r - 1` (unbiased, low variance, always >= 0);
//!   the one GRPO (DeepSeekMath) and TRL use.
//!
//! What this is not: no reference model is run here; the reference log-probs arrive as a tensor.
//! The penalty is added to the per-token loss (`loss += beta * k`) before aggregation, as TRL
//! does; the result stays differentiable w.r.t. the current log-probs.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};

use super::GrpoError;

/// Which per-token KL estimator. Default: k3.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlEstimator {
    K1,
    K2,
    #[default]
    K3,
}

impl KlEstimator {
    /// Per-token estimate, same shape as the inputs.
    pub fn per_token(
        &self,
        current_logprobs: &Tensor,
        ref_logprobs: &Tensor,
    ) -> Result<Tensor, GrpoError> {
        let log_r = (ref_logprobs - current_logprobs)?;
        let k = match self {
            KlEstimator::K1 => log_r.neg()?,
            KlEstimator::K2 => (log_r.sqr()? * 0.5)?,
            KlEstimator::K3 => ((log_r.exp()? - &log_r)? - 1.0)?,
        };
        Ok(k)
    }
}

/// The KL term of the loss: `beta * estimator(current, ref)` per token. `beta = 0` (the default)
/// means no term at all, and then the reference model need not be loaded.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct KlPenalty {
    pub estimator: KlEstimator,
    /// Coefficient, finite and > 0 (a zero coefficient is expressed as no `KlPenalty`).
    pub beta: f64,
}

impl KlPenalty {
    /// `None` for `beta == 0`; an error for a negative or non-finite `beta`.
    pub fn new(estimator: KlEstimator, beta: f64) -> Result<Option<KlPenalty>, GrpoError> {
        if !(beta.is_finite() && beta >= 0.0) {
            return Err(GrpoError::config(
                "beta",
                format!("must be finite and >= 0, got {beta}"),
            ));
        }
        Ok((beta > 0.0).then_some(KlPenalty { estimator, beta }))
    }
}
