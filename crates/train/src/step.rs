//! The optimizer step every objective shares: the trainer loop (pretraining, SFT), GRPO's policy
//! update and the preference objectives each compute their micro-batch losses and backward
//! passes, add the gradients into a [`GradientSum`], and hand it to [`StepEngine::finish`], which
//! does the rest in one place:
//!
//! 1. a non-finite loss or gradient norm skips the step (weights and optimizer state untouched)
//!    and counts towards `max_bad_steps` consecutive bad steps, after which the caller stops;
//! 2. the loss-spike detector decides (skip the batch and/or tighten the clip; off for GRPO);
//! 3. the global norm is clipped, the learning rate is `peak lr * schedule(step)`, and the
//!    optimizer steps.
//!
//! Steps count calls that ended a step, applied or skipped, so a skipped batch keeps the run on
//! its planned learning-rate curve; the optimizer counts its applied updates itself. The
//! engine's counters and the spike state are part of every checkpoint ([`EngineState`]), so a
//! resumed run decides exactly as an uninterrupted one.
//!
//! Before `finish`, every objective runs its micro-batches through the one loop here,
//! [`accumulate`]: each micro-batch gives its loss (not yet weighted) and its weight in the step
//! ([`MicroLoss`]); the loop backpropagates `loss * weight`, adds the gradients, sums
//! `weight * value` as the step's loss, and stops at the first non-finite loss (nothing after it
//! runs, and the step is then skipped by `finish`). The objectives differ only in their batch
//! type and their weights: packed rows weigh `1 / loss tokens of the step` (pretraining, SFT,
//! distillation), preference pairs `pairs in the micro-batch / pairs in the step`, GRPO's groups
//! by the loss aggregation's share.
//!
//! What this is not: no forward pass, no data, no logging.

use candle_core::backprop::GradStore;
use candle_core::{Tensor, Var};
use serde::{Deserialize, Serialize};
use stoke_optim::{LrSchedule, Optimizer, clip_to_norm, global_grad_norm};

pub use crate::checkpoint::EngineState;
use crate::config::peak_lr;
use crate::error::TrainError;
use crate::spike::{SpikeAction, SpikeDetector, SpikePolicy};

/// Gradients summed over backward passes, one slot per optimizer parameter.
pub struct GradientSum {
    params: Vec<Var>,
    sums: Vec<Option<Tensor>>,
}

impl GradientSum {
    fn new(params: Vec<Var>) -> GradientSum {
        let sums = vec![None; params.len()];
        GradientSum { params, sums }
    }

    /// Adds the gradients of one backward pass.
    pub fn add(&mut self, store: &GradStore) -> Result<(), TrainError> {
        for (slot, var) in self.sums.iter_mut().zip(&self.params) {
            if let Some(grad) = store.get(var.as_tensor()) {
                *slot = Some(match slot.take() {
                    None => grad.clone(),
                    Some(sum) => (sum + grad)?,
                });
            }
        }
        Ok(())
    }

    /// One gradient per parameter, zeros where none arrived.
    fn into_tensors(self) -> Result<Vec<Tensor>, TrainError> {
        self.sums
            .into_iter()
            .zip(&self.params)
            .map(|(sum, var)| match sum {
                Some(sum) => Ok(sum),
                None => Ok(var.as_tensor().zeros_like()?),
            })
            .collect()
    }
}

/// Turns the gradient store of a weighted loss into the stores to add, for scoring split over
/// several graphs (the preference objectives' sharded log-probabilities).
pub type SplitBackward = Box<dyn FnOnce(&GradStore) -> Result<Vec<GradStore>, TrainError>>;

/// One micro-batch's share of a step.
pub struct MicroLoss {
    /// Differentiable scalar, not yet weighted.
    pub loss: Tensor,
    /// The loss's value as the step's loss counts it (checked for being finite).
    pub value: f64,
    /// The micro-batch's weight in the step: the loop backpropagates `loss * weight`.
    pub weight: f64,
    /// None: the backward pass's store is the gradient itself.
    pub split: Option<SplitBackward>,
}

impl MicroLoss {
    pub fn new(loss: Tensor, value: f64, weight: f64) -> MicroLoss {
        MicroLoss {
            loss,
            value,
            weight,
            split: None,
        }
    }
}

/// What a step's micro-batches added up to.
pub struct Accumulated {
    /// `sum(weight * value)` over the micro-batches that ran.
    pub loss: f64,
    /// The summed gradients; None when a non-finite loss stopped the loop.
    pub grads: Option<GradientSum>,
}

