//! The `stoke score`, `stoke generate` and `stoke inspect` commands, run as the built binary on
//! the fixture checkpoints (fixtures/models) and on broken copies made in a temporary directory.
//!
//! Each error test checks one class of bad input: the process exits non-zero without panicking
//! and prints one `error:` line that names the file and the field or tensor at fault.

use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use safetensors::{Dtype, SafeTensors, tensor::TensorView};
use serde_json::Value;

const FIXTURE: &str = "llama_gqa_rope_llama3";

fn fixture_dir(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name)
}

fn stoke(args: &[&str]) -> Output {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
        .args(args)
        .output()
        .expect("the stoke binary runs")
}

fn stdout_of(output: &Output) -> String {
    assert!(
        output.status.success(),
        "stoke failed: {}",
        String::from_utf8_lossy(&output.stderr)
    );
    String::from_utf8(output.stdout.clone()).expect("stdout is UTF-8")
}

/// Asserts a clean failure: non-zero exit (not a panic), one `error:` line containing every
/// string of `needles`. Returns the line.
fn assert_one_line_error(output: &Output, needles: &[&str]) -> String {
    let stderr = String::from_utf8_lossy(&output.stderr).to_string();
    assert!(
        !output.status.success(),
        "expected failure, got success; stdout: {}",
        String::from_utf8_lossy(&output.stdout)
    );
    assert_eq!(
        output.status.code(),
        Some(1),
        "exit code (101 would be a panic); stderr: {stderr}"
    );
    assert!(!stderr.contains("panicked"), "panic: {stderr}");
    let lines: Vec<&str> = stderr.lines().collect();
    assert_eq!(lines.len(), 1, "one line expected: {stderr}");
    assert!(lines[0].starts_with("error: "), "{stderr}");
    for needle in needles {
        assert!(
            lines[0].contains(needle),
            "error should mention {needle:?}: {stderr}"
        );
    }
    lines[0].to_string()
}

/// A copy of the fixture model directory in a fresh temporary directory.
fn broken_copy() -> (tempfile::TempDir, PathBuf) {
    let temp = tempfile::tempdir().expect("temp dir");
    let dir = temp.path().join("model");
    std::fs::create_dir(&dir).unwrap();
    for entry in std::fs::read_dir(fixture_dir(FIXTURE)).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    (temp, dir)
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, Value>)) {
    let path = dir.join("config.json");
    let mut config: Value = serde_json::from_str(&std::fs::read_to_string(&path).unwrap()).unwrap();
    edit(config.as_object_mut().unwrap());
    std::fs::write(&path, serde_json::to_string_pretty(&config).unwrap()).unwrap();
}

/// Rewrites dir/model.safetensors with `edit` applied to the (name, dtype, shape, bytes) list.
fn edit_weights(dir: &Path, edit: impl FnOnce(&mut Vec<(String, Dtype, Vec<usize>, Vec<u8>)>)) {
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let mut entries: Vec<(String, Dtype, Vec<usize>, Vec<u8>)> = tensors
        .tensors()
        .into_iter()
        .map(|(name, view)| {
            (
                name,
                view.dtype(),
                view.shape().to_vec(),
                view.data().to_vec(),
            )
        })
        .collect();
    edit(&mut entries);
    let views: Vec<(String, TensorView)> = entries
        .iter()
        .map(|(name, dtype, shape, data)| {
            (
                name.clone(),
                TensorView::new(*dtype, shape.clone(), data).unwrap(),
            )
        })
        .collect();
    std::fs::write(&path, safetensors::serialize(views, None).unwrap()).unwrap();
}

fn reference_tensor(name: &str) -> (Vec<usize>, Vec<u8>) {
    let bytes = std::fs::read(fixture_dir(FIXTURE).join("reference.safetensors")).unwrap();
    let tensors = SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(name).unwrap();
    (view.shape().to_vec(), view.data().to_vec())
}

fn ids_argument(ids: &[u32]) -> String {
    ids.iter().map(u32::to_string).collect::<Vec<_>>().join(",")
}

