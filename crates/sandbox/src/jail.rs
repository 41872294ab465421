//! The jail itself: the code that runs in the forked child between `fork` and `exec` (installed as
//! a `pre_exec` hook on a `std::process::Command`), and the small supervisor process it splits
//! into. This is the only module with `unsafe` code (system calls through `libc`).
//!
//! Process tree of one run (with a PID namespace):
//!
//! ```text
//! caller ── supervisor (root or caller uid; outside the new PID namespace)
//!              └── init (PID 1 of the new PID namespace: reaps orphans, reports the program)
//!                     └── program (PID 2; own session, own uid, Landlock, seccomp)
//!                            └── whatever the program starts
//! ```
//!
//! The forked child applies `setsid`, `PR_SET_PDEATHSIG`, `unshare` of the namespaces and rlimits,
//! then forks with a raw `clone` system call: the parent half becomes the supervisor, which closes
//! every descriptor but a status pipe, waits for init with `wait4` (for CPU time), relays a stop
//! request (SIGTERM from the caller) as SIGKILL, writes a [`SupervisorRecord`] to the status pipe
//! (a Unix socket; with the work dir's tmpfs it passes a descriptor of the tmpfs root along, so
//! the caller can read back what the program left) and exits. The child half is PID 1 of the new namespace: it makes the mounts private, mounts a
//! fresh `/proc`, and forks the program. It stays a minimal init because PID 1 ignores signals it
//! has no handler for when they come from inside its namespace (a program that is PID 1 could not
//! even kill itself). When the program ends, init writes its wait status to the status pipe and
//! exits; the kernel then kills every process left in the namespace before init's `wait4` in the
//! supervisor returns, so when the supervisor exits, nothing of the run is alive. The program
//! drops to the run's uid, sets no-new-privileges, restricts itself with Landlock, installs the
//! seccomp filters, and returns to `std`, which `exec`s the interpreter.
//!
//! "The forked child" is either a fork of the caller (`install`, a `pre_exec` hook) or, by
//! default, the helper process itself (`enter_and_exec`, see `helper.rs`), a fresh and small
//! `exec` of the caller's binary whose inner forks are cheap.
//!
//! Without a PID namespace there is no init: the supervisor waits for the program directly and
//! afterwards kills its process group and, when it ran under a uid of its own, every process of
//! that uid (`kill(-1)` after switching to it).
//!
//! Cost: three forks of the caller's address space per run (std's, supervisor/init, init/program).
//! Page-table copies grow with the caller's mapped memory; a fork server would remove that cost.
//!
//! Invariants of the post-fork code (the caller may be multi-threaded): it allocates nothing,
//! takes no lock and calls only async-signal-safe system calls on data prepared before the fork
//! ([`PreparedJail`]). That is why the second fork is a raw `clone` (glibc's `fork` runs atfork
//! handlers and takes malloc's locks, which another thread of the caller may have held at the
//! first fork) and why the Landlock ruleset and seccomp programs are built in the parent.
//!
//! Not here: choosing layers (probe/sandbox), reading output, timeouts (sandbox.rs).
#![allow(unsafe_code)]

use std::ffi::{CStr, CString};
use std::io;
use std::os::fd::{AsRawFd, OwnedFd, RawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::Command;
use std::sync::Arc;
use std::time::Duration;

use crate::seccomp::SeccompFilters;
use crate::work_dir::LayoutEntry;

/// Which uid the program runs under.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) enum UserMode {
    /// The caller's own uid (no user isolation).
    Caller,
    /// As root: switch to a per-run uid and gid after the privileged setup.
    SeparateUser,
    /// Not root: a user namespace mapping the caller's uid to itself (owns the other namespaces).
    UserNamespace,
}

/// The rlimits of a run.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize, serde::Deserialize)]
pub(crate) struct Limits {
    pub(crate) cpu_seconds: u64,
    pub(crate) memory_bytes: u64,
    pub(crate) file_bytes: u64,
    pub(crate) open_files: u64,
    pub(crate) processes: u64,
}

/// The layers a sandbox applies to each run (decided once, from the probe and the config).
#[derive(Debug, Clone)]
pub(crate) struct JailSpec {
    pub(crate) limits: Limits,
    pub(crate) user: UserMode,
    pub(crate) pid_namespace: bool,
    pub(crate) network_namespace: bool,
    pub(crate) mount_namespace: bool,
    pub(crate) ipc_namespace: bool,
    pub(crate) no_new_privs: bool,
    /// The kernel's Landlock ABI version, when Landlock is applied.
    pub(crate) landlock_abi: Option<i32>,
    pub(crate) seccomp: Option<Arc<SeccompFilters>>,
    pub(crate) allow_network: bool,
    /// Size in bytes of the private tmpfs mounted over the work dir (needs the mount namespace).
    pub(crate) work_dir_tmpfs_bytes: Option<u64>,
    /// Memory limit in bytes of the run's cgroup, when one is made.
    pub(crate) memory_cgroup_bytes: Option<u64>,
    /// CPU limit of the run's CPU cgroup (percent of one CPU), when one is made.
    pub(crate) cpu_cgroup_percent: Option<u32>,
    /// Make every mount of the jail's mount namespace read-only (recursively) before the work
    /// dir's tmpfs is mounted (needs the mount namespace and the tmpfs).
    pub(crate) read_only_host: bool,
}

