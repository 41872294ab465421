//! The `python` and `bash` tools over one episode's workspace: files persist from call to call,
//! deletions propagate, and runaway programs come back as failed tool outputs within the
//! sandbox's limits.
//!
//! Each test needs a sandbox at the confined level; on a machine that cannot give one it says
//! "skipped" with the reason and passes (as the sandbox crate's own suites do for missing layers).

use std::sync::Arc;
use std::time::{Duration, Instant};

use serde_json::json;
use stoke_env::{SandboxedTool, Tool, ToolOutput, Workspace};
use stoke_sandbox::{FileCollection, Sandbox, SandboxConfig};

const WALL: Duration = Duration::from_millis(2000);

fn sandbox() -> Option<Arc<Sandbox>> {
    match Sandbox::new(SandboxConfig {
        wall_timeout: WALL,
        cpu_seconds: 2,
        memory_bytes: 256 << 20,
        max_processes: 16,
        max_output_bytes: 64 << 10,
        workers: 4,
        ..SandboxConfig::default()
    }) {
        Ok(sandbox) => Some(Arc::new(sandbox)),
        Err(error) => {
            eprintln!("skipped: no sandbox on this machine: {error}");
            None
        }
    }
}

fn python(tool: &SandboxedTool, workspace: &mut Workspace, code: &str) -> ToolOutput {
    tool.call(&json!({ "code": code }), workspace)
}

fn bash(tool: &SandboxedTool, workspace: &mut Workspace, command: &str) -> ToolOutput {
    tool.call(&json!({ "command": command }), workspace)
}

#[test]
fn a_file_written_by_one_python_call_is_read_by_the_next() {
    let Some(sandbox) = sandbox() else { return };
    let tool = SandboxedTool::python(sandbox);
    let mut workspace = Workspace::default();
    let first = python(
        &tool,
        &mut workspace,
        "open('notes.txt', 'w').write('6 * 7 = 42')",
    );
    assert!(!first.failed, "{}", first.content);
    assert_eq!(first.touched, ["notes.txt"]);
    assert_eq!(workspace.text("notes.txt").as_deref(), Some("6 * 7 = 42"));
    let second = python(&tool, &mut workspace, "print(open('notes.txt').read())");
    assert!(!second.failed, "{}", second.content);
    assert_eq!(second.content, "6 * 7 = 42\n");
    assert!(second.touched.is_empty(), "{:?}", second.touched);
}

#[test]
fn bash_sees_what_python_wrote() {
    let Some(sandbox) = sandbox() else { return };
    let python_tool = SandboxedTool::python(Arc::clone(&sandbox));
    let bash_tool = SandboxedTool::bash(sandbox);
    let mut workspace = Workspace::default();
    let wrote = python(
        &python_tool,
        &mut workspace,
        "import os\nos.makedirs('src', exist_ok=True)\nopen('src/a.txt', 'w').write('alpha\\n')",
    );
    assert!(!wrote.failed, "{}", wrote.content);
    let listed = bash(&bash_tool, &mut workspace, "ls -R && cat src/a.txt");
    assert!(!listed.failed, "{}", listed.content);
    assert!(listed.content.contains("a.txt"), "{}", listed.content);
    assert!(listed.content.ends_with("alpha\n"), "{}", listed.content);
    // The sandbox's own source file is not part of the workspace.
    assert!(!workspace.files.contains_key("main.sh"));
    assert!(!workspace.files.contains_key("main.py"));
}

#[test]
fn deletions_propagate_and_are_reported_as_touched() {
    let Some(sandbox) = sandbox() else { return };
    let tool = SandboxedTool::bash(sandbox);
    let mut workspace = Workspace::default();
    workspace.files.insert("keep.txt".into(), b"k".to_vec());
    workspace.files.insert("drop.txt".into(), b"d".to_vec());
    let output = bash(&tool, &mut workspace, "rm drop.txt && echo new > made.txt");
    assert!(!output.failed, "{}", output.content);
    assert_eq!(output.touched, ["drop.txt", "made.txt"]);
    let paths: Vec<&str> = workspace.files.keys().map(String::as_str).collect();
    assert_eq!(paths, ["keep.txt", "made.txt"]);
    let check = bash(
        &tool,
        &mut workspace,
        "test -e drop.txt && echo present || echo absent",
    );
    assert_eq!(check.content, "absent\n");
}

#[test]
fn a_non_zero_exit_fails_with_its_status_and_stderr() {
    let Some(sandbox) = sandbox() else { return };
    let tool = SandboxedTool::python(sandbox);
    let output = python(&tool, &mut Workspace::default(), "print('before')\n1 / 0");
    assert!(output.failed);
    assert!(output.content.starts_with("before\n"), "{}", output.content);
    assert!(
        output.content.contains("ZeroDivisionError"),
        "{}",
        output.content
    );
    assert!(
        output.content.ends_with("[exit status 1]"),
        "{}",
        output.content
    );
}

