//! Rejection sampling for fine-tuning (RFT, Yuan et al. 2023; the third stage of DeepSeek-R1):
//! sample `k` completions per task from a policy, keep those the task's verifier calls
//! `Correct`, and write them as chat JSONL that `stoke train`'s SFT reader takes.
//!
//! What it is: [`sample_and_filter`] (generation with `stoke_rollout::Engine`, several prompts
//! per call, scoring with the run's [`RewardPool`]), the pure per-task filter [`filter_group`],
//! and [`write_chat_jsonl`]. What it is not: the SFT itself (`stoke_train::run`), config
//! parsing, or model loading (the CLI's `stoke rft` and `stoke r1` do those).
//!
//! The filter, per task, in sample order:
//! - only samples whose outcome is `Correct` are candidates (a verifier that panicked or timed
//!   out counts as not correct, as in GRPO); with `verify` off every sample is (offline
//!   distillation: a teacher's samples taken as they are);
//! - a correct sample that hit `max_new_tokens` is dropped unless `keep_truncated`: its text
//!   does not end where the policy ended it, and SFT would teach it to stop there (the chat
//!   template closes the turn);
//! - a text equal to one already kept for the task is dropped (exact string equality);
//! - at most `keep_per_prompt` texts are kept; the first ones in sample order win.
//!
//! Each kept completion becomes one line `{"messages": [{"role": "user", "content": PROMPT},
//! {"role": "assistant", "content": COMPLETION}], "prompt_ids": [...], "completion_ids": [...],
//! "task_id": ..., "sample": j}` where PROMPT is `Task::prompt` (the last user message of the
//! task) and the ids are exactly what the model was prompted with and sampled. `stoke train`'s
//! SFT reader trains on the ids when a line has them (no retokenization, so the student learns
//! the very tokens the teacher chose, and a prompt with a system message or earlier turns keeps
//! them); the messages are for people and for readers without ids. A task whose prompt tokens are
//! not the chat-template rendering of that one user message is counted in
//! [`RejectionReport::prompts_with_other_context`]: its messages lack that context (its ids do
//! not).
//!
//! Preference pairs from the same samples (the iterative/online DPO route): per task, the kept
//! correct completions in order are paired with the distinct wrong ones (scored, not correct,
//! no verifier failure) in order, as many pairs as the shorter list; [`write_pairs_jsonl`]
//! writes them in the format `stoke dpo` reads, with the sampled token ids alongside the
//! texts, so DPO trains on exactly the tokens the policy produced.
//!
//! Invariants: sample `j` of task `i` draws from the engine's stream `(seed, i, j)`, so the
//! output depends on (model, tasks, settings) only, not on batching; the JSONL file is written
//! to a temporary name and renamed, so it is either complete or absent.

use std::io::Write;
use std::path::Path;
use std::sync::Arc;
use std::time::Instant;

use serde::{Deserialize, Serialize};
use stoke_model::Transformer;
use stoke_rollout::{Detokenizer, Engine, GenerationRequest, SamplingParams};
use stoke_tokenizer::chat::{ChatMessage, ChatOptions};
use stoke_tokenizer::hf::Tokenizer;

use crate::error::PipelineError;
use crate::records::{RolloutGroup, ScoredGroup, Task};
use crate::reward::RewardPool;

/// Tasks per engine call (each with `samples_per_prompt` rows).
const PROMPTS_PER_CALL: usize = 16;

/// How to sample and what to keep.
#[derive(Clone, Debug, PartialEq)]
pub struct RejectionSettings {
    /// `k`: completions drawn per task.
    pub samples_per_prompt: usize,
    /// Most distinct correct completions kept per task.
    pub keep_per_prompt: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub max_new_tokens: usize,
    pub seed: u64,
    /// Keep correct samples that hit `max_new_tokens` (default off; see the module doc).
    pub keep_truncated: bool,
    /// Keep only samples the reward calls `Correct` (default). Off: every sample is a candidate,
    /// verified or not (sequence-level distillation from a teacher trusted as it is); rewards are
    /// still computed and counted, and preference pairs still take correct samples only.
    pub verify: bool,
}

