//! Hostile programs: each must be contained (the program fails or is stopped), leave no process
//! and no file behind, and leave the test process unaffected.
//!
//! Every program gets a unique marker as its first argument; its processes (forks included) carry
//! it in `/proc/<pid>/cmdline`, so "nothing survives" is checked by scanning `/proc` for it right
//! after the run returns.

use std::net::TcpListener;
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use common::processes_with;
use stoke_sandbox::{ExecResult, ExitStatusKind, Language, Program, Sandbox, SandboxConfig};

const WALL: Duration = Duration::from_millis(1500);

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        wall_timeout: WALL,
        cpu_seconds: 1,
        memory_bytes: 256 << 20,
        max_processes: 16,
        max_output_bytes: 64 << 10,
        workers: 8,
        ..SandboxConfig::default()
    })
    .expect("the test machine gives at least the confined level")
}

fn marker(name: &str) -> String {
    common::marker("adversarial", name)
}

/// Runs `source` with the marker as argument and checks that nothing of it survives.
fn run_contained(name: &str, language: Language, source: &str, extra_args: &[&str]) -> ExecResult {
    let marker = marker(name);
    let mut args = vec![marker.clone()];
    args.extend(extra_args.iter().map(|arg| arg.to_string()));
    let started = Instant::now();
    let result = sandbox().run_blocking(Program {
        language,
        source: source.to_string(),
        args,
        ..Program::default()
    });
    let elapsed = started.elapsed();
    let survivors = processes_with(&marker);
    assert!(
        survivors.is_empty(),
        "{name}: processes survived the run: {survivors:?}"
    );
    assert!(
        elapsed < WALL + Duration::from_secs(3),
        "{name}: the run took {elapsed:?}"
    );
    result
}

fn assert_failed(name: &str, result: &ExecResult) {
    assert!(
        !result.status.success(),
        "{name}: the program should not succeed: {:?}, stdout {:?}",
        result.status,
        result.stdout_text()
    );
    assert!(
        !matches!(result.status, ExitStatusKind::SandboxError(_)),
        "{name}: the sandbox itself failed: {:?}",
        result.status
    );
}

#[test]
fn python_fork_bomb_is_contained() {
    let source =
        "import os\nwhile True:\n    try:\n        os.fork()\n    except OSError:\n        pass\n";
    let result = run_contained("forkbomb", Language::Python, source, &[]);
    assert_failed("fork bomb", &result);
    // The caller can still start processes.
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn bash_fork_bomb_is_contained() {
    // The foreground form: every level waits for its two children, so the bomb keeps growing
    // until the process limit stops it and the wall clock ends it.
    let result = run_contained(
        "bashbomb",
        Language::Bash,
        "bomb() { bomb | bomb; }\nbomb\n",
        &[],
    );
    assert_failed("bash fork bomb", &result);
    assert!(
        std::process::Command::new("true")
            .status()
            .unwrap()
            .success()
    );
}

#[test]
fn memory_hog_fails_with_memory_error() {
    let source = "chunks = []\nwhile True:\n    chunks.append(bytearray(16 << 20))\n";
    let result = run_contained("memhog", Language::Python, source, &[]);
    assert_eq!(result.status, ExitStatusKind::Exited(1));
    assert!(
        result.stderr_text().contains("MemoryError"),
        "{}",
        result.stderr_text()
    );
}

#[test]
fn infinite_loop_hits_the_cpu_limit() {
    let result = run_contained("spin", Language::Python, "while True:\n    pass\n", &[]);
    assert!(
        matches!(
            result.status,
            ExitStatusKind::CpuLimit | ExitStatusKind::TimedOut
        ),
        "{:?}",
        result.status
    );
}

#[test]
fn sleeping_program_hits_the_wall_clock_limit() {
    let result = run_contained(
        "sleep",
        Language::Python,
        "import time\ntime.sleep(60)\n",
        &[],
    );
    assert_eq!(result.status, ExitStatusKind::TimedOut);
    assert!(result.wall_time >= WALL);
}

#[test]
fn spinning_child_that_ignores_sigterm_is_killed() {
    let source = "import os, signal, time\n\
        if os.fork() == 0:\n    signal.signal(signal.SIGTERM, signal.SIG_IGN)\n    while True:\n        pass\n\
        time.sleep(60)\n";
    let result = run_contained("sigterm", Language::Python, source, &[]);
    assert!(
        matches!(
            result.status,
            ExitStatusKind::TimedOut | ExitStatusKind::CpuLimit
        ),
        "{:?}",
        result.status
    );
}

#[test]
fn hundred_megabytes_of_output_are_cut_at_the_cap() {
    let source =
        "import sys\nblock = 'x' * (1 << 20)\nfor _ in range(100):\n    sys.stdout.write(block)\n";
    let started = Instant::now();
    let result = run_contained("flood", Language::Python, source, &[]);
    assert_eq!(result.status, ExitStatusKind::OutputLimit);
    assert!(result.stdout_truncated);
    assert_eq!(result.stdout.len(), 64 << 10);
    assert!(
        started.elapsed() < WALL,
        "the cap should stop the run early"
    );
}

#[test]
fn tcp_connect_to_a_local_listener_fails() {
    let listener = TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port().to_string();
    let source = "import socket, sys\n\
        try:\n    socket.create_connection(('127.0.0.1', int(sys.argv[2])), timeout=1)\n    print('CONNECTED')\n\
        except OSError as error:\n    print('BLOCKED', error)\n    sys.exit(3)\n";
    let result = run_contained("network", Language::Python, source, &[&port]);
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(3),
        "{}",
        result.stdout_text()
    );
    assert!(result.stdout_text().starts_with("BLOCKED"));
    assert!(
        listener.accept().is_err(),
        "a connection reached the listener"
    );
}

