//! GRPO monitoring records and their log: one JSON object per line in `OUT/metrics.jsonl`.
//!
//! What it is: [`GrpoStepRecord`] (one per trainer update: rewards, correctness, loss figures,
//! clip fractions, completion lengths, staleness, time per module, the LLM judge's calls and
//! failures when a judge reward is used), [`GrpoEvalRecord`] (one per
//! held-out evaluation), alerts, the append-only [`GrpoMetricsLog`], and [`batch_stats`], the pure
//! reward / length / staleness figures of a batch of scored groups that the run puts into each
//! step record.
//! What it is not: it neither prints progress bars nor draws (`report.rs`), and it measures no
//! time itself (the run passes seconds in).
//!
//! Invariants:
//! - The log is the shared `RunLog` of every training command (append, fsync, resume
//!   truncation, torn-line recovery, TensorBoard event file beside it), so its rules are written
//!   once, in `stoke_train::metrics`.
//! - Non-finite floats survive the round trip as the strings `"NaN"`, `"Infinity"`,
//!   `"-Infinity"`: a NaN loss is exactly what a person looks for in the log.
//! - Step numbers count completed updates (the first update is step 1; an evaluation before any
//!   update is step 0). A step's `policy_version` is the version its update produced.

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

use crate::records::{RewardFailure, ScoredGroup};
use crate::staleness::PolicyVersion;
use stoke_reward::Outcome;
use stoke_train::metrics::{LogRecord, RunLog, json_float, json_float_opt};

/// What the trainer did with a batch: the shared step outcome (GRPO has no spike policy, so
/// never `skipped_spike`).
pub use stoke_train::step::StepOutcome;

/// One figure per compute module: busy seconds ([`ModuleSeconds::busy`]) or the busy share of
/// the update's wall time per thread ([`GrpoStepRecord::utilization`], 0..=1).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct PerModule {
    #[serde(with = "json_float")]
    pub rollout: f64,
    #[serde(with = "json_float")]
    pub reward: f64,
    #[serde(with = "json_float")]
    pub inference: f64,
    #[serde(with = "json_float")]
    pub trainer: f64,
}

impl PerModule {
    /// The modules' names, in the order of [`PerModule::values`].
    pub const NAMES: [&'static str; 4] = ["rollout", "reward", "inference", "trainer"];

    pub fn values(&self) -> [f64; 4] {
        [self.rollout, self.reward, self.inference, self.trainer]
    }

    /// Each figure divided by `by` (busy seconds over wall seconds: the utilization).
    pub fn divided_by(self, by: f64) -> PerModule {
        PerModule {
            rollout: self.rollout / by,
            reward: self.reward / by,
            inference: self.inference / by,
            trainer: self.trainer / by,
        }
    }
}

/// Wall seconds spent in each module during one update's span (summed over worker threads).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ModuleSeconds {
    /// Busy seconds per module (written as `rollout`, `reward`, ... beside `waiting`).
    #[serde(flatten)]
    pub busy: PerModule,
    /// The trainer waiting for groups (the pipeline bubble).
    #[serde(with = "json_float")]
    pub waiting: f64,
    /// Publishing the new weights (remote rollout: writing them and the servers loading them).
    #[serde(default, with = "json_float")]
    pub publish: f64,
}

/// The trainer/rollout importance ratio over the update's tokens (`stoke_train::grpo::RatioStats`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RatioRecord {
    #[serde(with = "json_float")]
    pub mean: f64,
    #[serde(with = "json_float")]
    pub min: f64,
    #[serde(with = "json_float")]
    pub max: f64,
    /// Kish effective sample size as a fraction of the counted tokens.
    #[serde(with = "json_float")]
    pub ess_fraction: f64,
    /// Tokens whose weight was truncated or masked by the correction.
    #[serde(with = "json_float")]
    pub corrected_fraction: f64,
}

