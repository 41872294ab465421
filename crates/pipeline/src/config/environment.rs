//! `[environment]`: the environment a multi-turn GRPO run plays its episodes in, its tools'
//! call format and its limits; the file layer and its resolution into [`EnvironmentSettings`].
//!
//! ```toml
//! [environment]
//! kind = "calculator"            # built-in environments: "calculator", "guess_number",
//!                                # "openenv" (a remote OpenEnv server, below), or
//!                                # "tools": the [tasks] with these tools:
//! tools = ["python", "calculator"] # kind "tools": built-in tools (calculator, python, bash)
//! system_prompt = "..."          # kind "tools": optional
//! requires_tool = false          # kind "tools": tasks need a tool call (hacking monitor)
//! [[environment.mcp]]            # kind "tools": MCP servers whose tools are offered
//! transport = "stdio"            # or transport = "http", url = "http://127.0.0.1:8000/mcp"
//! command = "python3"
//! args = ["server.py"]
//! [environment.openenv]          # kind = "openenv": an OpenEnv server's environment
//! url = "http://127.0.0.1:8000"  # its base URL (required); episodes are sessions on /ws
//! action_field = "message"       # the action field that carries the model's turn text
//! observation_field = "prompt"   # the observation field shown (default: all of it, as JSON)
//! opening = "task"               # the opening message: the task's prompt, or "reset": the
//!                                # reset observation
//! [environment]                  # (the keys below apply to every kind)
//! tool_call_parser = "auto"      # "auto" (from the chat template, else hermes) or a parser name
//! tools_in = "auto"              # "template" (the template's `tools` variable), "system"
//!                                # (described in the system prompt), "auto": template when it
//!                                # renders tools, "none": described nowhere (a model
//!                                # fine-tuned on its tools)
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
use stoke_env::mcp::McpServer;
use stoke_env::openenv::OpenEnvSpec;
use stoke_env::toolbox::BuiltinTool;
use stoke_tokenizer::tool_calls::ToolCallParser;

use crate::env_settings::{
    EnvironmentKind, EnvironmentSettings, EpisodeLimits, ParserChoice, ToolsIn,
};
use crate::error::PipelineError;

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
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tools: Option<Vec<BuiltinTool>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub system_prompt: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub requires_tool: Option<bool>,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub mcp: Vec<McpServer>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub openenv: Option<OpenEnvSpec>,
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
        let tools_kind = self.kind == EnvironmentKind::Tools;
        for (name, given) in [
            ("tools", self.tools.is_some()),
            ("system_prompt", self.system_prompt.is_some()),
            ("requires_tool", self.requires_tool.is_some()),
            ("mcp", !self.mcp.is_empty()),
        ] {
            if given && !tools_kind {
                return Err(PipelineError::config(
                    key(name),
                    format!(
                        "only kind = \"tools\" takes it (kind is {:?})",
                        self.kind.name()
                    ),
                ));
            }
        }
        if tools_kind && self.tools.as_ref().is_none_or(Vec::is_empty) && self.mcp.is_empty() {
            return Err(PipelineError::config(
                key("tools"),
                "kind = \"tools\" needs built-in tools (calculator, python, bash) or [[environment.mcp]] servers",
            ));
        }
        let openenv_kind = self.kind == EnvironmentKind::OpenEnv;
        match &self.openenv {
            Some(_) if !openenv_kind => {
                return Err(PipelineError::config(
                    key("openenv"),
                    format!(
                        "only kind = \"openenv\" takes it (kind is {:?})",
                        self.kind.name()
                    ),
                ));
            }
            Some(spec) => spec.check().map_err(|e| match e {
                stoke_env::EnvError::Config {
                    key: field,
                    message,
                } => PipelineError::config(key(&format!("openenv.{field}")), message),
                other => PipelineError::config(key("openenv"), other.to_string()),
            })?,
            None if openenv_kind => {
                return Err(PipelineError::config(
                    key("openenv"),
                    "kind = \"openenv\" needs an [environment.openenv] table with the server's url",
                ));
            }
            None => {}
        }
        for (index, server) in self.mcp.iter().enumerate() {
            server.check().map_err(|e| {
                PipelineError::config(format!("environment.mcp[{index}]"), e.to_string())
            })?;
        }
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
            builtins: self.tools.clone().unwrap_or_default(),
            mcp: self.mcp.clone(),
            system_prompt: self.system_prompt.clone(),
            requires_tool: self.requires_tool.unwrap_or(false),
            openenv: self.openenv.clone(),
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
            tools: (self.kind == EnvironmentKind::Tools).then(|| self.builtins.clone()),
            system_prompt: self.system_prompt.clone(),
            requires_tool: (self.kind == EnvironmentKind::Tools).then_some(self.requires_tool),
            mcp: self.mcp.clone(),
            openenv: self.openenv.clone(),
        }
    }
}
