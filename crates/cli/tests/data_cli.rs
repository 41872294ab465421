//! `stoke data run CONFIG.toml`: runs the funnel from a config file, prints the per-stage
//! summary, resolves relative paths from the config's folder, and fails with a one-line error
//! naming the problem on a bad config.

use std::process::Command;

fn stoke() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
}

const CONFIG: &str = r#"
[run]
output = "out/kept.jsonl"
report_dir = "out/report"

[[source]]
name = "notes"
paths = ["in"]
format = "jsonl"

[[stage]]
kind = "gopher_quality"
"#;

fn long_text() -> String {
    let words: Vec<String> = (0..60).map(|i| format!("item{i}")).collect();
    format!(
        "The notes of the day and that list with {} end here.",
        words.join(" ")
    )
}

#[test]
fn data_run_writes_kept_documents_and_prints_the_summary() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    let input = format!(
        "{}\n{}\nnot json\n",
        serde_json::json!({"id": "long", "text": long_text()}),
        serde_json::json!({"id": "short", "text": "Too short."})
    );
    std::fs::write(dir.path().join("in/a.jsonl"), input).unwrap();
    std::fs::write(dir.path().join("funnel.toml"), CONFIG).unwrap();
    // Run from elsewhere: paths in the config are relative to the config file.
    let output = stoke()
        .arg("data")
        .arg("run")
        .arg(dir.path().join("funnel.toml"))
        .current_dir("/")
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("input: 2 documents"), "{stdout}");
    assert!(stdout.contains("1 bad records"), "{stdout}");
    assert!(stdout.contains("gopher_short_doc=1"), "{stdout}");
    let kept = std::fs::read_to_string(dir.path().join("out/kept.jsonl")).unwrap();
    assert_eq!(kept.lines().count(), 1);
    assert!(dir.path().join("out/report/report.json").exists());
    assert!(dir.path().join("out/report/funnel.svg").exists());
}

#[test]
fn data_run_rejects_an_unknown_key_with_a_one_line_error() {
    let dir = tempfile::tempdir().unwrap();
    let config = CONFIG.replace(
        "kind = \"gopher_quality\"",
        "kind = \"gopher_quality\"\nmin_words = 5",
    );
    std::fs::write(dir.path().join("funnel.toml"), config).unwrap();
    let output = stoke()
        .arg("data")
        .arg("run")
        .arg(dir.path().join("funnel.toml"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.starts_with("error:") && stderr.contains("min_words"),
        "{stderr}"
    );
    assert!(stderr.contains("funnel.toml"), "{stderr}");
}

#[test]
fn data_run_names_a_missing_config_file() {
    let output = stoke()
        .args(["data", "run", "/nonexistent/funnel.toml"])
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/funnel.toml"));
}

#[test]
fn data_run_with_tokenize_ends_in_shards_encoded_by_the_named_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    let text = long_text();
    std::fs::write(
        dir.path().join("in/a.jsonl"),
        format!("{}\n", serde_json::json!({"text": text})),
    )
    .unwrap();
    std::fs::write(dir.path().join("train.txt"), format!("{text}\n{text}\n")).unwrap();
    let trained = stoke()
        .args([
            "tokenizer",
            "train",
            "--vocab-size",
            "300",
            "--special-tokens",
            "<|endoftext|>",
        ])
        .arg("--input")
        .arg(dir.path().join("train.txt"))
        .arg("--output")
        .arg(dir.path().join("tok"))
        .output()
        .unwrap();
    assert!(
        trained.status.success(),
        "{}",
        String::from_utf8_lossy(&trained.stderr)
    );
    let config = format!(
        "{CONFIG}\n[tokenize]\ntokenizer = \"tok\"\nend_of_text = \"<|endoftext|>\"\noutput_dir = \"out/shards\"\n"
    );
    std::fs::write(dir.path().join("funnel.toml"), config).unwrap();
    let output = stoke()
        .arg("data")
        .arg("run")
        .arg(dir.path().join("funnel.toml"))
        .output()
        .unwrap();
    let stdout = String::from_utf8_lossy(&output.stdout);
    assert!(
        output.status.success(),
        "{stdout}\n{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(stdout.contains("tokenized: 1 documents"), "{stdout}");
    let readers = stoke_data::shard::open_dir(&dir.path().join("out/shards")).unwrap();
    let tokens = readers[0].document(0).unwrap().to_vec();
    let tokenizer = stoke_tokenizer::hf::Tokenizer::from_dir(&dir.path().join("tok")).unwrap();
    let mut expected = tokenizer.encode(&text, false).unwrap();
    expected.push(tokenizer.token_to_id("<|endoftext|>").unwrap());
    assert_eq!(tokens, expected);
}

#[test]
fn data_run_names_a_tokenize_token_missing_from_the_tokenizer() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir(dir.path().join("in")).unwrap();
    std::fs::write(dir.path().join("train.txt"), long_text()).unwrap();
    let trained = stoke()
        .args(["tokenizer", "train", "--vocab-size", "300", "--input"])
        .arg(dir.path().join("train.txt"))
        .arg("--output")
        .arg(dir.path().join("tok"))
        .output()
        .unwrap();
    assert!(
        trained.status.success(),
        "{}",
        String::from_utf8_lossy(&trained.stderr)
    );
    let config = format!(
        "{CONFIG}\n[tokenize]\ntokenizer = \"tok\"\nend_of_text = \"<eot>\"\noutput_dir = \"out/shards\"\n"
    );
    std::fs::write(dir.path().join("funnel.toml"), config).unwrap();
    let output = stoke()
        .arg("data")
        .arg("run")
        .arg(dir.path().join("funnel.toml"))
        .output()
        .unwrap();
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("<eot>"));
}