impl From<&stoke_train::grpo::RatioStats> for RatioRecord {
    fn from(stats: &stoke_train::grpo::RatioStats) -> RatioRecord {
        RatioRecord {
            mean: stats.mean,
            min: stats.min,
            max: stats.max,
            ess_fraction: if stats.tokens == 0 {
                0.0
            } else {
                stats.effective_sample_size / stats.tokens as f64
            },
            corrected_fraction: stats.fraction_corrected,
        }
    }
}

/// Figures of one trainer update.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrpoStepRecord {
    /// Updates completed, counting this one (the first is 1).
    pub step: u64,
    pub policy_version: u64,
    pub outcome: StepOutcome,
    #[serde(with = "json_float")]
    pub reward_mean: f64,
    /// Population standard deviation over the batch's samples.
    #[serde(with = "json_float")]
    pub reward_std: f64,
    /// Mean of each composite component over the samples that report it.
    #[serde(default)]
    pub reward_components: BTreeMap<String, f64>,
    /// Share of the batch's samples whose verdict is `correct` (pass@1 of the training samples).
    #[serde(with = "json_float")]
    pub correct_fraction: f64,
    /// Groups trained on, and groups dropped (all rewards equal, with dynamic sampling).
    pub groups: usize,
    pub groups_dropped: usize,
    pub samples: usize,
    /// Failed scorings by kind (`panicked`, `timed_out`).
    #[serde(default)]
    pub reward_failures: BTreeMap<String, u64>,
    /// Samples per verdict (`correct`, `wrong`, `unparseable_prediction`, ...).
    #[serde(default)]
    pub outcomes: BTreeMap<String, u64>,
    #[serde(with = "json_float")]
    pub loss: f64,
    #[serde(default, with = "json_float_opt")]
    pub ptx_loss: Option<f64>,
    #[serde(with = "json_float")]
    pub grad_norm: f64,
    #[serde(with = "json_float")]
    pub lr: f64,
    #[serde(default, with = "json_float_opt")]
    pub kl_mean: Option<f64>,
    #[serde(with = "json_float")]
    pub entropy_mean: f64,
    #[serde(with = "json_float")]
    pub clip_low_fraction: f64,
    #[serde(with = "json_float")]
    pub clip_high_fraction: f64,
    #[serde(with = "json_float")]
    pub clip_region_fraction: f64,
    #[serde(default)]
    pub ratio: Option<RatioRecord>,
    /// Completion lengths in tokens.
    #[serde(with = "json_float")]
    pub length_mean: f64,
    pub length_max: usize,
    /// Share of completions that hit `max_new_tokens`.
    #[serde(with = "json_float")]
    pub truncated_fraction: f64,
    /// Completion tokens in the batch.
    pub tokens: u64,
    /// `staleness_histogram[d]`: samples whose oldest token came from weights `d` versions older
    /// than the weights the update started from.
    #[serde(default)]
    pub staleness_histogram: Vec<u64>,
    pub seconds: ModuleSeconds,
    /// Busy share (0..=1 per thread) of each module over the update's wall time.
    pub utilization: PerModule,
    #[serde(with = "json_float")]
    pub tokens_per_s: f64,
    #[serde(with = "json_float")]
    pub samples_per_s: f64,
    /// Wall seconds since the run (or its resumed part) started.
    #[serde(with = "json_float")]
    pub elapsed_s: f64,
    #[serde(with = "json_float")]
    pub temperature: f64,
    /// Where the memory went (the trainer's weights, gradients, optimizer state; the rest of the
    /// process's peak, rollout KV caches and snapshots included, in `activations_bytes`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<stoke_train::metrics::MemoryReport>,
    /// Remote rollout: each server's counters since the run started, and the retries.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_servers: Option<RemoteRecord>,
    /// Remote rewards: likewise.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_servers: Option<RemoteRecord>,
    /// Multi-turn runs: what the batch's episodes did.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub episodes: Option<EpisodeBatchRecord>,
    /// LLM-judge rewards: what judging the batch cost and how often it failed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeBatchRecord>,
    /// Dense process advantages (`process_reward` with `dense = true`): scored steps per
    /// trained sample that reached the token advantages, mean. Absent when off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub process_steps_mean: Option<f64>,
}

