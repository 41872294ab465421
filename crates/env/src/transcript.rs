//! The token-exact record of an episode, and the rendering of environment messages as ids.
//!
//! An episode is one growing token sequence: the prompt (the opening messages rendered with the
//! generation prompt), then alternating segments of the model's sampled ids and the
//! environment's ids. The model's ids are kept exactly as sampled, with their log-probs and
//! weight versions; they are never decoded and encoded again. The environment's messages are
//! rendered through the chat template and appended as ids. So the trained sequence is the
//! sampled sequence by construction, and the loss mask is simply "was this segment sampled".
//!
//! How an environment segment is rendered ([`TurnRenderer::continuation_ids`]): with `history`
//! the conversation up to and including the model's last turn (its raw text as the assistant
//! message's content) and `new` the environment's messages,
//! - `A = render(history)` and `B = render(history + new, add_generation_prompt)`;
//! - `B` must start with `A` (the template does not rewrite earlier turns when messages
//!   follow);
//! - the model's turn ended on the end-of-turn token, so the ids must resume right after the
//!   last end-of-turn text in `A`: the segment is `encode(A[after that token..] + B[A.len()..])`
//!   (for ChatML, `"\n<|im_start|>tool\n...<|im_end|>\n<|im_start|>assistant\n"`).
//!
//! The segment depends only on how the template renders the conversation around the model's
//! turn, never on how it renders the model's content, so templates that reformat an assistant
//! message (reasoning moved into `<think>` blocks, tool calls re-serialized) still give exact
//! sequences.
//!
//! Template behaviours, by name:
//! - supported: ChatML-style and Llama-3-style turns; `<think>` blocks kept in the current
//!   turn's history; tools given as the template's `tools` variable; tool and user messages
//!   after an assistant turn;
//! - refused with [`EnvError::UnsupportedTemplate`]: a template that rewrites earlier turns when
//!   messages follow (`B` does not start with `A`, e.g. one that drops the reasoning of every
//!   assistant turn before the last one within the same user query), and a template whose
//!   assistant turn has no end-of-turn token (nowhere to resume).
//!
//! A conversation the template cannot render at all is an [`EnvError::Render`] naming the first
//! message index and role at which rendering fails, not a template line.

use std::collections::BTreeMap;

use serde_json::Value;
use stoke_tokenizer::chat::{ChatMessage, ChatOptions, ChatTemplate, TemplateValue};
use stoke_tokenizer::hf::Tokenizer;

use crate::environment::Opening;
use crate::error::EnvError;
use crate::tool::ToolSpec;

/// A run of tokens in an episode after the prompt.
#[derive(Clone, Debug, PartialEq)]
pub enum Segment {
    /// The model's sampled ids of one turn (ending on its end-of-turn token unless truncated).
    Model {
        ids: Vec<u32>,
        logprobs: Vec<f32>,
        versions: Vec<u64>,
        /// The turn decoded with special tokens kept, without the final end-of-turn token: the
        /// assistant message's content in the transcript.
        text: String,
    },
    /// The environment's messages, rendered by the template, plus the next generation prompt.
    Env {
        ids: Vec<u32>,
        messages: Vec<ChatMessage>,
    },
    /// The end-of-turn token that closes a model turn cut at its token limit, appended by the
    /// runner (not sampled, not trained) so the conversation can go on
    /// (`truncated_turns = "close"`). Always one id: the template's turn closer.
    Close { ids: Vec<u32> },
}

impl Segment {
    pub fn ids(&self) -> &[u32] {
        match self {
            Segment::Model { ids, .. } | Segment::Env { ids, .. } | Segment::Close { ids } => ids,
        }
    }

    pub fn is_model(&self) -> bool {
        matches!(self, Segment::Model { .. })
    }
}

/// One episode's sequence.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Transcript {
    pub opening: Opening,
    pub prompt_ids: Vec<u32>,
    pub segments: Vec<Segment>,
}

impl Transcript {
    /// Every id after the prompt, in order.
    pub fn completion_ids(&self) -> Vec<u32> {
        self.segments
            .iter()
            .flat_map(|s| s.ids().iter().copied())
            .collect()
    }

    /// Per completion id: sampled by the model.
    pub fn loss_mask(&self) -> Vec<bool> {
        self.segments
            .iter()
            .flat_map(|s| std::iter::repeat_n(s.is_model(), s.ids().len()))
            .collect()
    }

