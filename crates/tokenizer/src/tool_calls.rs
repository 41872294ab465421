//! Tool calls parsed out of a model's generated text: one [`ToolCallParser`] per wire format,
//! chosen by name (vLLM's `--tool-call-parser` names) or detected from a chat template's source,
//! shared by the server and the rollout engine.
//!
//! What it is: a closed set of formats matched in one place ([`ToolCallParser::parse`]), each
//! format in its own file under `tool_calls/`:
//! - `hermes` (also `qwen`): `<tool_call>\n{"name": ..., "arguments": {...}}\n</tool_call>`
//!   blocks (Hermes 2 Pro, Qwen2.5, Qwen3);
//! - `llama3_json` (also `llama4_json`): the whole message is `{"name": ..., "parameters": {...}}`,
//!   optionally after `<|python_tag|>`, several separated by `;`;
//! - `mistral`: `[TOOL_CALLS][{"name": ..., "arguments": {...}}, ...]`, and the v11+ tokenizer's
//!   `[TOOL_CALLS]name[ARGS]{...}` (or `[TOOL_CALLS]name{...}`), one call per marker;
//! - `deepseek_v3` (also `deepseekv3`): `<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>function
//!   <｜tool▁sep｜>NAME\n```json\n{...}\n```<｜tool▁call▁end｜>...<｜tool▁calls▁end｜>`.
//!
//! What it is not: streaming deltas (a stream holds text back from [`ToolCallParser::call_start`]
//! on and parses once the sample ends), tool schemas or `tool_choice` (the caller decides whether
//! to parse at all), and the chat template (which renders calls back into prompts).
//!
//! Invariants:
//! - all or nothing: a text without at least one complete, valid call, or with one malformed call
//!   among valid ones, parses to no calls and the whole text as content;
//! - with calls, `content` is the text before the first call's marker, trimmed (`None` when
//!   empty), and `calls_at` is that marker's byte offset;
//! - a call's `arguments` is always the text of a JSON object, written as the model wrote it
//!   (a string holding a JSON object is unwrapped; any other JSON type makes the call invalid);
//! - a call's `id` is `{id_prefix}-{index}`, so ids are reproducible from the prefix.

mod deepseek_v3;
mod hermes;
mod llama3_json;
mod mistral;

use serde::Deserialize;
use serde_json::value::RawValue;
use serde_json::{Value, json};

/// A tool-call wire format.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ToolCallParser {
    Hermes,
    Llama3Json,
    Mistral,
    DeepSeekV3,
}

/// Every name [`ToolCallParser::from_name`] accepts, with the parser it names; each parser's
/// first is its canonical name ([`ToolCallParser::name`]).
const NAMES: [(&str, ToolCallParser); 7] = [
    ("hermes", ToolCallParser::Hermes),
    ("qwen", ToolCallParser::Hermes),
    ("llama3_json", ToolCallParser::Llama3Json),
    ("llama4_json", ToolCallParser::Llama3Json),
    ("mistral", ToolCallParser::Mistral),
    ("deepseek_v3", ToolCallParser::DeepSeekV3),
    ("deepseekv3", ToolCallParser::DeepSeekV3),
];

/// A tool-call parser name that is not one of [`ToolCallParser::valid_names`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("unknown tool-call parser `{name}`; valid names: {}", ToolCallParser::valid_names().join(", "))]
pub struct UnknownToolCallParser {
    pub name: String,
}

/// One call: what an OpenAI `tool_calls` entry holds.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ToolCall {
    pub id: String,
    pub name: String,
    /// The text of a JSON object.
    pub arguments: String,
}

impl ToolCall {
    /// The OpenAI form: `{"id", "type": "function", "function": {"name", "arguments"}}`.
    pub fn to_openai(&self) -> Value {
        json!({
            "id": self.id,
            "type": "function",
            "function": {"name": self.name, "arguments": self.arguments},
        })
    }
}

