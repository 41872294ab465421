//! The training loop shared by every objective.
//!
//! One trainer step, top to bottom:
//! 1. fetch this step's micro-batches (`grad_accum_steps`, fewer while batch-size warmup ramps);
//! 2. count the step's loss tokens *before* any forward pass, then per micro-batch run the
//!    objective, scale its loss sum by `1 / total_tokens`, backpropagate, and add the gradients
//!    into one buffer per parameter (aligned with `Optimizer::params()`): accumulation equals one
//!    large batch;
//! 3. refuse a non-finite loss or gradient norm: the step is skipped, and after
//!    `max_bad_steps` consecutive bad steps the run stops with [`TrainError::NonFinite`];
//! 4. ask the spike detector (skip the batch and/or tighten the clip), clip the global norm,
//!    take the learning-rate factor from the schedule and step the optimizer;
//! 5. record metrics, evaluate every `eval_every` steps, checkpoint every `checkpoint_every`.
//!
//! Determinism: everything that decides what is trained (batches, skips, clip thresholds, lr)
//! is a function of the data, the seed and computed values, never of the wall clock; all of it
//! is restored from a checkpoint (step, tokens seen, source cursor, spike state, optimizer
//! moments), so a resumed run produces the weights of an uninterrupted one bit for bit.
//! Throughput figures and alerts are reported only.
//!
//! Steps count trainer steps, applied or skipped (`TrainerState.step`, metrics, the schedule's
//! index), so a skipped batch keeps the run on its planned length and learning-rate curve; the
//! optimizer counts its applied updates itself (bias correction).
//!
//! A checkpoint is never written from a non-finite state: every parameter is checked before
//! saving, and bad steps never touch the weights.
//!
//! What this is not: no file layout decisions beyond what it is handed (run.rs builds the
//! model, sources, store and logs), no objective-specific code.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};
use stoke_model::Transformer;
use stoke_optim::Optimizer;

use crate::checkpoint::{CheckpointStore, TrainerState};
use crate::config::TrainConfig;
use crate::error::TrainError;
use crate::eval::{EvalResult, Evaluator};
use crate::metrics::{EvalMetrics, MetricRecord, MetricsLog, StepMetrics, mfu};
use crate::objective::Objective;
use crate::source::BatchSource;
pub use crate::step::StepOutcome;
use crate::step::{EngineState, MicroLoss, StepEngine, StepSettings, accumulate};
use std::collections::BTreeMap;

/// What happened in one trainer step.
#[derive(Clone, Debug, PartialEq)]
pub struct StepReport {
    /// Trainer steps completed, counting this one.
    pub step: u64,
    /// Mean cross-entropy over the step's loss tokens (nats; no z-loss).
    pub loss: f64,
    /// Mean z-loss term, when the objective has one.
    pub z_loss: Option<f64>,
    /// Global gradient norm before clipping (NaN when the loss was already non-finite).
    pub grad_norm: f64,
    /// Learning rate the update used (peak times schedule factor; reported also when skipped).
    pub lr: f64,
    pub loss_tokens: u64,
    /// Input tokens of the step's micro-batches.
    pub step_tokens: u64,
    pub tokens_seen: u64,
    pub outcome: StepOutcome,
    /// The loss was a spike (whatever the policy did about it).
    pub spike: bool,
    /// The clip threshold used instead of the configured one (tightened after a spike).
    pub clip_override: Option<f64>,
    pub seconds: f64,
    /// Tokens routed to each expert over the step, per MoE layer (empty for dense models).
    pub expert_counts: Vec<(usize, Vec<u64>)>,
    /// Mean auxiliary load-balancing term per loss token (coefficient included), when on.
    pub moe_aux_loss: Option<f64>,
    /// The share of (token, slot) pairs an expert capacity dropped, when one is set.
    pub moe_dropped: Option<f64>,
    /// MuonClip: the largest attention logit of the step's forward passes (before the clip).
    pub max_attn_logit: Option<f64>,
    /// MuonClip: heads whose query/key projections the step scaled.
    pub qk_clipped_heads: Option<u64>,
    /// Multi-token prediction: the modules' mean cross-entropy per prediction, when trained.
    pub mtp_loss: Option<f64>,
}

