//! Red-team attacks not covered by `adversarial.rs`: reading the caller's files by indirect
//! paths, abusing the work dir against the harness, reaching host services through sockets,
//! denied kernel interfaces, and the helper's re-exec marker. Each test asserts containment: the
//! attack fails or stays confined, nothing outside the work dir is read or written, no process
//! survives and the caller keeps working.
//!
//! Programs print `LEAK ...` or `ESCAPED ...` when an attack succeeds; the tests look for those
//! words, so a program that crashes early still counts as contained only if the sandbox did not
//! fail itself.

use std::os::unix::net::{UnixDatagram, UnixListener};
use std::path::Path;
use std::time::{Duration, Instant};

mod common;

use common::processes_with;
use stoke_sandbox::{ExecResult, ExitStatusKind, Language, Program, Sandbox, SandboxConfig};

const WALL: Duration = Duration::from_millis(3000);

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        wall_timeout: WALL,
        cpu_seconds: 2,
        memory_bytes: 256 << 20,
        max_processes: 16,
        max_output_bytes: 64 << 10,
        workers: 8,
        ..SandboxConfig::default()
    })
    .expect("the test machine gives at least the confined level")
}

fn marker(name: &str) -> String {
    common::marker("redteam", name)
}

/// Runs `program` (the marker becomes its first argument) and checks that nothing survives, the
/// run returned in bounded time and the sandbox itself did not fail.
fn run_contained(name: &str, mut program: Program) -> ExecResult {
    let marker = marker(name);
    program.args.insert(0, marker.clone());
    let started = Instant::now();
    let result = sandbox().run_blocking(program);
    let elapsed = started.elapsed();
    let survivors = processes_with(&marker);
    assert!(
        survivors.is_empty(),
        "{name}: processes survived: {survivors:?}"
    );
    assert!(
        elapsed < WALL + Duration::from_secs(10),
        "{name}: the run took {elapsed:?}"
    );
    assert!(
        !matches!(result.status, ExitStatusKind::SandboxError(_)),
        "{name}: the sandbox itself failed: {:?} {}",
        result.status,
        result.stderr_text()
    );
    result
}

fn python(source: &str, args: &[&str]) -> Program {
    Program {
        args: args.iter().map(|arg| arg.to_string()).collect(),
        ..Program::python(source)
    }
}

/// The program's stdout holds none of `LEAK`, `ESCAPED` or `secret`.
fn assert_no_leak(name: &str, result: &ExecResult, secret: &str) {
    let stdout = result.stdout_text();
    let stderr = result.stderr_text();
    if std::env::var_os("STOKE_REDTEAM_VERBOSE").is_some() {
        eprintln!("{name}: {:?}\n{stdout}{stderr}", result.status);
    }
    for output in [&stdout, &stderr] {
        assert!(
            !output.contains("LEAK") && !output.contains("ESCAPED") && !output.contains(secret),
            "{name}: attack succeeded: status {:?}\nstdout {stdout}\nstderr {stderr}",
            result.status
        );
    }
}

/// A secret file outside any work dir, readable by everyone (so only the jail protects it).
fn secret_file(dir: &Path, secret: &str) -> std::path::PathBuf {
    use std::os::unix::fs::PermissionsExt;
    std::fs::set_permissions(dir, std::fs::Permissions::from_mode(0o755)).unwrap();
    let path = dir.join("credentials");
    std::fs::write(&path, secret).unwrap();
    std::fs::set_permissions(&path, std::fs::Permissions::from_mode(0o644)).unwrap();
    path
}

