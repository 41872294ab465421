//! The host stays unchanged and unobserved by a run (issue 11's findings 3 and 5): metadata
//! writes outside the work dir (`utime`, `chmod`, `chown`, `setxattr`), which Landlock does not
//! govern, fail on the read-only host view; the mount table (`listmount`/`statmount`), inotify
//! watches on host directories and new sessions are refused by seccomp.
//!
//! Each probe prints `CHANGED ...` or `LEAK ...` when it succeeds; the tests also compare the
//! host file's metadata before and after.

use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;
use std::time::Duration;

use stoke_sandbox::{ExecResult, ExitStatusKind, Layer, Program, Sandbox, SandboxConfig};

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(5),
        cpu_seconds: 3,
        memory_bytes: 256 << 20,
        workers: 2,
        ..SandboxConfig::default()
    })
    .expect("the test machine gives at least the confined level")
}

fn run(source: &str, args: &[&str]) -> ExecResult {
    let mut program = Program::python(source);
    program.args = args.iter().map(|arg| arg.to_string()).collect();
    let result = sandbox().run_blocking(program);
    assert!(
        !matches!(result.status, ExitStatusKind::SandboxError(_)),
        "the sandbox itself failed: {:?} {}",
        result.status,
        result.stderr_text()
    );
    if std::env::var_os("STOKE_REDTEAM_VERBOSE").is_some() {
        eprintln!("{}{}", result.stdout_text(), result.stderr_text());
    }
    result
}

/// What a run could change of a file: mode, owner, times, extended attributes.
#[derive(Debug, PartialEq, Eq)]
struct Snapshot {
    mode: u32,
    uid: u32,
    gid: u32,
    mtime_ns: i128,
    atime_ns: i128,
    xattrs: Vec<String>,
}

fn snapshot(path: &Path) -> Snapshot {
    let meta = std::fs::symlink_metadata(path).unwrap();
    let listing = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sys\ntry:\n    print(' '.join(sorted(os.listxattr(sys.argv[1]))))\nexcept OSError:\n    print('')",
        ])
        .arg(path)
        .output()
        .map(|out| String::from_utf8_lossy(&out.stdout).trim().to_string())
        .unwrap_or_default();
    Snapshot {
        mode: meta.mode(),
        uid: meta.uid(),
        gid: meta.gid(),
        mtime_ns: i128::from(meta.mtime()) * 1_000_000_000 + i128::from(meta.mtime_nsec()),
        atime_ns: i128::from(meta.atime()) * 1_000_000_000 + i128::from(meta.atime_nsec()),
        xattrs: listing.split_whitespace().map(str::to_string).collect(),
    }
}

/// A world-writable file in a world-writable dir on the host disk (not under the work root):
/// `utime(now)` and user xattrs need only write permission, so any uid may change them.
fn world_writable_file(name: &str) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir_in("/var/tmp").unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let file = dir.path().join(name);
    std::fs::write(&file, b"host").unwrap();
    std::fs::set_permissions(&file, std::fs::Permissions::from_mode(0o666)).unwrap();
    (dir, file)
}

const METADATA_PROBE: &str = r#"
import os, sys
targets = sys.argv[1:]
def attempt(label, fn):
    try:
        fn()
        print('CHANGED', label)
    except Exception as error:
        print('denied', label, type(error).__name__, getattr(error, 'errno', ''))
for t in targets:
    attempt('utime-now ' + t, lambda: os.utime(t))
    attempt('utime-zero ' + t, lambda: os.utime(t, (0, 0)))
    attempt('chmod ' + t, lambda: os.chmod(t, 0o600))
    attempt('chown ' + t, lambda: os.chown(t, os.getuid(), os.getgid()))
    attempt('setxattr ' + t, lambda: os.setxattr(t, 'user.stoke', b'channel'))
    attempt('removexattr ' + t, lambda: os.removexattr(t, 'user.keep'))
    attempt('lchown ' + t, lambda: os.lchown(t, os.getuid(), os.getgid()))
"#;

