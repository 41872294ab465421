//! stoke-reward: reward functions for RL with verifiable rewards, evaluation and `stoke verify`.
//!
//! A reward is a `Verifier` (`verifier.rs`): it reads a `RewardInput` (prompt, completion, the
//! task's `Reference`, token count) and returns a `RewardOutcome` (score, closed-set `Outcome`,
//! structured `Details`). The set of reward kinds is closed: `RewardConfig` (`config.rs`), a
//! serde-tagged enum with one options struct per kind, built into `Reward` and matched in one
//! place; `RewardKind` (`kind.rs`) names the kinds and `ConfigError` (`error.rs`) is what
//! building one can fail with. One file (or folder) per reward kind:
//!
//! | kind | file | reads |
//! |---|---|---|
//! | `math` | `math/` | `answer` |
//! | `exact_match` | `exact_match.rs` | `answer` |
//! | `unit_tests` | `unit_tests.rs` | `tests`, `entry_point`, `prompt` |
//! | `stdio_tests` | `stdio_tests.rs` | `cases` |
//! | `format_regex` | `format_regex.rs` | completion only |
//! | `tag_structure` | `tag_structure.rs` | completion only |
//! | `json_schema` | `json_schema.rs` | `schema` |
//! | `overlong` | `overlong.rs` | `completion_tokens` |
//! | `group_length` | `group_length.rs` | `completion_tokens`, `correct` (group-level) |
//! | `cosine_length` | `cosine_length.rs` | `completion_tokens`, `correct` |
//! | `repetition` | `repetition.rs` | completion only |
//! | `instructions` | `instructions.rs` | completion only (constraints in the config) |
//! | `composite` | `config/composite.rs` | whatever its components read |
//! | `reward_model` | `reward_model.rs` | prompt and completion (a learned model the caller runs) |
//! | `process_reward` | `process_reward.rs` | prompt and completion, step by step (a PRM the caller runs) |
//! | `judge` | `judge/` | prompt and completion(s) (a language model on OpenAI-compatible servers) |
//!
//! What this crate is not: a tokenizer (token counts are inputs) or a process jail (code runs
//! through `stoke-sandbox`). It has no tensor dependency and no async runtime (the judge's HTTP
//! calls are blocking `ureq` on scoped threads).
//!
//! Invariants: no verifier panics on any input or blocks without bound (the judge's requests
//! have timeouts and bounded retries); pure verifiers bound their work by input size; a
//! reference that cannot be parsed yields `UnparseableGold`, and a judge verdict that cannot be
//! read `UnparseableVerdict`, never a positive score.

pub mod code;
pub mod config;
pub mod constraint;
pub mod cosine_length;
pub mod error;
pub mod exact_match;
pub mod format_regex;
pub mod group_length;
pub mod instructions;
pub mod json_schema;
pub mod judge;
pub mod kind;
pub mod learned;
pub mod math;
pub mod overlong;
pub mod process_reward;
pub mod repetition;
pub mod reward_model;
pub mod stats;
pub mod stdio_tests;
pub mod tag_structure;
pub mod unit_tests;
pub mod verifier;

pub use config::composite;
pub use config::{Reward, RewardConfig};
pub use error::ConfigError;
pub use kind::RewardKind;
pub use stats::RewardStats;
pub use verifier::{
    Check, ComponentScore, Details, IoCase, JudgeFigures, Outcome, Reference, RewardInput,
    RewardOutcome, StepScore, Verifier,
};
