//! ORPO (Hong, Lee, Thorne 2024) as TRL 1.16's `ORPOTrainer` computes it: supervised fine-tuning
//! and preference in one stage, with no reference model.
//!
//! With `p_w`, `p_l` the per-token mean log-probs of the two responses (the log of the geometric
//! mean probability), the log odds ratio is
//! `z = (p_w - p_l) - (log(1 - exp(p_w)) - log(1 - exp(p_l)))`, and
//! `loss = NLL(chosen) - lambda * mean_pairs(log s(z))` with `lambda = beta` (0.1).
//!
//! One difference from TRL: TRL's NLL term runs over the chosen sequence's prompt and response
//! tokens (its labels are every attended token), while the ORPO paper's `L_SFT` is the
//! response's likelihood given the prompt. stoke follows the paper: `NLL(chosen)` is the mean
//! over the chosen response tokens, as in SFT. Given the same NLL the formula is TRL's (the
//! fixtures check it that way).
//! Metrics: TRL's `rewards/*` (`beta * p`), `logps/*`, `nll_loss`, `log_odds_ratio` (mean
//! `log s(z)`) and `log_odds_chosen` (mean `z`).

use serde::{Deserialize, Serialize};
use stoke_ops::logistic::{log_sigmoid, log1mexp};

use super::cpo::chosen_nll;
use super::{PreferenceOutput, SequenceLogps, check_beta, halves, mean_value, pair_metrics, shape};
use crate::error::TrainError;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OrpoLoss {
    /// `lambda` of the paper (TRL's `beta`, 0.1).
    #[serde(default = "default_beta")]
    pub beta: f64,
}

fn default_beta() -> f64 {
    0.1
}

impl Default for OrpoLoss {
    fn default() -> Self {
        OrpoLoss {
            beta: default_beta(),
        }
    }
}

impl OrpoLoss {
    pub fn validate(&self) -> Result<(), TrainError> {
        check_beta("orpo.beta", self.beta)
    }

    /// The loss over one micro-batch of pairs (`[chosen; rejected]`, with the graph).
    pub fn loss(&self, policy: &SequenceLogps) -> Result<PreferenceOutput, TrainError> {
        if policy.rows() == 0 || !policy.rows().is_multiple_of(2) {
            return Err(shape(format!(
                "{} rows: a non-empty [chosen; rejected] batch",
                policy.rows()
            )));
        }
        if let Some(row) = policy.tokens.iter().position(|&n| n == 0) {
            return Err(shape(format!(
                "row {row} has no response token: ORPO's odds need a mean log-prob"
            )));
        }
        let (chosen, rejected) = halves(&policy.mean()?)?;
        let log_odds = ((&chosen - &rejected)? - (log1mexp(&chosen)? - log1mexp(&rejected)?)?)?;
        let ratio = log_sigmoid(&log_odds)?;
        let nll = chosen_nll(policy)?;
        let nll_value = nll.detach().to_scalar::<f64>()?;
        let loss = (nll - (ratio.mean_all()? * self.beta)?)?;
        let mut metrics = pair_metrics(
            &(&chosen * self.beta)?,
            &(&rejected * self.beta)?,
            &chosen,
            &rejected,
        )?;
        metrics.push(("nll_loss", nll_value));
        metrics.push(("log_odds_ratio", mean_value(&ratio)?));
        metrics.push(("log_odds_chosen", mean_value(&log_odds)?));
        Ok(PreferenceOutput { loss, metrics })
    }
}