/// The trainer's own part of `TrainerState.extra`. `spike` and `consecutive_bad_steps` are read
/// from checkpoints written before `TrainerState.engine` held them, and no longer written.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TrainerExtra {
    #[serde(default, skip_serializing_if = "serde_json::Value::is_null")]
    spike: serde_json::Value,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    consecutive_bad_steps: Option<u64>,
    /// The MoE balancing state per layer (bias rules only).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    moe_bias: Vec<(usize, stoke_model::moe::BiasState)>,
}

/// Why the loop ended.
#[derive(Clone, Debug, PartialEq)]
pub enum StopReason {
    /// `training.steps` reached.
    Completed,
    /// The batch source ran out (its `max_epochs`).
    DataExhausted,
}

/// The loop's result.
#[derive(Clone, Debug)]
pub struct TrainOutcome {
    pub stop: StopReason,
    pub steps: u64,
    pub tokens_seen: u64,
    pub last_loss: Option<f64>,
    pub last_eval: Option<EvalResult>,
    pub last_checkpoint: Option<PathBuf>,
    pub skipped_steps: u64,
    pub spikes: u64,
    /// Mean tokens/s over this process's steps.
    pub tokens_per_s: f64,
}

/// Where a finished step is reported (the progress bar, alerts). Never influences training.
pub trait StepObserver {
    fn on_step(&mut self, _report: &StepReport, _metrics: &StepMetrics) {}
    fn on_eval(&mut self, _metrics: &EvalMetrics) {}
    fn on_checkpoint(&mut self, _step: u64, _path: &Path) {}
    /// The loop has ended (also after an error): close the display.
    fn finish(&mut self) {}
    /// Alerts to record in the metrics log, drained after every step.
    fn take_alerts(&mut self) -> Vec<MetricRecord> {
        Vec::new()
    }
}

struct Checkpointing {
    store: CheckpointStore,
    config_toml: String,
    tokenizer_dir: Option<PathBuf>,
}

/// The loop and everything it owns.
pub struct Trainer {
    config: TrainConfig,
    model: Transformer,
    engine: StepEngine,
    objective: Box<dyn Objective>,
    source: Box<dyn BatchSource>,
    evaluator: Option<Evaluator>,
    checkpointing: Option<Checkpointing>,
    metrics_log: Option<MetricsLog>,
    observer: Option<Box<dyn StepObserver>>,
    peak_flops: Option<f64>,
    num_params: u64,
    tokens_seen: u64,
    last_checkpoint: Option<(u64, PathBuf)>,
    /// MoE bias balancing: the rule and each MoE layer's state.
    moe_bias: Option<(
        stoke_model::moe::BiasRule,
        BTreeMap<usize, stoke_model::moe::BiasState>,
    )>,
}

impl Trainer {
    pub fn new(
        config: TrainConfig,
        model: Transformer,
        optimizer: Optimizer,
        objective: Box<dyn Objective>,
        source: Box<dyn BatchSource>,
    ) -> Trainer {
        let num_params = model.config().num_parameters() as u64;
        let moe_bias = match (model.config().moe.as_ref(), config.training.moe.bias_rule()) {
            (Some(moe), Some(rule)) => {
                let states = (0..model.config().num_hidden_layers)
                    .filter(|&l| model.config().is_sparse_layer(l))
                    .map(|l| {
                        // AFMoE starts from its checkpoint's expert_bias.
                        let mut state = stoke_model::moe::BiasState::new(moe.num_experts);
                        if let Some(bias) = model.expert_bias(l) {
                            state.bias = bias;
                        }
                        (l, state)
                    })
                    .collect();
                Some((rule, states))
            }
            _ => None,
        };
        let engine = StepEngine::new(
            optimizer,
            StepSettings {
                schedule: config.schedule.clone(),
                clip_norm: config.training.clip_norm,
                spike: config.training.spike.clone(),
                max_bad_steps: config.training.max_bad_steps.max(1),
            },
        );
        Trainer {
            config,
            model,
            engine,
            objective,
            source,
            evaluator: None,
            checkpointing: None,
            metrics_log: None,
            observer: None,
            peak_flops: None,
            num_params,
            tokens_seen: 0,
            last_checkpoint: None,
            moe_bias,
        }
    }