#[test]
fn secret_files_are_unreachable_by_indirect_paths() {
    let dir = tempfile::tempdir().unwrap();
    let secret = format!("SECRET-{}", marker("s"));
    let path = secret_file(dir.path(), &secret);
    let source = r#"
import os, sys, ctypes
target = sys.argv[2]
def attempt(label, fn):
    try:
        data = fn()
        print('LEAK', label, data)
    except Exception as error:
        print('denied', label, type(error).__name__)
def read(p):
    with open(p) as f:
        return f.read()
attempt('absolute', lambda: read(target))
attempt('self-root', lambda: read('/proc/self/root' + target))
attempt('pid1-root', lambda: read('/proc/1/root' + target))
attempt('relative', lambda: read('../' * 40 + target.lstrip('/')))
def symlink():
    os.symlink(target, 'link')
    return read('link')
attempt('symlink', symlink)
def hardlink():
    os.link(target, 'hard')
    return read('hard')
attempt('hardlink', hardlink)
def openat_dotdot():
    fd = os.open('.', os.O_RDONLY)
    return os.read(os.open('../' * 40 + target.lstrip('/'), os.O_RDONLY, dir_fd=fd), 100)
attempt('openat', openat_dotdot)
def fd_path():
    fd = os.open('/', os.O_RDONLY | os.O_DIRECTORY)
    return os.read(os.open(target.lstrip('/'), os.O_RDONLY, dir_fd=fd), 100)
attempt('root-dirfd', fd_path)
def cwd_escape():
    os.chdir('/')
    return read(target.lstrip('/'))
attempt('chdir', cwd_escape)
def rename_in():
    os.rename(target, 'moved')
    return read('moved')
attempt('rename', rename_in)
def unlink():
    os.unlink(target)
    return 'unlinked'
attempt('unlink', unlink)
"#;
    let result = run_contained("indirect-read", python(source, &[path.to_str().unwrap()]));
    assert_no_leak("indirect read", &result, &secret);
    assert!(
        result.stdout_text().contains("denied unlink"),
        "{}",
        result.stdout_text()
    );
    assert_eq!(std::fs::read_to_string(&path).unwrap(), secret);
}

#[test]
fn secret_under_home_is_unreachable() {
    let home = std::env::var_os("HOME")
        .map(std::path::PathBuf::from)
        .unwrap_or("/root".into());
    let Ok(dir) = tempfile::Builder::new()
        .prefix(".stoke-redteam-")
        .tempdir_in(&home)
    else {
        return; // no writable home: nothing to protect there
    };
    let secret = format!("HOMESECRET-{}", marker("h"));
    let path = secret_file(dir.path(), &secret);
    let source = "import sys\ntry:\n    print('LEAK', open(sys.argv[2]).read())\nexcept Exception as e:\n    print('denied', e)\n";
    let result = run_contained("home-read", python(source, &[path.to_str().unwrap()]));
    assert_no_leak("home read", &result, &secret);
}

#[test]
fn named_unix_sockets_outside_the_work_dir_are_unreachable() {
    use std::os::unix::fs::PermissionsExt;
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let stream_path = dir.path().join("service.sock");
    let dgram_path = dir.path().join("log.sock");
    let listener = UnixListener::bind(&stream_path).unwrap();
    listener.set_nonblocking(true).unwrap();
    let datagram = UnixDatagram::bind(&dgram_path).unwrap();
    datagram.set_nonblocking(true).unwrap();
    for path in [&stream_path, &dgram_path] {
        std::fs::set_permissions(path, std::fs::Permissions::from_mode(0o777)).unwrap();
    }
    let source = r#"
import socket, sys
def attempt(label, fn):
    try:
        fn()
        print('ESCAPED', label)
    except Exception as error:
        print('denied', label, type(error).__name__, error)
def stream():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    s.connect(sys.argv[2]); s.sendall(b'hello')
attempt('stream', stream)
def dgram():
    s = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    s.sendto(b'hello', sys.argv[3])
attempt('dgram', dgram)
def pair_dgram():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendto(b'hello', sys.argv[3])
attempt('socketpair-dgram', pair_dgram)
def pair_dgram_msg():
    a, b = socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM)
    a.sendmsg([b'hello'], [], 0, sys.argv[3])
attempt('socketpair-sendmsg', pair_dgram_msg)
"#;
    let result = run_contained(
        "named-socket",
        python(
            source,
            &[stream_path.to_str().unwrap(), dgram_path.to_str().unwrap()],
        ),
    );
    let accepted = listener.accept().is_ok();
    let mut buffer = [0u8; 16];
    let received = datagram.recv(&mut buffer).is_ok();
    assert!(
        !accepted && !received,
        "a host socket was reached (stream accepted {accepted}, datagram received {received}): {}",
        result.stdout_text()
    );
    assert_no_leak("named socket", &result, "never-printed");
}

#[test]
fn abstract_unix_sockets_of_the_host_are_unreachable() {
    use std::os::linux::net::SocketAddrExt;
    let name = marker("abstract");
    let address = std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap();
    let listener = UnixListener::bind_addr(&address).unwrap();
    listener.set_nonblocking(true).unwrap();
    let source = "import socket, sys\ns = socket.socket(socket.AF_UNIX)\ntry:\n    s.connect('\\0' + sys.argv[2])\n    print('ESCAPED')\nexcept Exception as e:\n    print('denied', e)\n";
    let result = run_contained("abstract", python(source, &[&name]));
    assert!(listener.accept().is_err(), "{}", result.stdout_text());
    assert_no_leak("abstract socket", &result, "never-printed");
}

