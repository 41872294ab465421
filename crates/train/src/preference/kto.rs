//! KTO (Ethayarajh et al. 2024) on unpaired data, as TRL 1.16's `KTOTrainer` computes it: each
//! completion is labelled desirable or undesirable, with no partner.
//!
//! With `r = log pi(y) - log ref(y)` (per-sequence sums) and the reference point
//! `z = max(0, mean over the batch of (log pi(y') - log ref(y')))` on *mismatched* pairs `y'`
//! (each prompt with another example's completion; detached, no gradient), per completion:
//!
//! ```text
//! kto                desirable: 1 - s(b (r - z))      undesirable: 1 - s(b (z - r))
//! apo_zero_unpaired  desirable: 1 - s(b r)            undesirable: s(b r)       (no z)
//! loss = mean over completions of (desirable_weight or undesirable_weight) * loss
//! ```
//!
//! Metrics (TRL's names): `kl` (= z), `rewards/chosen` and `logps/chosen` (means over the
//! desirable completions), `rewards/rejected` and `logps/rejected`, and `rewards/margins` when
//! the batch has both kinds.

use candle_core::Tensor;
use serde::{Deserialize, Serialize};
use stoke_ops::logistic::sigmoid;

use super::{PreferenceOutput, SequenceLogps, check_beta, invalid, shape};
use crate::error::TrainError;

/// TRL's `KTOConfig.loss_type`.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KtoLossType {
    #[default]
    Kto,
    ApoZeroUnpaired,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct KtoLoss {
    #[serde(default)]
    pub loss_type: KtoLossType,
    #[serde(default = "default_beta")]
    pub beta: f64,
    /// Weight of the desirable completions' losses (1). The KTO paper suggests keeping
    /// `desirable_weight * n_desirable / (undesirable_weight * n_undesirable)` in [1, 4/3].
    #[serde(default = "one")]
    pub desirable_weight: f64,
    #[serde(default = "one")]
    pub undesirable_weight: f64,
}

fn default_beta() -> f64 {
    0.1
}
fn one() -> f64 {
    1.0
}

impl Default for KtoLoss {
    fn default() -> Self {
        KtoLoss {
            loss_type: KtoLossType::Kto,
            beta: default_beta(),
            desirable_weight: 1.0,
            undesirable_weight: 1.0,
        }
    }
}

/// One micro-batch of unpaired completions.
#[derive(Debug)]
pub struct KtoInputs<'a> {
    /// `[B]` policy log-probs (with the graph).
    pub policy: &'a SequenceLogps,
    /// `[B]` reference log-probs.
    pub reference: &'a SequenceLogps,
    /// Desirable (true) or undesirable, per completion.
    pub labels: &'a [bool],
    /// The mismatched completions under the policy and the reference (plain values); required
    /// by `kto`, unused by `apo_zero_unpaired`.
    pub mismatched: Option<(&'a SequenceLogps, &'a SequenceLogps)>,
}

impl KtoLoss {
    pub fn validate(&self) -> Result<(), TrainError> {
        check_beta("kto.beta", self.beta)?;
        for (key, value) in [
            ("kto.desirable_weight", self.desirable_weight),
            ("kto.undesirable_weight", self.undesirable_weight),
        ] {
            if !(value.is_finite() && value >= 0.0) {
                return Err(invalid(
                    key,
                    format!("must be finite and >= 0, got {value}"),
                ));
            }
        }
        Ok(())
    }

    /// Whether the loss needs the mismatched-pair pass (the KL reference point).
    pub fn needs_mismatched(&self) -> bool {
        self.loss_type == KtoLossType::Kto
    }

    /// The reference point `z` from the mismatched pairs: `max(0, mean(pi - ref))`, detached.
    pub fn reference_point(
        policy: &SequenceLogps,
        reference: &SequenceLogps,
    ) -> Result<f64, TrainError> {
        let pi = policy.sum_values()?;
        let rf = reference.sum_values()?;
        if pi.len() != rf.len() || pi.is_empty() {
            return Err(shape(format!(
                "{} mismatched policy rows and {} reference rows",
                pi.len(),
                rf.len()
            )));
        }
        let mean = pi.iter().zip(&rf).map(|(p, r)| p - r).sum::<f64>() / pi.len() as f64;
        Ok(mean.max(0.0))
    }

    pub fn loss(&self, inputs: &KtoInputs<'_>) -> Result<PreferenceOutput, TrainError> {
        let rows = inputs.policy.rows();
        if rows == 0 || inputs.reference.rows() != rows || inputs.labels.len() != rows {
            return Err(shape(format!(
                "{rows} policy rows, {} reference rows and {} labels",
                inputs.reference.rows(),
                inputs.labels.len()
            )));
        }
        let beta = self.beta;
        let z = match (self.loss_type, inputs.mismatched) {
            (KtoLossType::Kto, Some((policy, reference))) => {
                Some(Self::reference_point(policy, reference)?)
            }
            (KtoLossType::Kto, None) => {
                return Err(shape(
                    "kto needs the mismatched pairs for its reference point".into(),
                ));
            }
            (KtoLossType::ApoZeroUnpaired, _) => None,
        };
        let logps = inputs.policy.weighted(None)?;
        let ratio = (&logps - inputs.reference.weighted(None)?.detach())?;
        let device = logps.device();
        let desirable: Vec<u32> = (0..rows as u32)
            .filter(|&i| inputs.labels[i as usize])
            .collect();
        let undesirable: Vec<u32> = (0..rows as u32)
            .filter(|&i| !inputs.labels[i as usize])
            .collect();
        let pick = |t: &Tensor, index: &[u32]| -> Result<Tensor, TrainError> {
            let index = Tensor::from_slice(index, index.len(), device)?;
            Ok(t.index_select(&index, 0)?)
        };
        let mut terms = Vec::new();
        let mut metrics = vec![("kl", z.unwrap_or(0.0))];
        let mut means = [None, None];
        for (side, index) in [&desirable, &undesirable].into_iter().enumerate() {
            if index.is_empty() {
                continue;
            }
            let r = pick(&ratio, index)?;
            let x = match z {
                Some(z) if side == 0 => (&r - z)?,
                Some(z) => (r.neg()? + z)?,
                None => r.clone(),
            };
            let losses = match (self.loss_type, side) {
                (KtoLossType::Kto, _) | (KtoLossType::ApoZeroUnpaired, 0) => {
                    (1.0 - sigmoid(&(x * beta)?)?)?
                }
                (KtoLossType::ApoZeroUnpaired, _) => sigmoid(&(x * beta)?)?,
            };
            let weight = if side == 0 {
                self.desirable_weight
            } else {
                self.undesirable_weight
            };
            terms.push((losses * weight)?);
            let n = index.len() as f64;
            let reward = (r.detach() * beta)?.sum_all()?.to_scalar::<f64>()? / n;
            let logp = pick(&logps, index)?
                .detach()
                .sum_all()?
                .to_scalar::<f64>()?
                / n;
            let (reward_key, logp_key) = if side == 0 {
                ("rewards/chosen", "logps/chosen")
            } else {
                ("rewards/rejected", "logps/rejected")
            };
            metrics.push((reward_key, reward));
            metrics.push((logp_key, logp));
            means[side] = Some(reward);
        }
        if let [Some(chosen), Some(rejected)] = means {
            metrics.push(("rewards/margins", chosen - rejected));
        }
        let loss = Tensor::cat(&terms, 0)?.mean_all()?;
        Ok(PreferenceOutput { loss, metrics })
    }
}
