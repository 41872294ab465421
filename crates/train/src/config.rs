//! Run configuration in two layers: [`ConfigFile`], the TOML file format (every table rejects
//! unknown keys; most dials optional), and [`TrainConfig`], the validated runtime record that
//! the trainer reads (public fields, so code such as the speedrun builds it without TOML).
//!
//! ```toml
//! title = "pretrain-tiny"
//! output_dir = "../runs/pretrain-tiny"      # relative paths are relative to this file's folder
//! [model]
//! preset = "micro"            # or: config = "config.json" (random init) | path = "hf-dir"
//! tokenizer = "../tokenizer"  # folder with tokenizer.json (default: the model folder)
//! [data]
//! kind = "shards"             # or "chat": train = "train.jsonl", eval = "eval.jsonl"
//! train = ["../data/train"]   # shard files or folders of shards
//! eval = ["../data/eval"]
//! seq_len = 256
//! micro_batch_size = 8
//! grad_accum_steps = 2        # or tokens_per_step = 4096
//! [optimizer]
//! kind = "adamw"              # or "muon"; lr etc. optional
//! [schedule]
//! kind = "wsd"                # or "cosine" | "constant"
//! [training]
//! steps = 200
//! # activation_checkpointing = true; precision = "bf16"
//! # mtp_loss_weight = 0.1     # models with MTP modules (DeepSeek-V3): the MTP loss's weight
//! # [training.moe]            # mixture-of-experts models: balance = "none" | "aux_loss" |
//! # balance = "smebu"         # "aux_free" | "smebu"; aux_loss_coef, bias_rate, bias_momentum
//! # capacity_factor = 1.25    # optional: drop (and log) pairs past each expert's capacity
//! # [lora]                    # optional: adapters on the frozen model (PEFT's key names)
//! # r = 16
//! # lora_alpha = 32
//! # target_modules = ["q_proj", "v_proj"]   # or ["all-linear"]
//! # [distill]                 # optional: logit distillation instead of cross-entropy
//! # teacher = "../teacher"    # model folder with the student's tokenizer (none: the data's
//! #                           # stored teacher_topk_ids / teacher_topk_logprobs)
//! # top_k = 20                # only the teacher's 20 most likely ids + the rest-of-mass bucket
//! # beta = 0.5                # 0 forward KL, 1 reverse KL, between: the GKD mixture (TRL)
//! # temperature = 1.0
//! # lmbda = 0.0               # share of on-policy micro-batches (the student's own replies)
//! # max_new_tokens = 128      # of those replies, sampled at
//! # generation_temperature = 0.9
//! # ce_weight = 0.0           # plus this weight x the cross-entropy on the data's replies
//! ```
//!
//! Defaults derived from the model size, where published recipes agree:
//! - peak learning rate `lr = min(3e-3, 6e-4 * 768 / hidden_size)`: GPT-3's table (Brown et al.
//!   2020, table 2.1) falls roughly as 1/width from 6e-4 at width 768 (2e-4 at 2048, 1.2e-4 at
//!   4096); small CPU models are capped at 3e-3. Muon uses the same value because its updates
//!   are RMS-matched to AdamW (Moonshot, "Muon is scalable", 2025).
//! - AdamW betas (0.9, 0.95), eps 1e-8, weight decay 0.1 (GPT-3, Llama); clip norm 1.0.
//! - warmup `min(1000, steps / 20)` steps; WSD decays over the last 20% of the run to 0;
//!   cosine decays to 10% of the peak (Chinchilla).
//!
//! Changing a run: `apply_overrides` edits the parsed table with `--set key=value` pairs before
//! it is deserialised, so an override is checked exactly like a key in the file. The resolved
//! config (derived values filled in, paths absolute) is written to `<output_dir>/config.toml`;
//! a resumed run compares it field by field (see `math_fields_differ`).
//!
//! Files: `config/file.rs` (the TOML layer and `--set`), `config/resolve.rs` (file <-> runtime:
//! derived defaults, absolute paths), this file (the runtime record, validation, resume checks).
//!
//! What this is not: no file reading beyond the model's `config.json` (needed to derive the
//! learning rate); the trainer opens the data.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use stoke_data::packing::PackingPolicy;
use stoke_optim::{BatchSizeWarmup, LrSchedule, OptimizerConfig};

use crate::spike::SpikePolicy;

