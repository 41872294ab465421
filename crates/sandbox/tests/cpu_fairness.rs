//! CPU fairness between runs (issue 11's finding 4): a hostile run that starts many spinning
//! children, each trying to lead a session of its own (a new scheduler autogroup), must not
//! starve an honest run on the same machine into a time-out, which would score the honest
//! sample 0 and soften the hostile one's negative advantage in its group.
//!
//! One test in its own binary, so no other test of this crate competes for the CPU. The margins
//! are wide: the honest run needs about 0.4 s of CPU and gets 8 s of wall clock; starved to its
//! share among 16 autogroups on two cores it would need well over that.

use std::time::{Duration, Instant};

use stoke_sandbox::{ExitStatusKind, Layer, Program, Sandbox, SandboxConfig};

/// Forks 15 children that each try `setsid` and spin until the wall clock ends the run.
const HOSTILE: &str = r#"
import os, time
for _ in range(15):
    if os.fork() == 0:
        try:
            os.setsid()
        except OSError:
            pass
        while True:
            pass
while True:
    pass
"#;

/// A fixed amount of CPU work (about 0.3-0.5 s on the development machine), then its own CPU
/// time.
const HONEST: &str = r#"
import time
start = time.process_time()
total = 0
for i in range(6_000_000):
    total += i & 7
print(total, round(time.process_time() - start, 3))
"#;

#[test]
fn a_hostile_run_does_not_starve_a_concurrent_honest_run() {
    let hostile_sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(4),
        cpu_seconds: 20,
        max_processes: 32,
        workers: 1,
        ..SandboxConfig::default()
    })
    .unwrap();
    let honest_sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(8),
        workers: 1,
        ..SandboxConfig::default()
    })
    .unwrap();
    let layers = hostile_sandbox.isolation();
    if !layers.applies(Layer::CpuCgroup) && !layers.applies(Layer::Seccomp) {
        eprintln!("skipped: neither a CPU cgroup nor seccomp (which refuses setsid) applies here");
        return;
    }
    // Alone first: what the honest run costs on this machine right now.
    let alone = honest_sandbox.run_blocking(Program::python(HONEST));
    assert_eq!(
        alone.status,
        ExitStatusKind::Exited(0),
        "{}",
        alone.stderr_text()
    );

    let hostile =
        std::thread::spawn(move || hostile_sandbox.run_blocking(Program::python(HOSTILE)));
    // Let the hostile run start its children.
    std::thread::sleep(Duration::from_millis(800));
    let started = Instant::now();
    let honest = honest_sandbox.run_blocking(Program::python(HONEST));
    let contended = started.elapsed();
    let hostile = hostile.join().unwrap();
    eprintln!(
        "honest run alone {:?} wall, beside the hostile run {contended:?} wall; hostile ended {:?}",
        alone.wall_time, hostile.status
    );
    assert_eq!(
        honest.status,
        ExitStatusKind::Exited(0),
        "the honest run was starved: {:?} after {contended:?}; {}",
        honest.status,
        honest.stderr_text()
    );
    let total = |text: String| text.split_whitespace().next().map(str::to_string);
    assert_eq!(total(honest.stdout_text()), total(alone.stdout_text()));
    // With fair sharing the honest run gets about one of the two cores; unfairly it would get
    // two sixteenths. Allow four times its solo time (plus start-up noise).
    assert!(
        contended < alone.wall_time * 4 + Duration::from_millis(500),
        "the honest run took {contended:?} beside the hostile run, {:?} alone",
        alone.wall_time
    );
    assert!(
        !matches!(hostile.status, ExitStatusKind::Exited(0)),
        "the hostile run should have been stopped: {:?}",
        hostile.status
    );
}

/// This process's own CPU time (user + system, all threads), from `/proc/self/stat`.
fn own_cpu_time() -> Duration {
    let stat = std::fs::read_to_string("/proc/self/stat").unwrap();
    // Fields after the parenthesised command name; utime and stime are fields 14 and 15.
    let fields: Vec<&str> = stat[stat.rfind(')').unwrap() + 2..].split(' ').collect();
    let ticks: u64 = fields[11].parse::<u64>().unwrap() + fields[12].parse::<u64>().unwrap();
    // USER_HZ is 100 on every Linux architecture this crate supports.
    Duration::from_millis(ticks * 10)
}

#[test]
fn output_written_a_byte_at_a_time_does_not_spend_the_callers_cpu() {
    // Found by the red-team: one-byte writes on both streams woke the caller's runtime for
    // every byte, so most of the run's CPU was spent by the caller, outside the run's cgroup.
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(10),
        workers: 1,
        ..SandboxConfig::default()
    })
    .unwrap();
    let trickle = r#"
import os, time
end = time.monotonic() + 2.0
pid = os.fork()
fd = 1 if pid else 2
n = 0
while time.monotonic() < end and n < 400000:
    os.write(fd, b'x')
    n += 1
if pid:
    os.waitpid(pid, 0)
"#;
    let before = own_cpu_time();
    let result = sandbox.run_blocking(Program::python(trickle));
    let spent = own_cpu_time() - before;
    eprintln!(
        "caller CPU {spent:?} over a {:?} run ({} + {} bytes captured)",
        result.wall_time,
        result.stdout.len(),
        result.stderr.len()
    );
    assert!(result.stdout.len() > 1000, "{:?}", result.status);
    assert!(
        spent < result.wall_time / 4,
        "the caller spent {spent:?} of CPU on a {:?} run's output",
        result.wall_time
    );
}