impl JailSpec {
    /// The limits of the run's cgroups.
    pub(crate) fn cgroup_limits(&self) -> crate::cgroup::RunLimits {
        crate::cgroup::RunLimits {
            memory_bytes: self.memory_cgroup_bytes,
            cpu_percent: self.cpu_cgroup_percent,
        }
    }
}

/// A private tmpfs over the work dir, filled by the namespace init before the program starts.
#[derive(Debug)]
struct TmpfsWorkDir {
    path: CString,
    options: CString,
    /// Relative paths, parents first; `None` contents make a directory.
    entries: Vec<(CString, Option<Vec<u8>>)>,
    /// Landlock rights for the tmpfs root (a new inode, unknown to the parent's ruleset).
    landlock_access: u64,
}

#[cfg(target_env = "gnu")]
type RlimitResource = libc::__rlimit_resource_t;
#[cfg(not(target_env = "gnu"))]
type RlimitResource = libc::c_int;

/// A user-namespace id map, written by the child to `/proc/self/{uid,gid}_map`.
#[derive(Debug)]
struct IdMaps {
    uid_map: Vec<u8>,
    gid_map: Vec<u8>,
}

/// Everything the post-fork code needs, prepared in the parent for one run.
#[derive(Debug)]
pub(crate) struct PreparedJail {
    parent_pid: libc::pid_t,
    unshare_flags: libc::c_int,
    id_maps: Option<IdMaps>,
    rlimits: Vec<(RlimitResource, libc::rlimit)>,
    switch_to: Option<(libc::uid_t, libc::gid_t)>,
    mount_namespace: bool,
    pid_namespace: bool,
    no_new_privs: bool,
    landlock_ruleset: Option<OwnedFd>,
    seccomp: Option<Arc<SeccompFilters>>,
    status_writer: OwnedFd,
    tmpfs: Option<TmpfsWorkDir>,
    read_only_host: bool,
    /// The run's cgroups' `cgroup.procs`, joined first thing.
    cgroup_procs: Vec<CString>,
}

/// Marks a valid [`SupervisorRecord`].
const RECORD_MAGIC: u32 = 0x5354_4b31;
/// Inodes of the work dir's tmpfs (files plus directories the program may create).
const TMPFS_INODES: u64 = 16_384;
/// Size of an encoded [`SupervisorRecord`].
const RECORD_BYTES: usize = 32;
/// Marks the namespace init's report of the program's own wait status.
const PROGRAM_STATUS_MAGIC: u32 = 0x5354_4b32;
/// Size of that report.
const PROGRAM_STATUS_BYTES: usize = 8;
/// Exit code of a jail child that found its parent gone before it could arm the death signal.
const EXIT_PARENT_GONE: libc::c_int = 121;

/// What the supervisor observed about the program.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct SupervisorRecord {
    /// A `wait4` status word.
    pub(crate) wait_status: i32,
    pub(crate) cpu_time: Duration,
    pub(crate) max_rss_kib: u64,
}

impl SupervisorRecord {
    fn decode(bytes: &[u8; RECORD_BYTES]) -> Option<SupervisorRecord> {
        let word = |at: usize| {
            u32::from_ne_bytes([bytes[at], bytes[at + 1], bytes[at + 2], bytes[at + 3]])
        };
        let long = |at: usize| {
            let mut raw = [0u8; 8];
            raw.copy_from_slice(&bytes[at..at + 8]);
            i64::from_ne_bytes(raw)
        };
        if word(0) != RECORD_MAGIC {
            return None;
        }
        let micros = long(8).max(0) as u64 + long(16).max(0) as u64;
        Some(SupervisorRecord {
            wait_status: word(4) as i32,
            cpu_time: Duration::from_micros(micros),
            max_rss_kib: long(24).max(0) as u64,
        })
    }

    /// The exit code, when the program exited.
    pub(crate) fn exit_code(&self) -> Option<i32> {
        libc::WIFEXITED(self.wait_status).then(|| libc::WEXITSTATUS(self.wait_status))
    }

    /// The signal, when the program was killed.
    pub(crate) fn signal(&self) -> Option<i32> {
        libc::WIFSIGNALED(self.wait_status).then(|| libc::WTERMSIG(self.wait_status))
    }
}