/// The LLM judge's figures over one update's samples (those a `judge` reward scored).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct JudgeBatchRecord {
    /// Judge requests sent to a server (cache hits excluded).
    pub calls: u64,
    /// Samples the judge could not score: no server answered (`scorer_error`), or the verdict
    /// could not be read (`unparseable_verdict`). Both are left out of training.
    pub failures: u64,
    pub parse_failures: u64,
    pub cache_hits: u64,
    pub retries: u64,
    pub servers_skipped: u64,
    /// Seconds per request sent (0 without requests).
    #[serde(with = "json_float")]
    pub latency_mean_s: f64,
    /// Share of the pairs judged in both orders whose two verdicts agreed (absent without
    /// `swap`).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub swap_consistency: Option<f64>,
}

impl JudgeBatchRecord {
    /// The record of the judge figures of a batch's samples and their outcomes.
    pub fn of<'a>(
        samples: impl IntoIterator<Item = (&'a stoke_reward::JudgeFigures, Outcome)>,
    ) -> Option<JudgeBatchRecord> {
        let mut record = JudgeBatchRecord::default();
        let mut total = stoke_reward::JudgeFigures::default();
        let mut any = false;
        for (figures, outcome) in samples {
            any = true;
            total = total.plus(*figures);
            match outcome {
                Outcome::ScorerError => record.failures += 1,
                Outcome::UnparseableVerdict => record.parse_failures += 1,
                _ => {}
            }
        }
        if !any {
            return None;
        }
        record.calls = total.calls;
        record.cache_hits = total.cache_hits;
        record.retries = total.retries;
        record.servers_skipped = total.servers_skipped;
        record.latency_mean_s = if total.calls == 0 {
            0.0
        } else {
            total.latency_s / total.calls as f64
        };
        record.swap_consistency = (total.compared_pairs > 0)
            .then(|| total.consistent_pairs as f64 / total.compared_pairs as f64);
        Some(record)
    }
}

/// The episodes of one update (runs with an `[environment]`), with the reward-hacking monitors.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct EpisodeBatchRecord {
    #[serde(with = "json_float")]
    pub turns_mean: f64,
    #[serde(with = "json_float")]
    pub tool_calls_mean: f64,
    /// Tool calls that failed (unknown tool, bad arguments, an error, a timeout).
    pub tool_failures: u64,
    /// Episodes per stop reason (`done`, `max_turns`, `env_failed`, ...).
    pub stops: BTreeMap<String, u64>,
    /// Model tokens (trained) and environment tokens (masked) in the batch.
    pub model_tokens: u64,
    pub env_tokens: u64,
    /// Seconds inside environments and inside tool calls, summed over episodes.
    #[serde(with = "json_float")]
    pub env_seconds: f64,
    #[serde(with = "json_float")]
    pub tool_seconds: f64,
    /// Monitor: tool calls that touched the grader's files (tests, graders).
    pub touched_grader: u64,
    /// Monitor: correct episodes without a tool call, where the environment requires one.
    pub correct_without_tool: u64,
}

/// One server of a remote module, cumulative since the run started.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServerRecord {
    pub url: String,
    pub alive: bool,
    pub requests: u64,
    pub failures: u64,
    pub samples: u64,
    pub tokens: u64,
    /// Share of the run's wall time with at least one request of ours in flight.
    #[serde(with = "json_float")]
    pub utilization: f64,
    /// Tokens (rollout) or samples (reward) per busy second.
    #[serde(with = "json_float")]
    pub throughput: f64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub last_error: Option<String>,
}

/// A remote module's servers and retries.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RemoteRecord {
    pub servers: Vec<ServerRecord>,
    pub retries: u64,
}

