//! Loss-spike detection: running statistics of the training loss and what to do when a step's
//! loss jumps far above them.
//!
//! The detector keeps exponential moving averages (bias-corrected) of the loss, of its squared
//! *upward* deviation from the running mean (the semi-deviation: a falling loss sits below its
//! lagging mean, and counting those deviations would inflate the spread exactly while training
//! goes well) and of the pre-clip gradient norm, fed only by steps that were applied. A step whose
//! loss exceeds `mean + sigma * std` and also `mean * (1 + MIN_RELATIVE_JUMP)` (after
//! `min_history` applied steps) is a spike; the
//! configured [`SpikeAction`] decides whether its batch is skipped, applied with a tightened
//! gradient clip, or both (skip it and tighten the clip for the following steps).
//!
//! What this is not: no NaN/Inf handling (the trainer refuses non-finite steps before the
//! detector sees them) and no wall clock: every decision is a function of loss and gradient-norm
//! values only, so a resumed run decides exactly as an uninterrupted one. The whole state
//! serialises with every float stored as its bit pattern (JSON decimal round trips are not
//! guaranteed exact), which keeps resume bit-identical.
//!
//! Invariants: a run of spikes cannot stall training forever: after `max_consecutive_skips`
//! skipped spikes in a row the next spiking batch is applied (and enters the statistics), since
//! a loss level that persists is the new normal, not a spike.

use serde::{Deserialize, Serialize};

/// A loss within 10% of its running mean is never a spike, however small the recent spread:
/// after a smooth stretch the semi-deviation can be tiny, and a few percent is ordinary noise.
pub const MIN_RELATIVE_JUMP: f64 = 0.1;

/// What the trainer does with a spiking batch.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum SpikeAction {
    /// Detect and report only.
    Off,
    /// Do not apply the spiking batch.
    Skip,
    /// Apply it with the clip lowered to the running mean gradient norm, and keep the lowered
    /// clip for `cooldown_steps` more steps.
    TightenClip,
    /// Skip it and run the next `cooldown_steps` steps with the lowered clip.
    Both,
}

/// Validated spike policy (see the module doc).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpikePolicy {
    pub action: SpikeAction,
    /// A loss more than `sigma` running standard deviations above the running mean is a spike.
    pub sigma: f64,
    /// Applied steps observed before detection starts.
    pub min_history: u64,
    /// EMA decay of the running statistics (0.98: about the last 50 steps).
    pub ema_decay: f64,
    /// Steps after a spike that keep the tightened clip.
    pub cooldown_steps: u64,
    /// After this many consecutive skipped spikes the next one is applied.
    pub max_consecutive_skips: u64,
}

impl Default for SpikePolicy {
    /// Skip batches more than 6 sigma above the running mean after 20 steps of history.
    fn default() -> Self {
        SpikePolicy {
            action: SpikeAction::Skip,
            sigma: 6.0,
            min_history: 20,
            ema_decay: 0.98,
            cooldown_steps: 10,
            max_consecutive_skips: 5,
        }
    }
}

impl SpikePolicy {
    pub fn validate(&self) -> Result<(), String> {
        if !(self.sigma.is_finite() && self.sigma > 0.0) {
            return Err(format!("sigma must be > 0, got {}", self.sigma));
        }
        if !(self.ema_decay > 0.0 && self.ema_decay < 1.0) {
            return Err(format!(
                "ema_decay must be in (0, 1), got {}",
                self.ema_decay
            ));
        }
        Ok(())
    }
}

/// The decision for one step.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct SpikeDecision {
    /// The loss was a spike (whatever the action).
    pub is_spike: bool,
    /// Do not apply this batch.
    pub skip: bool,
    /// Clip threshold to use instead of the configured one (never larger than it).
    pub clip_override: Option<f64>,
    /// The running mean and standard deviation the loss was compared with.
    pub mean: f64,
    pub std: f64,
}

