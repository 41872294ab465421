//! The reference-free family of TRL 1.16's `CPOTrainer`: CPO, SimPO and AlphaPO. No reference
//! model is loaded or scored.
//!
//! Per pair, with `p_w`, `p_l` the policy's log-probs of the two responses (per-sequence sums
//! for `sigmoid` and `hinge`; per-token means for `ipo` and `simpo`, as TRL's
//! `average_log_prob`), the rewards `u = p` (or AlphaPO's `u = (1 - exp(p)^(-alpha)) / alpha`
//! when `alpha != 0`) and `x = u_w - u_l`:
//!
//! ```text
//! sigmoid  -(1 - e) log s(b x) - e log s(-b x)
//! hinge    relu(1 - b x)
//! ipo      (x - 1 / (2 b))^2
//! simpo    the sigmoid form on x - gamma / b
//! loss     mean_pairs + cpo_alpha * NLL(chosen)
//! ```
//!
//! with `NLL(chosen)` the mean negative log-prob over the micro-batch's chosen tokens (TRL's
//! cross-entropy on the chosen labels). SimPO is `loss_type = "simpo"` with `cpo_alpha = 0`;
//! `loss_type = "alphapo"` is TRL's sugar for simpo with `cpo_alpha = 0` (set `alpha` too).
//! Metrics: `rewards/*` are `b * u`, `logps/*` the log-probs the loss used, and `nll_loss`.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use stoke_ops::logistic::log_sigmoid;

use super::{PreferenceOutput, SequenceLogps, check_beta, halves, invalid, pair_metrics, shape};
use crate::error::TrainError;

/// TRL's `CPOConfig.loss_type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CpoLossType {
    #[default]
    Sigmoid,
    Hinge,
    Ipo,
    Simpo,
    /// Sugar for `simpo` with `cpo_alpha = 0` (TRL's `CPOConfig.__post_init__`).
    Alphapo,
}

/// CPO-family settings (TRL's names and defaults).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CpoLoss {
    #[serde(default)]
    pub loss_type: CpoLossType,
    /// 0.1 (SimPO's paper uses 2 to 10).
    #[serde(default = "default_beta")]
    pub beta: f64,
    #[serde(default)]
    pub label_smoothing: f64,
    /// Weight of the chosen NLL term (1); ignored (0) for alphapo.
    #[serde(default = "default_cpo_alpha")]
    pub cpo_alpha: f64,
    /// SimPO's target margin (0.5).
    #[serde(default = "default_simpo_gamma")]
    pub simpo_gamma: f64,
    /// AlphaPO's reward shape; 0 is plain log-probs.
    #[serde(default)]
    pub alpha: f64,
}

fn default_beta() -> f64 {
    0.1
}
fn default_cpo_alpha() -> f64 {
    1.0
}
fn default_simpo_gamma() -> f64 {
    0.5
}

impl Default for CpoLoss {
    fn default() -> Self {
        CpoLoss {
            loss_type: CpoLossType::Sigmoid,
            beta: default_beta(),
            label_smoothing: 0.0,
            cpo_alpha: default_cpo_alpha(),
            simpo_gamma: default_simpo_gamma(),
            alpha: 0.0,
        }
    }
}

impl CpoLoss {
    /// SimPO as its paper sets it up: length-normalised, margin `gamma`, no NLL term.
    pub fn simpo(beta: f64, gamma: f64) -> CpoLoss {
        CpoLoss {
            loss_type: CpoLossType::Simpo,
            beta,
            cpo_alpha: 0.0,
            simpo_gamma: gamma,
            ..CpoLoss::default()
        }
    }