impl RemoteRecord {
    /// The record of `stats`; `by_tokens`: throughput in tokens (rollout), else samples.
    pub fn of(stats: &crate::service::RemoteStats, by_tokens: bool) -> RemoteRecord {
        RemoteRecord {
            servers: stats
                .servers
                .iter()
                .map(|s| ServerRecord {
                    url: s.url.clone(),
                    alive: s.alive,
                    requests: s.requests,
                    failures: s.failures,
                    samples: s.samples,
                    tokens: s.tokens,
                    utilization: s.busy_seconds / stats.seconds.max(1e-9),
                    throughput: if by_tokens { s.tokens } else { s.samples } as f64
                        / s.busy_seconds.max(1e-9),
                    last_error: s.last_error.clone(),
                })
                .collect(),
            retries: stats.retries,
        }
    }
}

/// Figures of one held-out evaluation.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct GrpoEvalRecord {
    /// Updates completed when it ran (0: before the first).
    pub step: u64,
    #[serde(with = "json_float")]
    pub greedy_pass_at_1: f64,
    /// Unbiased pass@1 and pass@k over `k` samples per problem at the rollout temperature.
    #[serde(with = "json_float")]
    pub pass_at_1: f64,
    #[serde(with = "json_float")]
    pub pass_at_k: f64,
    pub k: usize,
    pub problems: usize,
    /// Mean completion length in tokens (greedy completions).
    #[serde(with = "json_float")]
    pub mean_length: f64,
    #[serde(with = "json_float")]
    pub seconds: f64,
    /// Multi-turn runs: greedy episodes' mean model turns and tool calls, and the share with a
    /// tool call.
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub turns_mean: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub tool_calls_mean: Option<f64>,
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub tool_use_rate: Option<f64>,
    /// Multi-turn runs: greedy episodes' mean outcome reward from the environment (code
    /// repair: the share of the hidden-test gap closed).
    #[serde(
        default,
        skip_serializing_if = "Option::is_none",
        with = "json_float_opt"
    )]
    pub env_outcome_mean: Option<f64>,
}

/// One line of `metrics.jsonl`, tagged by `"kind"`.
// One record per update is written and read: boxing the step record would only add noise.
#[allow(clippy::large_enum_variant)]
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum GrpoRecord {
    Step(GrpoStepRecord),
    Eval(GrpoEvalRecord),
    /// Something a person should know (a reward worker panicked, a NaN update was skipped).
    Alert {
        step: u64,
        message: String,
    },
}

impl GrpoRecord {
    pub fn step(&self) -> u64 {
        match self {
            GrpoRecord::Step(r) => r.step,
            GrpoRecord::Eval(r) => r.step,
            GrpoRecord::Alert { step, .. } => *step,
        }
    }
}

impl LogRecord for GrpoRecord {
    fn step(&self) -> u64 {
        GrpoRecord::step(self)
    }
}

/// `stoke grpo`'s metrics log: the one log every training command writes
/// (`stoke_train::metrics::RunLog`), over [`GrpoRecord`].
pub type GrpoMetricsLog = RunLog<GrpoRecord>;

// ---------------------------------------------------------------------------------------------
// Batch statistics
// ---------------------------------------------------------------------------------------------

/// Reward, correctness, length and staleness figures of one batch of groups. With no samples
/// every mean and fraction is 0.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct BatchStats {
    pub groups: usize,
    pub samples: usize,
    pub reward_mean: f64,
    pub reward_std: f64,
    pub reward_components: BTreeMap<String, f64>,
    pub correct_fraction: f64,
    /// Groups whose rewards are all equal (zero advantage under group normalisation).
    pub equal_reward_groups: usize,
    pub reward_failures: BTreeMap<String, u64>,
    pub outcomes: BTreeMap<String, u64>,
    pub length_mean: f64,
    pub length_max: usize,
    pub truncated_fraction: f64,
    pub tokens: u64,
    /// Index `d`: samples whose oldest token is `d` versions behind the trainer.
    pub staleness_histogram: Vec<u64>,
    /// Sums over the groups of the per-group seconds the modules recorded.
    pub rollout_seconds: f64,
    pub reward_seconds: f64,
    pub inference_seconds: f64,
    pub episodes: Option<EpisodeBatchRecord>,
    /// Present when a judge reward scored any of the batch's samples.
    pub judge: Option<JudgeBatchRecord>,
}