impl RejectionSettings {
    /// Checks ranges; errors name the `[sampling]` key.
    pub fn validate(&self) -> Result<(), PipelineError> {
        if self.samples_per_prompt == 0 {
            return Err(PipelineError::config(
                "sampling.samples",
                "must be at least 1",
            ));
        }
        if self.keep_per_prompt == 0 {
            return Err(PipelineError::config(
                "sampling.keep_per_prompt",
                "must be at least 1",
            ));
        }
        if self.max_new_tokens == 0 {
            return Err(PipelineError::config(
                "sampling.max_new_tokens",
                "must be at least 1",
            ));
        }
        if !(self.temperature.is_finite() && self.temperature > 0.0) {
            return Err(PipelineError::config(
                "sampling.temperature",
                format!(
                    "must be > 0 (rejection sampling draws several different completions), got {}",
                    self.temperature
                ),
            ));
        }
        if !(self.top_p > 0.0 && self.top_p <= 1.0) {
            return Err(PipelineError::config(
                "sampling.top_p",
                format!("must be in (0, 1], got {}", self.top_p),
            ));
        }
        Ok(())
    }
}

/// One kept completion: a line of the SFT file.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct KeptCompletion {
    pub task_id: String,
    /// The task's prompt as the verifier saw it (the user message of the SFT line).
    pub prompt: String,
    pub completion: String,
    /// The prompt exactly as the model was given it (chat template applied, generation prompt
    /// included) and the sampled token ids (ending in the stop token when the sample stopped):
    /// SFT trains on these ids as they are, so no retokenization changes what was sampled.
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    /// Which of the task's samples it was.
    pub sample_index: usize,
}

/// What one task's filter decided, as counts and the kept sample indices.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct FilteredGroup {
    /// Indices of the kept samples, in sample order.
    pub kept: Vec<usize>,
    pub correct: usize,
    pub truncated: usize,
    pub duplicates: usize,
    pub over_cap: usize,
    pub reward_failures: usize,
}

/// Counts of a whole rejection-sampling pass.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct RejectionReport {
    pub prompts: usize,
    pub samples: usize,
    /// Samples the verifier called `Correct`.
    pub correct: usize,
    /// Lines written: correct, complete, distinct, within the per-task cap.
    pub kept: usize,
    pub prompts_with_kept: usize,
    /// Correct samples dropped because they hit `max_new_tokens`.
    pub truncated: usize,
    /// Correct samples dropped as repeats of a text already kept for the task.
    pub duplicates: usize,
    /// Correct distinct samples dropped by `keep_per_prompt`.
    pub over_cap: usize,
    /// Samples whose verifier panicked or timed out (not kept).
    pub reward_failures: usize,
    /// Tasks whose prompt is more than the one user message the SFT line holds.
    pub prompts_with_other_context: usize,
    pub generated_tokens: usize,
    pub seconds: f64,
}

impl RejectionReport {
    /// Kept lines per sample drawn.
    pub fn acceptance_rate(&self) -> f64 {
        self.kept as f64 / self.samples.max(1) as f64
    }

    /// Correct samples per sample drawn (the policy's sampled pass@1 on these tasks).
    pub fn correct_rate(&self) -> f64 {
        self.correct as f64 / self.samples.max(1) as f64
    }

    /// One line for logs.
    pub fn summary(&self) -> String {
        let failures = if self.reward_failures > 0 {
            format!(
                ", {} reward failures (panics, timeouts)",
                self.reward_failures
            )
        } else {
            String::new()
        };
        format!(
            "{} prompts x {} samples: {} correct ({:.1}%), {} kept ({:.1}% accepted; {} duplicates, \
             {} truncated, {} over the cap), {} prompts with at least one kept{failures}, {:.1} s",
            self.prompts,
            self.samples / self.prompts.max(1),
            self.correct,
            100.0 * self.correct_rate(),
            self.kept,
            100.0 * self.acceptance_rate(),
            self.duplicates,
            self.truncated,
            self.over_cap,
            self.prompts_with_kept,
            self.seconds
        )
    }