impl PreparedJail {
    /// Prepares one run: id maps, rlimits, the tmpfs contents; `landlock_ruleset` is the run's
    /// ruleset, `status_writer` the write end of [`status_pipe`], `parent_pid` the process that
    /// starts the jail child (whose death kills the run).
    pub(crate) fn new(
        spec: &JailSpec,
        run_user: Option<(u32, u32)>,
        landlock_ruleset: Option<OwnedFd>,
        work_dir: &Path,
        layout: Vec<LayoutEntry>,
        status_writer: OwnedFd,
        parent_pid: u32,
    ) -> io::Result<PreparedJail> {
        let c_string = |bytes: Vec<u8>| {
            CString::new(bytes).map_err(|_| io::Error::other("a path holds a NUL byte"))
        };
        let tmpfs = match spec.work_dir_tmpfs_bytes {
            None => None,
            Some(bytes) => {
                let mut entries = Vec::with_capacity(layout.len());
                for entry in layout {
                    entries.push((
                        c_string(entry.path.into_os_string().into_vec())?,
                        entry.contents,
                    ));
                }
                let landlock_access = spec
                    .landlock_abi
                    .map(crate::filesystem_rules::work_dir_access_bits)
                    .unwrap_or(0);
                Some(TmpfsWorkDir {
                    path: c_string(work_dir.as_os_str().as_bytes().to_vec())?,
                    options: c_string(
                        format!("size={bytes},nr_inodes={TMPFS_INODES},mode=0700").into_bytes(),
                    )?,
                    entries,
                    landlock_access,
                })
            }
        };
        let mut unshare_flags = 0;
        let mut id_maps = None;
        if spec.user == UserMode::UserNamespace {
            unshare_flags |= libc::CLONE_NEWUSER;
            // SAFETY: getuid/getgid cannot fail and touch no memory.
            let (uid, gid) = unsafe { (libc::getuid(), libc::getgid()) };
            id_maps = Some(IdMaps {
                uid_map: format!("{uid} {uid} 1\n").into_bytes(),
                gid_map: format!("{gid} {gid} 1\n").into_bytes(),
            });
        }
        for (wanted, flag) in [
            (spec.pid_namespace, libc::CLONE_NEWPID),
            (spec.network_namespace, libc::CLONE_NEWNET),
            (spec.mount_namespace, libc::CLONE_NEWNS),
            (spec.ipc_namespace, libc::CLONE_NEWIPC | libc::CLONE_NEWUTS),
        ] {
            if wanted {
                unshare_flags |= flag;
            }
        }
        let limits = spec.limits;
        let rlimit = |soft: u64, hard: u64| libc::rlimit {
            rlim_cur: soft as libc::rlim_t,
            rlim_max: hard as libc::rlim_t,
        };
        let rlimits = vec![
            (libc::RLIMIT_CORE, rlimit(0, 0)),
            // SIGXCPU at the soft limit, SIGKILL one second later.
            (
                libc::RLIMIT_CPU,
                rlimit(limits.cpu_seconds, limits.cpu_seconds + 1),
            ),
            (
                libc::RLIMIT_AS,
                rlimit(limits.memory_bytes, limits.memory_bytes),
            ),
            (
                libc::RLIMIT_FSIZE,
                rlimit(limits.file_bytes, limits.file_bytes),
            ),
            (
                libc::RLIMIT_NOFILE,
                rlimit(limits.open_files, limits.open_files),
            ),
            (
                libc::RLIMIT_NPROC,
                rlimit(limits.processes, limits.processes),
            ),
            (libc::RLIMIT_MEMLOCK, rlimit(0, 0)),
            (libc::RLIMIT_MSGQUEUE, rlimit(0, 0)),
            // No real-time scheduling and no raised priority, whatever the caller was granted
            // (limits.conf may give a user rtprio): a SCHED_FIFO spinner starves the machine.
            (libc::RLIMIT_RTPRIO, rlimit(0, 0)),
            (libc::RLIMIT_NICE, rlimit(0, 0)),
        ];
        let jail = PreparedJail {
            parent_pid: parent_pid as libc::pid_t,
            unshare_flags,
            id_maps,
            rlimits,
            switch_to: run_user,
            mount_namespace: spec.mount_namespace,
            pid_namespace: spec.pid_namespace,
            no_new_privs: spec.no_new_privs,
            landlock_ruleset,
            seccomp: spec.seccomp.clone(),
            status_writer,
            read_only_host: spec.read_only_host && spec.mount_namespace && tmpfs.is_some(),
            tmpfs,
            cgroup_procs: Vec::new(),
        };
        Ok(jail)
    }

    /// Makes the jail child join the cgroups whose `cgroup.procs` are `procs` (before anything
    /// else, so every process of the run is charged to them).
    pub(crate) fn join_cgroups(&mut self, procs: Vec<CString>) {
        self.cgroup_procs = procs;
    }

    /// Enters the jail in this very process and `exec`s `command` (for the helper process,
    /// which is single-threaded). Returns only on failure.
    pub(crate) fn enter_and_exec(self, command: &mut Command) -> io::Error {
        match enter_jail(&self) {
            Ok(()) => command.exec(),
            Err(error) => error,
        }
    }

    /// Installs the jail as `command`'s pre-exec hook. The command must be dropped after
    /// `spawn` (it holds the status pipe's write end).
    pub(crate) fn install(self, command: &mut Command) {
        let jail = Arc::new(self);
        // SAFETY: `enter_jail` is async-signal-safe: it only reads `jail` (prepared before the
        // fork, never mutated) and makes system calls; see the module invariants.
        unsafe {
            command.pre_exec(move || enter_jail(&jail));
        }
    }
}

/// The channel for the supervisor's record: (read end, non-blocking; write end). Both close on
/// exec. A Unix stream socket pair rather than a pipe, so that the supervisor can hand over a
/// descriptor of the work dir's tmpfs with its record (`SCM_RIGHTS`), which the caller cannot
/// reach otherwise (the tmpfs lives in the run's mount namespace).
pub(crate) fn status_pipe() -> io::Result<(OwnedFd, OwnedFd)> {
    let (reader, writer) = std::os::unix::net::UnixStream::pair()?;
    let reader: OwnedFd = reader.into();
    set_nonblocking(&reader)?;
    Ok((reader, writer.into()))
}

