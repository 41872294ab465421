//! `run` end to end on chat data: SFT of a tiny pretrained Qwen2 fixture (vocab 300) on chat
//! JSONL learns the assistant replies, evaluates loss and bits-per-byte, and writes a model
//! folder with the tokenizer files; bits-per-byte counts every byte of the text once.

use std::path::{Path, PathBuf};

use serde_json::json;
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::config::{ConfigFile, TrainConfig};
use stoke_train::eval::bytes_per_token;
use stoke_train::run::{RunOptions, run};

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

fn write_chat(path: &Path, first: usize, count: usize) {
    let lines: Vec<String> = (first..first + count)
        .map(|k| {
            let (a, b) = (k % 7, (k / 7) % 5);
            json!({"messages": [
                {"role": "user", "content": format!("add {a} {b}")},
                {"role": "assistant", "content": format!("sum {}", a + b)},
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(path, lines.join("\n") + "\n").unwrap();
}

#[test]
fn sft_run_learns_assistant_replies_and_reports_bits_per_byte() {
    let dir = tempfile::tempdir().unwrap();
    write_chat(&dir.path().join("train.jsonl"), 0, 120);
    write_chat(&dir.path().join("eval.jsonl"), 200, 16);
    let text = format!(
        r#"
output_dir = "run"
[model]
pretrained = "{}"
[data]
kind = "chat"
train = ["train.jsonl"]
eval = ["eval.jsonl"]
seq_len = 128
micro_batch_size = 4
[optimizer]
kind = "adamw"
lr = 0.01
weight_decay = 0.0
[schedule]
kind = "constant"
warmup_steps = 2
[training]
steps = 40
[eval]
every = 20
batches = 2
"#,
        fixture().display()
    );
    let table: toml::Table = toml::from_str(&text).unwrap();
    let config =
        TrainConfig::from_file(ConfigFile::from_table(table, "sft").unwrap(), dir.path()).unwrap();
    assert_eq!(
        config.model.tokenizer.as_deref(),
        Some(fixture().as_path()),
        "tokenizer from the model folder"
    );
    let options = RunOptions {
        quiet: true,
        measure_mfu: false,
        ..RunOptions::default()
    };
    let summary = run(config, options).unwrap();
    assert_eq!(summary.steps, 40);
    let records =
        stoke_train::metrics::MetricsLog::read_all(&dir.path().join("run/metrics.jsonl")).unwrap();
    let losses: Vec<f64> = records
        .iter()
        .filter_map(|r| match r {
            stoke_train::metrics::MetricRecord::Step(m) => Some(m.loss),
            _ => None,
        })
        .collect();
    assert_eq!(losses.len(), 40);
    let first = losses[..4].iter().sum::<f64>() / 4.0;
    let last = losses[36..].iter().sum::<f64>() / 4.0;
    assert!(
        last < 0.5 * first,
        "SFT loss should fall: {first} -> {last}"
    );
    let eval = summary.final_eval.expect("eval set");
    let bpb = eval.bits_per_byte.expect("a tokenizer gives bits per byte");
    assert!(bpb.is_finite() && bpb > 0.0, "{bpb}");
    assert!(
        eval.loss < first,
        "held-out loss {} vs first train loss {first}",
        eval.loss
    );
    assert!(summary.model_dir.join("tokenizer.json").exists());
    assert!(summary.model_dir.join("model.safetensors").exists());
    assert!(summary.report.expect("report").exists());
}

/// Summing the byte count of each token of an encoded text gives the text's UTF-8 length, also
/// for characters split across byte-level tokens.
#[test]
fn bytes_per_token_sums_to_the_text_bytes() {
    let tokenizer = Tokenizer::from_dir(&fixture()).unwrap();
    let table = bytes_per_token(&tokenizer, tokenizer.vocab_size());
    for text in ["sum 12 and 7", "héllo wörld — ok", "日本語 text"] {
        let ids = tokenizer.encode(text, false).unwrap();
        let total: u64 = ids.iter().map(|&id| table[id as usize] as u64).sum();
        assert_eq!(total, text.len() as u64, "{text:?}: {ids:?}");
    }
    let eos = tokenizer.eos_token_ids()[0];
    assert_eq!(table[eos as usize], 0, "special tokens carry no text bytes");
}