    fn add(&mut self, group: &FilteredGroup, samples: usize) {
        self.prompts += 1;
        self.samples += samples;
        self.correct += group.correct;
        self.kept += group.kept.len();
        self.prompts_with_kept += usize::from(!group.kept.is_empty());
        self.truncated += group.truncated;
        self.duplicates += group.duplicates;
        self.over_cap += group.over_cap;
        self.reward_failures += group.reward_failures;
    }
}

/// A verified-correct and a wrong completion of one task.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct VerifiedPair {
    pub task_id: String,
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub chosen: String,
    pub chosen_ids: Vec<u32>,
    pub rejected: String,
    pub rejected_ids: Vec<u32>,
}

/// The kept completions, the preference pairs and the counts.
#[derive(Clone, Debug)]
pub struct RejectionResult {
    pub kept: Vec<KeptCompletion>,
    pub pairs: Vec<VerifiedPair>,
    pub report: RejectionReport,
}

/// Applies the filter of the module doc to one scored task.
pub fn filter_group(
    group: &ScoredGroup,
    keep_per_prompt: usize,
    keep_truncated: bool,
    verify: bool,
) -> FilteredGroup {
    let mut filtered = FilteredGroup::default();
    let mut kept_texts: Vec<&str> = Vec::new();
    for (index, (sample, reward)) in group.rollout.samples.iter().zip(&group.rewards).enumerate() {
        if reward.failure.is_some() {
            filtered.reward_failures += 1;
        }
        if reward.correct() {
            filtered.correct += 1;
        } else if verify {
            continue;
        }
        if sample.truncated() && !keep_truncated {
            filtered.truncated += 1;
        } else if kept_texts.contains(&sample.text.as_str()) {
            filtered.duplicates += 1;
        } else if kept_texts.len() >= keep_per_prompt {
            filtered.over_cap += 1;
        } else {
            kept_texts.push(&sample.text);
            filtered.kept.push(index);
        }
    }
    filtered
}

/// Samples every task `samples_per_prompt` times with `model`, scores the samples with
/// `rewards` and keeps what the filter keeps. `progress` sees the counts after every engine call.
pub fn sample_and_filter(
    model: &Transformer,
    tokenizer: &Tokenizer,
    tasks: &[Arc<Task>],
    rewards: &RewardPool,
    settings: &RejectionSettings,
    progress: &mut dyn FnMut(&RejectionReport),
) -> Result<RejectionResult, PipelineError> {
    let started = Instant::now();
    settings.validate()?;
    if tasks.is_empty() {
        return Err(PipelineError::config("tasks", "no tasks to sample"));
    }
    if tokenizer.chat_template().is_none() {
        return Err(PipelineError::config(
            "model",
            "the tokenizer has no chat template; rejection sampling writes chat JSONL for SFT, \
             which is rendered with it",
        ));
    }
    let stop_token_ids = stop_token_ids(tokenizer, model)?;
    let engine = Engine::new(model);
    let detokenizer: &dyn Detokenizer = tokenizer;
    let params = SamplingParams {
        max_new_tokens: settings.max_new_tokens,
        temperature: settings.temperature,
        top_k: settings.top_k,
        top_p: settings.top_p,
        seed: settings.seed,
        n: settings.samples_per_prompt,
        stop_token_ids,
        stop_strings: Vec::new(),
    };
    let mut report = RejectionReport::default();
    let mut kept = Vec::new();
    let mut pairs = Vec::new();
    for (chunk_index, chunk) in tasks.chunks(PROMPTS_PER_CALL).enumerate() {
        let first = chunk_index * PROMPTS_PER_CALL;
        let request = GenerationRequest {
            prompts: chunk.iter().map(|t| t.prompt_ids.clone()).collect(),
            params: params.clone(),
            first_prompt_number: first as u64,
            streams: None,
        };
        let output = engine.generate(&request, Some(detokenizer))?;
        report.generated_tokens += output.generated_tokens;
        for (offset, completions) in output.completions.into_iter().enumerate() {
            let task = Arc::clone(&chunk[offset]);
            if !is_single_user_turn(&task, tokenizer)? {
                report.prompts_with_other_context += 1;
            }
            let group = RolloutGroup::offline(
                (first + offset) as u64,
                Arc::clone(&task),
                settings.temperature,
                completions,
            );
            let sample_count = group.samples.len();
            let scored = rewards.score(group);
            let filtered = filter_group(
                &scored,
                settings.keep_per_prompt,
                settings.keep_truncated,
                settings.verify,
            );
            report.add(&filtered, sample_count);
            kept.extend(filtered.kept.iter().map(|&index| KeptCompletion {
                task_id: task.id.clone(),
                prompt: task.prompt.clone(),
                completion: scored.rollout.samples[index].text.clone(),
                prompt_ids: task.prompt_ids.clone(),
                completion_ids: scored.rollout.samples[index].completion_ids.clone(),
                sample_index: index,
            }));
            pairs.extend(pair_group(&scored, &filtered));
        }
        report.seconds = started.elapsed().as_secs_f64();
        progress(&report);
    }
    report.seconds = started.elapsed().as_secs_f64();
    Ok(RejectionResult {
        kept,
        pairs,
        report,
    })
}

