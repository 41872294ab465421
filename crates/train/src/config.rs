//! Run configuration in two layers: [`ConfigFile`], the TOML file format (every table rejects
//! unknown keys; most dials optional), and [`TrainConfig`], the validated runtime record that
//! the trainer reads (public fields, so code such as the speedrun builds it without TOML).
//!
//! ```toml
//! title = "pretrain-tiny"
//! output_dir = "../runs/pretrain-tiny"      # relative paths are relative to this file's folder
//! [model]
//! preset = "micro"            # or: config = "config.json" (random init) | pretrained = "hf-dir"
//! tokenizer = "../tokenizer"  # folder with tokenizer.json (default: the pretrained folder)
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
//! What this is not: no file reading beyond the model's `config.json` (needed to derive the
//! learning rate); the trainer opens the data.

use std::path::{Path, PathBuf};

use serde::{Deserialize, Serialize};
use stoke_data::packing::PackingPolicy;
use stoke_optim::{
    AdamWConfig, BatchSizeWarmup, DecayShape, LrSchedule, MuonConfig, OptimizerConfig,
};

use crate::spike::{SpikeAction, SpikePolicy};

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub pretrained: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tokenizer: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub init_seed: Option<u64>,
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
    /// Global gradient-norm clip; 0 turns clipping off (default 1.0).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub clip_norm: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub z_loss: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub logit_softcap: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bad_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_every: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub eval_batches: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub checkpoint_every: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub keep_last: Option<usize>,
    #[serde(default)]
    pub keep_steps: Vec<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub spike: Option<SpikeFile>,
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
}

/// `min(3e-3, 6e-4 * 768 / hidden)`; see the module doc.
pub fn default_lr(hidden_size: usize) -> f64 {
    (6e-4 * 768.0 / hidden_size.max(1) as f64).min(3e-3)
}

/// `min(1000, steps / 20)`.
pub fn default_warmup(steps: u64) -> u64 {
    (steps / 20).min(1000)
}

