//! `stoke sandbox probe` and `stoke sandbox run` from the outside.

use std::process::Command;

fn stoke() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
}

#[test]
fn probe_json_lists_every_layer_with_a_level() {
    let output = stoke()
        .args(["sandbox", "probe", "--json"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let report: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    let level = report["level"].as_str().unwrap();
    assert!(["basic", "confined", "full"].contains(&level), "{level}");
    let layers = report["layers"].as_array().unwrap();
    assert_eq!(layers.len(), stoke_sandbox::Layer::ALL.len());
    let fresh = layers
        .iter()
        .find(|entry| entry["layer"] == "fresh_work_dir")
        .unwrap();
    assert_eq!(fresh["available"], true);
}

#[test]
fn probe_table_has_a_header_and_a_line_per_layer() {
    let output = stoke().args(["sandbox", "probe"]).output().unwrap();
    assert!(output.status.success());
    let table = String::from_utf8(output.stdout).unwrap();
    assert!(table.starts_with("isolation level: "), "{table}");
    assert!(
        table.lines().any(|line| line.starts_with("seccomp ")),
        "{table}"
    );
    assert_eq!(table.lines().count(), 2 + stoke_sandbox::Layer::ALL.len());
}

#[test]
fn run_prints_the_result_as_json() {
    let dir = tempfile_dir();
    let source = dir.join("prog.py");
    std::fs::write(&source, "import sys\nprint(sys.argv[1])\nsys.exit(4)\n").unwrap();
    let output = stoke()
        .args(["sandbox", "run", "--timeout", "5"])
        .arg(&source)
        .args(["--", "hello"])
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let result: serde_json::Value = serde_json::from_slice(&output.stdout).unwrap();
    assert_eq!(result["status"]["exited"], 4);
    assert_eq!(result["stdout"], "hello\n");
    // The stoke binary carries the helper constructor: runs do not fork the CLI process.
    assert_eq!(result["via_helper"], true);
    let _ = std::fs::remove_dir_all(dir);
}

#[test]
fn run_rejects_an_unknown_extension() {
    let dir = tempfile_dir();
    let source = dir.join("prog.xyz");
    std::fs::write(&source, "").unwrap();
    let output = stoke()
        .args(["sandbox", "run"])
        .arg(&source)
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("--language"), "{stderr}");
    let _ = std::fs::remove_dir_all(dir);
}

fn tempfile_dir() -> std::path::PathBuf {
    use std::sync::atomic::{AtomicU32, Ordering};
    static COUNTER: AtomicU32 = AtomicU32::new(0);
    let dir = std::env::temp_dir().join(format!(
        "stoke-sandbox-cli-{}-{}",
        std::process::id(),
        COUNTER.fetch_add(1, Ordering::Relaxed)
    ));
    std::fs::create_dir_all(&dir).unwrap();
    dir
}
