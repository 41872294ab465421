//! The run's side effects per update: the metrics record, the step shown on the shared
//! `stoke_train::monitor::Monitor` (bar or plain lines with ETA, GRPO's figures as the step's
//! detail), alerts (a skipped non-finite update, samples whose reward failed: a console warning
//! and an `alert` record), evaluation and checkpoint cadence, saving the reference after a reset
//! (in [`reference_dir`], where a resume finds it), and the report at the end.
//!
//! What it is not: the figures' definitions (`metrics`), the charts (`report`), the update
//! itself (`learner`) or a progress display of its own (quiet runs print only evaluations and
//! warnings; the shared alert rules are off, GRPO judges its updates here). Evaluation and
//! checkpoint time is measured and excluded from the throughput figures, so sync and async runs
//! compare on update work alone.

use std::path::{Path, PathBuf};
use std::time::Instant;

use stoke_model::Transformer;
use stoke_train::checkpoint::CheckpointStore;
use stoke_train::grpo::update::UpdateOutcome;
use stoke_train::monitor::Monitor;

use crate::driver::{FinishedUpdate, Modules, StepSink, StepTiming};
use crate::error::PipelineError;
use crate::held_out::HeldOutResult;
use crate::learner::{Learner, LearnerStep};
use crate::metrics::{
    EpisodeBatchRecord, GrpoEvalRecord, GrpoMetricsLog, GrpoRecord, GrpoStepRecord, ModuleSeconds,
    PerModule, RatioRecord, RemoteRecord, batch_stats,
};
use crate::records::{RewardFailure, ScoredGroup};
use crate::settings::GrpoSettings;

/// The run's held-out evaluation, called with the current policy.
pub type EvaluateFn<'a> =
    dyn Fn(&Transformer, &Modules) -> Result<Option<HeldOutResult>, PipelineError> + 'a;

pub struct RunMonitor {
    out_dir: PathBuf,
    log: GrpoMetricsLog,
    display: Monitor,
    store: CheckpointStore,
    model_dir: PathBuf,
    config_toml: String,
    eval_every: u64,
    total_steps: u64,
    checkpoint_every: u64,
    keep_steps: Vec<u64>,
    samples_per_step: usize,
    skipped_steps: u64,
    tokens_seen: u64,
    last_checkpoint: Option<u64>,
    /// The update whose reward failures were last shown on the console.
    last_reward_warning: Option<u64>,
    /// Multi-turn runs: running means of earlier updates' turns and lengths, and the last
    /// update whose hacking signals were shown on the console.
    episode_baseline: EpisodeBaseline,
    last_hacking_warning: Option<u64>,
    started: Instant,
    title: String,
}

/// Updates with reward failures between two console warnings (alerts go to the log every time).
const REWARD_WARNING_EVERY: u64 = 10;

impl RunMonitor {
    pub fn open(
        out_dir: &Path,
        settings: &GrpoSettings,
        resumed_from: Option<u64>,
        quiet: bool,
        store: CheckpointStore,
        model_dir: PathBuf,
        config_toml: String,
    ) -> Result<RunMonitor, PipelineError> {
        let path = out_dir.join("metrics.jsonl");
        // A resumed run cuts the log back to its checkpoint; a fresh run starts a new log.
        let log = GrpoMetricsLog::open(&path, Some(resumed_from.unwrap_or(0)))?;
        let display = if quiet {
            Monitor::quiet(settings.steps, Box::new(std::io::stderr()))
        } else {
            Monitor::new(settings.steps, false)
        };
        let mut display = display.without_alert_rules();
        if resumed_from.is_some() {
            // Moves the bar to the kept steps, so its ETA counts this process's updates only.
            display.replay(&crate::report::standard_records(&GrpoMetricsLog::read_all(
                log.path(),
            )?));
        }
        Ok(RunMonitor {
            out_dir: out_dir.to_path_buf(),
            log,
            display,
            store,
            model_dir,
            config_toml,
            eval_every: settings.eval.every,
            total_steps: settings.steps,
            checkpoint_every: settings.checkpoint_every,
            keep_steps: settings.keep_steps.clone(),
            samples_per_step: settings.samples_per_step(),
            skipped_steps: 0,
            tokens_seen: 0,
            last_checkpoint: resumed_from,
            last_reward_warning: None,
            episode_baseline: EpisodeBaseline::default(),
            last_hacking_warning: None,
            started: Instant::now(),
            title: format!(
                "GRPO: {} updates x {} prompts x {} samples ({:?})",
                settings.steps, settings.prompts_per_step, settings.group_size, settings.mode
            ),
        })
    }