/// A generated turn split into content and calls.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParsedTurn {
    /// Without calls: the whole text. With calls: the text before the first call, trimmed, or
    /// `None` when that is empty.
    pub content: Option<String>,
    pub calls: Vec<ToolCall>,
    /// The byte offset of the first call's marker; `None` when there are no calls.
    pub calls_at: Option<usize>,
}

impl ParsedTurn {
    fn plain(text: &str) -> ParsedTurn {
        ParsedTurn {
            content: Some(text.to_string()),
            calls: Vec::new(),
            calls_at: None,
        }
    }
}

/// What a format's parser finds: where the calls start and each call's name and arguments.
#[derive(Debug, PartialEq, Eq)]
struct Found {
    calls_at: usize,
    calls: Vec<(String, String)>,
}

impl ToolCallParser {
    /// The parser named `name` (vLLM's `--tool-call-parser` names, plus the aliases in
    /// [`ToolCallParser::valid_names`]).
    pub fn from_name(name: &str) -> Result<ToolCallParser, UnknownToolCallParser> {
        NAMES
            .iter()
            .find(|(n, _)| *n == name)
            .map(|&(_, parser)| parser)
            .ok_or_else(|| UnknownToolCallParser {
                name: name.to_string(),
            })
    }

    /// Every accepted name, canonical names and aliases.
    pub fn valid_names() -> Vec<&'static str> {
        NAMES.iter().map(|(n, _)| *n).collect()
    }

    /// The canonical name (what `from_name` is given to get this parser back).
    pub fn name(self) -> &'static str {
        match self {
            ToolCallParser::Hermes => "hermes",
            ToolCallParser::Llama3Json => "llama3_json",
            ToolCallParser::Mistral => "mistral",
            ToolCallParser::DeepSeekV3 => "deepseek_v3",
        }
    }

    /// The format a chat template writes calls in, from its source: DeepSeek V3 on its
    /// `<｜tool▁calls▁begin｜>` marker with ```` ```json ```` argument blocks (V3.1's marker
    /// without them is another format, so `None`), Mistral on `[TOOL_CALLS]`, Hermes on
    /// `<tool_call>`, Llama 3 on `<|python_tag|>` or its JSON tool prompt.
    pub fn detect(template_source: &str) -> Option<ToolCallParser> {
        if template_source.contains(deepseek_v3::CALLS_BEGIN) {
            return template_source
                .contains("```json")
                .then_some(ToolCallParser::DeepSeekV3);
        }
        if template_source.contains(mistral::MARKER) {
            return Some(ToolCallParser::Mistral);
        }
        if template_source.contains(hermes::OPEN) {
            return Some(ToolCallParser::Hermes);
        }
        if template_source.contains(llama3_json::PYTHON_TAG)
            || template_source.contains(llama3_json::JSON_PROMPT)
        {
            return Some(ToolCallParser::Llama3Json);
        }
        None
    }

    /// The text that opens this format's calls (a stream holds text back from it).
    pub fn marker(self) -> &'static str {
        match self {
            ToolCallParser::Hermes => hermes::OPEN,
            ToolCallParser::Llama3Json => llama3_json::PYTHON_TAG,
            ToolCallParser::Mistral => mistral::MARKER,
            ToolCallParser::DeepSeekV3 => deepseek_v3::CALLS_BEGIN,
        }
    }

    /// Where a call may start in a text still being generated: the first full marker, a partial
    /// marker at the very end, or (Llama 3, whose calls may be bare JSON) 0 when the text so far
    /// is empty or starts with `{`. Text before it is content whatever comes next.
    pub fn call_start(self, text: &str) -> Option<usize> {
        if self == ToolCallParser::Llama3Json {
            let trimmed = text.trim_start();
            if trimmed.is_empty() || trimmed.starts_with('{') {
                return Some(0);
            }
        }
        let marker = self.marker();
        if let Some(at) = text.find(marker) {
            return Some(at);
        }
        (1..marker.len())
            .rev()
            .filter(|&cut| marker.is_char_boundary(cut))
            .find(|&cut| text.ends_with(&marker[..cut]))
            .map(|cut| text.len() - cut)
    }

    /// Splits `text` into content and calls; call `i` gets the id `{id_prefix}-{i}`.
    pub fn parse(self, text: &str, id_prefix: &str) -> ParsedTurn {
        let found = match self {
            ToolCallParser::Hermes => hermes::parse(text),
            ToolCallParser::Llama3Json => llama3_json::parse(text),
            ToolCallParser::Mistral => mistral::parse(text),
            ToolCallParser::DeepSeekV3 => deepseek_v3::parse(text),
        };
        let Some(found) = found.filter(|f| !f.calls.is_empty()) else {
            return ParsedTurn::plain(text);
        };
        let content = text[..found.calls_at].trim();
        ParsedTurn {
            content: (!content.is_empty()).then(|| content.to_string()),
            calls: found
                .calls
                .into_iter()
                .enumerate()
                .map(|(index, (name, arguments))| ToolCall {
                    id: format!("{id_prefix}-{index}"),
                    name,
                    arguments,
                })
                .collect(),
            calls_at: Some(found.calls_at),
        }
    }
}

