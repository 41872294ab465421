//! The GRPO policy update: one optimizer step of the policy on the samples of one update.
//!
//! One update, top to bottom:
//! 1. check the samples (log-prob lengths, reference log-probs present when the KL term is on)
//!    and that every number the loss will use is finite (a NaN advantage or log-prob skips the
//!    step before any forward pass);
//! 2. split the samples (in order) into micro-batches by padded token budget
//!    ([`token_budget_batches`]); per micro-batch score the completions under the policy
//!    ([`completion_logprobs`], with the graph), build the [`PolicyBatch`] (old log-probs given
//!    or, on-policy, the current ones detached so the ratio is exactly 1, as TRL does; rollout
//!    log-probs when mismatch correction is on; reference log-probs when the KL term is on),
//!    compute [`GrpoLoss`], weight it and backpropagate, adding gradients into one buffer per
//!    parameter;
//!    A sample's `token_advantages` (dense process supervision) make the batch's advantages
//!    `[B, T]`: its own per token, the others' repeated over their tokens;
//! 3. PTX (InstructGPT): when a packed batch is given and `ptx_coef` is set, add
//!    `coef * mean next-token loss` of that batch ([`NextTokenObjective`]);
//! 4. a non-finite loss or gradient norm skips the step: weights and optimizer state untouched;
//! 5. clip the global norm, `lr = peak lr * schedule(steps)`, step the optimizer.
//!
//! Micro-batch weights make the accumulated gradient equal the gradient of the loss over the
//! whole batch: token-mean divides by the batch's loss-token count, so micro-batch `m` weighs
//! `tokens_m / tokens`; the per-sequence aggregations average over sequences, so it weighs
//! `rows_m / rows` (Dr. GRPO's constant `max_len` does not depend on the split).
//!
//! Loss mask (multi-turn episodes): a sample's [`PolicySample::loss_mask`] marks the completion
//! tokens the model sampled; the others (environment and tool tokens) are read like padding.
//! The loss's `[B, T]` mask is the completion mask times the loss mask, and every input at a
//! masked position (current, old, rollout and reference log-probs) is set to exactly 0, as
//! padding is. Every consumer reads positions only through that mask, so a masked token counts
//! in nothing: the policy loss and its aggregation (token-mean over loss tokens, sequence-mean
//! over a sequence's loss tokens, Dr. GRPO's constant divisor unchanged), the sequence-level
//! ratio, the KL term and its mean, the entropy, clip fractions, the mismatch weights and their
//! figures, on-policy distillation's per-token advantages. "Tokens" below and in the report are
//! loss tokens. A sample with no loss token weighs like an empty completion: nothing at token
//! level, one (zero) row of the mean at sequence level. Invariant: a `None` mask takes the
//! single-turn path unchanged, and an all-true mask gives the same update bit for bit.
//!
//! Steps count update calls that returned a report (applied or skipped, as the trainer loop
//! counts them), so a skipped update keeps the learning rate on its planned curve; the
//! optimizer counts its applied updates itself. [`PolicyUpdater::set_steps`] restores the count
//! on resume.
//!
//! What this is not: no rollout, no rewards, no advantages (the caller computes them per group),
//! no pipeline types; the policy's weights change in place (the optimizer owns them through
//! shared `Var`s), so publishing them to a sampler is the caller's snapshot.

use std::time::Instant;

use candle_core::{DType, Device, Tensor};
use stoke_data::packing::PackedBatch;
use stoke_model::Transformer;
use stoke_optim::{LrSchedule, Optimizer, OptimizerConfig};

use super::sequences::{SequenceRow, completion_logprobs, token_budget_batches};
use super::{
    ClipFractions, GrpoError, GrpoLoss, GrpoLossOutput, LossAggregation, PolicyBatch, PolicyLoss,
    RatioLevel, RatioStats,
};
use crate::config::ConfigError;
use crate::error::TrainError;
use crate::objective::{NextTokenObjective, Objective};
use crate::step::{MicroLoss, StepEngine, StepResult, StepSettings, accumulate};