/// Lets `fd` survive `exec` (for handing the status pipe to the helper process).
pub(crate) fn make_inheritable(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl F_SETFD on a descriptor we own.
    let rc = unsafe { libc::fcntl(fd.as_raw_fd(), libc::F_SETFD, 0) };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Closes every descriptor above 2 except `keep` (the helper's first step, so that no descriptor
/// another run leaked into it reaches its program).
pub(crate) fn close_inherited_except(keep: RawFd) {
    let keep = keep as libc::c_uint;
    // SAFETY: close_range takes plain integers; the helper owns no other descriptors yet.
    unsafe {
        if keep > 3 {
            libc::syscall(libc::SYS_close_range, 3u32, keep - 1, 0u32);
        }
        libc::syscall(libc::SYS_close_range, keep.max(2) + 1, u32::MAX, 0u32);
    }
}

pub(crate) fn set_nonblocking(fd: &OwnedFd) -> io::Result<()> {
    // SAFETY: fcntl on a descriptor we own; F_GETFL/F_SETFL touch no memory.
    let rc = unsafe {
        let flags = libc::fcntl(fd.as_raw_fd(), libc::F_GETFL);
        if flags < 0 {
            flags
        } else {
            libc::fcntl(fd.as_raw_fd(), libc::F_SETFL, flags | libc::O_NONBLOCK)
        }
    };
    if rc < 0 {
        return Err(io::Error::last_os_error());
    }
    Ok(())
}

/// Reads the supervisor's record after it exited (`None` when it died before writing one).
pub(crate) fn read_record(status_reader: OwnedFd) -> Option<SupervisorRecord> {
    read_report(status_reader).0
}

/// Reads the supervisor's record after it exited (`None` when it died before writing one) and
/// the descriptor of the work dir's tmpfs root it handed over (`None` without a tmpfs).
///
/// With a PID namespace the channel holds first the namespace init's report of the program's
/// wait status, then the supervisor's record (whose own wait status is the init's); the
/// program's status wins.
pub(crate) fn read_report(status_reader: OwnedFd) -> (Option<SupervisorRecord>, Option<OwnedFd>) {
    let mut bytes = Vec::with_capacity(PROGRAM_STATUS_BYTES + RECORD_BYTES);
    let mut chunk = [0u8; PROGRAM_STATUS_BYTES + RECORD_BYTES];
    let mut work_dir = None;
    loop {
        match receive(&status_reader, &mut chunk) {
            Ok((0, _)) => break,
            Ok((read, fd)) => {
                bytes.extend_from_slice(&chunk[..read]);
                if fd.is_some() {
                    work_dir = fd;
                }
            }
            Err(error) if error.kind() == io::ErrorKind::Interrupted => continue,
            Err(_) => break,
        }
    }
    (decode_report(&bytes), work_dir)
}

/// One `recvmsg` on the non-blocking status channel: bytes read, and a descriptor that came
/// with them.
fn receive(socket: &OwnedFd, buffer: &mut [u8]) -> io::Result<(usize, Option<OwnedFd>)> {
    use std::os::fd::FromRawFd;
    // Room for one control message carrying one descriptor, aligned for `cmsghdr`.
    let mut control = [0u64; 8];
    let mut vector = libc::iovec {
        iov_base: buffer.as_mut_ptr().cast(),
        iov_len: buffer.len(),
    };
    // SAFETY: msghdr is plain data; every pointer set below outlives the recvmsg call, and the
    // control buffer's length is its size in bytes.
    let mut header: libc::msghdr = unsafe { std::mem::zeroed() };
    header.msg_iov = &mut vector;
    header.msg_iovlen = 1;
    header.msg_control = control.as_mut_ptr().cast();
    header.msg_controllen = std::mem::size_of_val(&control) as _;
    // SAFETY: recvmsg writes at most iov_len bytes into `buffer` and msg_controllen into
    // `control`; MSG_CMSG_CLOEXEC keeps a received descriptor from leaking into later children.
    let read = unsafe { libc::recvmsg(socket.as_raw_fd(), &mut header, libc::MSG_CMSG_CLOEXEC) };
    if read < 0 {
        return Err(io::Error::last_os_error());
    }
    let mut received = None;
    // SAFETY: the CMSG_* macros walk the control buffer recvmsg filled, within msg_controllen;
    // an SCM_RIGHTS message's data holds descriptors now owned by this process.
    unsafe {
        let mut message = libc::CMSG_FIRSTHDR(&header);
        while !message.is_null() {
            if (*message).cmsg_level == libc::SOL_SOCKET && (*message).cmsg_type == libc::SCM_RIGHTS
            {
                let data = libc::CMSG_DATA(message).cast::<libc::c_int>();
                let count = ((*message).cmsg_len as usize - libc::CMSG_LEN(0) as usize)
                    / std::mem::size_of::<libc::c_int>();
                for index in 0..count {
                    let fd = OwnedFd::from_raw_fd(data.add(index).read_unaligned());
                    // Keep the first; the others close on drop.
                    if received.is_none() {
                        received = Some(fd);
                    }
                }
            }
            message = libc::CMSG_NXTHDR(&header, message);
        }
    }
    Ok((read as usize, received))
}

fn decode_report(bytes: &[u8]) -> Option<SupervisorRecord> {
    let mut program_status = None;
    let mut rest = bytes;
    if rest.len() >= PROGRAM_STATUS_BYTES && rest[0..4] == PROGRAM_STATUS_MAGIC.to_ne_bytes() {
        program_status = Some(i32::from_ne_bytes([rest[4], rest[5], rest[6], rest[7]]));
        rest = &rest[PROGRAM_STATUS_BYTES..];
    }
    let record_bytes: &[u8; RECORD_BYTES] = rest.get(..RECORD_BYTES)?.try_into().ok()?;
    let mut record = SupervisorRecord::decode(record_bytes)?;
    if let Some(wait_status) = program_status {
        record.wait_status = wait_status;
    }
    Some(record)
}

/// Asks the supervisor `pid` to kill the program and everything it started. The caller must
/// not have reaped `pid` yet (so the pid cannot have been reused).
pub(crate) fn request_stop(pid: u32) {
    // SAFETY: kill has no memory effects; the pid is our unreaped child.
    unsafe {
        libc::kill(pid as libc::pid_t, libc::SIGTERM);
    }
}

/// Whether this process runs as root.
pub(crate) fn caller_is_root() -> bool {
    // SAFETY: geteuid cannot fail and touches no memory.
    unsafe { libc::geteuid() == 0 }
}

/// The kernel's Landlock ABI version, or `None` when Landlock is off or unknown.
pub(crate) fn landlock_abi_version() -> Option<i32> {
    const LANDLOCK_CREATE_RULESET_VERSION: libc::c_uint = 1;
    // SAFETY: with a null attribute pointer, size 0 and the VERSION flag the call only returns
    // a number.
    let version = unsafe {
        libc::syscall(
            libc::SYS_landlock_create_ruleset,
            std::ptr::null::<libc::c_void>(),
            0usize,
            LANDLOCK_CREATE_RULESET_VERSION,
        )
    };
    (version > 0).then_some(version as i32)
}

fn check(rc: libc::c_long) -> io::Result<()> {
    if rc < 0 {
        Err(io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Writes `bytes` to the procfs file `path` (user-namespace maps). Async-signal-safe.
fn write_proc_file(path: &CStr, bytes: &[u8]) -> io::Result<()> {
    // SAFETY: `path` is NUL-terminated; `bytes` outlives the write; the fd is closed on all paths.
    unsafe {
        let fd = libc::open(path.as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC);
        if fd < 0 {
            return Err(io::Error::last_os_error());
        }
        let written = libc::write(fd, bytes.as_ptr().cast(), bytes.len());
        let error = io::Error::last_os_error();
        libc::close(fd);
        if written != bytes.len() as isize {
            return Err(error);
        }
    }
    Ok(())
}

/// The pre-exec hook: runs in the forked child. Async-signal-safe (see the module doc).
fn enter_jail(jail: &PreparedJail) -> io::Result<()> {
    // SAFETY: (whole function) every call is a system call on values prepared before the fork
    // or on the stack; nothing allocates, locks, or unwinds across the fork.
    unsafe {
        for procs in &jail.cgroup_procs {
            write_proc_file(procs, b"0")?;
        }
        check(libc::setsid().into())?;
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0).into())?;
        if libc::getppid() != jail.parent_pid {
            // The caller died before the death signal was armed.
            libc::_exit(EXIT_PARENT_GONE);
        }
        if jail.unshare_flags != 0 {
            check(libc::unshare(jail.unshare_flags).into())?;
        }
        if let Some(maps) = &jail.id_maps {
            write_proc_file(c"/proc/self/setgroups", b"deny")?;
            write_proc_file(c"/proc/self/uid_map", &maps.uid_map)?;
            write_proc_file(c"/proc/self/gid_map", &maps.gid_map)?;
        }

        // Split into supervisor and program. Block the signals the supervisor waits for first,
        // so that none is lost between clone and sigwaitinfo.
        let mut waited: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut waited);
        libc::sigaddset(&mut waited, libc::SIGCHLD);
        libc::sigaddset(&mut waited, libc::SIGTERM);
        libc::signal(libc::SIGCHLD, libc::SIG_DFL);
        check(libc::sigprocmask(libc::SIG_BLOCK, &waited, std::ptr::null_mut()).into())?;
        let pid = fork_raw();
        if pid < 0 {
            return Err(io::Error::last_os_error());
        }
        if pid > 0 {
            supervise(pid as libc::pid_t, jail, &waited);
        }

        // The program half.
        let mut empty: libc::sigset_t = std::mem::zeroed();
        libc::sigemptyset(&mut empty);
        check(libc::sigprocmask(libc::SIG_SETMASK, &empty, std::ptr::null_mut()).into())?;
        check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0).into())?;
        // Its own session: the program's kill(0, ...) cannot reach the supervisor.
        check(libc::setsid().into())?;
        if jail.mount_namespace {
            check(
                libc::mount(
                    std::ptr::null(),
                    c"/".as_ptr(),
                    std::ptr::null(),
                    libc::MS_REC | libc::MS_PRIVATE,
                    std::ptr::null(),
                )
                .into(),
            )?;
            if jail.read_only_host {
                make_mounts_read_only()?;
            }
            if jail.pid_namespace {
                check(
                    libc::mount(
                        c"proc".as_ptr(),
                        c"/proc".as_ptr(),
                        c"proc".as_ptr(),
                        libc::MS_NOSUID | libc::MS_NODEV | libc::MS_NOEXEC,
                        std::ptr::null(),
                    )
                    .into(),
                )?;
            }
            if let Some(tmpfs) = &jail.tmpfs {
                fill_tmpfs_work_dir(tmpfs, jail)?;
            }
        }
        if jail.pid_namespace {
            // This process is PID 1 of the new namespace. PID 1 ignores every signal it has no
            // handler for when sent from inside the namespace (so `os.kill(os.getpid(), 9)` would
            // not kill it), so it stays a minimal init and the program becomes PID 2.
            let program = fork_raw();
            if program < 0 {
                return Err(io::Error::last_os_error());
            }
            if program > 0 {
                namespace_init(program as libc::pid_t, jail);
            }
            check(libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL, 0, 0, 0).into())?;
            check(libc::setsid().into())?;
        }
        // Limits apply to the program only (init must be able to write the work dir), and come
        // after unshare: in a user namespace, RLIMIT_NPROC set before it would also cap the
        // namespace as a whole at the caller's current process count.
        for (resource, limit) in &jail.rlimits {
            check(libc::setrlimit(*resource, limit).into())?;
        }
        if let Some((uid, gid)) = jail.switch_to {
            check(libc::setgroups(0, std::ptr::null()).into())?;
            check(libc::setresgid(gid, gid, gid).into())?;
            check(libc::setresuid(uid, uid, uid).into())?;
        }
        if jail.no_new_privs {
            check(libc::prctl(libc::PR_SET_NO_NEW_PRIVS, 1, 0, 0, 0).into())?;
        }
        if let Some(ruleset) = &jail.landlock_ruleset {
            check(libc::syscall(
                libc::SYS_landlock_restrict_self,
                ruleset.as_raw_fd(),
                0u32,
            ))?;
        }
        // No descriptor above 2 reaches the program: the ruleset, the status pipe, anything the
        // caller opened without CLOEXEC. (CLOSE_RANGE_CLOEXEC instead of closing keeps std's
        // exec-error pipe working; kernels before 5.11 lack the flag and keep inherited fds.)
        const CLOSE_RANGE_CLOEXEC: libc::c_uint = 1 << 2;
        libc::syscall(libc::SYS_close_range, 3u32, u32::MAX, CLOSE_RANGE_CLOEXEC);
        if let Some(filters) = &jail.seccomp {
            for program in &filters.programs {
                // seccompiler::apply_filter builds the sock_fprog on the stack: no allocation.
                seccompiler::apply_filter(program).map_err(|_| io::Error::last_os_error())?;
            }
        }
    }
    Ok(())
}

