//! [`Sandbox`]: a pool of jailed runs. Built once from a [`SandboxConfig`] (checks the probed
//! layers against `min_isolation`), then shared (`Clone`, `Send`, `Sync`) by any number of
//! callers; at most `workers` programs run at once, the rest wait on a semaphore.
//!
//! Every run executes on the crate's own small tokio runtime, so a slow or hanging program, or
//! the `fork` of a large caller process, never stalls the caller's runtime; `run` can be awaited
//! from any runtime and `run_blocking` called from any thread.
//!
//! A run: acquire a worker, create the work dir, build the per-run Landlock ruleset, spawn the
//! jail (see `jail.rs`), feed stdin, read stdout and stderr concurrently up to the cap, wait for
//! exit or the wall-clock limit or the output cap, kill everything on the last two, collect the
//! supervisor's record, read the work dir's files back when the program asked
//! (`collected_files.rs`), remove the work dir.
//!
//! Not here: what the layers do (`jail.rs`), deciding availability (`probe.rs`), choosing the
//! layers a config gets on this machine (`spec.rs`).

use std::ffi::{CString, OsString};
use std::os::fd::{AsRawFd, OwnedFd};
use std::path::Path;
use std::process::Stdio;
use std::sync::{Arc, Mutex, OnceLock, PoisonError};
use std::time::{Duration, Instant};

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Child;
use tokio::runtime::Runtime;
use tokio::sync::{Notify, Semaphore};

use crate::cgroup::{CgroupParents, RunCgroups};
use crate::collected_files::{self, CollectedFiles, Incomplete};
use crate::config::SandboxConfig;
use crate::error::SandboxError;
use crate::filesystem_rules;
use crate::helper::{self, HelperRequest};
use crate::isolation::IsolationReport;
use crate::jail::{self, JailSpec, PreparedJail, UserMode};
use crate::language::{Program, Toolchains};
use crate::probe::probe_outcome;
use crate::result::{ExecResult, ExitStatusKind};
use crate::run_user::RunUser;
use crate::spec::spec_for;
use crate::work_dir::{LayoutEntry, WorkDir, layout};

/// How long the supervisor gets to kill the run after a stop request before it is killed itself.
const STOP_GRACE: Duration = Duration::from_secs(2);
/// How long output readers get after the run ended (the pipes close when its last process dies).
const OUTPUT_GRACE: Duration = Duration::from_millis(500);

/// A pool of jailed runs with one configuration. Cheap to clone (shared state).
#[derive(Clone)]
pub struct Sandbox {
    inner: Arc<SandboxInner>,
}

impl std::fmt::Debug for Sandbox {
    fn fmt(&self, formatter: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        formatter
            .debug_struct("Sandbox")
            .field("config", &self.inner.config)
            .field("level", &self.inner.isolation.level)
            .finish()
    }
}

struct SandboxInner {
    config: SandboxConfig,
    spec: JailSpec,
    isolation: IsolationReport,
    toolchains: Toolchains,
    workers: Arc<Semaphore>,
    /// Start runs through the helper process (see `helper.rs`) rather than forking the caller.
    via_helper: bool,
    /// Where per-run memory cgroups are made, when the spec asks for them.
    cgroup_parents: CgroupParents,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static RUNTIME_INIT: Mutex<()> = Mutex::new(());

fn runtime() -> Result<&'static Runtime, SandboxError> {
    if let Some(runtime) = RUNTIME.get() {
        return Ok(runtime);
    }
    let _guard = RUNTIME_INIT.lock().unwrap_or_else(PoisonError::into_inner);
    if RUNTIME.get().is_none() {
        let built = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("stoke-sandbox")
            .enable_all()
            .build()
            .map_err(|error| SandboxError::Setup(format!("sandbox runtime: {error}")))?;
        // Cannot fail: set only here, under the lock.
        let _ = RUNTIME.set(built);
    }
    RUNTIME
        .get()
        .ok_or_else(|| SandboxError::Setup("sandbox runtime missing".to_string()))
}

