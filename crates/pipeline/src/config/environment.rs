//! `[environment]`: the environment a multi-turn GRPO run plays its episodes in, its tools'
//! call format and its limits; the file layer and its resolution into [`EnvironmentSettings`].
//!
//! ```toml
//! [environment]
//! kind = "calculator"            # built-in environments: "calculator", "guess_number"
//! tool_call_parser = "auto"      # "auto" (from the chat template, else hermes) or a parser name
//! tools_in = "auto"              # "template" (the template's `tools` variable), "system"
//!                                # (described in the system prompt), "auto": template when it
//!                                # renders tools
//! max_turns = 4                  # model turns per episode
//! max_turn_tokens = 256          # default: grpo.max_new_tokens
//! max_total_tokens = 2048        # ids after the prompt, model and environment; default:
//!                                # 2 * max_turns * max_turn_tokens (as much room for the
//!                                # environment's ids as for the model's)
//! truncated_turns = "end"        # a turn cut at max_turn_tokens ends the episode ("end"), or
//!                                # is closed with the template's end-of-turn token, masked,
//!                                # and the conversation goes on ("close")
//! env_timeout_s = 60             # one environment call (start, step, finish)
//! tool_timeout_s = 30            # one tool call (above the sandbox's own wall time)
//! max_tool_calls_per_turn = 4
//! max_tool_output_bytes = 2048   # longer tool output is cut in the middle
//! ```
//!
//! What it is not: the environment itself (`stoke_env`; built by `episode::build_environment`)
//! or the tasks (`[tasks]`, e.g. `kind = "calculator"`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use stoke_env::ToolLimits;
use stoke_tokenizer::tool_calls::ToolCallParser;

use crate::episode::EpisodeLimits;
use crate::error::PipelineError;

/// The built-in environments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentKind {
    /// Arithmetic with an exact calculator tool (`stoke_env::arithmetic`).
    Calculator,
    /// Guess a number from 1 to 100 with higher/lower feedback (`stoke_env::guess`).
    GuessNumber,
}

impl EnvironmentKind {
    pub fn name(self) -> &'static str {
        match self {
            EnvironmentKind::Calculator => "calculator",
            EnvironmentKind::GuessNumber => "guess_number",
        }
    }
}

/// Where the offered tools are shown to the model.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ToolsIn {
    /// The template's `tools` variable when the template renders it, else the system prompt.
    #[default]
    Auto,
    Template,
    System,
}

/// `[environment]` as written.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EnvironmentSection {
    pub kind: EnvironmentKind,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_call_parser: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools_in: Option<ToolsIn>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turns: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_turn_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_total_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub truncated_turns: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub env_timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tool_timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_calls_per_turn: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_tool_output_bytes: Option<usize>,
}

/// The tool-call parser choice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum ParserChoice {
    /// Detected from the chat template; Hermes when the template names no format.
    Auto,
    Named(ToolCallParser),
}

impl ParserChoice {
    /// The parser for a template with source `template_source`.
    pub fn resolve(self, template_source: &str) -> ToolCallParser {
        match self {
            ParserChoice::Named(parser) => parser,
            ParserChoice::Auto => {
                ToolCallParser::detect(template_source).unwrap_or(ToolCallParser::Hermes)
            }
        }
    }

    fn name(self) -> String {
        match self {
            ParserChoice::Auto => "auto".into(),
            ParserChoice::Named(parser) => parser.name().into(),
        }
    }
}

/// The resolved `[environment]`.
#[derive(Clone, Debug, PartialEq)]
pub struct EnvironmentSettings {
    pub kind: EnvironmentKind,
    pub parser: ParserChoice,
    pub tools_in: ToolsIn,
    pub limits: EpisodeLimits,
    pub tools: ToolLimits,
}

pub const DEFAULT_MAX_TURNS: usize = 4;
const DEFAULT_ENV_TIMEOUT_S: f64 = 60.0;