/// A micro-batch of one update: a range of the samples, or the pretraining batch mixed in with
/// its coefficient.
enum Micro<'b> {
    Samples(std::ops::Range<usize>),
    Ptx(&'b PackedBatch, f64),
}

/// One sampled completion, with what the loss needs about it. Log-prob slices have one entry
/// per completion token.
#[derive(Clone, Copy, Debug)]
pub struct PolicySample<'a> {
    pub prompt_ids: &'a [u32],
    pub completion_ids: &'a [u32],
    /// The sampler's log-probs (read only when mismatch correction is on).
    pub rollout_logprobs: &'a [f32],
    /// None: on-policy, the trainer's own detached log-probs are the old policy (ratio 1, as TRL).
    pub old_logprobs: Option<&'a [f32]>,
    /// Required when the loss has a KL term.
    pub ref_logprobs: Option<&'a [f32]>,
    pub advantage: f64,
    /// One entry per completion token, `true` where the model sampled it (multi-turn: the
    /// environment's tokens are `false` and are not trained on); `None`: every token is the
    /// model's.
    pub loss_mask: Option<&'a [bool]>,
    /// One advantage per completion token, replacing `advantage` (dense process supervision,
    /// `process_advantage::process_token_advantages`); `None`: `advantage` for every token.
    pub token_advantages: Option<&'a [f64]>,
}

impl PolicySample<'_> {
    /// The completion tokens the loss trains on (the model's).
    pub fn loss_tokens(&self) -> usize {
        self.loss_mask.map_or(self.completion_ids.len(), |mask| {
            mask.iter().filter(|&&sampled| sampled).count()
        })
    }

    /// Whether completion token `t` is one the loss trains on.
    fn counts(&self, t: usize) -> bool {
        self.loss_mask.is_none_or(|mask| mask[t])
    }
}

/// How updates are computed.
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateSettings {
    pub loss: GrpoLoss,
    /// Multiplies the optimizer config's lr; indexed by [`PolicyUpdater::steps`].
    pub schedule: LrSchedule,
    /// Global-norm clip; None turns it off.
    pub clip_grad_norm: Option<f64>,
    /// Padded (prompt + completion) tokens per micro-batch.
    pub micro_batch_tokens: usize,
    /// Coefficient of the PTX next-token loss; None (or 0) turns it off.
    pub ptx_coef: Option<f64>,
    /// Feed the samples' rollout log-probs to the loss's mismatch correction.
    pub use_mismatch_correction: bool,
}

impl UpdateSettings {
    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<(), TrainError> {
        let invalid = |key: &str, message: String| {
            TrainError::Config(ConfigError::Invalid {
                key: key.to_string(),
                message,
            })
        };
        if self.micro_batch_tokens == 0 {
            return Err(invalid("micro_batch_tokens", "must be at least 1".into()));
        }
        if let Some(norm) = self.clip_grad_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            return Err(invalid(
                "clip_grad_norm",
                format!("must be finite and > 0, got {norm}"),
            ));
        }
        if let Some(coef) = self.ptx_coef
            && !(coef.is_finite() && coef >= 0.0)
        {
            return Err(invalid(
                "ptx.coef",
                format!("must be finite and >= 0, got {coef}"),
            ));
        }
        self.schedule.validate()?;
        for check in [
            self.loss.advantage.validate(),
            self.loss.policy.validate(),
            self.loss.aggregation.validate(),
            self.loss.correction.validate(),
        ] {
            check.map_err(grpo_error)?;
        }
        Ok(())
    }
}

/// What an update did: the shared step outcome (an update is never skipped as a spike, since
/// GRPO runs without a spike policy).
pub use crate::step::StepOutcome as UpdateOutcome;

