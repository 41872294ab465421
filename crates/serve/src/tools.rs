//! How the server handles tools: which [`ToolCallParser`] reads calls out of chat answers (the
//! `tool_call_parser` option: `auto`, `none` or a parser name), whether the chat template can
//! show the model a request's `tools`, and the assistant message built from a finished text.
//!
//! What it is not: the parsers themselves (`stoke_tokenizer::tool_calls`, shared with the rollout
//! engine), nor request validation (`protocol.rs`).
//!
//! Policy:
//! - calls are parsed when the request has `tools` (and `tool_choice` is not `"none"`) and a
//!   parser is set: `auto` detects one from the chat template's source (as vLLM's
//!   `--tool-call-parser` must be given, a named parser applies whatever the template says);
//! - a request whose `tools` the template cannot render (neither the template tools select, the
//!   "tool_use" one or the default, mentions `tools`) is still served, but not silently: the
//!   server logs it once (stderr), and every such answer carries a top-level `warnings` array of
//!   strings (in a stream, on the first chunk). An extra top-level field is what vLLM's own
//!   extensions (`prompt_logprobs`, `kv_transfer_params`) do; OpenAI clients keep unknown
//!   fields, so they keep working.

use std::sync::atomic::{AtomicBool, Ordering};

use serde_json::{Value, json};
use stoke_tokenizer::hf::{DEFAULT_TEMPLATE_NAME, TOOL_USE_TEMPLATE_NAME, Tokenizer};
use stoke_tokenizer::tool_calls::ToolCallParser;

/// The `tool_call_parser` option.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum ToolCallSetting {
    /// Detect the parser from the chat template's source.
    #[default]
    Auto,
    /// Never parse calls: answers are text.
    None,
    /// This parser, whatever the template says.
    Parser(ToolCallParser),
}

impl std::str::FromStr for ToolCallSetting {
    type Err = String;
    fn from_str(value: &str) -> Result<Self, String> {
        match value {
            "auto" => Ok(ToolCallSetting::Auto),
            "none" => Ok(ToolCallSetting::None),
            name => ToolCallParser::from_name(name)
                .map(ToolCallSetting::Parser)
                .map_err(|_| {
                    format!(
                        "unknown tool-call parser `{name}`; valid: auto, none, {}",
                        ToolCallParser::valid_names().join(", ")
                    )
                }),
        }
    }
}

/// What a loaded server knows about tools.
#[derive(Debug)]
pub struct ToolSupport {
    /// The parser of chat answers to requests with tools; `None`: answers are text.
    pub parser: Option<ToolCallParser>,
    /// The template that renders requests with tools mentions `tools`.
    pub template_renders_tools: bool,
    warned: AtomicBool,
}

impl ToolSupport {
    pub fn new(setting: ToolCallSetting, tokenizer: &Tokenizer) -> ToolSupport {
        // The template a request with tools renders with comes first.
        let tool_template = tokenizer
            .chat_template_named(TOOL_USE_TEMPLATE_NAME)
            .or_else(|| tokenizer.chat_template_named(DEFAULT_TEMPLATE_NAME));
        let parser = match setting {
            ToolCallSetting::None => None,
            ToolCallSetting::Parser(parser) => Some(parser),
            ToolCallSetting::Auto => tool_template
                .into_iter()
                .chain(
                    tokenizer
                        .chat_template_names()
                        .into_iter()
                        .filter_map(|name| tokenizer.chat_template_named(name)),
                )
                .find_map(|template| ToolCallParser::detect(template.source())),
        };
        ToolSupport {
            parser,
            template_renders_tools: tool_template.is_some_and(|t| t.source().contains("tools")),
            warned: AtomicBool::new(false),
        }
    }

    /// The warnings an answer to a request carries (logged the first time for this server).
    pub fn warnings(&self, request_passes_tools: bool) -> Vec<String> {
        if !request_passes_tools || self.template_renders_tools {
            return Vec::new();
        }
        let warning = "the model's chat template does not render `tools`: the request's tools \
                       were not shown to the model"
            .to_string();
        if !self.warned.swap(true, Ordering::Relaxed) {
            eprintln!("stoke serve: warning: {warning} (logged once)");
        }
        vec![warning]
    }
}

/// The assistant message of a finished text, and whether it holds tool calls.
pub fn assistant_message(
    parser: Option<ToolCallParser>,
    text: &str,
    id_prefix: &str,
) -> (Value, bool) {
    if let Some(parser) = parser {
        let turn = parser.parse(text, id_prefix);
        if !turn.calls.is_empty() {
            let calls: Vec<Value> = turn.calls.iter().map(|c| c.to_openai()).collect();
            return (
                json!({"role": "assistant", "content": turn.content, "tool_calls": calls, "reasoning_content": null}),
                true,
            );
        }
    }
    (
        json!({"role": "assistant", "content": text, "tool_calls": [], "reasoning_content": null}),
        false,
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn settings_parse_auto_none_and_parser_names_and_name_the_valid_ones() {
        assert_eq!("auto".parse(), Ok(ToolCallSetting::Auto));
        assert_eq!("none".parse(), Ok(ToolCallSetting::None));
        assert_eq!(
            "qwen".parse(),
            Ok(ToolCallSetting::Parser(ToolCallParser::Hermes))
        );
        let err = "pythonic".parse::<ToolCallSetting>().unwrap_err();
        assert!(err.contains("`pythonic`"), "{err}");
        assert!(err.contains("auto, none, hermes"), "{err}");
    }

    #[test]
    fn a_hermes_block_becomes_tool_calls_only_with_a_parser() {
        let text = "<tool_call>\n{\"name\": \"get_weather\", \"arguments\": {\"city\": \"Paris\"}}\n</tool_call>";
        let (message, has_calls) = assistant_message(Some(ToolCallParser::Hermes), text, "x");
        assert!(has_calls);
        assert_eq!(message["content"], Value::Null);
        assert_eq!(message["tool_calls"][0]["id"], "x-0");
        assert_eq!(
            message["tool_calls"][0]["function"]["arguments"],
            "{\"city\": \"Paris\"}"
        );
        let (message, has_calls) = assistant_message(None, text, "x");
        assert!(!has_calls);
        assert_eq!(message["content"], text);
        assert_eq!(message["tool_calls"], json!([]));
    }
}
