//! `OptimError`: everything that can go wrong in stoke-optim, as one enum the trainer wraps.
//!
//! What it is: typed failures of configuration checks, of an optimizer step (gradient count or
//! shape not matching the parameters) and of saving/loading optimizer state (each state-file
//! error names the file, and the tensor where one is involved).
//! What it is not: a place for panics; every input from outside ends up here instead.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum OptimError {
    /// A configuration value out of its valid range (`field` names the config key).
    #[error("invalid optimizer setting `{field}`: {reason}")]
    InvalidConfig { field: String, reason: String },

    /// A parameter the optimizer cannot own (wrong dtype, device or layout, duplicate name).
    #[error("parameter `{name}`: {reason}")]
    InvalidParam { name: String, reason: String },

    /// `step` got a different number of gradients than there are parameters.
    #[error("optimizer step got {got} gradients for {expected} parameters")]
    GradCount { expected: usize, got: usize },

    /// A gradient whose shape differs from its parameter's.
    #[error("gradient for `{name}` has shape {got:?}, the parameter has {expected:?}")]
    GradShape {
        name: String,
        expected: Vec<usize>,
        got: Vec<usize>,
    },

    /// `step` was called with a learning-rate factor that is negative or not finite.
    #[error("learning-rate factor {0} is not a finite non-negative number")]
    InvalidLrFactor(f64),

    /// Reading or writing the state file failed at the OS level.
    #[error("optimizer state {path}: {source}")]
    StateIo {
        path: PathBuf,
        source: std::io::Error,
    },

    /// The state file is not a valid state file (truncated, corrupted header, wrong metadata).
    #[error("optimizer state {path}: {reason}")]
    StateFormat { path: PathBuf, reason: String },

    /// One tensor of the state file is missing, misshapen or corrupted.
    #[error("optimizer state {path}, tensor `{tensor}`: {reason}")]
    StateTensor {
        path: PathBuf,
        tensor: String,
        reason: String,
    },

    /// A tensor operation failed (from candle).
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
}
