//! `stoke prm CONFIG.toml [--set key=value]...`: a process reward model (a two-label token
//! classifier) trained on stepwise rows; see `stoke_train::prm::run` for the config format.

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use stoke_train::prm::run::{PrmFile, run_prm_with};
use stoke_train::run::RunOptions;

#[derive(Args)]
pub struct PrmArgs {
    /// The run's TOML config (relative paths inside it are relative to its folder).
    config: PathBuf,
    /// Override a key of the config, e.g. `--set prm.train_on_last_step_only=true` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
    /// Continue from the newest verified checkpoint in the output folder.
    #[arg(long)]
    resume: bool,
}

pub fn run_command(args: PrmArgs) -> anyhow::Result<()> {
    let file = PrmFile::load(&args.config, &args.sets)
        .with_context(|| format!("config {}", args.config.display()))?;
    let summary = run_prm_with(
        &file,
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
        "{} rows; completed: {} steps, {:.2} s/step",
        summary.rows, summary.steps, summary.seconds_per_step
    );
    let show = |label: &str, metrics: &[(&'static str, f64)]| {
        let figures: Vec<String> = metrics
            .iter()
            .map(|(name, value)| format!("{name} {value:.4}"))
            .collect();
        println!("{label}: {}", figures.join(", "));
    };
    if let Some(first) = &summary.first {
        show("first step", first);
    }
    if let Some(last) = &summary.last {
        show("last step", last);
    }
    if let Some(loss) = summary.last_loss {
        println!("final loss {loss:.4}");
    }
    if let Some((rows, figures)) = &summary.eval {
        show(&format!("held-out ({rows} rows)"), figures);
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
