//! stoke-sandbox: runs untrusted code (model completions in RL with verifiable rewards) on the
//! local machine, in a jail built from every isolation layer the kernel allows.
//!
//! ```no_run
//! use stoke_sandbox::{Program, Sandbox, SandboxConfig};
//! let sandbox = Sandbox::new(SandboxConfig::default())?;
//! let result = sandbox.run_blocking(Program::python("print(6 * 7)"));
//! assert!(result.status.success());
//! assert_eq!(result.stdout, b"42\n");
//! # Ok::<(), stoke_sandbox::SandboxError>(())
//! ```
//!
//! What a run gets (see [`Layer`] and `stoke sandbox probe`): a fresh work dir removed afterwards,
//! a cleared environment, its own session, a parent-death signal, rlimits (CPU, address space,
//! file size, open files, processes, no core dumps), a wall-clock limit and capped output; where
//! available a PID namespace (nothing it starts outlives it), a network namespace (no network),
//! a private mount namespace with a fresh `/proc` and the work dir on a size-limited tmpfs, a
//! per-run uid (as root) or a user namespace (otherwise), no-new-privileges, Landlock (read-only
//! system dirs, read-write work dir only) and a seccomp deny-list. On request
//! ([`Program::collect_files`]) the work dir's regular files come back, bounded, in
//! [`ExecResult::files`]. [`Sandbox::new`] probes once and refuses to run below
//! [`SandboxConfig::min_isolation`]; every [`ExecResult`] carries the layers applied.
//!
//! What it is not: a VM. Kernel bugs reachable through allowed system calls are not covered, and
//! memory is limited per process (`RLIMIT_AS`) rather than per run.
//!
//! Linux only. The caller's async runtime is never blocked: runs execute on the crate's own
//! two-thread tokio runtime, `workers` at a time. Each run starts from a fresh `exec` of the
//! caller's binary (`helper.rs`), so its cost does not grow with the caller's memory. See
//! `README.md` for the layer table, the adversarial results and the benchmark.

mod cgroup;
mod collected_files;
mod config;
mod error;
mod filesystem_rules;
mod helper;
mod isolation;
mod jail;
mod language;
mod probe;
mod result;
mod run_user;
mod sandbox;
mod seccomp;
mod spec;
mod work_dir;

pub use collected_files::{
    CollectedFiles, FileCollection, Incomplete, MAX_COLLECTION_DEPTH, MAX_COLLECTION_ENTRIES,
    SkippedEntry,
};
pub use config::{SandboxConfig, SandboxConfigFile};
pub use error::SandboxError;
pub use isolation::{IsolationLevel, IsolationReport, Layer, LayerReport};
pub use language::{Language, Program, Toolchains};
pub use probe::probe;
pub use result::{ExecResult, ExitStatusKind};
pub use sandbox::Sandbox;
