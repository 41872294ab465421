//! DeepSeek-V3 training end to end: a tiny model with latent attention, group-limited sigmoid
//! routing and a multi-token prediction module, trained from scratch with the MTP loss and the
//! aux-loss-free bias (which moves the checkpoint's `e_score_correction_bias`). The MTP loss is
//! logged and falls, and the saved model carries the module and the moved bias.

use std::path::Path;

mod common;
use common::{run_config, run_options, write_pattern_shards};
use stoke_train::run::run;

const DEEPSEEK_CONFIG: &str = r#"{
  "architectures": ["DeepseekV3ForCausalLM"], "model_type": "deepseek_v3",
  "vocab_size": 300, "hidden_size": 32, "intermediate_size": 64, "moe_intermediate_size": 16,
  "num_hidden_layers": 2, "num_attention_heads": 4, "num_key_value_heads": 4,
  "q_lora_rank": 16, "kv_lora_rank": 12, "qk_nope_head_dim": 8, "qk_rope_head_dim": 8,
  "v_head_dim": 8, "n_routed_experts": 8, "n_group": 4, "topk_group": 2,
  "num_experts_per_tok": 2, "n_shared_experts": 1, "first_k_dense_replace": 1,
  "routed_scaling_factor": 2.5, "num_nextn_predict_layers": 1,
  "max_position_embeddings": 128, "tie_word_embeddings": false
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
grad_accum_steps = 1
[optimizer]
kind = "adamw"
lr = 0.01
[schedule]
kind = "constant"
warmup_steps = 0
[training]
steps = 40
mtp_loss_weight = 0.3
[training.moe]
balance = "aux_free"
bias_rate = 0.01
"#;

fn steps(dir: &Path) -> Vec<serde_json::Value> {
    std::fs::read_to_string(dir.join("run/metrics.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        .filter(|r| r["kind"] == "step")
        .collect()
}

#[test]
fn a_deepseek_v3_trains_its_mtp_module_and_moves_the_stored_bias() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("config.json"), DEEPSEEK_CONFIG).unwrap();
    write_pattern_shards(dir.path(), 400, 20, 30);
    run(run_config(CONFIG, dir.path(), &[]), run_options(false)).unwrap();
    let records = steps(dir.path());
    assert_eq!(records.len(), 40);
    let mtp: Vec<f64> = records
        .iter()
        .map(|r| r["mtp_loss"].as_f64().expect("mtp_loss logged"))
        .collect();
    let mean = |s: &[f64]| s.iter().sum::<f64>() / s.len() as f64;
    let (first, last) = (mean(&mtp[..5]), mean(&mtp[35..]));
    assert!(last < 0.7 * first, "MTP loss {first} -> {last}");
    assert!(records.iter().all(|r| r["moe"].is_object()));
    let model =
        stoke_model::Transformer::load(&dir.path().join("run/model"), &candle_core::Device::Cpu)
            .unwrap();
    assert_eq!(model.num_mtp_modules(), 1);
    // The aux-loss-free rule moved the checkpoint's selection bias of the sparse layer.
    let bias = model.expert_bias(1).expect("layer 1's bias");
    assert!(bias.iter().any(|&b| b != 0.0), "{bias:?}");
}

#[test]
fn an_mtp_loss_weight_for_a_model_without_modules_is_refused_by_name() {
    let dir = tempfile::tempdir().unwrap();
    let config = DEEPSEEK_CONFIG.replace(
        "\"num_nextn_predict_layers\": 1",
        "\"num_nextn_predict_layers\": 0",
    );
    std::fs::write(dir.path().join("config.json"), config).unwrap();
    write_pattern_shards(dir.path(), 40, 20, 5);
    let error = run(run_config(CONFIG, dir.path(), &[]), run_options(false))
        .unwrap_err()
        .to_string();
    assert!(error.contains("training.mtp_loss_weight"), "{error}");
}
