//! `stoke r1 CONFIG.toml [--set key=value]... [--quiet]`: the DeepSeek-R1 training order from
//! one config: cold-start SFT -> reasoning RL (GRPO) -> rejection-sampling SFT -> final RL.
//!
//! ```toml
//! [model]
//! path = "../runs/speedrun-quick/pretrain/model"  # the start (default model of the cold start)
//! [out]
//! dir = "../runs/r1"         # default runs/<config stem> next to the file
//! [cold_start]               # a `stoke train` SFT config (or: cold_start = "sft.toml")
//! [reasoning_rl]             # a `stoke grpo` config
//! [rejection]                # a `stoke rft` config (with its own [rejection.sft])
//! [final_rl]                 # a `stoke grpo` config
//! ```
//!
//! Each stage table is the config of its command, written inline or as a path to its own file
//! (see `stage_config` for the keys the recipe owns). A stage's model defaults to the previous
//! stage's output model (the cold start's: `[model] path`); a stage left out is not run and
//! passes its input model on. Stage folders: `OUT/1-cold-start`, `OUT/2-reasoning-rl`,
//! `OUT/3-rejection-sft` (an rft folder: `rft.jsonl`, `sft/model`), `OUT/4-final-rl`; the final
//! model is the last stage's. A stage whose output model already exists is skipped, so a stopped
//! run continues from the stage it was in (the SFT and RL stages themselves continue from their
//! newest checkpoint). `OUT/r1.json` records every stage: status, wall time, the output model, and
//! for RL stages held-out pass@1 before and after.
//!
//! Every stage's config is checked before the first stage runs (unknown keys, bad values), so a
//! typo in the last stage does not surface hours in; only what needs a model folder that an
//! earlier stage makes (the SFT's derived defaults) is resolved when its stage starts.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use stoke_pipeline::config::{GrpoConfig, GrpoConfigFile, OutSection, resume_differences};
use stoke_pipeline::metrics::{GrpoMetricsLog, GrpoRecord};
use stoke_pipeline::rejection::RejectionReport;
use stoke_pipeline::run::RunOptions as GrpoRunOptions;
use stoke_train::config::{ConfigFile, apply_overrides, keys};
use stoke_train::run::RunOptions as TrainRunOptions;

use super::grpo::run_config;
use super::rft::{RftPlan, train_config};
use super::stage_config::{StageEntry, StageTable, path_value};

#[derive(Args)]
pub struct R1Args {
    /// The recipe's TOML config (relative paths inside it are relative to its folder).
    config: PathBuf,
    /// Override a key of the config, e.g. `--set reasoning_rl.training.steps=5` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// No progress output (stage headers and the summary are still printed).
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct R1ConfigFile {
    #[serde(default)]
    model: Option<StartModel>,
    #[serde(default)]
    out: OutSection,
    #[serde(default)]
    cold_start: Option<StageEntry>,
    #[serde(default)]
    reasoning_rl: Option<StageEntry>,
    #[serde(default)]
    rejection: Option<StageEntry>,
    #[serde(default)]
    final_rl: Option<StageEntry>,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct StartModel {
    path: PathBuf,
}

/// The four stages, in order.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Stage {
    ColdStart,
    ReasoningRl,
    Rejection,
    FinalRl,
}

impl Stage {
    const ALL: [Stage; 4] = [
        Stage::ColdStart,
        Stage::ReasoningRl,
        Stage::Rejection,
        Stage::FinalRl,
    ];

    fn key(self) -> &'static str {
        match self {
            Stage::ColdStart => "cold_start",
            Stage::ReasoningRl => "reasoning_rl",
            Stage::Rejection => "rejection",
            Stage::FinalRl => "final_rl",
        }
    }

    fn folder(self) -> &'static str {
        match self {
            Stage::ColdStart => "1-cold-start",
            Stage::ReasoningRl => "2-reasoning-rl",
            Stage::Rejection => "3-rejection-sft",
            Stage::FinalRl => "4-final-rl",
        }
    }

    fn title(self) -> &'static str {
        match self {
            Stage::ColdStart => "cold-start SFT",
            Stage::ReasoningRl => "reasoning RL (GRPO)",
            Stage::Rejection => "rejection sampling + SFT",
            Stage::FinalRl => "final RL (GRPO)",
        }
    }

    /// Where the stage's finished model is.
    fn output_model(self, stage_dir: &Path) -> PathBuf {
        match self {
            Stage::Rejection => RftPlan::output_model(stage_dir),
            _ => stage_dir.join("model"),
        }
    }
}

/// A stage, checked and ready to run.
enum StagePlan {
    Sft(StageTable),
    Grpo(Box<GrpoConfig>),
    Rft(Box<RftPlan>),
}

