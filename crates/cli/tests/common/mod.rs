//! Shared by the CLI tests that need a model folder: a tiny random Llama with a BPE tokenizer
//! trained on the test's own texts and a ChatML chat template.

use std::path::Path;

use candle_core::Device;
use stoke_model::{ModelConfig, Transformer};
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::train::{TrainerConfig, WordCounts, train_bpe};

pub const TEMPLATE: &str = r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

/// Writes `dir/tokenizer` (a 300-token BPE of `texts`, `<|im_end|>` as eos) and `dir/model` (a
/// random hidden-32, one-layer Llama over it, Hugging Face layout with the tokenizer files).
pub fn tiny_chat_model(dir: &Path, texts: &[String]) {
    let tokenizer_dir = dir.join("tokenizer");
    let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from);
    let trainer = TrainerConfig::new(300, specials.to_vec());
    let mut words = WordCounts::new(&trainer.pattern).unwrap();
    words.add_texts(texts);
    train_bpe(&words, &trainer, |_| {})
        .unwrap()
        .save(&tokenizer_dir)
        .unwrap();
    let tokenizer_config = serde_json::json!({
        "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": TEMPLATE,
    });
    std::fs::write(
        tokenizer_dir.join("tokenizer_config.json"),
        tokenizer_config.to_string(),
    )
    .unwrap();
    let vocab = Tokenizer::from_dir(&tokenizer_dir).unwrap().vocab_size();
    let json = serde_json::json!({
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
        "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
        "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
        "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true,
        "max_position_embeddings": 256,
    });
    let config = ModelConfig::from_json_str(&json.to_string(), Path::new("<test>")).unwrap();
    Transformer::init(config, &Device::Cpu, 1)
        .unwrap()
        .save_with_tokenizer(&dir.join("model"), Some(&tokenizer_dir))
        .unwrap();
}

/// `dir/rm/model`: a reward model trained by `stoke rm` for `steps` steps from `dir/model` on
/// pairs `(prompt, chosen, rejected)` (written to `dir/pairs.jsonl`).
#[allow(dead_code)] // used by the GRPO tests only; each test binary compiles this module
pub fn train_reward_model(dir: &Path, pairs: &[(String, String, String)], steps: usize) {
    let lines: Vec<String> = pairs
        .iter()
        .map(|(prompt, chosen, rejected)| {
            serde_json::json!({"prompt": prompt, "chosen": chosen, "rejected": rejected})
                .to_string()
        })
        .collect();
    std::fs::write(dir.join("pairs.jsonl"), lines.join("\n")).unwrap();
    std::fs::write(
        dir.join("rm.toml"),
        format!(
            "output_dir = \"rm\"\n[model]\npath = \"model\"\n[data]\ntrain = \"pairs.jsonl\"\n\
             max_len = 64\n[optimizer]\nlr = 1e-3\n[training]\nsteps = {steps}\n"
        ),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_stoke"))
        .arg("rm")
        .arg(dir.join("rm.toml"))
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "stoke rm: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}

/// `dir/prm/model`: a process reward model trained by `stoke prm` for `steps` steps from
/// `dir/model` on stepwise rows `(prompt, steps, labels)` (written to `dir/steps.jsonl`; steps
/// end at "\n", `stoke prm`'s default separator).
#[allow(dead_code)] // used by the GRPO tests only; each test binary compiles this module
pub fn train_process_reward_model(
    dir: &Path,
    rows: &[(String, Vec<String>, Vec<bool>)],
    steps: usize,
) {
    let lines: Vec<String> = rows
        .iter()
        .map(|(prompt, completions, labels)| {
            serde_json::json!({"prompt": prompt, "completions": completions, "labels": labels})
                .to_string()
        })
        .collect();
    std::fs::write(dir.join("steps.jsonl"), lines.join("\n")).unwrap();
    std::fs::write(
        dir.join("prm.toml"),
        format!(
            "output_dir = \"prm\"\n[model]\npath = \"model\"\n[data]\ntrain = \"steps.jsonl\"\n\
             rows_per_micro_batch = 2\n[optimizer]\nlr = 1e-3\n[training]\nsteps = {steps}\n"
        ),
    )
    .unwrap();
    let output = std::process::Command::new(env!("CARGO_BIN_EXE_stoke"))
        .arg("prm")
        .arg(dir.join("prm.toml"))
        .arg("--quiet")
        .output()
        .unwrap();
    assert!(
        output.status.success(),
        "stoke prm: {}",
        String::from_utf8_lossy(&output.stderr)
    );
}
