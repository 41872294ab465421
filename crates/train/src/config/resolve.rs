//! Between the two layers: `TrainConfig::from_file` fills the derived defaults (see the
//! `config` module doc for the rules) and makes paths absolute; `TrainConfig::to_file` writes
//! every value back explicitly, so the saved `config.toml` resolves to an equal config.

use std::path::{Path, PathBuf};

use stoke_data::packing::PackingPolicy;
use stoke_model::InitScheme;
use stoke_optim::{
    AdamWConfig, BatchSizeWarmup, DecayShape, LrSchedule, MuonConfig, OptimizerConfig,
};

use super::file::{
    BatchWarmupFile, CheckpointFile, ConfigFile, DataFile, DataKind, EvalFile, InitKind, ModelFile,
    OptimizerFile, OptimizerKind, ScheduleFile, ScheduleKind, SpikeFile, TrainingFile,
};
use super::{
    ConfigError, DataConfig, DataSource, ModelSource, ModelSpec, TrainConfig, TrainingConfig,
    default_lr, default_warmup, invalid,
};
use crate::spike::SpikePolicy;

impl TrainConfig {
    /// Resolves a parsed file: fills derived defaults and makes paths absolute against `base`.
    pub fn from_file(file: ConfigFile, base: &Path) -> Result<TrainConfig, ConfigError> {
        let base = std::path::absolute(base).map_err(|source| ConfigError::Io {
            path: base.to_path_buf(),
            source,
        })?;
        let at = |p: &Path| base.join(p);
        let m = &file.model;
        let chosen = [m.preset.is_some(), m.config.is_some(), m.path.is_some()];
        if chosen.iter().filter(|c| **c).count() != 1 {
            return Err(invalid(
                "model",
                "set exactly one of `preset`, `config` (a config.json) or `path` (a model folder)",
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
            let dir = at(m.path.as_deref().unwrap_or(Path::new(".")));
            // A file is a GGUF model, which carries its config and tokenizer in its metadata.
            let hidden = if dir.is_file() {
                stoke_model::gguf::config_of(&dir)
                    .map_err(|e| invalid("model.path", e.to_string()))?
                    .hidden_size
            } else {
                hidden_size_of(&dir.join("config.json"), "model.path")?
            };
            (ModelSource::Pretrained(dir), hidden)
        };
        let tokenizer = match (&m.tokenizer, &source) {
            (Some(dir), _) => Some(at(dir)),
            (None, ModelSource::Pretrained(dir))
                if dir.is_file() || dir.join("tokenizer.json").exists() =>
            {
                Some(dir.clone())
            }
            _ => None,
        };
        let training_seed = file.training.seed;
        let model = ModelSpec {
            source,
            tokenizer,
            init_seed: m.init_seed.unwrap_or(training_seed),
            init: resolve_init(m)?,
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
            clip_norm: super::keys::clip_grad_norm(file.optimizer.clip_grad_norm),
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
            eval_every: file.eval.every.unwrap_or(0),
            eval_batches: file.eval.batches.unwrap_or(8),
            checkpoint_every: file.checkpoint.every.unwrap_or(0),
            keep_last: file.checkpoint.keep.unwrap_or(2),
            keep_steps: file.checkpoint.keep_steps.clone(),
            precision: t.precision.unwrap_or_default(),
            activation_checkpointing: t.activation_checkpointing.unwrap_or(false),
            mtp_loss_weight: t.mtp_loss_weight,
            moe: {
                let m = t.moe.clone().unwrap_or_default();
                let d = crate::config::MoeBalanceConfig::default();
                crate::config::MoeBalanceConfig {
                    balance: m.balance.unwrap_or(d.balance),
                    aux_loss_coef: m.aux_loss_coef,
                    bias_rate: m.bias_rate.unwrap_or(d.bias_rate),
                    bias_momentum: m.bias_momentum.unwrap_or(d.bias_momentum),
                    capacity_factor: m.capacity_factor,
                }
            },
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
            lora: file.lora.clone(),
            distill: file.distill.as_ref().map(|d| super::DistillConfig {
                teacher: d.teacher.as_deref().map(at),
                ..d.clone()
            }),
        };
        if let Some(lora) = &config.lora {
            lora.validate().map_err(|e| {
                let detail = match e {
                    stoke_model::ModelError::InvalidArgument(m) => m,
                    other => other.to_string(),
                };
                match detail.split_once(": ") {
                    Some((key, message)) => ConfigError::Invalid {
                        key: key.to_string(),
                        message: message.to_string(),
                    },
                    None => ConfigError::Invalid {
                        key: "lora".into(),
                        message: detail,
                    },
                }
            })?;
        }
        config.validate()?;
        Ok(config)
    }

    /// The file form with every value explicit (what `<run>/config.toml` holds).
    pub fn to_file(&self) -> ConfigFile {
        let (preset, vocab_size, config, path) = match &self.model.source {
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
        let optimizer = OptimizerFile::explicit(&self.optimizer);
        let mut schedule = ScheduleFile::explicit(&self.schedule);
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
                path,
                tokenizer: self.model.tokenizer.clone(),
                init_seed: Some(self.model.init_seed),
                init: Some(match self.model.init {
                    InitScheme::Normal { .. } => InitKind::Normal,
                    InitScheme::TruncatedNormal { .. } => InitKind::TruncatedNormal,
                    InitScheme::Scaled => InitKind::Scaled,
                }),
                init_std: match self.model.init {
                    InitScheme::Normal { std } | InitScheme::TruncatedNormal { std } => Some(std),
                    InitScheme::Scaled => None,
                },
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
            optimizer: OptimizerFile {
                clip_grad_norm: Some(t.clip_norm.unwrap_or(0.0)),
                ..optimizer
            },
            schedule,
            lora: self.lora.clone(),
            distill: self.distill.clone(),
            eval: EvalFile {
                every: Some(t.eval_every),
                batches: Some(t.eval_batches),
            },
            checkpoint: CheckpointFile {
                every: Some(t.checkpoint_every),
                keep: Some(t.keep_last),
                keep_steps: t.keep_steps.clone(),
            },
            training: TrainingFile {
                steps: t.steps,
                seed: t.seed,
                z_loss: Some(t.z_loss),
                logit_softcap: t.logit_softcap,
                max_bad_steps: Some(t.max_bad_steps),
                spike: Some(SpikeFile {
                    action: Some(s.action),
                    sigma: Some(s.sigma),
                    min_history: Some(s.min_history),
                    ema_decay: Some(s.ema_decay),
                    cooldown_steps: Some(s.cooldown_steps),
                    max_consecutive_skips: Some(s.max_consecutive_skips),
                }),
                precision: (t.precision != stoke_types::Precision::F32).then_some(t.precision),
                activation_checkpointing: t.activation_checkpointing.then_some(true),
                mtp_loss_weight: t.mtp_loss_weight,
                moe: (t.moe != crate::config::MoeBalanceConfig::default()).then_some(
                    super::file::MoeBalanceFile {
                        balance: Some(t.moe.balance),
                        aux_loss_coef: t.moe.aux_loss_coef,
                        bias_rate: Some(t.moe.bias_rate),
                        bias_momentum: Some(t.moe.bias_momentum),
                        capacity_factor: t.moe.capacity_factor,
                    },
                ),
            },
        }
    }
}

/// `[model] init` and `init_std` as a scheme; a std must be positive and finite, and "scaled"
/// takes none (its scales come from the model's shape).
fn resolve_init(m: &ModelFile) -> Result<InitScheme, ConfigError> {
    let std = match m.init_std {
        Some(std) if !(std.is_finite() && std > 0.0) => {
            return Err(invalid(
                "model.init_std",
                format!("{std} is not a positive number"),
            ));
        }
        Some(std) => std,
        None => 0.02,
    };
    Ok(match m.init.unwrap_or(InitKind::Normal) {
        InitKind::Normal => InitScheme::Normal { std },
        InitKind::TruncatedNormal => InitScheme::TruncatedNormal { std },
        InitKind::Scaled if m.init_std.is_some() => {
            return Err(invalid(
                "model.init_std",
                "does not apply to init = \"scaled\" (its scales come from the model's width and depth)",
            ));
        }
        InitKind::Scaled => InitScheme::Scaled,
    })
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

/// The optimizer of an `[optimizer]` table; `lr` defaults to [`default_lr`] of `hidden_size`.
pub fn resolve_optimizer(
    o: &OptimizerFile,
    hidden_size: usize,
) -> Result<OptimizerConfig, ConfigError> {
    let defaults = AdamWConfig {
        lr: default_lr(hidden_size),
        ..AdamWConfig::default()
    };
    resolve_optimizer_with(o, &defaults)
}

/// The optimizer of an `[optimizer]` table, each unset AdamW value (lr included) taken from
/// `defaults` (each command has its own: `stoke grpo` a fixed lr and no weight decay). Muon's
/// own values default to `MuonConfig::default()`. Not validated here.
pub fn resolve_optimizer_with(
    o: &OptimizerFile,
    defaults: &AdamWConfig,
) -> Result<OptimizerConfig, ConfigError> {
    let (lr, base) = (o.lr.unwrap_or(defaults.lr), defaults);
    let adamw = AdamWConfig {
        lr,
        beta1: o.beta1.unwrap_or(base.beta1),
        beta2: o.beta2.unwrap_or(base.beta2),
        eps: o.eps.unwrap_or(base.eps),
        weight_decay: o.weight_decay.unwrap_or(base.weight_decay),
        moments: o.moments.unwrap_or(base.moments),
    };
    Ok(match o.kind {
        OptimizerKind::Adamw => {
            for (key, set) in [
                ("adamw_lr", o.adamw_lr.is_some()),
                ("momentum", o.momentum.is_some()),
                ("nesterov", o.nesterov.is_some()),
                ("ns_steps", o.ns_steps.is_some()),
                ("qk_clip", o.qk_clip.is_some()),
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
                qk_clip: o.qk_clip,
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
    let schedule = resolve_lr_schedule(s, steps, ScheduleDefaults::shared(steps))?;
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

/// What a file layer fills in for the schedule keys a config leaves out.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct ScheduleDefaults {
    pub warmup_steps: u64,
    /// The cosine schedule's floor as a share of the peak lr.
    pub cosine_min_lr_ratio: f64,
}

impl ScheduleDefaults {
    /// The one set of schedule defaults of every training command (`stoke train`, `stoke dpo`,
    /// `stoke grpo`) over a run of `steps`: a linear warmup over `min(1000, steps / 20)` steps,
    /// and a cosine floor of 0.1 of the peak. With the kind's default (WSD, `ScheduleKind`'s
    /// `Default`) an absent `[schedule]` table means the same in every command.
    pub fn shared(steps: u64) -> ScheduleDefaults {
        ScheduleDefaults {
            warmup_steps: default_warmup(steps),
            cosine_min_lr_ratio: 0.1,
        }
    }
}

/// The learning-rate schedule of a `[schedule]` table over a run of `steps` optimizer steps
/// (`batch_warmup` is not read): keys that do not apply to the kind are refused, WSD decays over
/// the last `decay_fraction` (default 0.2) to `min_lr_ratio` (default 0). Shared with the GRPO
/// config, which gives other defaults.
pub fn resolve_lr_schedule(
    s: &ScheduleFile,
    steps: u64,
    defaults: ScheduleDefaults,
) -> Result<LrSchedule, ConfigError> {
    let warmup_steps = s.warmup_steps.unwrap_or(defaults.warmup_steps);
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
                min_lr_ratio: s.min_lr_ratio.unwrap_or(defaults.cosine_min_lr_ratio),
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
    Ok(schedule)
}

impl OptimizerFile {
    /// The file form of a resolved optimizer with every value explicit (what a run's saved
    /// config holds; `stoke grpo` writes the same form).
    pub fn explicit(config: &OptimizerConfig) -> OptimizerFile {
        match config {
            OptimizerConfig::AdamW(c) => OptimizerFile {
                kind: OptimizerKind::Adamw,
                lr: Some(c.lr),
                beta1: Some(c.beta1),
                beta2: Some(c.beta2),
                eps: Some(c.eps),
                weight_decay: Some(c.weight_decay),
                moments: (!c.moments.is_f32()).then_some(c.moments),
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
                qk_clip: c.qk_clip,
                moments: (!c.adamw.moments.is_f32()).then_some(c.adamw.moments),
                clip_grad_norm: None,
            },
        }
    }
}

impl ScheduleFile {
    /// The file form of a resolved schedule with every value explicit (`stoke grpo` writes the
    /// same form into its `[schedule]`).
    pub fn explicit(schedule: &LrSchedule) -> ScheduleFile {
        match schedule {
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
        }
    }
}
