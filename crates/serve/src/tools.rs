//! Tool calls parsed out of generated text, for chat templates that define them.
//!
//! Supported format: Hermes / Qwen2.5 / Qwen3 `<tool_call>\n{"name": ..., "arguments": {...}}\n
//! </tool_call>` blocks (the format of every template whose source mentions `<tool_call>`).
//! The text before the first block is the message content; each block becomes an OpenAI
//! `tool_calls` entry with `arguments` as a JSON string. A block that is not valid JSON with a
//! string `name` leaves the whole text as content (nothing is half-parsed).

use serde_json::{Value, json};

pub const OPEN: &str = "<tool_call>";
pub const CLOSE: &str = "</tool_call>";

/// Whether a chat template produces Hermes-style tool calls.
pub fn template_uses_tool_calls(template_source: &str) -> bool {
    template_source.contains(OPEN)
}

/// The content and tool calls of `text`, or `None` when it holds no complete, valid call.
pub fn parse(text: &str, id_prefix: &str) -> Option<(Option<String>, Vec<Value>)> {
    let start = text.find(OPEN)?;
    let content = text[..start].trim();
    let mut calls = Vec::new();
    let mut rest = &text[start..];
    while let Some(open) = rest.find(OPEN) {
        let body_start = open + OPEN.len();
        let (body, next) = match rest[body_start..].find(CLOSE) {
            Some(close) => (
                &rest[body_start..body_start + close],
                &rest[body_start + close + CLOSE.len()..],
            ),
            // An unclosed last block (the model stopped on its end token) still counts.
            None => (&rest[body_start..], ""),
        };
        let call: Value = serde_json::from_str(body.trim()).ok()?;
        let name = call.get("name")?.as_str()?.to_string();
        let arguments = call
            .get("arguments")
            .or_else(|| call.get("parameters"))
            .cloned()
            .unwrap_or_else(|| json!({}));
        let arguments = match arguments {
            Value::String(text) => text,
            other => other.to_string(),
        };
        calls.push(json!({
            "id": format!("{id_prefix}-{}", calls.len()),
            "type": "function",
            "function": {"name": name, "arguments": arguments},
        }));
        rest = next;
    }
    if calls.is_empty() {
        return None;
    }
    Some(((!content.is_empty()).then(|| content.to_string()), calls))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hermes_blocks_become_openai_tool_calls() {
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let (content, calls) = parse(text, "call").unwrap();
        assert_eq!(content.as_deref(), Some("Let me check."));
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[0]["function"]["name"], "get_weather");
        assert_eq!(calls[0]["function"]["arguments"], "{\"city\":\"Paris\"}");
        assert_eq!(calls[1]["id"], "call-1");
    }

    #[test]
    fn text_without_a_valid_call_is_left_alone() {
        assert!(parse("no calls here", "c").is_none());
        assert!(parse("<tool_call>{not json}</tool_call>", "c").is_none());
        assert!(parse("<tool_call>{\"arguments\": {}}</tool_call>", "c").is_none());
    }

    #[test]
    fn an_unclosed_final_block_still_parses() {
        let (content, calls) =
            parse("<tool_call>\n{\"name\": \"f\", \"arguments\": \"{}\"}", "c").unwrap();
        assert_eq!(content, None);
        assert_eq!(calls[0]["function"]["arguments"], "{}");
    }
}
