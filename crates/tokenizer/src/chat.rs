//! Hugging Face chat templates rendered with minijinja, in the jinja dialect transformers uses,
//! and the assistant-token mask that SFT needs.
//!
//! The environment mirrors transformers' `apply_chat_template`: `trim_blocks` and `lstrip_blocks`
//! on, `keep_trailing_newline` off (jinja2's default), loop controls, Python string/dict/list
//! methods (`.strip()`, `.items()`, `.startswith()` via minijinja-contrib's pycompat), a `tojson`
//! filter that is Python's `json.dumps(..., ensure_ascii=False)`, `raise_exception(msg)` and
//! `strftime_now(fmt)` (local time, as Python's `datetime.now().strftime`). The template sees
//! `messages`, `add_generation_prompt`, `tools` and `documents` (none unless given as extra
//! variables), the special tokens (`bos_token`, `eos_token`, `pad_token`, `unk_token`, those the
//! tokenizer defines) and any extra variables of [`ChatOptions`] (e.g. `date_string`). Messages
//! are prepared as transformers 5.24 prepares them: keys whose value is null are dropped, and
//! reasoning under `reasoning_content`, `thinking` or `reasoning` is copied to `reasoning_content`
//! and `thinking`. An empty conversation is an error, as there. Token ids are `encode(text,
//! add_special_tokens=false)`, as in transformers, so the template alone decides where BOS goes.
//!
//! The assistant mask (`ChatEncoding::assistant_mask`) marks the tokens of assistant turns:
//! - Templates with `{% generation %}...{% endgeneration %}` blocks: exactly the tokens transformers'
//!   (5.24) `return_assistant_tokens_mask=True` marks: every token whose text overlaps a block's
//!   rendered text (all byte-level tokens of a character split across tokens included).
//!   minijinja does not know the tag, so it is rewritten to `{% filter <span-marker> %}` (same
//!   whitespace control, same position) whose output is wrapped in two noncharacters that are then
//!   cut out and turned into byte spans.
//! - Templates without them (transformers would return an all-zero mask): each assistant message
//!   `i` covers the text that rendering `messages[..=i]` without a generation prompt adds to
//!   rendering `messages[..i]` with one, cut after the last end-of-turn token in it (the
//!   tokenizer's eos tokens, e.g. `<|im_end|>` or `<|eot_id|>`). So the mask holds the assistant's
//!   content and its end-of-turn token, and not the role header or the newline after the end token.
//!   On the Qwen2.5 and Llama 3.x templates this equals the tagged variants' transformers masks,
//!   except on Qwen tool-call turns ("<|im_start|>assistant" + "\n<tool_call>..."), where the
//!   tagged block also covers that first "\n" and this mask does not (it is part of the generation
//!   prompt "<|im_start|>assistant\n"); `tests/chat_extra_reference.rs` pins that.
//!   This needs templates whose output for a prefix of the conversation is a prefix of the output
//!   for the whole (true of Qwen2.5 and Llama 3.1); otherwise it is an error that asks for
//!   generation tags.
//!
//! Message content given as a list of text parts is passed to templates that iterate over
//! `content` as that list (what transformers does), and joined with "\n" into a string for
//! templates that do not (they would fail in Python; vLLM joins the same way).
//!
//! Tokenizing the rendered text (`ChatTemplate::encode`) is defined beside `Tokenizer` in `hf.rs`:
//! this module renders text and assistant spans and names no tokenizer type.
//!
//! Not here: converting Python functions to tool schemas (pass JSON schemas as the `tools`
//! variable), images or other non-text parts, `continue_final_message`, transformers'
//! opt-in `sanitize_control_tokens`, and Python's `%` string formatting (minijinja has no `%` on
//! strings; no template we test uses it).

mod message;
mod python_json;

use message::REASONING_FIELDS;
pub use message::{ChatMessage, ContentPart, MessageContent, Role, TemplateValue};

use std::collections::BTreeMap;
use std::ops::Range;

use minijinja::syntax::SyntaxConfig;
use minijinja::value::Serde;
use minijinja::{Environment, Error as JinjaError, ErrorKind, Value};
use stoke_types::TokenId;

use crate::error::TokenizerError;

