//! GRPO-family loss math: advantages from group rewards, per-token policy losses (clipped
//! surrogate with DAPO clip-higher, GSPO's sequence-level ratio, CISPO), aggregation, the KL
//! penalty to a reference policy, and trainer/rollout mismatch correction. One noun per
//! submodule; this file joins them into [`GrpoLoss`], the whole loss for one batch:
//!
//! ```text
//! l_bt  = policy_loss(cur, old, A)_bt * mismatch_weight_bt + beta * kl(cur, ref)_bt
//! loss  = aggregate(l, mask)
//! ```
//!
//! the order TRL's `GRPOTrainer._compute_loss` uses, so that stoke's loss equals TRL's (checked
//! by `tests/grpo_loss.rs` against fixtures made by `scripts/make_grpo_fixtures.py`). TRL's loss
//! types map onto stoke as: `grpo` = clipped + sequence-mean-token-mean; `bnpo` and `dapo` (one
//! micro-batch, one process) = clipped + token-mean; `dr_grpo` = clipped +
//! sequence-mean-token-sum-normalized with `max_len = max_completion_length`; `cispo` = CISPO +
//! token-mean; `importance_sampling_level="sequence"` = [`RatioLevel::Sequence`].
//!
//! Defaults: clipped surrogate at token level with `eps_low = eps_high = 0.2`, token-mean
//! aggregation, `beta = 0` (no KL term, k3 when on), no mismatch correction, GRPO advantages
//! with `eps = 0.01`.
//!
//! What this is not: no model, no rollout, no trainer loop. Inputs are log-prob tensors `[B, T]`
//! (current ones carrying the graph), advantages `[B]` and a 0/1 mask `[B, T]` of one dtype.

pub mod advantage;
pub mod aggregation;
pub mod correction;
pub mod kl;
pub mod opd;
pub mod policy_loss;
pub mod process_advantage;
pub mod sequences;
pub mod update;

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

pub use advantage::{AdvantageEstimator, drop_equal_reward_groups};
pub use aggregation::LossAggregation;
pub use correction::{CorrectionOutput, MismatchCorrection, RatioStats};
pub use kl::{KlEstimator, KlPenalty};
pub use policy_loss::{ClipFractions, PolicyLoss, PolicyLossOutput, RatioLevel};
pub use process_advantage::{ScoredSteps, outcome_rewards, process_token_advantages};
pub use sequences::{
    CompletionScores, ScoringLayout, SequenceRow, completion_logprobs, completion_logprobs_with,
    shared_prefix_bias, token_budget_batches,
};
pub use update::{
    PolicySample, PolicyUpdater, UpdateOutcome, UpdateReport, UpdateSettings, kl_reward_penalty,
};

#[derive(Debug, thiserror::Error)]
pub enum GrpoError {
    #[error("grpo config `{field}`: {reason}")]
    Config { field: &'static str, reason: String },
    #[error("grpo inputs: {0}")]
    Shape(String),
    #[error("tensor operation: {0}")]
    Tensor(#[from] candle_core::Error),
}

impl GrpoError {
    pub(crate) fn config(field: &'static str, reason: String) -> GrpoError {
        GrpoError::Config { field, reason }
    }
}

/// The loss section of a GRPO config file (`[grpo.loss]`); every key optional.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoLossFile {
    #[serde(default)]
    pub advantage: AdvantageEstimator,
    #[serde(default)]
    pub policy: PolicyLoss,
    #[serde(default)]
    pub aggregation: LossAggregation,
    #[serde(default)]
    pub kl_estimator: KlEstimator,
    /// KL coefficient; 0 (default) turns the term off.
    #[serde(default)]
    pub beta: f64,
    #[serde(default)]
    pub correction: MismatchCorrection,
    /// On-policy distillation (`[grpo.loss.distill]`): per-token advantages from the teacher,
    /// which is the run's reference model (`[model] reference`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill: Option<opd::OpdConfig>,
}

impl GrpoLossFile {
    /// Validates every field and builds the runtime loss.
    pub fn into_config(self) -> Result<GrpoLoss, GrpoError> {
        self.advantage.validate()?;
        self.policy.validate()?;
        self.aggregation.validate()?;
        self.correction.validate()?;
        if let Some(distill) = &self.distill {
            distill.validate()?;
            if self.beta > 0.0 {
                return Err(GrpoError::config(
                    "beta",
                    "on-policy distillation takes the reference's place (the teacher is \
                     [model] reference): set beta = 0 with [grpo.loss.distill]"
                        .into(),
                ));
            }
        }
        Ok(GrpoLoss {
            advantage: self.advantage,
            policy: self.policy,
            aggregation: self.aggregation,
            kl: KlPenalty::new(self.kl_estimator, self.beta)?,
            correction: self.correction,
            distill: self.distill,
        })
    }
}

/// The validated loss configuration; `Default` is the documented defaults above.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct GrpoLoss {
    pub advantage: AdvantageEstimator,
    pub policy: PolicyLoss,
    pub aggregation: LossAggregation,
    pub kl: Option<KlPenalty>,
    pub correction: MismatchCorrection,
    /// On-policy distillation: the advantages are per token (`opd::token_advantages`).
    pub distill: Option<opd::OpdConfig>,
}