    pub fn validate(&self) -> Result<(), TrainError> {
        check_beta("cpo.beta", self.beta)?;
        let e = self.label_smoothing;
        if !(0.0..0.5).contains(&e) {
            return Err(invalid(
                "cpo.label_smoothing",
                format!("must be in [0, 0.5), got {e}"),
            ));
        }
        if e > 0.0 && matches!(self.loss_type, CpoLossType::Hinge | CpoLossType::Ipo) {
            return Err(invalid(
                "cpo.label_smoothing",
                format!(
                    "{:?} does not use label smoothing; set it to 0",
                    self.loss_type
                ),
            ));
        }
        for (key, value) in [
            ("cpo.cpo_alpha", self.cpo_alpha),
            ("cpo.simpo_gamma", self.simpo_gamma),
            ("cpo.alpha", self.alpha),
        ] {
            if !value.is_finite() {
                return Err(invalid(key, format!("must be finite, got {value}")));
            }
        }
        Ok(())
    }

    /// `(loss type, NLL weight)` after TRL's alphapo sugar.
    fn resolved(&self) -> (CpoLossType, f64) {
        match self.loss_type {
            CpoLossType::Alphapo => (CpoLossType::Simpo, 0.0),
            other => (other, self.cpo_alpha),
        }
    }

    /// The loss over one micro-batch of pairs (`[chosen; rejected]`, with the graph).
    pub fn loss(&self, policy: &SequenceLogps) -> Result<PreferenceOutput, TrainError> {
        if policy.rows() == 0 || !policy.rows().is_multiple_of(2) {
            return Err(shape(format!(
                "{} rows: a non-empty [chosen; rejected] batch",
                policy.rows()
            )));
        }
        let (loss_type, nll_weight) = self.resolved();
        let (beta, e) = (self.beta, self.label_smoothing);
        let logps = match loss_type {
            CpoLossType::Ipo | CpoLossType::Simpo => policy.mean()?,
            _ => policy.weighted(None)?,
        };
        let (chosen, rejected) = halves(&logps)?;
        let (chosen_u, rejected_u) = if self.alpha != 0.0 {
            // (1 - p^(-a)) / a with p = exp(logp): p^(-a) = exp(-a logp).
            let shape_reward = |logp: &Tensor| -> Result<Tensor, TrainError> {
                Ok(((1.0 - (logp * -self.alpha)?.exp()?)? / self.alpha)?)
            };
            (shape_reward(&chosen)?, shape_reward(&rejected)?)
        } else {
            (chosen.clone(), rejected.clone())
        };
        let mut x = (&chosen_u - &rejected_u)?;
        let per_pair = match loss_type {
            CpoLossType::Sigmoid | CpoLossType::Simpo | CpoLossType::Alphapo => {
                if loss_type == CpoLossType::Simpo {
                    x = (x - self.simpo_gamma / beta)?;
                }
                let bx = (&x * beta)?;
                let clean = (log_sigmoid(&bx)? * -(1.0 - e))?;
                (clean - (log_sigmoid(&bx.neg()?)? * e)?)?
            }
            CpoLossType::Hinge => (1.0 - (&x * beta)?)?.relu()?,
            CpoLossType::Ipo => (x - 1.0 / (2.0 * beta))?.sqr()?,
        };
        let nll = chosen_nll(policy)?;
        let nll_value = nll.detach().to_scalar::<f64>()?;
        let loss = if nll_weight == 0.0 {
            per_pair.mean_all()?
        } else {
            (per_pair.mean_all()? + (nll * nll_weight)?)?
        };
        let mut metrics = pair_metrics(
            &(&chosen_u * beta)?,
            &(&rejected_u * beta)?,
            &chosen,
            &rejected,
        )?;
        metrics.push(("nll_loss", if nll_weight == 0.0 { 0.0 } else { nll_value }));
        Ok(PreferenceOutput { loss, metrics })
    }
}

/// Mean negative log-prob over the chosen tokens of a `[chosen; rejected]` batch.
pub(crate) fn chosen_nll(policy: &SequenceLogps) -> Result<Tensor, TrainError> {
    let pairs = policy.rows() / 2;
    let (chosen_sum, _) = halves(&policy.weighted(None)?)?;
    let tokens: usize = policy.tokens[..pairs].iter().sum();
    Ok((chosen_sum.sum_all()? / -(tokens.max(1) as f64))?)
}
