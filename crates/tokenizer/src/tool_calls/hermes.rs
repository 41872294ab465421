//! The Hermes format (Hermes 2 Pro, Qwen2.5, Qwen3; vLLM's `hermes` parser): each call is a
//! `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>` block, after optional text.
//!
//! Not here: Qwen3-Coder's XML `<function=...>` bodies (another format). Text between or after
//! blocks is dropped, as vLLM drops it; an unclosed last block (generation stopped on the end
//! token, or `</tool_call>` was a stop string) still counts when its JSON is complete.

use super::{Found, JsonCall};

pub(super) const OPEN: &str = "<tool_call>";
const CLOSE: &str = "</tool_call>";

pub(super) fn parse(text: &str) -> Option<Found> {
    let calls_at = text.find(OPEN)?;
    let mut calls = Vec::new();
    let mut rest = &text[calls_at..];
    while let Some(open) = rest.find(OPEN) {
        let body_start = open + OPEN.len();
        let (body, next) = match rest[body_start..].find(CLOSE) {
            Some(close) => (
                &rest[body_start..body_start + close],
                &rest[body_start + close + CLOSE.len()..],
            ),
            None => (&rest[body_start..], ""),
        };
        let call: JsonCall = serde_json::from_str(body.trim()).ok()?;
        calls.push(call.into_call()?);
        rest = next;
    }
    Some(Found { calls_at, calls })
}

#[cfg(test)]
mod tests {
    use crate::tool_calls::{ParsedTurn, ToolCall, ToolCallParser};

    fn parse(text: &str) -> ParsedTurn {
        ToolCallParser::Hermes.parse(text, "call")
    }

    #[test]
    fn vllm_hermes_examples_become_calls_with_the_text_before_as_content() {
        // vLLM tests/tool_use (hermes): a single call, and parallel calls after text.
        let single = "<tool_call>\n{\"name\": \"get_current_weather\", \"arguments\": {\"city\": \"Dallas\", \"state\": \"TX\", \"unit\": \"fahrenheit\"}}\n</tool_call>";
        let turn = parse(single);
        assert_eq!(turn.content, None);
        assert_eq!(
            turn.calls,
            [ToolCall {
                id: "call-0".into(),
                name: "get_current_weather".into(),
                arguments: "{\"city\": \"Dallas\", \"state\": \"TX\", \"unit\": \"fahrenheit\"}"
                    .into(),
            }]
        );
        let text = "Let me check.\n<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>\n<tool_call>\n{\"name\": \"now\", \"arguments\": {}}\n</tool_call>";
        let turn = parse(text);
        assert_eq!(turn.content.as_deref(), Some("Let me check."));
        assert_eq!(turn.calls_at, Some(14));
        assert_eq!(turn.calls.len(), 2);
        assert_eq!(turn.calls[1].name, "now");
        assert_eq!(turn.calls[1].id, "call-1");
    }

    #[test]
    fn an_unclosed_final_block_still_parses_and_string_arguments_are_unwrapped() {
        let turn = parse("<tool_call>\n{\"name\": \"f\", \"arguments\": \"{\\\"x\\\": 1}\"}");
        assert_eq!(turn.content, None);
        assert_eq!(turn.calls[0].arguments, "{\"x\": 1}");
    }

    #[test]
    fn malformed_blocks_leave_the_whole_text_as_content() {
        for text in [
            "no calls here",
            "<tool_call>{not json}</tool_call>",
            "<tool_call>{\"arguments\": {}}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": [1]}</tool_call>",
            "<tool_call>{\"name\": \"f\", \"arguments\": {\"x\": 1}",
            // One good block does not rescue a bad one.
            "<tool_call>{\"name\": \"f\"}</tool_call><tool_call>{\"name\": </tool_call>",
        ] {
            let turn = parse(text);
            assert!(turn.calls.is_empty(), "{text}");
            assert_eq!(turn.content.as_deref(), Some(text));
            assert_eq!(turn.calls_at, None);
        }
    }
}
