//! Bradley-Terry reward-model training (`stoke rm`) as TRL 1.16's `RewardTrainer.compute_loss`
//! computes it: a sequence classifier with one label scores each response after its prompt
//! (`Transformer::score_sequences`: the `score` head at the last token that is not padding), and
//! with `r_c`, `r_r` the scores of a pair's chosen and rejected response and `m` its margin (the
//! data's `margin` field, 0 when absent),
//!
//! `loss = -mean_pairs(log s(r_c - r_r - m)) + c * mean_pairs((r_c + r_r)^2)`
//!
//! where the second term (Eisenstein et al. 2023's reward centering, TRL's
//! `center_rewards_coefficient`) is on only when `center_rewards_coefficient` is set. Checked by
//! `tests/reward_model.rs` against `fixtures/reward_model/trl_reward.json`
//! (`scripts/make_reward_model_fixtures.py` runs TRL's own `compute_loss` on the same model).
//!
//! Metrics: TRL's `accuracy` (share of pairs with `r_c > r_r`), `margin` (mean `r_c - r_r`),
//! `min_reward`, `mean_reward`, `max_reward` over the micro-batch's 2B scores, and `std_reward`
//! (their population standard deviation, which TRL does not log). The scores are computed in the
//! model's precision and the loss in f64, as the other preference losses.
//!
//! What this is not: the scoring forward pass or the data (`train`, `data`).

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use stoke_ops::logistic::log_sigmoid;

use super::{PreferenceOutput, halves, invalid, shape};
use crate::error::TrainError;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardModelLoss {
    /// Reward centering's coefficient (TRL's `center_rewards_coefficient`; the paper uses
    /// 0.01); unset: no centering term.
    #[serde(default)]
    pub center_rewards_coefficient: Option<f64>,
}

impl RewardModelLoss {
    pub fn validate(&self) -> Result<(), TrainError> {
        match self.center_rewards_coefficient {
            Some(c) if !(c.is_finite() && c >= 0.0) => Err(invalid(
                "reward_model.center_rewards_coefficient",
                format!("must be a finite number >= 0, got {c}"),
            )),
            _ => Ok(()),
        }
    }

    /// The loss over one micro-batch: `scores` `[2B]` or `[2B, 1]` (`[chosen; rejected]`, with
    /// the graph) and, when the data has them, one margin per pair.
    pub fn loss(
        &self,
        scores: &Tensor,
        margins: Option<&[f64]>,
    ) -> Result<PreferenceOutput, TrainError> {
        let scores = scores.flatten_all()?.to_dtype(DType::F64)?;
        let rows = scores.dim(0)?;
        if rows == 0 || !rows.is_multiple_of(2) {
            return Err(shape(format!(
                "{rows} scores: a non-empty [chosen; rejected] batch"
            )));
        }
        let (chosen, rejected) = halves(&scores)?;
        let mut difference = (&chosen - &rejected)?;
        if let Some(margins) = margins {
            if margins.len() != rows / 2 {
                return Err(shape(format!(
                    "{} margins for {} pairs",
                    margins.len(),
                    rows / 2
                )));
            }
            let margins = Tensor::from_slice(margins, rows / 2, scores.device())?;
            difference = (difference - margins)?;
        }
        let mut loss = log_sigmoid(&difference)?.mean_all()?.neg()?;
        if let Some(c) = self.center_rewards_coefficient {
            let centered = (&chosen + &rejected)?.sqr()?.mean_all()?;
            loss = (loss + (centered * c)?)?;
        }
        let values: Vec<f64> = scores.detach().to_vec1()?;
        let (c, r) = values.split_at(rows / 2);
        let pairs = (rows / 2) as f64;
        let accuracy = c.iter().zip(r).filter(|(c, r)| c > r).count() as f64 / pairs;
        let margin = c.iter().zip(r).map(|(c, r)| c - r).sum::<f64>() / pairs;
        let mean = values.iter().sum::<f64>() / rows as f64;
        let var = values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / rows as f64;
        let metrics = vec![
            ("accuracy", accuracy),
            ("margin", margin),
            (
                "min_reward",
                values.iter().copied().fold(f64::INFINITY, f64::min),
            ),
            ("mean_reward", mean),
            (
                "max_reward",
                values.iter().copied().fold(f64::NEG_INFINITY, f64::max),
            ),
            ("std_reward", var.sqrt()),
        ];
        Ok(PreferenceOutput { loss, metrics })
    }
}
