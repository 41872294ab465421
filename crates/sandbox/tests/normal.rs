//! Ordinary programs run and report exactly what they did.

use std::time::Duration;

use stoke_sandbox::{ExitStatusKind, Program, Sandbox, SandboxConfig};

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
fn hello_world_prints() {
    let result = sandbox().run_blocking(Program::python("print('hello world')"));
    assert_eq!(
        result.status,
        ExitStatusKind::Exited(0),
        "{}",
        result.stderr_text()
    );
    assert_eq!(result.stdout, b"hello world\n");
}

#[test]
fn probe_table() {
    println!("{}", stoke_sandbox::probe().to_table());
}