/// The micro-batch loop of every objective (see the module doc): `micro_loss` turns one
/// micro-batch into its [`MicroLoss`], or None when it has nothing to learn from (no backward
/// pass, nothing added).
pub fn accumulate<B>(
    mut grads: GradientSum,
    micro_batches: impl IntoIterator<Item = B>,
    mut micro_loss: impl FnMut(B) -> Result<Option<MicroLoss>, TrainError>,
) -> Result<Accumulated, TrainError> {
    let mut loss = 0.0;
    for batch in micro_batches {
        let Some(micro) = micro_loss(batch)? else {
            continue;
        };
        loss += micro.weight * micro.value;
        if !micro.value.is_finite() {
            return Ok(Accumulated { loss, grads: None });
        }
        let store = (micro.loss * micro.weight)?.backward()?;
        match micro.split {
            None => grads.add(&store)?,
            Some(split) => {
                for store in split(&store)? {
                    grads.add(&store)?;
                }
            }
        }
    }
    Ok(Accumulated {
        loss,
        grads: Some(grads),
    })
}

/// Whether a step's update was applied (also the `outcome` field of the metric logs).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepOutcome {
    #[default]
    Applied,
    /// The loss spiked and the policy skips such batches.
    SkippedSpike,
    /// A non-finite input, loss or gradient norm: nothing was applied.
    SkippedNonFinite,
    /// Nothing to learn from (no loss token, no sample).
    SkippedEmpty,
}

impl StepOutcome {
    /// The snake_case name the logs use.
    pub fn name(self) -> &'static str {
        match self {
            StepOutcome::Applied => "applied",
            StepOutcome::SkippedSpike => "skipped_spike",
            StepOutcome::SkippedNonFinite => "skipped_non_finite",
            StepOutcome::SkippedEmpty => "skipped_empty",
        }
    }
}

/// How steps are taken.
#[derive(Clone, Debug, PartialEq)]
pub struct StepSettings {
    /// Multiplies the optimizer config's lr; indexed by steps done.
    pub schedule: LrSchedule,
    /// Global-norm clip; None turns it off.
    pub clip_norm: Option<f64>,
    pub spike: SpikePolicy,
    /// Consecutive non-finite steps after which the run stops (at least 1).
    pub max_bad_steps: u64,
}

impl StepSettings {
    /// No spike handling (GRPO's updates, preference runs that ask for none).
    pub fn spike_off() -> SpikePolicy {
        SpikePolicy {
            action: SpikeAction::Off,
            ..SpikePolicy::default()
        }
    }
}

impl StepSettings {
    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<(), TrainError> {
        let invalid = |key: &str, message: String| {
            TrainError::Config(crate::config::ConfigError::Invalid {
                key: key.to_string(),
                message,
            })
        };
        if let Some(norm) = self.clip_norm
            && !(norm.is_finite() && norm > 0.0)
        {
            return Err(invalid(
                "clip_norm",
                format!("must be finite and > 0, got {norm}"),
            ));
        }
        if self.max_bad_steps == 0 {
            return Err(invalid("max_bad_steps", "must be at least 1".into()));
        }
        self.schedule.validate()?;
        self.spike
            .validate()
            .map_err(|message| invalid("spike", message))
    }
}

/// What a finished step did.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct StepResult {
    pub outcome: StepOutcome,
    /// Global gradient norm before clipping (NaN when the loss was already non-finite; 0 when
    /// empty).
    pub grad_norm: f64,
    /// Learning rate of this step (peak times schedule factor; reported also when skipped).
    pub lr: f64,
    /// The loss was a spike (whatever the policy did about it).
    pub spike: bool,
    /// The clip threshold used instead of the configured one (tightened after a spike).
    pub clip_override: Option<f64>,
    /// Non-finite steps in a row, counting this one (0 after a good step).
    pub consecutive_bad_steps: u64,
    /// `consecutive_bad_steps` reached `max_bad_steps`: the caller records the step and stops.
    pub stop: bool,
}

/// Owns the optimizer and the state of the step rules.
pub struct StepEngine {
    optimizer: Optimizer,
    settings: StepSettings,
    spike: SpikeDetector,
    steps: u64,
    consecutive_bad_steps: u64,
    skipped_steps: u64,
}

impl std::fmt::Debug for StepEngine {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("StepEngine")
            .field("optimizer", &self.optimizer)
            .field("settings", &self.settings)
            .field("steps", &self.steps)
            .field("consecutive_bad_steps", &self.consecutive_bad_steps)
            .finish()
    }
}

impl StepEngine {
    /// The engine at step 0 (the settings are checked by [`StepSettings::validate`], or by the
    /// config they come from).
    pub fn new(optimizer: Optimizer, settings: StepSettings) -> StepEngine {
        let spike = SpikeDetector::new(settings.spike.clone());
        StepEngine {
            optimizer,
            settings,
            spike,
            steps: 0,
            consecutive_bad_steps: 0,
            skipped_steps: 0,
        }
    }