impl BatchStats {
    /// Copies the batch figures into a step record (the rest of the record is the run's).
    pub fn apply_to(&self, record: &mut GrpoStepRecord) {
        record.groups = self.groups;
        record.samples = self.samples;
        record.reward_mean = self.reward_mean;
        record.reward_std = self.reward_std;
        record.reward_components = self.reward_components.clone();
        record.correct_fraction = self.correct_fraction;
        record.reward_failures = self.reward_failures.clone();
        record.outcomes = self.outcomes.clone();
        record.length_mean = self.length_mean;
        record.length_max = self.length_max;
        record.truncated_fraction = self.truncated_fraction;
        record.tokens = self.tokens;
        record.staleness_histogram = self.staleness_histogram.clone();
        record.episodes = self.episodes.clone();
        record.judge = self.judge.clone();
    }

    /// Mean staleness in versions (0 without samples).
    pub fn staleness_mean(&self) -> f64 {
        histogram_mean(&self.staleness_histogram)
    }
}

/// The name of a failure kind in metrics.
pub fn failure_kind(failure: &RewardFailure) -> &'static str {
    match failure {
        RewardFailure::Panicked(_) => "panicked",
        RewardFailure::TimedOut => "timed_out",
        RewardFailure::Environment(_) => "environment",
    }
}

/// The figures of `groups` as the trainer at `trainer_version` sees them (staleness is counted
/// against it). Samples and rewards are paired in order; a group with fewer rewards than samples
/// counts only its scored samples.
pub fn batch_stats(groups: &[ScoredGroup], trainer_version: PolicyVersion) -> BatchStats {
    let mut stats = BatchStats {
        groups: groups.len(),
        ..BatchStats::default()
    };
    let mut rewards = Vec::new();
    let mut component_sums: BTreeMap<String, (f64, u64)> = BTreeMap::new();
    let mut correct = 0usize;
    let mut truncated = 0usize;
    for group in groups {
        stats.rollout_seconds += group.rollout.generate_seconds;
        stats.reward_seconds += group.reward_seconds;
        stats.inference_seconds += group.inference_seconds;
        let fallback = group.rollout.ticket.permit.policy_version;
        let scored = group.rollout.samples.iter().zip(&group.rewards);
        let first = rewards.len();
        for (sample, reward) in scored {
            rewards.push(reward.score);
            if reward.correct() {
                correct += 1;
            }
            *stats
                .outcomes
                .entry(reward.outcome.name().to_string())
                .or_default() += 1;
            if let Some(failure) = &reward.failure {
                *stats
                    .reward_failures
                    .entry(failure_kind(failure).to_string())
                    .or_default() += 1;
            }
            for (name, value) in &reward.components {
                let entry = component_sums.entry(name.clone()).or_default();
                entry.0 += value;
                entry.1 += 1;
            }
            if let Some(episode) = &sample.episode {
                let figures = stats
                    .episodes
                    .get_or_insert_with(EpisodeBatchRecord::default);
                figures.turns_mean += episode.model_turns as f64;
                figures.tool_calls_mean += episode.tool_calls.len() as f64;
                figures.tool_failures +=
                    episode.tool_calls.iter().filter(|call| call.failed).count() as u64;
                *figures
                    .stops
                    .entry(episode.stop.name().to_string())
                    .or_default() += 1;
                let model = sample.model_tokens() as u64;
                figures.model_tokens += model;
                figures.env_tokens += sample.completion_ids.len() as u64 - model;
                figures.env_seconds += episode.env_seconds;
                figures.tool_seconds += episode.tool_seconds;
                figures.touched_grader += episode
                    .tool_calls
                    .iter()
                    .filter(|call| {
                        call.touched
                            .iter()
                            .any(|path| stoke_env::monitor::is_protected_path(path))
                    })
                    .count() as u64;
                if episode.requires_tool && episode.tool_calls.is_empty() && reward.correct() {
                    figures.correct_without_tool += 1;
                }
            }
            let length = sample.completion_ids.len();
            stats.tokens += length as u64;
            stats.length_max = stats.length_max.max(length);
            if sample.truncated() {
                truncated += 1;
            }
            let behind = trainer_version
                .0
                .saturating_sub(sample.oldest_version(fallback).0)
                as usize;
            if stats.staleness_histogram.len() <= behind {
                stats.staleness_histogram.resize(behind + 1, 0);
            }
            stats.staleness_histogram[behind] += 1;
        }
        let group_rewards = &rewards[first..];
        if group_rewards.windows(2).all(|w| w[0] == w[1]) {
            stats.equal_reward_groups += 1;
        }
    }
    stats.samples = rewards.len();
    if stats.samples > 0 {
        let n = stats.samples as f64;
        stats.reward_mean = rewards.iter().sum::<f64>() / n;
        let variance = rewards
            .iter()
            .map(|r| (r - stats.reward_mean).powi(2))
            .sum::<f64>()
            / n;
        stats.reward_std = variance.sqrt();
        stats.correct_fraction = correct as f64 / n;
        stats.truncated_fraction = truncated as f64 / n;
        stats.length_mean = stats.tokens as f64 / n;
        if let Some(figures) = &mut stats.episodes {
            figures.turns_mean /= n;
            figures.tool_calls_mean /= n;
        }
    }
    stats.reward_components = component_sums
        .into_iter()
        .map(|(name, (sum, count))| (name, sum / count as f64))
        .collect();
    stats.judge = JudgeBatchRecord::of(groups.iter().flat_map(|group| {
        group
            .rollout
            .samples
            .iter()
            .zip(&group.rewards)
            .filter_map(|(_, reward)| reward.judge.as_ref().map(|j| (j, reward.outcome)))
    }));
    stats
}