/// Wraps the rendered body of a `{% generation %}` block; noncharacters never occur in text.
const SPAN_START: char = '\u{FDD0}';
const SPAN_END: char = '\u{FDD1}';
const SPAN_FILTER: &str = "__stoke_generation_span";

/// Options of one rendering.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct ChatOptions {
    /// Append the header that opens an assistant turn (for generation).
    pub add_generation_prompt: bool,
    /// Extra template variables, e.g. `date_string` for Llama 3.1. They may override the special
    /// tokens, `tools` and `documents`, but not `messages` or `add_generation_prompt`.
    pub variables: BTreeMap<String, TemplateValue>,
}

/// The special-token texts a template can use (`bos_token`, ...), those the tokenizer defines.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TemplateTokens {
    pub bos: Option<String>,
    pub eos: Option<String>,
    pub pad: Option<String>,
    pub unk: Option<String>,
}

/// A rendered conversation: the text and the byte spans of the assistant turns in it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RenderedChat {
    pub text: String,
    pub assistant_spans: Vec<Range<usize>>,
}

/// A rendered and tokenized conversation. `ids.len() == assistant_mask.len()`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ChatEncoding {
    pub text: String,
    pub ids: Vec<TokenId>,
    /// True for the tokens of assistant turns (see the module doc for exactly which).
    pub assistant_mask: Vec<bool>,
}

/// How a template's assistant spans are found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum MaskSource {
    /// The template marks assistant text with `{% generation %}` blocks.
    GenerationTags,
    /// Spans come from rendering prefixes of the conversation.
    PrefixRendering,
}

/// Whether a template iterates over message content parts itself.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum ContentFormat {
    /// Content is always passed as a string (parts joined with "\n").
    String,
    /// Content is passed as given (string or list of parts).
    OpenAi,
}

/// A compiled chat template.
#[derive(Debug, Clone)]
pub struct ChatTemplate {
    name: String,
    source: String,
    env: Environment<'static>,
    tokens: TemplateTokens,
    end_of_turn: Vec<String>,
    mask_source: MaskSource,
    content_format: ContentFormat,
}

impl ChatTemplate {
    /// Compiles `source`. `end_of_turn` lists the token texts that close a turn (the tokenizer's
    /// eos tokens); only the prefix-rendering mask uses them.
    pub fn new(
        name: &str,
        source: &str,
        tokens: TemplateTokens,
        end_of_turn: Vec<String>,
    ) -> Result<Self, TokenizerError> {
        let (rewritten, has_generation_tags) = rewrite_generation_tags(source);
        let mut env = Environment::new();
        let syntax = SyntaxConfig::builder()
            .trim_blocks(true)
            .lstrip_blocks(true)
            .keep_trailing_newline(false)
            .build()
            .map_err(|err| template_error(name, &err))?;
        env.set_syntax(syntax);
        env.set_unknown_method_callback(minijinja_contrib::pycompat::unknown_method_callback);
        env.add_filter("tojson", python_json::tojson_filter);
        env.add_filter(SPAN_FILTER, |body: String| {
            format!("{SPAN_START}{body}{SPAN_END}")
        });
        env.add_function(
            "raise_exception",
            |message: String| -> Result<Value, JinjaError> {
                Err(JinjaError::new(ErrorKind::InvalidOperation, message))
            },
        );
        env.add_function("strftime_now", strftime_now);
        env.add_template_owned(name.to_string(), rewritten)
            .map_err(|err| template_error(name, &err))?;
        Ok(ChatTemplate {
            name: name.to_string(),
            source: source.to_string(),
            env,
            tokens,
            end_of_turn,
            mask_source: if has_generation_tags {
                MaskSource::GenerationTags
            } else {
                MaskSource::PrefixRendering
            },
            content_format: detect_content_format(source),
        })
    }

    pub fn name(&self) -> &str {
        &self.name
    }

    /// The template text as found in the tokenizer directory.
    pub fn source(&self) -> &str {
        &self.source
    }

    pub fn mask_source(&self) -> MaskSource {
        self.mask_source
    }