#[test]
fn score_matches_the_reference_log_softmax() {
    let (_, id_bytes) = reference_tensor("input_ids_a");
    let ids: Vec<u32> = id_bytes
        .chunks(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    let (shape, logit_bytes) = reference_tensor("logits_a");
    let vocab = shape[2];
    let logits: Vec<f64> = logit_bytes
        .chunks(4)
        .map(|b| f32::from_le_bytes(b.try_into().unwrap()) as f64)
        .collect();

    let model = fixture_dir(FIXTURE);
    let output = stoke(&[
        "score",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        &ids_argument(&ids),
    ]);
    let printed: Value = serde_json::from_str(&stdout_of(&output)).unwrap();
    let tokens: Vec<u32> = serde_json::from_value(printed["tokens"].clone()).unwrap();
    let logprobs: Vec<f64> =
        serde_json::from_value(printed["next_token_logprobs"].clone()).unwrap();
    assert_eq!(tokens, ids);
    assert_eq!(logprobs.len(), ids.len() - 1);
    for (i, got) in logprobs.iter().enumerate() {
        let row = &logits[i * vocab..(i + 1) * vocab];
        let max = row.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
        let log_normalizer = max + row.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
        let want = row[ids[i + 1] as usize] - log_normalizer;
        assert!(
            (got - want).abs() < 1e-4,
            "position {i}: {got} vs reference {want}"
        );
    }
}

#[test]
fn score_text_tokenizes_with_the_model_tokenizer() {
    let model = fixture_dir(FIXTURE);
    let text = stoke(&[
        "score",
        "--model",
        model.to_str().unwrap(),
        "--text",
        "hello world",
    ]);
    let text: Value = serde_json::from_str(&stdout_of(&text)).unwrap();
    let tokens: Vec<u32> = serde_json::from_value(text["tokens"].clone()).unwrap();
    assert!(tokens.len() >= 2, "{tokens:?}");
    // The same ids given directly score the same.
    let ids = stoke(&[
        "score",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        &ids_argument(&tokens),
    ]);
    let ids: Value = serde_json::from_str(&stdout_of(&ids)).unwrap();
    assert_eq!(ids, text);
}

#[test]
fn generate_prints_reproducible_json_lines() {
    let model = fixture_dir(FIXTURE);
    let args = [
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "hello",
        "--max-tokens",
        "6",
        "--temperature",
        "0.9",
        "--top-p",
        "0.95",
        "--top-k",
        "40",
        "--seed",
        "3",
        "-n",
        "3",
    ];
    let first = stdout_of(&stoke(&args));
    assert_eq!(first, stdout_of(&stoke(&args)), "same seed, same output");
    let lines: Vec<Value> = first
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(lines.len(), 3);
    for (j, line) in lines.iter().enumerate() {
        assert_eq!(line["sample_index"], j);
        let ids = line["token_ids"].as_array().unwrap();
        let logprobs = line["logprobs"].as_array().unwrap();
        assert!(!ids.is_empty() && ids.len() <= 6);
        assert_eq!(ids.len(), logprobs.len());
        assert!(logprobs.iter().all(|lp| lp.as_f64().unwrap() <= 0.0));
        assert!(line["text"].is_string());
        assert!(line["finish_reason"]["kind"].is_string());
    }
}

/// `--precision bf16` packs the weights and decodes: reproducible, valid log-probs, and its
/// greedy log-probs close to f32's (bf16 rounding, not a different model); a bad value is named.
#[test]
fn generate_in_bf16_is_reproducible_and_close_to_f32() {
    let model = fixture_dir(FIXTURE);
    let run = |precision: &str| {
        let args = [
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "1,2,3",
            "--max-tokens",
            "1",
            "--temperature",
            "0",
            "--precision",
            precision,
        ];
        let out = stdout_of(&stoke(&args));
        let line: Value = serde_json::from_str(out.lines().next().unwrap()).unwrap();
        (out, line["logprobs"][0].as_f64().unwrap())
    };
    let (bf16_out, bf16_lp) = run("bf16");
    assert_eq!(bf16_out, run("bf16").0, "bf16 is deterministic");
    let (_, f32_lp) = run("f32");
    assert!(bf16_lp <= 0.0);
    assert!(
        (bf16_lp - f32_lp).abs() < 0.05,
        "bf16 {bf16_lp} vs f32 {f32_lp}"
    );
    let bad = stoke(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "1",
        "--precision",
        "fp8",
    ]);
    assert!(!bad.status.success());
    let stderr = String::from_utf8_lossy(&bad.stderr);
    assert!(
        stderr.contains("fp8") && stderr.contains("precision"),
        "{stderr}"
    );
}

#[test]
fn generate_chat_renders_the_template_and_text_format_is_readable() {
    let model = fixture_dir(FIXTURE);
    let output = stoke(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt",
        "hi",
        "--chat",
        "--max-tokens",
        "4",
        "--temperature",
        "0",
        "--format",
        "text",
    ]);
    let text = stdout_of(&output);
    assert!(text.starts_with("--- completion 0 ("), "{text}");
}

