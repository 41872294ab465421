//! The environment boundary: what an environment must do for the episode runner.
//!
//! An [`Environment`] is shared by every episode of a run (`Send + Sync`, like a reward's
//! verifier); it opens episodes. An [`Episode`] is one conversation's state (a work dir, counters,
//! what the model has done so far) and is driven by one thread at a time:
//!
//! ```text
//! opening(task) -> messages + tools      (the group's prompt: the same for every sample)
//! start(task)   -> episode
//! loop: model turn -> episode.step(turn) -> messages, reward, done
//! episode.finish(stop reason) -> outcome reward on the final state
//! ```
//!
//! What it is not: the loop itself (the pipeline's episode runner), limits (max turns and
//! tokens are the runner's; a tool's own timeout is the tool's), or the tokenizer (environments
//! speak chat messages; the runner renders them as ids).
//!
//! Contract:
//! - `opening` is deterministic in the task: a GRPO group shares one prompt, rendered once.
//! - `step` is called once per model turn, in order, never after it returned `done` or an error.
//! - `finish` is called exactly once per started episode that is still in hand, whatever ended
//!   it (done, a limit, a truncated turn), and may score the final state (tests on the files the
//!   agent left). An episode whose `step` panicked or hung is abandoned instead: its outcome is
//!   the recorded failure.
//! - Rewards are finite; a non-finite reward is the environment's failure, not a score.

use std::collections::BTreeMap;

use serde::Serialize;
use serde_json::Value;
use stoke_reward::Reference;
use stoke_tokenizer::chat::ChatMessage;
use stoke_tokenizer::tool_calls::ToolCall;

use crate::error::EnvError;
use crate::tool::ToolSpec;

/// One task an episode is run on: what the pipeline's task loader read.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvTask {
    /// Stable name for logs (the JSONL `id`, else `FILE:LINE`).
    pub id: String,
    /// The user's request.
    pub prompt: String,
    /// Reference data a final-state reward reads (gold answer, hidden tests).
    pub reference: Reference,
    /// Extra task fields the environment understands (a repository's files, ...).
    pub data: BTreeMap<String, Value>,
}

/// How an episode opens: the messages before the model's first turn and the tools offered (given
/// to the chat template as its `tools` variable).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Opening {
    pub messages: Vec<ChatMessage>,
    pub tools: Vec<ToolSpec>,
}

/// The model's side of one turn, as the environment sees it.
#[derive(Clone, Copy, Debug)]
pub struct ModelTurn<'a> {
    /// 0 for the model's first turn.
    pub index: usize,
    /// The turn's text, decoded from the sampled ids without the end-of-turn token.
    pub text: &'a str,
    /// The text before the first tool call (all of it when there is none).
    pub content: Option<&'a str>,
    /// Tool calls parsed from the text by the run's tool-call parser.
    pub tool_calls: &'a [ToolCall],
}

/// A tool call as the episode record keeps it (for monitors and the transcript).
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ToolCallRecord {
    pub turn: usize,
    pub name: String,
    pub arguments: String,
    /// The tool failed (unknown tool, bad arguments, error, timeout).
    pub failed: bool,
    pub seconds: f64,
    /// Files the call touched, as the tool reports them (for reward-hacking monitors).
    pub touched: Vec<String>,
}

/// The environment's answer to one model turn.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EnvStep {
    /// Messages to append (tool results, a user follow-up); empty when `done`.
    pub messages: Vec<ChatMessage>,
    /// Per-turn reward (0 when the environment gives none).
    pub reward: f64,
    /// The episode is over (a final answer, a solved task).
    pub done: bool,
    /// Tool calls this step ran.
    pub tool_calls: Vec<ToolCallRecord>,
    /// Free-form figures for logs and metrics.
    pub metadata: BTreeMap<String, Value>,
}

/// Why an episode ended.
#[derive(Clone, Debug, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StopReason {
    /// The environment said done.
    Done,
    /// `max_turns` model turns were taken.
    MaxTurns { turns: usize },
    /// The episode reached `max_total_tokens` (model and environment tokens after the prompt).
    MaxTotalTokens { tokens: usize },
    /// A model turn hit `max_turn_tokens` (or the context end) without ending its turn.
    TurnTruncated { turn: usize },
    /// The model's context is full (`max_position_embeddings`).
    ContextFull { tokens: usize },
    /// The model ended on an end-of-sequence token that does not close a chat turn (e.g.
    /// `<|endoftext|>` where the template closes turns with `<|im_end|>`): it ended the
    /// conversation, and nothing can follow it in the template's format.
    ModelEnded { token_id: u32 },
    /// The model sampled an id the tokenizer has no token for (a padded vocabulary row): its
    /// turn has no text to show the environment.
    Undecodable { token_id: u32 },
    /// The environment failed (error, panic or timeout); the message says which.
    EnvFailed { message: String },
}

impl StopReason {
    /// A short name for counters and metrics.
    pub fn name(&self) -> &'static str {
        match self {
            StopReason::Done => "done",
            StopReason::MaxTurns { .. } => "max_turns",
            StopReason::MaxTotalTokens { .. } => "max_total_tokens",
            StopReason::TurnTruncated { .. } => "turn_truncated",
            StopReason::ContextFull { .. } => "context_full",
            StopReason::ModelEnded { .. } => "model_ended",
            StopReason::Undecodable { .. } => "undecodable",
            StopReason::EnvFailed { .. } => "env_failed",
        }
    }
}

/// A kind of environment: opens episodes. Shared by all episodes of a run.
pub trait Environment: Send + Sync {
    /// The name logs and records use.
    fn name(&self) -> &str;

    /// The opening of an episode on `task`; deterministic in the task.
    fn opening(&self, task: &EnvTask) -> Result<Opening, EnvError>;

    /// A fresh episode on `task`.
    fn start(&self, task: &EnvTask) -> Result<Box<dyn Episode>, EnvError>;

    /// Whether solving a task takes a tool call (the calculator's products do): an episode that
    /// scores without one is reported by the reward-hacking monitor.
    fn requires_tool(&self) -> bool {
        false
    }

    /// Whether the outcome reward (`Episode::finish`) is the task's grade, 1 meaning solved
    /// (code repair's hidden tests): the run then takes a sample's verdict from it rather than
    /// from the configured reward's check of the final answer.
    fn grades_outcome(&self) -> bool {
        false
    }
}

/// One episode's state.
pub trait Episode: Send {
    /// The environment's answer to the model's turn.
    fn step(&mut self, turn: &ModelTurn<'_>) -> Result<EnvStep, EnvError>;

    /// The outcome reward on the final state, once, whatever ended the episode. The default
    /// gives none (0): the run's configured reward scores the final answer instead.
    fn finish(&mut self, _stop: &StopReason) -> Result<f64, EnvError> {
        Ok(0.0)
    }
}
