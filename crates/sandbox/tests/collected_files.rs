//! Reading the work dir back after a run (`Program::collect_files`): what the program wrote comes
//! back, nothing outside the dir does, and a bound passed is said, never hidden.
//!
//! Each test runs on whatever layers this machine gives (with the work dir's private tmpfs the
//! files travel through the descriptor the jail hands over; without it they are read from the
//! host dir); the test that depends on the tmpfs says "skipped" where it is not applied.

use std::time::Duration;

use stoke_sandbox::{
    ExitStatusKind, FileCollection, Incomplete, Layer, Program, Sandbox, SandboxConfig,
};

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(5),
        cpu_seconds: 5,
        memory_bytes: 512 << 20,
        workers: 4,
        ..SandboxConfig::default()
    })
    .expect("the sandbox needs at least the confined level on the test machine")
}

#[test]
fn files_written_by_a_python_program_come_back() {
    let program = Program {
        files: vec![("given.txt".to_string(), b"given".to_vec())],
        ..Program::python(
            "import os\n\
             os.makedirs('out/deep', exist_ok=True)\n\
             open('out/deep/result.txt', 'w').write('42\\n')\n\
             open('data.bin', 'wb').write(bytes(range(256)))\n\
             open('given.txt', 'a').write('+more')\n",
        )
    }
    .collecting_files(FileCollection::default());
    let result = sandbox().run_blocking(program);
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stderr_text()
    );
    let collected = result.files.expect("files were asked for");
    assert_eq!(collected.incomplete, None);
    let paths: Vec<&str> = collected.files.keys().map(String::as_str).collect();
    // The source file (main.py) is the sandbox's, not the program's.
    assert_eq!(paths, ["data.bin", "given.txt", "out/deep/result.txt"]);
    assert_eq!(collected.files["out/deep/result.txt"], b"42\n");
    assert_eq!(
        collected.files["data.bin"],
        (0..=255u8).collect::<Vec<u8>>()
    );
    assert_eq!(collected.files["given.txt"], b"given+more");
}

#[test]
fn files_are_not_read_back_unless_asked() {
    let result = sandbox().run_blocking(Program::python("open('x', 'w').write('x')"));
    assert!(result.status.success(), "{}", result.stderr_text());
    assert!(result.files.is_none());
}

#[test]
fn a_symlink_to_etc_passwd_is_not_followed() {
    let program = Program::python(
        "import os\n\
         os.symlink('/etc/passwd', 'passwd')\n\
         os.symlink('/etc', 'etc')\n\
         os.symlink('../../../../../../etc/passwd', 'relative')\n\
         open('plain.txt', 'w').write('ok')\n",
    )
    .collecting_files(FileCollection::default());
    let result = sandbox().run_blocking(program);
    assert!(result.status.success(), "{}", result.stderr_text());
    let collected = result.files.expect("files were asked for");
    assert_eq!(collected.incomplete, None);
    let paths: Vec<&str> = collected.files.keys().map(String::as_str).collect();
    assert_eq!(paths, ["plain.txt"]);
    let passwd = std::fs::read("/etc/passwd").unwrap_or_default();
    assert!(
        collected
            .files
            .values()
            .all(|contents| passwd.is_empty() || contents != &passwd)
    );
    let mut skipped: Vec<(&str, &str)> = collected
        .skipped
        .iter()
        .map(|entry| (entry.path.as_str(), entry.kind))
        .collect();
    skipped.sort();
    assert_eq!(
        skipped,
        [
            ("etc", "symlink"),
            ("passwd", "symlink"),
            ("relative", "symlink")
        ]
    );
}

#[test]
fn a_fifo_is_skipped_without_blocking() {
    let program = Program::python("import os\nos.mkfifo('pipe')\nopen('f', 'w').write('1')\n")
        .collecting_files(FileCollection::default());
    let result = sandbox().run_blocking(program);
    assert!(result.status.success(), "{}", result.stderr_text());
    let collected = result.files.expect("files were asked for");
    assert_eq!(collected.files.keys().collect::<Vec<_>>(), ["f"]);
    assert_eq!(collected.skipped.len(), 1);
    assert_eq!(collected.skipped[0].kind, "fifo");
}

#[test]
fn the_byte_bound_is_reported_and_no_partial_set_returned() {
    let program = Program::python(
        "open('small.txt', 'w').write('x')\n\
         open('big.bin', 'wb').write(b'\\0' * 300_000)\n",
    )
    .collecting_files(FileCollection {
        max_files: 16,
        max_bytes: 100_000,
    });
    let result = sandbox().run_blocking(program);
    assert!(result.status.success(), "{}", result.stderr_text());
    let collected = result.files.expect("files were asked for");
    assert_eq!(
        collected.incomplete,
        Some(Incomplete::TooManyBytes { limit: 100_000 })
    );
    assert!(collected.files.is_empty());
}

#[test]
fn the_file_count_bound_is_reported() {
    let program = Program::python("for i in range(20):\n    open(f'f{i}', 'w').write('x')\n")
        .collecting_files(FileCollection {
            max_files: 5,
            max_bytes: 1 << 20,
        });
    let result = sandbox().run_blocking(program);
    assert!(result.status.success(), "{}", result.stderr_text());
    let collected = result.files.expect("files were asked for");
    assert_eq!(
        collected.incomplete,
        Some(Incomplete::TooManyFiles { limit: 5 })
    );
    assert!(collected.files.is_empty());
}

#[test]
fn files_the_program_made_unreadable_still_come_back() {
    let program = Program::python(
        "import os\n\
         os.mkdir('locked')\n\
         open('locked/f', 'w').write('kept')\n\
         os.chmod('locked/f', 0)\n\
         os.chmod('locked', 0)\n",
    )
    .collecting_files(FileCollection::default());
    let result = sandbox().run_blocking(program);
    assert!(result.status.success(), "{}", result.stderr_text());
    let collected = result.files.expect("files were asked for");
    assert_eq!(collected.incomplete, None, "{:?}", collected.skipped);
    assert_eq!(collected.files["locked/f"], b"kept");
}

#[test]
fn files_of_a_timed_out_run_come_back_too() {
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_millis(800),
        cpu_seconds: 5,
        workers: 2,
        ..SandboxConfig::default()
    })
    .expect("the sandbox needs at least the confined level on the test machine");
    let program = Program::python(
        "open('progress.txt', 'w').write('started')\n\
         while True:\n    pass\n",
    )
    .collecting_files(FileCollection::default());
    let result = sandbox.run_blocking(program);
    assert_eq!(result.status, ExitStatusKind::TimedOut);
    let collected = result.files.expect("files were asked for");
    assert_eq!(collected.files["progress.txt"], b"started");
}

#[test]
fn the_tmpfs_work_dir_is_read_through_the_handed_over_descriptor() {
    let sandbox = sandbox();
    if !sandbox.isolation().applies(Layer::WorkDirTmpfs) {
        eprintln!("skipped: the work dir's tmpfs is not applied here");
        return;
    }
    // On the tmpfs the host dir stays empty; the file can only come through the descriptor.
    let program = Program::bash("echo inside > made_in_tmpfs.txt")
        .collecting_files(FileCollection::default());
    let result = sandbox.run_blocking(program);
    assert!(result.status.success(), "{}", result.stderr_text());
    let collected = result.files.expect("files were asked for");
    assert_eq!(collected.files["made_in_tmpfs.txt"], b"inside\n");
}
