//! What isolation a run gets: the closed set of layers ([`Layer`]), the coarse level they add up to
//! ([`IsolationLevel`]), and the report ([`IsolationReport`]) that [`crate::probe`] returns and that
//! every [`crate::ExecResult`] carries.
//!
//! This module only describes isolation; it applies nothing (that is `jail.rs`) and probes nothing
//! (that is `probe.rs`).
//!
//! Invariant: a layer is reported `applied` only when every run of the sandbox applies it; a run in
//! which an applied layer cannot be set up fails with `ExitStatusKind::SandboxError` instead of
//! running with less isolation than reported.

use serde::{Deserialize, Serialize};

/// One isolation mechanism. The order is the order in which `stoke sandbox probe` lists them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Layer {
    /// A fresh working directory, a cleared environment, closed inherited descriptors.
    FreshWorkDir,
    /// `setsid`: the program leads its own session and process group, so it can be killed as one.
    ProcessGroup,
    /// `PR_SET_PDEATHSIG`: the jail dies with the caller.
    ParentDeathSignal,
    /// rlimits: CPU seconds, address space, file size, open files, processes, no core dumps.
    ResourceLimits,
    /// A memory cgroup per run: all its processes and its tmpfs together stay under
    /// `memory_bytes + max_disk_bytes` (rlimits bound each process alone). Needs write access to
    /// the caller's memory cgroup (root, in practice). Not required by any level.
    MemoryCgroup,
    /// A CPU cgroup per run: the run as a whole (however many processes it starts, whatever
    /// sessions they make) gets at most `max_cpu_percent` of one CPU, and an equal share against
    /// concurrent runs. Needs write access to the caller's CPU cgroup (root, in practice). Not
    /// required by any level.
    CpuCgroup,
    /// The program runs under a uid of its own (not the caller's), so file permissions protect the
    /// caller's files and the process limit is counted for this run alone. Needs root.
    SeparateUser,
    /// A user namespace (used when the caller is not root, to own the other namespaces).
    UserNamespace,
    /// A PID namespace: the program is PID 1 of its own tree; when it exits, the kernel kills every
    /// process it left behind, daemons included.
    PidNamespace,
    /// A network namespace with no interfaces but a down loopback: no network at all.
    NetworkNamespace,
    /// A private mount namespace with a fresh `/proc` that shows only the jail's processes.
    MountNamespace,
    /// The work dir is a private, size-limited tmpfs (`max_disk_bytes`): a program cannot fill
    /// the caller's disk, and what it writes vanishes with the run.
    WorkDirTmpfs,
    /// The jail's view of the host filesystem is read-only (every mount, recursively, before the
    /// work dir's tmpfs is mounted): metadata writes outside the work dir (`chmod`, `chown`,
    /// `utime`, `setxattr`), which Landlock does not govern, fail with `EROFS`. Needs the work
    /// dir tmpfs and `mount_setattr` (Linux 5.12).
    ReadOnlyHost,
    /// An IPC namespace: no System V IPC or POSIX message queues shared with the host.
    IpcNamespace,
    /// `PR_SET_NO_NEW_PRIVS`: set-uid binaries cannot raise privileges.
    NoNewPrivileges,
    /// Landlock: read-only access to system directories, read-write only in the work dir; TCP
    /// bind/connect denied (ABI >= 4); signals and abstract sockets scoped to the jail (ABI >= 6).
    Landlock,
    /// seccomp-bpf: denies non-Unix sockets, ptrace, mount, namespace creation, kernel modules,
    /// bpf, io_uring and similar.
    Seccomp,
}

impl Layer {
    /// Every layer, in report order.
    pub const ALL: [Layer; 17] = [
        Layer::FreshWorkDir,
        Layer::ProcessGroup,
        Layer::ParentDeathSignal,
        Layer::ResourceLimits,
        Layer::MemoryCgroup,
        Layer::CpuCgroup,
        Layer::SeparateUser,
        Layer::UserNamespace,
        Layer::PidNamespace,
        Layer::NetworkNamespace,
        Layer::MountNamespace,
        Layer::WorkDirTmpfs,
        Layer::ReadOnlyHost,
        Layer::IpcNamespace,
        Layer::NoNewPrivileges,
        Layer::Landlock,
        Layer::Seccomp,
    ];

    /// The name used in tables and JSON.
    pub fn name(self) -> &'static str {
        match self {
            Layer::FreshWorkDir => "fresh_work_dir",
            Layer::ProcessGroup => "process_group",
            Layer::ParentDeathSignal => "parent_death_signal",
            Layer::ResourceLimits => "resource_limits",
            Layer::MemoryCgroup => "memory_cgroup",
            Layer::CpuCgroup => "cpu_cgroup",
            Layer::SeparateUser => "separate_user",
            Layer::UserNamespace => "user_namespace",
            Layer::PidNamespace => "pid_namespace",
            Layer::NetworkNamespace => "network_namespace",
            Layer::MountNamespace => "mount_namespace",
            Layer::WorkDirTmpfs => "work_dir_tmpfs",
            Layer::ReadOnlyHost => "read_only_host",
            Layer::IpcNamespace => "ipc_namespace",
            Layer::NoNewPrivileges => "no_new_privileges",
            Layer::Landlock => "landlock",
            Layer::Seccomp => "seccomp",
        }
    }
}