#[test]
fn non_unix_sockets_and_udp_are_denied() {
    let receiver = std::net::UdpSocket::bind("127.0.0.1:0").unwrap();
    receiver.set_nonblocking(true).unwrap();
    let port = receiver.local_addr().unwrap().port().to_string();
    let source = r#"
import socket, sys
families = [('inet-udp', socket.AF_INET, socket.SOCK_DGRAM), ('inet6', socket.AF_INET6, socket.SOCK_STREAM),
            ('netlink', socket.AF_NETLINK, socket.SOCK_RAW), ('packet', 17, socket.SOCK_RAW),
            ('vsock', 40, socket.SOCK_STREAM), ('alg', 38, socket.SOCK_SEQPACKET)]
for label, family, kind in families:
    try:
        s = socket.socket(family, kind)
        if label == 'inet-udp':
            s.sendto(b'x', ('127.0.0.1', int(sys.argv[2])))
        print('ESCAPED', label)
    except Exception as error:
        print('denied', label, error)
"#;
    let result = run_contained("sockets", python(source, &[&port]));
    let mut buffer = [0u8; 4];
    assert!(receiver.recv(&mut buffer).is_err(), "UDP reached the host");
    assert_no_leak("sockets", &result, "never-printed");
    assert_eq!(result.stdout_text().matches("denied").count(), 6);
}

#[test]
fn dangerous_system_calls_are_denied() {
    // x86_64 numbers; on other architectures the test only checks containment.
    let source = r#"
import ctypes, os, platform
libc = ctypes.CDLL(None, use_errno=True)
calls = {'unshare-user': (272, 0x10000000), 'unshare-ns': (272, 0x00020000), 'setns': (308, 0, 0),
         'ptrace-attach-1': (101, 16, 1, 0, 0), 'process_vm_readv': (310, 1, 0, 0, 0, 0, 0),
         'io_uring_setup': (425, 8, 0), 'userfaultfd': (323, 0), 'perf_event_open': (298, 0, 0, -1, -1, 0),
         'keyctl': (250, 0, -3, 0), 'add_key': (248, 0, 0, 0, 0, 0), 'bpf': (321, 0, 0, 0),
         'clock_settime': (227, 0, 0), 'clone-newuser': (56, 0x10000000 | 17, 0, 0, 0, 0),
         'mount': (165, 0, 0, 0, 0, 0), 'chroot': (161, 0), 'pivot_root': (155, 0, 0),
         'x32-unshare': (0x40000000 + 272, 0x10000000)}
if platform.machine() == 'x86_64':
    for label, (nr, *args) in calls.items():
        ctypes.set_errno(0)
        result = libc.syscall(nr, *[ctypes.c_long(a) for a in args])
        if result == 0 and label.startswith('clone'):
            os._exit(0)  # the child of a successful clone
        if result >= 0:
            print('ESCAPED', label, result)
        else:
            print('denied', label, os.strerror(ctypes.get_errno()))
"#;
    let result = run_contained("syscalls", python(source, &[]));
    assert_no_leak("system calls", &result, "never-printed");
}

#[test]
fn raising_limits_and_setuid_fail() {
    let source = r#"
import resource, os
for name in ['RLIMIT_NPROC', 'RLIMIT_AS', 'RLIMIT_CPU', 'RLIMIT_NOFILE', 'RLIMIT_FSIZE']:
    r = getattr(resource, name)
    soft, hard = resource.getrlimit(r)
    try:
        resource.setrlimit(r, (resource.RLIM_INFINITY, resource.RLIM_INFINITY))
        if hard != resource.RLIM_INFINITY:
            print('ESCAPED raised', name)
    except Exception as e:
        print('denied', name, e)
for label, fn in [('setuid0', lambda: os.setuid(0)), ('setgid0', lambda: os.setgid(0))]:
    try:
        fn(); print('ESCAPED', label)
    except Exception as e:
        print('denied', label, e)
try:
    open('/sys/kernel/mm/transparent_hugepage/enabled', 'w').write('never'); print('ESCAPED sys')
except Exception as e:
    print('denied sys', e)
for p in ['/dev/shm/stoke-redteam', '/dev/mqueue/x', '/var/tmp/stoke-redteam']:
    try:
        open(p, 'w').write('x'); print('ESCAPED', p)
    except Exception as e:
        print('denied', p, e)
"#;
    let result = run_contained("limits", python(source, &[]));
    assert_no_leak("limits", &result, "never-printed");
    assert!(!Path::new("/dev/shm/stoke-redteam").exists());
    assert!(!Path::new("/var/tmp/stoke-redteam").exists());
}