/// Mean of the index weighted by the counts (0 for an empty histogram).
pub fn histogram_mean(histogram: &[u64]) -> f64 {
    let total: u64 = histogram.iter().sum();
    if total == 0 {
        return 0.0;
    }
    let weighted: f64 = histogram
        .iter()
        .enumerate()
        .map(|(d, &count)| d as f64 * count as f64)
        .sum();
    weighted / total as f64
}

impl GrpoStepRecord {
    /// One console line: step, reward, correctness, loss, KL, length, staleness, time.
    pub fn console_line(&self, total_steps: u64) -> String {
        let mut line = format!(
            "step {}/{total_steps} reward {} ± {} correct {:.1}% loss {} grad {} len {:.1} (max {}, {:.0}% cut)",
            self.step,
            significant(self.reward_mean),
            significant(self.reward_std),
            100.0 * self.correct_fraction,
            significant(self.loss),
            significant(self.grad_norm),
            self.length_mean,
            self.length_max,
            100.0 * self.truncated_fraction,
        );
        if let Some(kl) = self.kl_mean {
            line.push_str(&format!(" kl {}", significant(kl)));
        }
        if self.staleness_histogram.len() > 1 {
            line.push_str(&format!(
                " stale {:.2}",
                histogram_mean(&self.staleness_histogram)
            ));
        }
        let failures: u64 = self.reward_failures.values().sum();
        if failures > 0 {
            line.push_str(&format!(" reward failures {failures}"));
        }
        if self.outcome != StepOutcome::Applied {
            line.push_str(&format!(" [{}]", self.outcome.name()));
        }
        line.push_str(&format!(
            " {:.0} tok/s {:.1} s",
            self.tokens_per_s, self.elapsed_s
        ));
        line
    }
}