impl std::str::FromStr for ToolCallParser {
    type Err = UnknownToolCallParser;
    fn from_str(name: &str) -> Result<Self, Self::Err> {
        ToolCallParser::from_name(name)
    }
}

impl std::fmt::Display for ToolCallParser {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.name())
    }
}

/// A call written as a JSON object `{"name": ..., "arguments" | "parameters": ...}` (Hermes,
/// Llama 3, Mistral's array form); other keys are ignored.
#[derive(Debug, Deserialize)]
struct JsonCall<'a> {
    name: String,
    #[serde(borrow, default)]
    arguments: Option<&'a RawValue>,
    #[serde(borrow, default)]
    parameters: Option<&'a RawValue>,
}

impl JsonCall<'_> {
    /// `(name, arguments)`, or `None` when the arguments are not an object (missing arguments
    /// are `{}`, as a call without parameters is written by some templates).
    fn into_call(self) -> Option<(String, String)> {
        let arguments = match self.arguments.or(self.parameters) {
            Some(raw) => object_text(raw.get())?,
            None => "{}".to_string(),
        };
        Some((self.name, arguments))
    }
}

/// The text of a JSON object: `raw` itself when it is one, the string's content when `raw` is a
/// JSON string holding one, else `None`.
fn object_text(raw: &str) -> Option<String> {
    let raw = raw.trim();
    if raw.starts_with('{') {
        return serde_json::from_str::<&RawValue>(raw)
            .ok()
            .map(|_| raw.to_string());
    }
    let inner: String = serde_json::from_str(raw).ok()?;
    matches!(serde_json::from_str::<Value>(&inner), Ok(Value::Object(_))).then_some(inner)
}

