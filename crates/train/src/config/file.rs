//! The TOML layer of the run config: what a person writes (most dials optional) and what
//! `TrainConfig::to_toml` writes back (every value explicit). Every table rejects unknown keys;
//! deserialisation errors name the offending key by its dotted path. `apply_overrides` edits a
//! parsed table with `--set key=value` pairs before it is deserialised, so an override is checked
//! exactly like a key in the file.
//!
//! What this is not: no defaults are derived and no path is resolved here (`resolve.rs`).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use stoke_data::packing::PackingPolicy;
use stoke_optim::DecayShape;

use super::{ConfigError, ModelPreset};
use crate::spike::SpikeAction;

// ---------------------------------------------------------------------------------------------
// File format
// ---------------------------------------------------------------------------------------------

/// The TOML file as written by a person (optional dials) or by [`TrainConfig::to_toml`] (all set).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ConfigFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub title: Option<String>,
    pub output_dir: PathBuf,
    pub model: ModelFile,
    pub data: DataFile,
    #[serde(default)]
    pub optimizer: OptimizerFile,
    #[serde(default)]
    pub schedule: ScheduleFile,
    pub training: TrainingFile,
    /// Held-out evaluation cadence (the shared `[eval]` section).
    #[serde(default)]
    pub eval: EvalFile,
    /// Checkpoint cadence and retention (the shared `[checkpoint]` section).
    #[serde(default)]
    pub checkpoint: CheckpointFile,
    /// LoRA adapters instead of full fine-tuning: `r`, `lora_alpha`, `target_modules` (Hugging
    /// Face module names or "all-linear"), `lora_dropout` (0), `use_rslora` (false).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<stoke_model::lora::LoraConfig>,
    /// Logit distillation: `teacher` (a model folder), `beta` (0.5), `temperature` (1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub distill: Option<super::DistillConfig>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub preset: Option<ModelPreset>,
    /// Vocabulary size for a preset (default: the tokenizer's).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub vocab_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<PathBuf>,
    /// A model folder (Hugging Face layout) or a GGUF file to start from: the key every
    /// command shares (`pretrained` before: `load` migrates it with a warning, and a table
    /// deserialised directly still reads it).
    #[serde(default, alias = "pretrained", skip_serializing_if = "Option::is_none")]
    pub path: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_seed: Option<u64>,
    /// Random init of a from-scratch model: "normal" (default), "truncated_normal" (OLMo 2) or
    /// "scaled" (1/sqrt(hidden), residual outputs / sqrt(2 layers)); see `stoke_model::InitScheme`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init: Option<InitKind>,
    /// Standard deviation of "normal" and "truncated_normal" (default 0.02).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_std: Option<f64>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum InitKind {
    Normal,
    TruncatedNormal,
    Scaled,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DataKind {
    Shards,
    Chat,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataFile {
    pub kind: DataKind,
    pub train: Vec<PathBuf>,
    #[serde(default)]
    pub eval: Vec<PathBuf>,
    pub seq_len: usize,
    pub micro_batch_size: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub grad_accum_steps: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokens_per_step: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub packing: Option<PackingPolicy>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub shuffle: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_epochs: Option<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OptimizerKind {
    #[default]
    Adamw,
    Muon,
}

/// One flat table for both optimizers; Muon-only keys are refused for AdamW.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OptimizerFile {
    #[serde(default)]
    pub kind: OptimizerKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lr: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta1: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub beta2: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eps: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_decay: Option<f64>,
    /// Muon: lr of the AdamW groups (embeddings, head, norms); default `lr`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub adamw_lr: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub momentum: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub nesterov: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ns_steps: Option<usize>,
    /// Muon: MuonClip's attention-logit threshold (QK-clip after every step); default off.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub qk_clip: Option<f64>,
    /// AdamW moment storage: "f32" (default) or "int8" (8-bit, a quarter of the memory).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moments: Option<stoke_optim::MomentFormat>,
    /// Global gradient-norm clip before the step; 0 turns clipping off (default 1.0). Every
    /// command reads it here (`training.clip_norm` and `grpo.clip_grad_norm` are its old names).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_grad_norm: Option<f64>,
}

/// `[eval]` of `stoke train`: evaluate on the eval data every N steps (0: only at the end).
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u64>,
    /// Eval batches per evaluation (default 8).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batches: Option<usize>,
}

