//! Tools an environment offers the model: their OpenAI function schema, the call, and the
//! episode's [`Workspace`] that calls share.
//!
//! What it is: the [`Tool`] trait (a name, a schema, a call on parsed JSON arguments) and the
//! records around it. What it is not: parsing tool calls out of the model's text (the tokenizer
//! crate's `tool_calls` parser, chosen per model family), or deciding what the tool result looks
//! like in the conversation ([`crate::ToolEnvironment`] makes the `tool` message).
//!
//! The workspace is the episode's work dir, kept as files in memory: a sandboxed tool writes
//! them into the fresh jail directory of each call and reads back what the program left, so the
//! files persist across the episode's turns while every program still runs in a new, confined
//! directory; the workspace is dropped with the episode.

use std::collections::BTreeMap;

use serde_json::{Value, json};

/// A tool's schema as OpenAI's `tools` list and chat templates take it.
#[derive(Clone, Debug, PartialEq)]
pub struct ToolSpec {
    pub name: String,
    pub description: String,
    /// JSON Schema of the arguments object.
    pub parameters: Value,
}

impl ToolSpec {
    /// `{"type": "function", "function": {"name", "description", "parameters"}}`.
    pub fn to_openai(&self) -> Value {
        json!({
            "type": "function",
            "function": {
                "name": self.name,
                "description": self.description,
                "parameters": self.parameters,
            }
        })
    }
}

/// What a tool call returned.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ToolOutput {
    /// The tool message's content.
    pub content: String,
    /// The call failed (bad arguments, a non-zero exit, a timeout); the content says why.
    pub failed: bool,
    /// Workspace files the call read or wrote, relative paths (for reward-hacking monitors).
    pub touched: Vec<String>,
}

impl ToolOutput {
    pub fn ok(content: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: content.into(),
            ..ToolOutput::default()
        }
    }

    pub fn error(content: impl Into<String>) -> ToolOutput {
        ToolOutput {
            content: content.into(),
            failed: true,
            touched: Vec::new(),
        }
    }
}

/// The files of one episode, by relative path.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Workspace {
    pub files: BTreeMap<String, Vec<u8>>,
}

impl Workspace {
    /// The file's text (lossy UTF-8), if it exists.
    pub fn text(&self, path: &str) -> Option<String> {
        self.files
            .get(path)
            .map(|bytes| String::from_utf8_lossy(bytes).into_owned())
    }

    /// Total bytes held.
    pub fn bytes(&self) -> usize {
        self.files.values().map(Vec::len).sum()
    }
}

/// A tool. Shared by every episode (`Send + Sync`); per-episode state lives in the workspace.
pub trait Tool: Send + Sync {
    fn spec(&self) -> ToolSpec;

    /// Runs the call on parsed arguments. A failure is an output with `failed` set (the model
    /// reads the message and may retry), never a panic.
    fn call(&self, arguments: &Value, workspace: &mut Workspace) -> ToolOutput;
}
