//! `stoke tokenizer train|eval` and `stoke data tokenize|stats` from the outside.

use std::path::Path;
use std::process::{Command, Output};

fn stoke(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
        .args(args)
        .output()
        .unwrap()
}

fn ok(output: &Output) -> String {
    assert!(
        output.status.success(),
        "stderr: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8_lossy(&output.stdout).into_owned()
}

fn write_corpus(dir: &Path) -> (String, String) {
    let mut text = String::new();
    let mut jsonl = String::new();
    for i in 0..200 {
        let line = format!(
            "Document {i}: the tokenizer learns merges from frequent pairs, café {} naïve.\n",
            i * 7
        );
        text.push_str(&line);
        jsonl.push_str(&serde_json::json!({ "text": line, "id": i }).to_string());
        jsonl.push('\n');
    }
    jsonl.push_str("{\"id\": 999}\n"); // missing field
    jsonl.push_str("not json\n");
    let txt_path = dir.join("corpus.txt");
    let jsonl_path = dir.join("docs.jsonl");
    std::fs::write(&txt_path, text).unwrap();
    std::fs::write(&jsonl_path, jsonl).unwrap();
    (
        txt_path.display().to_string(),
        jsonl_path.display().to_string(),
    )
}

#[test]
fn train_eval_tokenize_and_stats_end_to_end() {
    let dir = tempfile::tempdir().unwrap();
    let (txt, jsonl) = write_corpus(dir.path());
    let tok = dir.path().join("tok").display().to_string();
    let tok_small = dir.path().join("tok_small").display().to_string();
    let out = ok(&stoke(&[
        "tokenizer",
        "train",
        "--input",
        &txt,
        &jsonl,
        "--vocab-size",
        "400",
        "--output",
        &tok,
    ]));
    assert!(out.contains("vocabulary 400"), "{out}");
    let loaded = tokenizers::Tokenizer::from_file(Path::new(&tok).join("tokenizer.json")).unwrap();
    assert_eq!(loaded.get_vocab_size(true), 400);
    ok(&stoke(&[
        "tokenizer",
        "train",
        "--input",
        &txt,
        "--vocab-size",
        "300",
        "--output",
        &tok_small,
    ]));

    let eval = ok(&stoke(&[
        "tokenizer",
        "eval",
        "--tokenizer",
        &tok,
        "--compare",
        &tok_small,
        "--input",
        &txt,
    ]));
    assert!(
        eval.contains("fertility") && eval.contains("tok_small"),
        "{eval}"
    );

    let shards = dir.path().join("shards").display().to_string();
    let output = stoke(&[
        "data",
        "tokenize",
        "--tokenizer",
        &tok,
        "--input",
        &jsonl,
        "--output",
        &shards,
        "--eos",
        "<|endoftext|>",
    ]);
    let stdout = ok(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stdout.contains("200 documents"), "{stdout}");
    // The two bad lines are reported with their line numbers (201, 202), not fatal.
    assert!(
        stderr.contains("docs.jsonl:201") && stderr.contains("docs.jsonl:202"),
        "{stderr}"
    );

    let reader = stoke_data::shard::open_dir(Path::new(&shards)).unwrap();
    let first = reader[0].document(0).unwrap().to_vec();
    let eos = loaded.token_to_id("<|endoftext|>").unwrap();
    assert_eq!(first.last(), Some(&eos));
    let text = loaded.decode(&first[..first.len() - 1], false).unwrap();
    assert!(text.starts_with("Document 0: the tokenizer"), "{text}");

    let stats = ok(&stoke(&["data", "stats", &shards]));
    assert!(stats.contains("documents: 200"), "{stats}");
    let stats = ok(&stoke(&["data", "stats", &jsonl]));
    assert!(
        stats.contains("documents: 200") && stats.contains("bad records: 2"),
        "{stats}"
    );
}

#[test]
fn strict_mode_fails_on_bad_records() {
    let dir = tempfile::tempdir().unwrap();
    let (_, jsonl) = write_corpus(dir.path());
    let tok = dir.path().join("tok").display().to_string();
    let output = stoke(&[
        "tokenizer",
        "train",
        "--input",
        &jsonl,
        "--vocab-size",
        "300",
        "--output",
        &tok,
        "--strict",
    ]);
    assert!(!output.status.success());
    assert!(String::from_utf8_lossy(&output.stderr).contains("docs.jsonl:201"));
}

#[test]
fn unreadable_input_is_reported_not_fatal() {
    let dir = tempfile::tempdir().unwrap();
    let (txt, _) = write_corpus(dir.path());
    let tok = dir.path().join("tok").display().to_string();
    let output = stoke(&[
        "tokenizer",
        "train",
        "--input",
        &txt,
        "/nonexistent/file.txt",
        "--vocab-size",
        "300",
        "--output",
        &tok,
    ]);
    ok(&output);
    assert!(String::from_utf8_lossy(&output.stderr).contains("/nonexistent/file.txt"));
}

#[test]
fn corrupt_shard_is_named_by_stats() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("x-00000.shard");
    std::fs::write(&path, b"STKSHARD garbage").unwrap();
    let stats = ok(&stoke(&[
        "data",
        "stats",
        &dir.path().display().to_string(),
    ]));
    assert!(
        stats.contains("bad shard") && stats.contains("x-00000.shard"),
        "{stats}"
    );
}