/// The figures of one update.
#[derive(Clone, Debug, PartialEq)]
pub struct UpdateReport {
    pub outcome: UpdateOutcome,
    /// The differentiated objective: GRPO loss over the whole batch plus `coef * ptx_loss`
    /// (NaN when a non-finite input stopped the update before any forward pass; 0 when empty).
    pub loss: f64,
    /// Mean next-token loss (nats) of the PTX batch, when PTX ran.
    pub ptx_loss: Option<f64>,
    /// Global gradient norm before clipping (NaN when the loss was already non-finite).
    pub grad_norm: f64,
    /// Learning rate of this update (peak times schedule factor; reported also when skipped).
    pub lr: f64,
    /// Over the whole batch: tokens (token-level ratio) or completions (sequence level).
    pub clip: ClipFractions,
    /// Masked token-mean of the per-token KL estimate, when the term is on.
    pub kl_mean: Option<f64>,
    /// Token-mean entropy (nats) of the policy at the completion positions.
    pub entropy_mean: f64,
    /// Trainer/rollout ratio figures, when mismatch correction is on.
    pub mismatch: Option<RatioStats>,
    /// Loss tokens in the batch: completion tokens the model sampled (all of them without a
    /// loss mask).
    pub tokens: usize,
    pub seconds: f64,
}

/// Owns the policy and its optimizer; [`PolicyUpdater::update`] is one optimizer step, taken by
/// the shared [`StepEngine`] (no spike policy: the caller decides when bad steps stop the run).
pub struct PolicyUpdater {
    model: Transformer,
    engine: StepEngine,
    settings: UpdateSettings,
}

impl std::fmt::Debug for PolicyUpdater {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PolicyUpdater")
            .field("engine", &self.engine)
            .field("settings", &self.settings)
            .finish()
    }
}