impl Sandbox {
    /// Validates `config`, probes the machine (once per process) and refuses when it cannot give
    /// `config.min_isolation`.
    pub fn new(config: SandboxConfig) -> Result<Sandbox, SandboxError> {
        config.validate()?;
        runtime()?;
        let outcome = probe_outcome();
        let (spec, isolation) = spec_for(outcome, &config).map_err(SandboxError::Setup)?;
        if isolation.level < config.min_isolation {
            let missing = isolation
                .layers
                .iter()
                .filter(|entry| !entry.applied)
                .map(|entry| entry.layer.name())
                .collect();
            return Err(SandboxError::insufficient(
                config.min_isolation,
                isolation.level,
                missing,
            ));
        }
        let workers = Arc::new(Semaphore::new(config.workers));
        let via_helper = config.spawn_via_helper && crate::probe::helper_check().is_ok();
        let cgroup_parents =
            CgroupParents::discover(spec.cgroup_limits()).map_err(SandboxError::Setup)?;
        Ok(Sandbox {
            inner: Arc::new(SandboxInner {
                config,
                spec,
                isolation,
                toolchains: Toolchains::discover(),
                workers,
                via_helper,
                cgroup_parents,
            }),
        })
    }

    /// Whether runs start from the helper process (a fresh `exec` of this binary, cost
    /// independent of the caller's memory) rather than from a fork of the caller. False when
    /// `spawn_via_helper` is off or the helper does not work in this binary.
    pub fn spawns_via_helper(&self) -> bool {
        self.inner.via_helper
    }

    /// The layers every run of this sandbox applies.
    pub fn isolation(&self) -> &IsolationReport {
        &self.inner.isolation
    }

    /// The configuration.
    pub fn config(&self) -> &SandboxConfig {
        &self.inner.config
    }

    /// The languages whose interpreter or compiler is on this machine.
    pub fn languages(&self) -> Vec<crate::Language> {
        self.inner.toolchains.available()
    }

    /// Runs `program` in the jail. Waits for a free worker first. Works from any async runtime.
    pub async fn run(&self, program: Program) -> ExecResult {
        let inner = Arc::clone(&self.inner);
        let runtime = match runtime() {
            Ok(runtime) => runtime,
            Err(error) => {
                return ExecResult::sandbox_error(error.to_string(), self.inner.isolation.clone());
            }
        };
        match runtime
            .spawn(async move { inner.execute(program).await })
            .await
        {
            Ok(result) => result,
            Err(error) => ExecResult::sandbox_error(
                format!("sandbox task failed: {error}"),
                self.inner.isolation.clone(),
            ),
        }
    }

    /// Runs `program` and blocks the calling thread until it ends. For synchronous callers; in
    /// async code use [`Sandbox::run`].
    pub fn run_blocking(&self, program: Program) -> ExecResult {
        let (sender, receiver) = std::sync::mpsc::channel();
        let inner = Arc::clone(&self.inner);
        match runtime() {
            Ok(runtime) => {
                runtime.spawn(async move {
                    let _ = sender.send(inner.execute(program).await);
                });
            }
            Err(error) => {
                return ExecResult::sandbox_error(error.to_string(), self.inner.isolation.clone());
            }
        }
        receiver.recv().unwrap_or_else(|_| {
            ExecResult::sandbox_error(
                "sandbox task ended without a result".to_string(),
                self.inner.isolation.clone(),
            )
        })
    }
}

/// Output kept from one stream.
#[derive(Debug, Default)]
struct Captured {
    bytes: Vec<u8>,
    truncated: bool,
}

/// Reads after which [`capture`] paces itself.
const UNPACED_READS: usize = 32;
/// The pause between reads past [`UNPACED_READS`].
const READ_PACE: Duration = Duration::from_millis(2);

