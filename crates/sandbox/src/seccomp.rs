//! The seccomp-bpf filters every jailed program runs under, compiled once per sandbox with
//! `seccompiler` (installed in the child by `jail.rs`).
//!
//! The filters are a deny-list over the system calls this filter knows, and an allow-list
//! cut-off for the ones it does not:
//! - Known calls (numbers below [`FIRST_UNREVIEWED_SYSCALL`]) are allowed by default:
//!   interpreters and compilers use a wide and changing set of them, and the other layers
//!   (Landlock, namespaces, a separate uid, rlimits, cgroups) already confine files, processes
//!   and resources. The deny-list removes what those layers do not cover: sockets (without
//!   network, only stream `socketpair`s), debugging other processes (ptrace, `pidfd_getfd`), new
//!   namespaces, mounts, kernel modules, bpf, io_uring (whose operations bypass seccomp),
//!   keyrings, clock changes, watching host files (`inotify_add_watch`, `fanotify`), and `setsid`
//!   (a new session is a new scheduler autogroup: without a CPU cgroup, a run's children that
//!   call it would each get a CPU share of their own and starve concurrent runs).
//! - File locks (`flock`, `fcntl` `F_*LK`) fail with `ENOLCK`: a lock is state of a host inode
//!   that the read-only view does not stop, visible to the host and to concurrent runs (a covert
//!   channel between the samples of a group).
//! - Calls that act on the host's page cache or disks succeed as no-ops (errno 0): `sync`,
//!   `syncfs`, `fadvise(DONTNEED)`, `madvise(MADV_COLD | MADV_PAGEOUT)`.
//! - Every call numbered from [`FIRST_UNREVIEWED_SYSCALL`] up (`statmount`, `listmount`, which
//!   show the host's mount table, and whatever later kernels add) fails with `ENOSYS`, as on a
//!   kernel without it; glibc and interpreters treat that as "not supported" and fall back. A new
//!   kernel interface is thus closed until someone reviews it and moves the cut-off, instead of
//!   open until someone notices it. Numbers from 424 up are shared by every architecture, so one
//!   cut-off serves all; the x32 ABI (`__X32_SYSCALL_BIT`, above the cut-off) falls under it too.
//!
//! Invariant: denied calls fail with `EPERM` (the program sees an ordinary error and can report
//! it), except locks (`ENOLCK`), the host-wide no-ops above (0), and `clone3` and the
//! unreviewed calls, which fail with `ENOSYS` (so that glibc falls
//! back to `clone`, whose flags a classic BPF filter can inspect, and to older interfaces).

use std::collections::BTreeMap;

use seccompiler::{
    BpfProgram, SeccompAction, SeccompCmpArgLen, SeccompCmpOp, SeccompCondition, SeccompFilter,
    SeccompRule, TargetArch,
};

/// System calls no untrusted program needs.
const DENIED_SYSCALLS: &[libc::c_long] = &[
    libc::SYS_ptrace,
    libc::SYS_process_vm_readv,
    libc::SYS_process_vm_writev,
    libc::SYS_mount,
    libc::SYS_umount2,
    libc::SYS_pivot_root,
    libc::SYS_chroot,
    libc::SYS_swapon,
    libc::SYS_swapoff,
    libc::SYS_reboot,
    libc::SYS_kexec_load,
    libc::SYS_kexec_file_load,
    libc::SYS_init_module,
    libc::SYS_finit_module,
    libc::SYS_delete_module,
    libc::SYS_bpf,
    libc::SYS_perf_event_open,
    libc::SYS_userfaultfd,
    libc::SYS_keyctl,
    libc::SYS_add_key,
    libc::SYS_request_key,
    libc::SYS_setns,
    libc::SYS_unshare,
    libc::SYS_io_uring_setup,
    libc::SYS_io_uring_enter,
    libc::SYS_io_uring_register,
    libc::SYS_open_by_handle_at,
    libc::SYS_name_to_handle_at,
    libc::SYS_acct,
    libc::SYS_quotactl,
    libc::SYS_settimeofday,
    libc::SYS_clock_settime,
    libc::SYS_clock_adjtime,
    libc::SYS_adjtimex,
    libc::SYS_sethostname,
    libc::SYS_setdomainname,
    libc::SYS_syslog,
    libc::SYS_vhangup,
    libc::SYS_fanotify_init,
    libc::SYS_mount_setattr,
    libc::SYS_move_mount,
    libc::SYS_open_tree,
    libc::SYS_fsopen,
    libc::SYS_fsmount,
    libc::SYS_fsconfig,
    libc::SYS_fspick,
    libc::SYS_pidfd_getfd,
    libc::SYS_inotify_add_watch,
    libc::SYS_fanotify_mark,
    libc::SYS_setsid,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_iopl,
    #[cfg(target_arch = "x86_64")]
    libc::SYS_ioperm,
];