/// The kept correct samples of a task paired, in order, with its distinct wrong ones.
pub fn pair_group(group: &ScoredGroup, filtered: &FilteredGroup) -> Vec<VerifiedPair> {
    let samples = &group.rollout.samples;
    let mut wrong: Vec<usize> = Vec::new();
    for (index, (sample, reward)) in samples.iter().zip(&group.rewards).enumerate() {
        let distinct = wrong.iter().all(|&w| samples[w].text != sample.text);
        if !reward.correct() && reward.failure.is_none() && distinct {
            wrong.push(index);
        }
    }
    let task = &group.rollout.ticket.task;
    filtered
        .kept
        .iter()
        .filter(|&&index| group.rewards[index].correct())
        .zip(&wrong)
        .map(|(&good, &bad)| VerifiedPair {
            task_id: task.id.clone(),
            prompt: task.prompt.clone(),
            prompt_ids: task.prompt_ids.clone(),
            chosen: samples[good].text.clone(),
            chosen_ids: samples[good].completion_ids.clone(),
            rejected: samples[bad].text.clone(),
            rejected_ids: samples[bad].completion_ids.clone(),
        })
        .collect()
}

/// The JSON line of one pair: `stoke dpo`'s format, with the token ids it trains on.
pub fn pair_line(pair: &VerifiedPair) -> String {
    serde_json::json!({
        "prompt": [{"role": "user", "content": pair.prompt}],
        "chosen": [{"role": "assistant", "content": pair.chosen}],
        "rejected": [{"role": "assistant", "content": pair.rejected}],
        "prompt_ids": pair.prompt_ids,
        "chosen_ids": pair.chosen_ids,
        "rejected_ids": pair.rejected_ids,
        "task_id": pair.task_id,
    })
    .to_string()
}

/// Writes one [`pair_line`] per pair to `path` (through a temporary file and a rename).
pub fn write_pairs_jsonl(path: &Path, pairs: &[VerifiedPair]) -> Result<(), PipelineError> {
    write_lines(path, pairs.iter().map(pair_line))
}

/// The JSON line of one kept completion (see the module doc).
pub fn chat_line(kept: &KeptCompletion) -> String {
    serde_json::json!({
        "messages": [
            {"role": "user", "content": kept.prompt},
            {"role": "assistant", "content": kept.completion},
        ],
        "prompt_ids": kept.prompt_ids,
        "completion_ids": kept.completion_ids,
        "task_id": kept.task_id,
        "sample": kept.sample_index,
    })
    .to_string()
}