impl TrainConfig {
    /// Reads `path`, applies `--set` overrides and resolves it (relative paths against the file's
    /// folder). Returns the config.
    pub fn load(path: &Path, sets: &[String]) -> Result<TrainConfig, ConfigError> {
        let text = std::fs::read_to_string(path).map_err(|source| ConfigError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        let mut table: toml::Table = toml::from_str(&text).map_err(|e| ConfigError::Syntax {
            path: path.to_path_buf(),
            message: e.to_string(),
        })?;
        apply_overrides(&mut table, sets)?;
        let file = ConfigFile::from_table(table, &path.display().to_string())?;
        let base = path.parent().unwrap_or(Path::new("."));
        let base = if base.as_os_str().is_empty() {
            Path::new(".")
        } else {
            base
        };
        TrainConfig::from_file(file, base)
    }

    /// Resolves a parsed file: fills derived defaults and makes paths absolute against `base`.
    pub fn from_file(file: ConfigFile, base: &Path) -> Result<TrainConfig, ConfigError> {
        let base = std::path::absolute(base).map_err(|source| ConfigError::Io {
            path: base.to_path_buf(),
            source,
        })?;
        let at = |p: &Path| base.join(p);
        let m = &file.model;
        let chosen = [
            m.preset.is_some(),
            m.config.is_some(),
            m.pretrained.is_some(),
        ];
        if chosen.iter().filter(|c| **c).count() != 1 {
            return Err(invalid(
                "model",
                "set exactly one of `preset`, `config` (a config.json) or `pretrained` (a model folder)",
            ));
        }
        if m.vocab_size.is_some() && m.preset.is_none() {
            return Err(invalid("model.vocab_size", "only applies to a `preset`"));
        }
        let (source, hidden_size) = if let Some(preset) = m.preset {
            let source = ModelSource::Preset {
                preset,
                vocab_size: m.vocab_size,
            };
            (source, preset.shape().0)
        } else if let Some(config) = &m.config {
            let path = at(config);
            let hidden = hidden_size_of(&path, "model.config")?;
            (ModelSource::ConfigJson(path), hidden)
        } else {
            let dir = at(m.pretrained.as_deref().unwrap_or(Path::new(".")));
            let hidden = hidden_size_of(&dir.join("config.json"), "model.pretrained")?;
            (ModelSource::Pretrained(dir), hidden)
        };
        let tokenizer = match (&m.tokenizer, &source) {
            (Some(dir), _) => Some(at(dir)),
            (None, ModelSource::Pretrained(dir)) if dir.join("tokenizer.json").exists() => {
                Some(dir.clone())
            }
            _ => None,
        };
        let training_seed = file.training.seed;
        let model = ModelSpec {
            source,
            tokenizer,
            init_seed: m.init_seed.unwrap_or(training_seed),
        };

        let data = resolve_data(&file.data, &at)?;
        let optimizer = resolve_optimizer(&file.optimizer, hidden_size)?;
        let steps = file.training.steps;
        let (schedule, batch_warmup) = resolve_schedule(&file.schedule, steps, &data)?;
        let t = &file.training;
        let s = t.spike.clone().unwrap_or_default();
        let spike_default = SpikePolicy::default();
        let training = TrainingConfig {
            steps,
            seed: t.seed,
            clip_norm: match t.clip_norm {
                None => Some(1.0),
                Some(0.0) => None,
                Some(c) => Some(c),
            },
            z_loss: t.z_loss.unwrap_or(0.0),
            logit_softcap: t.logit_softcap,
            max_bad_steps: t.max_bad_steps.unwrap_or(3),
            spike: SpikePolicy {
                action: s.action.unwrap_or(spike_default.action),
                sigma: s.sigma.unwrap_or(spike_default.sigma),
                min_history: s.min_history.unwrap_or(spike_default.min_history),
                ema_decay: s.ema_decay.unwrap_or(spike_default.ema_decay),
                cooldown_steps: s.cooldown_steps.unwrap_or(spike_default.cooldown_steps),
                max_consecutive_skips: s
                    .max_consecutive_skips
                    .unwrap_or(spike_default.max_consecutive_skips),
            },
            eval_every: t.eval_every.unwrap_or(0),
            eval_batches: t.eval_batches.unwrap_or(8),
            checkpoint_every: t.checkpoint_every.unwrap_or(0),
            keep_last: t.keep_last.unwrap_or(2),
            keep_steps: t.keep_steps.clone(),
        };
        let config = TrainConfig {
            title: file.title.clone().unwrap_or_else(|| {
                file.output_dir
                    .file_name()
                    .map(|n| n.to_string_lossy().into_owned())
                    .unwrap_or_else(|| "training run".into())
            }),
            output_dir: at(&file.output_dir),
            model,
            data,
            optimizer,
            schedule,
            batch_warmup,
            training,
        };
        config.validate()?;
        Ok(config)
    }

    /// Checks ranges and combinations (also for configs built in code).
    pub fn validate(&self) -> Result<(), ConfigError> {
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
                "training.clip_norm",
                format!("must be > 0 (0 turns it off), got {c}"),
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
        match &self.optimizer {
            OptimizerConfig::AdamW(c) => c.lr,
            OptimizerConfig::Muon(c) => c.lr,
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

    /// The file form with every value explicit (what `<run>/config.toml` holds).
    pub fn to_file(&self) -> ConfigFile {
        let (preset, vocab_size, config, pretrained) = match &self.model.source {
            ModelSource::Preset { preset, vocab_size } => (Some(*preset), *vocab_size, None, None),
            ModelSource::ConfigJson(p) => (None, None, Some(p.clone()), None),
            ModelSource::Pretrained(p) => (None, None, None, Some(p.clone())),
        };
        let (kind, train, eval) = match &self.data.source {
            DataSource::Shards { train, eval } => (DataKind::Shards, train.clone(), eval.clone()),
            DataSource::Chat { train, eval } => (
                DataKind::Chat,
                vec![train.clone()],
                eval.iter().cloned().collect(),
            ),
        };
        let optimizer = match &self.optimizer {
            OptimizerConfig::AdamW(c) => OptimizerFile {
                kind: OptimizerKind::Adamw,
                lr: Some(c.lr),
                beta1: Some(c.beta1),
                beta2: Some(c.beta2),
                eps: Some(c.eps),
                weight_decay: Some(c.weight_decay),
                ..OptimizerFile::default()
            },
            OptimizerConfig::Muon(c) => OptimizerFile {
                kind: OptimizerKind::Muon,
                lr: Some(c.lr),
                beta1: Some(c.adamw.beta1),
                beta2: Some(c.adamw.beta2),
                eps: Some(c.adamw.eps),
                weight_decay: Some(c.weight_decay),
                adamw_lr: Some(c.adamw.lr),
                momentum: Some(c.momentum),
                nesterov: Some(c.nesterov),
                ns_steps: Some(c.ns_steps),
            },
        };
        let mut schedule = match &self.schedule {
            LrSchedule::Constant { warmup_steps } => ScheduleFile {
                kind: ScheduleKind::Constant,
                warmup_steps: Some(*warmup_steps),
                ..ScheduleFile::default()
            },
            LrSchedule::Cosine {
                warmup_steps,
                total_steps,
                min_lr_ratio,
            } => ScheduleFile {
                kind: ScheduleKind::Cosine,
                warmup_steps: Some(*warmup_steps),
                min_lr_ratio: Some(*min_lr_ratio),
                decay_steps: Some(total_steps.saturating_sub(*warmup_steps)),
                ..ScheduleFile::default()
            },
            LrSchedule::Wsd {
                warmup_steps,
                decay_start,
                decay_steps,
                min_lr_ratio,
                decay_shape,
            } => ScheduleFile {
                kind: ScheduleKind::Wsd,
                warmup_steps: Some(*warmup_steps),
                min_lr_ratio: Some(*min_lr_ratio),
                decay_start: Some(*decay_start),
                decay_steps: Some(*decay_steps),
                decay_shape: Some(*decay_shape),
                ..ScheduleFile::default()
            },
        };
        schedule.batch_warmup = self.batch_warmup.as_ref().map(|w| BatchWarmupFile {
            start_tokens_per_step: w.start_tokens_per_step,
            ramp_tokens: w.ramp_tokens,
        });
        let t = &self.training;
        let s = &t.spike;
        ConfigFile {
            title: Some(self.title.clone()),
            output_dir: self.output_dir.clone(),
            model: ModelFile {
                preset,
                vocab_size,
                config,
                pretrained,
                tokenizer: self.model.tokenizer.clone(),
                init_seed: Some(self.model.init_seed),
            },
            data: DataFile {
                kind,
                train,
                eval,
                seq_len: self.data.seq_len,
                micro_batch_size: self.data.micro_batch_size,
                grad_accum_steps: Some(self.data.grad_accum_steps),
                tokens_per_step: None,
                packing: Some(self.data.packing),
                shuffle: Some(self.data.shuffle),
                max_epochs: self.data.max_epochs,
            },
            optimizer,
            schedule,
            training: TrainingFile {
                steps: t.steps,
                seed: t.seed,
                clip_norm: Some(t.clip_norm.unwrap_or(0.0)),
                z_loss: Some(t.z_loss),
                logit_softcap: t.logit_softcap,
                max_bad_steps: Some(t.max_bad_steps),
                eval_every: Some(t.eval_every),
                eval_batches: Some(t.eval_batches),
                checkpoint_every: Some(t.checkpoint_every),
                keep_last: Some(t.keep_last),
                keep_steps: t.keep_steps.clone(),
                spike: Some(SpikeFile {
                    action: Some(s.action),
                    sigma: Some(s.sigma),
                    min_history: Some(s.min_history),
                    ema_decay: Some(s.ema_decay),
                    cooldown_steps: Some(s.cooldown_steps),
                    max_consecutive_skips: Some(s.max_consecutive_skips),
                }),
            },
        }
    }

    /// The resolved config as TOML text (loads back to an equal `TrainConfig`).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(&self.to_file()).map_err(|e| invalid("<config>", e.to_string()))
    }

    /// Parses the text written by [`TrainConfig::to_toml`] (paths are absolute already).
    pub fn from_toml(text: &str, origin: &str) -> Result<TrainConfig, ConfigError> {
        let table: toml::Table = toml::from_str(text).map_err(|e| ConfigError::Syntax {
            path: PathBuf::from(origin),
            message: e.to_string(),
        })?;
        let file = ConfigFile::from_table(table, origin)?;
        TrainConfig::from_file(file, Path::new("/"))
    }
}

impl ConfigFile {
    /// Deserialises a table, naming the offending key on error.
    pub fn from_table(table: toml::Table, origin: &str) -> Result<ConfigFile, ConfigError> {
        serde_path_to_error::deserialize(toml::Value::Table(table)).map_err(|e| ConfigError::Key {
            file: origin.to_string(),
            key: e.path().to_string(),
            message: e.inner().to_string(),
        })
    }
}

fn hidden_size_of(config_json: &Path, key: &str) -> Result<usize, ConfigError> {
    let config = stoke_model::ModelConfig::from_file(config_json)
        .map_err(|e| invalid(key, e.to_string()))?;
    Ok(config.hidden_size)
}

fn resolve_data(d: &DataFile, at: &dyn Fn(&Path) -> PathBuf) -> Result<DataConfig, ConfigError> {
    let micro_tokens = (d.seq_len * d.micro_batch_size) as u64;
    let grad_accum_steps = match (d.grad_accum_steps, d.tokens_per_step) {
        (Some(_), Some(_)) => {
            return Err(invalid(
                "data.tokens_per_step",
                "set either `grad_accum_steps` or `tokens_per_step`, not both",
            ));
        }
        (Some(n), None) => n,
        (None, None) => 1,
        (None, Some(tokens)) => {
            if micro_tokens == 0 || tokens % micro_tokens != 0 {
                return Err(invalid(
                    "data.tokens_per_step",
                    format!(
                        "{tokens} is not a multiple of seq_len x micro_batch_size = {micro_tokens}"
                    ),
                ));
            }
            (tokens / micro_tokens) as usize
        }
    };
    let source = match d.kind {
        DataKind::Shards => DataSource::Shards {
            train: d.train.iter().map(|p| at(p)).collect(),
            eval: d.eval.iter().map(|p| at(p)).collect(),
        },
        DataKind::Chat => {
            let [train] = d.train.as_slice() else {
                return Err(invalid(
                    "data.train",
                    "chat data takes exactly one JSONL file",
                ));
            };
            if d.eval.len() > 1 {
                return Err(invalid(
                    "data.eval",
                    "chat data takes at most one JSONL file",
                ));
            }
            DataSource::Chat {
                train: at(train),
                eval: d.eval.first().map(|p| at(p)),
            }
        }
    };
    Ok(DataConfig {
        source,
        seq_len: d.seq_len,
        micro_batch_size: d.micro_batch_size,
        grad_accum_steps,
        // Conversations are not cut across rows (a cut reply trains on a fragment); documents
        // of pretraining text are.
        packing: d.packing.unwrap_or(match d.kind {
            DataKind::Shards => PackingPolicy::BestFitDecreasingSplit { window_docs: 1024 },
            DataKind::Chat => PackingPolicy::BestFitDecreasing { window_docs: 256 },
        }),
        shuffle: d.shuffle.unwrap_or(true),
        max_epochs: d.max_epochs,
    })
}

fn resolve_optimizer(
    o: &OptimizerFile,
    hidden_size: usize,
) -> Result<OptimizerConfig, ConfigError> {
    let lr = o.lr.unwrap_or_else(|| default_lr(hidden_size));
    let base = AdamWConfig::default();
    let adamw = AdamWConfig {
        lr,
        beta1: o.beta1.unwrap_or(base.beta1),
        beta2: o.beta2.unwrap_or(base.beta2),
        eps: o.eps.unwrap_or(base.eps),
        weight_decay: o.weight_decay.unwrap_or(base.weight_decay),
    };
    Ok(match o.kind {
        OptimizerKind::Adamw => {
            for (key, set) in [
                ("adamw_lr", o.adamw_lr.is_some()),
                ("momentum", o.momentum.is_some()),
                ("nesterov", o.nesterov.is_some()),
                ("ns_steps", o.ns_steps.is_some()),
            ] {
                if set {
                    return Err(invalid(
                        &format!("optimizer.{key}"),
                        "only applies to kind = \"muon\"",
                    ));
                }
            }
            OptimizerConfig::AdamW(adamw)
        }
        OptimizerKind::Muon => {
            let muon = MuonConfig::default();
            OptimizerConfig::Muon(MuonConfig {
                lr,
                momentum: o.momentum.unwrap_or(muon.momentum),
                nesterov: o.nesterov.unwrap_or(muon.nesterov),
                ns_steps: o.ns_steps.unwrap_or(muon.ns_steps),
                weight_decay: adamw.weight_decay,
                adamw: AdamWConfig {
                    lr: o.adamw_lr.unwrap_or(lr),
                    ..adamw
                },
            })
        }
    })
}

fn resolve_schedule(
    s: &ScheduleFile,
    steps: u64,
    data: &DataConfig,
) -> Result<(LrSchedule, Option<BatchSizeWarmup>), ConfigError> {
    let warmup_steps = s.warmup_steps.unwrap_or_else(|| default_warmup(steps));
    let only_for = |key: &str, set: bool, kinds: &str| {
        if set {
            Err(invalid(
                &format!("schedule.{key}"),
                format!("only applies to kind = {kinds}"),
            ))
        } else {
            Ok(())
        }
    };
    let schedule = match s.kind {
        ScheduleKind::Constant => {
            only_for(
                "min_lr_ratio",
                s.min_lr_ratio.is_some(),
                "\"cosine\" or \"wsd\"",
            )?;
            only_for(
                "decay_steps",
                s.decay_steps.is_some(),
                "\"cosine\" or \"wsd\"",
            )?;
            only_for("decay_fraction", s.decay_fraction.is_some(), "\"wsd\"")?;
            only_for("decay_start", s.decay_start.is_some(), "\"wsd\"")?;
            only_for("decay_shape", s.decay_shape.is_some(), "\"wsd\"")?;
            LrSchedule::Constant { warmup_steps }
        }
        ScheduleKind::Cosine => {
            only_for("decay_fraction", s.decay_fraction.is_some(), "\"wsd\"")?;
            only_for("decay_start", s.decay_start.is_some(), "\"wsd\"")?;
            only_for("decay_shape", s.decay_shape.is_some(), "\"wsd\"")?;
            let decay = s.decay_steps.unwrap_or(steps.saturating_sub(warmup_steps));
            LrSchedule::Cosine {
                warmup_steps,
                total_steps: warmup_steps + decay,
                min_lr_ratio: s.min_lr_ratio.unwrap_or(0.1),
            }
        }
        ScheduleKind::Wsd => {
            let fraction = s.decay_fraction.unwrap_or(0.2);
            if !(0.0..=1.0).contains(&fraction) {
                return Err(invalid(
                    "schedule.decay_fraction",
                    format!("must be in [0, 1], got {fraction}"),
                ));
            }
            let planned_decay = ((steps as f64) * fraction).round() as u64;
            let decay_start = s.decay_start.unwrap_or(steps.saturating_sub(planned_decay));
            let decay_steps = s
                .decay_steps
                .unwrap_or(steps.saturating_sub(decay_start).max(1));
            LrSchedule::Wsd {
                warmup_steps,
                decay_start: decay_start.max(warmup_steps),
                decay_steps,
                min_lr_ratio: s.min_lr_ratio.unwrap_or(0.0),
                decay_shape: s.decay_shape.unwrap_or(DecayShape::Linear),
            }
        }
    };
    if let Some(r) = match &schedule {
        LrSchedule::Cosine { min_lr_ratio, .. } | LrSchedule::Wsd { min_lr_ratio, .. } => {
            Some(*min_lr_ratio)
        }
        LrSchedule::Constant { .. } => None,
    } && !(0.0..=1.0).contains(&r)
    {
        return Err(invalid(
            "schedule.min_lr_ratio",
            format!("must be in [0, 1], got {r}"),
        ));
    }
    let batch_warmup = match &s.batch_warmup {
        None => None,
        Some(w) => {
            let end = data.tokens_per_micro_batch() * data.grad_accum_steps as u64;
            if w.start_tokens_per_step == 0 || w.start_tokens_per_step > end {
                return Err(invalid(
                    "schedule.batch_warmup.start_tokens_per_step",
                    format!("must be in 1..={end} (the full step's tokens)"),
                ));
            }
            Some(BatchSizeWarmup {
                start_tokens_per_step: w.start_tokens_per_step,
                end_tokens_per_step: end,
                ramp_tokens: w.ramp_tokens,
            })
        }
    };
    Ok((schedule, batch_warmup))
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
        let mut current = &mut *table;
        for (depth, part) in parts[..parts.len() - 1].iter().enumerate() {
            let entry = current
                .entry(part.to_string())
                .or_insert_with(|| toml::Value::Table(toml::Table::new()));
            current = match entry {
                toml::Value::Table(t) => t,
                _ => {
                    return Err(fail(format!(
                        "`{}` is a value, not a table",
                        parts[..=depth].join(".")
                    )));
                }
            };
        }
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
        "training.eval_every",
        "training.eval_batches",
        "training.checkpoint_every",
        "training.keep_last",
        "training.keep_steps",
        "data.eval",
        "data.max_epochs",
    ];
    let flatten = |c: &TrainConfig| {
        let mut out = std::collections::BTreeMap::new();
        if let Ok(toml::Value::Table(t)) = toml::Value::try_from(c.to_file()) {
            flatten_into("", &toml::Value::Table(t), &mut out);
        }
        out
    };
    let (a, b) = (flatten(saved), flatten(current));
    let mut keys: Vec<&String> = a.keys().chain(b.keys()).collect();
    keys.sort();
    keys.dedup();
    let mut diffs = Vec::new();
    for key in keys {
        if FREE.contains(&key.as_str())
            || key.starts_with("schedule.") && !key.starts_with("schedule.batch_warmup")
        {
            continue;
        }
        let (x, y) = (a.get(key), b.get(key));
        if x != y {
            let show = |v: Option<&String>| v.cloned().unwrap_or_else(|| "(unset)".into());
            diffs.push((key.clone(), show(x), show(y)));
        }
    }
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

fn flatten_into(
    prefix: &str,
    value: &toml::Value,
    out: &mut std::collections::BTreeMap<String, String>,
) {
    match value {
        toml::Value::Table(t) => {
            for (k, v) in t {
                let key = if prefix.is_empty() {
                    k.clone()
                } else {
                    format!("{prefix}.{k}")
                };
                flatten_into(&key, v, out);
            }
        }
        other => {
            out.insert(prefix.to_string(), other.to_string());
        }
    }
}
