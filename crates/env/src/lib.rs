//! stoke-env: the environment boundary of agentic RL, and the environments and tools stoke
//! ships.
//!
//! An agentic episode is a conversation between the policy and an environment: the environment
//! opens it (system and user messages, the tools it offers), the model takes a turn (text, maybe
//! tool calls), the environment answers (tool results, a follow-up, or the end), and so on until
//! the environment says done or a limit stops it. This crate holds:
//! - [`environment`]: the narrow [`Environment`] / [`Episode`] traits and their records;
//! - [`tool`]: the [`Tool`] trait, tool schemas and the episode's [`Workspace`];
//! - [`tool_env`]: [`ToolEnvironment`], an environment made of a task, tools and a final answer;
//!   [`toolbox`]: one assembled from configuration (built-in tools by name, MCP servers);
//! - [`mcp`]: Model Context Protocol servers (stdio or streamable HTTP) as tool sources;
//! - [`calculator`]: an exact-arithmetic tool; [`arithmetic`]: the calculator task generator;
//! - [`code_repair`]: fix a bug in a small Python repository with file and test tools, scored
//!   by hidden tests on the final files; its task generator;
//! - [`guess`]: guess the number, a multi-turn environment without tools;
//! - [`openenv`]: a remote environment served by an OpenEnv server (its WebSocket sessions);
//! - [`sandboxed`]: the `python` and `bash` tools, running code in `stoke_sandbox` over the
//!   episode's workspace;
//! - [`transcript`]: the token-exact record of an episode and the template rendering of the
//!   environment's messages as ids (never re-encoding the model's text);
//! - [`monitor`]: reward-hacking signals (grader paths, sudden shifts);
//! - [`guard`]: running environment calls on worker threads with a timeout, so an environment
//!   that panics or hangs ends its episode, never the run.
//!
//! What it is not: the generation loop (the pipeline's episode runner drives the engine and this
//! crate's traits), the tokenizer, or the sandbox itself (`stoke_sandbox`).

pub mod arithmetic;
pub mod calculator;
pub mod code_repair;
pub mod environment;
pub mod error;
pub mod guard;
pub mod guess;
pub mod mcp;
pub mod monitor;
pub mod openenv;
pub mod sandboxed;
pub mod tool;
pub mod tool_env;
pub mod toolbox;
pub mod transcript;

pub use code_repair::{CodeRepair, CodeRepairSpec, code_repair_tasks};
pub use environment::{EnvStep, EnvTask, Environment, Episode, ModelTurn, Opening, StopReason};
pub use error::EnvError;
pub use mcp::{McpServer, McpTool, McpToolSource};
pub use openenv::{OpenEnvEnvironment, OpenEnvSpec};
pub use sandboxed::SandboxedTool;
pub use tool::{Tool, ToolOutput, ToolSpec, Workspace};
pub use tool_env::{ToolEnvironment, ToolLimits};
pub use transcript::{Segment, Transcript, TurnRenderer};
