//! Mismatch correction between the trainer and the rollout engine: the same weights give
//! slightly different log-probs in the two (different kernels, precision, batching), and an
//! asynchronous rollout may lag the trainer. Per token, `w = exp(trainer_logprob - rollout_logprob)`
//! is the importance ratio of the distribution being trained over the one that sampled.
//!
//! - TIS (truncated importance sampling, Yao et al. 2025): weight `min(w, cap)`;
//! - IcePop (Ling team, Ring-1T 2025): weight `w` where `alpha <= w <= beta`, 0 outside (the
//!   token is dropped, not truncated); defaults `alpha = 0.5`, `beta = 5`.
//!
//! TIS's default cap is 2 (the value Yao et al. report). The weights are computed from detached log-probs and multiply the per-token policy loss (TRL's
//! `vllm_importance_sampling_correction` does the same with TIS). [`RatioStats`] describes the
//! raw ratio over the counted tokens: mean, min, max, the fraction the correction changed, and
//! the effective sample size `(sum w)^2 / sum w^2` of the raw ratios (Kish), which equals the
//! token count when trainer and rollout agree and falls as they diverge.
//!
//! What this is not: no log-probs are computed here.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use super::GrpoError;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum MismatchCorrection {
    /// Weights of 1 (the ratio is still measured).
    #[default]
    None,
    Tis {
        #[serde(default = "default_tis_cap")]
        cap: f64,
    },
    IcePop {
        #[serde(default = "default_icepop_alpha")]
        alpha: f64,
        #[serde(default = "default_icepop_beta")]
        beta: f64,
    },
}

fn default_tis_cap() -> f64 {
    2.0
}

fn default_icepop_alpha() -> f64 {
    0.5
}

fn default_icepop_beta() -> f64 {
    5.0
}

/// The raw trainer/rollout ratio over the counted tokens.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct RatioStats {
    pub mean: f64,
    pub min: f64,
    pub max: f64,
    /// Fraction of counted tokens whose weight differs from the raw ratio (truncated or zeroed).
    pub fraction_corrected: f64,
    /// Kish effective sample size `(sum w)^2 / sum w^2` in tokens.
    pub effective_sample_size: f64,
    /// Counted tokens.
    pub tokens: usize,
}

/// Detached per-token weights `[B, T]` and the ratio's figures.
#[derive(Debug)]
pub struct CorrectionOutput {
    pub weights: Tensor,
    pub stats: RatioStats,
}

impl MismatchCorrection {
    pub fn validate(&self) -> Result<(), GrpoError> {
        match *self {
            MismatchCorrection::None => Ok(()),
            MismatchCorrection::Tis { cap } if !(cap.is_finite() && cap > 0.0) => {
                Err(GrpoError::config(
                    "correction.cap",
                    format!("must be finite and > 0, got {cap}"),
                ))
            }
            MismatchCorrection::IcePop { alpha, beta }
                if !(alpha.is_finite() && beta.is_finite() && 0.0 <= alpha && alpha < beta) =>
            {
                Err(GrpoError::config(
                    "correction.alpha/beta",
                    format!("need 0 <= alpha < beta, got [{alpha}, {beta}]"),
                ))
            }
            _ => Ok(()),
        }
    }

    /// Weights from trainer and rollout log-probs `[B, T]` and the 0/1 mask `[B, T]`.
    pub fn weights(
        &self,
        trainer_logprobs: &Tensor,
        rollout_logprobs: &Tensor,
        mask: &Tensor,
    ) -> Result<CorrectionOutput, GrpoError> {
        let ratio = (trainer_logprobs.detach() - rollout_logprobs.detach())?.exp()?;
        let weights = match *self {
            MismatchCorrection::None => ratio.ones_like()?,
            MismatchCorrection::Tis { cap } => ratio.clamp(f64::NEG_INFINITY, cap)?,
            MismatchCorrection::IcePop { alpha, beta } => {
                let inside = (ratio.ge(alpha)? * ratio.le(beta)?)?;
                (inside.to_dtype(ratio.dtype())? * &ratio)?
            }
        };
        let stats = self.stats(&ratio, &weights, mask)?;
        Ok(CorrectionOutput { weights, stats })
    }

    fn stats(
        &self,
        ratio: &Tensor,
        weights: &Tensor,
        mask: &Tensor,
    ) -> Result<RatioStats, GrpoError> {
        let ratio = ratio
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        let weights = weights
            .to_dtype(DType::F64)?
            .flatten_all()?
            .to_vec1::<f64>()?;
        let mask = mask.to_dtype(DType::F64)?.flatten_all()?.to_vec1::<f64>()?;
        let corrects = !matches!(self, MismatchCorrection::None);
        let mut stats = RatioStats {
            min: f64::INFINITY,
            max: f64::NEG_INFINITY,
            ..RatioStats::default()
        };
        let (mut sum, mut sum_sq, mut corrected) = (0.0, 0.0, 0usize);
        for ((&w, &weight), &m) in ratio.iter().zip(&weights).zip(&mask) {
            if m == 0.0 {
                continue;
            }
            stats.tokens += 1;
            sum += w;
            sum_sq += w * w;
            stats.min = stats.min.min(w);
            stats.max = stats.max.max(w);
            if corrects && weight != w {
                corrected += 1;
            }
        }
        if stats.tokens == 0 {
            return Ok(RatioStats::default());
        }
        let n = stats.tokens as f64;
        stats.mean = sum / n;
        stats.fraction_corrected = corrected as f64 / n;
        stats.effective_sample_size = if sum_sq > 0.0 {
            sum * sum / sum_sq
        } else {
            0.0
        };
        Ok(stats)
    }
}