    /// Per completion id: its sampling log-prob (0 for environment ids).
    pub fn logprobs(&self) -> Vec<f32> {
        let mut out = Vec::new();
        for segment in &self.segments {
            match segment {
                Segment::Model { logprobs, .. } => out.extend_from_slice(logprobs),
                Segment::Env { ids, .. } | Segment::Close { ids } => {
                    out.extend(std::iter::repeat_n(0.0, ids.len()))
                }
            }
        }
        out
    }

    /// Per completion id: the weight version that produced it; environment ids repeat the
    /// version of the model id before them (so versions never decrease).
    pub fn versions(&self) -> Vec<u64> {
        let mut out: Vec<u64> = Vec::new();
        for segment in &self.segments {
            match segment {
                Segment::Model { versions, .. } => out.extend_from_slice(versions),
                Segment::Env { ids, .. } | Segment::Close { ids } => {
                    let last = out.last().copied().unwrap_or(0);
                    out.extend(std::iter::repeat_n(last, ids.len()));
                }
            }
        }
        out
    }

    /// The conversation: the opening, each model turn as an assistant message holding its raw
    /// text, and the environment's messages.
    pub fn messages(&self) -> Vec<ChatMessage> {
        let mut messages = self.opening.messages.clone();
        for segment in &self.segments {
            match segment {
                Segment::Model { text, .. } => messages.push(ChatMessage::assistant(text.clone())),
                Segment::Env { messages: env, .. } => messages.extend(env.iter().cloned()),
                Segment::Close { .. } => {}
            }
        }
        messages
    }

    /// Model turns taken.
    pub fn model_turns(&self) -> usize {
        self.segments.iter().filter(|s| s.is_model()).count()
    }

    /// The last model turn's text (the final answer), empty when there is none.
    pub fn final_text(&self) -> &str {
        self.segments
            .iter()
            .rev()
            .find_map(|s| match s {
                Segment::Model { text, .. } => Some(text.as_str()),
                Segment::Env { .. } | Segment::Close { .. } => None,
            })
            .unwrap_or("")
    }
}

/// Renders an episode's messages as ids with one tokenizer and template.
pub struct TurnRenderer<'a> {
    tokenizer: &'a Tokenizer,
    template: &'a ChatTemplate,
    variables: BTreeMap<String, TemplateValue>,
    end_of_turn: Vec<String>,
}

impl std::fmt::Debug for TurnRenderer<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TurnRenderer")
            .field("template", &self.template.name())
            .field("end_of_turn", &self.end_of_turn)
            .finish_non_exhaustive()
    }
}

/// Whether `template` renders the `tools` variable at all (its source names it).
pub fn template_renders_tools(template: &ChatTemplate) -> bool {
    template.source().contains("tools")
}

