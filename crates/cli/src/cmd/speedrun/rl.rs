//! The speedrun's GRPO stage: reinforcement learning with the exact-match reward on the SFT
//! model, through the same path as `stoke grpo <out>/grpo.toml` (the four-module asynchronous
//! pipeline, one version of staleness allowed), and the figures the report card charts.
//!
//! What it is not: the held-out accuracy comparison with the other models (stage 7 evaluates the
//! GRPO model with the same greedy exact-match evaluation as the pretrained and SFT models); the
//! in-run figures here are the pipeline's own (sampled pass@1 at the rollout temperature and
//! greedy pass@1 on the held-out split).

use std::path::{Path, PathBuf};

use anyhow::Context;
use serde::Serialize;
use stoke_pipeline::config::GrpoConfig;
use stoke_pipeline::metrics::{GrpoMetricsLog, GrpoRecord};
use stoke_pipeline::run::RunOptions;

use super::recipe::Recipe;
use crate::cmd::grpo::run_config;

/// What the GRPO stage did.
#[derive(Clone, Debug, Serialize)]
pub struct GrpoStageSummary {
    pub run_dir: PathBuf,
    pub model_dir: PathBuf,
    pub report: PathBuf,
    pub steps: u64,
    pub prompts_per_step: usize,
    pub group_size: usize,
    pub seconds: f64,
    /// Update work only (no evaluation, no saving).
    pub seconds_per_step: f64,
    pub samples_per_second: f64,
    /// Mean training reward of the first and of the last 10% of updates.
    pub initial_reward: f64,
    pub final_reward: f64,
    /// (update, greedy pass@1, sampled pass@1) of every in-run held-out evaluation.
    pub held_out: Vec<(u64, f64, f64)>,
    /// (update, mean training reward), for the chart.
    #[serde(skip)]
    pub rewards: Vec<(u64, f64)>,
    pub reward_failures: u64,
}

/// Writes `<out>/grpo.toml` and runs it on `sft_model`.
pub fn grpo(
    recipe: &Recipe,
    out: &Path,
    sft_model: &Path,
    seed: u64,
) -> anyhow::Result<GrpoStageSummary> {
    let run_dir = out.join("grpo");
    grpo_run(
        &recipe.grpo_config(sft_model, &run_dir, seed)?,
        &out.join("grpo.toml"),
    )
}

/// Writes the `stoke grpo` config `text` to `config_path`, runs it and reads back its figures
/// (the GRPO stage, and the distillation stage's on-policy phase).
pub fn grpo_run(text: &str, config_path: &Path) -> anyhow::Result<GrpoStageSummary> {
    std::fs::write(config_path, text)
        .with_context(|| format!("writing {}", config_path.display()))?;
    let config = GrpoConfig::load(config_path, &[])
        .with_context(|| format!("resolving {}", config_path.display()))?;
    let summary = run_config(
        &config,
        RunOptions {
            resume: false,
            quiet: false,
        },
    )?;
    let records = GrpoMetricsLog::read_all(&summary.metrics)?;
    let rewards: Vec<(u64, f64)> = records
        .iter()
        .filter_map(|r| match r {
            GrpoRecord::Step(step) => Some((step.step, step.reward_mean)),
            _ => None,
        })
        .collect();
    let held_out = records
        .iter()
        .filter_map(|r| match r {
            GrpoRecord::Eval(eval) => Some((eval.step, eval.greedy_pass_at_1, eval.pass_at_1)),
            _ => None,
        })
        .collect();
    let tenth = (rewards.len() / 10).max(1);
    let mean = |values: &[(u64, f64)]| {
        values.iter().map(|(_, r)| r).sum::<f64>() / values.len().max(1) as f64
    };
    Ok(GrpoStageSummary {
        run_dir: summary.out_dir.clone(),
        model_dir: summary.model_dir,
        report: summary.report,
        steps: summary.steps,
        prompts_per_step: config.settings.prompts_per_step,
        group_size: config.settings.group_size,
        seconds: summary.seconds,
        seconds_per_step: summary.seconds_per_step,
        samples_per_second: summary.samples_per_second,
        initial_reward: mean(&rewards[..tenth.min(rewards.len())]),
        final_reward: mean(&rewards[rewards.len().saturating_sub(tenth)..]),
        held_out,
        rewards,
        reward_failures: summary.reward_failures,
    })
}