/// `struct mount_attr` of the kernel ABI (`mount_setattr(2)`).
#[repr(C)]
struct MountAttr {
    attr_set: u64,
    attr_clr: u64,
    propagation: u64,
    userns_fd: u64,
}
const MOUNT_ATTR_RDONLY: u64 = 0x1;
const MOUNT_ATTR_NOSUID: u64 = 0x2;
const AT_RECURSIVE: libc::c_int = 0x8000;

/// Makes every mount of this (private) mount namespace read-only and nosuid, recursively from
/// `/` (`mount_setattr`, Linux 5.12): writes of any kind outside the mounts made afterwards (the
/// fresh `/proc`, the work dir's tmpfs) fail with `EROFS`, metadata included (`chmod`, `chown`,
/// `utime`, `setxattr`), which Landlock does not govern. Device nodes stay writable
/// (`/dev/null`). Async-signal-safe.
fn make_mounts_read_only() -> io::Result<()> {
    let attr = MountAttr {
        attr_set: MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID,
        attr_clr: 0,
        propagation: 0,
        userns_fd: 0,
    };
    // SAFETY: mount_setattr reads `attr` (on the stack, size given) and a static path.
    check(unsafe {
        libc::syscall(
            libc::SYS_mount_setattr,
            libc::AT_FDCWD,
            c"/".as_ptr(),
            AT_RECURSIVE,
            &attr as *const MountAttr,
            std::mem::size_of::<MountAttr>(),
        )
    })
}