impl EnvironmentSection {
    /// Defaults filled and every value checked; errors name `environment.KEY`.
    /// `max_new_tokens` is `grpo.max_new_tokens`, the default per-turn budget.
    pub fn resolve(&self, max_new_tokens: usize) -> Result<EnvironmentSettings, PipelineError> {
        let key = |name: &str| format!("environment.{name}");
        let parser = match self.tool_call_parser.as_deref() {
            None | Some("auto") => ParserChoice::Auto,
            Some(name) => ParserChoice::Named(ToolCallParser::from_name(name).map_err(|e| {
                PipelineError::config(key("tool_call_parser"), format!("{e}, or auto"))
            })?),
        };
        let max_turns = self.max_turns.unwrap_or(DEFAULT_MAX_TURNS);
        let max_turn_tokens = self.max_turn_tokens.unwrap_or(max_new_tokens);
        let max_total_tokens = self
            .max_total_tokens
            .unwrap_or(max_turns.saturating_mul(max_turn_tokens).saturating_mul(2));
        let seconds = |name: &str, value: Option<f64>, default: f64| {
            let value = value.unwrap_or(default);
            if value.is_finite() && value > 0.0 {
                Ok(Duration::from_secs_f64(value))
            } else {
                Err(PipelineError::config(
                    key(name),
                    format!("must be a positive number of seconds, got {value}"),
                ))
            }
        };
        let close_truncated_turns = match self.truncated_turns.as_deref() {
            None | Some("end") => false,
            Some("close") => true,
            Some(other) => {
                return Err(PipelineError::config(
                    key("truncated_turns"),
                    format!("must be \"end\" or \"close\", got {other:?}"),
                ));
            }
        };
        let defaults = ToolLimits::default();
        let settings = EnvironmentSettings {
            kind: self.kind,
            parser,
            tools_in: self.tools_in.unwrap_or_default(),
            limits: EpisodeLimits {
                max_turns,
                max_total_tokens,
                max_turn_tokens,
                close_truncated_turns,
                env_timeout: seconds("env_timeout_s", self.env_timeout_s, DEFAULT_ENV_TIMEOUT_S)?,
            },
            tools: ToolLimits {
                max_calls_per_turn: self
                    .max_tool_calls_per_turn
                    .unwrap_or(defaults.max_calls_per_turn),
                max_output_bytes: self
                    .max_tool_output_bytes
                    .unwrap_or(defaults.max_output_bytes),
                timeout: seconds(
                    "tool_timeout_s",
                    self.tool_timeout_s,
                    defaults.timeout.as_secs_f64(),
                )?,
            },
        };
        settings.limits.validate().map_err(|e| match e {
            PipelineError::Config { field, reason } => PipelineError::config(key(&field), reason),
            other => other,
        })?;
        for (name, value) in [
            ("max_tool_calls_per_turn", settings.tools.max_calls_per_turn),
            ("max_tool_output_bytes", settings.tools.max_output_bytes),
        ] {
            if value == 0 {
                return Err(PipelineError::config(key(name), "must be at least 1"));
            }
        }
        Ok(settings)
    }
}

impl EnvironmentSettings {
    /// The file form with every value explicit.
    pub fn to_file(&self) -> EnvironmentSection {
        EnvironmentSection {
            kind: self.kind,
            tool_call_parser: Some(self.parser.name()),
            tools_in: Some(self.tools_in),
            max_turns: Some(self.limits.max_turns),
            max_turn_tokens: Some(self.limits.max_turn_tokens),
            max_total_tokens: Some(self.limits.max_total_tokens),
            truncated_turns: Some(
                if self.limits.close_truncated_turns {
                    "close"
                } else {
                    "end"
                }
                .to_string(),
            ),
            env_timeout_s: Some(self.limits.env_timeout.as_secs_f64()),
            tool_timeout_s: Some(self.tools.timeout.as_secs_f64()),
            max_tool_calls_per_turn: Some(self.tools.max_calls_per_turn),
            max_tool_output_bytes: Some(self.tools.max_output_bytes),
        }
    }
}