/// Running loss statistics and the tightened-clip window; serialised into the checkpoint.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpikeDetector {
    #[serde(skip)]
    policy: SpikePolicy,
    #[serde(with = "f64_bits")]
    loss_ema: f64,
    #[serde(with = "f64_bits")]
    loss_sq_dev_ema: f64,
    #[serde(with = "f64_bits")]
    grad_norm_ema: f64,
    /// Applied steps folded into the statistics (drives bias correction).
    observations: u64,
    consecutive_skips: u64,
    /// Steps left that use `tightened_clip`.
    tightened_steps_left: u64,
    #[serde(with = "f64_bits")]
    tightened_clip: f64,
    /// Spikes seen so far (reporting).
    pub spikes: u64,
}

impl SpikeDetector {
    pub fn new(policy: SpikePolicy) -> SpikeDetector {
        SpikeDetector {
            policy,
            loss_ema: 0.0,
            loss_sq_dev_ema: 0.0,
            grad_norm_ema: 0.0,
            observations: 0,
            consecutive_skips: 0,
            tightened_steps_left: 0,
            tightened_clip: f64::INFINITY,
            spikes: 0,
        }
    }

    /// The state for a checkpoint.
    pub fn to_json(&self) -> serde_json::Value {
        serde_json::to_value(self).unwrap_or(serde_json::Value::Null)
    }

    /// Restores the state saved by [`SpikeDetector::to_json`], keeping this detector's policy.
    pub fn restore(&mut self, value: serde_json::Value) -> Result<(), String> {
        let mut restored: SpikeDetector = serde_path_to_error::deserialize(value)
            .map_err(|e| format!("spike detector state at `{}`: {}", e.path(), e.inner()))?;
        restored.policy = self.policy.clone();
        *self = restored;
        Ok(())
    }

    fn bias_corrected(&self, ema: f64) -> f64 {
        let correction = 1.0
            - self
                .policy
                .ema_decay
                .powi(self.observations.min(100_000) as i32);
        if correction > 0.0 {
            ema / correction
        } else {
            ema
        }
    }

    /// Running mean and upward semi-deviation of the applied steps' losses.
    pub fn loss_stats(&self) -> (f64, f64) {
        let mean = self.bias_corrected(self.loss_ema);
        let var = self.bias_corrected(self.loss_sq_dev_ema).max(0.0);
        (mean, var.sqrt())
    }

    /// Decides what to do with a step of finite `loss` and pre-clip `grad_norm`, given the
    /// configured clip (`None`: no clipping). Call [`SpikeDetector::record`] afterwards.
    pub fn decide(&mut self, loss: f64, configured_clip: Option<f64>) -> SpikeDecision {
        let (mean, std) = self.loss_stats();
        let is_spike = self.observations >= self.policy.min_history
            && loss > mean + self.policy.sigma * std
            && loss > mean + MIN_RELATIVE_JUMP * mean.abs();
        let forced_apply = self.consecutive_skips >= self.policy.max_consecutive_skips;
        let healthy_norm = self.bias_corrected(self.grad_norm_ema);
        let tighten_to = |configured: Option<f64>| {
            let tight = if healthy_norm > 0.0 {
                healthy_norm
            } else {
                f64::INFINITY
            };
            Some(configured.map_or(tight, |c| c.min(tight)))
        };
        let mut decision = SpikeDecision {
            is_spike,
            skip: false,
            clip_override: None,
            mean,
            std,
        };
        if is_spike {
            self.spikes += 1;
            match self.policy.action {
                SpikeAction::Off => {}
                SpikeAction::Skip => decision.skip = !forced_apply,
                SpikeAction::TightenClip => {
                    decision.clip_override = tighten_to(configured_clip);
                    self.tightened_clip = decision.clip_override.unwrap_or(f64::INFINITY);
                    self.tightened_steps_left = self.policy.cooldown_steps;
                }
                SpikeAction::Both => {
                    decision.skip = !forced_apply;
                    if forced_apply {
                        decision.clip_override = tighten_to(configured_clip);
                    }
                    self.tightened_clip = tighten_to(configured_clip).unwrap_or(f64::INFINITY);
                    self.tightened_steps_left = self.policy.cooldown_steps;
                }
            }
        } else if self.tightened_steps_left > 0 {
            self.tightened_steps_left -= 1;
            let clip = configured_clip.map_or(self.tightened_clip, |c| c.min(self.tightened_clip));
            decision.clip_override = Some(clip);
        }
        decision
    }