/// Mounts a private tmpfs over the work dir, enters it, writes the program's files into it,
/// hands them to the run's uid and lets Landlock allow the new directory. Async-signal-safe.
fn fill_tmpfs_work_dir(tmpfs: &TmpfsWorkDir, jail: &PreparedJail) -> io::Result<()> {
    /// `struct landlock_path_beneath_attr` of the kernel ABI (packed).
    #[repr(C, packed)]
    struct PathBeneathAttr {
        allowed_access: u64,
        parent_fd: i32,
    }
    const LANDLOCK_RULE_PATH_BENEATH: libc::c_int = 1;
    // SAFETY: system calls on NUL-terminated strings and byte buffers prepared before the fork,
    // and on descriptors opened here and closed on every path.
    unsafe {
        check(
            libc::mount(
                c"tmpfs".as_ptr(),
                tmpfs.path.as_ptr(),
                c"tmpfs".as_ptr(),
                libc::MS_NOSUID | libc::MS_NODEV,
                tmpfs.options.as_ptr().cast(),
            )
            .into(),
        )?;
        check(libc::chdir(tmpfs.path.as_ptr()).into())?;
        let give = |path: *const libc::c_char| -> io::Result<()> {
            if let Some((uid, gid)) = jail.switch_to {
                check(libc::lchown(path, uid, gid).into())?;
            }
            Ok(())
        };
        give(c".".as_ptr())?;
        for (path, contents) in &tmpfs.entries {
            match contents {
                None => check(libc::mkdir(path.as_ptr(), 0o755).into())?,
                Some(bytes) => {
                    let fd = libc::open(
                        path.as_ptr(),
                        libc::O_WRONLY | libc::O_CREAT | libc::O_EXCL | libc::O_CLOEXEC,
                        0o644,
                    );
                    if fd < 0 {
                        return Err(io::Error::last_os_error());
                    }
                    let mut written = 0;
                    while written < bytes.len() {
                        let rest = &bytes[written..];
                        let count = libc::write(fd, rest.as_ptr().cast(), rest.len());
                        if count < 0 {
                            let error = io::Error::last_os_error();
                            if error.kind() == io::ErrorKind::Interrupted {
                                continue;
                            }
                            libc::close(fd);
                            return Err(error);
                        }
                        written += count as usize;
                    }
                    libc::close(fd);
                }
            }
            give(path.as_ptr())?;
        }
        if let Some(ruleset) = &jail.landlock_ruleset {
            let root = libc::open(c".".as_ptr(), libc::O_PATH | libc::O_CLOEXEC);
            if root < 0 {
                return Err(io::Error::last_os_error());
            }
            let attr = PathBeneathAttr {
                allowed_access: tmpfs.landlock_access,
                parent_fd: root,
            };
            let added = libc::syscall(
                libc::SYS_landlock_add_rule,
                ruleset.as_raw_fd(),
                LANDLOCK_RULE_PATH_BENEATH,
                &attr as *const PathBeneathAttr,
                0u32,
            );
            let error = io::Error::last_os_error();
            libc::close(root);
            if added < 0 {
                return Err(error);
            }
        }
    }
    Ok(())
}

