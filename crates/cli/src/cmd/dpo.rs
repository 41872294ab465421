//! `stoke dpo CONFIG.toml [--set key=value]...`: preference optimization on pairs (the DPO
//! family, CPO/SimPO, ORPO), and `stoke rm CONFIG.toml`, a Bradley-Terry reward model on the
//! same pairs and config; see `stoke_train::preference::run` for the config format.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use stoke_train::preference::run::{PreferenceFile, run_preference_with};
use stoke_train::run::RunOptions;

#[derive(Args)]
pub struct DpoArgs {
    /// The run's TOML config (relative paths inside it are relative to its folder).
    config: PathBuf,
    /// Override a key of the config, e.g. `--set dpo.beta=0.05` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// Continue from the newest verified checkpoint in the output folder.
    #[arg(long)]
    resume: bool,
}

pub fn run_command(args: DpoArgs) -> anyhow::Result<()> {
    let file = PreferenceFile::load(&args.config, &args.sets)
        .with_context(|| format!("config {}", args.config.display()))?;
    run_file(&file, &args)
}

/// `stoke rm CONFIG.toml`: a Bradley-Terry reward model on the pairs, the `stoke dpo` run with
/// `objective.kind = "reward_model"` (the default here; another kind in the file is refused).
pub fn run_reward_model(args: DpoArgs) -> anyhow::Result<()> {
    let table = stoke_train::config::keys::read_table(&args.config)
        .with_context(|| format!("config {}", args.config.display()))?;
    let kind = table
        .get("objective")
        .and_then(|o| o.get("kind"))
        .and_then(|k| k.as_str());
    if let Some(kind) = kind.filter(|k| *k != "reward_model") {
        anyhow::bail!(
            "config {}: objective.kind = \"{kind}\": stoke rm trains reward models (leave \
             objective.kind out, or run stoke dpo)",
            args.config.display()
        );
    }
    let mut sets = vec!["objective.kind=\"reward_model\"".to_string()];
    sets.extend(args.sets.iter().cloned());
    let file = PreferenceFile::load(&args.config, &sets)
        .with_context(|| format!("config {}", args.config.display()))?;
    run_file(&file, &args)
}

fn run_file(file: &PreferenceFile, args: &DpoArgs) -> anyhow::Result<()> {
    let summary = run_preference_with(
        file,
        &RunOptions {
            resume: args.resume,
            quiet: args.quiet,
            ..RunOptions::default()
        },
    )?;
    if let Some(from) = &summary.resumed_from {
        println!("resumed from {}", from.display());
    }
    println!(
        "{} pairs ({} lines skipped, {} responses cut to max_len); reference: {}",
        summary.pairs,
        summary.read.skipped.len(),
        summary.read.truncated,
        summary.reference
    );
    println!(
        "completed: {} steps, {:.2} s/step, {:.0} tokens/s, micro-batches in {} shard{}",
        summary.steps,
        summary.seconds_per_step,
        summary.tokens_per_s,
        summary.shards,
        if summary.shards == 1 { "" } else { "s" }
    );
    let show = |label: &str, metrics: &Option<Vec<(&'static str, f64)>>| {
        if let Some(metrics) = metrics {
            let figures: Vec<String> = metrics
                .iter()
                .map(|(name, value)| format!("{name} {value:.4}"))
                .collect();
            println!("{label}: {}", figures.join(", "));
        }
    };
    show("first step", &summary.first);
    show("last step", &summary.last);
    if let Some(loss) = summary.last_loss {
        println!("final loss {loss:.4}");
    }
    if let Some((pairs, figures)) = &summary.eval {
        show(&format!("held-out ({pairs} pairs)"), &Some(figures.clone()));
    }
    if summary.skipped_steps > 0 {
        println!("skipped steps: {}", summary.skipped_steps);
    }
    println!("checkpoint: {}", summary.last_checkpoint.display());
    println!("metrics: {}", summary.metrics_path.display());
    println!("report: {}", summary.report_path.display());
    println!("model: {}", summary.model_dir.display());
    Ok(())
}
