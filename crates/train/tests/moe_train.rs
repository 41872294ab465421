//! Mixture-of-experts training (`[training.moe]`): every balance mode trains a tiny Qwen3-MoE
//! from scratch and logs the expert load; the bias rules' state is part of the checkpoint, so a
//! resumed run equals one longer run bit for bit; and the auxiliary loss changes the update.
//! Whether balancing balances is a property of a real run, not of a 40-step toy whose router
//! never collapses: bench/README.md's "MoE load balancing" documents it.

use std::path::Path;

use stoke_train::config::TrainConfig;
use stoke_train::run::{RunOptions, run};

mod common;
use common::{run_config, run_options, write_pattern_shards};

const MOE_CONFIG: &str = r#"{
  "architectures": ["Qwen3MoeForCausalLM"], "model_type": "qwen3_moe",
  "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 2, "head_dim": 8,
  "num_experts": 8, "num_experts_per_tok": 2, "norm_topk_prob": true,
  "max_position_embeddings": 128, "tie_word_embeddings": true, "router_aux_loss_coef": 0.01
}"#;

const CONFIG: &str = r#"
output_dir = "run"
[model]
config = "config.json"
[data]
kind = "shards"
train = ["shards"]
seq_len = 32
micro_batch_size = 4
grad_accum_steps = 2
[optimizer]
kind = "adamw"
lr = 0.01
[schedule]
kind = "constant"
warmup_steps = 0
[training]
steps = 6
[checkpoint]
every = 3
"#;

fn setup(dir: &Path) {
    std::fs::write(dir.join("config.json"), MOE_CONFIG).unwrap();
    write_pattern_shards(dir, 400, 5, 30);
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

/// The `moe` figures of every step record of a run.
fn moe_steps(dir: &Path, run: &str) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join(run).join("metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "step")
        .map(|r| r["moe"].clone())
        .collect()
}

#[test]
fn bias_rules_resume_bit_for_bit_and_every_mode_logs_the_load() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    for balance in ["aux_free", "smebu"] {
        let mode = format!("training.moe.balance=\"{balance}\"");
        let rate = "training.moe.bias_rate=0.01";
        let long = format!("output_dir=\"{balance}-long\"");
        let short = format!("output_dir=\"{balance}-short\"");
        run(
            config(dir.path(), &[&long, "training.steps=9", &mode, rate]),
            options(false),
        )
        .unwrap();
        run(config(dir.path(), &[&short, &mode, rate]), options(false)).unwrap();
        run(
            config(dir.path(), &[&short, "training.steps=9", &mode, rate]),
            options(true),
        )
        .unwrap();
        assert!(
            weights(dir.path(), &format!("{balance}-short"))
                == weights(dir.path(), &format!("{balance}-long")),
            "{balance}: the resumed run's weights differ from one longer run's"
        );
        let steps = moe_steps(dir.path(), &format!("{balance}-long"));
        assert_eq!(steps.len(), 9);
        for moe in &steps {
            let loads = moe["expert_load"].as_array().expect("expert_load");
            assert_eq!(loads.len(), 2, "two MoE layers");
            let shares: f64 = loads[0][1]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_f64().unwrap())
                .sum();
            assert!((shares - 1.0).abs() < 1e-9, "shares sum to {shares}");
            assert!(moe["max_violation"].as_f64().unwrap() >= 0.0);
        }
    }
    // Without a bias rule the routing (so the weights) differ from a bias run's.
    run(
        config(dir.path(), &["output_dir=\"none\"", "training.steps=9"]),
        options(false),
    )
    .unwrap();
    assert!(weights(dir.path(), "none") != weights(dir.path(), "aux_free-long"));
    assert!(moe_steps(dir.path(), "none")[0]["aux_loss"].is_null());
}

#[test]
fn the_aux_loss_is_logged_and_changes_the_update() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    run(
        config(dir.path(), &["output_dir=\"plain\""]),
        options(false),
    )
    .unwrap();
    run(
        config(
            dir.path(),
            &[
                "output_dir=\"aux\"",
                "training.moe.balance=\"aux_loss\"",
                "training.moe.aux_loss_coef=0.1",
            ],
        ),
        options(false),
    )
    .unwrap();
    let steps = moe_steps(dir.path(), "aux");
    // coef 0.1 times a balancing loss of at least 1 (its minimum, perfect balance).
    let first = steps[0]["aux_loss"].as_f64().expect("aux_loss logged");
    assert!((0.1 - 1e-6..0.1 * 8.0).contains(&first), "{first}");
    assert!(weights(dir.path(), "aux") != weights(dir.path(), "plain"));
}

/// `training.moe.capacity_factor`: a tight capacity drops pairs, and every step's `moe` record
/// says what share; without it nothing is reported as dropped. A non-positive factor is refused
/// by name.
#[test]
fn an_expert_capacity_logs_the_dropped_share() {
    let dir = tempfile::tempdir().unwrap();
    setup(dir.path());
    run(
        config(
            dir.path(),
            &[
                "output_dir=\"capacity\"",
                "training.steps=3",
                "training.moe.capacity_factor=0.5",
            ],
        ),
        options(false),
    )
    .unwrap();
    let steps = moe_steps(dir.path(), "capacity");
    assert_eq!(steps.len(), 3);
    for moe in &steps {
        let share = moe["dropped_share"].as_f64().expect("dropped_share logged");
        assert!(share > 0.0 && share < 1.0, "{share}");
    }
    run(
        config(dir.path(), &["output_dir=\"dropless\"", "training.steps=2"]),
        options(false),
    )
    .unwrap();
    assert!(
        moe_steps(dir.path(), "dropless")
            .iter()
            .all(|moe| moe.get("dropped_share").is_none())
    );
    let error = run_config_error(dir.path(), "training.moe.capacity_factor=0.0");
    assert!(error.contains("training.moe.capacity_factor"), "{error}");
}

fn run_config_error(dir: &Path, set: &str) -> String {
    let mut table: toml::Table = toml::from_str(CONFIG).unwrap();
    stoke_train::config::apply_overrides(&mut table, &[set.to_string()]).unwrap();
    let file = stoke_train::config::ConfigFile::from_table(table, "test").unwrap();
    TrainConfig::from_file(file, dir).unwrap_err().to_string()
}