/// One stage's line of `OUT/r1.json`.
#[derive(Clone, Debug, Serialize)]
struct StageRecord {
    stage: &'static str,
    /// "ran", "skipped" (its model existed), or "not configured".
    status: &'static str,
    seconds: f64,
    model: Option<PathBuf>,
    /// RL stages: held-out greedy pass@1 before and after (from the run, or from its
    /// metrics.jsonl when the stage was skipped).
    greedy_pass_at_1_before: Option<f64>,
    greedy_pass_at_1_after: Option<f64>,
    /// Rejection stage: kept completions and their share of the samples.
    kept: Option<usize>,
    acceptance_rate: Option<f64>,
}

/// A recipe, every stage checked; nothing run yet.
struct R1Plan {
    out: PathBuf,
    /// The four stages in order; `None` where the config leaves a stage out.
    stages: Vec<(Stage, Option<StagePlan>)>,
}

/// Reads the recipe, applies `--set` and checks every stage (see the module doc).
fn plan(config: &Path, sets: &[String]) -> anyhow::Result<R1Plan> {
    let text =
        std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("config {}", config.display()))?;
    apply_overrides(&mut table, sets)?;
    let file: R1ConfigFile = toml::Value::Table(table)
        .try_into()
        .with_context(|| format!("config {}", config.display()))?;
    let base = config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let base = std::path::absolute(base)?;
    let stem = config
        .file_stem()
        .map_or_else(|| "r1".to_string(), |s| s.to_string_lossy().into_owned());
    let out = base.join(
        file.out
            .dir
            .clone()
            .unwrap_or_else(|| Path::new("runs").join(&stem)),
    );

    let mut previous_model = file.model.as_ref().map(|m| base.join(&m.path));
    let mut stages = Vec::new();
    for stage in Stage::ALL {
        let entry = match stage {
            Stage::ColdStart => file.cold_start.clone(),
            Stage::ReasoningRl => file.reasoning_rl.clone(),
            Stage::Rejection => file.rejection.clone(),
            Stage::FinalRl => file.final_rl.clone(),
        };
        let Some(entry) = entry else {
            stages.push((stage, None));
            continue;
        };
        let dir = out.join(stage.folder());
        let table = StageTable::load(entry, stage.key(), config, &base)?;
        let plan = plan_stage(stage, table, &dir, previous_model.as_deref())?;
        previous_model = Some(stage.output_model(&dir));
        stages.push((stage, Some(plan)));
    }
    if stages.iter().all(|(_, plan)| plan.is_none()) {
        bail!(
            "{}: no stage configured (set any of [cold_start], [reasoning_rl], [rejection], [final_rl])",
            config.display()
        );
    }
    Ok(R1Plan { out, stages })
}

pub fn run_command(args: R1Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let R1Plan { out, stages: plans } = plan(&args.config, &args.sets)?;
    std::fs::create_dir_all(&out).with_context(|| format!("creating {}", out.display()))?;

    let mut records = Vec::new();
    let mut final_model = None;
    for (number, (stage, plan)) in plans.into_iter().enumerate() {
        println!(
            "== stage {}/4: {} ({})",
            number + 1,
            stage.title(),
            stage.key()
        );
        let dir = out.join(stage.folder());
        let Some(plan) = plan else {
            println!("not configured; the model passes on unchanged");
            records.push(StageRecord::empty(stage, "not configured"));
            continue;
        };
        let model = stage.output_model(&dir);
        final_model = Some(model.clone());
        if model.join("config.json").is_file() {
            println!(
                "skipped: {} exists (remove {} to run the stage again)",
                model.display(),
                dir.display()
            );
            let mut record = StageRecord::empty(stage, "skipped");
            record.model = Some(model);
            if matches!(plan, StagePlan::Grpo(_)) {
                let (before, after) = evals_from_metrics(&dir.join("metrics.jsonl"));
                record.greedy_pass_at_1_before = before;
                record.greedy_pass_at_1_after = after;
            }
            if matches!(plan, StagePlan::Rft(_))
                && let Some(report) = rejection_report(&dir.join("rejection.json"))
            {
                record.kept = Some(report.kept);
                record.acceptance_rate = Some(report.acceptance_rate());
            }
            records.push(record);
            continue;
        }
        let stage_started = Instant::now();
        let mut record = StageRecord::empty(stage, "ran");
        match plan {
            StagePlan::Sft(table) => {
                let config = train_config(&table)?;
                let summary = stoke_train::run::run(
                    config,
                    TrainRunOptions {
                        resume: true,
                        quiet: args.quiet,
                        ..TrainRunOptions::default()
                    },
                )
                .with_context(|| format!("stage {}", stage.key()))?;
                if let Some(loss) = summary.final_loss {
                    println!("{} steps, final training loss {loss:.4}", summary.steps);
                }
            }
            StagePlan::Grpo(config) => {
                let (before, after) = run_grpo_stage(&config, args.quiet)
                    .with_context(|| format!("stage {}", stage.key()))?;
                record.greedy_pass_at_1_before = before;
                record.greedy_pass_at_1_after = after;
            }
            StagePlan::Rft(plan) => {
                let summary = super::rft::run(&plan, args.quiet)
                    .with_context(|| format!("stage {}", stage.key()))?;
                println!("rejection sampling: {}", summary.report.summary());
                if let Some(loss) = summary.sft.final_loss {
                    println!(
                        "sft: {} steps, final training loss {loss:.4}",
                        summary.sft.steps
                    );
                }
                record.kept = Some(summary.report.kept);
                record.acceptance_rate = Some(summary.report.acceptance_rate());
            }
        }
        record.seconds = stage_started.elapsed().as_secs_f64();
        record.model = Some(model.clone());
        println!("model: {} ({:.1} s)", model.display(), record.seconds);
        records.push(record);
    }

    println!("== summary");
    for record in &records {
        println!("{}", record.line());
    }
    let summary_path = out.join("r1.json");
    let summary = serde_json::json!({
        "stages": records,
        "final_model": final_model,
        "seconds": started.elapsed().as_secs_f64(),
    });
    std::fs::write(&summary_path, serde_json::to_string_pretty(&summary)?)
        .with_context(|| format!("writing {}", summary_path.display()))?;
    if let Some(model) = final_model {
        println!("final model: {}", model.display());
    }
    println!("summary: {}", summary_path.display());
    Ok(())
}