    /// The rendered text only (what transformers' `apply_chat_template(tokenize=False)` returns).
    pub fn render_text(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<String, TokenizerError> {
        self.check_not_empty(messages)?;
        let raw = self.render_raw(messages, options.add_generation_prompt, &options.variables)?;
        Ok(self.split_spans(raw)?.text)
    }

    /// The rendered text and the byte spans of its assistant turns.
    pub fn render(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
    ) -> Result<RenderedChat, TokenizerError> {
        self.check_not_empty(messages)?;
        let raw = self.render_raw(messages, options.add_generation_prompt, &options.variables)?;
        let rendered = self.split_spans(raw)?;
        match self.mask_source {
            MaskSource::GenerationTags => Ok(rendered),
            MaskSource::PrefixRendering => {
                let spans = self.prefix_spans(messages, &options.variables, &rendered.text)?;
                Ok(RenderedChat {
                    text: rendered.text,
                    assistant_spans: spans,
                })
            }
        }
    }

    /// The template output, with span markers if the template has generation tags.
    fn render_raw(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
        variables: &BTreeMap<String, TemplateValue>,
    ) -> Result<String, TokenizerError> {
        let messages_json = serde_json::to_string(messages).unwrap_or_default();
        let variables_json = serde_json::to_string(variables).unwrap_or_default();
        if [messages_json, variables_json]
            .iter()
            .any(|s| s.contains([SPAN_START, SPAN_END]))
        {
            return Err(TokenizerError::Template {
                template: self.name.clone(),
                message:
                    "messages contain the noncharacters U+FDD0/U+FDD1, which mark assistant spans"
                        .into(),
            });
        }
        let mut context: BTreeMap<String, Value> = BTreeMap::new();
        for (key, token) in [
            ("bos_token", &self.tokens.bos),
            ("eos_token", &self.tokens.eos),
            ("pad_token", &self.tokens.pad),
            ("unk_token", &self.tokens.unk),
        ] {
            if let Some(token) = token {
                context.insert(key.into(), Value::from(token.as_str()));
            }
        }
        context.insert("tools".into(), Value::from(()));
        context.insert("documents".into(), Value::from(()));
        for (key, value) in variables {
            if key == "messages" || key == "add_generation_prompt" {
                return Err(TokenizerError::Template {
                    template: self.name.clone(),
                    message: format!(
                        "extra variable `{key}` would replace an argument of the template"
                    ),
                });
            }
            context.insert(key.clone(), value.clone());
        }
        let messages: Vec<Value> = messages.iter().map(|m| self.template_message(m)).collect();
        context.insert("messages".into(), Value::from(messages));
        context.insert(
            "add_generation_prompt".into(),
            Value::from(add_generation_prompt),
        );
        let template = self
            .env
            .get_template(&self.name)
            .map_err(|err| template_error(&self.name, &err))?;
        template
            .render(context)
            .map_err(|err| template_error(&self.name, &err))
    }

    /// The message as the template sees it, prepared as transformers 5.24 prepares it: keys whose
    /// value is none are left out (so `message.content is defined` is false for a null content),
    /// and reasoning given under any of [`REASONING_FIELDS`] is also set as `reasoning_content`
    /// and (unless given) `thinking`. Content parts are joined for templates that expect a string.
    fn template_message(&self, message: &ChatMessage) -> Value {
        let mut fields: Vec<(String, Value)> =
            vec![("role".into(), Value::from(message.role.as_str()))];
        match &message.content {
            None => {}
            Some(MessageContent::Text(text)) => {
                fields.push(("content".into(), Value::from(text.as_str())))
            }
            Some(content @ MessageContent::Parts(parts)) => {
                let value = match self.content_format {
                    ContentFormat::String => Value::from(content.joined_text()),
                    ContentFormat::OpenAi => Value::from(Serde(parts)),
                };
                fields.push(("content".into(), value));
            }
        }
        let present = |key: &str| {
            message
                .extra
                .get(key)
                .filter(|v| !v.is_none() && !v.is_undefined())
        };
        let reasoning = REASONING_FIELDS
            .iter()
            .find_map(|key| present(key))
            .cloned();
        for (key, value) in &message.extra {
            if value.is_none() || value.is_undefined() || key == "role" || key == "content" {
                continue;
            }
            if reasoning.is_some() && (key == "thinking" || key == "reasoning_content") {
                continue; // set below
            }
            fields.push((key.clone(), value.clone()));
        }
        if let Some(reasoning) = reasoning {
            let thinking = present("thinking")
                .cloned()
                .unwrap_or_else(|| reasoning.clone());
            fields.push(("thinking".into(), thinking));
            fields.push(("reasoning_content".into(), reasoning));
        }
        Value::from_pairs(fields)
    }

    /// Cuts the generation-span markers out of `raw`, returning their byte spans in the order
    /// the blocks closed (the order transformers records them in).
    fn split_spans(&self, raw: String) -> Result<RenderedChat, TokenizerError> {
        if !raw.contains([SPAN_START, SPAN_END]) {
            return Ok(RenderedChat {
                text: raw,
                assistant_spans: Vec::new(),
            });
        }
        let mut text = String::with_capacity(raw.len());
        let mut open: Vec<usize> = Vec::new();
        let mut spans = Vec::new();
        for ch in raw.chars() {
            match ch {
                SPAN_START => open.push(text.len()),
                SPAN_END => match open.pop() {
                    Some(start) => spans.push(start..text.len()),
                    None => {
                        return Err(
                            self.mask_error("a generation block closed that never opened".into())
                        );
                    }
                },
                c => text.push(c),
            }
        }
        if !open.is_empty() {
            return Err(self.mask_error("a generation block was never closed".into()));
        }
        Ok(RenderedChat {
            text,
            assistant_spans: spans,
        })
    }

    /// Assistant spans of a template without generation tags (see the module doc).
    fn prefix_spans(
        &self,
        messages: &[ChatMessage],
        variables: &BTreeMap<String, TemplateValue>,
        full_text: &str,
    ) -> Result<Vec<Range<usize>>, TokenizerError> {
        let mut spans = Vec::new();
        for (index, message) in messages.iter().enumerate() {
            if message.role != Role::Assistant {
                continue;
            }
            let before = self.render_raw(&messages[..index], true, variables)?;
            let through = self.render_raw(&messages[..=index], false, variables)?;
            if !through.starts_with(&before) || !full_text.starts_with(&through) {
                return Err(self.mask_error(format!(
                    "rendering messages[..{index}] is not a prefix of rendering the whole conversation, \
                     so assistant turns cannot be located; add {{% generation %}} tags to the template"
                )));
            }
            let turn = &through[before.len()..];
            let end = self
                .end_of_turn
                .iter()
                .filter(|token| !token.is_empty())
                .filter_map(|token| turn.rfind(token.as_str()).map(|at| at + token.len()))
                .max()
                .unwrap_or(turn.len());
            spans.push(before.len()..before.len() + end);
        }
        Ok(spans)
    }

    /// transformers refuses to render an empty conversation; so do the public entry points
    /// (prefix rendering renders empty prefixes internally).
    fn check_not_empty(&self, messages: &[ChatMessage]) -> Result<(), TokenizerError> {
        if messages.is_empty() {
            return Err(TokenizerError::Template {
                template: self.name.clone(),
                message: "cannot apply a chat template to an empty conversation".into(),
            });
        }
        Ok(())
    }

    fn mask_error(&self, message: String) -> TokenizerError {
        TokenizerError::AssistantMask {
            template: self.name.clone(),
            message,
        }
    }
}

/// Token mask from byte spans, with transformers 5.24's rule: a token is marked when its offsets
/// overlap a span (`token_start < span_end && token_end > span_start`), in one pass over tokens
/// and spans in order, as `apply_chat_template(return_assistant_tokens_mask=True)` does it. So
/// every byte-level token of a character split across tokens is marked. Byte offsets give the
/// same result as Python's character offsets because both are monotone in each other.
pub(crate) fn spans_to_token_mask(
    encoding: &tokenizers::Encoding,
    spans: &[Range<usize>],
) -> Vec<bool> {
    let mut mask = vec![false; encoding.get_ids().len()];
    let mut span_index = 0;
    for (token, &(token_start, token_end)) in encoding.get_offsets().iter().enumerate() {
        while span_index < spans.len() && token_start >= spans[span_index].end {
            span_index += 1;
        }
        if span_index == spans.len() {
            break;
        }
        if token_end > spans[span_index].start {
            mask[token] = true;
        }
    }
    mask
}

/// Rewrites `{% generation %}` / `{% endgeneration %}` (any whitespace control) into a filter block
/// that keeps the tag's position and `-`/`+` markers, so jinja's whitespace rules apply unchanged.
fn rewrite_generation_tags(source: &str) -> (String, bool) {
    let mut out = String::with_capacity(source.len());
    let mut found = false;
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        out.push_str(&rest[..open + 2]);
        rest = &rest[open + 2..];
        let control = rest.len() - rest.trim_start_matches(['-', '+']).len();
        let control = control.min(1);
        let after_control = &rest[control..];
        let inner = after_control.trim_start();
        let leading_ws = after_control.len() - inner.len();
        let ident_len = inner
            .find(|c: char| !(c.is_ascii_alphanumeric() || c == '_'))
            .unwrap_or(inner.len());
        let ident = &inner[..ident_len];
        let tail = inner[ident_len..].trim_start();
        let closes = tail.starts_with("%}") || tail.starts_with("-%}") || tail.starts_with("+%}");
        let replacement = match ident {
            "generation" if closes => Some(format!("filter {SPAN_FILTER}")),
            "endgeneration" if closes => Some("endfilter".to_string()),
            _ => None,
        };
        if let Some(replacement) = replacement {
            found = true;
            out.push_str(&rest[..control + leading_ws]);
            out.push_str(&replacement);
            rest = &inner[ident_len..];
        }
    }
    out.push_str(rest);
    (out, found)
}