    pub fn optimizer(&self) -> &Optimizer {
        &self.optimizer
    }

    /// For checkpoint load.
    pub fn optimizer_mut(&mut self) -> &mut Optimizer {
        &mut self.optimizer
    }

    pub fn settings(&self) -> &StepSettings {
        &self.settings
    }

    /// Steps ended so far (applied or skipped).
    pub fn steps(&self) -> u64 {
        self.steps
    }

    pub fn skipped_steps(&self) -> u64 {
        self.skipped_steps
    }

    pub fn consecutive_bad_steps(&self) -> u64 {
        self.consecutive_bad_steps
    }

    pub fn spikes(&self) -> u64 {
        self.spike.spikes
    }

    /// Resume: the schedule continues from `steps`.
    pub fn set_steps(&mut self, steps: u64) {
        self.steps = steps;
    }

    /// Resume: the streak of non-finite steps a checkpoint ended on.
    pub fn set_consecutive_bad_steps(&mut self, count: u64) {
        self.consecutive_bad_steps = count;
    }

    /// The learning rate the next step uses.
    pub fn next_lr(&self) -> f64 {
        peak_lr(self.optimizer.config()) * self.settings.schedule.lr_factor(self.steps)
    }

    /// An empty gradient sum over the optimizer's parameters.
    pub fn gradients(&self) -> GradientSum {
        GradientSum::new(
            self.optimizer
                .params()
                .iter()
                .map(|(_, var)| var.clone())
                .collect(),
        )
    }

    /// Ends a step with nothing to learn from.
    pub fn skip_empty(&mut self) -> StepResult {
        let lr = self.next_lr();
        self.steps += 1;
        self.skipped_steps += 1;
        StepResult {
            outcome: StepOutcome::SkippedEmpty,
            grad_norm: 0.0,
            lr,
            spike: false,
            clip_override: None,
            consecutive_bad_steps: self.consecutive_bad_steps,
            stop: false,
        }
    }

    /// Ends a step: `loss` is the objective over the whole step, `grads` the accumulated
    /// gradient (None when a non-finite value stopped the accumulation early). See the module
    /// doc for the rules.
    pub fn finish(
        &mut self,
        loss: f64,
        grads: Option<GradientSum>,
    ) -> Result<StepResult, TrainError> {
        let lr = self.next_lr();
        let factor = self.settings.schedule.lr_factor(self.steps);
        self.steps += 1;
        let mut result = StepResult {
            outcome: StepOutcome::SkippedNonFinite,
            grad_norm: f64::NAN,
            lr,
            spike: false,
            clip_override: None,
            consecutive_bad_steps: 0,
            stop: false,
        };
        let mut grads = match grads {
            Some(grads) if loss.is_finite() => {
                let grads = grads.into_tensors()?;
                result.grad_norm = global_grad_norm(&grads)?;
                Some(grads)
            }
            _ => None,
        };
        let Some(grads) = grads.as_mut().filter(|_| result.grad_norm.is_finite()) else {
            self.consecutive_bad_steps += 1;
            self.skipped_steps += 1;
            result.consecutive_bad_steps = self.consecutive_bad_steps;
            result.stop = self.consecutive_bad_steps >= self.settings.max_bad_steps;
            return Ok(result);
        };
        self.consecutive_bad_steps = 0;
        let configured = self.settings.clip_norm;
        let decision = self.spike.decide(loss, configured);
        let applied = !decision.skip;
        result.spike = decision.is_spike;
        result.clip_override = decision.clip_override;
        self.spike.record(loss, result.grad_norm, applied);
        if applied {
            if let Some(max_norm) = decision.clip_override.or(configured) {
                clip_to_norm(grads, max_norm, result.grad_norm)?;
            }
            self.optimizer.step(grads, factor)?;
            result.outcome = StepOutcome::Applied;
        } else {
            self.skipped_steps += 1;
            result.outcome = StepOutcome::SkippedSpike;
        }
        Ok(result)
    }

    pub fn state(&self) -> EngineState {
        EngineState {
            steps: self.steps,
            consecutive_bad_steps: self.consecutive_bad_steps,
            skipped_steps: self.skipped_steps,
            spike: self.spike.to_json(),
        }
    }

    /// Continues from a checkpoint's state (the optimizer state is loaded separately).
    pub fn restore(&mut self, state: EngineState) -> Result<(), TrainError> {
        if !state.spike.is_null() {
            self.spike
                .restore(state.spike)
                .map_err(TrainError::Resume)?;
        }
        self.steps = state.steps;
        self.consecutive_bad_steps = state.consecutive_bad_steps;
        self.skipped_steps = state.skipped_steps;
        Ok(())
    }
}
