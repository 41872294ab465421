//! One module per command group. Each exposes clap argument types and a `run`-style function
//! returning `anyhow::Result<()>`.

pub mod convert;
pub mod data;
pub mod distill;
pub mod dpo;
pub mod env;
pub mod eval;
pub mod eval_report;
pub mod export;
pub mod grpo;
pub mod launch;
pub mod model;
pub mod prm;
pub mod r1;
pub mod reward_server;
pub mod rft;
pub mod rlaif;
pub mod sandbox;
pub mod serve;
pub mod speedrun;
pub mod stage_config;
pub mod tokenizer;
pub mod train;
pub mod verify;
