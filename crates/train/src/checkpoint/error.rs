//! Errors of the checkpoint store: every variant names the checkpoint directory or the file
//! inside it, so "which file is broken and how" is readable from the message alone.
//!
//! A failed verification is one `CheckpointError::Corrupt` listing every broken file as a
//! `FileProblem` (missing, truncated, longer than recorded, hash mismatch), not only the first,
//! so one `stoke checkpoint verify`-style run shows the whole damage.

use std::fmt;
use std::path::PathBuf;

/// One file of a checkpoint that does not match its manifest entry.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum FileProblem {
    /// Listed in the manifest but absent (or not a regular file).
    Missing { path: PathBuf },
    /// Shorter than the manifest says: the write was cut off.
    Truncated {
        path: PathBuf,
        expected_bytes: u64,
        found_bytes: u64,
    },
    /// Longer than the manifest says: something appended to or replaced the file.
    Oversized {
        path: PathBuf,
        expected_bytes: u64,
        found_bytes: u64,
    },
    /// Right size, wrong content (bit rot, a partial overwrite, a different file).
    HashMismatch {
        path: PathBuf,
        expected_xxh3: u64,
        found_xxh3: u64,
    },
}

impl FileProblem {
    /// The broken file's path.
    pub fn path(&self) -> &PathBuf {
        match self {
            FileProblem::Missing { path }
            | FileProblem::Truncated { path, .. }
            | FileProblem::Oversized { path, .. }
            | FileProblem::HashMismatch { path, .. } => path,
        }
    }
}

impl fmt::Display for FileProblem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            FileProblem::Missing { path } => {
                write!(f, "{}: missing (listed in the manifest)", path.display())
            }
            FileProblem::Truncated {
                path,
                expected_bytes,
                found_bytes,
            } => write!(
                f,
                "{}: truncated: {found_bytes} bytes, the manifest records {expected_bytes}",
                path.display()
            ),
            FileProblem::Oversized {
                path,
                expected_bytes,
                found_bytes,
            } => write!(
                f,
                "{}: size mismatch: {found_bytes} bytes, longer than the {expected_bytes} the manifest records",
                path.display()
            ),
            FileProblem::HashMismatch {
                path,
                expected_xxh3,
                found_xxh3,
            } => write!(
                f,
                "{}: corrupted: hash mismatch (xxh3-64 {found_xxh3:016x}, the manifest records {expected_xxh3:016x})",
                path.display()
            ),
        }
    }
}

#[derive(Debug, thiserror::Error)]
pub enum CheckpointError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{0}: not a checkpoint directory (it does not exist or is not a directory)")]
    NotADirectory(PathBuf),
    #[error(
        "{checkpoint}: manifest.json is missing, so the checkpoint cannot be verified (it was not \
         completely written, or the manifest was deleted); refusing to load it"
    )]
    ManifestMissing { checkpoint: PathBuf },
    #[error("{path}: malformed manifest at `{field}`: {message}")]
    ManifestMalformed {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error("{path}: the manifest does not list `{file}`, which every checkpoint must contain")]
    ManifestIncomplete { path: PathBuf, file: String },
    #[error(
        "{checkpoint}: checkpoint failed verification: {}",
        join_problems(problems)
    )]
    Corrupt {
        checkpoint: PathBuf,
        problems: Vec<FileProblem>,
    },
    #[error("{path}: malformed trainer state at `{field}`: {message}")]
    StateMalformed {
        path: PathBuf,
        field: String,
        message: String,
    },
    #[error(
        "{path}: trainer state says step {state_step} but the manifest says step {manifest_step}"
    )]
    StepMismatch {
        path: PathBuf,
        state_step: u64,
        manifest_step: u64,
    },
    #[error(
        "{dir} already holds checkpoints of a run; pass --resume to continue it, or choose \
         another output_dir"
    )]
    FreshStartIntoCheckpoints { dir: PathBuf },
    #[error("checkpoint model: {0}")]
    Model(#[from] stoke_model::ModelError),
    #[error("checkpoint optimizer state: {0}")]
    Optimizer(#[from] stoke_optim::OptimError),
}

impl CheckpointError {
    pub(crate) fn io(path: impl Into<PathBuf>, source: std::io::Error) -> Self {
        CheckpointError::Io {
            path: path.into(),
            source,
        }
    }
}

fn join_problems(problems: &[FileProblem]) -> String {
    problems
        .iter()
        .map(ToString::to_string)
        .collect::<Vec<_>>()
        .join("; ")
}