#[test]
fn writes_outside_the_work_dir_are_denied() {
    let name = marker("escape");
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_string());
    let targets = [
        format!("{home}/{name}"),
        format!("/tmp/{name}"),
        format!("{}/{name}", std::env::temp_dir().display()),
    ];
    let source = "import sys\n\
        denied = 0\n\
        for path in sys.argv[2:]:\n    try:\n        open(path, 'w').write('x')\n        print('WROTE', path)\n    except OSError:\n        denied += 1\n\
        open('inside.txt', 'w').write('fine')\n\
        print(open('inside.txt').read())\n\
        sys.exit(0 if denied == len(sys.argv) - 2 else 1)\n";
    let args: Vec<&str> = targets.iter().map(String::as_str).collect();
    let result = run_contained("escape", Language::Python, source, &args);
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stdout_text()
    );
    assert_eq!(result.stdout_text(), "fine\n");
    for target in &targets {
        assert!(!Path::new(target).exists(), "{target} was written");
    }
}

#[test]
fn files_outside_the_work_dir_are_unreadable() {
    let secret_dir = tempfile::tempdir().unwrap();
    let secret = secret_dir.path().join("secret.txt");
    std::fs::write(&secret, "stoke-file-secret").unwrap();
    let home = std::env::var("HOME").unwrap_or_else(|_| "/root".to_string());
    let source = "import os, sys\n\
        leaked = []\n\
        try:\n    leaked.append(open(sys.argv[2]).read())\nexcept OSError:\n    pass\n\
        try:\n    leaked.append(str(os.listdir(sys.argv[3])))\nexcept OSError:\n    pass\n\
        print(leaked)\n";
    let secret_path = secret.display().to_string();
    let result = run_contained("read", Language::Python, source, &[&secret_path, &home]);
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stderr_text()
    );
    assert_eq!(result.stdout_text(), "[]\n");
}

#[test]
fn exit_codes_are_reported_exactly() {
    let early_exit = run_contained(
        "exit0",
        Language::Python,
        "import sys\nsys.exit(0)\nassert False\n",
        &[],
    );
    assert_eq!(early_exit.status, ExitStatusKind::Exited(0));
    let seven = run_contained("exit7", Language::Python, "import sys\nsys.exit(7)\n", &[]);
    assert_eq!(seven.status, ExitStatusKind::Exited(7));
    let failed_assert = run_contained("assert", Language::Python, "assert 1 == 2\n", &[]);
    assert_eq!(failed_assert.status, ExitStatusKind::Exited(1));
    let bash = run_contained("bash42", Language::Bash, "exit 42\n", &[]);
    assert_eq!(bash.status, ExitStatusKind::Exited(42));
}

#[test]
fn signals_the_program_sends_itself_are_reported() {
    let result = run_contained(
        "selfkill",
        Language::Python,
        "import os, signal\nos.kill(os.getpid(), signal.SIGKILL)\nprint('still alive')\n",
        &[],
    );
    assert_eq!(result.status, ExitStatusKind::Signaled(9));
    assert!(result.stdout.is_empty());
}

#[test]
fn killing_the_parent_does_not_reach_the_caller() {
    let source = "import os, signal\n\
        for pid in (os.getppid(), 1, -1, 0):\n    try:\n        os.kill(pid, signal.SIGKILL)\n    except OSError:\n        pass\n\
        print('done')\n";
    let result = run_contained("killparent", Language::Python, source, &[]);
    // kill(0) and kill(-1) may take the program down with its own group; either way the test
    // process (which is running this assertion) survived.
    assert!(!matches!(result.status, ExitStatusKind::SandboxError(_)));
    let after = sandbox().run_blocking(Program::python("print(2)"));
    assert_eq!(after.stdout, b"2\n");
}

#[test]
fn daemon_holding_the_output_pipe_is_killed() {
    let source = "import os, sys, time\n\
        if os.fork() == 0:\n    os.setsid()\n    if os.fork() == 0:\n        while True:\n            print('daemon', flush=True)\n            time.sleep(0.05)\n    os._exit(0)\n\
        print('parent exits')\n";
    let started = Instant::now();
    let result = run_contained("daemon", Language::Python, source, &[]);
    assert!(started.elapsed() < WALL + Duration::from_secs(1));
    assert!(result.stdout_text().contains("parent exits"));
}