impl PolicyUpdater {
    /// Validates the settings and builds the optimizer over the model's parameters.
    pub fn new(
        model: Transformer,
        optimizer: OptimizerConfig,
        settings: UpdateSettings,
    ) -> Result<PolicyUpdater, TrainError> {
        settings.validate()?;
        // Under LoRA only the adapters train.
        let optimizer = Optimizer::new(optimizer, model.trainable_parameters())?;
        let engine = StepEngine::new(
            optimizer,
            StepSettings {
                schedule: settings.schedule.clone(),
                clip_norm: settings.clip_grad_norm,
                spike: StepSettings::spike_off(),
                // Never reached: the caller owns the stop rule (`grpo.max_bad_steps`) and reads
                // the streak from `consecutive_bad_steps`.
                max_bad_steps: u64::MAX,
            },
        );
        Ok(PolicyUpdater {
            model,
            engine,
            settings,
        })
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn optimizer(&self) -> &Optimizer {
        self.engine.optimizer()
    }

    /// For checkpoint load.
    pub fn optimizer_mut(&mut self) -> &mut Optimizer {
        self.engine.optimizer_mut()
    }

    pub fn settings(&self) -> &UpdateSettings {
        &self.settings
    }

    /// Updates done so far (applied or skipped).
    pub fn steps(&self) -> u64 {
        self.engine.steps()
    }

    /// Resume: the schedule continues from `steps`.
    pub fn set_steps(&mut self, steps: u64) {
        self.engine.set_steps(steps);
    }

    /// Non-finite updates in a row up to now (0 after an applied or empty one).
    pub fn consecutive_bad_steps(&self) -> u64 {
        self.engine.consecutive_bad_steps()
    }

    /// Resume: the streak of non-finite updates the checkpoint ended on.
    pub fn set_consecutive_bad_steps(&mut self, count: u64) {
        self.engine.set_consecutive_bad_steps(count);
    }

    /// The step engine's state, as every command's checkpoint keeps it.
    pub fn engine_state(&self) -> crate::step::EngineState {
        self.engine.state()
    }

    /// Resume: the step engine's state of a checkpoint.
    pub fn restore_engine(&mut self, state: crate::step::EngineState) -> Result<(), TrainError> {
        self.engine.restore(state)
    }

    /// One optimizer step on `samples` (all of one update), scored at `temperature`; see the
    /// module doc. An error (malformed samples, a failed tensor operation) leaves the weights,
    /// the optimizer and the step count as they were.
    pub fn update(
        &mut self,
        samples: &[PolicySample<'_>],
        temperature: f32,
        ptx: Option<&PackedBatch>,
    ) -> Result<UpdateReport, TrainError> {
        let started = Instant::now();
        self.check_samples(samples)?;
        let tokens: usize = samples.iter().map(PolicySample::loss_tokens).sum();
        let mut report = UpdateReport {
            outcome: UpdateOutcome::SkippedEmpty,
            loss: 0.0,
            ptx_loss: None,
            grad_norm: 0.0,
            lr: self.engine.next_lr(),
            clip: ClipFractions::default(),
            kl_mean: None,
            entropy_mean: 0.0,
            mismatch: None,
            tokens,
            seconds: 0.0,
        };
        let result = if tokens > 0 {
            self.step(samples, temperature, ptx, &mut report)?
        } else {
            self.engine.skip_empty()
        };
        report.outcome = result.outcome;
        report.grad_norm = result.grad_norm;
        report.lr = result.lr;
        report.seconds = started.elapsed().as_secs_f64();
        Ok(report)
    }

    /// Steps 1-5 of the module doc for a batch with at least one loss token.
    fn step(
        &mut self,
        samples: &[PolicySample<'_>],
        temperature: f32,
        ptx: Option<&PackedBatch>,
        report: &mut UpdateReport,
    ) -> Result<StepResult, TrainError> {
        if !self.inputs_finite(samples) {
            report.loss = f64::NAN;
            return self.engine.finish(f64::NAN, None);
        }
        let mut figures = BatchFigures::new(self.policy_level(), samples.len(), report.tokens);
        let lengths: Vec<usize> = samples
            .iter()
            .map(|s| s.prompt_ids.len() + s.completion_ids.len())
            .collect();
        // The groups' micro-batches, then the pretraining mix-in (PPO-ptx) as one more.
        let ptx = ptx.zip(self.settings.ptx_coef.filter(|&c| c > 0.0));
        let micro_batches = token_budget_batches(&lengths, self.settings.micro_batch_tokens)
            .into_iter()
            .map(Micro::Samples)
            .chain(ptx.map(|(batch, coef)| Micro::Ptx(batch, coef)));
        let mut ptx_mean = None;
        let accumulated = accumulate(self.engine.gradients(), micro_batches, |micro| {
            match micro {
                Micro::Samples(range) => {
                    let chunk = &samples[range];
                    let chunk_tokens: usize = chunk.iter().map(PolicySample::loss_tokens).sum();
                    if chunk_tokens == 0 {
                        // Contributes 0 to every aggregation and nothing to the gradient.
                        return Ok(None);
                    }
                    let weight = match self.settings.loss.aggregation {
                        LossAggregation::TokenMean => chunk_tokens as f64 / report.tokens as f64,
                        LossAggregation::SequenceMeanTokenMean
                        | LossAggregation::SequenceMeanTokenSumNorm { .. } => {
                            chunk.len() as f64 / samples.len() as f64
                        }
                    };
                    let (output, entropy_sum) = self.micro_batch_loss(chunk, temperature)?;
                    let value = scalar(&output.loss)?;
                    figures.add(
                        &output,
                        value * weight,
                        entropy_sum,
                        chunk.len(),
                        chunk_tokens,
                    );
                    Ok(Some(MicroLoss::new(output.loss, value, weight)))
                }
                Micro::Ptx(batch, coef) => {
                    let output = NextTokenObjective::plain().loss(&self.model, batch)?;
                    if output.loss_tokens == 0 {
                        return Ok(None);
                    }
                    ptx_mean = Some(output.nll_sum / output.loss_tokens as f64);
                    let scale = coef / output.loss_tokens as f64;
                    Ok(Some(MicroLoss::new(output.loss_sum, output.nll_sum, scale)))
                }
            }
        })?;
        report.loss = figures.loss;
        if let (Some(mean), Some((_, coef))) = (ptx_mean, ptx) {
            report.ptx_loss = Some(mean);
            report.loss += coef * mean;
        }
        figures.finish(report, self.settings.use_mismatch_correction);
        self.engine.finish(report.loss, accumulated.grads)
    }

    /// The GRPO loss of one micro-batch (whole-micro-batch aggregation, not yet weighted) and
    /// the masked sum of its entropy.
    fn micro_batch_loss(
        &self,
        chunk: &[PolicySample<'_>],
        temperature: f32,
    ) -> Result<(GrpoLossOutput, f64), TrainError> {
        let rows: Vec<SequenceRow<'_>> = chunk
            .iter()
            .map(|s| SequenceRow {
                prompt_ids: s.prompt_ids,
                completion_ids: s.completion_ids,
            })
            .collect();
        let scores = completion_logprobs(&self.model, &rows, temperature, true)?;
        let device = self.model.device();
        let (_, width) = scores.logprobs.dims2()?;
        let loss_masks: Vec<Option<&[bool]>> = chunk.iter().map(|s| s.loss_mask).collect();
        let pad = |rows: &[&[f32]]| padded(rows, &loss_masks, width, device);
        // With a loss mask the environment's tokens become padding: out of the mask, and 0 in
        // every log-prob tensor (the single-turn path keeps its tensors untouched).
        let (mask, current) = if loss_masks.iter().any(Option::is_some) {
            let mask = loss_mask_tensor(chunk, width, device)?;
            let current = (&scores.logprobs * &mask)?;
            (mask, current)
        } else {
            (scores.mask.clone(), scores.logprobs.clone())
        };
        let current = &current;
        let old = if chunk.iter().all(|s| s.old_logprobs.is_none()) {
            current.detach()
        } else {
            let detached = current.detach().to_vec2::<f32>()?;
            let rows: Vec<&[f32]> = chunk
                .iter()
                .zip(&detached)
                .map(|(s, own)| s.old_logprobs.unwrap_or(&own[..s.completion_ids.len()]))
                .collect();
            pad(&rows)?
        };
        let rollout = if self.settings.use_mismatch_correction {
            let rows: Vec<&[f32]> = chunk.iter().map(|s| s.rollout_logprobs).collect();
            Some(pad(&rows)?)
        } else {
            None
        };
        let reference = if self.settings.loss.kl.is_some() || self.settings.loss.distill.is_some() {
            // `check_samples` made sure every sample has them.
            let rows: Vec<&[f32]> = chunk
                .iter()
                .map(|s| s.ref_logprobs.unwrap_or_default())
                .collect();
            Some(pad(&rows)?)
        } else {
            None
        };
        let mut advantages = if chunk.iter().any(|s| s.token_advantages.is_some()) {
            // Per-token advantages `[B, T]`: a sample without them repeats its own; padding 0
            // (the mask zeroes it anyway).
            let mut values = vec![0f32; chunk.len() * width];
            for (row, s) in values.chunks_mut(width).zip(chunk) {
                let tokens = s.completion_ids.len().min(width);
                match s.token_advantages {
                    Some(per_token) => {
                        for (v, a) in row.iter_mut().zip(&per_token[..tokens]) {
                            *v = *a as f32;
                        }
                    }
                    None => row[..tokens].fill(s.advantage as f32),
                }
            }
            Tensor::from_vec(values, (chunk.len(), width), device)?
        } else {
            let advantages: Vec<f32> = chunk.iter().map(|s| s.advantage as f32).collect();
            Tensor::from_vec(advantages, chunk.len(), device)?
        };
        if let (Some(distill), Some(teacher)) = (self.settings.loss.distill, reference.as_ref()) {
            // On-policy distillation: per-token advantages from the teacher's log-probs of the
            // sampled tokens against the sampler's own.
            let rows: Vec<&[f32]> = chunk.iter().map(|s| s.rollout_logprobs).collect();
            let behaviour = pad(&rows)?;
            advantages = super::opd::token_advantages(
                &behaviour,
                teacher,
                &mask,
                distill.kl_coef,
                Some((&advantages, distill.reward_weight)),
            )
            .map_err(grpo_error)?;
        }
        let reference = if self.settings.loss.kl.is_some() {
            reference
        } else {
            None
        };
        let batch = PolicyBatch {
            current_logprobs: current,
            old_logprobs: &old,
            ref_logprobs: reference.as_ref(),
            rollout_logprobs: rollout.as_ref(),
            advantages: &advantages,
            mask: &mask,
        };
        let output = self.settings.loss.compute(&batch).map_err(grpo_error)?;
        let entropy_sum = match &scores.entropy {
            Some(entropy) => scalar(&(entropy * &mask)?.sum_all()?)?,
            None => 0.0,
        };
        Ok((output, entropy_sum))
    }

    /// Refuses malformed samples, naming the sample and the field.
    fn check_samples(&self, samples: &[PolicySample<'_>]) -> Result<(), TrainError> {
        let distill = self.settings.loss.distill.is_some();
        let needs_ref = self.settings.loss.kl.is_some() || distill;
        for (i, sample) in samples.iter().enumerate() {
            let tokens = sample.completion_ids.len();
            let bad = |what: String| TrainError::Other(format!("policy sample {i}: {what}"));
            if sample.prompt_ids.is_empty() {
                return Err(bad("the prompt is empty".into()));
            }
            if let Some(mask) = sample.loss_mask
                && mask.len() != tokens
            {
                return Err(bad(format!(
                    "loss_mask has {} entries for {tokens} completion tokens",
                    mask.len()
                )));
            }
            if let Some(per_token) = sample.token_advantages {
                if per_token.len() != tokens {
                    return Err(bad(format!(
                        "token_advantages has {} entries for {tokens} completion tokens",
                        per_token.len()
                    )));
                }
                if distill {
                    return Err(bad(
                        "token_advantages cannot be combined with on-policy distillation".into(),
                    ));
                }
            }
            let mut named = vec![("old_logprobs", sample.old_logprobs)];
            if self.settings.use_mismatch_correction || distill {
                named.push(("rollout_logprobs", Some(sample.rollout_logprobs)));
            }
            if needs_ref {
                if sample.ref_logprobs.is_none() {
                    return Err(bad(if distill {
                        "ref_logprobs (the teacher's) missing, but the loss distills on-policy"
                            .into()
                    } else {
                        "ref_logprobs missing, but the loss has a KL term (beta > 0)".into()
                    }));
                }
                named.push(("ref_logprobs", sample.ref_logprobs));
            }
            for (name, values) in named {
                if let Some(values) = values
                    && values.len() != tokens
                {
                    return Err(bad(format!(
                        "{name} has {} entries for {tokens} completion tokens",
                        values.len()
                    )));
                }
            }
        }
        Ok(())
    }

    /// Whether every advantage and every log-prob the loss reads is finite (at loss tokens:
    /// the others are zeroed before the loss sees them).
    fn inputs_finite(&self, samples: &[PolicySample<'_>]) -> bool {
        samples.iter().all(|s| {
            let finite = |values: Option<&[f32]>| {
                values.is_none_or(|v| {
                    v.iter()
                        .enumerate()
                        .all(|(t, x)| x.is_finite() || !s.counts(t))
                })
            };
            s.advantage.is_finite()
                && s.token_advantages
                    .is_none_or(|v| v.iter().all(|a| a.is_finite()))
                && finite(s.old_logprobs)
                && (!(self.settings.use_mismatch_correction
                    || self.settings.loss.distill.is_some())
                    || finite(Some(s.rollout_logprobs)))
                && ((self.settings.loss.kl.is_none() && self.settings.loss.distill.is_none())
                    || finite(s.ref_logprobs))
        })
    }

    fn policy_level(&self) -> RatioLevel {
        match self.settings.loss.policy {
            PolicyLoss::Clipped { level, .. } | PolicyLoss::Cispo { level, .. } => level,
        }
    }
}

/// KL-in-reward: `beta * sum_t (rollout_lp - ref_lp)` over a sample's loss tokens (k1), to
/// subtract from the reward; `loss_mask` as in [`PolicySample::loss_mask`] (`None`: every token,
/// `Some`: the tokens marked `true`, the environment's tokens having no policy log-prob). Slices
/// of unequal length are summed over their common prefix.
pub fn kl_reward_penalty(
    rollout_logprobs: &[f32],
    ref_logprobs: &[f32],
    loss_mask: Option<&[bool]>,
    beta: f64,
) -> f64 {
    let sum: f64 = rollout_logprobs
        .iter()
        .zip(ref_logprobs)
        .enumerate()
        .filter(|(t, _)| loss_mask.is_none_or(|mask| mask.get(*t).copied().unwrap_or(false)))
        .map(|(_, (&rollout, &reference))| f64::from(rollout) - f64::from(reference))
        .sum();
    beta * sum
}

/// Running figures over the micro-batches of one update.
struct BatchFigures {
    /// Clip fractions count tokens at token level, completions at sequence level.
    level: RatioLevel,
    rows: usize,
    tokens: usize,
    /// Sum of the weighted micro-batch losses: the whole batch's GRPO loss.
    loss: f64,
    /// Clip fractions times their micro-batch's count (tokens or completions).
    clip_low: f64,
    clip_high: f64,
    clip_region: f64,
    kl_sum: Option<f64>,
    entropy_sum: f64,
    mismatch: Option<MismatchSums>,
}

/// Sums from which the combined [`RatioStats`] are rebuilt.
struct MismatchSums {
    tokens: usize,
    sum: f64,
    sum_sq: f64,
    corrected: f64,
    min: f64,
    max: f64,
}

impl BatchFigures {
    fn new(level: RatioLevel, rows: usize, tokens: usize) -> BatchFigures {
        BatchFigures {
            level,
            rows,
            tokens,
            loss: 0.0,
            clip_low: 0.0,
            clip_high: 0.0,
            clip_region: 0.0,
            kl_sum: None,
            entropy_sum: 0.0,
            mismatch: None,
        }
    }

    /// `weighted_loss` is the micro-batch's share of the whole batch's loss.
    fn add(
        &mut self,
        output: &GrpoLossOutput,
        weighted_loss: f64,
        entropy_sum: f64,
        rows: usize,
        tokens: usize,
    ) {
        self.loss += weighted_loss;
        self.entropy_sum += entropy_sum;
        let count = match self.level {
            RatioLevel::Token => tokens,
            RatioLevel::Sequence => rows,
        } as f64;
        self.clip_low += output.clip.low * count;
        self.clip_high += output.clip.high * count;
        self.clip_region += output.clip.region * count;
        if let Some(kl) = output.kl_mean {
            *self.kl_sum.get_or_insert(0.0) += kl * tokens as f64;
        }
        if let Some(stats) = output.mismatch.filter(|s| s.tokens > 0) {
            let n = stats.tokens as f64;
            let sum = stats.mean * n;
            let sum_sq = if stats.effective_sample_size > 0.0 {
                sum * sum / stats.effective_sample_size
            } else {
                0.0
            };
            let total = self.mismatch.get_or_insert(MismatchSums {
                tokens: 0,
                sum: 0.0,
                sum_sq: 0.0,
                corrected: 0.0,
                min: f64::INFINITY,
                max: f64::NEG_INFINITY,
            });
            total.tokens += stats.tokens;
            total.sum += sum;
            total.sum_sq += sum_sq;
            total.corrected += stats.fraction_corrected * n;
            total.min = total.min.min(stats.min);
            total.max = total.max.max(stats.max);
        }
    }

    /// Fills the report's figures. Sequence-level clip fractions are over all completions, as
    /// on the whole batch: a skipped micro-batch (no loss tokens) has ratio 1 and no clipped
    /// row, and so does a completion without loss tokens.
    fn finish(&self, report: &mut UpdateReport, use_mismatch_correction: bool) {
        let tokens = self.tokens.max(1) as f64;
        report.entropy_mean = self.entropy_sum / tokens;
        report.kl_mean = self.kl_sum.map(|sum| sum / tokens);
        let count = match self.level {
            RatioLevel::Token => tokens,
            RatioLevel::Sequence => self.rows.max(1) as f64,
        };
        report.clip = ClipFractions {
            low: self.clip_low / count,
            high: self.clip_high / count,
            region: self.clip_region / count,
        };
        report.mismatch = if use_mismatch_correction {
            Some(
                self.mismatch
                    .as_ref()
                    .map_or_else(RatioStats::default, |m| {
                        let n = m.tokens as f64;
                        RatioStats {
                            mean: m.sum / n,
                            min: m.min,
                            max: m.max,
                            fraction_corrected: m.corrected / n,
                            effective_sample_size: if m.sum_sq > 0.0 {
                                m.sum * m.sum / m.sum_sq
                            } else {
                                0.0
                            },
                            tokens: m.tokens,
                        }
                    }),
            )
        } else {
            None
        };
    }
}

/// `[B, width]` f32 from rows of at most `width` values, zero-padded on the right; an entry
/// its row's loss mask marks `false` is 0 too (an environment token reads like padding).
fn padded(
    rows: &[&[f32]],
    loss_masks: &[Option<&[bool]>],
    width: usize,
    device: &Device,
) -> Result<Tensor, TrainError> {
    let mut data = vec![0.0f32; rows.len() * width];
    for (b, (row, loss_mask)) in rows.iter().zip(loss_masks).enumerate() {
        let slot = &mut data[b * width..b * width + row.len()];
        slot.copy_from_slice(row);
        if let Some(mask) = loss_mask {
            for (value, _) in slot.iter_mut().zip(*mask).filter(|(_, sampled)| !**sampled) {
                *value = 0.0;
            }
        }
    }
    Ok(Tensor::from_vec(data, (rows.len(), width), device)?)
}

/// `[B, width]` 0/1 f32: 1 on the loss tokens of each sample (its completion tokens that the
/// loss mask keeps), 0 on the environment's tokens and on padding.
fn loss_mask_tensor(
    chunk: &[PolicySample<'_>],
    width: usize,
    device: &Device,
) -> Result<Tensor, TrainError> {
    let mut data = vec![0.0f32; chunk.len() * width];
    for (b, sample) in chunk.iter().enumerate() {
        for t in 0..sample.completion_ids.len() {
            data[b * width + t] = f32::from(u8::from(sample.counts(t)));
        }
    }
    Ok(Tensor::from_vec(data, (chunk.len(), width), device)?)
}

fn scalar(t: &Tensor) -> Result<f64, TrainError> {
    Ok(t.to_dtype(DType::F64)?.to_scalar::<f64>()?)
}

fn grpo_error(error: GrpoError) -> TrainError {
    match error {
        GrpoError::Tensor(e) => TrainError::Tensor(e),
        other => TrainError::Other(format!("grpo loss: {other}")),
    }
}
