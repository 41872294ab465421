//! The run folder every training command opens (`stoke train`, `stoke dpo`, `stoke grpo`, and
//! the commands still to come), so that all of them lay out, resume and refuse alike:
//!
//! ```text
//! <output_dir>/config.toml               the resolved config (always written)
//!              run.json                  command, version, threads, kernels (crate::run_info)
//!              metrics.jsonl             the metrics log (crate::metrics::RunLog)
//!              events.out.tfevents.stoke the same records for TensorBoard
//!              checkpoints/step-*/       model, optimizer, trainer_state.json, config.toml
//! ```
//!
//! The order is the resume rule's: [`RunFolder::open`] creates the folder and asks the
//! checkpoint store for the resume point ([`CheckpointStore::resume_point`]: `--resume` takes
//! the newest complete checkpoint, and a fresh start into a folder that holds checkpoints is
//! refused). The command then loads that checkpoint and checks its saved config against the
//! current one; only then does [`RunFolder::record_start`] write `config.toml` and `run.json`,
//! so a refused start leaves another run's config as it was.
//!
//! What this is not: no checkpoint loading or saving (each command's state is its own; the store
//! does the writing), no training, no display.

use std::path::{Path, PathBuf};

use crate::checkpoint::{CONFIG_FILE, CheckpointStore};
use crate::error::TrainError;

/// The metrics log's file name in a run folder.
pub const METRICS_FILE: &str = "metrics.jsonl";
/// The checkpoints' folder in a run folder.
pub const CHECKPOINTS_DIR: &str = "checkpoints";

/// An opened run folder: its checkpoint store and where the run resumes from.
#[derive(Debug)]
pub struct RunFolder {
    dir: PathBuf,
    store: CheckpointStore,
    resume: Option<PathBuf>,
}

impl RunFolder {
    /// Creates `dir` if needed and applies the resume rule (see the module doc); `keep_last` is
    /// the number of checkpoints the store keeps.
    pub fn open(dir: &Path, keep_last: usize, resume: bool) -> Result<RunFolder, TrainError> {
        std::fs::create_dir_all(dir).map_err(|e| TrainError::io(dir, e))?;
        let store = CheckpointStore::new(&dir.join(CHECKPOINTS_DIR), keep_last);
        let resume = store.resume_point(resume)?;
        Ok(RunFolder {
            dir: dir.to_path_buf(),
            store,
            resume,
        })
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The checkpoint the run continues from (None: a fresh start, or `--resume` into a folder
    /// without checkpoints).
    pub fn resume_point(&self) -> Option<&Path> {
        self.resume.as_deref()
    }

    pub fn store(&self) -> &CheckpointStore {
        &self.store
    }

    /// The store, for the command's loop to save its checkpoints.
    pub fn into_store(self) -> CheckpointStore {
        self.store
    }

    pub fn metrics_path(&self) -> PathBuf {
        self.dir.join(METRICS_FILE)
    }

    /// Writes `config.toml` and `run.json` for `command`; call it after the resumed checkpoint
    /// was checked (see the module doc).
    pub fn record_start(&self, command: &str, config_toml: &str) -> Result<(), TrainError> {
        let config_path = self.dir.join(CONFIG_FILE);
        std::fs::write(&config_path, config_toml).map_err(|e| TrainError::io(&config_path, e))?;
        crate::run_info::write_run_info(&self.dir, command, self.resume.is_some())?;
        Ok(())
    }
}