    pub fn metrics_path(&self) -> PathBuf {
        self.log.path().to_path_buf()
    }

    pub fn skipped_steps(&self) -> u64 {
        self.skipped_steps
    }

    pub fn record_eval(&mut self, step: u64, result: &HeldOutResult) -> Result<(), PipelineError> {
        let episodes = result.episodes.as_ref().map_or(String::new(), |e| {
            let outcome = if e.graded_outcome {
                format!(", outcome {:.3}", e.mean_outcome)
            } else {
                String::new()
            };
            format!(
                " | episodes: {:.2} turns, {:.2} tool calls{outcome}",
                e.mean_turns, e.mean_tool_calls
            )
        });
        self.display.println(&format!(
            "eval @ step {step}: greedy pass@1 {:.1}% | pass@1 {:.1}% | pass@{} {:.1}% ({} problems, {:.1} s){episodes}",
            100.0 * result.greedy_pass_at_1,
            100.0 * result.pass_at_1,
            result.k,
            100.0 * result.pass_at_k,
            result.problems,
            result.seconds
        ));
        Ok(self
            .log
            .append(&GrpoRecord::Eval(eval_record(step, result)))?)
    }

    /// Saves a checkpoint of the learner's state when one is due (every `checkpoint_every`
    /// updates, and at the end); a step already saved is not saved again.
    pub fn checkpoint(&mut self, learner: &Learner, at_end: bool) -> Result<(), PipelineError> {
        let step = learner.step();
        if self.last_checkpoint == Some(step) {
            return Ok(());
        }
        let due =
            at_end || (self.checkpoint_every > 0 && step.is_multiple_of(self.checkpoint_every));
        if !due {
            return Ok(());
        }
        let state = learner.trainer_state(self.tokens_seen);
        let path = self
            .store
            .save(
                learner.updater().model(),
                Some(&self.model_dir),
                learner.updater().optimizer(),
                &state,
                &self.config_toml,
                &self.keep_steps,
            )
            .map_err(stoke_train::error::TrainError::from)?;
        self.last_checkpoint = Some(step);
        self.log.flush()?;
        if !at_end {
            self.display
                .println(&format!("checkpoint {}", path.display()));
        }
        Ok(())
    }

    /// The per-update side effects, with the evaluation function of the run.
    pub fn sink<'a>(&'a mut self, evaluate: &'a EvaluateFn<'a>) -> RunSink<'a> {
        RunSink {
            monitor: self,
            evaluate,
            excluded: 0.0,
        }
    }

    /// Writes the report; returns its path.
    pub fn finish(&mut self) -> Result<PathBuf, PipelineError> {
        self.display.finish();
        self.log.flush()?;
        let records = GrpoMetricsLog::read_all(self.log.path())?;
        crate::report::write_grpo_report(&self.out_dir, &records, &self.title)
    }
}

/// The monitor as the driver's [`StepSink`].
pub struct RunSink<'a> {
    monitor: &'a mut RunMonitor,
    evaluate: &'a EvaluateFn<'a>,
    excluded: f64,
}

impl RunSink<'_> {
    /// Seconds spent evaluating and checkpointing inside updates' wall time.
    pub fn excluded_seconds(&self) -> f64 {
        self.excluded
    }
}