/// Writes one [`chat_line`] per kept completion to `path` (through a temporary file and a
/// rename, so a stopped run leaves no partial file under the final name).
pub fn write_chat_jsonl(path: &Path, kept: &[KeptCompletion]) -> Result<(), PipelineError> {
    write_lines(path, kept.iter().map(chat_line))
}

/// Writes one line per item to `path` through a temporary file and a rename (a stopped run
/// leaves no partial file under the final name).
pub fn write_lines(path: &Path, lines: impl Iterator<Item = String>) -> Result<(), PipelineError> {
    let mut temporary = path.as_os_str().to_owned();
    temporary.push(".tmp");
    let temporary = std::path::PathBuf::from(temporary);
    let write = || -> std::io::Result<()> {
        let mut file = std::io::BufWriter::new(std::fs::File::create(&temporary)?);
        for line in lines {
            writeln!(file, "{line}")?;
        }
        file.into_inner().map_err(|e| e.into_error())?.sync_all()
    };
    write().map_err(|e| PipelineError::io(&temporary, e))?;
    std::fs::rename(&temporary, path).map_err(|e| PipelineError::io(path, e))
}

/// The ids generation stops on: the tokenizer's and the model config's end-of-sequence tokens
/// (as `run` takes them).
fn stop_token_ids(tokenizer: &Tokenizer, model: &Transformer) -> Result<Vec<u32>, PipelineError> {
    let mut ids = tokenizer.eos_token_ids();
    ids.extend(model.config().eos_token_ids.iter().copied());
    ids.sort_unstable();
    ids.dedup();
    if ids.is_empty() {
        return Err(PipelineError::config(
            "model",
            "the tokenizer and model config name no end-of-sequence token to stop generation on",
        ));
    }
    Ok(ids)
}

/// Whether the task's prompt tokens are exactly one user message holding `task.prompt`, with
/// the generation prompt (what the SFT line reproduces).
fn is_single_user_turn(task: &Task, tokenizer: &Tokenizer) -> Result<bool, PipelineError> {
    let options = ChatOptions {
        add_generation_prompt: true,
        ..ChatOptions::default()
    };
    let rendered =
        tokenizer.apply_chat_template(&[ChatMessage::user(task.prompt.as_str())], &options)?;
    Ok(rendered.ids == task.prompt_ids)
}

#[cfg(test)]
mod tests {
    use stoke_reward::{Outcome, Reference};
    use stoke_rollout::FinishReason;

    use super::*;
    use crate::records::{GroupTicket, RewardFailure, Sample, SampleReward};
    use crate::staleness::{GenerationPermit, PolicyVersion};

    fn reward(outcome: Outcome) -> SampleReward {
        SampleReward {
            score: if outcome == Outcome::Correct {
                1.0
            } else {
                0.0
            },
            outcome,
            components: Vec::new(),
            failure: None,
            judge: None,
            steps: None,
        }
    }

    fn group(samples: &[(&str, bool)], rewards: Vec<SampleReward>) -> ScoredGroup {
        let samples = samples
            .iter()
            .map(|(text, truncated)| Sample {
                completion_ids: vec![1],
                rollout_logprobs: vec![-1.0],
                token_versions: Vec::new(),
                loss_mask: None,
                episode: None,
                text: text.to_string(),
                finish: if *truncated {
                    FinishReason::Length
                } else {
                    FinishReason::Eos { token_id: 2 }
                },
            })
            .collect();
        let task = Arc::new(Task {
            id: "t".into(),
            prompt: "1+1?".into(),
            prompt_ids: vec![1],
            reference: Reference::default(),
            reward: 0,
            data: Default::default(),
        });
        ScoredGroup::new(
            RolloutGroup {
                ticket: GroupTicket {
                    group_id: 0,
                    task,
                    permit: GenerationPermit {
                        policy_version: PolicyVersion(0),
                        update_slot: 0,
                        permit_index: 0,
                    },
                    temperature: 1.0,
                },
                samples,
                generate_seconds: 0.0,
            },
            rewards,
            0.0,
        )
    }