/// Zombie children of this test process (a leaked supervisor would show up here).
fn zombie_children_of_this_process() -> Vec<u32> {
    let me = std::process::id().to_string();
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|entry| entry.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
            let field = |name: &str| {
                status
                    .lines()
                    .find_map(|line| line.strip_prefix(name))
                    .map(|value| value.trim().to_string())
                    .unwrap_or_default()
            };
            field("State:").starts_with('Z') && field("PPid:") == me
        })
        .collect()
}

#[test]
fn zombies_are_reaped() {
    let source = "import os, time\n\
        for _ in range(5):\n    if os.fork() == 0:\n        os._exit(0)\n\
        time.sleep(60)\n";
    let result = run_contained("zombie", Language::Python, source, &[]);
    assert_eq!(result.status, ExitStatusKind::TimedOut);
    assert_eq!(zombie_children_of_this_process(), Vec::<u32>::new());
}

#[test]
fn the_environment_holds_only_the_sandbox_variables() {
    let source = "import os\nprint(sorted(os.environ))\n";
    let result = run_contained("env", Language::Python, source, &[]);
    assert_eq!(
        result.stdout_text(),
        "['HOME', 'LANG', 'LC_ALL', 'PATH', 'PYTHONDONTWRITEBYTECODE', 'TMPDIR']\n"
    );
}

#[test]
fn nothing_is_left_in_the_work_root() {
    let work_root = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: WALL,
        work_root: work_root.path().to_path_buf(),
        ..SandboxConfig::default()
    })
    .unwrap();
    let result = sandbox.run_blocking(Program::python(
        "import os\nos.makedirs('a/b')\nopen('a/b/c', 'w').write('x')\nos.chmod('a', 0)\n",
    ));
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stderr_text()
    );
    assert_eq!(std::fs::read_dir(work_root.path()).unwrap().count(), 0);
}

#[test]
fn process_limit_holds_even_for_a_root_caller() {
    // Children sleep so they stay counted; the parent counts successful forks until refused.
    let source = "import os, sys, time\n\
        count = 0\n\
        while count < 200:\n    try:\n        pid = os.fork()\n    except OSError:\n        break\n    if pid == 0:\n        time.sleep(30)\n        os._exit(0)\n    count += 1\n\
        print(count)\n";
    let result = run_contained("nproc", Language::Python, source, &[]);
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stderr_text()
    );
    let forks: u32 = result.stdout_text().trim().parse().unwrap();
    // max_processes is 16 and the program itself counts.
    assert!(forks < 16, "{forks} forks succeeded");
}

#[test]
fn filling_the_disk_stops_at_the_work_dir_quota() {
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(5),
        max_disk_bytes: 24 << 20,
        max_file_bytes: 8 << 20,
        ..SandboxConfig::default()
    })
    .unwrap();
    if !sandbox
        .isolation()
        .applies(stoke_sandbox::Layer::WorkDirTmpfs)
    {
        // Without the tmpfs layer only the per-file limit applies; nothing to measure here.
        return;
    }
    let source = "import errno, sys\n\
        written = 0\n\
        block = b'x' * (1 << 20)\n\
        for index in range(1000):\n    try:\n        with open(f'fill{index}', 'wb') as out:\n            for _ in range(4):\n                out.write(block)\n                out.flush()\n                written += len(block)\n    except OSError as error:\n        print(written >> 20, errno.errorcode[error.errno])\n        sys.exit(0)\n\
        print(written >> 20, 'no error')\n";
    let result = sandbox.run_blocking(Program::python(source));
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stderr_text()
    );
    let stdout = result.stdout_text();
    let mut fields = stdout.split_whitespace();
    let mebibytes: u64 = fields.next().unwrap().parse().unwrap();
    assert!(mebibytes <= 24, "{stdout}");
    assert_eq!(fields.next(), Some("ENOSPC"), "{stdout}");
}

#[test]
fn memory_spread_over_processes_is_bounded_by_the_run_cgroup() {
    // Eight children each touch 96 MiB: every one is under the 128 MiB per-process limit, the
    // sum (768 MiB) is far over the run's 128 + 16 MiB cgroup.
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(10),
        memory_bytes: 128 << 20,
        max_disk_bytes: 16 << 20,
        max_processes: 16,
        ..SandboxConfig::default()
    })
    .unwrap();
    if !sandbox
        .isolation()
        .applies(stoke_sandbox::Layer::MemoryCgroup)
    {
        // Needs write access to this process's memory cgroup (root); RLIMIT_AS still applies.
        return;
    }
    let source = "import os, time\n\
        children = []\n\
        for _ in range(8):\n    pid = os.fork()\n    if pid == 0:\n        block = b'x' * (96 << 20)\n        time.sleep(1.5)\n        os._exit(0)\n    children.append(pid)\n\
        survived = sum(1 for pid in children if os.waitpid(pid, 0)[1] == 0)\n\
        print(survived)\n";
    let result = sandbox.run_blocking(Program::python(source));
    let survived: u32 = result.stdout_text().trim().parse().unwrap_or(0);
    assert!(
        survived < 8,
        "all eight 96 MiB children survived: {:?} {}",
        result.status,
        result.stderr_text()
    );
}
