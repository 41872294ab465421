//! [`McpTool`]: one tool an MCP server listed, as a [`Tool`].
//!
//! What it is: the spec (the server's `name`, `description` and `inputSchema`, unchanged; a
//! missing description is empty) and the call (`tools/call` on the source's shared connection).
//! What it is not: argument validation (the server validates against its own schema and answers
//! with an error result, which the model reads) or the connection itself.
//!
//! A result becomes the tool message's text, one line group per content part, in order:
//! - `text`: the text;
//! - an embedded text resource: its text;
//! - `image`, `audio` and an embedded binary resource: a placeholder naming the kind, MIME type and
//!   size (`[image: image/png, 1234 bytes]`), since a tool message here is text only;
//! - `resource_link`: `[resource link: URI (name)]`;
//! - a part kind newer than this client: a placeholder saying it cannot be shown;
//!
//! and a result with no content parts but `structuredContent` is that JSON. `isError` and a failed
//! request (transport, protocol, timeout) give a `failed` output; the latter's text names the
//! server and the tool.

use std::sync::Arc;

use rmcp::model::{CallToolResult, ContentBlock, ResourceContents};
use serde_json::Value;

use super::source::Connection;
use crate::tool::{Tool, ToolOutput, ToolSpec, Workspace};

/// One tool of an MCP server.
pub struct McpTool {
    spec: ToolSpec,
    connection: Arc<Connection>,
}

impl McpTool {
    pub(crate) fn new(tool: rmcp::model::Tool, connection: Arc<Connection>) -> McpTool {
        McpTool {
            spec: ToolSpec {
                name: tool.name.into_owned(),
                description: tool.description.map(|d| d.into_owned()).unwrap_or_default(),
                parameters: Value::Object(Arc::unwrap_or_clone(tool.input_schema)),
            },
            connection,
        }
    }

    /// `error: MCP server S, tool T: reason`.
    fn failure(&self, reason: &str) -> ToolOutput {
        ToolOutput::error(format!(
            "error: MCP server {}, tool {}: {reason}",
            self.connection.label, self.spec.name
        ))
    }
}

impl Tool for McpTool {
    fn spec(&self) -> ToolSpec {
        self.spec.clone()
    }

    fn call(&self, arguments: &Value, _workspace: &mut Workspace) -> ToolOutput {
        let Value::Object(arguments) = arguments else {
            return self.failure("the arguments must be a JSON object");
        };
        match self
            .connection
            .call_tool(&self.spec.name, arguments.clone())
        {
            Ok(result) => tool_output(&result),
            Err(reason) => self.failure(&reason),
        }
    }
}

/// The tool output of a `tools/call` result (see the module doc).
pub(crate) fn tool_output(result: &CallToolResult) -> ToolOutput {
    let mut content: Vec<String> = result.content.iter().map(part_text).collect();
    if content.is_empty()
        && let Some(structured) = &result.structured_content
    {
        content.push(structured.to_string());
    }
    let content = content.join("\n");
    if result.is_error == Some(true) {
        ToolOutput::error(content)
    } else {
        ToolOutput::ok(content)
    }
}

fn part_text(part: &ContentBlock) -> String {
    match part {
        ContentBlock::Text(text) => text.text.clone(),
        ContentBlock::Image(image) => {
            format!(
                "[image: {}, {} bytes]",
                image.mime_type,
                base64_bytes(&image.data)
            )
        }
        ContentBlock::Audio(audio) => {
            format!(
                "[audio: {}, {} bytes]",
                audio.mime_type,
                base64_bytes(&audio.data)
            )
        }
        ContentBlock::Resource(embedded) => match &embedded.resource {
            ResourceContents::TextResourceContents { text, .. } => text.clone(),
            ResourceContents::BlobResourceContents {
                uri,
                mime_type,
                blob,
                ..
            } => format!(
                "[resource {uri}: {}, {} bytes]",
                mime_type.as_deref().unwrap_or("unknown type"),
                base64_bytes(blob)
            ),
            _ => "[a resource this client cannot show]".to_string(),
        },
        ContentBlock::ResourceLink(link) => {
            format!("[resource link: {} ({})]", link.uri, link.name)
        }
        // A part kind newer than this client: say so rather than drop it silently.
        _ => "[a content part this client cannot show]".to_string(),
    }
}

/// The decoded size of base64 `data` (padding discounted).
fn base64_bytes(data: &str) -> usize {
    let padding = data.bytes().rev().take_while(|&b| b == b'=').count();
    (data.len() / 4 * 3).saturating_sub(padding)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn result(json: serde_json::Value) -> CallToolResult {
        serde_json::from_value(json).unwrap()
    }

    #[test]
    fn text_parts_are_joined_and_other_parts_are_named() {
        let output = tool_output(&result(serde_json::json!({
            "content": [
                {"type": "text", "text": "5"},
                {"type": "image", "data": "aGVsbG8=", "mimeType": "image/png"},
                {"type": "resource", "resource": {"uri": "file:///a.txt", "text": "inside"}},
                {"type": "resource_link", "uri": "file:///b.txt", "name": "b"}
            ]
        })));
        assert!(!output.failed);
        assert_eq!(
            output.content,
            "5\n[image: image/png, 5 bytes]\ninside\n[resource link: file:///b.txt (b)]"
        );
    }

    #[test]
    fn is_error_gives_a_failed_output_with_the_servers_text() {
        let output = tool_output(&result(serde_json::json!({
            "content": [{"type": "text", "text": "Error executing tool add: bad b"}],
            "isError": true
        })));
        assert!(output.failed);
        assert_eq!(output.content, "Error executing tool add: bad b");
    }

    #[test]
    fn structured_content_stands_in_for_missing_parts() {
        let output = tool_output(&result(serde_json::json!({
            "content": [],
            "structuredContent": {"result": 5}
        })));
        assert_eq!(output.content, r#"{"result":5}"#);
    }
}
