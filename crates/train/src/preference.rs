//! Preference optimization: the loss math of the DPO family, the reference-free CPO/SimPO and
//! ORPO, and KTO on unpaired labels, as TRL 1.16 computes them (checked by
//! `tests/preference_loss.rs` against `fixtures/preference/trl_loss.json`, which
//! `scripts/make_preference_fixtures.py` makes by running TRL's own loss code on fixed log-probs).
//!
//! Inputs are per-token log-probabilities of completions under the policy (carrying the graph),
//! laid out as GRPO scores them (`grpo::completion_logprobs`): `[rows, T]`, each row's tokens at
//! slots `0..len`, exact zeros after. [`PairLogps`] reduces a batch of pairs, rows
//! `[chosen_0..chosen_B, rejected_0..rejected_B]`, to per-sequence sums in f64. Everything after
//! that is a handful of values per sequence, so the losses run in f64 with exact logistic ops
//! (`stoke_ops::logistic`; candle's own compositions have a zero gradient at a log-ratio of 0,
//! which is where DPO starts).
//!
//! Each loss returns TRL's per-micro-batch value (a mean over the batch's pairs or completions;
//! the `sft` term a mean over the chosen tokens) and TRL's metric names (`rewards/chosen`,
//! `rewards/rejected`, `rewards/accuracies`, `rewards/margins`, `logps/chosen`, `logps/rejected`,
//! and per-loss extras).
//!
//! One noun per submodule: [`dpo`] (every `loss_type` of TRL's `DPOTrainer`, weighted
//! combinations, f-divergences, LD-DPO), [`cpo`] (CPO, SimPO, AlphaPO), [`orpo`], [`kto`], and
//! [`reward_model`] (Bradley-Terry reward models on scores instead of log-probs).
//!
//! What this is not: no model forward, no data reading, no optimizer step.

pub mod cpo;
pub mod data;
pub mod dpo;
pub mod kto;
pub mod orpo;
pub mod record;
pub mod report;
pub mod reward_model;
pub mod run;
pub mod scoring;
pub mod shards;
pub mod train;

use candle_core::{DType, Tensor};

pub use cpo::{CpoLoss, CpoLossType};
pub use dpo::{DpoLoss, DpoLossType, FDivergence};
pub use kto::{KtoInputs, KtoLoss, KtoLossType};
pub use orpo::OrpoLoss;
pub use reward_model::RewardModelLoss;

use crate::config::ConfigError;
use crate::error::TrainError;

