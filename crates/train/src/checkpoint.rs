//! Training checkpoints: one directory per saved step, written atomically, verified before use,
//! rotated to a bounded number.
//!
//! Layout of `<run>/checkpoints/step-00000120/`:
//! - `model/`: the model in Hugging Face layout (`Transformer::save_with_tokenizer`), so any
//!   checkpoint is also a model folder that `stoke generate` or transformers can open;
//! - `optimizer.safetensors`: `Optimizer::save_state` (moments, step counts, config);
//! - `trainer_state.json`: `TrainerState` (step, tokens seen, data cursor, the step engine's
//!   typed state, the command's extras);
//! - `config.toml`: the resolved run config text;
//! - `manifest.json`: size and xxh3-64 of every other file, written last (see `manifest`).
//!
//! Atomicity: everything is written into `<dir>/.tmp-step-00000120-<pid>/`, every file and
//! directory is fsync'd, the manifest is written and fsync'd, and only then is the directory
//! renamed to its final name (and the parent fsync'd). A crash at any point leaves either the
//! previous set of checkpoints plus a `.tmp-*` directory, which `latest()` never considers and
//! the next `save` removes, or the complete new checkpoint. Rotation and replacement move a
//! directory to a `.tmp-*` name before deleting it, so a half-deleted checkpoint never carries
//! a `step-*` name either.
//!
//! Verification: `load_checkpoint` and `latest` check every file against the manifest before
//! anything is parsed, naming each missing, truncated or corrupted file.
//!
//! What it is not: a multi-writer store. One trainer owns a checkpoint directory; two processes
//! saving into the same directory would delete each other's temporary directories.

mod error;
mod manifest;

pub use error::{CheckpointError, FileProblem};
pub use manifest::{MANIFEST_FILE, Manifest, ManifestEntry, read_manifest};

use candle_core::Device;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use stoke_model::Transformer;
use stoke_optim::Optimizer;

pub const MODEL_DIR: &str = "model";
/// Under LoRA: the adapter in PEFT's layout, next to `model/` (which then holds the merged model).
pub const ADAPTER_DIR: &str = "adapter";
pub const OPTIMIZER_FILE: &str = "optimizer.safetensors";
pub const TRAINER_STATE_FILE: &str = "trainer_state.json";
pub const CONFIG_FILE: &str = "config.toml";
/// Files every checkpoint's manifest must list (the model may add tokenizer files).
pub const REQUIRED_FILES: [&str; 5] = [
    "model/config.json",
    "model/model.safetensors",
    OPTIMIZER_FILE,
    TRAINER_STATE_FILE,
    CONFIG_FILE,
];

const STEP_PREFIX: &str = "step-";
/// Prefix of every transient directory (being written, being replaced, being rotated away).
const TEMP_PREFIX: &str = ".tmp-";

/// The step engine's checkpointed state ([`crate::step::StepEngine::state`]): its step counters
/// and spike detector.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EngineState {
    pub steps: u64,
    pub consecutive_bad_steps: u64,
    pub skipped_steps: u64,
    pub spike: serde_json::Value,
}

/// Everything besides the model weights and optimizer moments that a resumed run needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainerState {
    /// Optimizer steps completed.
    pub step: u64,
    pub tokens_seen: u64,
    /// The BatchSource's cursor (typed by the source; opaque here).
    pub source: serde_json::Value,
    /// The shared step engine's state (non-finite streak, skipped steps, spike detector), typed
    /// and the same for every training command. Absent in checkpoints written before it was;
    /// their `extra` holds those fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineState>,
    /// The command's own state beyond the engine (MoE balancing, ...), typed by the command.
    pub extra: serde_json::Value,
}

/// A loaded, verified checkpoint. The optimizer state is left on disk: build the `Optimizer`
/// over `model.parameters()` and call `Optimizer::load_state(&optimizer_state)`.
pub struct LoadedCheckpoint {
    pub path: PathBuf,
    pub model: Transformer,
    pub state: TrainerState,
    pub config_toml: String,
    pub optimizer_state: PathBuf,
}

/// A checkpoint that `latest` passed over, and why.
#[derive(Debug)]
pub struct SkippedCheckpoint {
    pub path: PathBuf,
    pub error: CheckpointError,
}