/// `[checkpoint]` of `stoke train` and `stoke grpo`: save every N steps (0: only at the end),
/// keep the newest `keep` (default 2) plus the steps in `keep_steps`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CheckpointFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep: Option<usize>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub keep_steps: Vec<u64>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ScheduleKind {
    Constant,
    Cosine,
    #[default]
    Wsd,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScheduleFile {
    #[serde(default)]
    pub kind: ScheduleKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub warmup_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_lr_ratio: Option<f64>,
    /// WSD: share of the run spent decaying (default 0.2); ignored when `decay_start` is set.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_fraction: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_start: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub decay_shape: Option<DecayShape>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_warmup: Option<BatchWarmupFile>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct BatchWarmupFile {
    pub start_tokens_per_step: u64,
    pub ramp_tokens: u64,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingFile {
    pub steps: u64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub z_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_softcap: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bad_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spike: Option<SpikeFile>,
    /// Matmul precision: "f32" (default, the exact mode) or "bf16" (mixed precision; see
    /// `stoke_types::Precision`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<stoke_types::Precision>,
    /// Recompute each transformer block's activations in the backward pass (default false;
    /// bit-identical gradients, less memory, about a third more block arithmetic).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_checkpointing: Option<bool>,
    /// Load balancing of mixture-of-experts models.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub moe: Option<MoeBalanceFile>,
    /// Weight of the multi-token prediction loss (models with MTP modules; default 0.1).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mtp_loss_weight: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct MoeBalanceFile {
    /// "none" (default), "aux_loss", "aux_free" or "smebu".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub balance: Option<crate::config::MoeBalance>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aux_loss_coef: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias_rate: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bias_momentum: Option<f64>,
    /// Expert capacity factor (tokens over it are dropped and counted); absent: no capacity.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub capacity_factor: Option<f64>,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SpikeFile {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub action: Option<SpikeAction>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub sigma: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub min_history: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ema_decay: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cooldown_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_consecutive_skips: Option<u64>,
}

impl ConfigFile {
    /// Deserialises a table, naming the offending key on error.
    pub fn from_table(table: toml::Table, origin: &str) -> Result<ConfigFile, ConfigError> {
        super::keys::from_table(table, origin)
    }
}

/// Applies `key.path=value` overrides to a parsed config table. The value is parsed as a TOML
/// value (`200`, `1e-3`, `true`, `["a", "b"]`, `{ kind = "concat_chunk" }`), falling back to a
/// plain string. Missing intermediate tables are created; whether a key exists is checked when
/// the table is deserialised (unknown keys are refused there, named by their path).
pub fn apply_overrides(table: &mut toml::Table, sets: &[String]) -> Result<(), ConfigError> {
    for arg in sets {
        let fail = |message: String| ConfigError::Override {
            arg: arg.clone(),
            message,
        };
        let Some((key, raw)) = arg.split_once('=') else {
            return Err(fail("expected key=value (e.g. training.steps=200)".into()));
        };
        let key = key.trim();
        let parts: Vec<&str> = key.split('.').collect();
        if key.is_empty() || parts.iter().any(|p| p.is_empty()) {
            return Err(fail(format!("`{key}` is not a dotted key path")));
        }
        let value = parse_value(raw.trim());
        let current = super::keys::table_at_or_insert(table, &parts[..parts.len() - 1])
            .map_err(|prefix| fail(format!("`{prefix}` is a value, not a table")))?;
        current.insert(parts[parts.len() - 1].to_string(), value);
    }
    Ok(())
}

fn parse_value(raw: &str) -> toml::Value {
    let parsed: Result<toml::Table, _> = toml::from_str(&format!("v = {raw}"));
    match parsed.ok().and_then(|mut t| t.remove("v")) {
        Some(value) => value,
        None => toml::Value::String(raw.to_string()),
    }
}
