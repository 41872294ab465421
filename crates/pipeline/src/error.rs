//! The one error type of the RL pipeline. Each variant names where the failure happened (which
//! file, line, field or module) so a user can act on it. Per-sample failures (a panicking or
//! hanging verifier, a NaN update) are not errors: they are recorded in metrics and the run
//! continues; these variants are the failures that stop a run.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum PipelineError {
    #[error("grpo config `{field}`: {reason}")]
    Config { field: String, reason: String },
    #[error("{file}:{line}: {reason}")]
    Task {
        file: PathBuf,
        line: usize,
        reason: String,
    },
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("rollout: {0}")]
    Rollout(#[from] stoke_rollout::RolloutError),
    #[error("held-out evaluation: {0}")]
    Eval(#[from] stoke_eval::TargetError),
    /// Boxed: the trainer's error is large and would make every `Result` of the pipeline large.
    #[error("trainer: {0}")]
    Train(Box<stoke_train::error::TrainError>),
    #[error("grpo loss: {0}")]
    Loss(#[from] stoke_train::grpo::GrpoError),
    #[error("model: {0}")]
    Model(#[from] stoke_model::ModelError),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] stoke_tokenizer::error::TokenizerError),
    #[error("tensor operation: {0}")]
    Tensor(#[from] candle_core::Error),
    #[error("reward: {0}")]
    Reward(String),
    /// A remote module (rollout or reward servers) could not do its work on any server, or a
    /// server failed the checks before the first step.
    #[error("remote {service}: {reason}")]
    Remote {
        service: &'static str,
        reason: String,
    },
    /// A module thread died or a buffer closed before the run finished.
    #[error("pipeline module `{module}` stopped: {reason}")]
    ModuleStopped {
        module: &'static str,
        reason: String,
    },
}

impl From<stoke_train::error::TrainError> for PipelineError {
    fn from(error: stoke_train::error::TrainError) -> PipelineError {
        PipelineError::Train(Box::new(error))
    }
}

/// The shared metrics log's errors: a bad line keeps its file and line number.
impl From<stoke_train::metrics::MetricsError> for PipelineError {
    fn from(error: stoke_train::metrics::MetricsError) -> PipelineError {
        use stoke_train::metrics::MetricsError;
        match error {
            MetricsError::BadLine {
                path,
                line,
                message,
            } => PipelineError::Task {
                file: path,
                line,
                reason: message,
            },
            MetricsError::Io { path, source } => PipelineError::Io { path, source },
            other => PipelineError::Train(Box::new(other.into())),
        }
    }
}

impl PipelineError {
    pub fn config(field: impl Into<String>, reason: impl Into<String>) -> PipelineError {
        PipelineError::Config {
            field: field.into(),
            reason: reason.into(),
        }
    }

    pub fn io(path: impl Into<PathBuf>, source: std::io::Error) -> PipelineError {
        PipelineError::Io {
            path: path.into(),
            source,
        }
    }
}