/// Four significant digits, scientific outside [1e-3, 1e6); "NaN"/"inf" as Rust writes them.
pub fn significant(value: f64) -> String {
    if value.is_finite() {
        stoke_train::metrics::format_significant(value, 1e6)
    } else {
        value.to_string()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::sync::Arc;

    use crate::records::{GroupTicket, RolloutGroup, Sample, SampleReward, Task};
    use crate::staleness::GenerationPermit;
    use stoke_reward::{JudgeFigures, Reference};
    use stoke_rollout::FinishReason;

    fn judged(outcome: Outcome, judge: Option<JudgeFigures>) -> SampleReward {
        SampleReward {
            score: 0.5,
            outcome,
            components: Vec::new(),
            failure: None,
            judge,
            steps: None,
        }
    }

    fn group(rewards: Vec<SampleReward>) -> ScoredGroup {
        let samples = rewards
            .iter()
            .map(|_| Sample {
                completion_ids: vec![1, 2],
                rollout_logprobs: vec![-1.0, -1.0],
                token_versions: Vec::new(),
                loss_mask: None,
                episode: None,
                text: "x".into(),
                finish: FinishReason::Eos { token_id: 2 },
            })
            .collect();
        let task = Arc::new(Task {
            id: "t".into(),
            prompt: "p".into(),
            prompt_ids: vec![1],
            reference: Reference::default(),
            reward: 0,
            data: Default::default(),
        });
        let ticket = GroupTicket {
            group_id: 0,
            task,
            permit: GenerationPermit {
                policy_version: PolicyVersion(0),
                update_slot: 0,
                permit_index: 0,
            },
            temperature: 1.0,
        };
        ScoredGroup::new(
            RolloutGroup {
                ticket,
                samples,
                generate_seconds: 0.0,
            },
            rewards,
            0.0,
        )
    }

    #[test]
    fn judge_figures_add_up_over_the_batch_with_failures_by_kind() {
        let figures = |calls, hits, retries, skipped, latency, compared, consistent| {
            Some(JudgeFigures {
                calls,
                cache_hits: hits,
                retries,
                servers_skipped: skipped,
                latency_s: latency,
                compared_pairs: compared,
                consistent_pairs: consistent,
            })
        };
        let groups = [
            group(vec![
                judged(Outcome::Shaped, figures(4, 1, 1, 0, 2.0, 2, 2)),
                judged(Outcome::UnparseableVerdict, figures(2, 0, 0, 1, 1.0, 1, 0)),
            ]),
            group(vec![
                judged(Outcome::ScorerError, figures(2, 0, 4, 3, 3.0, 1, 1)),
                judged(Outcome::Shaped, figures(0, 2, 0, 0, 0.0, 0, 0)),
            ]),
        ];
        let stats = batch_stats(&groups, PolicyVersion(0));
        let judge = stats.judge.clone().expect("a judge scored the batch");
        assert_eq!(judge.calls, 8);
        assert_eq!(judge.cache_hits, 3);
        assert_eq!(judge.retries, 5);
        assert_eq!(judge.servers_skipped, 4);
        assert_eq!((judge.failures, judge.parse_failures), (1, 1));
        assert!((judge.latency_mean_s - 6.0 / 8.0).abs() < 1e-12);
        assert_eq!(judge.swap_consistency, Some(3.0 / 4.0));
        // The outcome counts keep their names.
        assert_eq!(stats.outcomes["unparseable_verdict"], 1);
        assert_eq!(stats.outcomes["scorer_error"], 1);
        // The record carries it, and it survives the log's JSON.
        let mut record = GrpoStepRecord::default();
        stats.apply_to(&mut record);
        assert_eq!(record.judge, Some(judge));
        let line = serde_json::to_string(&GrpoRecord::Step(record.clone())).unwrap();
        assert!(line.contains("\"swap_consistency\":0.75"), "{line}");
        let back: GrpoRecord = serde_json::from_str(&line).unwrap();
        assert_eq!(back, GrpoRecord::Step(record));
    }

    #[test]
    fn batches_without_a_judge_have_no_judge_record() {
        let stats = batch_stats(
            &[group(vec![judged(Outcome::Correct, None)])],
            PolicyVersion(0),
        );
        assert_eq!(stats.judge, None);
        let mut record = GrpoStepRecord::default();
        stats.apply_to(&mut record);
        let line = serde_json::to_string(&GrpoRecord::Step(record)).unwrap();
        assert!(!line.contains("judge"), "{line}");
        // A record written before the field existed still reads.
        let old: GrpoStepRecord =
            serde_json::from_str(&serde_json::to_string(&GrpoStepRecord::default()).unwrap())
                .unwrap();
        assert_eq!(old.judge, None);
    }
}