/// The result of scanning for the newest usable checkpoint.
#[derive(Debug)]
pub struct LatestCheckpoint {
    /// The newest checkpoint that verifies, if any.
    pub path: Option<PathBuf>,
    /// Newer checkpoints that failed verification, newest first.
    pub skipped: Vec<SkippedCheckpoint>,
}

/// The checkpoints of one run: `<run>/checkpoints/step-*`.
#[derive(Clone, Debug)]
pub struct CheckpointStore {
    dir: PathBuf,
    keep_last: usize,
}

impl CheckpointStore {
    /// `dir` = `<run>/checkpoints` (created on the first save). `keep_last`: how many of the
    /// newest checkpoints rotation keeps; 0 keeps every checkpoint.
    pub fn new(dir: &Path, keep_last: usize) -> CheckpointStore {
        CheckpointStore {
            dir: dir.to_path_buf(),
            keep_last,
        }
    }

    pub fn dir(&self) -> &Path {
        &self.dir
    }

    /// The path a checkpoint of `step` has (whether or not it exists).
    pub fn step_path(&self, step: u64) -> PathBuf {
        self.dir.join(step_dir_name(step))
    }

    /// Writes `<dir>/step-<step:08>/` atomically (see the module docs), then rotates, keeping
    /// the newest `keep_last` plus every step in `keep_steps` (see `rotate`). An existing checkpoint of the
    /// same step (a run resumed from an earlier one) is replaced. Returns the checkpoint path.
    pub fn save(
        &self,
        model: &Transformer,
        tokenizer_dir: Option<&Path>,
        optimizer: &Optimizer,
        state: &TrainerState,
        config_toml: &str,
        keep_steps: &[u64],
    ) -> Result<PathBuf, CheckpointError> {
        std::fs::create_dir_all(&self.dir).map_err(|e| CheckpointError::io(&self.dir, e))?;
        self.remove_temporaries()?;
        let name = step_dir_name(state.step);
        let staging = self
            .dir
            .join(format!("{TEMP_PREFIX}{name}-{}", std::process::id()));
        let written = write_checkpoint(
            &staging,
            model,
            tokenizer_dir,
            optimizer,
            state,
            config_toml,
        );
        if let Err(error) = written {
            let _ = std::fs::remove_dir_all(&staging);
            return Err(error);
        }
        let final_path = self.dir.join(&name);
        if final_path.exists() {
            let replaced = self.dir.join(format!(
                "{TEMP_PREFIX}replaced-{name}-{}",
                std::process::id()
            ));
            rename(&final_path, &replaced)?;
            rename(&staging, &final_path)?;
            manifest::sync_dir(&self.dir)?;
            remove_tree(&replaced)?;
        } else {
            rename(&staging, &final_path)?;
            manifest::sync_dir(&self.dir)?;
        }
        self.rotate(state.step, keep_steps)?;
        Ok(final_path)
    }