/// `clone` flags that create namespaces (a program inside cannot nest its own jail to escape the
/// seccomp filter's view, and user namespaces are a large kernel attack surface).
const NAMESPACE_CLONE_FLAGS: &[libc::c_int] = &[
    libc::CLONE_NEWUSER,
    libc::CLONE_NEWNS,
    libc::CLONE_NEWPID,
    libc::CLONE_NEWNET,
    libc::CLONE_NEWIPC,
    libc::CLONE_NEWUTS,
    libc::CLONE_NEWCGROUP,
];

/// `madvise` advice values that reclaim pages (Linux 5.4), absent from the libc crate.
const MADV_COLD: u64 = 20;
const MADV_PAGEOUT: u64 = 21;

/// The bits of `socket`/`socketpair`'s type argument that hold the type (the others are
/// `SOCK_NONBLOCK` and `SOCK_CLOEXEC`).
const SOCKET_TYPE_MASK: u64 = 0xf;

/// The compiled filters, installed in order.
#[derive(Debug, Clone)]
pub(crate) struct SeccompFilters {
    pub(crate) programs: Vec<BpfProgram>,
}

impl SeccompFilters {
    /// Compiles the filters; `allow_network` keeps `socket`, `connect` and `socketpair`
    /// unrestricted.
    pub(crate) fn compile(allow_network: bool) -> Result<SeccompFilters, String> {
        let arch = TargetArch::try_from(std::env::consts::ARCH)
            .map_err(|error| format!("seccomp: unsupported architecture: {error}"))?;
        let condition = |arg: u8, op: SeccompCmpOp, value: u64| {
            SeccompCondition::new(arg, SeccompCmpArgLen::Dword, op, value)
                .map_err(|error| format!("seccomp condition: {error}"))
        };
        let rule = |conditions: Vec<SeccompCondition>| {
            SeccompRule::new(conditions).map_err(|error| format!("seccomp rule: {error}"))
        };

        let mut denied: BTreeMap<i64, Vec<SeccompRule>> = DENIED_SYSCALLS
            .iter()
            .map(|syscall| (*syscall, Vec::new()))
            .collect();
        if !allow_network {
            // No socket() at all, not even AF_UNIX: Landlock (ABI <= 7) does not govern
            // connecting to a named Unix socket, so a program could reach any host service whose
            // socket file its uid may write (journald, the D-Bus buses, a caller's own agents)
            // through the shared filesystem. Without `socket` and `connect`, the only Unix sockets
            // are `socketpair`s: stream and seqpacket pairs refuse a destination address, and
            // datagram pairs (which accept one in `sendto`/`sendmsg`) are denied too.
            denied.insert(libc::SYS_socket, Vec::new());
            denied.insert(libc::SYS_connect, Vec::new());
            denied.insert(
                libc::SYS_socketpair,
                vec![rule(vec![condition(
                    1,
                    SeccompCmpOp::MaskedEq(SOCKET_TYPE_MASK),
                    libc::SOCK_DGRAM as u64,
                )?])?],
            );
        }
        let mut clone_rules = Vec::new();
        for flag in NAMESPACE_CLONE_FLAGS {
            let flag = *flag as u64;
            clone_rules.push(rule(vec![condition(
                0,
                SeccompCmpOp::MaskedEq(flag),
                flag,
            )?])?);
        }
        denied.insert(libc::SYS_clone, clone_rules);

        let deny_filter = SeccompFilter::new(
            denied,
            SeccompAction::Allow,
            SeccompAction::Errno(libc::EPERM as u32),
            arch,
        )
        .map_err(|error| format!("seccomp filter: {error}"))?;
        let clone3_filter = SeccompFilter::new(
            BTreeMap::from([(libc::SYS_clone3, Vec::new())]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOSYS as u32),
            arch,
        )
        .map_err(|error| format!("seccomp filter: {error}"))?;

        // File locks are the one state of a host inode the read-only view still lets a run
        // change: a lock held on a shared system file is seen by the host (a writer blocks) and
        // by concurrent runs (a covert channel between the samples of one group: a "relay" that
        // reads a sibling's answer off lock states scored as correct). The work dir is private
        // to the run, so nothing there needs a lock to be shared either.
        let lock_commands = [
            libc::F_GETLK,
            libc::F_SETLK,
            libc::F_SETLKW,
            libc::F_OFD_GETLK,
            libc::F_OFD_SETLK,
            libc::F_OFD_SETLKW,
        ];
        let mut fcntl_rules = Vec::new();
        for command in lock_commands {
            fcntl_rules.push(rule(vec![condition(1, SeccompCmpOp::Eq, command as u64)?])?);
        }
        let lock_filter = SeccompFilter::new(
            BTreeMap::from([
                (libc::SYS_flock, Vec::new()),
                (libc::SYS_fcntl, fcntl_rules),
            ]),
            SeccompAction::Allow,
            SeccompAction::Errno(libc::ENOLCK as u32),
            arch,
        )
        .map_err(|error| format!("seccomp filter: {error}"))?;
        // Calls that would act on the host's page cache or disks succeed without doing anything
        // (errno 0): evicting a host file's cached pages (`fadvise(DONTNEED)`, `madvise(COLD,
        // PAGEOUT)`) slows the host and is the send half of a cache-timing channel; `sync` and
        // `syncfs` flush every filesystem of the host.
        let noop_filter = SeccompFilter::new(
            BTreeMap::from([
                (libc::SYS_sync, Vec::new()),
                (libc::SYS_syncfs, Vec::new()),
                (
                    libc::SYS_fadvise64,
                    vec![rule(vec![condition(
                        3,
                        SeccompCmpOp::Eq,
                        libc::POSIX_FADV_DONTNEED as u64,
                    )?])?],
                ),
                (
                    libc::SYS_madvise,
                    vec![
                        rule(vec![condition(2, SeccompCmpOp::Eq, MADV_COLD)?])?,
                        rule(vec![condition(2, SeccompCmpOp::Eq, MADV_PAGEOUT)?])?,
                    ],
                ),
            ]),
            SeccompAction::Allow,
            SeccompAction::Errno(0),
            arch,
        )
        .map_err(|error| format!("seccomp filter: {error}"))?;

        let mut programs = [deny_filter, clone3_filter, lock_filter, noop_filter]
            .into_iter()
            .map(|filter| {
                BpfProgram::try_from(filter).map_err(|error| format!("seccomp compile: {error}"))
            })
            .collect::<Result<Vec<_>, _>>()?;
        programs.push(unreviewed_syscall_filter());
        Ok(SeccompFilters { programs })
    }
}