/// The first JSON value of `text` (leading whitespace skipped) and the text after it.
fn leading_json<'a, T: Deserialize<'a>>(text: &'a str) -> Option<(T, &'a str)> {
    let mut values = serde_json::Deserializer::from_str(text).into_iter::<T>();
    let value = values.next()?.ok()?;
    Some((value, &text[values.byte_offset()..]))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_valid_name_round_trips_and_unknown_names_list_the_valid_ones() {
        for name in ToolCallParser::valid_names() {
            let parser = ToolCallParser::from_name(name).unwrap();
            assert_eq!(ToolCallParser::from_name(parser.name()), Ok(parser));
        }
        assert_eq!(
            ToolCallParser::valid_names(),
            [
                "hermes",
                "qwen",
                "llama3_json",
                "llama4_json",
                "mistral",
                "deepseek_v3",
                "deepseekv3"
            ]
        );
        let err = ToolCallParser::from_name("hermès").unwrap_err();
        assert_eq!(
            err.to_string(),
            "unknown tool-call parser `hermès`; valid names: hermes, qwen, llama3_json, \
             llama4_json, mistral, deepseek_v3, deepseekv3"
        );
    }

    #[test]
    fn detect_reads_each_format_from_its_template_markers() {
        let qwen = "{%- if tools %}<tool_call>\n{\"name\": <function-name>}</tool_call>{% endif %}";
        assert_eq!(ToolCallParser::detect(qwen), Some(ToolCallParser::Hermes));
        let llama = "{{- '<|python_tag|>' + tool_call.name }}";
        assert_eq!(
            ToolCallParser::detect(llama),
            Some(ToolCallParser::Llama3Json)
        );
        let llama_prompt = "{{- 'Respond in the format {\"name\": function name, \"parameters\": dictionary of argument name and its value}.' }}";
        assert_eq!(
            ToolCallParser::detect(llama_prompt),
            Some(ToolCallParser::Llama3Json)
        );
        let mistral = "{{- '[TOOL_CALLS] [' }}";
        assert_eq!(
            ToolCallParser::detect(mistral),
            Some(ToolCallParser::Mistral)
        );
        let deepseek = "{{'<｜Assistant｜><｜tool▁calls▁begin｜><｜tool▁call▁begin｜>' + tool['type'] + '<｜tool▁sep｜>' + tool['function']['name'] + '\\n' + '```json' + '\\n' + tool['function']['arguments'] + '\\n' + '```' + '<｜tool▁call▁end｜>'}}";
        assert_eq!(
            ToolCallParser::detect(deepseek),
            Some(ToolCallParser::DeepSeekV3)
        );
        // DeepSeek V3.1 writes `NAME<｜tool▁sep｜>{args}`: another format, not V3's.
        let deepseek_v31 = "{{'<｜tool▁calls▁begin｜><｜tool▁call▁begin｜>'+ tool['function']['name'] + '<｜tool▁sep｜>' + tool['function']['arguments'] + '<｜tool▁call▁end｜>'}}";
        assert_eq!(ToolCallParser::detect(deepseek_v31), None);
        let chatml = "{% for message in messages %}{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}{% endfor %}";
        assert_eq!(ToolCallParser::detect(chatml), None);
    }

    #[test]
    fn call_start_holds_back_full_and_partial_markers() {
        let hermes = ToolCallParser::Hermes;
        assert_eq!(hermes.call_start("Sure. <tool_call>\n{"), Some(6));
        assert_eq!(hermes.call_start("Sure. <tool_"), Some(6));
        assert_eq!(hermes.call_start("Sure."), None);
        let deepseek = ToolCallParser::DeepSeekV3;
        // A partial multi-byte marker is cut on a character boundary.
        assert_eq!(deepseek.call_start("ok<｜tool"), Some(2));
        let llama = ToolCallParser::Llama3Json;
        assert_eq!(llama.call_start("  {\"name\""), Some(0));
        assert_eq!(llama.call_start("The answer is 4."), None);
    }

    #[test]
    fn openai_form_has_id_type_and_function() {
        let call = ToolCall {
            id: "call-0".into(),
            name: "add".into(),
            arguments: "{\"a\": 1}".into(),
        };
        assert_eq!(
            call.to_openai(),
            json!({"id": "call-0", "type": "function",
                   "function": {"name": "add", "arguments": "{\"a\": 1}"}})
        );
    }

    #[test]
    fn arguments_must_be_an_object_or_a_string_holding_one() {
        assert_eq!(
            object_text("{\"a\": [1, 2]}").as_deref(),
            Some("{\"a\": [1, 2]}")
        );
        assert_eq!(
            object_text("\"{\\\"a\\\": 1}\"").as_deref(),
            Some("{\"a\": 1}")
        );
        assert_eq!(object_text("[1]"), None);
        assert_eq!(object_text("\"not json\""), None);
        assert_eq!(object_text("{\"a\": "), None);
    }
}