/// Regression: the text format printed the finish reason as a JSON fragment
/// (`finish: {"kind":"length"}`); it says `length` or `stop`, as OpenAI's API words it.
#[test]
fn generate_text_format_names_the_finish_reason_in_a_word() {
    let model = fixture_dir(FIXTURE);
    let run = |format: &str| {
        stdout_of(&stoke(&[
            "generate",
            "--model",
            model.to_str().unwrap(),
            "--prompt-ids",
            "1,17,250,42",
            "--max-tokens",
            "3",
            "--temperature",
            "0",
            "-n",
            "1",
            "--format",
            format,
        ]))
    };
    let json: Value = serde_json::from_str(run("json").lines().next().unwrap()).unwrap();
    let expected = match json["finish_reason"]["kind"].as_str().unwrap() {
        "length" => "length",
        _ => "stop",
    };
    let text = run("text");
    let header = text.lines().next().unwrap();
    assert!(
        header.ends_with(&format!("finish: {expected}) ---")),
        "{header}"
    );
}

#[test]
fn inspect_prints_config_and_parameter_count() {
    let model = fixture_dir(FIXTURE);
    let printed: Value = serde_json::from_str(&stdout_of(&stoke(&[
        "inspect",
        "--model",
        model.to_str().unwrap(),
    ])))
    .unwrap();
    // Count the parameters stored in the checkpoint.
    let bytes = std::fs::read(model.join("model.safetensors")).unwrap();
    let stored: usize = SafeTensors::deserialize(&bytes)
        .unwrap()
        .tensors()
        .iter()
        .map(|(_, view)| view.shape().iter().product::<usize>())
        .sum();
    assert_eq!(printed["num_parameters"].as_u64().unwrap() as usize, stored);
    assert_eq!(printed["config"]["vocab_size"], 300);
}

/// A DeepSeek-V3 checkpoint: inspect shows its latent attention, its routing and its MTP modules.
#[test]
fn inspect_shows_mla_routing_and_mtp_modules() {
    let model = fixture_dir("deepseek_v3_mtp");
    let printed: Value = serde_json::from_str(&stdout_of(&stoke(&[
        "inspect",
        "--model",
        model.to_str().unwrap(),
    ])))
    .unwrap();
    let config = &printed["config"];
    assert_eq!(config["model_type"], "deepseek_v3");
    assert_eq!(config["mla"]["kv_lora_rank"], 12);
    assert_eq!(config["mla"]["q_lora_rank"], Value::Null);
    assert_eq!(config["moe"]["num_experts"], 4);
    assert_eq!(config["moe"]["router"]["sigmoid"]["route_scale"], 1.5);
    assert_eq!(config["num_mtp_layers"], 2);
}

#[test]
fn missing_model_directory_is_reported() {
    let output = stoke(&[
        "score",
        "--model",
        "/nonexistent/stoke-model",
        "--ids",
        "1,2",
    ]);
    assert_one_line_error(&output, &["/nonexistent/stoke-model"]);
}

#[test]
fn malformed_config_names_the_file_and_position() {
    let (_temp, dir) = broken_copy();
    std::fs::write(dir.join("config.json"), "{\"vocab_size\": 300,").unwrap();
    let output = stoke(&["inspect", "--model", dir.to_str().unwrap()]);
    assert_one_line_error(&output, &["config.json"]);
}

#[test]
fn unsupported_config_value_names_the_field() {
    let (_temp, dir) = broken_copy();
    edit_config(&dir, |config| {
        config.insert("hidden_act".into(), Value::from("gelu_fast"));
    });
    let output = stoke(&["score", "--model", dir.to_str().unwrap(), "--ids", "1,2"]);
    assert_one_line_error(&output, &["config.json", "hidden_act"]);
}

#[test]
fn missing_tensor_is_named() {
    let (_temp, dir) = broken_copy();
    let missing = "model.layers.1.mlp.down_proj.weight";
    edit_weights(&dir, |entries| entries.retain(|(name, ..)| name != missing));
    let output = stoke(&["score", "--model", dir.to_str().unwrap(), "--ids", "1,2"]);
    assert_one_line_error(&output, &[missing]);
}

#[test]
fn tensor_shape_mismatch_names_the_tensor_and_shapes() {
    let (_temp, dir) = broken_copy();
    let name = "model.layers.0.mlp.up_proj.weight";
    edit_weights(&dir, |entries| {
        let entry = entries.iter_mut().find(|(n, ..)| n == name).unwrap();
        entry.2.reverse(); // [64, 32] -> [32, 64]
    });
    let output = stoke(&["score", "--model", dir.to_str().unwrap(), "--ids", "1,2"]);
    assert_one_line_error(&output, &[name, "model.safetensors"]);
}

