//! `GgufError`: every way a GGUF file can be unreadable, unsupported or inconsistent. Each variant
//! names the file and the key, tensor or byte offset, so the message alone says what to fix.

use std::path::PathBuf;

#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    #[error("{path}: cannot read: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: not a GGUF file (magic {found:?}, expected \"GGUF\")")]
    NotGguf { path: PathBuf, found: String },
    #[error("{path}: GGUF version {version} is not supported (supported: 2, 3)")]
    Version { path: PathBuf, version: u32 },
    #[error("{path}: truncated or corrupt at byte {offset} while reading {what}")]
    Truncated {
        path: PathBuf,
        offset: usize,
        what: String,
    },
    #[error("{path}: {what}: {message}")]
    Malformed {
        path: PathBuf,
        what: String,
        message: String,
    },
    #[error("{path}: metadata key `{key}` is missing")]
    MissingKey { path: PathBuf, key: String },
    #[error("{path}: metadata key `{key}`: expected {expected}, found {found}")]
    KeyType {
        path: PathBuf,
        key: String,
        expected: String,
        found: String,
    },
    #[error("{path}: metadata key `{key}`: unsupported value {value} (supported: {supported})")]
    Unsupported {
        path: PathBuf,
        key: String,
        value: String,
        supported: String,
    },
    #[error(
        "{path}: tensor `{tensor}` has type {dtype}, which stoke cannot read (supported: {supported})"
    )]
    TensorType {
        path: PathBuf,
        tensor: String,
        dtype: String,
        supported: String,
    },
    #[error("{path}: tensor `{tensor}` is missing")]
    MissingTensor { path: PathBuf, tensor: String },
    #[error("{path}: tensor `{tensor}`: {message}")]
    BadTensor {
        path: PathBuf,
        tensor: String,
        message: String,
    },
}

impl GgufError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        GgufError::Io {
            path: path.into(),
            source,
        }
    }
}
