//! Learning-rate schedules (constant, cosine, warmup-stable-decay), batch-size warmup and the
//! square-root batch-size lr rule.
//!
//! What it is: pure functions of the optimizer step (or tokens seen) returning a factor that
//! multiplies the configured peak lr, or a batch size. Conventions, shared by all schedules:
//! `step` counts optimizer steps completed before the update being scheduled (0 for the first);
//! linear warmup gives `(step + 1) / warmup_steps` so the first update already moves and the
//! last warmup step reaches 1.0; decays reach `min_lr_ratio` exactly at their last step and
//! stay there.
//! What it is not: stateful. Nothing here is saved in a checkpoint beyond the step count, which
//! is why WSD can be re-planned: a run resumed from a stable-phase checkpoint with a different
//! `decay_start` follows the new plan from its step on.
//! Invariant: `lr_factor` never panics and returns a finite number in `[0, 1]` for every step
//! and every schedule that `validate` accepts.

use serde::{Deserialize, Serialize};

use crate::error::OptimError;

/// The shape of WSD's decay phase, as a function of progress `p` in `[0, 1]`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DecayShape {
    /// `1 - p`
    Linear,
    /// `(1 + cos(pi p)) / 2`
    Cosine,
    /// `1 - sqrt(p)` (Hägele et al. 2024, "Scaling Laws and Compute-Optimal Training Beyond
    /// Fixed Training Durations": the best of the shapes they compared for short cooldowns).
    Sqrt,
}

impl DecayShape {
    fn remaining(self, progress: f64) -> f64 {
        match self {
            DecayShape::Linear => 1.0 - progress,
            DecayShape::Cosine => 0.5 * (1.0 + (std::f64::consts::PI * progress).cos()),
            DecayShape::Sqrt => 1.0 - progress.sqrt(),
        }
    }
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LrSchedule {
    Constant {
        warmup_steps: u64,
    },
    Cosine {
        warmup_steps: u64,
        total_steps: u64,
        min_lr_ratio: f64,
    },
    /// warmup-stable-decay: linear warmup, constant until `decay_start`, then decay to
    /// `min_lr_ratio` over `decay_steps` (shape linear | cosine | sqrt (1 - sqrt)). `decay_start`
    /// can be set later than the run that wrote a stable-phase checkpoint planned, so decay can
    /// start from any saved stable checkpoint.
    Wsd {
        warmup_steps: u64,
        decay_start: u64,
        decay_steps: u64,
        min_lr_ratio: f64,
        decay_shape: DecayShape,
    },
}

impl LrSchedule {
    /// The factor for the update after `step` completed optimizer steps.
    pub fn lr_factor(&self, step: u64) -> f64 {
        match *self {
            LrSchedule::Constant { warmup_steps } => warmup(step, warmup_steps).unwrap_or(1.0),
            LrSchedule::Cosine {
                warmup_steps,
                total_steps,
                min_lr_ratio,
            } => {
                warmup(step, warmup_steps).unwrap_or_else(|| {
                    let span = total_steps.saturating_sub(warmup_steps);
                    // `span` updates after warmup, the last of which (step total_steps - 1)
                    // is at `min_lr_ratio`.
                    let progress = progress((step - warmup_steps).saturating_add(1), span);
                    decayed(DecayShape::Cosine, progress, min_lr_ratio)
                })
            }
            LrSchedule::Wsd {
                warmup_steps,
                decay_start,
                decay_steps,
                min_lr_ratio,
                decay_shape,
            } => {
                warmup(step, warmup_steps).unwrap_or_else(|| {
                    if step < decay_start {
                        1.0
                    } else {
                        // `decay_steps` updates, the last of which is at `min_lr_ratio`.
                        let progress =
                            progress((step - decay_start).saturating_add(1), decay_steps);
                        decayed(decay_shape, progress, min_lr_ratio)
                    }
                })
            }
        }
    }

