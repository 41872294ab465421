//! A tool environment assembled from configuration: built-in tools by name and MCP servers, for
//! `[environment] kind = "tools"` (tasks and the reward of the final answer come from the rest
//! of the run's config).
//!
//! What it is: [`ToolboxSpec`] -> [`ToolEnvironment`]: the built-in `calculator`, and `python`
//! and `bash` run in one sandbox with default limits over the episode's workspace; every tool
//! of every listed MCP server, connected once here (the servers stay up while the environment
//! lives). When the chat template cannot show tools, [`tools_system_prompt`] describes them in
//! the system prompt in the Hermes format (the text Qwen2.5's template writes). What it is not:
//! the tools themselves (`calculator`, `sandboxed`, `mcp`).

use std::sync::Arc;

use serde::{Deserialize, Serialize};
use stoke_sandbox::{Sandbox, SandboxConfigFile};

use crate::calculator::Calculator;
use crate::error::EnvError;
use crate::mcp::{McpServer, McpToolSource};
use crate::sandboxed::SandboxedTool;
use crate::tool::{Tool, ToolSpec};
use crate::tool_env::{ToolEnvironment, ToolLimits};

/// The tools stoke ships.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BuiltinTool {
    Calculator,
    Python,
    Bash,
}

/// What a configured tool environment holds.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolboxSpec {
    pub system_prompt: Option<String>,
    pub builtins: Vec<BuiltinTool>,
    pub mcp: Vec<McpServer>,
    pub limits: ToolLimits,
    /// The tasks need a tool call (for the reward-hacking monitor).
    pub requires_tool: bool,
}

/// Builds the environment; `describe_tools` adds the tool list to the system prompt. Errors
/// name the tool or the server that failed.
pub fn build_toolbox(
    spec: &ToolboxSpec,
    describe_tools: bool,
) -> Result<ToolEnvironment, EnvError> {
    let mut tools: Vec<Arc<dyn Tool>> = Vec::new();
    let needs_sandbox = spec
        .builtins
        .iter()
        .any(|tool| matches!(tool, BuiltinTool::Python | BuiltinTool::Bash));
    let sandbox = if needs_sandbox {
        let config = SandboxConfigFile::default()
            .into_config()
            .map_err(|e| EnvError::config("tools", format!("sandbox: {e}")))?;
        Some(Arc::new(Sandbox::new(config).map_err(|e| {
            EnvError::config(
                "tools",
                format!("starting the sandbox for python/bash: {e}"),
            )
        })?))
    } else {
        None
    };
    for builtin in &spec.builtins {
        let tool: Arc<dyn Tool> = match (builtin, &sandbox) {
            (BuiltinTool::Calculator, _) => Arc::new(Calculator),
            (BuiltinTool::Python, Some(sandbox)) => {
                Arc::new(SandboxedTool::python(Arc::clone(sandbox)))
            }
            (BuiltinTool::Bash, Some(sandbox)) => {
                Arc::new(SandboxedTool::bash(Arc::clone(sandbox)))
            }
            (_, None) => unreachable!("the sandbox is built when python or bash is listed"),
        };
        tools.push(tool);
    }
    for server in &spec.mcp {
        server.check()?;
        let source = McpToolSource::connect(server, spec.limits.timeout)?;
        tools.extend(source.tools());
    }
    if tools.is_empty() {
        return Err(EnvError::config(
            "tools",
            "a tool environment needs at least one built-in tool or MCP server",
        ));
    }
    let specs: Vec<ToolSpec> = tools.iter().map(|tool| tool.spec()).collect();
    let system_prompt = match (&spec.system_prompt, describe_tools) {
        (Some(prompt), true) => Some(format!("{prompt}\n\n{}", tools_system_prompt(&specs))),
        (Some(prompt), false) => Some(prompt.clone()),
        (None, true) => Some(tools_system_prompt(&specs)),
        (None, false) => None,
    };
    let environment = ToolEnvironment::new("tools", system_prompt, tools, spec.limits.clone())?;
    Ok(if spec.requires_tool {
        environment.requiring_tool()
    } else {
        environment
    })
}

/// The tools and the Hermes call format as system-prompt text.
pub fn tools_system_prompt(tools: &[ToolSpec]) -> String {
    let mut text = String::from(
        "You may call one or more functions to assist with the user query.\n\nYou are provided \
         with function signatures within <tools></tools> XML tags:\n<tools>",
    );
    for tool in tools {
        text.push('\n');
        text.push_str(&tool.to_openai().to_string());
    }
    text.push_str(
        "\n</tools>\n\nFor each function call, return a json object with function name and \
         arguments within <tool_call></tool_call> XML tags:\n<tool_call>\n{\"name\": \
         <function-name>, \"arguments\": <args-json-object>}\n</tool_call>",
    );
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builtins_assemble_and_describe_themselves() {
        let spec = ToolboxSpec {
            system_prompt: Some("Be exact.".into()),
            builtins: vec![BuiltinTool::Calculator],
            mcp: Vec::new(),
            limits: ToolLimits::default(),
            requires_tool: true,
        };
        let env = build_toolbox(&spec, true).unwrap();
        use crate::environment::Environment;
        assert!(env.requires_tool());
        let opening = env.opening(&crate::EnvTask::default()).unwrap();
        let system = opening.messages[0].content.as_ref().unwrap().joined_text();
        assert!(
            system.starts_with("Be exact.") && system.contains("\"calculator\""),
            "{system}"
        );
        assert!(system.contains("<tool_call>"));
        assert_eq!(opening.tools.len(), 1);
        let bare = build_toolbox(
            &ToolboxSpec {
                builtins: vec![],
                ..spec
            },
            false,
        );
        assert!(bare.unwrap_err().to_string().contains("at least one"));
    }
}
