//! `stoke verify` from the outside: scoring, pass-through fields, malformed lines, configs,
//! group-level rewards and code rewards.

use std::path::Path;
use std::process::{Command, Output};

fn stoke() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
}

fn verify(dir: &Path, input: &str, extra: &[&str]) -> (Output, Vec<serde_json::Value>) {
    let input_path = dir.join("in.jsonl");
    let output_path = dir.join("out.jsonl");
    std::fs::write(&input_path, input).unwrap();
    let output = stoke()
        .arg("verify")
        .args(extra)
        .arg("--input")
        .arg(&input_path)
        .arg("--output")
        .arg(&output_path)
        .output()
        .unwrap();
    let lines = std::fs::read_to_string(&output_path)
        .unwrap_or_default()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    (output, lines)
}

#[test]
fn math_lines_get_reward_outcome_and_details_and_keep_their_fields() {
    let dir = tempfile::tempdir().unwrap();
    let input = concat!(
        r#"{"id": 1, "completion": "so \\boxed{\\frac{1}{2}}", "answer": "0.5"}"#,
        "\n",
        "{\"id\": 2, \"completion\": \"#### 72\", \"answer\": 72}",
        "\n",
        r#"{"id": 3, "completion": "\\boxed{3}", "answer": "4"}"#,
        "\n",
        r#"{"id": 4, "completion": "\\boxed{3}", "answer": "\\frac{1}{"}"#,
        "\n",
    );
    let (output, lines) = verify(dir.path(), input, &["--reward", "math"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(lines.len(), 4);
    let outcomes: Vec<&str> = lines
        .iter()
        .map(|l| l["outcome"].as_str().unwrap())
        .collect();
    assert_eq!(
        outcomes,
        ["correct", "correct", "wrong", "unparseable_gold"]
    );
    assert_eq!(lines[0]["id"], 1);
    assert_eq!(lines[0]["reward"], 1.0);
    assert_eq!(lines[0]["details"]["extracted"], "\\frac{1}{2}");
    assert!(stderr.contains("4 scored"), "{stderr}");
    assert!(stderr.contains("correct=2"), "{stderr}");
    assert!(stderr.contains("samples/s"), "{stderr}");
}

#[test]
fn explain_prints_extraction_normalized_forms_and_rule_per_line() {
    let dir = tempfile::tempdir().unwrap();
    let input = concat!(
        r#"{"completion": "so $\\boxed{\\dfrac{14}{3}}$.", "answer": "\\frac{14}{3}"}"#,
        "\n",
        r#"{"completion": "The answer is at least 12.", "answer": "12"}"#,
        "\n",
    );
    let (output, lines) = verify(dir.path(), input, &["--reward", "math", "--explain"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(lines[0]["explain"]["source"], "Boxed");
    assert_eq!(lines[0]["explain"]["normalized_prediction"], "(14 / 3)");
    assert_eq!(lines[0]["explain"]["rule"], "exact rational");
    assert_eq!(lines[1]["outcome"], "unparseable_prediction");
    assert!(
        stderr.contains("in.jsonl:1: correct | extracted \\dfrac{14}{3} (from Boxed)"),
        "{stderr}"
    );
    assert!(
        stderr.contains("in.jsonl:2: unparseable_prediction"),
        "{stderr}"
    );
    let (output, _) = verify(dir.path(), input, &["--reward", "exact_match", "--explain"]);
    assert!(!output.status.success());
    assert!(
        String::from_utf8_lossy(&output.stderr)
            .contains("--explain is available for --reward math only")
    );
}

#[test]
fn malformed_lines_are_reported_with_line_numbers_and_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let input = concat!(
        r#"{"completion": "\\boxed{1}", "answer": "1"}"#,
        "\n",
        "not json\n",
        r#"{"answer": "1"}"#,
        "\n",
        "\n",
        r#"{"completion": 5, "answer": "1"}"#,
        "\n",
        r#"{"completion": "\\boxed{2}", "answer": "2"}"#,
        "\n",
    );
    let (output, lines) = verify(dir.path(), input, &["--reward", "math"]);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert_eq!(lines.len(), 2);
    assert!(stderr.contains("in.jsonl:2: skipped: not JSON"), "{stderr}");
    assert!(
        stderr.contains("in.jsonl:3: skipped: missing field `completion`"),
        "{stderr}"
    );
    assert!(
        stderr.contains("in.jsonl:5: skipped: field `completion`"),
        "{stderr}"
    );
    assert!(stderr.contains("3 malformed lines skipped"), "{stderr}");
}

#[test]
fn config_files_set_options_and_unknown_keys_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("reward.toml");
    std::fs::write(&config, "mode = \"choice\"\n").unwrap();
    let input = "{\"completion\": \"The answer is (C).\", \"answer\": \"C\"}\n";
    let (output, lines) = verify(
        dir.path(),
        input,
        &[
            "--reward",
            "exact_match",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(lines[0]["outcome"], "correct");

    std::fs::write(&config, "mode = \"choice\"\nmdoe = 1\n").unwrap();
    let (output, _) = verify(
        dir.path(),
        input,
        &[
            "--reward",
            "exact_match",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("mdoe"), "{stderr}");

    let (output, _) = verify(dir.path(), input, &["--reward", "no_such_kind"]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("unknown reward kind"));
}

#[test]
fn composite_group_length_scores_groups_by_prompt() {
    let dir = tempfile::tempdir().unwrap();
    let config = dir.path().join("reward.toml");
    std::fs::write(
        &config,
        r#"
[[components]]
correctness = true
reward = { kind = "math" }
[[components]]
weight = 0.5
reward = { kind = "group_length" }
"#,
    )
    .unwrap();
    let input = concat!(
        r#"{"prompt": "p1", "completion": "\\boxed{2}", "answer": "2", "completion_tokens": 10}"#,
        "\n",
        r#"{"prompt": "p1", "completion": "\\boxed{2}", "answer": "2", "completion_tokens": 30}"#,
        "\n",
        r#"{"prompt": "p2", "completion": "\\boxed{5}", "answer": "2", "completion_tokens": 99}"#,
        "\n",
    );
    let (output, lines) = verify(
        dir.path(),
        input,
        &[
            "--reward",
            "composite",
            "--config",
            config.to_str().unwrap(),
        ],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    let rewards: Vec<f64> = lines
        .iter()
        .map(|l| l["reward"].as_f64().unwrap())
        .collect();
    // p1: short correct 1 + 0.5 * 0.5, long correct 1 + 0.5 * -0.5; p2 alone: wrong, lambda 0.
    assert_eq!(rewards, [1.25, 0.75, 0.0]);
    assert_eq!(
        lines[0]["details"]["components"].as_array().unwrap().len(),
        2
    );
}

#[test]
fn stdio_tests_run_in_the_sandbox() {
    let dir = tempfile::tempdir().unwrap();
    let input = concat!(
        r#"{"completion": "```python\nprint(sum(map(int, input().split())))\n```", "cases": [{"input": "1 2\n", "output": "3"}, {"input": "5 5\n", "output": "10\n"}]}"#,
        "\n",
        r#"{"completion": "print(3)", "cases": [{"input": "1 2\n", "output": "3"}, {"input": "5 5\n", "output": "10"}]}"#,
        "\n",
    );
    let (output, lines) = verify(
        dir.path(),
        input,
        &["--reward", "stdio_tests", "--min-isolation", "basic"],
    );
    assert!(
        output.status.success(),
        "{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert_eq!(lines[0]["outcome"], "correct");
    assert_eq!(lines[1]["outcome"], "partial");
    assert_eq!(lines[1]["reward"], 0.5);
    assert!(lines[0]["details"]["isolation"].is_string());
}

#[test]
fn large_inputs_stream_in_order_and_non_utf8_lines_are_skipped() {
    let dir = tempfile::tempdir().unwrap();
    let mut input = Vec::new();
    for id in 0..5_000 {
        input.extend_from_slice(
            format!(
                "{{\"id\": {id}, \"completion\": \"\\\\boxed{{{id}}}\", \"answer\": \"{}\"}}\n",
                id % 7
            )
            .as_bytes(),
        );
        if id == 4_500 {
            input.extend_from_slice(b"{\"completion\": \"\xff\xfe\"}\n");
        }
    }
    let input_path = dir.path().join("big.jsonl");
    let output_path = dir.path().join("big.out.jsonl");
    std::fs::write(&input_path, &input).unwrap();
    let output = stoke()
        .args(["verify", "--reward", "math", "--input"])
        .arg(&input_path)
        .arg("--output")
        .arg(&output_path)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(output.status.success(), "{stderr}");
    assert!(
        stderr.contains("big.jsonl:4502: skipped: not UTF-8"),
        "{stderr}"
    );
    let text = std::fs::read_to_string(&output_path).unwrap();
    let ids: Vec<i64> = text
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_i64()
                .unwrap()
        })
        .collect();
    assert_eq!(ids, (0..5_000).collect::<Vec<_>>());
    let correct = text
        .lines()
        .filter(|l| l.contains("\"outcome\":\"correct\""))
        .count();
    assert_eq!(correct, 7);
}
