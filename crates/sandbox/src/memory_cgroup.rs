//! A memory cgroup per run, so the run as a whole (all its processes and its tmpfs work dir)
//! cannot use more than a set amount of memory; rlimits only bound each process.
//!
//! Created under the caller's own memory cgroup (cgroup v1 `memory` hierarchy, or cgroup v2 when
//! the caller's cgroup already delegates the `memory` controller to children), which needs write
//! access there: in practice root. The jail child moves itself in (writes `0` to `cgroup.procs`)
//! before anything else, so every process of the run is charged to it. Removed after the run.
//!
//! Not here: whether it is used (probe/sandbox); reporting OOM kills (they show as `Signaled(9)`).

use std::ffi::CString;
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};

/// Which cgroup interface the parent directory speaks.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Version {
    V1,
    V2,
}

/// The caller's memory cgroup, under which run cgroups are made.
#[derive(Debug, Clone)]
pub(crate) struct CgroupParent {
    dir: PathBuf,
    version: Version,
}

/// Finds the caller's memory cgroup directory.
pub(crate) fn discover() -> Result<CgroupParent, String> {
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
        if controllers.split(',').any(|name| name == "memory") {
            let dir = Path::new("/sys/fs/cgroup/memory").join(relative);
            if dir.join("memory.limit_in_bytes").exists() {
                return Ok(CgroupParent {
                    dir,
                    version: Version::V1,
                });
            }
        }
        if controllers.is_empty() {
            let dir = Path::new("/sys/fs/cgroup").join(relative);
            let delegated = std::fs::read_to_string(dir.join("cgroup.subtree_control"))
                .map(|list| list.split_whitespace().any(|name| name == "memory"))
                .unwrap_or(false);
            if delegated {
                return Ok(CgroupParent {
                    dir,
                    version: Version::V2,
                });
            }
        }
    }
    Err("no writable memory cgroup for this process".to_string())
}

/// One run's cgroup; removed on drop (after the run's processes are gone).
#[derive(Debug)]
pub(crate) struct RunCgroup {
    dir: PathBuf,
}

impl CgroupParent {
    /// The caller's cgroup directory.
    pub(crate) fn dir(&self) -> &Path {
        &self.dir
    }

    /// Makes a cgroup limited to `limit_bytes` (swap included where the kernel accounts it).
    pub(crate) fn create(&self, limit_bytes: u64) -> Result<RunCgroup, String> {
        static COUNTER: AtomicU64 = AtomicU64::new(0);
        let name = format!(
            "stoke-sandbox-{}-{}",
            std::process::id(),
            COUNTER.fetch_add(1, Ordering::Relaxed)
        );
        let dir = self.dir.join(name);
        std::fs::create_dir(&dir)
            .map_err(|error| format!("creating cgroup {}: {error}", dir.display()))?;
        let run = RunCgroup { dir };
        let write = |file: &str, value: &str| {
            std::fs::write(run.dir.join(file), value)
                .map_err(|error| format!("writing {}/{file}: {error}", run.dir.display()))
        };
        match self.version {
            Version::V1 => {
                write("memory.limit_in_bytes", &limit_bytes.to_string())?;
                // Only where swap accounting is on; the plain limit holds either way.
                let _ = write("memory.memsw.limit_in_bytes", &limit_bytes.to_string());
            }
            Version::V2 => {
                write("memory.max", &limit_bytes.to_string())?;
                let _ = write("memory.swap.max", "0");
            }
        }
        Ok(run)
    }
}

impl RunCgroup {
    /// The `cgroup.procs` path the jail child writes itself into.
    pub(crate) fn procs_path(&self) -> Result<CString, String> {
        CString::new(self.dir.join("cgroup.procs").as_os_str().as_bytes())
            .map_err(|_| "cgroup path holds a NUL byte".to_string())
    }
}

impl Drop for RunCgroup {
    fn drop(&mut self) {
        // Empty once the run's last process is reaped; a few retries cover the kernel's lag in
        // uncharging exited tasks.
        for _ in 0..20 {
            if std::fs::remove_dir(&self.dir).is_ok() {
                return;
            }
            std::thread::sleep(std::time::Duration::from_millis(5));
        }
    }
}
