//! Process reward models (PRMs): a token classifier that scores each step of a reasoning trace
//! (Lightman et al. 2023, "Let's Verify Step by Step"; Uesato et al. 2022), trained as TRL
//! 0.29.0's `PRMTrainer` trains one and used as a reward.
//!
//! The pieces, one noun per submodule:
//!
//! - [`data`]: stepwise rows (`prompt`, `completions`, `labels`; PRM800K in TRL's format) ->
//!   ids and per-token labels, TRL's `tokenize_row` rule.
//! - [`loss`]: cross-entropy over the labelled positions (the last token of each step), mean.
//! - [`steps`]: a generated trace split into steps with the hack checks (empty steps dropped,
//!   repeats scored 0) and the aggregation of step scores (`min`, `last`, `mean`).
//! - [`scorer`]: a trained PRM scoring generated traces step by step (P(good) per step).
//! - [`train`]: the training loop's state and step; [`run`]: `stoke prm CONFIG.toml` in the run
//!   shell every training command shares.
//!
//! The model is `stoke_model::Transformer` as a token classifier with two labels (0 = bad step,
//! 1 = good step; `LlamaForTokenClassification` and its kin, `Transformer::score_tokens`). Dense
//! advantages for GRPO from step scores are `grpo::process_advantage`.
//!
//! What this is not: the PRM as a `stoke grpo` reward kind (`stoke_reward::process_reward`, its
//! scorer in `stoke_pipeline::learned_reward`, the dense advantages' hook in
//! `stoke_pipeline::dense_process`).

pub mod data;
pub mod loss;
pub mod run;
pub mod scorer;
pub mod steps;
pub mod train;

use std::path::PathBuf;

pub use data::{
    StepwiseRow, StepwiseTokenization, TokenizedSteps, parse_row, read_rows, tokenize_row,
};
pub use loss::{ProcessRewardLoss, good_probability};
pub use scorer::{ScoredTrace, score_traces};
pub use steps::{Step, StepAggregation, StepKind, StepRule, step_scores, token_spans};

/// Every way PRM data, scoring or loss can fail.
#[derive(Debug, thiserror::Error)]
pub enum PrmError {
    /// A row of a stepwise file (or one built in code) that the rule cannot use.
    #[error("{}line {line}: `{field}`: {message}", file.as_ref().map(|f| format!("{}: ", f.display())).unwrap_or_default())]
    Row {
        line: usize,
        field: &'static str,
        message: String,
        file: Option<PathBuf>,
    },
    /// A setting the rule cannot work with.
    #[error("prm `{field}`: {message}")]
    Config {
        field: &'static str,
        message: String,
    },
    #[error("{path}: {message}")]
    Io { path: PathBuf, message: String },
    #[error("prm inputs: {0}")]
    Shape(String),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] stoke_tokenizer::error::TokenizerError),
    #[error("model: {0}")]
    Model(#[from] stoke_model::ModelError),
    #[error("tensor operation: {0}")]
    Tensor(#[from] candle_core::Error),
}

impl From<PrmError> for crate::error::TrainError {
    fn from(error: PrmError) -> Self {
        crate::error::TrainError::Prm(error.to_string())
    }
}

impl PrmError {
    /// A row error of `file`.
    pub(crate) fn in_file(self, path: &std::path::Path) -> PrmError {
        match self {
            PrmError::Row {
                line,
                field,
                message,
                ..
            } => PrmError::Row {
                line,
                field,
                message,
                file: Some(path.to_path_buf()),
            },
            other => other,
        }
    }
}