/// Sets the recipe's keys of one stage and checks its config (see the module doc).
fn plan_stage(
    stage: Stage,
    mut table: StageTable,
    dir: &Path,
    previous_model: Option<&Path>,
) -> anyhow::Result<StagePlan> {
    match stage {
        Stage::ColdStart => {
            keys::migrate_renamed_with_warnings(
                &mut table.table,
                stoke_train::config::RENAMED,
                &table.origin,
            )?;
            table.set_owned("output_dir", path_value(dir), "the stage folder")?;
            if !table.has_any(&["model.preset", "model.config", "model.path"]) {
                let Some(model) = previous_model else {
                    bail!(
                        "{}: no model: set `model.path` here or `[model] path` in the recipe",
                        table.origin
                    );
                };
                table.set_default("model.path", path_value(model))?;
            }
            ConfigFile::from_table(table.table.clone(), &table.origin)?;
            Ok(StagePlan::Sft(table))
        }
        Stage::ReasoningRl | Stage::FinalRl => {
            keys::migrate_renamed_with_warnings(
                &mut table.table,
                stoke_pipeline::config::RENAMED,
                &table.origin,
            )?;
            table.set_owned("output_dir", path_value(dir), "the stage folder")?;
            if let Some(model) = previous_model {
                table.set_default("model.path", path_value(model))?;
            }
            let file = GrpoConfigFile::from_table(table.table.clone(), &table.origin)?;
            let config = GrpoConfig::from_file(file, &table.base, stage.key())
                .with_context(|| table.origin.clone())?;
            Ok(StagePlan::Grpo(Box::new(config)))
        }
        Stage::Rejection => {
            table.set_owned("out.dir", path_value(dir), "the stage folder")?;
            if let Some(model) = previous_model {
                table.set_default("model.path", path_value(model))?;
            }
            Ok(StagePlan::Rft(Box::new(RftPlan::from_stage(
                table,
                stage.key(),
            )?)))
        }
    }
}

/// Runs one GRPO stage, continuing from its newest checkpoint when a stopped run left one (and
/// the config is unchanged); returns held-out greedy pass@1 before and after.
fn run_grpo_stage(config: &GrpoConfig, quiet: bool) -> anyhow::Result<(Option<f64>, Option<f64>)> {
    let checkpoints = config.out_dir.join("checkpoints");
    let resume = std::fs::read_dir(&checkpoints).is_ok_and(|mut d| d.next().is_some());
    if resume {
        let saved_path = config.out_dir.join("config.toml");
        if saved_path.is_file() {
            let saved = GrpoConfig::load(&saved_path, &[])
                .with_context(|| format!("reading {}", saved_path.display()))?;
            let differences = resume_differences(&saved, config);
            if let Some((key, was, now)) = differences.first() {
                bail!(
                    "{} holds a stopped run of another config ({key}: {was} -> {now}); remove the \
                     folder to start the stage again",
                    config.out_dir.display()
                );
            }
        }
    }
    let summary = run_config(config, GrpoRunOptions { resume, quiet })?;
    println!(
        "{} updates, {:.2} s per update",
        summary.steps, summary.seconds_per_step
    );
    Ok((
        summary.initial_eval.map(|e| e.greedy_pass_at_1),
        summary.final_eval.map(|e| e.greedy_pass_at_1),
    ))
}