#[test]
fn metadata_writes_outside_the_work_dir_fail() {
    let sandbox = sandbox();
    if !sandbox.isolation().applies(Layer::ReadOnlyHost) {
        eprintln!(
            "skipped: the read-only host view is not applied here ({})",
            sandbox
                .isolation()
                .layer(Layer::ReadOnlyHost)
                .map(|entry| entry.detail.clone())
                .unwrap_or_default()
        );
        assert!(
            std::env::var_os("STOKE_REQUIRE_READ_ONLY_HOST").is_none(),
            "STOKE_REQUIRE_READ_ONLY_HOST is set"
        );
        return;
    }
    let (dir, file) = world_writable_file("shared");
    let keep = std::process::Command::new("python3")
        .args([
            "-c",
            "import os, sys; os.setxattr(sys.argv[1], 'user.keep', b'1')",
        ])
        .arg(&file)
        .status()
        .is_ok_and(|status| status.success());
    let targets = [file.as_path(), dir.path()];
    let before: Vec<Snapshot> = targets.iter().map(|path| snapshot(path)).collect();
    let args: Vec<&str> = targets.iter().map(|path| path.to_str().unwrap()).collect();
    let result = run(METADATA_PROBE, &args);
    let stdout = result.stdout_text();
    assert!(
        stdout.contains("denied utime-now"),
        "the probe did not run: {stdout}{}",
        result.stderr_text()
    );
    assert!(
        !stdout.contains("CHANGED"),
        "host metadata changed:\n{stdout}"
    );
    let after: Vec<Snapshot> = targets.iter().map(|path| snapshot(path)).collect();
    assert_eq!(before, after, "host metadata changed:\n{stdout}");
    if keep {
        assert_eq!(after[0].xattrs, ["user.keep"]);
    }
    // Writing inside the work dir still works, metadata included.
    let inside = run(
        "import os\nopen('f', 'w').write('x')\nos.utime('f', (0, 0))\nos.chmod('f', 0o600)\nprint(os.stat('f').st_mtime, oct(os.stat('f').st_mode & 0o777))\nprint(open('/dev/null', 'w').write('ok'))\n",
        &[],
    );
    assert_eq!(
        inside.stdout_text(),
        "0.0 0o600\n2\n",
        "{}",
        inside.stderr_text()
    );
}

#[test]
fn concurrent_runs_cannot_use_metadata_as_a_channel() {
    let sandbox = sandbox();
    if !sandbox.isolation().applies(Layer::ReadOnlyHost) {
        eprintln!("skipped: the read-only host view is not applied here");
        return;
    }
    let (_dir, file) = world_writable_file("mailbox");
    let path = file.to_str().unwrap();
    let sender = run(
        "import os, sys\ntry:\n    os.setxattr(sys.argv[1], 'user.answer', b'42')\n    print('CHANGED xattr')\nexcept OSError as e:\n    print('denied', e.errno)\ntry:\n    os.utime(sys.argv[1], (42, 42))\n    print('CHANGED utime')\nexcept OSError as e:\n    print('denied', e.errno)\n",
        &[path],
    );
    let receiver = run(
        "import os, sys\ntry:\n    print('LEAK', os.getxattr(sys.argv[1], 'user.answer'))\nexcept OSError as e:\n    print('nothing', e.errno)\nprint('mtime', int(os.stat(sys.argv[1]).st_mtime) == 42)\n",
        &[path],
    );
    assert!(
        !sender.stdout_text().contains("CHANGED"),
        "{}",
        sender.stdout_text()
    );
    assert!(
        !receiver.stdout_text().contains("LEAK") && receiver.stdout_text().contains("mtime False"),
        "{}",
        receiver.stdout_text()
    );
}

