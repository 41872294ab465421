//! `stoke train CONFIG.toml [--set key=value]... [--resume]`: one training run (pretraining or
//! SFT) described by a TOML file; see `stoke_train::config` for the format.
//!
//! The command only turns files and flags into a validated `TrainConfig` and `RunOptions`; the
//! run itself is `stoke_train::run::run`. `--set` edits the parsed file before validation, so an
//! override is checked like a key in the file (an unknown key is named in the error).

use std::path::PathBuf;

use anyhow::Context;
use clap::Args;
use stoke_train::config::TrainConfig;
use stoke_train::run::{RunOptions, run};
use stoke_train::trainer::StopReason;

#[derive(Args)]
pub struct TrainArgs {
    /// The run's TOML config (relative paths inside it are relative to its folder).
    config: PathBuf,
    /// Override a key of the config, e.g. `--set training.steps=200` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Continue from the newest verified checkpoint in the run folder.
    #[arg(long)]
    resume: bool,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

pub fn run_command(args: TrainArgs) -> anyhow::Result<()> {
    let config = TrainConfig::load(&args.config, &args.sets)
        .with_context(|| format!("config {}", args.config.display()))?;
    let options = RunOptions {
        resume: args.resume,
        quiet: args.quiet,
        ..RunOptions::default()
    };
    let summary = run(config, options)?;
    if let Some(from) = &summary.resumed_from {
        println!("resumed from {}", from.display());
    }
    let stop = match summary.stop {
        StopReason::Completed => "completed",
        StopReason::DataExhausted => "stopped: training data exhausted",
    };
    println!(
        "{stop}: {} steps, {} tokens, {:.0} tokens/s, {:.1} s",
        summary.steps, summary.tokens_seen, summary.tokens_per_s, summary.elapsed_s
    );
    if let Some(loss) = summary.final_loss {
        println!("final training loss {loss:.4}");
    }
    if let Some(eval) = &summary.final_eval {
        match eval.bits_per_byte {
            Some(bpb) => println!("eval loss {:.4}, {bpb:.4} bits/byte", eval.loss),
            None => println!("eval loss {:.4}", eval.loss),
        }
    }
    if summary.skipped_steps > 0 {
        println!(
            "skipped steps: {} ({} loss spikes)",
            summary.skipped_steps, summary.spikes
        );
    }
    println!("model: {}", summary.model_dir.display());
    if let Some(report) = &summary.report {
        println!("report: {}", report.display());
    }
    Ok(())
}
