//! `stoke reward-server CONFIG.toml [--host H] [--port P] [--set key=value]...`: the run's
//! rewards (the `[rewards]` tables of a GRPO config, with `grpo.reward_workers` and
//! `grpo.reward_timeout_s`) served over HTTP, so untrusted code runs on a machine of its own.
//! A GRPO run points `[reward] kind = "remote"` at one or more of these. The exchange is
//! documented in `stoke_pipeline::remote::reward`.
//!
//! It prints the sandbox's isolation level on this machine at start (and `/info` reports it), so
//! whoever runs untrusted code knows how it is confined.

use std::path::PathBuf;

use anyhow::{Context, anyhow};
use clap::Args;
use stoke_pipeline::config::GrpoConfig;
use stoke_pipeline::remote::{RewardServerConfig, RunningRewardServer};

#[derive(Args)]
pub struct RewardServerArgs {
    /// A GRPO config; its `[rewards]` (and `grpo.reward_workers`, `grpo.reward_timeout_s`) are
    /// served.
    config: PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    /// 0 picks a free port (printed at start).
    #[arg(long, default_value_t = 8100)]
    port: u16,
    /// Override a key of the config, e.g. `--set grpo.reward_workers=8` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
}

pub fn run(args: RewardServerArgs) -> anyhow::Result<()> {
    let config = GrpoConfig::load(&args.config, &args.sets)
        .with_context(|| format!("config {}", args.config.display()))?;
    let rewards = super::grpo::build_rewards(&config)?;
    let names: Vec<String> = rewards.iter().map(|r| r.name.clone()).collect();
    let isolation = stoke_sandbox::probe().level.name().to_string();
    let server = RunningRewardServer::start(
        RewardServerConfig {
            host: args.host,
            port: args.port,
            rewards,
            workers: config.settings.reward_workers,
            timeout: config.settings.reward_timeout,
            isolation: isolation.clone(),
        },
        true,
    )
    .map_err(|e| anyhow!("stoke reward-server: {e}"))?;
    eprintln!(
        "stoke reward-server: rewards {} at {} (sandbox isolation: {isolation}); Ctrl-C stops",
        names.join(", "),
        server.url()
    );
    server.wait();
    eprintln!("stoke reward-server: stopped");
    Ok(())
}
