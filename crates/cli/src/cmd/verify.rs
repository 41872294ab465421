//! `stoke verify`.

use clap::Args;

#[derive(Args)]
pub struct VerifyArgs {}

pub fn run(_args: VerifyArgs) -> anyhow::Result<()> {
    anyhow::bail!("`stoke verify` is under construction")
}
