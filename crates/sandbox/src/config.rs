//! Sandbox configuration in two layers: [`SandboxConfigFile`] is the serde file format (a TOML
//! table, unknown keys rejected, every field optional), [`SandboxConfig`] the validated runtime
//! struct that [`crate::Sandbox::new`] takes.
//!
//! This module holds limits and switches only; it does not know how they are enforced.
//!
//! Invariant: a `SandboxConfig` that passed [`SandboxConfig::validate`] has non-zero limits and at
//! least one worker.

use std::path::PathBuf;
use std::time::Duration;

use serde::Deserialize;

use crate::error::SandboxError;
use crate::isolation::IsolationLevel;

/// Limits and switches for every run of a [`crate::Sandbox`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SandboxConfig {
    /// CPU time per process (`RLIMIT_CPU`, seconds); exceeding it ends in
    /// [`crate::ExitStatusKind::CpuLimit`].
    pub cpu_seconds: u64,
    /// Wall-clock limit for the whole run; exceeding it kills every process of the run and ends
    /// in [`crate::ExitStatusKind::TimedOut`].
    pub wall_timeout: Duration,
    /// Address space per process (`RLIMIT_AS`, bytes).
    pub memory_bytes: u64,
    /// Largest file a process may write (`RLIMIT_FSIZE`, bytes).
    pub max_file_bytes: u64,
    /// Open file descriptors per process (`RLIMIT_NOFILE`).
    pub max_open_files: u64,
    /// CPU the whole run may use, in percent of one CPU (a CFS quota on the run's CPU cgroup,
    /// where `Layer::CpuCgroup` is applied; runs also share the CPU equally however many
    /// processes each starts). 100 = one core.
    pub max_cpu_percent: u32,
    /// Processes (threads included) under the run's uid (`RLIMIT_NPROC`). Enforced only when the
    /// program runs as a non-root uid (see `Layer::SeparateUser`).
    pub max_processes: u64,
    /// Bytes the work dir may hold (size of its private tmpfs, when `Layer::WorkDirTmpfs` is
    /// applied; otherwise only `max_file_bytes` per file bounds the disk use).
    pub max_disk_bytes: u64,
    /// Bytes kept of stdout and of stderr, each; more output stops the run with
    /// [`crate::ExitStatusKind::OutputLimit`].
    pub max_output_bytes: usize,
    /// `Sandbox::new` fails when the machine cannot give at least this level.
    pub min_isolation: IsolationLevel,
    /// Runs executing at once; more wait for a free worker.
    pub workers: usize,
    /// Allow network access (no network namespace, no socket filter). Off by default.
    pub network: bool,
    /// Keep Python's `site` module (site-packages importable). Off by default: `python3 -S`
    /// starts in about a third of the time and untrusted code gets the standard library only.
    pub python_site_packages: bool,
    /// Start each run from a fresh `exec` of this binary (the helper process) instead of a fork
    /// of the caller, whose cost grows with the caller's memory. On by default; the sandbox falls
    /// back to forking when the helper does not work in this binary.
    pub spawn_via_helper: bool,
    /// Where work dirs are created (default: the system temp dir).
    pub work_root: PathBuf,
    /// First uid of the per-run uids used when the caller is root: a run gets
    /// `uid_base + (pid mod 65536) * 4096 + slot` (a block per process, a slot per run).
    pub uid_base: u32,
}

impl Default for SandboxConfig {
    fn default() -> SandboxConfig {
        SandboxConfig {
            cpu_seconds: 10,
            wall_timeout: Duration::from_secs(10),
            memory_bytes: 1 << 30,
            max_file_bytes: 16 << 20,
            max_open_files: 64,
            max_cpu_percent: 100,
            max_processes: 32,
            max_disk_bytes: 64 << 20,
            max_output_bytes: 1 << 20,
            min_isolation: IsolationLevel::Confined,
            workers: std::thread::available_parallelism()
                .map(|n| n.get())
                .unwrap_or(1),
            network: false,
            python_site_packages: false,
            spawn_via_helper: true,
            work_root: std::env::temp_dir(),
            uid_base: 2_000_000_000,
        }
    }
}

impl SandboxConfig {
    /// Checks that every limit is usable.
    pub fn validate(&self) -> Result<(), SandboxError> {
        let positive = [
            ("cpu_seconds", self.cpu_seconds),
            ("memory_bytes", self.memory_bytes),
            ("max_file_bytes", self.max_file_bytes),
            ("max_open_files", self.max_open_files),
            ("max_processes", self.max_processes),
            ("max_cpu_percent", u64::from(self.max_cpu_percent)),
            ("max_disk_bytes", self.max_disk_bytes),
            ("max_output_bytes", self.max_output_bytes as u64),
            ("workers", self.workers as u64),
        ];
        for (field, value) in positive {
            if value == 0 {
                return Err(SandboxError::Config(format!("`{field}` must be positive")));
            }
        }
        if self.wall_timeout.is_zero() {
            return Err(SandboxError::Config(
                "`wall_timeout` must be positive".to_string(),
            ));
        }
        if self.max_open_files < 8 {
            return Err(SandboxError::Config(
                "`max_open_files` below 8 leaves no room for an interpreter".to_string(),
            ));
        }
        let uid_span = crate::run_user::SLOTS_PER_PROCESS * crate::run_user::PROCESS_BLOCKS;
        if self.uid_base == 0
            || self
                .uid_base
                .checked_add(uid_span)
                .is_none_or(|end| end >= u32::MAX - 1)
        {
            return Err(SandboxError::Config(format!(
                "`uid_base` must be non-zero and leave room for {uid_span} uids below 2^32 - 1"
            )));
        }
        Ok(())
    }
}

