//! Errors that stop a sandbox from being built. A failing *run* is not an error: it is an
//! [`crate::ExecResult`] whose status says what happened (including `SandboxError` for a run the
//! jail could not set up), so a long batch survives one bad program.

use crate::isolation::IsolationLevel;

/// Why a [`crate::Sandbox`] could not be created.
#[derive(Debug, thiserror::Error)]
pub enum SandboxError {
    /// A config value is out of range; the message names the field.
    #[error("sandbox config: {0}")]
    Config(String),
    /// The machine cannot provide the configured minimum isolation level.
    #[error(
        "sandbox: isolation level `{required}` required but only `{available}` is available here \
         (missing: {missing}); run `stoke sandbox probe` for details or lower `min_isolation`"
    )]
    InsufficientIsolation {
        required: &'static str,
        available: &'static str,
        missing: String,
    },
    /// Setting up shared state (seccomp filters, the runtime) failed.
    #[error("sandbox setup: {0}")]
    Setup(String),
}

impl SandboxError {
    pub(crate) fn insufficient(
        required: IsolationLevel,
        available: IsolationLevel,
        missing: Vec<&'static str>,
    ) -> SandboxError {
        SandboxError::InsufficientIsolation {
            required: required.name(),
            available: available.name(),
            missing: if missing.is_empty() {
                "none".to_string()
            } else {
                missing.join(", ")
            },
        }
    }
}