/// The first and last held-out greedy pass@1 of a finished GRPO run's metrics (None when the
/// file is missing or holds no evaluation).
fn evals_from_metrics(path: &Path) -> (Option<f64>, Option<f64>) {
    let Ok(records) = GrpoMetricsLog::read_all(path) else {
        return (None, None);
    };
    let evals: Vec<f64> = records
        .iter()
        .filter_map(|r| match r {
            GrpoRecord::Eval(eval) => Some(eval.greedy_pass_at_1),
            _ => None,
        })
        .collect();
    (evals.first().copied(), evals.last().copied())
}

/// The counts a finished rejection stage wrote (None when missing or unreadable).
fn rejection_report(path: &Path) -> Option<RejectionReport> {
    serde_json::from_str(&std::fs::read_to_string(path).ok()?).ok()
}

impl StageRecord {
    fn empty(stage: Stage, status: &'static str) -> StageRecord {
        StageRecord {
            stage: stage.key(),
            status,
            seconds: 0.0,
            model: None,
            greedy_pass_at_1_before: None,
            greedy_pass_at_1_after: None,
            kept: None,
            acceptance_rate: None,
        }
    }

    /// One line of the printed summary.
    fn line(&self) -> String {
        let mut line = format!("{:<13} {:<15}", self.stage, self.status);
        if self.status == "ran" {
            line.push_str(&format!(" {:>8.1} s", self.seconds));
        }
        if let (Some(before), Some(after)) =
            (self.greedy_pass_at_1_before, self.greedy_pass_at_1_after)
        {
            line.push_str(&format!(
                "  held-out greedy pass@1 {:.1}% -> {:.1}%",
                100.0 * before,
                100.0 * after
            ));
        }
        if let (Some(kept), Some(rate)) = (self.kept, self.acceptance_rate) {
            line.push_str(&format!(
                "  kept {kept} completions ({:.1}% of samples)",
                100.0 * rate
            ));
        }
        line
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shipped_config() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/r1-tiny.toml")
    }

    #[test]
    fn the_shipped_config_plans_four_chained_stages() {
        let plan = plan(&shipped_config(), &[]).unwrap();
        assert!(plan.out.ends_with("runs/r1-tiny"));
        let stages: Vec<Stage> = plan.stages.iter().map(|(s, _)| *s).collect();
        assert_eq!(stages, Stage::ALL);
        let Some(StagePlan::Grpo(reasoning)) = &plan.stages[1].1 else {
            panic!("stage 2 is GRPO");
        };
        assert!(reasoning.model.ends_with("runs/r1-tiny/1-cold-start/model"));
        assert!(reasoning.out_dir.ends_with("runs/r1-tiny/2-reasoning-rl"));
        let Some(StagePlan::Rft(rejection)) = &plan.stages[2].1 else {
            panic!("stage 3 is rejection sampling");
        };
        assert!(rejection.source.model.ends_with("2-reasoning-rl/model"));
        let Some(StagePlan::Grpo(final_rl)) = &plan.stages[3].1 else {
            panic!("stage 4 is GRPO");
        };
        assert!(final_rl.model.ends_with("3-rejection-sft/sft/model"));
    }

    #[test]
    fn set_reaches_a_stage_and_a_typo_is_named() {
        let sets = ["final_rl.training.steps=3".to_string()];
        let plan = plan(&shipped_config(), &sets).unwrap();
        let Some(StagePlan::Grpo(final_rl)) = &plan.stages[3].1 else {
            panic!("stage 4 is GRPO");
        };
        assert_eq!(final_rl.settings.steps, 3);
        let typo = ["rejection.sampling.sample=3".to_string()];
        let error = format!("{:#}", super::plan(&shipped_config(), &typo).err().unwrap());
        assert!(error.contains("sample"), "{error}");
    }

    #[test]
    fn a_stage_may_be_a_path_to_its_own_config() {
        let dir = tempfile::tempdir().unwrap();
        std::fs::write(
            dir.path().join("rl.toml"),
            "[model]\npath = \"m\"\n[grpo]\nsteps = 2\n[out]\ndir = \"elsewhere\"\n",
        )
        .unwrap();
        let recipe = dir.path().join("r1.toml");
        std::fs::write(&recipe, "reasoning_rl = \"rl.toml\"\n").unwrap();
        let plan = plan(&recipe, &[]).unwrap();
        let Some(StagePlan::Grpo(config)) = &plan.stages[1].1 else {
            panic!("stage 2 is GRPO");
        };
        // The file's own model is kept; its output folder is the recipe's.
        assert_eq!(config.model, dir.path().join("m"));
        assert_eq!(config.out_dir, dir.path().join("runs/r1/2-reasoning-rl"));
        assert_eq!(config.settings.steps, 2);
        assert!(plan.stages[0].1.is_none());
    }
}
