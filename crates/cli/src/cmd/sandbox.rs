//! `stoke sandbox ...`.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum SandboxCommand {
    /// Print the isolation level available on this machine.
    Probe,
}

pub fn run(_command: SandboxCommand) -> anyhow::Result<()> {
    anyhow::bail!("`stoke sandbox` is under construction")
}