/// Finds `{% for ... in <expr with content> %}`: the template walks content parts itself.
fn detect_content_format(source: &str) -> ContentFormat {
    let mut rest = source;
    while let Some(open) = rest.find("{%") {
        rest = &rest[open + 2..];
        let end = rest.find("%}").unwrap_or(rest.len());
        let tag = rest[..end].trim_matches(|c: char| c == '-' || c == '+' || c.is_whitespace());
        if let Some(loop_head) = tag.strip_prefix("for ")
            && let Some((_, iterable)) = loop_head.split_once(" in ")
            && iterable.contains("content")
        {
            return ContentFormat::OpenAi;
        }
    }
    ContentFormat::String
}

/// `strftime_now(fmt)`: the local time formatted with Python's strftime directives.
fn strftime_now(format: String) -> Result<String, JinjaError> {
    use chrono::format::{Item, StrftimeItems};
    let items: Vec<Item<'_>> = StrftimeItems::new(&format).collect();
    if items.iter().any(|item| matches!(item, Item::Error)) {
        return Err(JinjaError::new(
            ErrorKind::InvalidOperation,
            format!("strftime_now: unsupported format {format:?}"),
        ));
    }
    Ok(chrono::Local::now()
        .format_with_items(items.into_iter())
        .to_string())
}