#[test]
fn an_endless_loop_comes_back_failed_within_the_time_limit() {
    let Some(sandbox) = sandbox() else { return };
    let tool = SandboxedTool::python(sandbox);
    let mut workspace = Workspace::default();
    workspace.files.insert("before.txt".into(), b"b".to_vec());
    let started = Instant::now();
    let output = python(
        &tool,
        &mut workspace,
        "import time\nwhile True:\n    time.sleep(0.01)",
    );
    let elapsed = started.elapsed();
    assert!(output.failed);
    assert!(output.content.contains("timed out"), "{}", output.content);
    // The wall limit plus the sandbox's stop grace and start-up, far below a hung call.
    assert!(elapsed < WALL + Duration::from_secs(4), "{elapsed:?}");
    assert_eq!(workspace.text("before.txt").as_deref(), Some("b"));
}

#[test]
fn megabytes_of_output_are_cut_at_the_sandbox_cap() {
    let Some(sandbox) = sandbox() else { return };
    let cap = sandbox.config().max_output_bytes;
    let tool = SandboxedTool::python(sandbox);
    let output = python(
        &tool,
        &mut Workspace::default(),
        "import sys\nfor _ in range(64):\n    sys.stdout.write('x' * (1 << 16))",
    );
    assert!(output.failed);
    assert!(
        output.content.contains("output went over"),
        "{}",
        output.content
    );
    assert!(
        output.content.len() < cap + 1024,
        "{} bytes",
        output.content.len()
    );
}

#[test]
fn a_fork_bomb_is_contained_and_the_next_call_runs() {
    let Some(sandbox) = sandbox() else { return };
    let tool = SandboxedTool::bash(sandbox);
    let mut workspace = Workspace::default();
    let started = Instant::now();
    let bomb = bash(
        &tool,
        &mut workspace,
        "bomb() { bomb | bomb & }; bomb; sleep 30",
    );
    assert!(bomb.failed, "{}", bomb.content);
    assert!(
        started.elapsed() < WALL + Duration::from_secs(4),
        "{:?}",
        started.elapsed()
    );
    let after = bash(&tool, &mut workspace, "echo alive");
    assert!(!after.failed, "{}", after.content);
    assert_eq!(after.content, "alive\n");
}

#[test]
fn a_symlink_out_of_the_workspace_does_not_enter_it() {
    let Some(sandbox) = sandbox() else { return };
    let tool = SandboxedTool::bash(sandbox);
    let mut workspace = Workspace::default();
    let output = bash(&tool, &mut workspace, "ln -s /etc/passwd passwd && echo ok");
    assert!(!output.failed, "{}", output.content);
    assert!(workspace.files.is_empty(), "{:?}", workspace.files.keys());
    assert!(
        output.content.contains("passwd (symlink)"),
        "{}",
        output.content
    );
}

#[test]
fn too_many_bytes_fail_the_call_and_keep_the_workspace() {
    let Some(sandbox) = sandbox() else { return };
    let tool = SandboxedTool::python(sandbox).with_collection(FileCollection {
        max_files: 8,
        max_bytes: 10_000,
    });
    let mut workspace = Workspace::default();
    workspace.files.insert("old.txt".into(), b"old".to_vec());
    let output = python(
        &tool,
        &mut workspace,
        "open('big', 'wb').write(b'0' * 50_000)",
    );
    assert!(output.failed);
    assert!(
        output.content.contains("were not kept"),
        "{}",
        output.content
    );
    assert!(output.touched.is_empty());
    let paths: Vec<&str> = workspace.files.keys().map(String::as_str).collect();
    assert_eq!(paths, ["old.txt"]);
}

#[test]
fn missing_arguments_are_a_failed_output_naming_the_key() {
    let Some(sandbox) = sandbox() else { return };
    let output =
        SandboxedTool::bash(sandbox).call(&json!({"code": "ls"}), &mut Workspace::default());
    assert!(output.failed);
    assert!(output.content.contains("`command`"), "{}", output.content);
}

#[test]
fn the_specs_name_their_argument() {
    let Some(sandbox) = sandbox() else { return };
    let python_spec = SandboxedTool::python(Arc::clone(&sandbox)).spec();
    assert_eq!(python_spec.name, "python");
    assert_eq!(python_spec.parameters["required"], json!(["code"]));
    let bash_spec = SandboxedTool::bash(Arc::clone(&sandbox)).spec();
    assert_eq!(bash_spec.name, "bash");
    assert_eq!(bash_spec.parameters["required"], json!(["command"]));
    let error = SandboxedTool::new(sandbox, stoke_sandbox::Language::C, "c").unwrap_err();
    assert!(error.to_string().starts_with("language:"), "{error}");
}