/// The first system call number this filter has not reviewed: 457 is `statmount` (Linux 6.8),
/// followed by `listmount`, the LSM attribute calls, `mseal`, the `*xattrat` family,
/// `open_tree_attr`, `file_getattr`/`file_setattr`, and whatever later kernels add.
pub(crate) const FIRST_UNREVIEWED_SYSCALL: u32 = 457;

/// A filter failing every system call numbered [`FIRST_UNREVIEWED_SYSCALL`] or above with
/// `ENOSYS`. Hand-written because `seccompiler` matches exact numbers only. It also covers the
/// x32 ABI on x86_64 (`nr | 0x4000_0000`, same audit arch): on kernels built with
/// `CONFIG_X86_X32_ABI`, `unshare` as an x32 call would otherwise slip past every exact rule.
/// Other architectures and the i386 ABI are killed by the arch check of the filters above.
fn unreviewed_syscall_filter() -> BpfProgram {
    const LOAD_NR: u16 = 0x20; // BPF_LD (0) | BPF_W (0) | BPF_ABS; seccomp_data.nr is at offset 0
    const JUMP_GE: u16 = 0x05 | 0x30; // BPF_JMP | BPF_JGE | BPF_K
    const RETURN: u16 = 0x06; // BPF_RET | BPF_K
    let instruction = |code, jt, jf, k| seccompiler::sock_filter { code, jt, jf, k };
    vec![
        instruction(LOAD_NR, 0, 0, 0),
        instruction(JUMP_GE, 0, 1, FIRST_UNREVIEWED_SYSCALL),
        instruction(RETURN, 0, 0, libc::SECCOMP_RET_ERRNO | libc::ENOSYS as u32),
        instruction(RETURN, 0, 0, libc::SECCOMP_RET_ALLOW),
    ]
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn filters_compile_with_and_without_network() {
        let closed = SeccompFilters::compile(false).unwrap();
        let open = SeccompFilters::compile(true).unwrap();
        assert_eq!(closed.programs.len(), 5);
        // The socket rule adds instructions.
        assert!(closed.programs[0].len() > open.programs[0].len());
    }
}