mod file;
pub mod keys;
mod resolve;

pub use resolve::{
    ScheduleDefaults, resolve_lr_schedule, resolve_optimizer, resolve_optimizer_with,
};

pub use file::{
    BatchWarmupFile, CheckpointFile, ConfigFile, DataFile, DataKind, EvalFile, ModelFile,
    OptimizerFile, OptimizerKind, ScheduleFile, ScheduleKind, SpikeFile, TrainingFile,
    apply_overrides,
};

#[derive(Debug, thiserror::Error)]
pub enum ConfigError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: {message}")]
    Syntax { path: PathBuf, message: String },
    /// A key that is unknown, missing or of the wrong type, named by its dotted path.
    #[error("{file}: `{key}`: {message}")]
    Key {
        file: String,
        key: String,
        message: String,
    },
    #[error("invalid config: `{key}`: {message}")]
    Invalid { key: String, message: String },
    #[error("--set {arg}: {message}")]
    Override { arg: String, message: String },
}

fn invalid(key: &str, message: impl Into<String>) -> ConfigError {
    ConfigError::Invalid {
        key: key.to_string(),
        message: message.into(),
    }
}

// ---------------------------------------------------------------------------------------------
// Runtime config
// ---------------------------------------------------------------------------------------------

/// Small Llama-style shapes for runs from scratch (head_dim 32-64, grouped-query attention).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModelPreset {
    /// hidden 64, 2 layers, 2 heads (tests).
    Nano,
    /// hidden 128, 4 layers, 2 heads.
    Micro,
    /// hidden 256, 4 layers, 4 heads, 2 KV heads (the benchmark shape).
    Tiny,
    /// hidden 512, 8 layers, 8 heads, 4 KV heads.
    Small,
}

impl ModelPreset {
    /// (hidden, layers, heads, kv_heads, intermediate)
    pub fn shape(self) -> (usize, usize, usize, usize, usize) {
        match self {
            ModelPreset::Nano => (64, 2, 2, 1, 176),
            ModelPreset::Micro => (128, 4, 2, 1, 352),
            ModelPreset::Tiny => (256, 4, 4, 2, 688),
            ModelPreset::Small => (512, 8, 8, 4, 1376),
        }
    }

    /// The HF `config.json` of this preset with `vocab_size` tokens.
    pub fn config_json(self, vocab_size: usize, max_positions: usize) -> serde_json::Value {
        let (hidden, layers, heads, kv_heads, intermediate) = self.shape();
        serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama",
            "vocab_size": vocab_size, "hidden_size": hidden, "intermediate_size": intermediate,
            "num_hidden_layers": layers, "num_attention_heads": heads,
            "num_key_value_heads": kv_heads, "head_dim": hidden / heads, "rms_norm_eps": 1e-5,
            "rope_theta": 10000.0, "tie_word_embeddings": false,
            "max_position_embeddings": max_positions.max(512),
        })
    }
}

/// Where the model comes from.
#[derive(Clone, Debug, PartialEq)]
pub enum ModelSource {
    Preset {
        preset: ModelPreset,
        /// `None`: the tokenizer's vocabulary size.
        vocab_size: Option<usize>,
    },
    /// Random init from a Hugging Face `config.json`.
    ConfigJson(PathBuf),
    /// Weights from a Hugging Face model folder.
    Pretrained(PathBuf),
}

#[derive(Clone, Debug, PartialEq)]
pub struct ModelSpec {
    pub source: ModelSource,
    /// Folder with tokenizer.json (and chat template); needed for chat data and bits-per-byte.
    pub tokenizer: Option<PathBuf>,
    /// Seed of the random init (ignored for pretrained weights).
    pub init_seed: u64,
    /// How a from-scratch model's weights are drawn (ignored for pretrained weights).
    pub init: stoke_model::InitScheme,
}

#[derive(Clone, Debug, PartialEq)]
pub enum DataSource {
    Shards {
        train: Vec<PathBuf>,
        eval: Vec<PathBuf>,
    },
    Chat {
        train: PathBuf,
        eval: Option<PathBuf>,
    },
}

#[derive(Clone, Debug, PartialEq)]
pub struct DataConfig {
    pub source: DataSource,
    pub seq_len: usize,
    pub micro_batch_size: usize,
    /// Micro-batches per optimizer step (the largest, when batch-size warmup is on).
    pub grad_accum_steps: usize,
    pub packing: PackingPolicy,
    pub shuffle: bool,
    pub max_epochs: Option<u64>,
}

