//! `stoke prm`'s run (`prm::run::run_prm_with`) on the fixture PRM (fixtures/models/llama_prm)
//! and a handful of stepwise rows:
//!
//! - it trains (the loss falls on rows it sees every step), logs every step, saves `model/` as a
//!   `LlamaForTokenClassification` with its tokenizer, and scores the held-out rows;
//! - a run stopped and resumed ends with the weights of the uninterrupted run, bit for bit;
//! - a causal LM starts with a fresh two-label token head;
//! - a bad row fails the run with an error naming the file, the line and the field;
//! - `stoke dpo` refuses a PRM, naming `stoke prm`.

use std::path::{Path, PathBuf};

use stoke_train::prm::run::{PrmFile, run_prm_with};
use stoke_train::run::RunOptions;

fn fixture_model(name: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name)
}

const ROWS: &str = r#"{"prompt": "what is 2+3?", "completions": ["2+3 = 5.", "the answer is 5."], "labels": [true, true]}
{"prompt": "what is 4*2?", "completions": ["4*2 is 6.", "so the answer is 6."], "labels": [false, false]}
{"prompt": "is 7 odd?", "completions": ["7 = 2*3+1.", "7 is odd.", "yes."], "labels": [true, true, true]}
{"prompt": "what is 9+9?", "completions": ["9+9 = 18.", "18 = 2*9.", "thus 19."], "labels": [true, true, false]}
"#;

fn write_config(dir: &Path, model: &Path, steps: u64, extra: &str) -> PathBuf {
    std::fs::write(dir.join("steps.jsonl"), ROWS).unwrap();
    let path = dir.join("prm.toml");
    std::fs::write(
        &path,
        format!(
            r#"output_dir = "run"
[model]
path = "{}"
[data]
train = "steps.jsonl"
eval = "steps.jsonl"
rows_per_micro_batch = 2
micro_batches = 2
[optimizer]
lr = 0.01
[schedule]
kind = "constant"
[training]
steps = {steps}
{extra}"#,
            model.display()
        ),
    )
    .unwrap();
    path
}

fn quiet() -> RunOptions {
    RunOptions {
        quiet: true,
        ..RunOptions::default()
    }
}

fn weights(dir: &Path) -> Vec<(String, Vec<f32>)> {
    let model = stoke_model::Transformer::load(dir, &candle_core::Device::Cpu).unwrap();
    model
        .parameters()
        .into_iter()
        .map(|(name, var)| {
            let values = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            (name, values)
        })
        .collect()
}

#[test]
fn a_prm_run_trains_logs_saves_a_token_classifier_and_scores_held_out_rows() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fixture_model("llama_prm"), 6, "");
    let file = PrmFile::load(&config, &[]).unwrap();
    let summary = run_prm_with(&file, &quiet()).unwrap();
    assert_eq!(summary.steps, 6);
    assert_eq!(summary.rows, 4);
    let metrics = std::fs::read_to_string(&summary.metrics_path).unwrap();
    let losses: Vec<f64> = metrics
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|v| v["kind"] == "step")
        .map(|v| v["loss"].as_f64().unwrap())
        .collect();
    assert_eq!(losses.len(), 6);
    assert!(
        losses[5] < losses[0],
        "the loss did not fall over the run: {losses:?}"
    );
    let config_json: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(summary.model_dir.join("config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        config_json["architectures"],
        serde_json::json!(["LlamaForTokenClassification"])
    );
    assert!(summary.model_dir.join("tokenizer.json").exists());
    let (rows, figures) = summary.eval.expect("held-out figures");
    assert_eq!(rows, 4);
    let eval: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("run/eval.json")).unwrap())
            .unwrap();
    let accuracy = figures.iter().find(|(k, _)| *k == "accuracy").unwrap().1;
    assert_eq!(eval["metrics"]["accuracy"].as_f64().unwrap(), accuracy);
    assert_eq!(eval["metrics"]["labelled_steps"].as_f64().unwrap(), 10.0);
    assert!(summary.report_path.exists());
}

