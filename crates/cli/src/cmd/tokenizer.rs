//! `stoke tokenizer ...`.

use clap::Subcommand;

#[derive(Subcommand)]
pub enum TokenizerCommand {
    /// Train a byte-level BPE tokenizer.
    Train,
}

pub fn run(_command: TokenizerCommand) -> anyhow::Result<()> {
    anyhow::bail!("`stoke tokenizer` is under construction")
}