impl DataConfig {
    /// Input tokens of one micro-batch.
    pub fn tokens_per_micro_batch(&self) -> u64 {
        (self.seq_len * self.micro_batch_size) as u64
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct TrainingConfig {
    /// Trainer steps (optimizer steps plus skipped ones) to run in total.
    pub steps: u64,
    /// Seed of the data order.
    pub seed: u64,
    pub clip_norm: Option<f64>,
    pub z_loss: f64,
    pub logit_softcap: Option<f64>,
    /// Consecutive non-finite steps tolerated (skipped) before the run stops.
    pub max_bad_steps: u64,
    pub spike: SpikePolicy,
    /// Evaluate every N steps (0: only at the end).
    pub eval_every: u64,
    /// Micro-batches per evaluation.
    pub eval_batches: usize,
    /// Checkpoint every N steps (0: only at the end).
    pub checkpoint_every: u64,
    pub keep_last: usize,
    pub keep_steps: Vec<u64>,
    /// Matmul precision of the forward and backward passes (weights and optimizer stay f32).
    pub precision: stoke_types::Precision,
    /// Recompute each block's activations in the backward pass (exact; memory for time).
    pub activation_checkpointing: bool,
    /// Load balancing of mixture-of-experts models (ignored by dense ones).
    pub moe: MoeBalanceConfig,
    /// Weight λ of the multi-token prediction loss for models with MTP modules (DeepSeek-V3):
    /// each module's next-next-token cross-entropy, times λ / modules, is added per predicted
    /// token. `None`: 0.1 (DeepSeek-V3's weight for the later part of pretraining); 0 leaves the
    /// modules untrained.
    pub mtp_loss_weight: Option<f64>,
}

/// How a mixture-of-experts model's experts are kept in balance (`[training.moe]`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Default, serde::Serialize, serde::Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MoeBalance {
    /// No balancing: the loads are still measured and logged.
    #[default]
    None,
    /// HF's auxiliary load-balancing loss, weighted by `aux_loss_coef`.
    AuxLoss,
    /// torchtitan's aux-loss-free bias: `bias_rate * sign(mean - load)`, re-centred.
    AuxFree,
    /// SMEBU: clipped normalized violation, re-centred, momentum `bias_momentum`.
    Smebu,
}

#[derive(Clone, Debug, PartialEq)]
pub struct MoeBalanceConfig {
    pub balance: MoeBalance,
    /// The auxiliary loss's weight (`None`: the model's `router_aux_loss_coef`).
    pub aux_loss_coef: Option<f64>,
    /// The bias rules' step (aux_free: `coeff`, torchtitan's 1e-3; smebu: `lr`).
    pub bias_rate: f64,
    /// SMEBU's momentum.
    pub bias_momentum: f64,
    /// Expert capacity factor for training (`Transformer::set_expert_capacity`): each expert
    /// takes at most `ceil(factor * pairs / experts)` of a micro-batch's (token, slot) pairs;
    /// the rest are dropped and logged. `None`: dropless.
    pub capacity_factor: Option<f64>,
}

impl Default for MoeBalanceConfig {
    fn default() -> Self {
        MoeBalanceConfig {
            balance: MoeBalance::None,
            aux_loss_coef: None,
            bias_rate: 1e-3,
            bias_momentum: 0.9,
            capacity_factor: None,
        }
    }
}

impl MoeBalanceConfig {
    /// The bias rule this config asks for (`None` for none and aux_loss).
    pub fn bias_rule(&self) -> Option<stoke_model::moe::BiasRule> {
        match self.balance {
            MoeBalance::AuxFree => Some(stoke_model::moe::BiasRule::AuxLossFree {
                coeff: self.bias_rate,
            }),
            MoeBalance::Smebu => Some(stoke_model::moe::BiasRule::Smebu {
                lr: self.bias_rate,
                momentum: self.bias_momentum,
            }),
            MoeBalance::None | MoeBalance::AuxLoss => None,
        }
    }
}

/// The validated run configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct TrainConfig {
    pub title: String,
    pub output_dir: PathBuf,
    pub model: ModelSpec,
    pub data: DataConfig,
    pub optimizer: OptimizerConfig,
    pub schedule: LrSchedule,
    pub batch_warmup: Option<BatchSizeWarmup>,
    pub training: TrainingConfig,
    /// LoRA: train adapters on the frozen model (checkpoints hold the adapter and the merged
    /// model).
    pub lora: Option<stoke_model::lora::LoraConfig>,
    /// Logit distillation from a teacher instead of next-token cross-entropy.
    pub distill: Option<DistillConfig>,
}

