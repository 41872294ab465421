//! The probe: which isolation layers work on this machine, found by actually starting a jailed
//! `true` with each layer (a layer the kernel refuses fails the child's setup, which `std`
//! reports as a spawn error). Runs once per process; the result is cached.
//!
//! Not here: what a particular sandbox applies (that depends on its config; `sandbox.rs`).
//!
//! Invariant: a layer reported available has been applied successfully at least once, together
//! with every other available layer (the final combined check), on this machine, by this process.

use std::io::{Read, Write};
use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use crate::cgroup::{self, CgroupParents, Controller};
use crate::helper::{self, HelperRequest};
use crate::isolation::{IsolationReport, Layer, LayerReport};
use crate::jail::{self, JailSpec, Limits, PreparedJail, UserMode};
use crate::language::{Program, TRUSTED_BIN_DIRS};
use crate::run_user::RunUser;
use crate::seccomp::SeccompFilters;
use crate::spec::{ProbeOutcome, spec_for};
use crate::work_dir::{WorkDir, layout};
use crate::{SandboxConfig, filesystem_rules};

static PROBE: OnceLock<ProbeOutcome> = OnceLock::new();

/// The isolation layers available on this machine (probed once per process, then cached).
pub fn probe() -> IsolationReport {
    probe_outcome().report.clone()
}

pub(crate) fn probe_outcome() -> &'static ProbeOutcome {
    PROBE.get_or_init(run_probe)
}

fn base_spec() -> JailSpec {
    JailSpec {
        limits: Limits {
            cpu_seconds: 5,
            memory_bytes: 1 << 30,
            file_bytes: 1 << 20,
            open_files: 64,
            processes: 64,
        },
        user: UserMode::Caller,
        pid_namespace: false,
        network_namespace: false,
        mount_namespace: false,
        ipc_namespace: false,
        no_new_privs: false,
        landlock_abi: None,
        seccomp: None,
        allow_network: false,
        work_dir_tmpfs_bytes: None,
        memory_cgroup_bytes: None,
        cpu_cgroup_percent: None,
        read_only_host: false,
    }
}

fn true_binary() -> Option<PathBuf> {
    TRUSTED_BIN_DIRS
        .iter()
        .map(|dir| Path::new(dir).join("true"))
        .find(|path| path.is_file())
}

/// Starts `true` under `spec` and checks it exited 0 with a supervisor record.
pub(crate) fn try_spec(spec: &JailSpec) -> Result<(), String> {
    let truth = true_binary().ok_or("no `true` in /usr/bin or /bin")?;
    let config = SandboxConfig::default();
    let run_user = (spec.user == UserMode::SeparateUser).then(|| RunUser::acquire(config.uid_base));
    let owner = run_user.as_ref().map(|user| (user.uid(), user.uid()));
    let layout = layout(&Program::bash("exit 0"))?;
    let work_dir = WorkDir::create(&config.work_root, &layout, owner)?;
    let ruleset = match spec.landlock_abi {
        Some(abi) => Some(filesystem_rules::build_ruleset(
            abi,
            work_dir.path(),
            spec.allow_network,
        )?),
        None => None,
    };
    let cgroup = CgroupParents::discover(spec.cgroup_limits())?.create(spec.cgroup_limits())?;
    let (status_reader, status_writer) = jail::status_pipe().map_err(|error| error.to_string())?;
    let mut prepared = PreparedJail::new(
        spec,
        owner,
        ruleset,
        work_dir.path(),
        layout,
        status_writer,
        std::process::id(),
    )
    .map_err(|error| error.to_string())?;
    prepared.join_cgroups(cgroup.procs_paths()?);
    let mut command = Command::new(truth);
    command
        .env_clear()
        .current_dir(work_dir.path())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null());
    prepared.install(&mut command);
    let spawned = command.spawn();
    drop(command);
    let mut child = spawned.map_err(|error| error.to_string())?;
    let status = child.wait().map_err(|error| error.to_string())?;
    let record = jail::read_record(status_reader).ok_or("no supervisor record")?;
    if !status.success() || record.exit_code() != Some(0) {
        return Err(format!(
            "test child failed: supervisor {status}, program status word {}",
            record.wait_status
        ));
    }
    Ok(())
}

static HELPER: OnceLock<Result<(), String>> = OnceLock::new();

/// Whether the helper process (see `helper.rs`) works in this binary: tried once, with a bare
/// jail running `true`.
pub(crate) fn helper_check() -> &'static Result<(), String> {
    HELPER.get_or_init(try_helper)
}