/// Reads `pipe` into `sink` until EOF or until more than `cap` bytes arrived (then signals
/// `over_cap` and stops reading, closing the pipe).
///
/// Past the first [`UNPACED_READS`] reads the pipe leaves the runtime's reactor (`into_fd`) and
/// is read without waiting, every [`READ_PACE`]: a program writing one byte at a time would
/// otherwise wake the caller's runtime for every byte (an edge-triggered readiness event per
/// write) and spend the caller's CPU, outside the run's CPU cgroup (measured: 57% of such a
/// run's CPU). Ordinary output finishes within the first reads and is never paced.
async fn capture<P: AsyncRead + Unpin>(
    mut pipe: P,
    into_fd: fn(P) -> std::io::Result<OwnedFd>,
    cap: usize,
    sink: Arc<Mutex<Captured>>,
    over_cap: Arc<Notify>,
) {
    let mut chunk = vec![0u8; 64 * 1024];
    for _ in 0..UNPACED_READS {
        match pipe.read(&mut chunk).await {
            Ok(0) | Err(_) => return,
            Ok(read) => {
                if !store(&sink, &chunk[..read], cap, &over_cap) {
                    return;
                }
            }
        }
    }
    let Ok(fd) = into_fd(pipe) else {
        return;
    };
    // Leaving the reactor made the descriptor blocking again; an empty pipe must answer
    // WouldBlock instead of blocking a runtime thread.
    if jail::set_nonblocking(&fd).is_err() {
        return;
    }
    let mut pipe = std::fs::File::from(fd);
    loop {
        tokio::time::sleep(READ_PACE).await;
        loop {
            match std::io::Read::read(&mut pipe, &mut chunk) {
                Ok(0) => return,
                Ok(read) => {
                    if !store(&sink, &chunk[..read], cap, &over_cap) {
                        return;
                    }
                }
                Err(error) if error.kind() == std::io::ErrorKind::Interrupted => {}
                Err(error) if error.kind() == std::io::ErrorKind::WouldBlock => break,
                Err(_) => return,
            }
        }
    }
}

/// Appends `bytes` to `sink` up to `cap`; false (and `over_cap` signalled) once past it.
fn store(sink: &Arc<Mutex<Captured>>, bytes: &[u8], cap: usize, over_cap: &Notify) -> bool {
    let mut captured = sink.lock().unwrap_or_else(PoisonError::into_inner);
    let room = cap.saturating_sub(captured.bytes.len());
    if bytes.len() > room {
        captured.bytes.extend_from_slice(&bytes[..room]);
        captured.truncated = true;
        over_cap.notify_one();
        return false;
    }
    captured.bytes.extend_from_slice(bytes);
    true
}

fn take(sink: &Arc<Mutex<Captured>>) -> Captured {
    std::mem::take(&mut *sink.lock().unwrap_or_else(PoisonError::into_inner))
}

/// Everything needed to start one jailed run, by either path.
struct Launch<'a> {
    spec: &'a JailSpec,
    owner: Option<(u32, u32)>,
    work_dir: &'a Path,
    layout: Vec<LayoutEntry>,
    executable: &'a Path,
    argv: Vec<OsString>,
    env: Vec<(String, OsString)>,
    status_writer: OwnedFd,
    cgroup_procs: Vec<CString>,
}