impl StepSink for RunSink<'_> {
    fn on_step(&mut self, update: FinishedUpdate<'_>) -> Result<(), PipelineError> {
        let FinishedUpdate {
            learner,
            step,
            timing,
            modules,
        } = update;
        let monitor = &mut *self.monitor;
        let number = learner.step();
        monitor.tokens_seen += step.report.tokens as u64;
        let skipped = step.report.outcome == UpdateOutcome::SkippedNonFinite;
        if skipped {
            monitor.skipped_steps += 1;
            let message = format!(
                "update {number} skipped: non-finite loss {} or grad norm {} ({}); weights \
                 unchanged",
                step.report.loss,
                step.report.grad_norm,
                non_finite_inputs(&step.groups)
            );
            monitor.display.println(&format!("warning: {message}"));
            monitor.log.append(&GrpoRecord::Alert {
                step: number,
                message,
            })?;
        }
        // Failed scorings are otherwise only a count in the step record: the person watching
        // needs to know that (and why) samples are being scored 0 while the run goes on. Every
        // such update gets an alert in the log; the console shows the first and then at most one
        // every `REWARD_WARNING_EVERY` updates, so a reward that always fails cannot flood it.
        if let Some(message) = reward_failure_message(number, &step, modules) {
            let quiet_since = monitor
                .last_reward_warning
                .is_some_and(|last| number < last + REWARD_WARNING_EVERY);
            if !quiet_since {
                monitor.last_reward_warning = Some(number);
                monitor.display.println(&format!(
                    "warning: {message} (alerts for every update in metrics.jsonl)"
                ));
            }
            monitor.log.append(&GrpoRecord::Alert {
                step: number,
                message,
            })?;
        }
        let mut record = step_record(number, &step, &timing, monitor.started.elapsed());
        let updater = learner.updater();
        record.memory = Some(
            stoke_train::metrics::MemoryReport::measure(updater.model(), updater.optimizer())
                .with_kv_cache(modules.rollout.stats().kv_cache_peak_bytes),
        );
        record.rollout_servers = modules
            .rollout
            .remote_stats()
            .map(|stats| RemoteRecord::of(&stats, true));
        record.reward_servers = modules
            .rewards
            .remote_stats()
            .map(|stats| RemoteRecord::of(&stats, false));
        let detail = step_detail(
            &record,
            step.report.kl_mean,
            timing.wall,
            monitor.samples_per_step,
        );
        // Reward-hacking monitors of multi-turn runs: alerts in the log every time, on the
        // console at most every `REWARD_WARNING_EVERY` updates.
        if let Some(episodes) = &record.episodes {
            let signals = monitor
                .episode_baseline
                .signals(episodes, record.length_mean);
            if !signals.is_empty() {
                let message = format!("update {number}: {}", signals.join("; "));
                let quiet_since = monitor
                    .last_hacking_warning
                    .is_some_and(|last| number < last + REWARD_WARNING_EVERY);
                if !quiet_since {
                    monitor.last_hacking_warning = Some(number);
                    monitor.display.println(&format!("warning: {message}"));
                }
                monitor.log.append(&GrpoRecord::Alert {
                    step: number,
                    message,
                })?;
            }
        }
        let standard = crate::report::standard_step(&record, monitor.tokens_seen);
        monitor.display.on_step_with(&standard, &detail);
        monitor.log.append(&GrpoRecord::Step(record))?;

        let side_started = Instant::now();
        if step.reference_reset {
            let dir = reference_dir(&monitor.out_dir, number);
            let policy = learner.updater().model();
            // Under LoRA the reference is the adapted policy: saved merged.
            match policy.lora_config() {
                Some(_) => policy
                    .merged()?
                    .save_with_tokenizer(&dir, Some(&monitor.model_dir))?,
                None => policy.save_with_tokenizer(&dir, Some(&monitor.model_dir))?,
            }
        }
        // The last update's evaluation is the run's final one (made by `run`).
        if monitor.eval_every > 0
            && number.is_multiple_of(monitor.eval_every)
            && number < monitor.total_steps
            && let Some(result) = (self.evaluate)(learner.updater().model(), modules)?
        {
            monitor.record_eval(number, &result)?;
        }
        monitor.checkpoint(learner, false)?;
        self.excluded += side_started.elapsed().as_secs_f64();
        Ok(())
    }
}

/// Running means of episode turns and lengths over earlier updates, for the shift monitor.
#[derive(Clone, Debug, Default)]
struct EpisodeBaseline {
    updates: u64,
    turns: f64,
    length: f64,
}

/// Updates averaged before the shift monitor speaks, and the ratio it flags.
const SHIFT_WARMUP_UPDATES: u64 = 3;
const SHIFT_FACTOR: f64 = 2.0;

