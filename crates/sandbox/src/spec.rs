//! The jail a sandbox applies: from what the probe found (`ProbeOutcome`) and a
//! [`SandboxConfig`] to the `JailSpec` of every run and the report of the layers applied.
//!
//! Both the probe (whose final check runs the combined default spec) and [`crate::Sandbox`]
//! (built once per config) ask this module, so it sits below both.
//! Not here: finding which layers work (`probe.rs`), what each layer does (`jail.rs`), running
//! anything (`sandbox.rs`).
//! Invariant: a layer is reported applied only if the probe found it available and the spec
//! uses it.

use std::sync::Arc;

use crate::config::SandboxConfig;
use crate::isolation::{IsolationReport, Layer};
use crate::jail::{JailSpec, Limits, UserMode};
use crate::seccomp::SeccompFilters;

/// What the probe found, with what a sandbox needs to apply it.
#[derive(Debug, Clone)]
pub(crate) struct ProbeOutcome {
    /// Every layer's availability (`applied` = available, i.e. what a default sandbox applies).
    pub(crate) report: IsolationReport,
    pub(crate) landlock_abi: Option<i32>,
}

/// The jail spec and the report of applied layers for `config` on a machine probed as `outcome`.
pub(crate) fn spec_for(
    outcome: &ProbeOutcome,
    config: &SandboxConfig,
) -> Result<(JailSpec, IsolationReport), String> {
    let probe = &outcome.report;
    let on = |layer: Layer| probe.applies(layer);
    let root = probe.caller_is_root;
    let user = if root && on(Layer::SeparateUser) {
        UserMode::SeparateUser
    } else if !root && on(Layer::UserNamespace) {
        UserMode::UserNamespace
    } else {
        UserMode::Caller
    };
    let namespaces = root || user == UserMode::UserNamespace;
    let pid_namespace = namespaces && on(Layer::PidNamespace);
    let network_namespace = namespaces && on(Layer::NetworkNamespace) && !config.network;
    let mount_namespace = pid_namespace && on(Layer::MountNamespace);
    let work_dir_tmpfs = mount_namespace && on(Layer::WorkDirTmpfs);
    // The tmpfs's pages are charged to the run's cgroup too.
    let memory_cgroup_bytes = on(Layer::MemoryCgroup).then(|| {
        let disk = if work_dir_tmpfs {
            config.max_disk_bytes
        } else {
            0
        };
        config.memory_bytes.saturating_add(disk)
    });
    let cpu_cgroup_percent = on(Layer::CpuCgroup).then_some(config.max_cpu_percent);
    let read_only_host = work_dir_tmpfs && on(Layer::ReadOnlyHost);
    let ipc_namespace = namespaces && on(Layer::IpcNamespace);
    let no_new_privs = on(Layer::NoNewPrivileges);
    let landlock_abi = if no_new_privs && on(Layer::Landlock) {
        outcome.landlock_abi
    } else {
        None
    };
    let seccomp = if no_new_privs && on(Layer::Seccomp) {
        Some(Arc::new(SeccompFilters::compile(config.network)?))
    } else {
        None
    };
    let spec = JailSpec {
        limits: Limits {
            cpu_seconds: config.cpu_seconds,
            memory_bytes: config.memory_bytes,
            file_bytes: config.max_file_bytes,
            open_files: config.max_open_files,
            processes: config.max_processes,
        },
        user,
        pid_namespace,
        network_namespace,
        mount_namespace,
        ipc_namespace,
        no_new_privs,
        landlock_abi,
        seccomp: seccomp.clone(),
        allow_network: config.network,
        work_dir_tmpfs_bytes: work_dir_tmpfs.then_some(config.max_disk_bytes),
        memory_cgroup_bytes,
        cpu_cgroup_percent,
        read_only_host,
    };
    let used = |layer: Layer| match layer {
        Layer::FreshWorkDir
        | Layer::ProcessGroup
        | Layer::ParentDeathSignal
        | Layer::ResourceLimits => true,
        Layer::MemoryCgroup => memory_cgroup_bytes.is_some(),
        Layer::CpuCgroup => cpu_cgroup_percent.is_some(),
        Layer::ReadOnlyHost => read_only_host,
        Layer::SeparateUser => user == UserMode::SeparateUser,
        Layer::UserNamespace => user == UserMode::UserNamespace,
        Layer::PidNamespace => pid_namespace,
        Layer::NetworkNamespace => network_namespace,
        Layer::MountNamespace => mount_namespace,
        Layer::WorkDirTmpfs => work_dir_tmpfs,
        Layer::IpcNamespace => ipc_namespace,
        Layer::NoNewPrivileges => no_new_privs,
        Layer::Landlock => landlock_abi.is_some(),
        Layer::Seccomp => seccomp.is_some(),
    };
    let layers = probe
        .layers
        .iter()
        .map(|entry| {
            let mut entry = entry.clone();
            entry.applied = entry.available && used(entry.layer);
            if entry.available && !entry.applied && entry.layer == Layer::NetworkNamespace {
                entry.detail = "off: the config allows network".to_string();
            }
            entry
        })
        .collect();
    Ok((spec, IsolationReport::new(root, layers)))
}
