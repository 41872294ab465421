//! `stoke data ...`.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum DataCommand {
    /// Run the data funnel described by a TOML file.
    Run { config: std::path::PathBuf },
}

pub fn run(_command: DataCommand) -> anyhow::Result<()> {
    anyhow::bail!("`stoke data` is under construction")
}