    /// Folds a step into the statistics: applied steps update them; skipped ones count towards
    /// the consecutive-skip limit only.
    pub fn record(&mut self, loss: f64, grad_norm: f64, applied: bool) {
        if !applied {
            self.consecutive_skips += 1;
            return;
        }
        self.consecutive_skips = 0;
        let decay = self.policy.ema_decay;
        let (mean_before, _) = self.loss_stats();
        let deviation = if self.observations == 0 {
            0.0
        } else {
            (loss - mean_before).max(0.0)
        };
        self.loss_ema = decay * self.loss_ema + (1.0 - decay) * loss;
        self.loss_sq_dev_ema = decay * self.loss_sq_dev_ema + (1.0 - decay) * deviation * deviation;
        if grad_norm.is_finite() {
            self.grad_norm_ema = decay * self.grad_norm_ema + (1.0 - decay) * grad_norm;
        }
        self.observations += 1;
    }
}

/// Serialises an f64 as its IEEE-754 bit pattern so the value round-trips exactly.
mod f64_bits {
    use serde::{Deserialize, Deserializer, Serializer};

    pub fn serialize<S: Serializer>(value: &f64, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_u64(value.to_bits())
    }

    pub fn deserialize<'de, D: Deserializer<'de>>(deserializer: D) -> Result<f64, D::Error> {
        Ok(f64::from_bits(u64::deserialize(deserializer)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn warmed(policy: SpikePolicy) -> SpikeDetector {
        let mut detector = SpikeDetector::new(policy);
        for i in 0..50 {
            let loss = 3.0 + 0.01 * ((i % 5) as f64);
            let decision = detector.decide(loss, Some(1.0));
            assert!(!decision.is_spike, "step {i}: {decision:?}");
            detector.record(loss, 0.5, true);
        }
        detector
    }

    #[test]
    fn a_jump_is_a_spike_and_skip_skips_it() {
        let mut detector = warmed(SpikePolicy::default());
        let decision = detector.decide(6.0, Some(1.0));
        assert!(decision.is_spike && decision.skip, "{decision:?}");
        let normal = detector.decide(3.02, Some(1.0));
        assert!(!normal.is_spike && !normal.skip, "{normal:?}");
    }

    #[test]
    fn tighten_clip_lowers_the_clip_to_the_healthy_norm_for_the_cooldown() {
        let policy = SpikePolicy {
            action: SpikeAction::TightenClip,
            cooldown_steps: 2,
            ..SpikePolicy::default()
        };
        let mut detector = warmed(policy);
        let spike = detector.decide(6.0, Some(1.0));
        assert!(!spike.skip);
        let clip = spike.clip_override.expect("tightened clip");
        assert!((clip - 0.5).abs() < 1e-9, "{clip}");
        detector.record(6.0, 5.0, true);
        assert!(detector.decide(3.0, Some(1.0)).clip_override.is_some());
        assert!(detector.decide(3.0, Some(1.0)).clip_override.is_some());
        assert_eq!(detector.decide(3.0, Some(1.0)).clip_override, None);
    }

    #[test]
    fn persistent_spikes_are_applied_after_the_skip_limit() {
        let mut detector = warmed(SpikePolicy::default());
        for _ in 0..5 {
            let d = detector.decide(9.0, Some(1.0));
            assert!(d.skip);
            detector.record(9.0, 1.0, false);
        }
        assert!(!detector.decide(9.0, Some(1.0)).skip);
    }

    #[test]
    fn state_round_trips_exactly_through_json() {
        let detector = warmed(SpikePolicy::default());
        let text = serde_json::to_string(&detector.to_json()).unwrap();
        let mut restored = SpikeDetector::new(SpikePolicy::default());
        restored
            .restore(serde_json::from_str(&text).unwrap())
            .unwrap();
        assert_eq!(restored, detector);
    }
}
