//! The speedrun's preference stage: preference optimization on the SFT model's own verified
//! samples (the iterative/online DPO route). The SFT model samples `samples` answers to each of
//! `prompts` training-split questions, the exact-match verifier scores them, and each question's
//! correct answers are paired with its wrong ones (`stoke_pipeline::rejection`, as `stoke rft`
//! writes `pairs.jsonl`). Each loss of the recipe (DPO's sigmoid and APO-zero) then trains a copy
//! of the SFT model on those pairs through `stoke dpo`'s path (cached reference log-probs, so one
//! model in memory); stage 7 evaluates the results beside the SFT model.
//!
//! Files: `<out>/preference/pairs.jsonl` (the pairs, with token ids), `rejection.json` (the
//! sampling counts), `<loss>/` (each run: `metrics.jsonl` with TRL's metric names, `model/`),
//! and `<out>/dpo-<loss>.toml`, which `stoke dpo` reruns.
//!
//! What it is not: the GRPO stage's input (GRPO still starts from the SFT model), or an
//! evaluation (stage 7 does that with the same greedy exact-match as the other models).

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use serde::Serialize;
use stoke_pipeline::config::{GrpoConfig, TaskSource};
use stoke_pipeline::rejection::{RejectionSettings, write_pairs_jsonl};
use stoke_train::preference::run::{PreferenceFile, run_preference};

use super::recipe::Recipe;
use crate::cmd::rft::sample;

/// One preference run of the stage.
#[derive(Clone, Debug, Serialize)]
pub struct PreferenceRun {
    /// The model's label in the evaluation (`dpo`, `apo_zero`).
    pub label: String,
    pub config: PathBuf,
    pub model_dir: PathBuf,
    pub metrics: PathBuf,
    pub steps: u64,
    pub seconds: f64,
    /// TRL's metrics of the first and of the last step.
    pub first: Vec<(String, f64)>,
    pub last: Vec<(String, f64)>,
    /// (step, logps/chosen, logps/rejected, rewards/margins), for the chart.
    #[serde(skip)]
    pub curve: Vec<(u64, f64, f64, f64)>,
}

/// What the preference stage did.
#[derive(Clone, Debug, Serialize)]
pub struct PreferenceStageSummary {
    pub pairs_file: PathBuf,
    pub prompts: usize,
    pub samples_per_prompt: usize,
    /// Sampled answers the verifier called correct, of all sampled.
    pub correct: usize,
    pub sampled: usize,
    pub pairs: usize,
    pub sampling_seconds: f64,
    pub runs: Vec<PreferenceRun>,
}

/// Samples and pairs with `sft_model`, then runs each of the recipe's losses on the pairs.
pub fn preference(
    recipe: &Recipe,
    out: &Path,
    sft_model: &Path,
    seed: u64,
) -> anyhow::Result<PreferenceStageSummary> {
    let p = recipe.preference;
    let dir = out.join("preference");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    // The model, tasks and rewards through `stoke grpo`'s config: the GRPO stage's text with
    // its own slice of the training split (another task seed).
    let origin = out.join("grpo.toml");
    let mut source = GrpoConfig::parse(&recipe.grpo_config(sft_model, &dir, seed)?, &origin, &[])
        .context("resolving the preference stage's sampling config")?;
    if let TaskSource::Arithmetic {
        problems,
        seed: task_seed,
        ..
    } = &mut source.tasks
    {
        *problems = p.prompts;
        *task_seed = seed + 2;
    }
    let started = Instant::now();
    let settings = RejectionSettings {
        samples_per_prompt: p.samples,
        keep_per_prompt: p.samples,
        temperature: p.temperature,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: recipe.eval_max_new_tokens,
        seed,
        keep_truncated: false,
        verify: true,
    };
    let result = sample(&source, &settings, true)?;
    let sampling_seconds = started.elapsed().as_secs_f64();
    let report_path = dir.join("rejection.json");
    std::fs::write(&report_path, serde_json::to_string_pretty(&result.report)?)
        .with_context(|| format!("writing {}", report_path.display()))?;
    if result.pairs.is_empty() {
        bail!(
            "the SFT model's samples gave no preference pair ({}): every question was answered \
             all right or all wrong",
            result.report.summary()
        );
    }
    let pairs_file = dir.join("pairs.jsonl");
    write_pairs_jsonl(&pairs_file, &result.pairs)?;
    println!(
        "sampled {} x {} answers in {sampling_seconds:.1} s: {} correct, {} pairs",
        p.prompts,
        p.samples,
        result.report.correct,
        result.pairs.len()
    );

    let mut runs = Vec::new();
    for loss in p.losses {
        let run_dir = dir.join(loss);
        let config = out.join(format!("dpo-{loss}.toml"));
        let text = recipe.dpo_config(loss, sft_model, &pairs_file, &run_dir, &dir, seed)?;
        std::fs::write(&config, &text).with_context(|| format!("writing {}", config.display()))?;
        let file = PreferenceFile::load(&config, &[])
            .with_context(|| format!("config {}", config.display()))?;
        let clock = Instant::now();
        let summary = run_preference(&file, false)?;
        let seconds = clock.elapsed().as_secs_f64();
        let named = |m: Option<Vec<(&'static str, f64)>>| -> Vec<(String, f64)> {
            m.unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k.to_string(), v))
                .collect()
        };
        let curve = read_curve(&summary.metrics_path)?;
        let metric = |m: &[(String, f64)], name: &str| {
            m.iter()
                .find(|(k, _)| k == name)
                .map_or(f64::NAN, |(_, v)| *v)
        };
        let (first, last) = (named(summary.first), named(summary.last));
        println!(
            "{loss}: {} steps in {seconds:.1} s; logps/chosen {:.2} -> {:.2}, logps/rejected \
             {:.2} -> {:.2}, reward accuracy {:.2} -> {:.2}",
            summary.steps,
            metric(&first, "logps/chosen"),
            metric(&last, "logps/chosen"),
            metric(&first, "logps/rejected"),
            metric(&last, "logps/rejected"),
            metric(&first, "rewards/accuracies"),
            metric(&last, "rewards/accuracies"),
        );
        runs.push(PreferenceRun {
            label: loss.to_string(),
            config,
            model_dir: summary.model_dir,
            metrics: summary.metrics_path,
            steps: summary.steps,
            seconds,
            first,
            last,
            curve,
        });
    }
    Ok(PreferenceStageSummary {
        pairs_file,
        prompts: p.prompts,
        samples_per_prompt: p.samples,
        correct: result.report.correct,
        sampled: result.report.samples,
        pairs: result.pairs.len(),
        sampling_seconds,
        runs,
    })
}

/// (step, logps/chosen, logps/rejected, rewards/margins) of every line of a run's metrics.
fn read_curve(path: &Path) -> anyhow::Result<Vec<(u64, f64, f64, f64)>> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut curve = Vec::new();
    for (number, line) in text.lines().enumerate() {
        let value: serde_json::Value = serde_json::from_str(line)
            .with_context(|| format!("{}:{}", path.display(), number + 1))?;
        let get = |key: &str| value[key].as_f64().unwrap_or(f64::NAN);
        curve.push((
            value["step"].as_u64().unwrap_or(number as u64 + 1),
            get("logps/chosen"),
            get("logps/rejected"),
            get("rewards/margins"),
        ));
    }
    Ok(curve)
}