#[test]
fn setuid_binaries_do_not_elevate() {
    // `su`/`passwd`/`mount` are set-uid on most systems; no-new-privs keeps the run's uid.
    let source = "for b in /usr/bin/su /bin/su /usr/bin/passwd /usr/bin/mount /usr/bin/newgrp; do\n  [ -x \"$b\" ] && \"$b\" --help >/dev/null 2>&1 </dev/null\ndone\nid -u; if [ \"$(id -u)\" = 0 ] && [ -w /etc/passwd ]; then echo ESCAPED; fi\nif touch /etc/stoke-redteam 2>/dev/null; then echo ESCAPED etc; fi\n";
    let result = run_contained(
        "setuid",
        Program {
            args: Vec::new(),
            ..Program::bash(source)
        },
    );
    assert_no_leak("setuid", &result, "never-printed");
    assert!(!Path::new("/etc/stoke-redteam").exists());
}

#[test]
fn bash_dev_tcp_is_denied() {
    let listener = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    listener.set_nonblocking(true).unwrap();
    let port = listener.local_addr().unwrap().port();
    let source = format!(
        "if exec 3<>/dev/tcp/127.0.0.1/{port}; then echo ESCAPED; else echo denied; fi\nif echo x >/dev/udp/127.0.0.1/{port}; then echo ESCAPED udp; fi\n"
    );
    let result = run_contained("dev-tcp", Program::bash(&source));
    assert!(listener.accept().is_err());
    assert_no_leak("/dev/tcp", &result, "never-printed");
}

#[test]
fn signals_do_not_reach_the_caller() {
    // Guess pids around the caller's and signal them, plus every broadcast form.
    let caller = std::process::id();
    let source = r#"
import os, sys, signal
caller = int(sys.argv[2])
for pid in [-1, 0, 1] + list(range(max(2, caller - 200), caller + 200)):
    if pid == os.getpid():
        continue
    try:
        os.kill(pid, signal.SIGKILL)
    except Exception:
        pass
try:
    os.killpg(1, signal.SIGKILL)
except Exception:
    pass
print('done')
"#;
    let result = run_contained("signals", python(source, &[&caller.to_string()]));
    // We are still alive, and a sandbox keeps working.
    assert!(result.stdout_text().contains("done") || !result.status.success());
    let again = sandbox().run_blocking(Program::python("print(1)"));
    assert_eq!(again.stdout, b"1\n");
}

#[test]
fn a_daemon_escaping_by_setsid_is_killed() {
    let source = r#"
import os, time
if os.fork() == 0:
    os.setsid()
    if os.fork() == 0:
        os.setsid()
        time.sleep(30)
    os._exit(0)
print('parent done')
"#;
    let result = run_contained("daemon", python(source, &[]));
    assert!(result.status.success(), "{:?}", result.status);
}

#[test]
fn a_fifo_in_the_work_dir_does_not_block_the_harness() {
    let source = "import os\nos.mkfifo('main.py.out')\nos.mkfifo('fifo')\nos.symlink('/etc/passwd', 'link')\nprint('ok')\n";
    let result = run_contained("fifo", python(source, &[]));
    assert_eq!(result.stdout_text(), "ok\n");
}

#[test]
fn cleanup_does_not_follow_symlinks_out_of_the_work_dir() {
    use std::os::unix::fs::PermissionsExt;
    let outside = tempfile::tempdir().unwrap();
    std::fs::set_permissions(outside.path(), std::fs::Permissions::from_mode(0o777)).unwrap();
    let precious = outside.path().join("precious");
    std::fs::write(&precious, "keep").unwrap();
    let work_root = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: WALL,
        work_root: work_root.path().to_path_buf(),
        ..SandboxConfig::default()
    })
    .unwrap();
    let source = "import os, sys\nos.symlink(sys.argv[1], 'outside')\nos.symlink(sys.argv[1] + '/precious', 'precious')\nos.makedirs('d')\nos.symlink(sys.argv[1], 'd/x')\nos.chmod('d', 0)\n";
    let result = sandbox.run_blocking(Program {
        args: vec![outside.path().to_str().unwrap().to_string()],
        ..Program::python(source)
    });
    assert!(
        result.status.success(),
        "{:?} {}",
        result.status,
        result.stderr_text()
    );
    assert_eq!(std::fs::read_to_string(&precious).unwrap(), "keep");
    assert_eq!(std::fs::read_dir(work_root.path()).unwrap().count(), 0);
}