    /// Every `step-*` directory, ascending by step (unverified; temporaries excluded).
    pub fn list(&self) -> Result<Vec<(u64, PathBuf)>, CheckpointError> {
        let entries = match std::fs::read_dir(&self.dir) {
            Ok(entries) => entries,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
            Err(e) => return Err(CheckpointError::io(&self.dir, e)),
        };
        let mut steps = Vec::new();
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io(&self.dir, e))?;
            let Some(step) = entry.file_name().to_str().and_then(parse_step_dir_name) else {
                continue;
            };
            if entry.path().is_dir() {
                steps.push((step, entry.path()));
            }
        }
        steps.sort();
        Ok(steps)
    }

    /// Newest checkpoint that verifies; newer ones that fail are reported in `skipped`.
    pub fn find_latest(&self) -> Result<LatestCheckpoint, CheckpointError> {
        let mut skipped = Vec::new();
        for (_, path) in self.list()?.into_iter().rev() {
            match verify(&path) {
                Ok(_) => {
                    return Ok(LatestCheckpoint {
                        path: Some(path),
                        skipped,
                    });
                }
                Err(error) => skipped.push(SkippedCheckpoint { path, error }),
            }
        }
        Ok(LatestCheckpoint {
            path: None,
            skipped,
        })
    }

    /// The one resume rule of every training command. With `resume`: the newest checkpoint
    /// that verifies (older ones are tried when the newest is corrupt, each skip a warning), or
    /// `None` when the folder holds none yet, so the run starts fresh. Without: `None`, but a
    /// folder that already holds checkpoints is refused, so a run is never silently mixed with
    /// another.
    pub fn resume_point(&self, resume: bool) -> Result<Option<PathBuf>, CheckpointError> {
        if resume {
            return self.latest();
        }
        if !self.list()?.is_empty() {
            return Err(CheckpointError::FreshStartIntoCheckpoints {
                dir: self.dir.clone(),
            });
        }
        Ok(None)
    }

    /// Newest checkpoint that verifies. Older ones are tried when the newest is corrupt; each
    /// skipped checkpoint is reported as a warning on stderr (use `find_latest` to get them as
    /// values instead).
    pub fn latest(&self) -> Result<Option<PathBuf>, CheckpointError> {
        let found = self.find_latest()?;
        for skip in &found.skipped {
            eprintln!(
                "warning: skipping checkpoint {}: {}",
                skip.path.display(),
                skip.error
            );
        }
        Ok(found.path)
    }

    /// Removes `.tmp-*` directories: checkpoints whose writer crashed, and replaced or rotated
    /// checkpoints whose removal was interrupted.
    fn remove_temporaries(&self) -> Result<(), CheckpointError> {
        let entries =
            std::fs::read_dir(&self.dir).map_err(|e| CheckpointError::io(&self.dir, e))?;
        for entry in entries {
            let entry = entry.map_err(|e| CheckpointError::io(&self.dir, e))?;
            let is_temporary = entry
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with(TEMP_PREFIX));
            if is_temporary {
                remove_tree(&entry.path())?;
            }
        }
        Ok(())
    }

    /// Keeps the newest `keep_last` checkpoints up to `just_saved` (which is one of them), every
    /// step in `keep_steps`, and every checkpoint newer than `just_saved`. Newer ones exist only
    /// when a run resumed from an older checkpoint because the newer ones failed verification;
    /// counting them would delete the good older checkpoints in favour of corrupt ones. They are
    /// replaced when the run reaches their step again.
    fn rotate(&self, just_saved: u64, keep_steps: &[u64]) -> Result<(), CheckpointError> {
        if self.keep_last == 0 {
            return Ok(());
        }
        let checkpoints = self.list()?;
        let up_to_saved = checkpoints.iter().filter(|(s, _)| *s <= just_saved).count();
        let first_kept = up_to_saved.saturating_sub(self.keep_last);
        for (index, (step, path)) in checkpoints.iter().enumerate() {
            let keep = index >= first_kept || keep_steps.contains(step);
            if !keep {
                // Renamed first so an interrupted removal leaves a temporary, not a broken step.
                let doomed = self.dir.join(format!(
                    "{TEMP_PREFIX}rotated-{}-{}",
                    step_dir_name(*step),
                    std::process::id()
                ));
                rename(path, &doomed)?;
                remove_tree(&doomed)?;
            }
        }
        manifest::sync_dir(&self.dir)
    }
}

/// Verifies a checkpoint directory against its manifest (every file's size and hash, and that
/// the required files are listed). Returns the manifest. Reads every byte of the checkpoint.
pub fn verify(path: &Path) -> Result<Manifest, CheckpointError> {
    manifest::verify_files(path, &REQUIRED_FILES)
}

/// Verifies the manifest (clear error naming the file: missing, truncated, hash mismatch),
/// then loads the trainer state, the run config text and the model.
pub fn load_checkpoint(path: &Path, device: &Device) -> Result<LoadedCheckpoint, CheckpointError> {
    let manifest = verify(path)?;
    let state = read_trainer_state(&path.join(TRAINER_STATE_FILE))?;
    if state.step != manifest.step {
        return Err(CheckpointError::StepMismatch {
            path: path.join(TRAINER_STATE_FILE),
            state_step: state.step,
            manifest_step: manifest.step,
        });
    }
    let config_path = path.join(CONFIG_FILE);
    let config_toml =
        std::fs::read_to_string(&config_path).map_err(|e| CheckpointError::io(&config_path, e))?;
    let model = Transformer::load(&path.join(MODEL_DIR), device)?;
    Ok(LoadedCheckpoint {
        path: path.to_path_buf(),
        model,
        state,
        config_toml,
        optimizer_state: path.join(OPTIMIZER_FILE),
    })
}

