//! `run` with `resume`: continuing a finished run to more steps gives the weights of one longer
//! run; a resume that changes the math is refused naming the field; a fresh start into a run
//! folder with checkpoints is refused.

use std::path::Path;

use stoke_train::config::TrainConfig;
use stoke_train::error::TrainError;
use stoke_train::run::{RunOptions, run};

mod common;
use common::{run_config, run_options, write_pattern_shards};

const CONFIG: &str = r#"
output_dir = "run"
[model]
preset = "nano"
vocab_size = 300
[data]
kind = "shards"
train = ["shards"]
seq_len = 32
micro_batch_size = 2
grad_accum_steps = 2
[optimizer]
kind = "adamw"
[schedule]
kind = "constant"
warmup_steps = 2
[training]
steps = 6
[training.spike]
min_history = 2
[checkpoint]
every = 3
"#;

fn write_shards(dir: &Path) {
    write_pattern_shards(dir, 200, 5, 30);
}

fn config(dir: &Path, sets: &[&str]) -> TrainConfig {
    run_config(CONFIG, dir, sets)
}

fn options(resume: bool) -> RunOptions {
    run_options(resume)
}

fn weights(dir: &Path, run: &str) -> Vec<u8> {
    std::fs::read(dir.join(run).join("model/model.safetensors")).unwrap()
}

#[test]
fn extending_a_finished_run_equals_one_longer_run() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    run(
        config(dir.path(), &["output_dir=long", "training.steps=9"]),
        options(false),
    )
    .unwrap();
    run(config(dir.path(), &["output_dir=short"]), options(false)).unwrap();
    let summary = run(
        config(dir.path(), &["output_dir=short", "training.steps=9"]),
        options(true),
    )
    .unwrap();
    assert!(summary.resumed_from.unwrap().ends_with("step-00000006"));
    assert_eq!(summary.steps, 9);
    assert!(
        weights(dir.path(), "short") == weights(dir.path(), "long"),
        "weights differ"
    );
}

#[test]
fn a_resume_that_changes_the_math_is_refused_naming_the_field() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    run(config(dir.path(), &["training.steps=3"]), options(false)).unwrap();
    let error = run(config(dir.path(), &["optimizer.lr=0.1"]), options(true)).unwrap_err();
    match &error {
        TrainError::ResumeMismatch { field, .. } => assert_eq!(field, "optimizer.lr"),
        other => panic!("expected ResumeMismatch, got {other}"),
    }
    assert!(error.to_string().contains("optimizer.lr"), "{error}");
}

#[test]
fn a_fresh_start_into_a_run_with_checkpoints_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    run(config(dir.path(), &["training.steps=3"]), options(false)).unwrap();
    let error = run(config(dir.path(), &[]), options(false))
        .unwrap_err()
        .to_string();
    assert!(error.contains("--resume"), "{error}");
}

/// LoRA (`[lora]`): checkpoints hold the adapter (PEFT layout) and the merged model; extending a
/// finished LoRA run equals one longer run, adapter and merged weights alike; the adapters moved.
#[test]
fn a_lora_run_resumes_bit_for_bit_and_saves_adapter_and_merged_model() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    let lora =
        r#"lora={ r = 4, lora_alpha = 8, target_modules = ["q_proj", "v_proj", "down_proj"] }"#;
    let lr = "optimizer.lr=0.01";
    run(
        config(
            dir.path(),
            &["output_dir=long", "training.steps=9", lora, lr],
        ),
        options(false),
    )
    .unwrap();
    run(
        config(dir.path(), &["output_dir=short", lora, lr]),
        options(false),
    )
    .unwrap();
    let summary = run(
        config(
            dir.path(),
            &["output_dir=short", "training.steps=9", lora, lr],
        ),
        options(true),
    )
    .unwrap();
    assert!(summary.resumed_from.unwrap().ends_with("step-00000006"));
    let adapter = |run: &str| {
        std::fs::read(
            dir.path()
                .join(run)
                .join("adapter/adapter_model.safetensors"),
        )
        .unwrap()
    };
    assert!(adapter("short") == adapter("long"), "adapters differ");
    assert!(
        weights(dir.path(), "short") == weights(dir.path(), "long"),
        "merged weights differ"
    );
    let checkpoint = dir.path().join("short/checkpoints/step-00000009");
    assert!(checkpoint.join("adapter/adapter_config.json").is_file());
    // Trained: B is no longer zero, and the merged model differs from the frozen base (a run
    // without LoRA would change every weight; here only the targeted ones moved).
    let tensors = candle_core::safetensors::load(
        dir.path().join("long/adapter/adapter_model.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let b = &tensors["base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight"];
    let max = b
        .abs()
        .unwrap()
        .flatten_all()
        .unwrap()
        .max(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(max > 0.0, "lora_B never moved");
    assert_eq!(tensors.len(), 2 * 3 * 2, "2 layers x 3 modules x (A, B)");
    // Changing the adapters on resume changes the math: refused.
    let other =
        r#"lora={ r = 8, lora_alpha = 8, target_modules = ["q_proj", "v_proj", "down_proj"] }"#;
    let error = run(
        config(
            dir.path(),
            &["output_dir=short", "training.steps=12", other, lr],
        ),
        options(true),
    )
    .unwrap_err();
    assert!(error.to_string().contains("lora.r"), "{error}");
}

/// Every step record carries the memory by stage: f32 AdamW holds gradients the size of the
/// weights and two moments; under LoRA the gradients and moments are the adapters' only; the
/// peak resident set covers the counted stages.
#[test]
fn step_records_report_memory_by_stage() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    let lora = r#"lora={ r = 2, lora_alpha = 4, target_modules = ["q_proj"] }"#;
    run(
        config(dir.path(), &["output_dir=full", "training.steps=2"]),
        options(false),
    )
    .unwrap();
    run(
        config(dir.path(), &["output_dir=lora", "training.steps=2", lora]),
        options(false),
    )
    .unwrap();
    let memory = |run: &str| {
        let records =
            stoke_train::metrics::MetricsLog::read_all(&dir.path().join(run).join("metrics.jsonl"))
                .unwrap();
        records
            .into_iter()
            .find_map(|r| match r {
                stoke_train::metrics::MetricRecord::Step(s) => s.memory,
                _ => None,
            })
            .expect("a step record with memory")
    };
    let full = memory("full");
    assert!(full.weights_bytes > 0);
    assert_eq!(full.gradients_bytes, full.weights_bytes);
    assert_eq!(full.optimizer_bytes, 2 * full.weights_bytes);
    assert!(
        full.peak_rss_bytes >= full.weights_bytes + full.gradients_bytes + full.optimizer_bytes
    );
    let adapted = memory("lora");
    assert!(
        adapted.weights_bytes > full.weights_bytes,
        "the adapters add to the weights"
    );
    assert!(adapted.gradients_bytes > 0 && adapted.gradients_bytes * 20 < full.gradients_bytes);
    assert_eq!(adapted.optimizer_bytes, 2 * adapted.gradients_bytes);
}
