//! The helper process: each run starts from a fresh `exec` of the caller's own binary
//! (`/proc/self/exe`) instead of a `fork` of the caller, so the cost of a run does not grow with
//! the caller's memory (a trainer holding a model in RAM would otherwise copy its page tables
//! three times per run: measured 1.8 runs/s with a 2 GiB caller on the 2-core test VM).
//!
//! How: `std` starts `/proc/self/exe` with `posix_spawn` (no page-table copy) and the environment
//! variable [`HELPER_ENV`]. A constructor in `.init_array`, which runs before `main` in every
//! binary that links this crate, sees the variable, reads a [`HelperRequest`] from stdin (length-
//! prefixed JSON; the program's own stdin follows it in the same pipe), rebuilds the jail in that
//! small fresh process and enters it with the same code as the fork path (`jail.rs`); the helper
//! process itself becomes the run's supervisor, the caller's direct child.
//!
//! Not here: deciding whether the helper works (the sandbox tries it once and falls back to
//! forking the caller).
//!
//! Invariant: the helper closes every inherited descriptor above 2 except its status pipe before
//! anything else, so a descriptor leaked from a concurrent run cannot reach its program.
#![allow(unsafe_code)]

use std::ffi::{CString, OsString};
use std::io::{Read, Write};
use std::mem::ManuallyDrop;
use std::os::fd::{FromRawFd, OwnedFd, RawFd};
use std::path::PathBuf;
use std::process::Command;
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::filesystem_rules;
use crate::jail::{self, JailSpec, Limits, PreparedJail, UserMode};
use crate::seccomp::SeccompFilters;
use crate::work_dir::LayoutEntry;

/// Set (to the status pipe's descriptor number) in the helper's environment.
pub(crate) const HELPER_ENV: &str = "STOKE_SANDBOX_HELPER_STATUS_FD";
/// Arguments given to the helper. Should the constructor not run (a binary that does not link
/// this crate's constructor), they make a libtest binary run no test and a clap binary fail.
pub(crate) const HELPER_ARGS: [&str; 2] = ["__stoke_sandbox_helper__", "--exact"];
/// Exit code of a helper that could not set up the jail (its stderr says why).
pub(crate) const HELPER_FAILED: i32 = 125;

/// Everything the helper needs to rebuild the jail of one run.
#[derive(Debug, Serialize, Deserialize)]
pub(crate) struct HelperRequest {
    caller_pid: u32,
    limits: Limits,
    user: UserMode,
    pid_namespace: bool,
    network_namespace: bool,
    mount_namespace: bool,
    ipc_namespace: bool,
    no_new_privs: bool,
    landlock_abi: Option<i32>,
    seccomp: bool,
    allow_network: bool,
    work_dir_tmpfs_bytes: Option<u64>,
    run_user: Option<(u32, u32)>,
    work_dir: PathBuf,
    layout: Vec<(PathBuf, Option<Vec<u8>>)>,
    executable: PathBuf,
    argv: Vec<OsString>,
    env: Vec<(String, OsString)>,
    /// The run's cgroups' `cgroup.procs`, as bytes.
    cgroup_procs: Vec<Vec<u8>>,
    memory_cgroup_bytes: Option<u64>,
    cpu_cgroup_percent: Option<u32>,
    read_only_host: bool,
}

impl HelperRequest {
    #[allow(clippy::too_many_arguments)]
    pub(crate) fn new(
        spec: &JailSpec,
        run_user: Option<(u32, u32)>,
        work_dir: PathBuf,
        layout: Vec<LayoutEntry>,
        executable: PathBuf,
        argv: Vec<OsString>,
        env: Vec<(String, OsString)>,
        cgroup_procs: Vec<CString>,
    ) -> HelperRequest {
        HelperRequest {
            caller_pid: std::process::id(),
            limits: spec.limits,
            user: spec.user,
            pid_namespace: spec.pid_namespace,
            network_namespace: spec.network_namespace,
            mount_namespace: spec.mount_namespace,
            ipc_namespace: spec.ipc_namespace,
            no_new_privs: spec.no_new_privs,
            landlock_abi: spec.landlock_abi,
            seccomp: spec.seccomp.is_some(),
            allow_network: spec.allow_network,
            work_dir_tmpfs_bytes: spec.work_dir_tmpfs_bytes,
            run_user,
            work_dir,
            layout: layout
                .into_iter()
                .map(|entry| (entry.path, entry.contents))
                .collect(),
            executable,
            argv,
            env,
            cgroup_procs: cgroup_procs.into_iter().map(CString::into_bytes).collect(),
            memory_cgroup_bytes: spec.memory_cgroup_bytes,
            cpu_cgroup_percent: spec.cpu_cgroup_percent,
            read_only_host: spec.read_only_host,
        }
    }

