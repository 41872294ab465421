//! `ModelError`: everything that can go wrong loading, building, running or saving a model.
//!
//! Every variant that comes from outside input names the file and the field or tensor, so a
//! user can fix the checkpoint without reading code. Numeric failures inside candle during a
//! forward pass arrive as `Tensor` (they indicate a bug or wrong shapes from the caller).

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum ModelError {
    #[error("model directory {0} does not exist or is not a directory")]
    MissingDir(PathBuf),
    #[error("{path}: file not found{hint}")]
    MissingFile { path: PathBuf, hint: String },
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: malformed JSON at {field}: {message}")]
    MalformedJson {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("{path}: field `{field}`: {message}")]
    InvalidConfig {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("{path}: field `{field}`: unsupported value {value} (supported: {supported})")]
    Unsupported {
        path: PathBuf,
        field: String,
        value: String,
        supported: String,
    },
    #[error("{path}: corrupt or truncated safetensors file: {message}")]
    CorruptSafetensors { path: PathBuf, message: String },
    #[error("{path}: tensor `{tensor}` is missing{detail}")]
    MissingTensor {
        path: PathBuf,
        tensor: String,
        detail: String,
    },
    #[error("{path}: tensor `{tensor}` has shape {found:?}, expected {expected:?}")]
    ShapeMismatch {
        path: PathBuf,
        tensor: String,
        expected: Vec<usize>,
        found: Vec<usize>,
    },
    #[error("{path}: tensor `{tensor}` has dtype {dtype}, expected a float type (F32, BF16, F16)")]
    UnsupportedDtype {
        path: PathBuf,
        tensor: String,
        dtype: String,
    },
    #[error(
        "{path}: unexpected tensor `{tensor}` (not part of the model described by config.json)"
    )]
    UnexpectedTensor { path: PathBuf, tensor: String },
    #[error(transparent)]
    Gguf(#[from] stoke_gguf::GgufError),
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    #[error("tensor operation failed: {0}")]
    Tensor(#[from] candle_core::Error),
}

impl ModelError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        ModelError::Io {
            path: path.into(),
            source,
        }
    }
}
