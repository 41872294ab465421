//! `<run>/run.json`: what a run ran on, written by every training command at its start: the
//! command, stoke's version, the thread count and the CPU kernels the dispatch point chose
//! (`stoke_ops::dispatch::chosen`, with any `STOKE_*` variables that forced them).
//!
//! What it is not: the run's config (`config.toml`) or its figures (`metrics.jsonl`). A resumed
//! run rewrites it: the kernels of the machine that finished the run are the ones recorded.

use std::path::{Path, PathBuf};

use serde::Serialize;

use crate::error::TrainError;

/// The file's name in a run folder.
pub const RUN_INFO_FILE: &str = "run.json";

#[derive(Serialize)]
struct RunInfo<'a> {
    command: &'a str,
    stoke_version: &'a str,
    threads: usize,
    resumed: bool,
    kernels: serde_json::Map<String, serde_json::Value>,
}

/// Writes `<run_dir>/run.json` for `command` (`"train"`, `"dpo"`, `"grpo"`, ...).
pub fn write_run_info(run_dir: &Path, command: &str, resumed: bool) -> Result<PathBuf, TrainError> {
    let info = RunInfo {
        command,
        stoke_version: env!("CARGO_PKG_VERSION"),
        threads: rayon::current_num_threads(),
        resumed,
        kernels: stoke_ops::dispatch::chosen()
            .into_iter()
            .map(|(name, value)| (name.to_string(), serde_json::Value::String(value)))
            .collect(),
    };
    let path = run_dir.join(RUN_INFO_FILE);
    let text = serde_json::to_string_pretty(&info)
        .map_err(|e| TrainError::Other(format!("run info: {e}")))?;
    std::fs::write(&path, text + "\n").map_err(|e| TrainError::io(&path, e))?;
    Ok(path)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn run_info_names_the_command_and_the_instruction_set_chosen() {
        let dir = tempfile::tempdir().unwrap();
        let path = write_run_info(dir.path(), "dpo", false).unwrap();
        let value: serde_json::Value =
            serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
        assert_eq!(value["command"], "dpo");
        let kernels = value["kernels"].as_object().unwrap();
        assert!(!kernels.is_empty());
        let (first, _) = stoke_ops::dispatch::chosen()[0].clone();
        assert!(kernels.contains_key(first), "{kernels:?}");
    }
}
