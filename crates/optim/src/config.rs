//! `OptimizerConfig`: which optimizer a run uses (AdamW or Muon) and its hyperparameters, the
//! value a run's TOML `[optimizer]` table deserializes into and the optimizer-state file records.
//!
//! What it is not: the optimizer (`optimizer.rs` holds the state and applies the updates) nor
//! the per-rule settings themselves (`AdamWConfig` in `adamw.rs`, `MuonConfig` in `muon.rs`).
//! It sits below both `optimizer.rs` and `state.rs`, which each name it.

use serde::{Deserialize, Serialize};

use crate::adamw::AdamWConfig;
use crate::error::OptimError;
use crate::muon::MuonConfig;

/// Which optimizer a run uses (TOML: `kind = "adamw"` or `kind = "muon"` plus the fields).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum OptimizerConfig {
    #[serde(rename = "adamw")]
    AdamW(AdamWConfig),
    Muon(MuonConfig),
}

impl Default for OptimizerConfig {
    /// AdamW with the GPT-3/Llama recipe (see `AdamWConfig::default`).
    fn default() -> Self {
        OptimizerConfig::AdamW(AdamWConfig::default())
    }
}

impl OptimizerConfig {
    pub fn validate(&self) -> Result<(), OptimError> {
        match self {
            OptimizerConfig::AdamW(adamw) => adamw.validate("adamw"),
            OptimizerConfig::Muon(muon) => muon.validate(),
        }
    }

    /// `"adamw"` or `"muon"`, as in the file format.
    pub fn kind_name(&self) -> &'static str {
        match self {
            OptimizerConfig::AdamW(_) => "adamw",
            OptimizerConfig::Muon(_) => "muon",
        }
    }

    /// The AdamW settings used for parameters Muon does not take (all of them under AdamW).
    pub(crate) fn adamw(&self) -> &AdamWConfig {
        match self {
            OptimizerConfig::AdamW(adamw) => adamw,
            OptimizerConfig::Muon(muon) => &muon.adamw,
        }
    }
}
