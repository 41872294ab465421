//! The Mistral format (vLLM's `mistral` parser): `[TOOL_CALLS]` followed either by a JSON array
//! of `{"name": ..., "arguments": {...}}` objects (Mistral 7B v0.3 and the pre-v11 tokenizers),
//! or by `name[ARGS]{...}` / `name{...}` (v11+ tokenizers: Mistral Small 3.2, Magistral), one call
//! per `[TOOL_CALLS]`, where a `[CALL_ID]id` between name and arguments is skipped.
//!
//! Not here: vLLM's fallback that digs a `[{...}]` out of text around it (a malformed call is
//! content here), and the 9-character alphanumeric ids Mistral's own API uses (ids follow the
//! caller's prefix). `[TOOL_CALLS]` is a special token: the caller must decode without skipping
//! special tokens for it to reach the text.

use super::{Found, JsonCall, leading_json, object_text};

pub(super) const MARKER: &str = "[TOOL_CALLS]";
const ARGS: &str = "[ARGS]";
const CALL_ID: &str = "[CALL_ID]";

pub(super) fn parse(text: &str) -> Option<Found> {
    let calls_at = text.find(MARKER)?;
    let after = text[calls_at + MARKER.len()..].trim_start();
    let calls = if after.starts_with('[') {
        let (array, rest) = leading_json::<Vec<JsonCall>>(after)?;
        if !rest.trim().is_empty() {
            return None;
        }
        array
            .into_iter()
            .map(JsonCall::into_call)
            .collect::<Option<Vec<_>>>()?
    } else {
        text[calls_at + MARKER.len()..]
            .split(MARKER)
            .map(named_call)
            .collect::<Option<Vec<_>>>()?
    };
    Some(Found { calls_at, calls })
}

/// `name[ARGS]{...}`, `name[CALL_ID]id[ARGS]{...}` or `name{...}`, and nothing after.
fn named_call(segment: &str) -> Option<(String, String)> {
    let segment = segment.trim();
    let name_end = segment
        .find(|c: char| !(c.is_ascii_alphanumeric() || matches!(c, '_' | '-' | '.')))
        .unwrap_or(segment.len());
    let (name, mut rest) = segment.split_at(name_end);
    if name.is_empty() {
        return None;
    }
    if let Some(after_id) = rest.strip_prefix(CALL_ID) {
        rest = &after_id[after_id.find(ARGS)?..];
    }
    let rest = rest.strip_prefix(ARGS).unwrap_or(rest);
    if !rest.trim_start().starts_with('{') {
        return None;
    }
    let (_, tail) = leading_json::<&serde_json::value::RawValue>(rest)?;
    if !tail.trim().is_empty() {
        return None;
    }
    let arguments = object_text(&rest[..rest.len() - tail.len()])?;
    Some((name.to_string(), arguments))
}

#[cfg(test)]
mod tests {
    use crate::tool_calls::ToolCallParser;

    fn names_and_arguments(text: &str) -> Vec<(String, String)> {
        let turn = ToolCallParser::Mistral.parse(text, "c");
        turn.calls
            .into_iter()
            .map(|c| (c.name, c.arguments))
            .collect()
    }

    #[test]
    fn vllm_mistral_array_examples_become_calls() {
        // vLLM tests/tool_use/test_mistral_tool_parser.py
        assert_eq!(
            names_and_arguments(
                "[TOOL_CALLS][{\"name\": \"add\", \"arguments\":{\"a\": 3.5, \"b\": 4}}]"
            ),
            [("add".to_string(), "{\"a\": 3.5, \"b\": 4}".to_string())]
        );
        assert_eq!(
            names_and_arguments(
                "[TOOL_CALLS] [{\"arguments\":{\"name\": \"John Doe\"}, \"name\": \"get_age\"}]"
            ),
            [(
                "get_age".to_string(),
                "{\"name\": \"John Doe\"}".to_string()
            )]
        );
        let two = "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 3.5, \"b\": 4}}, {\"name\": \"get_current_weather\", \"arguments\":{\"city\": \"San Francisco\", \"state\": \"CA\", \"unit\": \"celsius\"}}]";
        let calls = names_and_arguments(two);
        assert_eq!(calls.len(), 2);
        assert_eq!(calls[1].0, "get_current_weather");
    }

    #[test]
    fn vllm_mistral_v11_examples_become_calls() {
        // vLLM tests/tool_use/test_mistral_tool_parser.py (v11 tokenizer), and the [ARGS] form.
        assert_eq!(
            names_and_arguments("[TOOL_CALLS]add{\"a\": 3.5, \"b\": 4}"),
            [("add".to_string(), "{\"a\": 3.5, \"b\": 4}".to_string())]
        );
        let turn = ToolCallParser::Mistral.parse(
            "Sure.[TOOL_CALLS]get_current_weather[ARGS]{\"city\": \"San Francisco\"}[TOOL_CALLS]add[CALL_ID]a1b2c3d4e[ARGS]{\"a\": 1}",
            "c",
        );
        assert_eq!(turn.content.as_deref(), Some("Sure."));
        assert_eq!(turn.calls[0].name, "get_current_weather");
        assert_eq!(turn.calls[0].arguments, "{\"city\": \"San Francisco\"}");
        assert_eq!(turn.calls[1].name, "add");
        assert_eq!(turn.calls[1].arguments, "{\"a\": 1}");
    }

    #[test]
    fn malformed_mistral_calls_leave_the_whole_text_as_content() {
        for text in [
            "This is a test",
            "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}}",
            "[TOOL_CALLS][{\"name\": \"add\", \"arguments\": {\"a\": 1}}] trailing",
            "[TOOL_CALLS][{\"arguments\": {}}]",
            "[TOOL_CALLS]add[ARGS]{\"a\": ",
            "[TOOL_CALLS]add[ARGS]{\"a\": 1}[TOOL_CALLS]",
            "[TOOL_CALLS]{\"a\": 1}",
            "[TOOL_CALLS][]",
        ] {
            let turn = ToolCallParser::Mistral.parse(text, "c");
            assert!(turn.calls.is_empty(), "{text}");
            assert_eq!(turn.content.as_deref(), Some(text));
        }
    }
}