/// A loss's value and figures for one micro-batch.
#[derive(Debug)]
pub struct PreferenceOutput {
    /// Differentiable f64 scalar: the objective's value on this micro-batch.
    pub loss: Tensor,
    /// TRL's metric names and this micro-batch's values.
    pub metrics: Vec<(&'static str, f64)>,
}

impl PreferenceOutput {
    /// The value of metric `name`, if the loss reports it.
    pub fn metric(&self, name: &str) -> Option<f64> {
        find_metric(&self.metrics, name)
    }
}

/// The value of metric `name` in a list of named figures.
pub fn find_metric(metrics: &[(&'static str, f64)], name: &str) -> Option<f64> {
    metrics
        .iter()
        .find(|(key, _)| *key == name)
        .map(|(_, value)| *value)
}

/// Per-sequence log-probs of a batch of completions, split where LD-DPO needs it: `shared` sums
/// a row's first `min(len_chosen, len_rejected)` tokens (its pair's common length), `tail` the
/// rest. A plain sum is `shared + tail`; LD-DPO's is `shared + alpha * tail`. Paired batches
/// hold `2B` rows, chosen then rejected; unpaired (KTO) batches one row per completion with
/// `tail` = 0.
#[derive(Debug)]
pub struct SequenceLogps {
    /// `[rows]` f64 (carries the graph for the policy; plain values for a reference).
    pub shared: Tensor,
    /// `[rows]` f64.
    pub tail: Tensor,
    /// Completion tokens of each row.
    pub tokens: Vec<usize>,
}

impl SequenceLogps {
    /// Sums `[2B, T]` per-token log-probs of a paired batch (rows chosen then rejected, row `i`'s
    /// tokens at slots `0..lengths[i]`).
    pub fn pairs(token_logps: &Tensor, lengths: &[usize]) -> Result<SequenceLogps, TrainError> {
        let rows = lengths.len();
        if !rows.is_multiple_of(2) {
            return Err(shape(format!(
                "a paired batch needs an even number of rows (chosen then rejected), got {rows}"
            )));
        }
        let half = rows / 2;
        let shared_len: Vec<usize> = (0..rows)
            .map(|row| lengths[row % half].min(lengths[half + row % half]))
            .collect();
        Self::sums(token_logps, lengths, &shared_len)
    }

    /// Sums `[B, T]` per-token log-probs of unpaired completions.
    pub fn unpaired(token_logps: &Tensor, lengths: &[usize]) -> Result<SequenceLogps, TrainError> {
        Self::sums(token_logps, lengths, lengths)
    }

    /// Host values `shared`, `tail` (a reference computed elsewhere, or read from a cache).
    pub fn from_values(
        shared: Vec<f64>,
        tail: Vec<f64>,
        tokens: Vec<usize>,
        device: &candle_core::Device,
    ) -> Result<SequenceLogps, TrainError> {
        if shared.len() != tail.len() || shared.len() != tokens.len() {
            return Err(shape(format!(
                "reference log-probs: {} shared, {} tail and {} lengths",
                shared.len(),
                tail.len(),
                tokens.len()
            )));
        }
        let rows = shared.len();
        Ok(SequenceLogps {
            shared: Tensor::from_vec(shared, rows, device)?,
            tail: Tensor::from_vec(tail, rows, device)?,
            tokens,
        })
    }

    fn sums(
        token_logps: &Tensor,
        lengths: &[usize],
        shared_len: &[usize],
    ) -> Result<SequenceLogps, TrainError> {
        let (rows, width) = token_logps.dims2()?;
        if rows != lengths.len() {
            return Err(shape(format!(
                "{rows} rows of log-probs for {} lengths",
                lengths.len()
            )));
        }
        if let Some(&longest) = lengths.iter().max()
            && longest > width
        {
            return Err(shape(format!(
                "a completion of {longest} tokens in {width} log-prob slots"
            )));
        }
        let weights = |keep: &dyn Fn(usize, usize) -> bool| -> Result<Tensor, TrainError> {
            let mut w = vec![0f64; rows * width];
            for row in 0..rows {
                for slot in 0..width {
                    if keep(row, slot) {
                        w[row * width + slot] = 1.0;
                    }
                }
            }
            Ok(Tensor::from_vec(w, (rows, width), token_logps.device())?)
        };
        let shared_w = weights(&|row, slot| slot < shared_len[row])?;
        let tail_w = weights(&|row, slot| slot >= shared_len[row] && slot < lengths[row])?;
        let values = token_logps.to_dtype(DType::F64)?;
        Ok(SequenceLogps {
            shared: (&values * shared_w)?.sum(1)?,
            tail: (&values * tail_w)?.sum(1)?,
            tokens: lengths.to_vec(),
        })
    }

    /// `shared + alpha * tail` (LD-DPO) or the plain sum (`alpha` None).
    pub fn weighted(&self, ld_alpha: Option<f64>) -> Result<Tensor, TrainError> {
        Ok(match ld_alpha {
            None => (&self.shared + &self.tail)?,
            Some(alpha) => (&self.shared + (&self.tail * alpha)?)?,
        })
    }

    /// Per-sequence mean log-prob (sum over tokens, divided by `max(tokens, 1)`).
    pub fn mean(&self) -> Result<Tensor, TrainError> {
        let lengths: Vec<f64> = self.tokens.iter().map(|&n| n.max(1) as f64).collect();
        let lengths = Tensor::from_vec(lengths, self.tokens.len(), self.shared.device())?;
        Ok(((&self.shared + &self.tail)? / lengths)?)
    }

    /// The two halves of a `[first; second]` batch.
    pub fn split_halves(&self) -> Result<[SequenceLogps; 2], TrainError> {
        let half = self.rows() / 2;
        let (a_shared, b_shared) = halves(&self.shared)?;
        let (a_tail, b_tail) = halves(&self.tail)?;
        Ok([
            SequenceLogps {
                shared: a_shared,
                tail: a_tail,
                tokens: self.tokens[..half].to_vec(),
            },
            SequenceLogps {
                shared: b_shared,
                tail: b_tail,
                tokens: self.tokens[half..].to_vec(),
            },
        ])
    }

    /// The same values without the graph.
    pub fn detached(&self) -> SequenceLogps {
        SequenceLogps {
            shared: self.shared.detach(),
            tail: self.tail.detach(),
            tokens: self.tokens.clone(),
        }
    }

    pub fn rows(&self) -> usize {
        self.tokens.len()
    }

    /// The plain per-sequence sums on the host.
    pub fn sum_values(&self) -> Result<Vec<f64>, TrainError> {
        Ok((&self.shared + &self.tail)?.detach().to_vec1::<f64>()?)
    }
}

/// Splits a `[2B]` tensor into its chosen and rejected halves.
pub(crate) fn halves(t: &Tensor) -> Result<(Tensor, Tensor), TrainError> {
    let rows = t.dim(0)?;
    let half = rows / 2;
    Ok((t.narrow(0, 0, half)?, t.narrow(0, half, half)?))
}

pub(crate) fn shape(message: String) -> TrainError {
    TrainError::Config(ConfigError::Invalid {
        key: "preference batch".into(),
        message,
    })
}

pub(crate) fn invalid(key: &str, message: String) -> TrainError {
    TrainError::Config(ConfigError::Invalid {
        key: key.to_string(),
        message,
    })
}

/// `beta` must be finite and > 0.
pub(crate) fn check_beta(key: &str, beta: f64) -> Result<(), TrainError> {
    if beta.is_finite() && beta > 0.0 {
        Ok(())
    } else {
        Err(invalid(key, format!("must be finite and > 0, got {beta}")))
    }
}

pub(crate) fn mean_value(t: &Tensor) -> Result<f64, TrainError> {
    let n = t.elem_count();
    if n == 0 {
        return Ok(0.0);
    }
    Ok(t.detach().sum_all()?.to_scalar::<f64>()? / n as f64)
}

/// The metrics every paired loss reports, TRL's names: rewards are `beta *` the given
/// per-sequence rewards (log-ratios for DPO, log-probs for the reference-free losses).
pub(crate) fn pair_metrics(
    chosen_rewards: &Tensor,
    rejected_rewards: &Tensor,
    chosen_logps: &Tensor,
    rejected_logps: &Tensor,
) -> Result<Vec<(&'static str, f64)>, TrainError> {
    let chosen = chosen_rewards.detach().to_vec1::<f64>()?;
    let rejected = rejected_rewards.detach().to_vec1::<f64>()?;
    let pairs = chosen.len().max(1) as f64;
    let accuracy = chosen.iter().zip(&rejected).filter(|(c, r)| c > r).count() as f64 / pairs;
    let margin = chosen
        .iter()
        .zip(&rejected)
        .map(|(c, r)| c - r)
        .sum::<f64>()
        / pairs;
    Ok(vec![
        ("rewards/chosen", mean_value(chosen_rewards)?),
        ("rewards/rejected", mean_value(rejected_rewards)?),
        ("rewards/accuracies", accuracy),
        ("rewards/margins", margin),
        ("logps/chosen", mean_value(chosen_logps)?),
        ("logps/rejected", mean_value(rejected_logps)?),
    ])
}
