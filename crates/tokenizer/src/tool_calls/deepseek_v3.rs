//! The DeepSeek V3 format (vLLM's `deepseek_v3` parser): after optional text,
//! `<｜tool▁calls▁begin｜>`, then per call `<｜tool▁call▁begin｜>function<｜tool▁sep｜>NAME\n
//! ```json\n{...}\n```<｜tool▁call▁end｜>` (whitespace between calls allowed), then
//! `<｜tool▁calls▁end｜>` (may be missing when generation stopped right after the last call).
//!
//! Not here: DeepSeek V3.1's `NAME<｜tool▁sep｜>{...}` calls (no type, no ```` ```json ````
//! fence), a different format. The markers are added tokens; the caller must decode them into
//! the text.

use super::{Found, object_text};

pub(super) const CALLS_BEGIN: &str = "<｜tool▁calls▁begin｜>";
const CALLS_END: &str = "<｜tool▁calls▁end｜>";
const CALL_BEGIN: &str = "<｜tool▁call▁begin｜>";
const CALL_END: &str = "<｜tool▁call▁end｜>";
const SEP: &str = "<｜tool▁sep｜>";
const FENCE_OPEN: &str = "```json\n";
const FENCE_CLOSE: &str = "\n```";

pub(super) fn parse(text: &str) -> Option<Found> {
    let calls_at = text.find(CALLS_BEGIN)?;
    let mut rest = &text[calls_at + CALLS_BEGIN.len()..];
    let mut calls = Vec::new();
    loop {
        rest = rest.trim_start();
        if rest.is_empty() || rest.starts_with(CALLS_END) {
            break;
        }
        let (call, after) = one_call(rest)?;
        calls.push(call);
        rest = after;
    }
    if let Some(after_end) = rest.strip_prefix(CALLS_END)
        && !after_end.trim().is_empty()
    {
        return None;
    }
    Some(Found { calls_at, calls })
}

/// One `<｜tool▁call▁begin｜>...<｜tool▁call▁end｜>` at the start of `text`, and the text after.
fn one_call(text: &str) -> Option<((String, String), &str)> {
    let text = text.strip_prefix(CALL_BEGIN)?;
    let (kind, text) = text.split_once(SEP)?;
    if kind.trim() != "function" {
        return None;
    }
    let (name, text) = text.split_once('\n')?;
    let name = name.trim();
    if name.is_empty() {
        return None;
    }
    let text = text.strip_prefix(FENCE_OPEN)?;
    let (arguments, text) = text.split_once(FENCE_CLOSE)?;
    let text = text.trim_start().strip_prefix(CALL_END)?;
    Some(((name.to_string(), object_text(arguments)?), text))
}

#[cfg(test)]
mod tests {
    use crate::tool_calls::ToolCallParser;

    #[test]
    fn vllm_deepseek_v3_example_becomes_two_calls() {
        // The docstring of vLLM's DeepSeekV3ToolParser (the end-of-sentence token is special
        // and skipped from the text).
        let text = "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>get_current_weather\n```json\n{\"location\": \"Beijing\"}\n```<｜tool▁call▁end｜>\n<｜tool▁call▁begin｜>function<｜tool▁sep｜>get_current_weather\n```json\n{\"location\": \"Beijing\"}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜>";
        let turn = ToolCallParser::DeepSeekV3.parse(text, "c");
        assert_eq!(turn.content, None);
        assert_eq!(turn.calls.len(), 2);
        assert_eq!(turn.calls[0].name, "get_current_weather");
        assert_eq!(turn.calls[1].arguments, "{\"location\": \"Beijing\"}");
        assert_eq!(turn.calls[1].id, "c-1");
    }

    #[test]
    fn text_before_the_calls_is_content() {
        let text = "I'll look.<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>now\n```json\n{}\n```<｜tool▁call▁end｜>";
        let turn = ToolCallParser::DeepSeekV3.parse(text, "c");
        assert_eq!(turn.content.as_deref(), Some("I'll look."));
        assert_eq!(turn.calls_at, Some("I'll look.".len()));
        assert_eq!(turn.calls[0].arguments, "{}");
    }

    #[test]
    fn malformed_deepseek_calls_leave_the_whole_text_as_content() {
        for text in [
            "plain text",
            "<｜tool▁calls▁begin｜><｜tool▁calls▁end｜>",
            // Truncated inside the arguments.
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{\"a\": 1",
            // No fence (V3.1 style).
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>f<｜tool▁sep｜>{\"a\": 1}<｜tool▁call▁end｜><｜tool▁calls▁end｜>",
            // Arguments that are not an object.
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n[1]\n```<｜tool▁call▁end｜>",
            // Text after the calls' end.
            "<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function<｜tool▁sep｜>f\n```json\n{}\n```<｜tool▁call▁end｜><｜tool▁calls▁end｜> more",
        ] {
            let turn = ToolCallParser::DeepSeekV3.parse(text, "c");
            assert!(turn.calls.is_empty(), "{text}");
            assert_eq!(turn.content.as_deref(), Some(text));
        }
    }
}
