//! The Llama 3.x JSON format (vLLM's `llama3_json` parser): the message is one or more
//! `{"name": ..., "parameters": {...}}` objects (`"arguments"` is accepted too) separated by `;`,
//! optionally after `<|python_tag|>`, which the Llama 3.1 template writes before calls.
//!
//! Stricter than vLLM on purpose: vLLM takes the first JSON object found anywhere in the text;
//! here the text after the tag (or the whole text, when there is no tag) must be calls and
//! nothing else, so an answer that merely contains JSON stays content. Text before the tag is
//! the content.

use super::{Found, JsonCall, leading_json};

pub(super) const PYTHON_TAG: &str = "<|python_tag|>";
/// The instruction of the Llama 3.1/3.2/3.3 templates' JSON tool prompt.
pub(super) const JSON_PROMPT: &str = "\"parameters\": dictionary of argument name and its value";

pub(super) fn parse(text: &str) -> Option<Found> {
    let (calls_at, mut rest) = match text.find(PYTHON_TAG) {
        Some(at) => (at, &text[at + PYTHON_TAG.len()..]),
        None => (0, text),
    };
    let mut calls = Vec::new();
    loop {
        let (call, after) = leading_json::<JsonCall>(rest)?;
        calls.push(call.into_call()?);
        let after = after.trim_start();
        if after.is_empty() {
            return Some(Found { calls_at, calls });
        }
        rest = after.strip_prefix(';')?;
    }
}

#[cfg(test)]
mod tests {
    use crate::tool_calls::ToolCallParser;

    #[test]
    fn vllm_llama3_examples_become_calls() {
        // vLLM tests/entrypoints/openai/tool_parsers/test_llama3_json_tool_parser.py
        let turn = ToolCallParser::Llama3Json.parse(
            "{\"name\": \"get_weather\", \"parameters\": {\"location\": \"San Francisco, CA\"}}",
            "c",
        );
        assert_eq!(turn.content, None);
        assert_eq!(turn.calls[0].name, "get_weather");
        assert_eq!(
            turn.calls[0].arguments,
            "{\"location\": \"San Francisco, CA\"}"
        );
        let several = "{\"name\": \"searchTool\", \"parameters\": {\"query\": \"test1\"}}; {\"name\": \"getOpenIncidentsTool\", \"parameters\": {}}; {\"name\": \"searchTool\", \"parameters\": {\"query\": \"test2\"}}";
        let turn = ToolCallParser::Llama3Json.parse(several, "c");
        let names: Vec<_> = turn.calls.iter().map(|c| c.name.as_str()).collect();
        assert_eq!(names, ["searchTool", "getOpenIncidentsTool", "searchTool"]);
        assert_eq!(turn.calls[1].arguments, "{}");
        assert_eq!(turn.calls[2].id, "c-2");
    }

    #[test]
    fn text_before_the_python_tag_is_content() {
        let turn = ToolCallParser::Llama3Json.parse(
            "Checking.<|python_tag|>{\"name\": \"f\", \"arguments\": {\"x\": 1}}",
            "c",
        );
        assert_eq!(turn.content.as_deref(), Some("Checking."));
        assert_eq!(turn.calls_at, Some(9));
        assert_eq!(turn.calls[0].arguments, "{\"x\": 1}");
    }

    #[test]
    fn json_that_is_not_only_calls_stays_content() {
        for text in [
            "The answer is {\"name\": \"f\", \"parameters\": {}}",
            "{\"name\": \"f\", \"parameters\": {}} and more text",
            "{\"result\": 4}",
            "{\"name\": \"f\", \"parameters\": {}}; ",
            "{\"name\": \"f\", \"parameters\": {\"x\": ",
            "{\"name\": \"f\", \"parameters\": 3}",
        ] {
            let turn = ToolCallParser::Llama3Json.parse(text, "c");
            assert!(turn.calls.is_empty(), "{text}");
            assert_eq!(turn.content.as_deref(), Some(text));
        }
    }
}
