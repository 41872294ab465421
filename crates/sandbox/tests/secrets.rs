//! The caller's environment does not reach the program: neither through the inherited
//! environment nor through `/proc/<pid>/environ` of the caller.
//!
//! A separate test binary with a single test, because setting an environment variable is only
//! sound while no other thread reads the environment.

use stoke_sandbox::{ExitStatusKind, Program, Sandbox, SandboxConfig};

const SECRET: &str = "stoke-secret-value-7f3a91";

#[test]
fn caller_environment_is_invisible() {
    // SAFETY: this binary holds one test and nothing else runs yet: no other thread reads the
    // environment while it is written (the sandbox's runtime starts below).
    #[allow(unsafe_code)]
    unsafe {
        std::env::set_var("STOKE_TEST_SECRET", SECRET);
    }
    let sandbox = Sandbox::new(SandboxConfig::default()).unwrap();
    let caller = std::process::id().to_string();
    let program = Program {
        args: vec![caller],
        ..Program::python(
            "import os, sys\n\
             found = [value for value in os.environ.values()]\n\
             for path in (f'/proc/{sys.argv[1]}/environ', '/proc/1/environ', '/proc/self/environ'):\n\
             \x20   try:\n\
             \x20       found.append(open(path, 'rb').read().decode('latin-1'))\n\
             \x20   except OSError as error:\n\
             \x20       found.append(type(error).__name__)\n\
             print(found)\n",
        )
    };
    let result = sandbox.run_blocking(program);
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stderr_text()
    );
    let stdout = result.stdout_text();
    assert!(!stdout.contains(SECRET), "the secret leaked: {stdout}");
    // The reads were refused, not merely empty.
    assert!(
        stdout.contains("PermissionError") || stdout.contains("FileNotFoundError"),
        "{stdout}"
    );
}