#[test]
fn a_resumed_prm_run_ends_with_the_uninterrupted_runs_weights() {
    let whole = tempfile::tempdir().unwrap();
    let config = write_config(
        whole.path(),
        &fixture_model("llama_prm"),
        4,
        "[checkpoint]\nevery = 2\n",
    );
    let summary = run_prm_with(&PrmFile::load(&config, &[]).unwrap(), &quiet()).unwrap();
    let uninterrupted = weights(&summary.model_dir);

    let parts = tempfile::tempdir().unwrap();
    let config = write_config(
        parts.path(),
        &fixture_model("llama_prm"),
        2,
        "[checkpoint]\nevery = 2\n",
    );
    run_prm_with(&PrmFile::load(&config, &[]).unwrap(), &quiet()).unwrap();
    let file = PrmFile::load(&config, &["training.steps=4".to_string()]).unwrap();
    // A fresh start into the folder is refused; --resume continues.
    let refused = run_prm_with(&file, &quiet()).unwrap_err().to_string();
    assert!(refused.contains("resume"), "{refused}");
    let summary = run_prm_with(
        &file,
        &RunOptions {
            resume: true,
            quiet: true,
            ..RunOptions::default()
        },
    )
    .unwrap();
    assert!(summary.resumed_from.is_some());
    assert_eq!(summary.steps, 4);
    assert_eq!(weights(&summary.model_dir), uninterrupted);
    // What changes the training is refused on resume, naming the key.
    let changed = PrmFile::load(
        &config,
        &[
            "training.steps=6".to_string(),
            "prm.train_on_last_step_only=true".to_string(),
        ],
    )
    .unwrap();
    let refused = run_prm_with(
        &changed,
        &RunOptions {
            resume: true,
            quiet: true,
            ..RunOptions::default()
        },
    )
    .unwrap_err()
    .to_string();
    assert!(refused.contains("prm.train_on_last_step_only"), "{refused}");
}

#[test]
fn a_causal_lm_starts_with_a_fresh_two_label_token_head() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fixture_model("llama_gqa_rope_llama3"), 1, "");
    let summary = run_prm_with(&PrmFile::load(&config, &[]).unwrap(), &quiet()).unwrap();
    let model =
        stoke_model::Transformer::load(&summary.model_dir, &candle_core::Device::Cpu).unwrap();
    assert!(model.is_token_classifier());
    assert_eq!(model.config().score_labels, Some(2));
}

#[test]
fn a_bad_row_fails_the_run_naming_the_file_line_and_field() {
    let dir = tempfile::tempdir().unwrap();
    let config = write_config(dir.path(), &fixture_model("llama_prm"), 1, "");
    std::fs::write(
        dir.path().join("steps.jsonl"),
        format!(
            "{ROWS}{{\"prompt\": \"p\", \"completions\": [\"a\", \"b\"], \"labels\": [true]}}\n"
        ),
    )
    .unwrap();
    let err = run_prm_with(&PrmFile::load(&config, &[]).unwrap(), &quiet())
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("steps.jsonl") && err.contains("line 5") && err.contains("`labels`"),
        "{err}"
    );
}

#[test]
fn stoke_dpo_refuses_a_process_reward_model_naming_stoke_prm() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(
        dir.path().join("pairs.jsonl"),
        "{\"prompt\": \"what is 2+3?\", \"chosen\": \"5\", \"rejected\": \"6\"}\n",
    )
    .unwrap();
    let config = dir.path().join("dpo.toml");
    std::fs::write(
        &config,
        format!(
            "output_dir = \"run\"\n[model]\npath = \"{}\"\n[data]\ntrain = \"pairs.jsonl\"\n\
             [training]\nsteps = 1\n",
            fixture_model("llama_prm").display()
        ),
    )
    .unwrap();
    let file = stoke_train::preference::run::PreferenceFile::load(&config, &[]).unwrap();
    let err = stoke_train::preference::run::run_preference(&file, true)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("model.path") && err.contains("stoke prm"),
        "{err}"
    );
}