/// The `[sandbox]` table of a run config. Every field is optional; missing ones take the
/// [`SandboxConfig::default`] value.
#[derive(Debug, Clone, Default, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SandboxConfigFile {
    pub cpu_seconds: Option<u64>,
    pub wall_timeout_seconds: Option<f64>,
    pub memory_mib: Option<u64>,
    pub max_file_mib: Option<u64>,
    pub max_open_files: Option<u64>,
    pub max_cpu_percent: Option<u32>,
    pub max_processes: Option<u64>,
    pub max_disk_mib: Option<u64>,
    pub max_output_kib: Option<usize>,
    pub min_isolation: Option<IsolationLevel>,
    pub workers: Option<usize>,
    pub network: Option<bool>,
    pub python_site_packages: Option<bool>,
    pub work_root: Option<PathBuf>,
}

impl SandboxConfigFile {
    /// Converts the file format into a validated [`SandboxConfig`].
    pub fn into_config(self) -> Result<SandboxConfig, SandboxError> {
        let defaults = SandboxConfig::default();
        let wall_timeout = match self.wall_timeout_seconds {
            None => defaults.wall_timeout,
            Some(seconds) if seconds.is_finite() && seconds > 0.0 && seconds < 1e6 => {
                Duration::from_secs_f64(seconds)
            }
            Some(seconds) => {
                return Err(SandboxError::Config(format!(
                    "`wall_timeout_seconds` must be a positive number of seconds, got {seconds}"
                )));
            }
        };
        let mib = |value: Option<u64>, default: u64, field: &str| match value {
            None => Ok(default),
            Some(mib) => mib
                .checked_mul(1 << 20)
                .ok_or_else(|| SandboxError::Config(format!("`{field}` = {mib} MiB is too large"))),
        };
        let config = SandboxConfig {
            cpu_seconds: self.cpu_seconds.unwrap_or(defaults.cpu_seconds),
            wall_timeout,
            memory_bytes: mib(self.memory_mib, defaults.memory_bytes, "memory_mib")?,
            max_file_bytes: mib(self.max_file_mib, defaults.max_file_bytes, "max_file_mib")?,
            max_open_files: self.max_open_files.unwrap_or(defaults.max_open_files),
            max_cpu_percent: self.max_cpu_percent.unwrap_or(defaults.max_cpu_percent),
            max_processes: self.max_processes.unwrap_or(defaults.max_processes),
            max_disk_bytes: mib(self.max_disk_mib, defaults.max_disk_bytes, "max_disk_mib")?,
            max_output_bytes: match self.max_output_kib {
                None => defaults.max_output_bytes,
                Some(kib) => kib.checked_mul(1024).ok_or_else(|| {
                    SandboxError::Config(format!("`max_output_kib` = {kib} is too large"))
                })?,
            },
            min_isolation: self.min_isolation.unwrap_or(defaults.min_isolation),
            workers: self.workers.unwrap_or(defaults.workers),
            network: self.network.unwrap_or(defaults.network),
            python_site_packages: self
                .python_site_packages
                .unwrap_or(defaults.python_site_packages),
            spawn_via_helper: defaults.spawn_via_helper,
            work_root: self.work_root.unwrap_or(defaults.work_root),
            uid_base: defaults.uid_base,
        };
        config.validate()?;
        Ok(config)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_config_is_valid() {
        assert!(SandboxConfig::default().validate().is_ok());
    }

    #[test]
    fn zero_workers_is_rejected_with_the_field_name() {
        let config = SandboxConfig {
            workers: 0,
            ..SandboxConfig::default()
        };
        let message = config.validate().unwrap_err().to_string();
        assert!(message.contains("workers"), "{message}");
    }

    #[test]
    fn file_format_converts_units() {
        let file = SandboxConfigFile {
            memory_mib: Some(256),
            wall_timeout_seconds: Some(1.5),
            max_output_kib: Some(4),
            ..SandboxConfigFile::default()
        };
        let config = file.into_config().unwrap();
        assert_eq!(config.memory_bytes, 256 << 20);
        assert_eq!(config.wall_timeout, Duration::from_millis(1500));
        assert_eq!(config.max_output_bytes, 4096);
    }

    #[test]
    fn negative_timeout_is_rejected() {
        let file = SandboxConfigFile {
            wall_timeout_seconds: Some(-1.0),
            ..SandboxConfigFile::default()
        };
        assert!(file.into_config().is_err());
    }
}