impl Launch<'_> {
    fn tokio_command(command: std::process::Command) -> tokio::process::Command {
        let mut command = tokio::process::Command::from(command);
        command.kill_on_drop(true);
        command
    }

    /// Forks the caller and builds the jail in the child (`pre_exec`). Returns the child and
    /// the bytes for its stdin.
    fn spawn_forked(self, stdin: Vec<u8>) -> Result<(Child, Vec<u8>), String> {
        let ruleset = match self.spec.landlock_abi {
            Some(abi) => Some(filesystem_rules::build_ruleset(
                abi,
                self.work_dir,
                self.spec.allow_network,
            )?),
            None => None,
        };
        let mut prepared = PreparedJail::new(
            self.spec,
            self.owner,
            ruleset,
            self.work_dir,
            self.layout,
            self.status_writer,
            std::process::id(),
        )
        .map_err(|io_error| format!("preparing the jail: {io_error}"))?;
        prepared.join_cgroups(self.cgroup_procs);
        let mut command = std::process::Command::new(self.executable);
        command
            .args(&self.argv)
            .env_clear()
            .envs(self.env.iter().map(|(key, value)| (key, value)))
            .current_dir(self.work_dir)
            .stdin(if stdin.is_empty() {
                Stdio::null()
            } else {
                Stdio::piped()
            })
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        prepared.install(&mut command);
        let mut command = Self::tokio_command(command);
        let spawned = command.spawn();
        // The command holds the status pipe's write end and the ruleset: close them now.
        drop(command);
        let child = spawned.map_err(|io_error| {
            format!(
                "starting {} in the jail: {io_error}",
                self.executable.display()
            )
        })?;
        Ok((child, stdin))
    }

    /// Starts a helper (a fresh exec of this binary) that builds the jail; the request goes
    /// first into its stdin, the program's stdin after it.
    fn spawn_via_helper(self, stdin: Vec<u8>) -> Result<(Child, Vec<u8>), String> {
        let request = HelperRequest::new(
            self.spec,
            self.owner,
            self.work_dir.to_path_buf(),
            self.layout,
            self.executable.to_path_buf(),
            self.argv,
            self.env,
            self.cgroup_procs,
        );
        let mut framed = request.frame()?;
        framed.extend_from_slice(&stdin);
        jail::make_inheritable(&self.status_writer)
            .map_err(|io_error| format!("status pipe: {io_error}"))?;
        let mut command = helper::helper_command(self.status_writer.as_raw_fd());
        command
            .current_dir(self.work_dir)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped());
        let spawned = Self::tokio_command(command).spawn();
        drop(self.status_writer);
        let child =
            spawned.map_err(|io_error| format!("starting the sandbox helper: {io_error}"))?;
        Ok((child, framed))
    }
}

impl SandboxInner {
    async fn execute(&self, program: Program) -> ExecResult {
        let error = |message: String| ExecResult::sandbox_error(message, self.isolation.clone());
        let Ok(_worker) = self.workers.acquire().await else {
            return error("the sandbox is shut down".to_string());
        };
        let (executable, argv) = match self.toolchains.command(
            program.language,
            &program.args,
            self.config.python_site_packages,
            program.isolated,
        ) {
            Ok(command) => command,
            Err(message) => return error(message),
        };
        let run_user = (self.spec.user == UserMode::SeparateUser)
            .then(|| RunUser::acquire(self.config.uid_base));
        let owner = run_user.as_ref().map(|user| (user.uid(), user.uid()));
        let collect_files = program.collect_files;
        let source_file = program.language.source_file();
        let layout = match layout(&program) {
            Ok(layout) => layout,
            Err(message) => return error(message),
        };
        let work_dir = match WorkDir::create(&self.config.work_root, &layout, owner) {
            Ok(work_dir) => work_dir,
            Err(message) => return error(message),
        };
        let env: Vec<(String, OsString)> = vec![
            ("PATH".into(), "/usr/bin:/bin".into()),
            ("HOME".into(), work_dir.path().into()),
            ("TMPDIR".into(), work_dir.path().into()),
            ("LANG".into(), "C.UTF-8".into()),
            ("LC_ALL".into(), "C.UTF-8".into()),
            ("PYTHONDONTWRITEBYTECODE".into(), "1".into()),
        ];
        let (status_reader, status_writer) = match jail::status_pipe() {
            Ok(pipe) => pipe,
            Err(io_error) => return error(format!("status pipe: {io_error}")),
        };
        let cgroup = match self.cgroup_parents.create(self.spec.cgroup_limits()) {
            Ok(cgroup) => cgroup,
            Err(message) => return error(message),
        };
        let cgroup_procs = match RunCgroups::procs_paths(&cgroup) {
            Ok(paths) => paths,
            Err(message) => return error(message),
        };
        let started = Instant::now();
        let launch = Launch {
            cgroup_procs,
            spec: &self.spec,
            owner,
            work_dir: work_dir.path(),
            layout,
            executable: &executable,
            argv,
            env,
            status_writer,
        };
        let spawned = if self.via_helper {
            launch.spawn_via_helper(program.stdin)
        } else {
            launch.spawn_forked(program.stdin)
        };
        let (mut child, stdin_bytes) = match spawned {
            Ok(spawned) => spawned,
            Err(message) => return error(message),
        };

        let over_cap = Arc::new(Notify::new());
        let cap = self.config.max_output_bytes;
        let stdout_sink = Arc::new(Mutex::new(Captured::default()));
        let stderr_sink = Arc::new(Mutex::new(Captured::default()));
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(tokio::spawn(capture(
                stdout,
                tokio::process::ChildStdout::into_owned_fd,
                cap,
                Arc::clone(&stdout_sink),
                Arc::clone(&over_cap),
            )));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(tokio::spawn(capture(
                stderr,
                tokio::process::ChildStderr::into_owned_fd,
                cap,
                Arc::clone(&stderr_sink),
                Arc::clone(&over_cap),
            )));
        }
        let stdin_writer = child.stdin.take().map(|mut stdin| {
            let bytes = stdin_bytes;
            // A program that never reads its stdin must not block the run: errors are ignored.
            tokio::spawn(async move {
                let _ = stdin.write_all(&bytes).await;
                let _ = stdin.shutdown().await;
            })
        });