impl EpisodeBaseline {
    /// The hacking signals of one update (empty when none), then folds it into the means.
    fn signals(&mut self, episodes: &EpisodeBatchRecord, length_mean: f64) -> Vec<String> {
        let mut signals = Vec::new();
        if episodes.touched_grader > 0 {
            signals.push(format!(
                "{} tool call(s) touched the grader's files (tests, graders)",
                episodes.touched_grader
            ));
        }
        if episodes.correct_without_tool > 0 {
            signals.push(format!(
                "{} episode(s) scored correct without the tool call the environment requires",
                episodes.correct_without_tool
            ));
        }
        if self.updates >= SHIFT_WARMUP_UPDATES {
            let (turns, length) = (
                self.turns / self.updates as f64,
                self.length / self.updates as f64,
            );
            if stoke_env::monitor::sudden_shift(turns, episodes.turns_mean, SHIFT_FACTOR) {
                signals.push(format!(
                    "turns per episode shifted to {:.2} from a mean of {turns:.2}",
                    episodes.turns_mean
                ));
            }
            if stoke_env::monitor::sudden_shift(length, length_mean, SHIFT_FACTOR) {
                signals.push(format!(
                    "episode length shifted to {length_mean:.1} tokens from a mean of {length:.1}"
                ));
            }
        }
        self.updates += 1;
        self.turns += episodes.turns_mean;
        self.length += length_mean;
        signals
    }
}

/// Where the reference after the reset at `step` is kept (saved here, loaded by a resume).
pub fn reference_dir(out_dir: &Path, step: u64) -> PathBuf {
    out_dir.join(format!("reference-step-{step:08}"))
}

/// GRPO's figures of one update, shown after the shared ones (loss, lr, tokens/s).
fn step_detail(
    record: &GrpoStepRecord,
    kl: Option<f64>,
    seconds_per_step: f64,
    samples_per_step: usize,
) -> String {
    let kl = kl.map(|kl| format!(" | kl {kl:.4}")).unwrap_or_default();
    let skipped = if record.outcome == UpdateOutcome::SkippedNonFinite {
        " | SKIPPED (non-finite)"
    } else {
        ""
    };
    format!(
        "reward {:.3} | correct {:.1}%{kl} | {seconds_per_step:.2} s/step | {:.1} samples/s{skipped}",
        record.reward_mean,
        100.0 * record.correct_fraction,
        samples_per_step as f64 / seconds_per_step.max(1e-9),
    )
}

/// What went wrong scoring one update's samples, for a person: how many failed and how, and the
/// first failure's reward, task and panic message; None when every sample got its verdict.
pub fn reward_failure_message(
    number: u64,
    step: &LearnerStep,
    modules: &Modules,
) -> Option<String> {
    let (mut panicked, mut timed_out, mut environment, mut samples) =
        (0usize, 0usize, 0usize, 0usize);
    let mut first = None;
    for group in &step.groups {
        samples += group.rewards.len();
        for reward in &group.rewards {
            let Some(failure) = &reward.failure else {
                continue;
            };
            match failure {
                RewardFailure::Panicked(_) => panicked += 1,
                RewardFailure::TimedOut => timed_out += 1,
                RewardFailure::Environment(_) => environment += 1,
            }
            first.get_or_insert((group, failure));
        }
    }
    let (group, failure) = first?;
    let task = &group.rollout.ticket.task;
    let reward = modules
        .rewards
        .reward_name(task.reward)
        .unwrap_or_else(|| format!("#{}", task.reward));
    let why = match failure {
        RewardFailure::Panicked(message) => format!("panicked: {message}"),
        RewardFailure::TimedOut => "did not answer within grpo.reward_timeout_s".to_string(),
        RewardFailure::Environment(message) => format!("(its environment failed: {message})"),
    };
    // Environment failures are named only in multi-turn runs that have them.
    let environments = if environment > 0 {
        format!(", {environment} environments failed")
    } else {
        String::new()
    };
    Some(format!(
        "update {number}: {} of {samples} rewards failed and were scored 0 ({panicked} panicked, \
         {timed_out} timed out{environments}); first: reward `{reward}` on task `{}` {why}",
        panicked + timed_out + environment,
        task.id
    ))
}