    /// The bytes written to the helper's stdin before the program's stdin.
    pub(crate) fn frame(&self) -> Result<Vec<u8>, String> {
        let body = serde_json::to_vec(self).map_err(|error| format!("helper request: {error}"))?;
        let mut framed = (body.len() as u64).to_le_bytes().to_vec();
        framed.extend_from_slice(&body);
        Ok(framed)
    }
}

/// The command that starts a helper whose status pipe is `status_fd` (already inheritable).
pub(crate) fn helper_command(status_fd: RawFd) -> Command {
    // Keep the constructor linked into every binary that builds a sandbox.
    std::hint::black_box(HELPER_ENTRY);
    let mut command = Command::new("/proc/self/exe");
    command
        .args(HELPER_ARGS)
        .env_clear()
        .env(HELPER_ENV, status_fd.to_string());
    command
}

#[used]
#[unsafe(link_section = ".init_array")]
static HELPER_ENTRY: extern "C" fn() = helper_entry;

/// Runs before `main`: a no-op unless this process is a helper, which never returns to `main`.
extern "C" fn helper_entry() {
    let Some(status_fd) = std::env::var_os(HELPER_ENV) else {
        return;
    };
    let error = match status_fd.to_str().and_then(|fd| fd.parse::<RawFd>().ok()) {
        Some(status_fd) => run_helper(status_fd),
        None => format!("bad {HELPER_ENV}"),
    };
    let _ = writeln!(std::io::stderr(), "stoke sandbox helper: {error}");
    // SAFETY: _exit ends the process without running anything else.
    unsafe { libc::_exit(HELPER_FAILED) }
}

/// Reads the request and enters the jail; returns only with an error.
fn run_helper(status_fd: RawFd) -> String {
    jail::close_inherited_except(status_fd);
    // SAFETY: the caller handed us this descriptor for exactly this use; nothing else owns it.
    let status_writer = unsafe { OwnedFd::from_raw_fd(status_fd) };
    let request = match read_request() {
        Ok(request) => request,
        Err(error) => return error,
    };
    let seccomp = if request.seccomp {
        match SeccompFilters::compile(request.allow_network) {
            Ok(filters) => Some(Arc::new(filters)),
            Err(error) => return error,
        }
    } else {
        None
    };
    let spec = JailSpec {
        limits: request.limits,
        user: request.user,
        pid_namespace: request.pid_namespace,
        network_namespace: request.network_namespace,
        mount_namespace: request.mount_namespace,
        ipc_namespace: request.ipc_namespace,
        no_new_privs: request.no_new_privs,
        landlock_abi: request.landlock_abi,
        seccomp,
        allow_network: request.allow_network,
        work_dir_tmpfs_bytes: request.work_dir_tmpfs_bytes,
        memory_cgroup_bytes: request.memory_cgroup_bytes,
        cpu_cgroup_percent: request.cpu_cgroup_percent,
        read_only_host: request.read_only_host,
    };
    let ruleset = match spec.landlock_abi {
        Some(abi) => {
            match filesystem_rules::build_ruleset(abi, &request.work_dir, spec.allow_network) {
                Ok(fd) => Some(fd),
                Err(error) => return error,
            }
        }
        None => None,
    };
    let layout = request
        .layout
        .into_iter()
        .map(|(path, contents)| LayoutEntry { path, contents })
        .collect();
    let mut prepared = match PreparedJail::new(
        &spec,
        request.run_user,
        ruleset,
        &request.work_dir,
        layout,
        status_writer,
        request.caller_pid,
    ) {
        Ok(prepared) => prepared,
        Err(error) => return format!("preparing the jail: {error}"),
    };
    match request
        .cgroup_procs
        .into_iter()
        .map(CString::new)
        .collect::<Result<Vec<_>, _>>()
    {
        Ok(procs) => prepared.join_cgroups(procs),
        Err(_) => return "cgroup path holds a NUL byte".to_string(),
    }
    let mut command = Command::new(&request.executable);
    command
        .args(&request.argv)
        .env_clear()
        .envs(request.env.iter().map(|(key, value)| (key, value)));
    format!(
        "starting {} in the jail: {}",
        request.executable.display(),
        prepared.enter_and_exec(&mut command)
    )
}

/// Reads exactly one framed request from fd 0, leaving the program's stdin in the pipe.
fn read_request() -> Result<HelperRequest, String> {
    // SAFETY: fd 0 stays open (ManuallyDrop); File reads are unbuffered, so no byte of the
    // program's stdin is consumed.
    let mut stdin = ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(0) });
    let mut length = [0u8; 8];
    stdin
        .read_exact(&mut length)
        .map_err(|error| format!("reading the request length: {error}"))?;
    let length = u64::from_le_bytes(length);
    if length > 1 << 31 {
        return Err(format!("request of {length} bytes is too large"));
    }
    let mut body = vec![0u8; length as usize];
    stdin
        .read_exact(&mut body)
        .map_err(|error| format!("reading the request: {error}"))?;
    serde_json::from_slice(&body).map_err(|error| format!("parsing the request: {error}"))
}
