//! Helpers shared by the hostile-program suites (`adversarial.rs`, `redteam.rs`): a unique marker
//! per program, and a `/proc` scan for processes that still carry it.

use std::sync::atomic::{AtomicU64, Ordering};
use std::time::{SystemTime, UNIX_EPOCH};

/// A marker unique to this process and call, `stoke-{suite}-{name}-...`; programs take it as their
/// first argument so their processes (forks included) carry it in `/proc/<pid>/cmdline`.
pub fn marker(suite: &str, name: &str) -> String {
    static COUNTER: AtomicU64 = AtomicU64::new(0);
    let nanos = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|elapsed| elapsed.subsec_nanos())
        .unwrap_or(0);
    format!(
        "stoke-{suite}-{name}-{}-{nanos}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    )
}

/// Pids of live processes whose command line holds `marker`.
pub fn processes_with(marker: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .map(|cmdline| {
                    cmdline
                        .windows(marker.len())
                        .any(|window| window == marker.as_bytes())
                })
                .unwrap_or(false)
        })
        .collect()
}