/// Which inputs of an update were non-finite, for the skip warning: a broken reference model
/// and a diverging policy call for different fixes.
pub fn non_finite_inputs(groups: &[ScoredGroup]) -> String {
    let bad = |values: &[f32]| values.iter().any(|v| !v.is_finite());
    let bad_rows = |rows: &Option<Vec<Vec<f32>>>| {
        rows.as_ref()
            .map_or(0, |rows| rows.iter().filter(|row| bad(row)).count())
    };
    let reference: usize = groups.iter().map(|g| bad_rows(&g.ref_logprobs)).sum();
    let recomputed: usize = groups.iter().map(|g| bad_rows(&g.old_logprobs)).sum();
    let rollout = groups
        .iter()
        .flat_map(|g| &g.rollout.samples)
        .filter(|sample| bad(&sample.rollout_logprobs))
        .count();
    let parts: Vec<String> = [
        (reference, "reference"),
        (recomputed, "recomputed old"),
        (rollout, "rollout"),
    ]
    .into_iter()
    .filter(|(samples, _)| *samples > 0)
    .map(|(samples, what)| format!("{what} log-probs of {samples} samples"))
    .collect();
    if parts.is_empty() {
        "every input finite: the loss or gradient overflowed".to_string()
    } else {
        format!("non-finite {}", parts.join(", "))
    }
}

/// The metrics record of one update.
pub fn step_record(
    number: u64,
    step: &LearnerStep,
    timing: &StepTiming,
    elapsed: std::time::Duration,
) -> GrpoStepRecord {
    let stats = batch_stats(&step.groups, step.trained_version);
    let report = &step.report;
    let wall = timing.wall.max(1e-9);
    let busy = PerModule {
        rollout: timing.rollout_busy,
        reward: timing.reward_busy,
        inference: timing.inference_busy,
        trainer: timing.trainer_busy,
    };
    let mut record = GrpoStepRecord {
        step: number,
        policy_version: step.trained_version.0,
        outcome: report.outcome,
        groups_dropped: step.groups_dropped + step.groups_unusable,
        loss: report.loss,
        ptx_loss: report.ptx_loss,
        grad_norm: report.grad_norm,
        lr: report.lr,
        kl_mean: report.kl_mean,
        entropy_mean: report.entropy_mean,
        clip_low_fraction: report.clip.low,
        clip_high_fraction: report.clip.high,
        clip_region_fraction: report.clip.region,
        ratio: report.mismatch.as_ref().map(RatioRecord::from),
        process_steps_mean: step.process_steps_mean,
        seconds: ModuleSeconds {
            busy,
            waiting: timing.trainer_waiting,
            publish: timing.publish,
        },
        // Busy seconds per thread the module had: 1.0 means its threads never idled.
        utilization: busy.divided_by(wall),
        elapsed_s: elapsed.as_secs_f64(),
        temperature: step
            .groups
            .first()
            .map_or(0.0, |g| f64::from(g.rollout.ticket.temperature)),
        ..GrpoStepRecord::default()
    };
    stats.apply_to(&mut record);
    // The trained groups (after dropping), not all groups of the slot.
    record.groups = stats.groups - record.groups_dropped.min(stats.groups);
    record.tokens_per_s = stats.tokens as f64 / wall;
    record.samples_per_s = stats.samples as f64 / wall;
    record
}

/// The metrics record of one held-out evaluation.
pub fn eval_record(step: u64, result: &HeldOutResult) -> GrpoEvalRecord {
    GrpoEvalRecord {
        step,
        greedy_pass_at_1: result.greedy_pass_at_1,
        pass_at_1: result.pass_at_1,
        pass_at_k: result.pass_at_k,
        k: result.k,
        problems: result.problems,
        mean_length: result.mean_length,
        seconds: result.seconds,
        turns_mean: result.episodes.as_ref().map(|e| e.mean_turns),
        tool_calls_mean: result.episodes.as_ref().map(|e| e.mean_tool_calls),
        tool_use_rate: result.episodes.as_ref().map(|e| e.tool_use_rate),
        env_outcome_mean: result
            .episodes
            .as_ref()
            .filter(|e| e.graded_outcome)
            .map(|e| e.mean_outcome),
    }
}