/// Coarse isolation levels, ordered from weakest to strongest; `SandboxConfig::min_isolation`
/// names the least a sandbox accepts.
#[derive(
    Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize,
)]
#[serde(rename_all = "snake_case")]
pub enum IsolationLevel {
    /// Fresh work dir, cleared environment, process group, parent-death signal, rlimits. Contains
    /// runaway resource use but not a hostile program (it can read what the caller can read and
    /// use the network).
    Basic,
    /// Basic plus no-new-privileges, Landlock and seccomp: no writes outside the work dir, no
    /// reads outside system directories, no network sockets, no dangerous system calls.
    #[default]
    Confined,
    /// Confined plus a PID namespace (nothing survives the run), a network namespace, a private
    /// mount namespace with a size-limited tmpfs work dir and every other mount read-only, and a
    /// uid not the caller's (root) or a user namespace (non-root).
    Full,
}

impl IsolationLevel {
    /// The lowercase name used in configs and tables.
    pub fn name(self) -> &'static str {
        match self {
            IsolationLevel::Basic => "basic",
            IsolationLevel::Confined => "confined",
            IsolationLevel::Full => "full",
        }
    }
}

/// One layer's line in a report.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct LayerReport {
    pub layer: Layer,
    /// The kernel and privileges allow it (probed by trying it in a child process).
    pub available: bool,
    /// Every run of this sandbox applies it (for [`crate::probe`]: what a default sandbox applies).
    pub applied: bool,
    /// Why it is unavailable, or what exactly it does here (e.g. the Landlock ABI).
    pub detail: String,
}

/// The isolation layers available or applied, and the level they reach.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IsolationReport {
    /// The highest level whose layers are all applied.
    pub level: IsolationLevel,
    /// Whether the caller runs as root (uid 0); decides between `SeparateUser` and
    /// `UserNamespace`.
    pub caller_is_root: bool,
    /// One entry per [`Layer`], in [`Layer::ALL`] order.
    pub layers: Vec<LayerReport>,
}

impl IsolationReport {
    /// Builds a report and derives its level from the applied layers.
    pub fn new(caller_is_root: bool, layers: Vec<LayerReport>) -> IsolationReport {
        let mut report = IsolationReport {
            level: IsolationLevel::Basic,
            caller_is_root,
            layers,
        };
        report.level = report.derive_level();
        report
    }

    /// The entry for `layer`, if present.
    pub fn layer(&self, layer: Layer) -> Option<&LayerReport> {
        self.layers.iter().find(|entry| entry.layer == layer)
    }

    /// Whether `layer` is applied.
    pub fn applies(&self, layer: Layer) -> bool {
        self.layer(layer).is_some_and(|entry| entry.applied)
    }

    /// Whether `layer` is available.
    pub fn has(&self, layer: Layer) -> bool {
        self.layer(layer).is_some_and(|entry| entry.available)
    }

    fn derive_level(&self) -> IsolationLevel {
        let all = |layers: &[Layer]| layers.iter().all(|layer| self.applies(*layer));
        let basic = [
            Layer::FreshWorkDir,
            Layer::ProcessGroup,
            Layer::ParentDeathSignal,
            Layer::ResourceLimits,
        ];
        let confined = [Layer::NoNewPrivileges, Layer::Landlock, Layer::Seccomp];
        let full = [
            Layer::PidNamespace,
            Layer::NetworkNamespace,
            Layer::MountNamespace,
            Layer::WorkDirTmpfs,
            Layer::ReadOnlyHost,
        ];
        let own_user = if self.caller_is_root {
            Layer::SeparateUser
        } else {
            Layer::UserNamespace
        };
        if !all(&basic) || !all(&confined) {
            // Basic is the floor: every run has a fresh dir, a process group and rlimits, or fails.
            return IsolationLevel::Basic;
        }
        if all(&full) && self.applies(own_user) {
            IsolationLevel::Full
        } else {
            IsolationLevel::Confined
        }
    }

    /// A human-readable table, one line per layer.
    pub fn to_table(&self) -> String {
        let mut out = format!(
            "isolation level: {} (caller is {})\n",
            self.level.name(),
            if self.caller_is_root {
                "root"
            } else {
                "not root"
            }
        );
        out.push_str(&format!(
            "{:<22} {:<10} {:<8} {}\n",
            "layer", "available", "applied", "detail"
        ));
        for entry in &self.layers {
            out.push_str(&format!(
                "{:<22} {:<10} {:<8} {}\n",
                entry.layer.name(),
                if entry.available { "yes" } else { "no" },
                if entry.applied { "yes" } else { "no" },
                entry.detail
            ));
        }
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn report(root: bool, missing: &[Layer]) -> IsolationReport {
        let layers = Layer::ALL
            .iter()
            .map(|layer| LayerReport {
                layer: *layer,
                available: !missing.contains(layer),
                applied: !missing.contains(layer),
                detail: String::new(),
            })
            .collect();
        IsolationReport::new(root, layers)
    }

    #[test]
    fn all_layers_make_full() {
        assert_eq!(report(true, &[]).level, IsolationLevel::Full);
    }

    #[test]
    fn missing_pid_namespace_drops_to_confined() {
        assert_eq!(
            report(true, &[Layer::PidNamespace]).level,
            IsolationLevel::Confined
        );
    }

    #[test]
    fn root_without_separate_user_is_not_full() {
        assert_eq!(
            report(true, &[Layer::SeparateUser]).level,
            IsolationLevel::Confined
        );
        assert_eq!(
            report(false, &[Layer::SeparateUser]).level,
            IsolationLevel::Full
        );
    }

    #[test]
    fn missing_landlock_drops_to_basic() {
        assert_eq!(
            report(true, &[Layer::Landlock]).level,
            IsolationLevel::Basic
        );
    }

    #[test]
    fn levels_are_ordered() {
        assert!(IsolationLevel::Basic < IsolationLevel::Confined);
        assert!(IsolationLevel::Confined < IsolationLevel::Full);
    }
}