/// One batch's log-probs, advantages and mask. `rollout_logprobs` are the sampler's own
/// log-probs, used for mismatch correction against `old_logprobs` (the trainer's recomputation
/// of the behaviour policy); without them no correction is applied.
#[derive(Clone, Copy, Debug)]
pub struct PolicyBatch<'a> {
    /// `[B, T]`, carries the graph.
    pub current_logprobs: &'a Tensor,
    /// `[B, T]` behaviour-policy log-probs as the trainer computes them (detached by nature).
    pub old_logprobs: &'a Tensor,
    /// `[B, T]` reference-policy log-probs; required when the KL term is on.
    pub ref_logprobs: Option<&'a Tensor>,
    /// `[B, T]` log-probs recorded by the rollout engine.
    pub rollout_logprobs: Option<&'a Tensor>,
    /// `[B]`, or `[B, T]` per-token advantages (on-policy distillation, dense process
    /// supervision).
    pub advantages: &'a Tensor,
    /// `[B, T]` 0/1, same dtype as the log-probs: 1 on the tokens the loss trains on (0 on
    /// padding and on a multi-turn episode's environment tokens). Every term reads positions
    /// only through it.
    pub mask: &'a Tensor,
}

/// The scalar loss and the figures that go with it.
#[derive(Debug)]
pub struct GrpoLossOutput {
    /// Differentiable scalar.
    pub loss: Tensor,
    pub clip: ClipFractions,
    /// Masked token-mean of the per-token KL estimate, when the term is on.
    pub kl_mean: Option<f64>,
    /// The trainer/rollout ratio, when rollout log-probs were given.
    pub mismatch: Option<RatioStats>,
}

impl GrpoLoss {
    /// Advantages of a flat list of rewards in groups of `group_size`.
    pub fn advantages(&self, rewards: &[f64], group_size: usize) -> Result<Vec<f64>, GrpoError> {
        self.advantage.advantages(rewards, group_size)
    }

    pub fn compute(&self, batch: &PolicyBatch<'_>) -> Result<GrpoLossOutput, GrpoError> {
        check_shapes(batch)?;
        let policy = self.policy.per_token(
            batch.current_logprobs,
            batch.old_logprobs,
            batch.advantages,
            batch.mask,
        )?;
        let mut per_token = policy.per_token_loss;
        let mut mismatch = None;
        if let Some(rollout) = batch.rollout_logprobs {
            let corrected = self
                .correction
                .weights(batch.old_logprobs, rollout, batch.mask)?;
            per_token = (per_token * corrected.weights)?;
            mismatch = Some(corrected.stats);
        }
        let mut kl_mean = None;
        if let Some(kl) = self.kl {
            let reference = batch.ref_logprobs.ok_or_else(|| {
                GrpoError::Shape("beta > 0 needs reference log-probs".to_string())
            })?;
            let per_token_kl = kl.estimator.per_token(batch.current_logprobs, reference)?;
            kl_mean = Some(masked_token_mean(&per_token_kl, batch.mask)?);
            per_token = (per_token + (per_token_kl * kl.beta)?)?;
        }
        let loss = self.aggregation.aggregate(&per_token, batch.mask)?;
        Ok(GrpoLossOutput {
            loss,
            clip: policy.clip,
            kl_mean,
            mismatch,
        })
    }
}

fn check_shapes(batch: &PolicyBatch<'_>) -> Result<(), GrpoError> {
    let dims = batch.current_logprobs.dims2().map_err(|_| {
        GrpoError::Shape(format!(
            "current log-probs must be [B, T], got {:?}",
            batch.current_logprobs.dims()
        ))
    })?;
    let named = [
        ("old log-probs", Some(batch.old_logprobs)),
        ("reference log-probs", batch.ref_logprobs),
        ("rollout log-probs", batch.rollout_logprobs),
        ("mask", Some(batch.mask)),
    ];
    for (name, tensor) in named {
        if let Some(t) = tensor
            && t.dims() != [dims.0, dims.1]
        {
            return Err(GrpoError::Shape(format!(
                "{name} must be [{}, {}] like the current log-probs, got {:?}",
                dims.0,
                dims.1,
                t.dims()
            )));
        }
    }
    let dtype = batch.current_logprobs.dtype();
    let all = named.iter().filter_map(|(name, t)| t.map(|t| (*name, t)));
    for (name, t) in all.chain([("advantages", batch.advantages)]) {
        if t.dtype() != dtype {
            return Err(GrpoError::Shape(format!(
                "{name}: dtype {:?}, but the current log-probs are {dtype:?}",
                t.dtype()
            )));
        }
    }
    if batch.advantages.dims() != [dims.0] && batch.advantages.dims() != [dims.0, dims.1] {
        return Err(GrpoError::Shape(format!(
            "advantages must be [{}] or [{}, {}], got {:?}",
            dims.0,
            dims.0,
            dims.1,
            batch.advantages.dims()
        )));
    }
    Ok(())
}

fn masked_token_mean(values: &Tensor, mask: &Tensor) -> Result<f64, GrpoError> {
    let values = values.detach().to_dtype(DType::F64)?;
    let mask = mask.to_dtype(DType::F64)?;
    let total = (values * &mask)?.sum_all()?.to_scalar::<f64>()?;
    let tokens = mask.sum_all()?.to_scalar::<f64>()?;
    Ok(total / tokens.max(1.0))
}
