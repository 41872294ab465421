//! `stoke score`, `stoke generate`, `stoke inspect`.

use clap::Args;

#[derive(Args)]
pub struct ScoreArgs {}
#[derive(Args)]
pub struct GenerateArgs {}
#[derive(Args)]
pub struct InspectArgs {}

pub fn score(_args: ScoreArgs) -> anyhow::Result<()> {
    anyhow::bail!("`stoke score` is under construction")
}
pub fn generate(_args: GenerateArgs) -> anyhow::Result<()> {
    anyhow::bail!("`stoke generate` is under construction")
}
pub fn inspect(_args: InspectArgs) -> anyhow::Result<()> {
    anyhow::bail!("`stoke inspect` is under construction")
}