fn default_distill_beta() -> f64 {
    0.5
}
fn default_distill_temperature() -> f64 {
    1.0
}

/// `[distill]`: train on the generalized JSD to a teacher's next-token distributions at the
/// batch's loss positions (TRL's `GKDTrainer.generalized_jsd_loss`; `beta` 0 forward KL, 1
/// reverse KL, between the GKD mixture; TRL's default 0.5). The teacher is a model folder with
/// the student's tokenizer; it runs without gradients, one micro-batch at a time.
///
/// `lmbda` (GKD's, TRL's name) is the share of micro-batches trained on-policy: the student
/// samples its own reply to each conversation's prompt (`max_new_tokens`, at
/// `generation_temperature`, TRL's `GKDConfig.temperature`) and the divergence is taken on those
/// tokens (`objective::OnPolicySampling`). 0 (the default here; TRL's is 0.5) is the supervised
/// regime on the data's replies.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DistillConfig {
    /// Hugging Face model folder of the teacher (relative to the config file); without one the
    /// training data must carry the teacher's top-k (`teacher_topk_ids`/`teacher_topk_logprobs`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub teacher: Option<PathBuf>,
    /// Only the teacher model's `top_k` most likely ids per position, plus the rest-of-mass
    /// bucket (what a remote teacher returns); default: the full vocabulary.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    #[serde(default = "default_distill_beta")]
    pub beta: f64,
    /// Of the divergence (TRL's `generalized_jsd_loss` temperature).
    #[serde(default = "default_distill_temperature")]
    pub temperature: f64,
    #[serde(default)]
    pub lmbda: f64,
    #[serde(default = "default_distill_max_new_tokens")]
    pub max_new_tokens: usize,
    #[serde(default = "default_distill_generation_temperature")]
    pub generation_temperature: f64,
    /// Weight of the ordinary cross-entropy on the data's own reply tokens, added to the
    /// divergence (Hinton et al.'s soft-plus-hard targets); 0, the default, is TRL's pure GKD
    /// loss. On-policy batches (`lmbda`) take the divergence alone: their tokens are the
    /// student's own samples, not labels.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub ce_weight: f64,
}

fn is_zero(x: &f64) -> bool {
    *x == 0.0
}

/// TRL `GKDConfig.max_new_tokens`.
fn default_distill_max_new_tokens() -> usize {
    128
}
/// TRL `GKDConfig.temperature`.
fn default_distill_generation_temperature() -> f64 {
    0.9
}

/// `min(3e-3, 6e-4 * 768 / hidden)`; see the module doc.
pub fn default_lr(hidden_size: usize) -> f64 {
    (6e-4 * 768.0 / hidden_size.max(1) as f64).min(3e-3)
}

/// `min(1000, steps / 20)`.
pub fn default_warmup(steps: u64) -> u64 {
    (steps / 20).min(1000)
}

/// Keys of `stoke train` renamed to the vocabulary every command shares (see `keys`).
pub const RENAMED: &[keys::Renamed] = &[
    keys::Renamed {
        old: "model.pretrained",
        new: keys::MODEL_PATH,
    },
    keys::Renamed {
        old: "training.clip_norm",
        new: keys::CLIP_GRAD_NORM,
    },
    keys::Renamed {
        old: "training.eval_every",
        new: "eval.every",
    },
    keys::Renamed {
        old: "training.eval_batches",
        new: "eval.batches",
    },
    keys::Renamed {
        old: "training.checkpoint_every",
        new: "checkpoint.every",
    },
    keys::Renamed {
        old: "training.keep_last",
        new: "checkpoint.keep",
    },
    keys::Renamed {
        old: "training.keep_steps",
        new: "checkpoint.keep_steps",
    },
];

