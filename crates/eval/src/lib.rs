//! stoke-eval: evaluation tasks and metrics: built-in generated tasks with exact answers,
//! accuracy, pass@k and bits-per-byte over held-out sets, run through the rollout engine and the
//! reward crate's verifiers.
//!
//! Modules: [`arithmetic`] (the procedural word-problem task: generator, levels, train/held-out
//! split), [`corpus`] (the task written as a pretraining corpus and as SFT chat JSONL),
//! [`accuracy`] (held-out exact-match accuracy of a chat model through `stoke_rollout::Engine`).
//! The arithmetic task is the built-in verifiable task of `stoke speedrun` and of GRPO: its
//! problems carry exact integer answers that the reward crate's `gsm8k` exact-match mode checks.

pub mod accuracy;
pub mod arithmetic;
pub mod builtin;
pub mod contamination;
pub mod corpus;
pub mod docs;
pub mod harness;
pub mod metrics;
pub mod quality;
pub mod target;
pub mod task;
pub mod task_error;

pub use accuracy::{
    AccuracyConfig, AccuracyError, AccuracyReport, LevelAccuracy, SampleRecord, evaluate,
};
pub use arithmetic::{ArithmeticTask, Level, Problem, Split, TaskError};
pub use corpus::{ChatRecord, CorpusError, DocumentStyle, WrittenFile};
pub use harness::{EvalError, ItemRecord, Metric, RunOptions, TaskResult};
pub use target::{EndpointTarget, LocalTarget, Target, TargetError};
pub use task::{OutputType, Task, TaskFile};
