//! The error of reading an evaluation task: its TOML file, its documents (`docs`) and its
//! items. Its own module so that `docs` (which reads the documents) and `task` (which reads the
//! file and uses `docs`) both name it without depending on each other.
//!
//! What it is not: the built-in arithmetic task's error (`arithmetic::TaskError`).

#[derive(Debug, thiserror::Error)]
pub enum TaskError {
    #[error("task file {path}: {message}")]
    File { path: String, message: String },
    #[error("{location}: {message}")]
    Data { location: String, message: String },
    #[error("task {task}, item {location}: {message}")]
    Item {
        task: String,
        location: String,
        message: String,
    },
}