    pub fn with_evaluator(mut self, evaluator: Evaluator) -> Trainer {
        self.evaluator = Some(evaluator);
        self
    }

    /// Checkpoints go to `store`, each with the resolved config text and the tokenizer files.
    pub fn with_checkpoints(
        mut self,
        store: CheckpointStore,
        config_toml: String,
        tokenizer_dir: Option<PathBuf>,
    ) -> Trainer {
        self.checkpointing = Some(Checkpointing {
            store,
            config_toml,
            tokenizer_dir,
        });
        self
    }

    pub fn with_metrics_log(mut self, log: MetricsLog) -> Trainer {
        self.metrics_log = Some(log);
        self
    }

    pub fn with_observer(mut self, observer: Box<dyn StepObserver>) -> Trainer {
        self.observer = Some(observer);
        self
    }

    /// The machine's measured matmul FLOP/s, for the MFU figure (0 is reported without it).
    pub fn with_peak_flops(mut self, peak_flops: f64) -> Trainer {
        self.peak_flops = Some(peak_flops);
        self
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    /// The trained model (a teacher for distillation, a policy handed on).
    pub fn into_model(self) -> Transformer {
        self.model
    }

    pub fn optimizer(&self) -> &Optimizer {
        self.engine.optimizer()
    }

    /// For checkpoint load.
    pub fn optimizer_mut(&mut self) -> &mut Optimizer {
        self.engine.optimizer_mut()
    }

    pub fn step(&self) -> u64 {
        self.engine.steps()
    }

    pub fn tokens_seen(&self) -> u64 {
        self.tokens_seen
    }

    /// Continues from a checkpoint's state (the optimizer state is loaded by the caller).
    pub fn restore(&mut self, state: TrainerState) -> Result<(), TrainError> {
        let extra: TrainerExtra = serde_json::from_value(state.extra)
            .map_err(|e| TrainError::Resume(format!("trainer state `extra`: {e}")))?;
        self.source.restore(state.source)?;
        let engine = match state.engine {
            Some(engine) => engine,
            None => EngineState {
                steps: state.step,
                consecutive_bad_steps: extra.consecutive_bad_steps.unwrap_or(0),
                skipped_steps: 0,
                spike: extra.spike,
            },
        };
        self.engine.restore(EngineState {
            steps: state.step,
            ..engine
        })?;
        self.tokens_seen = state.tokens_seen;
        self.last_checkpoint = None;
        if let Some((_, states)) = &mut self.moe_bias {
            for (layer, saved) in extra.moe_bias {
                self.model.set_expert_bias(layer, &saved.bias)?;
                states.insert(layer, saved);
            }
        }
        Ok(())
    }

    /// The state a checkpoint taken now would hold.
    pub fn state(&self) -> TrainerState {
        let engine = self.engine.state();
        let extra = TrainerExtra {
            spike: serde_json::Value::Null,
            consecutive_bad_steps: None,
            moe_bias: self
                .moe_bias
                .iter()
                .flat_map(|(_, states)| states.iter().map(|(l, s)| (*l, s.clone())))
                .collect(),
        };
        TrainerState {
            step: engine.steps,
            tokens_seen: self.tokens_seen,
            source: self.source.cursor(),
            engine: Some(engine),
            extra: serde_json::to_value(extra).unwrap_or(serde_json::Value::Null),
        }
    }

    /// Runs until `training.steps` (or the data runs out), with evaluations and checkpoints,
    /// and a final evaluation and checkpoint.
    pub fn run(&mut self) -> Result<TrainOutcome, TrainError> {
        let outcome = self.run_loop();
        if let Some(observer) = &mut self.observer {
            observer.finish();
        }
        outcome
    }

    fn run_loop(&mut self) -> Result<TrainOutcome, TrainError> {
        let total_steps = self.config.training.steps;
        let mut stop = StopReason::Completed;
        let mut last_loss = None;
        let mut last_eval = None;
        let mut last_eval_step = None;
        let (mut timed_tokens, mut timed_seconds) = (0u64, 0.0f64);
        let started = Instant::now();
        while self.step() < total_steps {
            let Some(report) = self.train_step()? else {
                stop = StopReason::DataExhausted;
                break;
            };
            timed_tokens += report.step_tokens;
            timed_seconds += report.seconds;
            if report.loss.is_finite() && report.outcome != StepOutcome::SkippedEmpty {
                last_loss = Some(report.loss);
            }
            self.record_step(&report, started.elapsed().as_secs_f64())?;
            let eval_every = self.config.training.eval_every;
            let step = self.step();
            if eval_every > 0 && step.is_multiple_of(eval_every) && step < total_steps {
                last_eval = self.evaluate_and_record()?;
                last_eval_step = Some(step);
            }
            // During a streak of non-finite steps the checkpoint waits: the streak either ends
            // (the next good step is saved at the next multiple) or stops the run.
            let every = self.config.training.checkpoint_every;
            if every > 0 && step.is_multiple_of(every) && self.engine.consecutive_bad_steps() == 0 {
                self.checkpoint()?;
            }
        }
        if last_eval_step != Some(self.step()) {
            last_eval = self.evaluate_and_record()?.or(last_eval);
        }
        if self.last_checkpoint.as_ref().map(|(s, _)| *s) != Some(self.step()) {
            self.checkpoint()?;
        }
        if let Some(log) = &mut self.metrics_log {
            log.flush()?;
        }
        Ok(TrainOutcome {
            stop,
            steps: self.step(),
            tokens_seen: self.tokens_seen,
            last_loss,
            last_eval,
            last_checkpoint: self.last_checkpoint.as_ref().map(|(_, p)| p.clone()),
            skipped_steps: self.engine.skipped_steps(),
            spikes: self.engine.spikes(),
            tokens_per_s: if timed_seconds > 0.0 {
                timed_tokens as f64 / timed_seconds
            } else {
                0.0
            },
        })
    }

    /// One trainer step; `None` when the source has no full step of batches left.
    pub fn train_step(&mut self) -> Result<Option<StepReport>, TrainError> {
        let started = Instant::now();
        let accum = self.config.grad_accum_at(self.tokens_seen);
        let mut batches = Vec::with_capacity(accum);
        for _ in 0..accum {
            match self.source.next_batch()? {
                Some(batch) => batches.push(batch),
                None => return Ok(None),
            }
        }
        let step_tokens: u64 = batches
            .iter()
            .map(|b| (b.batch_size * b.seq_len) as u64)
            .sum();
        let loss_tokens: usize = batches.iter().map(|b| self.objective.loss_tokens(b)).sum();
        self.tokens_seen += step_tokens;
        let mut report = StepReport {
            step: self.engine.steps() + 1,
            loss: 0.0,
            z_loss: None,
            grad_norm: 0.0,
            lr: self.engine.next_lr(),
            loss_tokens: loss_tokens as u64,
            step_tokens,
            tokens_seen: self.tokens_seen,
            outcome: StepOutcome::SkippedEmpty,
            spike: false,
            clip_override: None,
            seconds: 0.0,
            expert_counts: Vec::new(),
            moe_aux_loss: None,
            moe_dropped: None,
            max_attn_logit: None,
            qk_clipped_heads: None,
            mtp_loss: None,
        };
        if loss_tokens == 0 {
            self.engine.skip_empty();
            report.seconds = started.elapsed().as_secs_f64();
            return Ok(Some(report));
        }

        let scale = 1.0 / loss_tokens as f64;
        let (mut nll_sum, mut z_sum) = (0.0f64, 0.0f64);
        let mut expert_counts: BTreeMap<usize, Vec<u64>> = BTreeMap::new();
        let mut aux_sum = 0.0f64;
        let (mut mtp_sum, mut mtp_tokens) = (0.0f64, 0usize);
        let (mut routed_pairs, mut dropped_pairs) = (0u64, 0u64);
        let mut max_logits: Vec<(usize, Vec<f32>)> = Vec::new();
        let (objective, model) = (&self.objective, &self.model);
        let accumulated = accumulate(self.engine.gradients(), &batches, |batch| {
            let output = objective.loss(model, batch)?;
            for (layer, counts) in &output.figures.expert_counts {
                let total = expert_counts
                    .entry(*layer)
                    .or_insert_with(|| vec![0; counts.len()]);
                for (t, c) in total.iter_mut().zip(counts) {
                    *t += c;
                }
            }
            aux_sum += output.figures.aux_loss_sum;
            mtp_sum += output.figures.mtp_nll_sum;
            routed_pairs += output.figures.routed_pairs;
            dropped_pairs += output.figures.dropped_pairs;
            mtp_tokens += output.figures.mtp_tokens;
            max_logits.extend(output.figures.max_logits.iter().cloned());
            if output.loss_tokens == 0 {
                return Ok(None);
            }
            nll_sum += output.nll_sum;
            z_sum += output.z_loss_sum;
            let value = output.nll_sum + output.z_loss_sum;
            Ok(Some(MicroLoss::new(output.loss_sum, value, scale)))
        })?;
        report.loss = nll_sum * scale;
        report.z_loss = self.objective.reports_z_loss().then_some(z_sum * scale);
        report.moe_aux_loss = (aux_sum != 0.0).then_some(aux_sum * scale);
        report.mtp_loss = (mtp_tokens > 0).then(|| mtp_sum / mtp_tokens as f64);
        report.moe_dropped = (self.config.training.moe.capacity_factor.is_some()
            && routed_pairs > 0)
            .then(|| dropped_pairs as f64 / routed_pairs as f64);
        // The bias rules see the step's whole load (every micro-batch) before the optimizer
        // step, as torchtitan's pre-step hook does; the bias moves the next step's routing.
        if let Some((rule, states)) = &mut self.moe_bias {
            for (layer, counts) in &expert_counts {
                if let Some(state) = states.get_mut(layer) {
                    state.update(rule, counts);
                    self.model.set_expert_bias(*layer, &state.bias)?;
                }
            }
        }
        report.expert_counts = expert_counts.into_iter().collect();
        let objective_loss = (nll_sum + z_sum) * scale;
        let result = self.engine.finish(objective_loss, accumulated.grads)?;
        // MuonClip: after the update, the heads whose logits passed the threshold in this
        // step's forward passes get their query/key projections scaled down (Kimi K2).
        if let Some(threshold) = self.config.qk_clip_threshold()
            && !max_logits.is_empty()
        {
            let clip = self.model.qk_clip(&max_logits, threshold)?;
            report.max_attn_logit = Some(f64::from(clip.max_logit));
            report.qk_clipped_heads = Some(clip.clipped_heads as u64);
        }
        report.grad_norm = result.grad_norm;
        report.outcome = result.outcome;
        report.spike = result.spike;
        report.clip_override = result.clip_override;
        report.seconds = started.elapsed().as_secs_f64();
        if result.stop {
            // Leave a record of the failing step before stopping.
            self.record_step(&report, 0.0)?;
            return Err(TrainError::NonFinite {
                step: report.step,
                consecutive: result.consecutive_bad_steps,
                loss: objective_loss,
                grad_norm: report.grad_norm,
            });
        }
        Ok(Some(report))
    }

    fn record_step(&mut self, report: &StepReport, elapsed_s: f64) -> Result<(), TrainError> {
        let tokens_per_s = if report.seconds > 0.0 {
            report.step_tokens as f64 / report.seconds
        } else {
            0.0
        };
        let metrics = StepMetrics {
            step: report.step,
            loss: report.loss,
            lr: report.lr,
            grad_norm: report.grad_norm,
            tokens_per_s,
            tokens_seen: report.tokens_seen,
            mfu: self
                .peak_flops
                .map_or(0.0, |peak| mfu(self.num_params, tokens_per_s, peak)),
            elapsed_s,
            skipped: report.outcome != StepOutcome::Applied,
            z_loss: report.z_loss,
            memory: Some(crate::metrics::MemoryReport::measure(
                &self.model,
                self.engine.optimizer(),
            )),
            moe: crate::metrics::MoeMetrics::from_counts(
                &report.expert_counts,
                report.moe_aux_loss,
            )
            .map(|moe| crate::metrics::MoeMetrics {
                dropped_share: report.moe_dropped,
                ..moe
            }),
            max_attn_logit: report.max_attn_logit,
            qk_clipped_heads: report.qk_clipped_heads,
            mtp_loss: report.mtp_loss,
        };
        let mut records = vec![MetricRecord::Step(metrics.clone())];
        // What the spike policy did; skipped and non-finite steps as such are the monitor's
        // alerts.
        if report.spike {
            let action = match (report.outcome, report.clip_override) {
                (StepOutcome::SkippedSpike, _) => "batch skipped".to_string(),
                (_, Some(clip)) => format!("applied with the clip tightened to {clip:.4}"),
                _ => "applied (policy: report only)".to_string(),
            };
            records.push(MetricRecord::Alert {
                step: report.step,
                message: format!("loss spike ({:.4}): {action}", report.loss),
            });
        }
        if let Some(observer) = &mut self.observer {
            observer.on_step(report, &metrics);
            records.extend(observer.take_alerts());
        }
        if let Some(log) = &mut self.metrics_log {
            for record in &records {
                log.append(record)?;
            }
        }
        Ok(())
    }

    /// Evaluates on the held-out set (if any) and records the figures.
    pub fn evaluate_and_record(&mut self) -> Result<Option<EvalResult>, TrainError> {
        let Some(evaluator) = &self.evaluator else {
            return Ok(None);
        };
        if evaluator.num_batches() == 0 {
            return Ok(None);
        }
        let result = evaluator.evaluate(&self.model)?;
        let metrics = EvalMetrics {
            step: self.step(),
            loss: result.loss,
            bits_per_byte: result.bits_per_byte.unwrap_or(f64::NAN),
            tokens: result.tokens,
        };
        if let Some(observer) = &mut self.observer {
            observer.on_eval(&metrics);
        }
        if let Some(log) = &mut self.metrics_log {
            log.append(&MetricRecord::Eval(metrics))?;
        }
        Ok(Some(result))
    }

    /// Writes a checkpoint of the current state (no-op without a store). Refuses when any
    /// parameter is non-finite.
    pub fn checkpoint(&mut self) -> Result<Option<PathBuf>, TrainError> {
        let Some(checkpointing) = &self.checkpointing else {
            return Ok(None);
        };
        let step = self.step();
        for (name, var) in self.engine.optimizer().params() {
            if !all_finite(var.as_tensor())? {
                return Err(TrainError::NonFiniteParameters {
                    step,
                    parameter: name.clone(),
                });
            }
        }
        if let Some(log) = &mut self.metrics_log {
            log.flush()?;
        }
        let state = self.state();
        let path = checkpointing.store.save(
            &self.model,
            checkpointing.tokenizer_dir.as_deref(),
            self.engine.optimizer(),
            &state,
            &checkpointing.config_toml,
            &self.config.training.keep_steps,
        )?;
        if let Some(observer) = &mut self.observer {
            observer.on_checkpoint(step, &path);
        }
        self.last_checkpoint = Some((step, path.clone()));
        Ok(Some(path))
    }
}

/// Whether every value of `t` is finite (one pass; `0 * x` is 0 for finite x and NaN otherwise).
fn all_finite(t: &Tensor) -> Result<bool, TrainError> {
    let sum = (t * 0.0)?
        .sum_all()?
        .to_dtype(DType::F64)?
        .to_scalar::<f64>()?;
    Ok(sum == 0.0)
}