#[test]
fn deep_nesting_and_many_files_are_cleaned_up() {
    let work_root = tempfile::tempdir().unwrap();
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: Duration::from_secs(5),
        cpu_seconds: 4,
        work_root: work_root.path().to_path_buf(),
        ..SandboxConfig::default()
    })
    .unwrap();
    let source = r#"
import os
try:
    for i in range(3000):
        os.mkdir('d'); os.chdir('d')
except OSError as e:
    print('nest stopped', e)
os.chdir(os.environ['HOME'])
n = 0
try:
    for i in range(100000):
        open('f%d' % i, 'w').close(); n += 1
except OSError as e:
    print('files stopped', n, e)
try:
    with open('sparse', 'w') as f:
        f.seek(1 << 40); f.write('x')
    print('sparse ok')
except OSError as e:
    print('sparse stopped', e)
"#;
    let result = run_contained_with(&sandbox, "nesting", python(source, &[]));
    assert_no_leak("nesting", &result, "never-printed");
    assert!(!matches!(result.status, ExitStatusKind::SandboxError(_)));
    assert_eq!(
        std::fs::read_dir(work_root.path()).unwrap().count(),
        0,
        "work dir left behind"
    );
}

fn run_contained_with(sandbox: &Sandbox, name: &str, mut program: Program) -> ExecResult {
    let marker = marker(name);
    program.args.insert(0, marker.clone());
    let result = sandbox.run_blocking(program);
    assert!(processes_with(&marker).is_empty(), "{name}: survivors");
    result
}

#[test]
fn unread_large_stdin_and_huge_lines_do_not_deadlock() {
    let program = Program {
        stdin: vec![b'x'; 16 << 20],
        ..Program::python(
            "import sys, os\nos.write(1, b'y' * (1 << 22))\nsys.stderr.write('z' * (1 << 22))\n",
        )
    };
    let result = run_contained("stdin", program);
    assert!(result.stdout.len() <= 64 << 10);
    assert!(result.stderr.len() <= 64 << 10);
}

#[test]
fn the_helper_marker_is_not_visible_to_the_program() {
    let source = r#"
import os
print('env', sorted(k for k in os.environ if 'STOKE' in k))
try:
    pids = os.listdir('/proc')
except OSError:
    pids = ['1', '2', '3', str(os.getppid())]
for pid in pids:
    try:
        cmd = open('/proc/%s/cmdline' % pid, 'rb').read()
        env = open('/proc/%s/environ' % pid, 'rb').read()
        if b'__stoke_sandbox_helper__' in cmd or b'STOKE_SANDBOX' in env:
            print('LEAK helper visible', pid)
    except OSError:
        pass
for fd in range(3, 64):
    try:
        os.fstat(fd); print('LEAK fd', fd)
    except OSError:
        pass
"#;
    let result = run_contained("marker", python(source, &[]));
    assert_no_leak("helper marker", &result, "STOKE_SANDBOX");
    assert!(
        result.stdout_text().contains("env []"),
        "{}",
        result.stdout_text()
    );
}

#[test]
fn the_helper_marker_in_a_normal_environment_does_not_hijack_children() {
    // A program started by this test binary with the marker variable but no framed request on
    // stdin must fail fast with the helper's exit code, not hang or run anything.
    let exe = std::env::current_exe().unwrap();
    let output = std::process::Command::new(exe)
        .env("STOKE_SANDBOX_HELPER_STATUS_FD", "1")
        .stdin(std::process::Stdio::null())
        .output()
        .unwrap();
    assert_eq!(output.status.code(), Some(125), "{:?}", output);
}

#[test]
fn stream_socketpairs_still_work_without_network() {
    // What the socket rules keep: multiprocessing.Pipe and asyncio use stream socketpairs.
    let source = "import socket\na, b = socket.socketpair()\na.sendall(b'ping')\nprint(b.recv(4).decode())\nfrom multiprocessing import Pipe\nx, y = Pipe()\nx.send(7)\nprint(y.recv())\n";
    let result = run_contained("socketpair", python(source, &[]));
    assert_eq!(
        result.stdout_text(),
        "ping\n7\n",
        "{}",
        result.stderr_text()
    );
}