impl TrainConfig {
    /// Reads `path`, applies `--set` overrides and resolves it (relative paths against the file's
    /// folder). Returns the config.
    pub fn load(path: &Path, sets: &[String]) -> Result<TrainConfig, ConfigError> {
        let origin = path.display().to_string();
        let table = keys::prepare_table(keys::read_table(path)?, &origin, sets, RENAMED)?;
        let file = ConfigFile::from_table(table, &origin)?;
        let base = keys::base_dir(path);
        TrainConfig::from_file(file, base)
    }

    /// Checks ranges and combinations (also for configs built in code).
    pub fn validate(&self) -> Result<(), ConfigError> {
        if let Some(distill) = &self.distill {
            if !(0.0..=1.0).contains(&distill.beta) {
                return Err(invalid("distill.beta", "must be in [0, 1]"));
            }
            if !(distill.temperature > 0.0 && distill.temperature.is_finite()) {
                return Err(invalid("distill.temperature", "must be positive"));
            }
            if distill.top_k == Some(0) {
                return Err(invalid("distill.top_k", "must be at least 1"));
            }
            if !(distill.ce_weight >= 0.0 && distill.ce_weight.is_finite()) {
                return Err(invalid("distill.ce_weight", "must be a finite number >= 0"));
            }
            if !(0.0..=1.0).contains(&distill.lmbda) {
                return Err(invalid("distill.lmbda", "must be in [0, 1]"));
            }
            if distill.lmbda > 0.0 && distill.max_new_tokens == 0 {
                return Err(invalid("distill.max_new_tokens", "must be at least 1"));
            }
            if !(distill.generation_temperature >= 0.0
                && distill.generation_temperature.is_finite())
            {
                return Err(invalid(
                    "distill.generation_temperature",
                    "must be >= 0 (0: greedy)",
                ));
            }
        }
        let d = &self.data;
        if d.seq_len == 0 {
            return Err(invalid("data.seq_len", "must be > 0"));
        }
        if d.micro_batch_size == 0 {
            return Err(invalid("data.micro_batch_size", "must be > 0"));
        }
        if d.grad_accum_steps == 0 {
            return Err(invalid("data.grad_accum_steps", "must be > 0"));
        }
        match &d.source {
            DataSource::Shards { train, .. } if train.is_empty() => {
                return Err(invalid(
                    "data.train",
                    "name at least one shard file or folder",
                ));
            }
            DataSource::Chat { .. } if self.model.tokenizer.is_none() => {
                return Err(invalid(
                    "model.tokenizer",
                    "chat data needs a tokenizer folder (for its chat template)",
                ));
            }
            _ => {}
        }
        if let ModelSource::Preset {
            vocab_size: None, ..
        } = self.model.source
            && self.model.tokenizer.is_none()
        {
            return Err(invalid(
                "model.vocab_size",
                "a preset needs `vocab_size` or a `tokenizer` to take it from",
            ));
        }
        let t = &self.training;
        if t.steps == 0 {
            return Err(invalid("training.steps", "must be > 0"));
        }
        if let Some(c) = t.clip_norm
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid(
                keys::CLIP_GRAD_NORM,
                format!("must be > 0 (0 turns it off), got {c}"),
            ));
        }
        if let Some(w) = t.mtp_loss_weight
            && !(w.is_finite() && w >= 0.0)
        {
            return Err(invalid(
                "training.mtp_loss_weight",
                format!("must be >= 0, got {w}"),
            ));
        }
        if !(t.z_loss.is_finite() && t.z_loss >= 0.0) {
            return Err(invalid(
                "training.z_loss",
                format!("must be >= 0, got {}", t.z_loss),
            ));
        }
        if let Some(c) = t.logit_softcap
            && !(c.is_finite() && c > 0.0)
        {
            return Err(invalid(
                "training.logit_softcap",
                format!("must be > 0, got {c}"),
            ));
        }
        if t.max_bad_steps == 0 {
            return Err(invalid("training.max_bad_steps", "must be >= 1"));
        }
        if let Some(c) = t.moe.aux_loss_coef
            && !(c.is_finite() && c >= 0.0)
        {
            return Err(invalid(
                "training.moe.aux_loss_coef",
                format!("must be >= 0, got {c}"),
            ));
        }
        if !(t.moe.bias_rate.is_finite() && t.moe.bias_rate > 0.0) {
            return Err(invalid(
                "training.moe.bias_rate",
                format!("must be > 0, got {}", t.moe.bias_rate),
            ));
        }
        if let Some(f) = t.moe.capacity_factor
            && !(f.is_finite() && f > 0.0)
        {
            return Err(invalid(
                "training.moe.capacity_factor",
                format!("must be > 0, got {f}"),
            ));
        }
        if !(0.0..1.0).contains(&t.moe.bias_momentum) {
            return Err(invalid(
                "training.moe.bias_momentum",
                format!("must be in [0, 1), got {}", t.moe.bias_momentum),
            ));
        }
        t.spike
            .validate()
            .map_err(|m| invalid("training.spike", m))?;
        match &self.optimizer {
            OptimizerConfig::AdamW(c) => c.validate("optimizer"),
            OptimizerConfig::Muon(c) => c.validate(),
        }
        .map_err(|e| invalid("optimizer", e.to_string()))?;
        Ok(())
    }

    /// The peak learning rate reported in metrics (Muon: its matrix lr).
    pub fn peak_lr(&self) -> f64 {
        peak_lr(&self.optimizer)
    }

    /// MuonClip's threshold when the optimizer is Muon with `qk_clip` set.
    pub fn qk_clip_threshold(&self) -> Option<f64> {
        match &self.optimizer {
            OptimizerConfig::Muon(m) => m.qk_clip,
            _ => None,
        }
    }

    /// Micro-batches for the step that starts with `tokens_seen` tokens behind it.
    pub fn grad_accum_at(&self, tokens_seen: u64) -> usize {
        let max = self.data.grad_accum_steps;
        match &self.batch_warmup {
            None => max,
            Some(warmup) => {
                let wanted = warmup.tokens_per_step(tokens_seen);
                let per_micro = self.data.tokens_per_micro_batch();
                (wanted.div_ceil(per_micro) as usize).clamp(1, max)
            }
        }
    }

    /// The resolved config as TOML text (loads back to an equal `TrainConfig`).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(&self.to_file()).map_err(|e| invalid("<config>", e.to_string()))
    }

    /// Parses the text written by [`TrainConfig::to_toml`] (paths are absolute already).
    pub fn from_toml(text: &str, origin: &str) -> Result<TrainConfig, ConfigError> {
        let mut table = keys::parse_table(text, Path::new(origin))?;
        // Configs saved by earlier releases use the old names; read them quietly.
        keys::migrate_renamed(&mut table, RENAMED, origin)?;
        let file = ConfigFile::from_table(table, origin)?;
        TrainConfig::from_file(file, Path::new("/"))
    }
}

