//! `ConfigError`: why a reward configuration was rejected (a field that failed validation, a
//! code reward without a sandbox, an unknown kind name).
//!
//! What this is not: the validation itself, which each reward kind's `new` does on its own
//! options (and `config.rs` for the set). It sits below every reward kind, which all return it.

use crate::kind::RewardKind;

/// A configuration field that failed validation.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ConfigError {
    #[error("reward config field `{field}`: {message}")]
    Invalid { field: String, message: String },
    #[error("reward kind `{0}` runs code and needs a sandbox")]
    NeedsSandbox(&'static str),
    #[error(
        "reward kind `{0}` runs a learned model: it is built by `stoke grpo` (which loads the \
         model), not here"
    )]
    NeedsScorer(&'static str),
    #[error("unknown reward kind `{0}` (known: {known})", known = RewardKind::names().join(", "))]
    UnknownKind(String),
}

impl ConfigError {
    pub fn invalid(field: impl Into<String>, message: impl Into<String>) -> Self {
        ConfigError::Invalid {
            field: field.into(),
            message: message.into(),
        }
    }
}