#[test]
fn i386_system_calls_do_not_bypass_the_filter() {
    // `int 0x80` enters the i386 ABI, whose numbers differ from x86_64's (310 is unshare there):
    // the filters' arch check kills the process instead of letting it past the deny-list.
    let sandbox = sandbox();
    if !cfg!(target_arch = "x86_64") || !sandbox.languages().contains(&Language::C) {
        return;
    }
    let source = r#"
#include <stdio.h>
int main(void) {
    long result;
    __asm__ volatile ("int $0x80" : "=a"(result) : "a"(310L), "b"(0x10000000L) : "memory");
    printf(result == 0 ? "ESCAPED unshare\n" : "denied %ld\n", result);
    return 0;
}
"#;
    let result = run_contained(
        "i386",
        Program {
            language: Language::C,
            ..Program::python(source)
        },
    );
    assert_no_leak("i386 ABI", &result, "never-printed");
}

#[test]
fn the_terminal_is_unreachable() {
    // TIOCSTI on a controlling terminal would type commands into the caller's shell.
    let source = "import os\ntry:\n    fd = os.open('/dev/tty', os.O_RDWR)\n    print('ESCAPED tty', fd)\nexcept OSError as e:\n    print('denied', e)\nprint('sid', os.getsid(0) == os.getpid())\n";
    let result = run_contained("tty", python(source, &[]));
    assert_no_leak("terminal", &result, "never-printed");
}

#[test]
#[allow(unsafe_code)] // setrlimit on the test process itself
fn real_time_scheduling_and_raised_priority_are_refused() {
    // A caller allowed real-time priority (RLIMIT_RTPRIO > 0, e.g. by limits.conf) must not pass
    // it on: a SCHED_FIFO spinner starves the machine's other work.
    let raised = libc::rlimit {
        rlim_cur: 50,
        rlim_max: 50,
    };
    // SAFETY: plain setrlimit on this test process; failing (non-root) leaves the default 0.
    unsafe {
        libc::setrlimit(libc::RLIMIT_RTPRIO, &raised);
        libc::setrlimit(
            libc::RLIMIT_NICE,
            &libc::rlimit {
                rlim_cur: 40,
                rlim_max: 40,
            },
        );
    }
    let source = r#"
import os, resource
print('rtprio', resource.getrlimit(resource.RLIMIT_RTPRIO)[1], 'nice', resource.getrlimit(resource.RLIMIT_NICE)[1])
try:
    os.sched_setscheduler(0, os.SCHED_FIFO, os.sched_param(1))
    print('ESCAPED fifo')
except OSError as e:
    print('denied fifo', e)
try:
    os.setpriority(os.PRIO_PROCESS, 0, -10)
    print('ESCAPED nice')
except OSError as e:
    print('denied nice', e)
"#;
    let result = run_contained("realtime", python(source, &[]));
    assert_no_leak("real-time scheduling", &result, "never-printed");
    assert!(
        result.stdout_text().contains("denied fifo"),
        "{}",
        result.stderr_text()
    );
}

#[test]
fn the_fork_start_path_has_the_same_filters() {
    // Runs started by forking the caller (`spawn_via_helper: false`, also the automatic
    // fallback) must get the same socket and namespace rules as helper runs.
    let sandbox = Sandbox::new(SandboxConfig {
        wall_timeout: WALL,
        spawn_via_helper: false,
        ..SandboxConfig::default()
    })
    .unwrap();
    assert!(!sandbox.spawns_via_helper());
    let source = r#"
import socket, os, ctypes
libc = ctypes.CDLL(None, use_errno=True)
for label, fn in [('unix', lambda: socket.socket(socket.AF_UNIX)), ('inet', lambda: socket.socket()),
                  ('dgram-pair', lambda: socket.socketpair(socket.AF_UNIX, socket.SOCK_DGRAM))]:
    try:
        fn(); print('ESCAPED', label)
    except OSError as e:
        print('denied', label, e)
if os.uname().machine == 'x86_64' and libc.syscall(272, ctypes.c_long(0x10000000)) == 0:
    print('ESCAPED unshare')
"#;
    let result = run_contained_with(&sandbox, "fork-path", python(source, &[]));
    assert!(
        result.status.success(),
        "{:?} {}",
        result.status,
        result.stderr_text()
    );
    assert_no_leak("fork path", &result, "never-printed");
    assert_eq!(result.stdout_text().matches("denied").count(), 3);
}