fn try_helper() -> Result<(), String> {
    let truth = true_binary().ok_or("no `true` in /usr/bin or /bin")?;
    let config = SandboxConfig::default();
    let layout = layout(&Program::bash("exit 0"))?;
    let work_dir = WorkDir::create(&config.work_root, &layout, None)?;
    let (status_reader, status_writer) = jail::status_pipe().map_err(|error| error.to_string())?;
    jail::make_inheritable(&status_writer).map_err(|error| error.to_string())?;
    let request = HelperRequest::new(
        &base_spec(),
        None,
        work_dir.path().to_path_buf(),
        layout,
        truth,
        Vec::new(),
        Vec::new(),
        Vec::new(),
    );
    let framed = request.frame()?;
    let mut command = helper::helper_command(status_writer.as_raw_fd());
    command
        .current_dir(work_dir.path())
        .stdin(Stdio::piped())
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    let spawned = command.spawn();
    drop(command);
    drop(status_writer);
    let mut child = spawned.map_err(|error| error.to_string())?;
    if let Some(mut stdin) = child.stdin.take() {
        // A binary without the constructor may not read its stdin; that is reported below.
        let _ = stdin.write_all(&framed);
    }
    // A binary without the constructor runs its `main` with the helper arguments; give it a
    // moment, then give up on the helper.
    let deadline = Instant::now() + Duration::from_secs(5);
    loop {
        match child.try_wait().map_err(|error| error.to_string())? {
            Some(_) => break,
            None if Instant::now() > deadline => {
                let _ = child.kill();
                let _ = child.wait();
                return Err("the helper did not finish within 5 s".to_string());
            }
            None => std::thread::sleep(Duration::from_millis(2)),
        }
    }
    let mut stderr = String::new();
    if let Some(mut pipe) = child.stderr.take() {
        let _ = pipe.read_to_string(&mut stderr);
    }
    let record = jail::read_record(status_reader)
        .ok_or_else(|| format!("the helper reported nothing: {}", stderr.trim()))?;
    if record.exit_code() != Some(0) {
        return Err(format!(
            "the helper's test child failed (status word {}): {}",
            record.wait_status,
            stderr.trim()
        ));
    }
    Ok(())
}

fn parent_dir_name(parent: &cgroup::CgroupParent) -> String {
    parent.dir().display().to_string()
}