/// `fork` as a raw `clone` system call: no atfork handlers, no malloc locks (see module doc).
/// Returns the child's pid in the parent, 0 in the child, -1 on error.
fn fork_raw() -> libc::c_long {
    // SAFETY: clone without CLONE_VM and without a new stack behaves as fork: the child gets a
    // copy of this stack and continues from here.
    unsafe {
        libc::syscall(
            libc::SYS_clone,
            libc::SIGCHLD as libc::c_ulong,
            0usize,
            0usize,
            0usize,
            0usize,
        )
    }
}

/// PID 1 of the run's PID namespace: reaps every orphan, and when `program` ends writes its wait
/// status to the status pipe and exits, upon which the kernel kills what is left. Never returns.
fn namespace_init(program: libc::pid_t, jail: &PreparedJail) -> ! {
    let status_fd = jail.status_writer.as_raw_fd();
    // SAFETY: system calls on our own descriptor and stack values only.
    unsafe {
        close_all_except(status_fd);
        loop {
            let mut wait_status: libc::c_int = 0;
            let reaped = libc::wait4(-1, &mut wait_status, libc::__WALL, std::ptr::null_mut());
            if reaped == program {
                let mut message = [0u8; PROGRAM_STATUS_BYTES];
                message[0..4].copy_from_slice(&PROGRAM_STATUS_MAGIC.to_ne_bytes());
                message[4..8].copy_from_slice(&wait_status.to_ne_bytes());
                libc::write(status_fd, message.as_ptr().cast(), PROGRAM_STATUS_BYTES);
                libc::_exit(0);
            }
            if reaped < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(0);
            }
        }
    }
}

/// The supervisor half: waits for `program`, relays stop requests, reports, exits. Never returns.
///
/// # Safety
/// Must run in the forked child only, with `waited` blocked.
unsafe fn supervise(program: libc::pid_t, jail: &PreparedJail, waited: &libc::sigset_t) -> ! {
    let status_fd: RawFd = jail.status_writer.as_raw_fd();
    // SAFETY: system calls on our own descriptors, signal set and stack values only.
    unsafe {
        // Hold no copy of the caller's pipes (the caller sees EOF when the program's side closes)
        // and nothing else the caller opened, except the status pipe.
        close_all_except(status_fd);
        let mut wait_status: libc::c_int = 0;
        let mut usage: libc::rusage = std::mem::zeroed();
        loop {
            let signal = libc::sigwaitinfo(waited, std::ptr::null_mut());
            if signal == libc::SIGTERM {
                libc::kill(program, libc::SIGKILL);
                if !jail.pid_namespace {
                    libc::kill(-program, libc::SIGKILL);
                }
            }
            let reaped = libc::wait4(program, &mut wait_status, libc::WNOHANG, &mut usage);
            if reaped == program {
                break;
            }
            if reaped < 0 && *libc::__errno_location() != libc::EINTR {
                libc::_exit(1);
            }
        }
        if !jail.pid_namespace {
            // Without a PID namespace, kill what the program left in its process group and, when
            // it ran under a uid of its own, every process of that uid.
            libc::kill(-program, libc::SIGKILL);
            if let Some((uid, _)) = jail.switch_to
                && libc::setresuid(uid, uid, uid) == 0
            {
                libc::kill(-1, libc::SIGKILL);
            }
        }
        let mut record = [0u8; RECORD_BYTES];
        let micros = |time: libc::timeval| time.tv_sec * 1_000_000 + time.tv_usec;
        record[0..4].copy_from_slice(&RECORD_MAGIC.to_ne_bytes());
        record[4..8].copy_from_slice(&wait_status.to_ne_bytes());
        record[8..16].copy_from_slice(&(micros(usage.ru_utime) as i64).to_ne_bytes());
        record[16..24].copy_from_slice(&(micros(usage.ru_stime) as i64).to_ne_bytes());
        record[24..32].copy_from_slice(&(usage.ru_maxrss as i64).to_ne_bytes());
        match &jail.tmpfs {
            Some(tmpfs) => send_with_work_dir(status_fd, &record, tmpfs),
            None => {
                libc::write(status_fd, record.as_ptr().cast(), RECORD_BYTES);
            }
        }
        libc::_exit(0)
    }
}

