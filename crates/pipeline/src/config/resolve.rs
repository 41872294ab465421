//! Resolution helpers of the GRPO config: each file-layer section into its validated runtime
//! value (with the documented defaults) and back (for `to_toml`). What it is not: the order of
//! resolution or the whole-config checks ([`super::GrpoConfig::from_file`] does those).

use super::*;
use stoke_train::config::{
    ConfigError, ScheduleDefaults, ScheduleFile, resolve_lr_schedule, resolve_optimizer_with,
};

pub(super) fn resolve_tasks(
    section: &str,
    source: &TaskSourceFile,
    at: &dyn Fn(&Path) -> PathBuf,
    default_problems: usize,
    default_seed: u64,
) -> Result<TaskSource, PipelineError> {
    Ok(match source {
        TaskSourceFile::Jsonl { path } => TaskSource::Jsonl { path: at(path) },
        TaskSourceFile::Arithmetic {
            levels,
            problems,
            seed,
        } => {
            let levels = levels
                .clone()
                .unwrap_or_else(|| vec![ARITHMETIC_LEVELS[0].to_string()]);
            if levels.is_empty() {
                return Err(PipelineError::config(
                    format!("{section}.levels"),
                    format!("name at least one of {}", ARITHMETIC_LEVELS.join(", ")),
                ));
            }
            if let Some(unknown) = levels
                .iter()
                .find(|l| !ARITHMETIC_LEVELS.contains(&l.as_str()))
            {
                return Err(PipelineError::config(
                    format!("{section}.levels"),
                    format!(
                        "unknown level `{unknown}` (known: {})",
                        ARITHMETIC_LEVELS.join(", ")
                    ),
                ));
            }
            let problems = problems.unwrap_or(default_problems);
            at_least_one(&format!("{section}.problems"), problems)?;
            TaskSource::Arithmetic {
                levels,
                problems,
                seed: seed.unwrap_or(default_seed),
            }
        }
    })
}

pub(super) fn task_file(source: &TaskSource) -> TaskSourceFile {
    match source {
        TaskSource::Jsonl { path } => TaskSourceFile::Jsonl { path: path.clone() },
        TaskSource::Arithmetic {
            levels,
            problems,
            seed,
        } => TaskSourceFile::Arithmetic {
            levels: Some(levels.clone()),
            problems: Some(*problems),
            seed: Some(*seed),
        },
    }
}

/// The reward list in index order; each reward that needs no sandbox is built once to check it.
pub(super) fn resolve_rewards(
    rewards: &BTreeMap<String, RewardConfig>,
) -> Result<Vec<(String, RewardConfig)>, PipelineError> {
    if rewards.is_empty() {
        let exact_gsm8k = RewardConfig::ExactMatch(ExactMatchConfig {
            mode: MatchMode::Gsm8k,
            extract_answer: true,
        });
        return Ok(vec![(DEFAULT_REWARD.to_string(), exact_gsm8k)]);
    }
    let mut ordered: Vec<(String, RewardConfig)> = Vec::with_capacity(rewards.len());
    if let Some(default) = rewards.get(DEFAULT_REWARD) {
        ordered.push((DEFAULT_REWARD.to_string(), default.clone()));
    }
    // BTreeMap iterates in name order.
    for (name, reward) in rewards {
        if name != DEFAULT_REWARD {
            ordered.push((name.clone(), reward.clone()));
        }
    }
    for (name, reward) in &ordered {
        if name.trim().is_empty() {
            return Err(PipelineError::config("rewards", "a reward name is empty"));
        }
        match reward.build(None) {
            Ok(_) | Err(stoke_reward::ConfigError::NeedsSandbox(_)) => {}
            Err(e) => {
                return Err(PipelineError::config(
                    format!("rewards.{name}"),
                    e.to_string(),
                ));
            }
        }
    }
    Ok(ordered)
}

pub(super) fn resolve_optimizer(o: &OptimizerFile) -> Result<OptimizerConfig, PipelineError> {
    // stoke train's resolver with GRPO's defaults (lr DEFAULT_LR, no weight decay).
    let defaults = AdamWConfig {
        lr: DEFAULT_LR,
        beta1: 0.9,
        beta2: 0.999,
        eps: 1e-8,
        weight_decay: 0.0,
        moments: Default::default(),
    };
    let config = resolve_optimizer_with(o, &defaults).map_err(|e| match e {
        ConfigError::Invalid { key, message } => PipelineError::config(key, message),
        other => PipelineError::config("optimizer", other.to_string()),
    })?;
    config.validate().map_err(|e| match e {
        stoke_optim::OptimError::InvalidConfig { field, reason } => {
            // The optimizer names its fields `adamw.lr`, `muon.adamw.eps`, ...; the file has
            // one flat table.
            let key = field.rsplit('.').next().unwrap_or(&field).to_string();
            PipelineError::config(format!("optimizer.{key}"), reason)
        }
        other => PipelineError::config("optimizer", other.to_string()),
    })?;
    Ok(config)
}

/// `[schedule]` through stoke train's resolver (the same keys and checks) with the GRPO defaults:
/// constant, no warmup, cosine and WSD down to 0.
pub(super) fn resolve_schedule(
    s: &ScheduleSection,
    steps: u64,
) -> Result<LrSchedule, PipelineError> {
    let file = ScheduleFile {
        kind: s.kind.unwrap_or(ScheduleKind::Constant),
        warmup_steps: s.warmup_steps,
        min_lr_ratio: s.min_lr_ratio,
        decay_fraction: None,
        decay_start: s.decay_start,
        decay_steps: s.decay_steps,
        decay_shape: s.decay_shape,
        batch_warmup: None,
    };
    let defaults = ScheduleDefaults {
        warmup_steps: 0,
        cosine_min_lr_ratio: 0.0,
    };
    let schedule = resolve_lr_schedule(&file, steps, defaults).map_err(|e| match e {
        ConfigError::Invalid { key, message } => PipelineError::config(key, message),
        other => PipelineError::config("schedule", other.to_string()),
    })?;
    schedule.validate().map_err(|e| match e {
        stoke_optim::OptimError::InvalidConfig { field, reason } => {
            PipelineError::config(field, reason)
        }
        other => PipelineError::config("schedule", other.to_string()),
    })?;
    Ok(schedule)
}

/// `[schedule]` with every value explicit: stoke train's file form (GRPO's section has no
/// `decay_fraction` or `batch_warmup`; the explicit form sets neither).
pub(super) fn schedule_file(schedule: &LrSchedule) -> ScheduleSection {
    let f = ScheduleFile::explicit(schedule);
    ScheduleSection {
        kind: Some(f.kind),
        warmup_steps: f.warmup_steps,
        min_lr_ratio: f.min_lr_ratio,
        decay_start: f.decay_start,
        decay_steps: f.decay_steps,
        decay_shape: f.decay_shape,
    }
}