fn run_probe() -> ProbeOutcome {
    let root = jail::caller_is_root();
    let mut entries: Vec<LayerReport> = Vec::new();
    let mut note = |layer: Layer, result: Result<String, String>| {
        let (available, detail) = match result {
            Ok(detail) => (true, detail),
            Err(detail) => (false, detail),
        };
        entries.push(LayerReport {
            layer,
            available,
            applied: available,
            detail,
        });
    };

    let base = try_spec(&base_spec());
    let base_ok = base.is_ok();
    for layer in [
        Layer::FreshWorkDir,
        Layer::ProcessGroup,
        Layer::ParentDeathSignal,
        Layer::ResourceLimits,
    ] {
        note(
            layer,
            base.clone().map(|()| match layer {
                Layer::ResourceLimits => {
                    "CPU, address space, file size, open files, processes, core=0".to_string()
                }
                _ => String::new(),
            }),
        );
    }
    let memory_cgroup = cgroup::discover(Controller::Memory).and_then(|parent| {
        try_spec(&JailSpec {
            memory_cgroup_bytes: Some(1 << 30),
            ..base_spec()
        })
        .map(|()| format!("under {}", parent_dir_name(&parent)))
    });
    let unless_base = |result: Result<String, String>| {
        if base_ok {
            result
        } else {
            Err("the basic jail failed".to_string())
        }
    };

    note(Layer::MemoryCgroup, unless_base(memory_cgroup));
    let default_cpu_percent = SandboxConfig::default().max_cpu_percent;
    let cpu_cgroup = cgroup::discover(Controller::Cpu).and_then(|parent| {
        try_spec(&JailSpec {
            cpu_cgroup_percent: Some(default_cpu_percent),
            ..base_spec()
        })
        .map(|()| {
            format!(
                "a CFS quota (default {default_cpu_percent}% of one CPU) and equal shares under {}",
                parent_dir_name(&parent)
            )
        })
    });
    note(Layer::CpuCgroup, unless_base(cpu_cgroup));

    let separate_user = if root {
        try_spec(&JailSpec {
            user: UserMode::SeparateUser,
            ..base_spec()
        })
        .map(|()| format!("per-run uid above {}", SandboxConfig::default().uid_base))
    } else {
        Err("needs root".to_string())
    };
    note(Layer::SeparateUser, unless_base(separate_user));

    let user_namespace = try_spec(&JailSpec {
        user: UserMode::UserNamespace,
        ..base_spec()
    })
    .map(|()| "maps the caller's uid to itself".to_string());
    let user_namespace_ok = user_namespace.is_ok();
    note(Layer::UserNamespace, unless_base(user_namespace));

    // Namespaces other than the user namespace need CAP_SYS_ADMIN: root has it, others get it
    // inside their own user namespace.
    let namespace_user = if root {
        UserMode::Caller
    } else {
        UserMode::UserNamespace
    };
    let namespace_possible = root || user_namespace_ok;
    let namespace = |set: &dyn Fn(&mut JailSpec), detail: &str| {
        if !namespace_possible {
            return Err("needs root or a user namespace".to_string());
        }
        let mut spec = JailSpec {
            user: namespace_user,
            ..base_spec()
        };
        set(&mut spec);
        try_spec(&spec).map(|()| detail.to_string())
    };
    let pid = namespace(
        &|spec| spec.pid_namespace = true,
        "own PID 1 (a minimal init); nothing outlives the program",
    );
    let network = namespace(&|spec| spec.network_namespace = true, "no interfaces");
    let mount = namespace(
        &|spec| {
            spec.mount_namespace = true;
            spec.pid_namespace = true;
        },
        "private mounts, fresh /proc",
    );
    let tmpfs = namespace(
        &|spec| {
            spec.mount_namespace = true;
            spec.pid_namespace = true;
            spec.work_dir_tmpfs_bytes = Some(1 << 20);
        },
        "size = max_disk_bytes",
    );
    let read_only = namespace(
        &|spec| {
            spec.mount_namespace = true;
            spec.pid_namespace = true;
            spec.work_dir_tmpfs_bytes = Some(1 << 20);
            spec.read_only_host = true;
        },
        "mount_setattr(/, AT_RECURSIVE, MOUNT_ATTR_RDONLY | MOUNT_ATTR_NOSUID)",
    );
    let ipc = namespace(&|spec| spec.ipc_namespace = true, "IPC and UTS");
    let pid_ok = pid.is_ok();
    note(Layer::PidNamespace, unless_base(pid));
    note(Layer::NetworkNamespace, unless_base(network));
    // The mount namespace is only used with a PID namespace (for the fresh /proc).
    note(
        Layer::MountNamespace,
        unless_base(if pid_ok {
            mount
        } else {
            Err("needs a PID namespace".into())
        }),
    );
    note(
        Layer::WorkDirTmpfs,
        unless_base(if pid_ok {
            tmpfs
        } else {
            Err("needs a mount namespace".into())
        }),
    );
    note(
        Layer::ReadOnlyHost,
        unless_base(if pid_ok {
            read_only.map_err(|error| format!("the kernel refused: {error}"))
        } else {
            Err("needs the work dir tmpfs".into())
        }),
    );
    note(Layer::IpcNamespace, unless_base(ipc));

    note(
        Layer::NoNewPrivileges,
        unless_base(
            try_spec(&JailSpec {
                no_new_privs: true,
                ..base_spec()
            })
            .map(|()| String::new()),
        ),
    );

    let landlock_abi = jail::landlock_abi_version();
    let landlock = match landlock_abi {
        None => Err("not enabled in this kernel".to_string()),
        Some(abi) => try_spec(&JailSpec {
            no_new_privs: true,
            landlock_abi: Some(abi),
            ..base_spec()
        })
        .map(|()| {
            let mut detail = format!("ABI {abi}: filesystem");
            if abi >= 4 {
                detail.push_str(", TCP bind/connect");
            }
            if abi >= 6 {
                detail.push_str(", signal and abstract-socket scoping");
            }
            detail
        }),
    };
    let landlock_ok = landlock.is_ok();
    note(Layer::Landlock, unless_base(landlock));

    let seccomp = SeccompFilters::compile(false).and_then(|filters| {
        try_spec(&JailSpec {
            no_new_privs: true,
            seccomp: Some(Arc::new(filters)),
            ..base_spec()
        })
        .map(|()| {
            "deny-list: sockets (but stream socketpairs), ptrace, mount, namespaces, bpf, io_uring, setsid, inotify, ...; ENOSYS from syscall 457 (statmount, listmount) up".to_string()
        })
    });
    note(Layer::Seccomp, unless_base(seccomp));

    let mut report = IsolationReport::new(root, entries);
    // All available layers together (what a default sandbox does) must work as well.
    if base_ok {
        let outcome = ProbeOutcome {
            report: report.clone(),
            landlock_abi: if landlock_ok { landlock_abi } else { None },
        };
        let combined =
            spec_for(&outcome, &SandboxConfig::default()).and_then(|(spec, _)| try_spec(&spec));
        if let Err(error) = combined {
            for entry in &mut report.layers {
                if !matches!(
                    entry.layer,
                    Layer::FreshWorkDir
                        | Layer::ProcessGroup
                        | Layer::ParentDeathSignal
                        | Layer::ResourceLimits
                ) {
                    entry.applied = false;
                    entry.detail = format!("works alone, fails combined: {error}");
                }
            }
            report = IsolationReport::new(root, report.layers);
        }
    }
    let mut outcome = ProbeOutcome {
        report,
        landlock_abi: if landlock_ok { landlock_abi } else { None },
    };
    // `applied` in the probe's report means: what a sandbox with the default config applies
    // (e.g. no user namespace for a root caller, who gets a separate uid instead).
    if let Ok((_, default_view)) = spec_for(&outcome, &SandboxConfig::default()) {
        let layers = outcome
            .report
            .layers
            .iter()
            .zip(default_view.layers)
            .map(|(probed, default)| LayerReport {
                applied: probed.applied && default.applied,
                ..probed.clone()
            })
            .collect();
        outcome.report = IsolationReport::new(root, layers);
    }
    outcome
}
