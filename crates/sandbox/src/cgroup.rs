//! Cgroups per run: a memory cgroup, so the run as a whole (all its processes and its tmpfs work
//! dir) cannot use more than a set amount of memory (rlimits only bound each process), and a CPU
//! cgroup, so the run as a whole gets at most `max_cpu_percent` of one CPU and an equal share
//! against concurrent runs however many processes it starts (a hostile run's children cannot
//! starve an honest run into a time-out).
//!
//! Created under the caller's own cgroup of each controller: cgroup v1 (`memory`, `cpu`
//! hierarchies) or cgroup v2 when the caller's cgroup delegates the controller to children
//! (then one run cgroup carries both limits). That needs write access there: in practice root.
//! The jail child moves itself into every run cgroup (writes `0` to each `cgroup.procs`) before
//! anything else, so every process of the run is charged. Removed after the run.
//!
//! Not here: whether a controller is used (probe/sandbox); reporting OOM kills (they show as
//! `Signaled(9)`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Which cgroup interface a parent directory speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// A controller the sandbox limits runs with.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Controller {
    Memory,
    Cpu,
}

impl Controller {
    /// The controller's name in `/proc/self/cgroup` and `cgroup.subtree_control`.
    fn name(self) -> &'static str {
        match self {
            Controller::Memory => "memory",
            Controller::Cpu => "cpu",
        }
    }

    /// A file that exists in a v1 cgroup directory of this controller.
    fn v1_marker(self) -> &'static str {
        match self {
            Controller::Memory => "memory.limit_in_bytes",
            Controller::Cpu => "cpu.cfs_quota_us",
        }
    }
}

/// The caller's cgroup of one controller, under which run cgroups are made.
#[derive(Debug, Clone)]
pub(crate) struct CgroupParent {
    dir: PathBuf,
    version: Version,
}

/// Finds the caller's cgroup directory for `controller`.
pub(crate) fn discover(controller: Controller) -> Result<CgroupParent, String> {
    let table = std::fs::read_to_string("/proc/self/cgroup")
        .map_err(|error| format!("reading /proc/self/cgroup: {error}"))?;
    for line in table.lines() {
        let mut fields = line.splitn(3, ':');
        let (Some(_id), Some(controllers), Some(path)) =
            (fields.next(), fields.next(), fields.next())
        else {
            continue;
        };
        let relative = path.trim_start_matches('/');
        if controllers.split(',').any(|name| name == controller.name()) {
            // v1 hierarchies are mounted under their controller's name, or under the joined
            // list (`cpu,cpuacct`) with the single name as a symlink.
            for mount in [controller.name(), controllers] {
                let dir = Path::new("/sys/fs/cgroup").join(mount).join(relative);
                if dir.join(controller.v1_marker()).exists() {
                    return Ok(CgroupParent {
                        dir,
                        version: Version::V1,
                    });
                }
            }
        }
        if controllers.is_empty() {
            let dir = Path::new("/sys/fs/cgroup").join(relative);
            let delegated = std::fs::read_to_string(dir.join("cgroup.subtree_control"))
                .map(|list| {
                    list.split_whitespace()
                        .any(|name| name == controller.name())
                })
                .unwrap_or(false);
            if delegated {
                return Ok(CgroupParent {
                    dir,
                    version: Version::V2,
                });
            }
        }
    }
    Err(format!(
        "no writable {} cgroup for this process",
        controller.name()
    ))
}

impl CgroupParent {
    /// The caller's cgroup directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }
}

/// The limits of one run's cgroups.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RunLimits {
    /// Memory of the whole run (swap included where the kernel accounts it).
    pub(crate) memory_bytes: Option<u64>,
    /// CPU time of the whole run per period, in percent of one CPU.
    pub(crate) cpu_percent: Option<u32>,
}

/// The parents a sandbox makes run cgroups under.
#[derive(Debug, Clone, Default)]
pub(crate) struct CgroupParents {
    pub(crate) memory: Option<CgroupParent>,
    pub(crate) cpu: Option<CgroupParent>,
}

/// The CFS period of the CPU limit (the kernel's default, 100 ms).
const CPU_PERIOD_MICROS: u64 = 100_000;

