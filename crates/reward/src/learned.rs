//! What the learned rewards share (`reward_model`, `process_reward`): their options, the sample
//! they score ([`ScoreItem`]), the scorer traits the caller implements ([`SequenceScorer`],
//! [`StepScorer`], made by a [`ScorerSource`]: this crate runs no model), and the group
//! post-processing ([`Normalize`], [`post_process`]).
//!
//! What it is not: the verifiers (`reward_model.rs`, `process_reward.rs`, which re-export these
//! names). Both verifiers sit above this module, so neither names the other.

use std::path::PathBuf;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::verifier::StepScore;

/// `[rewards.NAME] kind = "reward_model"`'s options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RewardModelConfig {
    /// The reward model's folder: a sequence classifier with one label and its tokenizer (with
    /// a chat template: each sample is scored as the conversation `[user: prompt, assistant:
    /// completion]`). With `url`, only its tokenizer files are read (the ids are made here, as
    /// for a local model, and sent to the server).
    pub model: PathBuf,
    /// A server that scores for this process: `stoke serve --task reward`, or vLLM serving the
    /// same model (`/classify` with `use_activation: false`, which returns raw logits).
    #[serde(default)]
    pub url: Option<String>,
    /// The name the server serves the model under (default: its first model).
    #[serde(default)]
    pub served_model: Option<String>,
    /// Seconds one scoring request may take before the group fails with `scorer_error`.
    #[serde(default = "default_timeout_s")]
    pub timeout_s: f64,
    #[serde(default)]
    pub normalize: Normalize,
    /// Clamp every score to `[-clip, clip]` after normalization.
    #[serde(default)]
    pub clip: Option<f64>,
}

fn default_timeout_s() -> f64 {
    120.0
}

/// How a group's scores are rescaled.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Normalize {
    #[default]
    None,
    /// Subtract the group's mean, divide by its standard deviation.
    Group,
}

/// One sample to score: the task's prompt and the completion.
#[derive(Debug, Clone, Copy)]
pub struct ScoreItem<'a> {
    pub prompt: &'a str,
    pub completion: &'a str,
}

/// Scores conversations with a learned model.
pub trait SequenceScorer: Send + Sync {
    /// One finite score per item, in order. An error fails the whole call.
    fn score(&self, items: &[ScoreItem<'_>]) -> Result<Vec<f64>, String>;
}

/// Makes the scorers of learned rewards (a caller that can run models).
pub trait ScorerSource: Send + Sync {
    /// The scorer of a `reward_model` reward.
    fn scorer(&self, config: &RewardModelConfig) -> Result<Arc<dyn SequenceScorer>, String>;

    /// The step scorer of a `process_reward` reward (by default: none, with the reason).
    fn step_scorer(&self, _config: &ProcessRewardConfig) -> Result<Arc<dyn StepScorer>, String> {
        Err("this caller cannot run process reward models".into())
    }
}

/// `[rewards.NAME] kind = "process_reward"`'s options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ProcessRewardConfig {
    /// The PRM's folder: a token classifier with two labels and its tokenizer.
    pub model: PathBuf,
    #[serde(default)]
    pub aggregation: Aggregation,
    /// Where a completion splits into steps: the separator the PRM was trained with (`stoke
    /// prm`'s `[prm] step_separator`, TRL's `PRMConfig` default `"\n"`).
    #[serde(default = "default_separator")]
    pub step_separator: String,
    #[serde(default)]
    pub normalize: Normalize,
    /// Clamp every score to `[-clip, clip]` after normalization.
    #[serde(default)]
    pub clip: Option<f64>,
    /// Also shape the token advantages with the step scores (the learner's dense process
    /// supervision); the outcome score is used either way.
    #[serde(default)]
    pub dense: bool,
}

fn default_separator() -> String {
    "\n".into()
}

/// How a completion's step scores become one score.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Aggregation {
    /// The lowest step score.
    #[default]
    Min,
    /// The last step's score.
    Last,
    /// The mean step score.
    Mean,
}

impl Aggregation {
    /// One score from the step scores, in order; no steps: 0.
    pub fn aggregate(self, scores: &[f64]) -> f64 {
        match (self, scores) {
            (_, []) => 0.0,
            (Aggregation::Min, _) => scores.iter().copied().fold(f64::INFINITY, f64::min),
            (Aggregation::Last, [.., last]) => *last,
            (Aggregation::Mean, _) => scores.iter().sum::<f64>() / scores.len() as f64,
        }
    }
}

/// Scores completions step by step with a PRM.
pub trait StepScorer: Send + Sync {
    /// Per item, in order: its steps (bytes in the completion, P(good); a repeated step 0), in
    /// order. An error fails the whole call.
    fn score_steps(&self, items: &[ScoreItem<'_>]) -> Result<Vec<Vec<StepScore>>, String>;
}

/// The post-processing of one group's raw scores (normalization, then clipping).
pub fn post_process(raw: &[f64], normalize: Normalize, clip: Option<f64>) -> Vec<f64> {
    let n = raw.len().max(1) as f64;
    let mean = raw.iter().sum::<f64>() / n;
    let std = (raw.iter().map(|s| (s - mean).powi(2)).sum::<f64>() / n).sqrt();
    raw.iter()
        .map(|&s| {
            let s = match normalize {
                Normalize::None => s,
                Normalize::Group => (s - mean) / (std + 1e-6),
            };
            match clip {
                Some(c) => s.clamp(-c, c),
                None => s,
            }
        })
        .collect()
}
