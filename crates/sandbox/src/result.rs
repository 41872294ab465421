//! The outcome of one run: [`ExecResult`] and its [`ExitStatusKind`].
//!
//! Invariant: the status is reported exactly as observed (an `Exited(0)` from a program that
//! called `sys.exit(0)` before its asserts is still `Exited(0)`; judging it is the verifier's job),
//! and `stdout`/`stderr` never hold more than `max_output_bytes` each; `files` is complete or
//! flagged incomplete (see [`CollectedFiles`]).

use std::time::Duration;

use serde::Serialize;

use crate::collected_files::CollectedFiles;
use crate::isolation::IsolationReport;

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
pub enum ExitStatusKind {
    /// The program exited by itself with this code.
    Exited(i32),
    /// The program was killed by this signal (from itself, or from a kernel limit other than CPU).
    Signaled(i32),
    /// The wall-clock limit passed; every process of the run was killed.
    TimedOut,
    /// The CPU-time limit (`RLIMIT_CPU`) killed the program.
    CpuLimit,
    /// stdout or stderr went over `max_output_bytes`; every process of the run was killed.
    OutputLimit,
    /// The jail could not be set up or the program could not be started; nothing untrusted ran
    /// or it ran incompletely. The message says why.
    SandboxError(String),
}

impl ExitStatusKind {
    /// `Exited(0)`.
    pub fn success(&self) -> bool {
        matches!(self, ExitStatusKind::Exited(0))
    }
}

/// Everything observed about one run.
#[derive(Debug, Clone, Serialize)]
pub struct ExecResult {
    pub status: ExitStatusKind,
    /// At most `max_output_bytes`.
    pub stdout: Vec<u8>,
    /// At most `max_output_bytes`.
    pub stderr: Vec<u8>,
    /// stdout was cut at `max_output_bytes`.
    pub stdout_truncated: bool,
    /// stderr was cut at `max_output_bytes`.
    pub stderr_truncated: bool,
    /// From start to the death of the last process of the run.
    pub wall_time: Duration,
    /// User plus system CPU time of the program and the children it waited for; `None` when the
    /// run never started.
    pub cpu_time: Option<Duration>,
    /// Peak resident set size of the largest process, in KiB, when known.
    pub max_rss_kib: Option<u64>,
    /// The layers this run was confined by.
    pub isolation: IsolationReport,
    /// The work dir's files after the run, when [`crate::Program::collect_files`] asked for
    /// them and the run started; read after every process of the run was gone.
    pub files: Option<CollectedFiles>,
}

impl ExecResult {
    /// A run that failed before or while starting.
    pub(crate) fn sandbox_error(message: String, isolation: IsolationReport) -> ExecResult {
        ExecResult {
            status: ExitStatusKind::SandboxError(message),
            stdout: Vec::new(),
            stderr: Vec::new(),
            stdout_truncated: false,
            stderr_truncated: false,
            wall_time: Duration::ZERO,
            cpu_time: None,
            max_rss_kib: None,
            isolation,
            files: None,
        }
    }

    /// stdout as text (lossy UTF-8).
    pub fn stdout_text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    /// stderr as text (lossy UTF-8).
    pub fn stderr_text(&self) -> String {
        String::from_utf8_lossy(&self.stderr).into_owned()
    }
}