fn template_error(name: &str, err: &JinjaError) -> TokenizerError {
    // The detail is the message of `raise_exception(...)` or minijinja's explanation; the line
    // tells where in the template it happened.
    let mut message = match err.detail() {
        Some(detail) => detail.to_string(),
        None => err.to_string(),
    };
    if let Some(line) = err.line() {
        message.push_str(&format!(" (template line {line})"));
    }
    TokenizerError::Template {
        template: name.to_string(),
        message,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generation_tags_are_rewritten_with_their_whitespace_control() {
        let (out, found) = rewrite_generation_tags(
            "a{%- generation %}b{% endgeneration -%}c{% if x %}{% endif %}",
        );
        assert!(found);
        assert_eq!(
            out,
            format!("a{{%- filter {SPAN_FILTER} %}}b{{% endfilter -%}}c{{% if x %}}{{% endif %}}")
        );
    }

    #[test]
    fn template_without_generation_tags_is_unchanged() {
        let source = "{% for m in messages %}{{ m.content }}{% endfor %}{% generation_x %}";
        assert_eq!(rewrite_generation_tags(source), (source.to_string(), false));
    }

    #[test]
    fn content_format_detects_loops_over_content() {
        assert_eq!(
            detect_content_format("{% for part in message['content'] %}{% endfor %}"),
            ContentFormat::OpenAi
        );
        assert_eq!(
            detect_content_format("{%- if '</think>' in content %}{% endif %}"),
            ContentFormat::String
        );
    }
}