/// Dotted keys of the resolved configs whose values differ, ignoring keys that do not change
/// what is trained (length of the run, evaluation and checkpoint cadence, naming). The schedule
/// is compared by its values over the completed steps (`resume_step`), so a WSD decay can be
/// moved later when resuming from a stable-phase checkpoint.
pub fn math_fields_differ(
    saved: &TrainConfig,
    current: &TrainConfig,
    resume_step: u64,
) -> Vec<(String, String, String)> {
    const FREE: &[&str] = &[
        "title",
        "output_dir",
        "training.steps",
        "training.max_bad_steps",
        "eval.",
        "checkpoint.",
        // Exact (bit-identical gradients), so it may change between sessions of a run.
        "training.activation_checkpointing",
        "data.eval",
        "data.max_epochs",
    ];
    // The schedule is compared by its values below (all of it but batch warmup).
    let mut diffs: Vec<_> = keys::differences(&saved.to_file(), &current.to_file(), FREE)
        .into_iter()
        .filter(|(key, _, _)| {
            !key.starts_with("schedule.") || key.starts_with("schedule.batch_warmup")
        })
        .collect();
    if let Some(step) = (0..resume_step)
        .find(|&s| saved.schedule.lr_factor(s).to_bits() != current.schedule.lr_factor(s).to_bits())
    {
        diffs.push((
            "schedule".into(),
            format!(
                "lr factor {} at step {step}",
                saved.schedule.lr_factor(step)
            ),
            format!("{}", current.schedule.lr_factor(step)),
        ));
    }
    diffs
}

/// The configured (peak) learning rate of an optimizer config.
pub fn peak_lr(config: &OptimizerConfig) -> f64 {
    match config {
        OptimizerConfig::AdamW(adamw) => adamw.lr,
        OptimizerConfig::Muon(muon) => muon.lr,
    }
}
