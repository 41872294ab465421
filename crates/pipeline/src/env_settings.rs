//! The validated settings of a multi-turn run's environment (`[environment]`, resolved by
//! `config::environment`): which environment, how its tool calls are parsed and shown, and the
//! limits of an episode. What it is not: the file layer (`config::environment`) or the runner
//! (`episode`).

use std::time::Duration;

use serde::{Deserialize, Serialize};
use stoke_env::ToolLimits;
use stoke_env::mcp::McpServer;
use stoke_env::openenv::OpenEnvSpec;
use stoke_env::toolbox::BuiltinTool;
use stoke_tokenizer::tool_calls::ToolCallParser;

use crate::error::PipelineError;

/// Limits of one episode.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeLimits {
    /// Model turns at most.
    pub max_turns: usize,
    /// Ids after the prompt at most (model and environment).
    pub max_total_tokens: usize,
    /// Ids one model turn may sample.
    pub max_turn_tokens: usize,
    /// A turn cut at `max_turn_tokens` is closed with the template's end-of-turn token
    /// (`Segment::Close`, masked) and the episode goes on; otherwise it ends the episode.
    pub close_truncated_turns: bool,
    /// Wall time of one environment call (start, step, finish).
    pub env_timeout: Duration,
}

impl EpisodeLimits {
    /// Checks every field; the error names it.
    pub fn validate(&self) -> Result<(), PipelineError> {
        for (key, value) in [
            ("max_turns", self.max_turns),
            ("max_total_tokens", self.max_total_tokens),
            ("max_turn_tokens", self.max_turn_tokens),
        ] {
            if value == 0 {
                return Err(PipelineError::config(key, "must be at least 1"));
            }
        }
        if self.env_timeout.is_zero() {
            return Err(PipelineError::config("env_timeout", "must be above 0 s"));
        }
        Ok(())
    }
}

/// The built-in environments.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EnvironmentKind {
    /// Arithmetic with an exact calculator tool (`stoke_env::arithmetic`).
    Calculator,
    /// Guess a number from 1 to 100 with higher/lower feedback (`stoke_env::guess`).
    GuessNumber,
    /// The `[tasks]` prompts with the listed `tools` and `[[environment.mcp]]` servers
    /// (`stoke_env::toolbox`); the run's reward scores the final answer.
    Tools,
    /// An OpenEnv server's environment over its session protocol (`[environment.openenv]`,
    /// `stoke_env::openenv`).
    #[serde(rename = "openenv")]
    OpenEnv,
    /// Fix a planted bug in a small Python repository with file and test tools, graded by
    /// hidden tests (`stoke_env::code_repair`); takes `[tasks] kind = "code_repair"`.
    CodeRepair,
}

impl EnvironmentKind {
    pub fn name(self) -> &'static str {
        match self {
            EnvironmentKind::Calculator => "calculator",
            EnvironmentKind::GuessNumber => "guess_number",
            EnvironmentKind::Tools => "tools",
            EnvironmentKind::OpenEnv => "openenv",
            EnvironmentKind::CodeRepair => "code_repair",
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
    /// Described nowhere: for a model fine-tuned on its tools and their call format (the
    /// speedrun's agent stage), whose context is too short to spend on a description.
    None,
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

    pub fn name(self) -> String {
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
    /// Kind "tools": what the environment offers (`builtins` empty and no `mcp` otherwise).
    pub builtins: Vec<BuiltinTool>,
    pub mcp: Vec<McpServer>,
    pub system_prompt: Option<String>,
    pub requires_tool: bool,
    /// Kind "openenv": the server and the action/observation mapping (`None` otherwise).
    pub openenv: Option<OpenEnvSpec>,
}