impl<'a> TurnRenderer<'a> {
    /// `tools` go to the template's `tools` variable (pass none when the template cannot render
    /// them and the environment describes them in its system prompt instead).
    pub fn new(
        tokenizer: &'a Tokenizer,
        template: &'a ChatTemplate,
        tools: &[ToolSpec],
    ) -> Result<TurnRenderer<'a>, EnvError> {
        let mut variables = BTreeMap::new();
        if !tools.is_empty() {
            let list: Vec<Value> = tools.iter().map(ToolSpec::to_openai).collect();
            let json = Value::Array(list).to_string();
            let value: TemplateValue = serde_json::from_str(&json)
                .map_err(|error| EnvError::config("tools", error.to_string()))?;
            variables.insert("tools".to_string(), value);
        }
        let end_of_turn: Vec<String> = tokenizer
            .eos_token_ids()
            .into_iter()
            .filter_map(|id| tokenizer.id_to_token(id))
            .collect();
        if end_of_turn.is_empty() {
            return Err(EnvError::UnsupportedTemplate {
                template: template.name().to_string(),
                behaviour: "a tokenizer without an end-of-turn (eos) token",
                detail: "multi-turn episodes resume after the model's end-of-turn token".into(),
            });
        }
        Ok(TurnRenderer {
            tokenizer,
            template,
            variables,
            end_of_turn,
        })
    }

    /// The end-of-turn token text the template closes an assistant turn with (the first of the
    /// tokenizer's eos texts that follows the content of a rendered assistant message), or
    /// None when no eos text follows it.
    pub fn turn_closer(&self) -> Option<&str> {
        const CONTENT: &str = "\u{2063}stoke-turn\u{2063}";
        let messages = [ChatMessage::user("x"), ChatMessage::assistant(CONTENT)];
        let text = self.render(&messages, false).ok()?;
        let after = &text[text.rfind(CONTENT)? + CONTENT.len()..];
        let after = after.trim_start_matches([' ', '\n']);
        self.end_of_turn
            .iter()
            .find(|token| after.starts_with(token.as_str()))
            .map(String::as_str)
    }

    /// The prompt ids of `opening`: rendered with the generation prompt, encoded without added
    /// special tokens (the template places BOS).
    pub fn prompt_ids(&self, opening: &[ChatMessage]) -> Result<Vec<u32>, EnvError> {
        let text = self.render(opening, true)?;
        self.encode(&text)
    }

    /// The ids that follow the model's last turn in `history` when the environment answers with
    /// `new` (see the module doc).
    pub fn continuation_ids(
        &self,
        history: &[ChatMessage],
        new: &[ChatMessage],
    ) -> Result<Vec<u32>, EnvError> {
        let text = self.continuation_text(history, new)?;
        self.encode(&text)
    }

    /// The text of [`TurnRenderer::continuation_ids`].
    pub fn continuation_text(
        &self,
        history: &[ChatMessage],
        new: &[ChatMessage],
    ) -> Result<String, EnvError> {
        let before = self.render(history, false)?;
        let mut all = history.to_vec();
        all.extend(new.iter().cloned());
        let after = self.render(&all, true)?;
        if !after.starts_with(&before) {
            let at = before
                .char_indices()
                .zip(after.chars())
                .find(|((_, a), b)| a != b)
                .map_or(before.len().min(after.len()), |((i, _), _)| i);
            return Err(EnvError::UnsupportedTemplate {
                template: self.template.name().to_string(),
                behaviour: "rewriting earlier turns when new messages follow",
                detail: format!(
                    "rendering {} messages changes the text of the first {} at byte {at} ({:?} became {:?})",
                    all.len(),
                    history.len(),
                    excerpt(&before, at),
                    excerpt(&after, at)
                ),
            });
        }
        let resume = self.after_last_end_of_turn(&before)?;
        Ok(format!("{}{}", &before[resume..], &after[before.len()..]))
    }

    /// Checks that `transcript` is what rendering its conversation gives: the prompt ids are the
    /// opening's, every environment segment's ids are its messages' continuation, and the
    /// decoded whole equals the template's rendering of the whole conversation (up to the last
    /// end-of-turn token when the episode ended on a model turn). The error says where it
    /// differs.
    pub fn verify(&self, transcript: &Transcript) -> Result<(), String> {
        let prompt = self
            .prompt_ids(&transcript.opening.messages)
            .map_err(|e| e.to_string())?;
        if prompt != transcript.prompt_ids {
            return Err("the prompt ids differ from the opening's rendering".into());
        }
        let mut history = transcript.opening.messages.clone();
        for (index, segment) in transcript.segments.iter().enumerate() {
            match segment {
                Segment::Model { text, .. } => history.push(ChatMessage::assistant(text.clone())),
                Segment::Close { ids } => {
                    let closer = self
                        .turn_closer()
                        .and_then(|t| self.tokenizer.token_to_id(t));
                    if closer.is_none() || ids[..] != [closer.unwrap_or_default()] {
                        return Err(format!(
                            "segment {index}: a closing segment that is not the template's turn closer"
                        ));
                    }
                }
                Segment::Env { ids, messages } => {
                    let expected = self
                        .continuation_ids(&history, messages)
                        .map_err(|e| e.to_string())?;
                    if &expected != ids {
                        return Err(format!(
                            "segment {index}: environment ids differ from the re-rendered messages"
                        ));
                    }
                    history.extend(messages.iter().cloned());
                }
            }
        }
        // The whole sequence decodes to the template's rendering of the conversation. A final
        // model turn that did not end on an end-of-turn token is compared up to its start, then
        // by its own text.
        let mut ids = transcript.prompt_ids.clone();
        ids.extend(transcript.completion_ids());
        let open_end = match transcript.segments.last() {
            Some(Segment::Model { ids: last, .. }) => {
                let closed = last
                    .last()
                    .and_then(|&id| self.tokenizer.id_to_token(id))
                    .is_some_and(|token| self.end_of_turn.contains(&token));
                (!closed).then_some(last.len())
            }
            _ => None,
        };
        let (compared, rendered) = match open_end {
            Some(open) => {
                let before = &ids[..ids.len() - open];
                history.pop();
                (
                    before,
                    self.render(&history, true).map_err(|e| e.to_string())?,
                )
            }
            None => {
                let ends_on_model = transcript.segments.last().is_some_and(Segment::is_model);
                let text = self
                    .render(&history, !ends_on_model)
                    .map_err(|e| e.to_string())?;
                let text = if ends_on_model {
                    let end = self
                        .after_last_end_of_turn(&text)
                        .map_err(|e| e.to_string())?;
                    text[..end].to_string()
                } else {
                    text
                };
                (&ids[..], text)
            }
        };
        let decoded = self
            .tokenizer
            .decode(compared, false)
            .map_err(|e| e.to_string())?;
        if decoded != rendered {
            let at = decoded
                .char_indices()
                .zip(rendered.chars())
                .find(|((_, a), b)| a != b)
                .map_or(decoded.len().min(rendered.len()), |((i, _), _)| i);
            return Err(format!(
                "the decoded sequence differs from the rendered conversation at byte {at}: {:?} vs {:?}",
                excerpt(&decoded, at),
                excerpt(&rendered, at)
            ));
        }
        if let (Some(open), Some(Segment::Model { text, .. })) =
            (open_end, transcript.segments.last())
        {
            let own = self
                .tokenizer
                .decode(&ids[ids.len() - open..], false)
                .map_err(|e| e.to_string())?;
            if &own != text {
                return Err("the last model turn's text is not its ids' decoding".into());
            }
        }
        Ok(())
    }

    fn render(
        &self,
        messages: &[ChatMessage],
        add_generation_prompt: bool,
    ) -> Result<String, EnvError> {
        let options = ChatOptions {
            add_generation_prompt,
            variables: self.variables.clone(),
        };
        match self.template.render_text(messages, &options) {
            Ok(text) => Ok(text),
            Err(error) => Err(self.locate_render_error(messages, &options, error.to_string())),
        }
    }

    /// The first message at which rendering a prefix fails, with the template's message.
    fn locate_render_error(
        &self,
        messages: &[ChatMessage],
        options: &ChatOptions,
        whole: String,
    ) -> EnvError {
        let options = ChatOptions {
            add_generation_prompt: false,
            ..options.clone()
        };
        for end in 1..=messages.len() {
            if let Err(error) = self.template.render_text(&messages[..end], &options) {
                return EnvError::Render {
                    index: end - 1,
                    role: messages[end - 1].role.as_str().to_string(),
                    message: error.to_string(),
                };
            }
        }
        let last = messages.len().saturating_sub(1);
        EnvError::Render {
            index: last,
            role: messages
                .get(last)
                .map_or("none", |m| m.role.as_str())
                .to_string(),
            message: whole,
        }
    }

    /// The byte just after the last end-of-turn token text in `text`.
    fn after_last_end_of_turn(&self, text: &str) -> Result<usize, EnvError> {
        self.end_of_turn
            .iter()
            .filter_map(|token| text.rfind(token.as_str()).map(|at| at + token.len()))
            .max()
            .ok_or_else(|| EnvError::UnsupportedTemplate {
                template: self.template.name().to_string(),
                behaviour: "an assistant turn without an end-of-turn token",
                detail: format!(
                    "none of {:?} closes the rendered assistant turn",
                    self.end_of_turn
                ),
            })
    }

    fn encode(&self, text: &str) -> Result<Vec<u32>, EnvError> {
        self.tokenizer
            .encode(text, false)
            .map_err(|e| EnvError::Tokenizer(e.to_string()))
    }
}

/// A few characters of `text` around byte `at`, for error messages.
fn excerpt(text: &str, at: usize) -> String {
    let mut start = at.saturating_sub(20);
    while !text.is_char_boundary(start) {
        start -= 1;
    }
    let mut end = (at + 20).min(text.len());
    while !text.is_char_boundary(end) {
        end += 1;
    }
    text[start..end].to_string()
}
