//! `TrainError`: every way a training run can fail, wrapping each module's own error enum.
//!
//! Each variant names what went wrong in the user's terms (the config key, the file, the step);
//! module errors keep their own messages and are wrapped with `#[from]`.

use std::path::PathBuf;

use crate::config::ConfigError;
use crate::source::SourceError;

#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error(transparent)]
    Config(#[from] ConfigError),
    #[error("batch source: {0}")]
    Source(#[from] SourceError),
    #[error("checkpoint: {0}")]
    Checkpoint(#[from] crate::checkpoint::CheckpointError),
    #[error("metrics: {0}")]
    Metrics(#[from] crate::metrics::MetricsError),
    #[error("optimizer: {0}")]
    Optim(#[from] stoke_optim::OptimError),
    #[error("model: {0}")]
    Model(#[from] stoke_model::ModelError),
    #[error("tensor operation: {0}")]
    Tensor(#[from] candle_core::Error),
    /// A process reward model's data or scoring (`prm::PrmError`, converted in `prm`: the
    /// error sits below every module).
    #[error("process reward model: {0}")]
    Prm(String),
    #[error("tokenizer: {0}")]
    Tokenizer(#[from] stoke_tokenizer::error::TokenizerError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    /// Too many consecutive steps had a non-finite loss or gradient norm; nothing was applied
    /// from them and no checkpoint was written from a non-finite state.
    #[error(
        "training stopped at step {step}: {consecutive} consecutive steps had a non-finite loss \
         or gradient norm (last loss {loss}, grad norm {grad_norm}); the weights were not updated \
         by these steps and the last checkpoint is the last good state (lower the learning rate, \
         check the data, or enable z-loss / soft-capping)"
    )]
    NonFinite {
        step: u64,
        consecutive: u64,
        loss: f64,
        grad_norm: f64,
    },
    /// The model's parameters are not all finite, so the state must not be checkpointed.
    #[error("step {step}: parameter `{parameter}` holds non-finite values; refusing to checkpoint")]
    NonFiniteParameters { step: u64, parameter: String },
    /// `--resume` against a run whose saved config differs in a field that changes the math.
    #[error(
        "cannot resume {run_dir}: the saved config has {field} = {saved} but this run has {current}; \
         this changes what is trained (start a new run directory, or set it back)"
    )]
    ResumeMismatch {
        run_dir: PathBuf,
        field: String,
        saved: String,
        current: String,
    },
    #[error("cannot resume: {0}")]
    Resume(String),
    #[error("{0}")]
    Other(String),
}

impl TrainError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> TrainError {
        TrainError::Io {
            path: path.into(),
            source,
        }
    }
}
