//! Chat messages in OpenAI format, as `chat::ChatTemplate` takes them: a role, a content that is
//! a string or a list of text parts, and any other fields (`tool_calls`, `reasoning_content`, ...)
//! kept as template values. Deserializes from the JSON that OpenAI-style APIs and chat datasets
//! use. Not here: how a template sees a message (`ChatTemplate` prepares that).

use std::collections::BTreeMap;

use serde::{Deserialize, Serialize};

/// A value handed to a template (extra message fields, extra variables). It is minijinja's value
/// type so that maps parsed from JSON keep their key order, which `tojson` must reproduce
/// (serde_json's own map sorts keys). Parse it from JSON with serde, or build it with `From`.
pub use minijinja::Value as TemplateValue;

/// Who speaks a message (OpenAI chat roles, plus Llama 3.1's `ipython` tool role).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Role {
    System,
    Developer,
    User,
    Assistant,
    Tool,
    Ipython,
}

impl Role {
    /// The role as templates compare it (`message.role == "assistant"`).
    pub fn as_str(self) -> &'static str {
        match self {
            Role::System => "system",
            Role::Developer => "developer",
            Role::User => "user",
            Role::Assistant => "assistant",
            Role::Tool => "tool",
            Role::Ipython => "ipython",
        }
    }
}

/// Names a message's reasoning may come under; transformers fills `thinking` and
/// `reasoning_content` from the first of them that is set.
pub(super) const REASONING_FIELDS: [&str; 3] = ["reasoning_content", "thinking", "reasoning"];

/// One part of a multi-part message content; only text is supported.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "lowercase")]
pub enum ContentPart {
    Text { text: String },
}

/// Message content: a string or a list of parts (OpenAI format).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MessageContent {
    Text(String),
    Parts(Vec<ContentPart>),
}

impl MessageContent {
    /// The text parts joined with "\n".
    pub fn joined_text(&self) -> String {
        match self {
            MessageContent::Text(text) => text.clone(),
            MessageContent::Parts(parts) => parts
                .iter()
                .map(|ContentPart::Text { text }| text.as_str())
                .collect::<Vec<_>>()
                .join("\n"),
        }
    }
}

/// A chat message in OpenAI format. Fields other than `role` and `content` (`tool_calls`,
/// `name`, `tool_call_id`, `reasoning_content`, ...) are passed to the template unchanged, with
/// the key order of nested maps kept.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ChatMessage {
    pub role: Role,
    #[serde(default)]
    pub content: Option<MessageContent>,
    #[serde(flatten)]
    pub extra: BTreeMap<String, TemplateValue>,
}

impl ChatMessage {
    pub fn new(role: Role, content: impl Into<String>) -> Self {
        ChatMessage {
            role,
            content: Some(MessageContent::Text(content.into())),
            extra: Default::default(),
        }
    }
    pub fn system(content: impl Into<String>) -> Self {
        Self::new(Role::System, content)
    }
    pub fn user(content: impl Into<String>) -> Self {
        Self::new(Role::User, content)
    }
    pub fn assistant(content: impl Into<String>) -> Self {
        Self::new(Role::Assistant, content)
    }
}