        let stopped_by = tokio::select! {
            biased;
            _ = child.wait() => None,
            _ = tokio::time::sleep(self.config.wall_timeout) => Some(ExitStatusKind::TimedOut),
            _ = over_cap.notified() => Some(ExitStatusKind::OutputLimit),
        };
        if stopped_by.is_some() {
            if let Some(pid) = child.id() {
                jail::request_stop(pid);
            }
            if tokio::time::timeout(STOP_GRACE, child.wait())
                .await
                .is_err()
            {
                let _ = child.start_kill();
                let _ = child.wait().await;
            }
        }
        let supervisor_status = child.wait().await;
        let wall_time = started.elapsed();
        let _ = tokio::time::timeout(OUTPUT_GRACE, async {
            for reader in &mut readers {
                let _ = reader.await;
            }
        })
        .await;
        for reader in &readers {
            reader.abort();
        }
        if let Some(writer) = stdin_writer {
            writer.abort();
        }

        let (record, tmpfs_root) = jail::read_report(status_reader);
        // Every process of the run is gone (the supervisor exited), so the tree holds still.
        let files = collect_files.map(|bounds| {
            let root = match tmpfs_root {
                Some(fd) => Ok(std::fs::File::from(fd)),
                None if self.spec.work_dir_tmpfs_bytes.is_some() => {
                    Err("the jail did not hand over the work dir's tmpfs".to_string())
                }
                None => collected_files::open_root(work_dir.path())
                    .map_err(|io_error| format!("{}: {io_error}", work_dir.path().display())),
            };
            match root {
                Ok(root) => collected_files::collect(root, source_file, bounds),
                Err(message) => CollectedFiles::incomplete(Incomplete::Unreadable(message)),
            }
        });
        let status = match (stopped_by, record) {
            (Some(kind), _) => kind,
            (None, Some(record)) => {
                if let Some(code) = record.exit_code() {
                    ExitStatusKind::Exited(code)
                } else if let Some(signal) = record.signal() {
                    let cpu_limit = Duration::from_secs(self.config.cpu_seconds);
                    if signal == libc::SIGXCPU
                        || (signal == libc::SIGKILL && record.cpu_time >= cpu_limit)
                    {
                        ExitStatusKind::CpuLimit
                    } else {
                        ExitStatusKind::Signaled(signal)
                    }
                } else {
                    ExitStatusKind::SandboxError(format!(
                        "unexpected wait status {}",
                        record.wait_status
                    ))
                }
            }
            (None, None) => ExitStatusKind::SandboxError(format!(
                "the jail supervisor ended without a report ({})",
                match &supervisor_status {
                    Ok(status) => status.to_string(),
                    Err(io_error) => io_error.to_string(),
                }
            )),
        };
        let stdout = take(&stdout_sink);
        let stderr = take(&stderr_sink);
        drop(work_dir);
        drop(cgroup);
        drop(run_user);
        ExecResult {
            status,
            stdout: stdout.bytes,
            stderr: stderr.bytes,
            stdout_truncated: stdout.truncated,
            stderr_truncated: stderr.truncated,
            wall_time,
            cpu_time: record.map(|record| record.cpu_time),
            max_rss_kib: record.map(|record| record.max_rss_kib),
            isolation: self.isolation.clone(),
            files,
        }
    }
}