    /// A WSD plan for a run of `total_steps`: decay over the last `decay_fraction` of the run
    /// (rounded to whole steps) with the 1 - sqrt shape, down to 0.
    pub fn wsd_for(total_steps: u64, warmup_steps: u64, decay_fraction: f64) -> LrSchedule {
        let fraction = if decay_fraction.is_finite() {
            decay_fraction.clamp(0.0, 1.0)
        } else {
            0.0
        };
        let decay_steps = ((total_steps as f64) * fraction).round() as u64;
        let decay_steps = decay_steps.min(total_steps.saturating_sub(warmup_steps));
        LrSchedule::Wsd {
            warmup_steps,
            decay_start: total_steps - decay_steps,
            decay_steps,
            min_lr_ratio: 0.0,
            decay_shape: DecayShape::Sqrt,
        }
    }

    /// Checks that the schedule's numbers make sense together (field names as in the file).
    pub fn validate(&self) -> Result<(), OptimError> {
        let bad = |field: &str, reason: String| OptimError::InvalidConfig {
            field: format!("schedule.{field}"),
            reason,
        };
        let check_ratio = |ratio: f64| {
            if (0.0..=1.0).contains(&ratio) {
                Ok(())
            } else {
                Err(bad("min_lr_ratio", format!("{ratio} is not in [0, 1]")))
            }
        };
        match *self {
            LrSchedule::Constant { .. } => Ok(()),
            LrSchedule::Cosine {
                warmup_steps,
                total_steps,
                min_lr_ratio,
            } => {
                check_ratio(min_lr_ratio)?;
                if warmup_steps > total_steps {
                    return Err(bad(
                        "warmup_steps",
                        format!("{warmup_steps} exceeds total_steps {total_steps}"),
                    ));
                }
                Ok(())
            }
            LrSchedule::Wsd {
                warmup_steps,
                decay_start,
                min_lr_ratio,
                ..
            } => {
                check_ratio(min_lr_ratio)?;
                if warmup_steps > decay_start {
                    return Err(bad(
                        "warmup_steps",
                        format!("{warmup_steps} exceeds decay_start {decay_start}"),
                    ));
                }
                Ok(())
            }
        }
    }
}

/// `Some((step + 1) / warmup_steps)` during warmup, `None` after it.
fn warmup(step: u64, warmup_steps: u64) -> Option<f64> {
    (step < warmup_steps).then(|| (step + 1) as f64 / warmup_steps as f64)
}

/// `done / span` clamped to `[0, 1]`; an empty span counts as finished.
fn progress(done: u64, span: u64) -> f64 {
    if span == 0 {
        1.0
    } else {
        (done as f64 / span as f64).min(1.0)
    }
}

fn decayed(shape: DecayShape, progress: f64, min_lr_ratio: f64) -> f64 {
    min_lr_ratio + (1.0 - min_lr_ratio) * shape.remaining(progress)
}

/// Batch-size warmup: tokens per optimizer step ramp linearly from `start_tokens_per_step` to
/// `end_tokens_per_step` over the first `ramp_tokens` training tokens, then stay at the end
/// value. (The trainer rounds to whole micro-batches.)
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchSizeWarmup {
    pub start_tokens_per_step: u64,
    pub end_tokens_per_step: u64,
    pub ramp_tokens: u64,
}

impl BatchSizeWarmup {
    pub fn tokens_per_step(&self, tokens_seen: u64) -> u64 {
        if tokens_seen >= self.ramp_tokens {
            return self.end_tokens_per_step;
        }
        // Integer interpolation in i128: exact, and no overflow for any u64 inputs.
        let start = i128::from(self.start_tokens_per_step);
        let end = i128::from(self.end_tokens_per_step);
        let value = start + (end - start) * i128::from(tokens_seen) / i128::from(self.ramp_tokens);
        value.clamp(0, i128::from(u64::MAX)) as u64
    }
}

/// The square-root scaling rule for Adam-family optimizers (Malladi et al. 2022): an lr tuned
/// at `base_batch` becomes `base_lr * sqrt(batch / base_batch)` at `batch`. A `base_batch` of 0
/// has no meaning and returns `base_lr` unchanged.
pub fn sqrt_batch_lr(base_lr: f64, base_batch: u64, batch: u64) -> f64 {
    if base_batch == 0 {
        return base_lr;
    }
    base_lr * (batch as f64 / base_batch as f64).sqrt()
}