/// Writes `record` to the status channel with a descriptor of the work dir's tmpfs root (the
/// supervisor shares the run's mount namespace, so the path resolves to the tmpfs), so that the
/// caller can read back the files the program left; the tmpfs then lives until the caller drops
/// the descriptor. When the directory cannot be opened the record goes alone. Async-signal-safe.
fn send_with_work_dir(status_fd: RawFd, record: &[u8; RECORD_BYTES], tmpfs: &TmpfsWorkDir) {
    // SAFETY: system calls on a NUL-terminated path prepared before the fork, on stack buffers
    // whose lengths are passed with them, and on a descriptor opened and closed here.
    unsafe {
        let dir = libc::open(
            tmpfs.path.as_ptr(),
            // O_PATH: no read permission needed (the program may have chmod-ed the dir).
            libc::O_PATH | libc::O_DIRECTORY | libc::O_NOFOLLOW | libc::O_CLOEXEC,
        );
        if dir < 0 {
            libc::write(status_fd, record.as_ptr().cast(), RECORD_BYTES);
            return;
        }
        let mut vector = libc::iovec {
            iov_base: record.as_ptr() as *mut libc::c_void,
            iov_len: RECORD_BYTES,
        };
        let mut control = [0u64; 8];
        let mut header: libc::msghdr = std::mem::zeroed();
        header.msg_iov = &mut vector;
        header.msg_iovlen = 1;
        header.msg_control = control.as_mut_ptr().cast();
        header.msg_controllen = libc::CMSG_SPACE(std::mem::size_of::<libc::c_int>() as u32) as _;
        let message = libc::CMSG_FIRSTHDR(&header);
        (*message).cmsg_level = libc::SOL_SOCKET;
        (*message).cmsg_type = libc::SCM_RIGHTS;
        (*message).cmsg_len = libc::CMSG_LEN(std::mem::size_of::<libc::c_int>() as u32) as _;
        libc::CMSG_DATA(message)
            .cast::<libc::c_int>()
            .write_unaligned(dir);
        if libc::sendmsg(status_fd, &header, libc::MSG_NOSIGNAL) < 0 {
            libc::write(status_fd, record.as_ptr().cast(), RECORD_BYTES);
        }
        libc::close(dir);
    }
}

/// Closes every descriptor but `keep`. Async-signal-safe.
///
/// # Safety
/// Closes descriptors other code may hold; only for the supervisor, which owns nothing else.
unsafe fn close_all_except(keep: RawFd) {
    let keep = keep as libc::c_uint;
    // SAFETY: close_range/close take plain integers.
    unsafe {
        let low = if keep > 0 {
            libc::syscall(libc::SYS_close_range, 0u32, keep - 1, 0u32)
        } else {
            0
        };
        let high = libc::syscall(libc::SYS_close_range, keep + 1, u32::MAX, 0u32);
        if low < 0 || high < 0 {
            // Kernels before 5.9: close one by one.
            for fd in 0..4096 {
                if fd != keep as libc::c_int {
                    libc::close(fd);
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn record_round_trips() {
        let mut bytes = [0u8; RECORD_BYTES];
        bytes[0..4].copy_from_slice(&RECORD_MAGIC.to_ne_bytes());
        // Exit status 3 in wait(2) encoding.
        bytes[4..8].copy_from_slice(&(3i32 << 8).to_ne_bytes());
        bytes[8..16].copy_from_slice(&1_500_000i64.to_ne_bytes());
        bytes[16..24].copy_from_slice(&500_000i64.to_ne_bytes());
        bytes[24..32].copy_from_slice(&2048i64.to_ne_bytes());
        let record = SupervisorRecord::decode(&bytes).unwrap();
        assert_eq!(record.exit_code(), Some(3));
        assert_eq!(record.signal(), None);
        assert_eq!(record.cpu_time, Duration::from_secs(2));
        assert_eq!(record.max_rss_kib, 2048);
    }

    #[test]
    fn record_without_magic_is_rejected() {
        assert!(SupervisorRecord::decode(&[0u8; RECORD_BYTES]).is_none());
    }
}