#[test]
fn wrong_tensor_dtype_names_the_tensor() {
    let (_temp, dir) = broken_copy();
    let name = "model.norm.weight";
    edit_weights(&dir, |entries| {
        let entry = entries.iter_mut().find(|(n, ..)| n == name).unwrap();
        entry.1 = Dtype::I32; // same byte size as f32, so only the dtype is wrong
    });
    let output = stoke(&["score", "--model", dir.to_str().unwrap(), "--ids", "1,2"]);
    assert_one_line_error(&output, &[name]);
}

#[test]
fn truncated_safetensors_names_the_file() {
    let (_temp, dir) = broken_copy();
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() / 2]).unwrap();
    let output = stoke(&["score", "--model", dir.to_str().unwrap(), "--ids", "1,2"]);
    assert_one_line_error(&output, &["model.safetensors"]);
}

#[test]
fn token_id_outside_the_vocabulary_is_rejected() {
    let model = fixture_dir(FIXTURE);
    let output = stoke(&[
        "score",
        "--model",
        model.to_str().unwrap(),
        "--ids",
        "1,300",
    ]);
    assert_one_line_error(&output, &["--ids", "300", "vocab_size"]);
    let output = stoke(&[
        "generate",
        "--model",
        model.to_str().unwrap(),
        "--prompt-ids",
        "5000",
    ]);
    assert_one_line_error(&output, &["--prompt-ids", "5000", "vocab_size"]);
}

#[test]
fn ids_that_are_not_u32_integers_are_rejected() {
    let model = fixture_dir(FIXTURE);
    for bad in ["-1", "4294967296", "1,x", "1,,2"] {
        let output = stoke(&["score", "--model", model.to_str().unwrap(), "--ids", bad]);
        assert_one_line_error(&output, &["--ids", "not a token id"]);
    }
}

/// `stoke merge` folds a PEFT adapter (fixtures/peft) into its base: the merged model scores a
/// sequence as the base plus `--adapter` does, and differently from the bare base; a missing
/// adapter directory is named.
#[test]
fn merge_folds_a_peft_adapter_and_scores_like_the_adapter() {
    let base = fixture_dir(FIXTURE);
    let adapter = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/peft/llama_gqa_all_linear_rslora");
    let out = tempfile::tempdir().unwrap();
    let merged = out.path().join("merged");
    let report = stdout_of(&stoke(&[
        "merge",
        "--model",
        base.to_str().unwrap(),
        "--adapter",
        adapter.to_str().unwrap(),
        "--out",
        merged.to_str().unwrap(),
    ]));
    let report: Value = serde_json::from_str(report.trim()).unwrap();
    assert_eq!(report["r"], 3);
    assert!(
        merged.join("tokenizer.json").is_file(),
        "the tokenizer was not copied"
    );
    let score = |model: &std::path::Path, adapter: Option<&std::path::Path>| -> Vec<f64> {
        let mut args = vec![
            "score",
            "--model",
            model.to_str().unwrap(),
            "--ids",
            "5,17,2,99,4",
        ];
        if let Some(a) = adapter {
            args.extend(["--adapter", a.to_str().unwrap()]);
        }
        let v: Value = serde_json::from_str(stdout_of(&stoke(&args)).trim()).unwrap();
        v["next_token_logprobs"]
            .as_array()
            .unwrap()
            .iter()
            .map(|x| x.as_f64().unwrap())
            .collect()
    };
    let (with_adapter, from_merged, bare) = (
        score(&base, Some(&adapter)),
        score(&merged, None),
        score(&base, None),
    );
    for (a, m) in with_adapter.iter().zip(&from_merged) {
        assert!((a - m).abs() < 1e-4, "adapter {a} vs merged {m}");
    }
    assert!(
        with_adapter
            .iter()
            .zip(&bare)
            .any(|(a, b)| (a - b).abs() > 1e-2),
        "the adapter changed nothing"
    );
    let missing = stoke(&[
        "merge",
        "--model",
        base.to_str().unwrap(),
        "--adapter",
        "/nonexistent/adapter",
        "--out",
        out.path().join("x").to_str().unwrap(),
    ]);
    assert!(!missing.status.success());
    let stderr = String::from_utf8_lossy(&missing.stderr);
    assert!(stderr.contains("/nonexistent/adapter"), "{stderr}");
    assert!(
        !out.path().join("x").exists(),
        "a failed merge wrote output"
    );
}
