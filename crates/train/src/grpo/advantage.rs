//! Advantages: one number per completion, computed from the rewards of its group (the `n`
//! completions sampled for one prompt). Rewards arrive flat, group after group, so completion
//! `i` belongs to group `i / group_size`.
//!
//! What this is not: no rewards are computed here (the reward crate does that) and no tensors
//! are built; the trainer turns the returned `Vec<f64>` into the `[B]` advantages tensor.
//!
//! Standard deviations are *sample* standard deviations (Bessel's correction, divisor `n - 1`),
//! the choice TRL's `GRPOTrainer` makes (`trl.trainer.utils.nanstd`), so stoke's advantages equal
//! TRL's for the same rewards apart from TRL's fixed `1e-4` epsilon. A group of one completion has
//! no spread; its standard deviation is taken as 0.

use serde::{Deserialize, Serialize};

use super::GrpoError;

/// How a group's rewards become advantages. Default: GRPO with `eps = 0.01`.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum AdvantageEstimator {
    /// GRPO (DeepSeekMath): `A_i = (R_i - mean(R)) / (std(R) + eps)` within the group; `eps`
    /// defaults to 0.01, the value the seed ablation found best (TRL hard-codes 1e-4).
    Grpo {
        #[serde(default = "default_grpo_eps")]
        eps: f64,
    },
    /// Dr. GRPO (Liu et al. 2025): `A_i = R_i - mean(R)`; no division by the group's spread, which
    /// otherwise up-weights groups that are almost all right or all wrong.
    DrGrpo,
    /// RLOO (Ahmadian et al. 2024): `A_i = R_i - mean_{j != i}(R_j)`, the leave-one-out baseline,
    /// equal to `n / (n - 1) * (R_i - mean(R))`. A group of one gets advantage 0.
    Rloo,
    /// REINFORCE++ with baseline (OpenRLHF `reinforce_baseline`): first `B_i = R_i - mean(R)` in
    /// the group, then whitened over the whole batch of completions:
    /// `A_i = (B_i - mean_batch(B)) / (std_batch(B) + eps)`, `eps` default 1e-8. Whitening is per
    /// completion here (OpenRLHF whitens per token, weighting long completions more).
    ReinforcePlusPlus {
        #[serde(default = "default_reinforce_eps")]
        eps: f64,
    },
}

fn default_grpo_eps() -> f64 {
    0.01
}

fn default_reinforce_eps() -> f64 {
    1e-8
}

impl Default for AdvantageEstimator {
    fn default() -> Self {
        AdvantageEstimator::Grpo {
            eps: default_grpo_eps(),
        }
    }
}

impl AdvantageEstimator {
    /// Checks the epsilon of the estimators that have one (finite, > 0).
    pub fn validate(&self) -> Result<(), GrpoError> {
        match *self {
            AdvantageEstimator::Grpo { eps } | AdvantageEstimator::ReinforcePlusPlus { eps } => {
                if !(eps.is_finite() && eps > 0.0) {
                    return Err(GrpoError::config(
                        "advantage.eps",
                        format!("must be finite and > 0, got {eps}"),
                    ));
                }
                Ok(())
            }
            AdvantageEstimator::DrGrpo | AdvantageEstimator::Rloo => Ok(()),
        }
    }

    /// Advantages of `rewards`, laid out as consecutive groups of `group_size`.
    pub fn advantages(&self, rewards: &[f64], group_size: usize) -> Result<Vec<f64>, GrpoError> {
        check_groups(rewards, group_size)?;
        let mut out = Vec::with_capacity(rewards.len());
        for group in rewards.chunks(group_size) {
            let mean = mean(group);
            match *self {
                AdvantageEstimator::Grpo { eps } => {
                    let std = sample_std(group);
                    out.extend(group.iter().map(|r| (r - mean) / (std + eps)));
                }
                AdvantageEstimator::DrGrpo | AdvantageEstimator::ReinforcePlusPlus { .. } => {
                    out.extend(group.iter().map(|r| r - mean));
                }
                AdvantageEstimator::Rloo => {
                    let n = group.len();
                    if n < 2 {
                        out.extend(std::iter::repeat_n(0.0, n));
                    } else {
                        let sum: f64 = group.iter().sum();
                        out.extend(group.iter().map(|r| r - (sum - r) / (n - 1) as f64));
                    }
                }
            }
        }
        if let AdvantageEstimator::ReinforcePlusPlus { eps } = *self {
            let batch_mean = mean(&out);
            let batch_std = sample_std(&out);
            for a in &mut out {
                *a = (*a - batch_mean) / (batch_std + eps);
            }
        }
        Ok(out)
    }
}

/// Dynamic sampling (DAPO): the indices of the groups whose rewards are not all equal. A group
/// where every completion scored the same has zero advantage under every estimator above and
/// only dilutes the batch. Equality is exact (`==`): verifiable rewards are discrete.
pub fn drop_equal_reward_groups(
    rewards: &[f64],
    group_size: usize,
) -> Result<Vec<usize>, GrpoError> {
    check_groups(rewards, group_size)?;
    Ok(rewards
        .chunks(group_size)
        .enumerate()
        .filter(|(_, group)| group.iter().any(|r| *r != group[0]))
        .map(|(index, _)| index)
        .collect())
}

fn check_groups(rewards: &[f64], group_size: usize) -> Result<(), GrpoError> {
    if group_size == 0 {
        return Err(GrpoError::config(
            "group_size",
            "must be at least 1".to_string(),
        ));
    }
    if !rewards.len().is_multiple_of(group_size) {
        return Err(GrpoError::Shape(format!(
            "{} rewards do not split into groups of {group_size}",
            rewards.len()
        )));
    }
    if let Some(i) = rewards.iter().position(|r| !r.is_finite()) {
        return Err(GrpoError::Shape(format!(
            "reward {i} is not finite ({})",
            rewards[i]
        )));
    }
    Ok(())
}

pub(super) fn mean(values: &[f64]) -> f64 {
    if values.is_empty() {
        return 0.0;
    }
    values.iter().sum::<f64>() / values.len() as f64
}

/// Sample standard deviation (divisor `n - 1`); 0 for fewer than two values.
pub(super) fn sample_std(values: &[f64]) -> f64 {
    let n = values.len();
    if n < 2 {
        return 0.0;
    }
    let m = mean(values);
    let sum_sq: f64 = values.iter().map(|v| (v - m) * (v - m)).sum();
    (sum_sq / (n - 1) as f64).sqrt()
}