#[test]
fn mount_table_inotify_and_new_sessions_are_refused() {
    let sandbox = sandbox();
    if !sandbox.isolation().applies(Layer::Seccomp) {
        eprintln!("skipped: seccomp is not applied here");
        return;
    }
    let result = run(
        r#"
import ctypes, errno, os
libc = ctypes.CDLL(None, use_errno=True)
def syscall(label, number, *args):
    rc = libc.syscall(number, *args)
    err = ctypes.get_errno()
    print('LEAK' if rc >= 0 else 'denied', label, errno.errorcode.get(err, err))
buf = ctypes.create_string_buffer(4096)
req = ctypes.create_string_buffer(32)
syscall('statmount', 457, req, buf, 4096, 0)
syscall('listmount', 458, req, buf, 512, 0)
syscall('future', 470, 0, 0, 0, 0)
fd = libc.inotify_init1(0)
if fd >= 0:
    wd = libc.inotify_add_watch(fd, b'/tmp', 0xfff)
    print('LEAK' if wd >= 0 else 'denied', 'inotify', errno.errorcode.get(ctypes.get_errno()))
try:
    os.setsid()
    print('LEAK setsid')
except OSError as e:
    print('denied setsid', errno.errorcode.get(e.errno))
print('done')
"#,
        &[],
    );
    let stdout = result.stdout_text();
    assert!(stdout.contains("done"), "{stdout}{}", result.stderr_text());
    assert!(!stdout.contains("LEAK"), "{stdout}");
    assert!(stdout.contains("denied statmount ENOSYS"), "{stdout}");
    assert!(stdout.contains("denied listmount ENOSYS"), "{stdout}");
    assert!(stdout.contains("denied setsid EPERM"), "{stdout}");
}

/// A host file every run may read (the interpreter itself: Landlock allows reading `/usr`).
fn shared_host_file() -> std::path::PathBuf {
    std::fs::canonicalize("/usr/bin/python3").expect("python3 is installed")
}

#[test]
fn locks_on_host_files_are_refused() {
    let sandbox = sandbox();
    if !sandbox.isolation().applies(Layer::Seccomp) {
        eprintln!("skipped: seccomp is not applied here");
        return;
    }
    // A lock is host state the read-only view does not stop: held on a shared file it blocks
    // host writers and signals bits to a concurrent run.
    let file = shared_host_file();
    let result = run(
        r#"
import fcntl, os, struct, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
def attempt(label, fn):
    try:
        fn()
        print('LEAK', label)
    except OSError as e:
        print('denied', label, e.errno)
attempt('flock-ex', lambda: fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB))
attempt('flock-sh', lambda: fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
attempt('posix-rdlock', lambda: fcntl.lockf(fd, fcntl.LOCK_SH | fcntl.LOCK_NB))
lock = struct.pack('hhqqi', fcntl.F_RDLCK, 0, 0, 0, 0)
attempt('getlk', lambda: fcntl.fcntl(fd, fcntl.F_GETLK, lock))
attempt('ofd-setlk', lambda: fcntl.fcntl(fd, 37, lock))
print('done')
"#,
        &[file.to_str().unwrap()],
    );
    let stdout = result.stdout_text();
    assert!(stdout.contains("done"), "{stdout}{}", result.stderr_text());
    assert!(!stdout.contains("LEAK"), "{stdout}");
    assert_eq!(stdout.matches("denied").count(), 5, "{stdout}");
}

/// Resident bytes of `path` in the page cache (util-linux `fincore`), if the tool is here.
fn resident_bytes(path: &Path) -> Option<u64> {
    let output = std::process::Command::new("fincore")
        .args(["--bytes", "--noheadings", "--output", "RES"])
        .arg(path)
        .output()
        .ok()?;
    String::from_utf8_lossy(&output.stdout).trim().parse().ok()
}

#[test]
fn the_host_page_cache_and_disks_are_left_alone() {
    let sandbox = sandbox();
    if !sandbox.isolation().applies(Layer::Seccomp) {
        eprintln!("skipped: seccomp is not applied here");
        return;
    }
    let file = shared_host_file();
    std::fs::read(&file).unwrap();
    let Some(before) = resident_bytes(&file) else {
        eprintln!("skipped: no fincore on this machine to read the page cache");
        return;
    };
    let result = run(
        r#"
import mmap, os, sys
fd = os.open(sys.argv[1], os.O_RDONLY)
os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
m = mmap.mmap(fd, 0, prot=mmap.PROT_READ)
for advice in (20, 21):
    try:
        m.madvise(advice)
    except OSError as e:
        print('madvise', advice, e.errno)
os.sync()
os.fsync(fd)
print('done')
"#,
        &[file.to_str().unwrap()],
    );
    assert!(
        result.stdout_text().contains("done"),
        "{}{}",
        result.stdout_text(),
        result.stderr_text()
    );
    let after = resident_bytes(&file).unwrap_or(0);
    assert_eq!(
        after, before,
        "the run evicted the host file's cached pages ({before} -> {after} bytes resident)"
    );
}