impl CgroupParents {
    /// Finds the parents of the controllers `limits` uses.
    pub(crate) fn discover(limits: RunLimits) -> Result<CgroupParents, String> {
        Ok(CgroupParents {
            memory: match limits.memory_bytes {
                Some(_) => Some(discover(Controller::Memory)?),
                None => None,
            },
            cpu: match limits.cpu_percent {
                Some(_) => Some(discover(Controller::Cpu)?),
                None => None,
            },
        })
    }

    /// Makes the run's cgroups: one per v1 hierarchy, one for every controller under the same
    /// v2 parent (a process belongs to one v2 cgroup only).
    pub(crate) fn create(&self, limits: RunLimits) -> Result<RunCgroups, String> {
        let mut run = RunCgroups { dirs: Vec::new() };
        let mut wanted: Vec<(&CgroupParent, Controller)> = Vec::new();
        if let (Some(parent), Some(_)) = (&self.memory, limits.memory_bytes) {
            wanted.push((parent, Controller::Memory));
        }
        if let (Some(parent), Some(_)) = (&self.cpu, limits.cpu_percent) {
            wanted.push((parent, Controller::Cpu));
        }
        let mut made: Vec<(PathBuf, PathBuf)> = Vec::new();
        for (parent, controller) in wanted {
            let shared = (parent.version == Version::V2)
                .then(|| made.iter().find(|(dir, _)| *dir == parent.dir))
                .flatten()
                .map(|(_, run_dir)| run_dir.clone());
            let dir = match shared {
                Some(dir) => dir,
                None => {
                    let dir = parent.dir.join(run_cgroup_name());
                    std::fs::create_dir(&dir)
                        .map_err(|error| format!("creating cgroup {}: {error}", dir.display()))?;
                    run.dirs.push(dir.clone());
                    made.push((parent.dir.clone(), dir.clone()));
                    dir
                }
            };
            let write = |file: &str, value: &str| {
                std::fs::write(dir.join(file), value)
                    .map_err(|error| format!("writing {}/{file}: {error}", dir.display()))
            };
            match (controller, parent.version) {
                (Controller::Memory, version) => {
                    let bytes = limits.memory_bytes.unwrap_or(u64::MAX).to_string();
                    if version == Version::V1 {
                        write("memory.limit_in_bytes", &bytes)?;
                        // Only where swap accounting is on; the plain limit holds either way.
                        let _ = write("memory.memsw.limit_in_bytes", &bytes);
                    } else {
                        write("memory.max", &bytes)?;
                        let _ = write("memory.swap.max", "0");
                    }
                }
                (Controller::Cpu, version) => {
                    let quota =
                        u64::from(limits.cpu_percent.unwrap_or(100)) * CPU_PERIOD_MICROS / 100;
                    if version == Version::V1 {
                        write("cpu.cfs_period_us", &CPU_PERIOD_MICROS.to_string())?;
                        write("cpu.cfs_quota_us", &quota.to_string())?;
                    } else {
                        write("cpu.max", &format!("{quota} {CPU_PERIOD_MICROS}"))?;
                    }
                }
            }
        }
        Ok(run)
    }
}

fn run_cgroup_name() -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    format!(
        "stoke-sandbox-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// One run's cgroups; removed on drop (after the run's processes are gone).
#[derive(Debug)]
pub(crate) struct RunCgroups {
    dirs: Vec<PathBuf>,
}

impl RunCgroups {
    /// The `cgroup.procs` paths the jail child writes itself into.
    pub(crate) fn procs_paths(&self) -> Result<Vec<CString>, String> {
        self.dirs
            .iter()
            .map(|dir| {
                CString::new(dir.join("cgroup.procs").as_os_str().as_bytes())
                    .map_err(|_| "cgroup path holds a NUL byte".to_string())
            })
            .collect()
    }
}

impl Drop for RunCgroups {
    fn drop(&mut self) {
        for dir in &self.dirs {
            // Empty once the run's last process is reaped; a few retries cover the kernel's lag
            // in uncharging exited tasks.
            for _ in 0..20 {
                if std::fs::remove_dir(dir).is_ok() {
                    break;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
            }
        }
    }
}