/// Reads `trainer_state.json`; unknown or missing fields are errors naming the field.
pub fn read_trainer_state(path: &Path) -> Result<TrainerState, CheckpointError> {
    let text = std::fs::read_to_string(path).map_err(|e| CheckpointError::io(path, e))?;
    serde_path_to_error::deserialize(&mut serde_json::Deserializer::from_str(&text)).map_err(|e| {
        CheckpointError::StateMalformed {
            path: path.to_path_buf(),
            field: e.path().to_string(),
            message: e.inner().to_string(),
        }
    })
}

/// `step-00000120` (at least eight digits, so names sort like steps up to 10^8).
pub fn step_dir_name(step: u64) -> String {
    format!("{STEP_PREFIX}{step:08}")
}

/// The step of a `step-<digits>` name; `None` for anything else (temporaries included).
pub fn parse_step_dir_name(name: &str) -> Option<u64> {
    let digits = name.strip_prefix(STEP_PREFIX)?;
    if digits.is_empty() || !digits.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    digits.parse().ok()
}

/// Fills `staging` with a complete, fsync'd checkpoint, manifest last.
fn write_checkpoint(
    staging: &Path,
    model: &Transformer,
    tokenizer_dir: Option<&Path>,
    optimizer: &Optimizer,
    state: &TrainerState,
    config_toml: &str,
) -> Result<(), CheckpointError> {
    if staging.exists() {
        remove_tree(staging)?;
    }
    std::fs::create_dir(staging).map_err(|e| CheckpointError::io(staging, e))?;
    save_model(model, &staging.join(MODEL_DIR), tokenizer_dir)?;
    optimizer.save_state(&staging.join(OPTIMIZER_FILE))?;
    let state_path = staging.join(TRAINER_STATE_FILE);
    let mut state_json = serde_json::to_string_pretty(state)
        .map_err(|e| CheckpointError::io(&state_path, std::io::Error::other(e)))?;
    state_json.push('\n');
    manifest::write_synced(&state_path, state_json.as_bytes())?;
    manifest::write_synced(&staging.join(CONFIG_FILE), config_toml.as_bytes())?;
    // Hashing reads every file back and fsyncs it; the manifest goes last.
    let manifest = Manifest::build(staging, state.step)?;
    manifest.write(staging)?;
    manifest::sync_dir_tree(staging)
}

/// Saves `model` to `dir` in Hugging Face layout; a model with LoRA adapters is saved merged
/// (so `dir` opens anywhere) and its adapter goes to `dir/../adapter` (PEFT layout).
pub fn save_model(
    model: &Transformer,
    dir: &Path,
    tokenizer_dir: Option<&Path>,
) -> Result<(), CheckpointError> {
    if model.lora_config().is_none() {
        model.save_with_tokenizer(dir, tokenizer_dir)?;
        return Ok(());
    }
    model.merged()?.save_with_tokenizer(dir, tokenizer_dir)?;
    let adapter = dir.with_file_name(ADAPTER_DIR);
    let base = tokenizer_dir.map_or(String::new(), |d| d.display().to_string());
    model.save_adapter(&adapter, &base)?;
    Ok(())
}

fn rename(from: &Path, to: &Path) -> Result<(), CheckpointError> {
    std::fs::rename(from, to).map_err(|e| {
        CheckpointError::io(
            from,
            std::io::Error::new(e.kind(), format!("rename to {}: {e}", to.display())),
        )
    })
}

fn remove_tree(path: &Path) -> Result<(), CheckpointError> {
    std::fs::remove_dir_all(path).map_err(|e| CheckpointError::io(path, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn step_names_round_trip_and_reject_temporaries() {
        assert_eq!(step_dir_name(120), "step-00000120");
        assert_eq!(parse_step_dir_name("step-00000120"), Some(120));
        assert_eq!(parse_step_dir_name("step-123456789"), Some(123_456_789));
        assert_eq!(parse_step_dir_name(".tmp-step-00000120-42"), None);
        assert_eq!(parse_step_dir_name("step-"), None);
        assert_eq!(parse_step_dir_name("step-12a"), None);
        assert_eq!(parse_step_dir_name("step-+12"), None);
    }
}