    #[test]
    fn keeps_only_correct_complete_distinct_samples_up_to_the_cap() {
        let scored = group(
            &[
                ("wrong", false),
                ("a", false),
                ("a", false),
                ("cut", true),
                ("b", false),
                ("c", false),
                ("d", false),
            ],
            vec![
                reward(Outcome::Wrong),
                reward(Outcome::Correct),
                reward(Outcome::Correct),
                reward(Outcome::Correct),
                reward(Outcome::Correct),
                reward(Outcome::Correct),
                reward(Outcome::Correct),
            ],
        );
        let filtered = filter_group(&scored, 3, false, true);
        assert_eq!(filtered.kept, vec![1, 4, 5]);
        assert_eq!(filtered.correct, 6);
        assert_eq!(filtered.duplicates, 1);
        assert_eq!(filtered.truncated, 1);
        assert_eq!(filtered.over_cap, 1);
        let with_truncated = filter_group(&scored, 3, true, true);
        assert_eq!(with_truncated.kept, vec![1, 3, 4]);
        assert_eq!(with_truncated.truncated, 0);
        // Unverified (offline distillation): the wrong first sample is a candidate too; the
        // correct count is unchanged.
        let unverified = filter_group(&scored, 3, false, false);
        assert_eq!(unverified.kept, vec![0, 1, 4]);
        assert_eq!(unverified.correct, 6);
    }

    #[test]
    fn a_failed_verifier_is_never_kept() {
        let scored = group(
            &[("x", false), ("y", false)],
            vec![
                SampleReward::failed(RewardFailure::TimedOut),
                SampleReward::failed(RewardFailure::Panicked("boom".into())),
            ],
        );
        let filtered = filter_group(&scored, 4, false, true);
        assert!(filtered.kept.is_empty());
        assert_eq!(filtered.reward_failures, 2);
        assert_eq!(filtered.correct, 0);
    }

    #[test]
    fn chat_line_is_a_user_and_an_assistant_message() {
        let line = chat_line(&KeptCompletion {
            task_id: "q7".into(),
            prompt: "What is \"2\" + 3?".into(),
            completion: "2 + 3 = 5\n#### 5".into(),
            prompt_ids: vec![1, 2, 3],
            completion_ids: vec![7, 8, 0],
            sample_index: 3,
        });
        let value: serde_json::Value = serde_json::from_str(&line).unwrap();
        assert_eq!(value["messages"][0]["role"], "user");
        assert_eq!(value["messages"][0]["content"], "What is \"2\" + 3?");
        assert_eq!(value["messages"][1]["role"], "assistant");
        assert_eq!(value["messages"][1]["content"], "2 + 3 = 5\n#### 5");
        assert_eq!(value["task_id"], "q7");
        assert_eq!(value["sample"], 3);
        assert_eq!(value["prompt_ids"], serde_json::json!([1, 2, 3]));
        assert_eq!(value["completion_ids"], serde_json::json!([7, 8, 0]));
    }

    #[test]
    fn settings_errors_name_the_key() {
        let settings = RejectionSettings {
            samples_per_prompt: 4,
            keep_per_prompt: 0,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: 8,
            seed: 0,
            keep_truncated: false,
            verify: true,
        };
        let error = settings.validate().unwrap_err().to_string();
        assert!(error.contains("sampling.keep_per_prompt"), "{error}");
        let greedy = RejectionSettings {
            keep_per_prompt: 1,
            temperature: 0.0,
            ..settings
        };
        let error = greedy.validate().unwrap_err().to_string();
        assert!(error.contains("sampling.temperature"), "{error}");
    }
}
