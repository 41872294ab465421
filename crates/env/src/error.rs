//! Errors of environments, tools and the transcript renderer. Each names what failed: the
//! environment, the message index and role, the template behaviour that is not supported, or the
//! MCP server.

use thiserror::Error;

#[derive(Debug, Error, Clone, PartialEq)]
pub enum EnvError {
    /// The environment refused or failed a call (its own message).
    #[error("environment {env}: {message}")]
    Failed { env: String, message: String },
    /// An environment call panicked; the panic message is kept.
    #[error("environment {env} panicked: {message}")]
    Panicked { env: String, message: String },
    /// An environment call did not return within its timeout.
    #[error("environment {env} did not answer within {seconds} s")]
    TimedOut { env: String, seconds: f64 },
    /// The chat template could not render the conversation; names the message.
    #[error("messages[{index}] (role {role}): {message}")]
    Render {
        index: usize,
        role: String,
        message: String,
    },
    /// The template does something token-exact multi-turn cannot follow (named).
    #[error(
        "chat template {template}: {behaviour} is not supported in multi-turn episodes: {detail}"
    )]
    UnsupportedTemplate {
        template: String,
        behaviour: &'static str,
        detail: String,
    },
    /// Tokenizing or detokenizing failed.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
    /// An MCP server could not be started, reached, initialized or listed; names the server (its
    /// command line or URL).
    #[error("MCP server {server}: {message}")]
    Mcp { server: String, message: String },
    /// A configuration value is invalid; names the key.
    #[error("{key}: {message}")]
    Config { key: String, message: String },
}

impl EnvError {
    pub fn failed(env: &str, message: impl Into<String>) -> EnvError {
        EnvError::Failed {
            env: env.to_string(),
            message: message.into(),
        }
    }

    pub fn config(key: &str, message: impl Into<String>) -> EnvError {
        EnvError::Config {
            key: key.to_string(),
            message: message.into(),
        }
    }
}
