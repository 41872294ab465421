//! Reading chat JSONL for [`super::ChatSource`]: each line is parsed as a chat record
//! (`{"messages": [...]}`, other top-level fields ignored), rendered with the tokenizer's chat
//! template into token ids and an assistant-token mask, and truncated to one row. A line with
//! `"prompt_ids"` and `"completion_ids"` (what `stoke rft` and `stoke distill generate` write: the
//! prompt as the model was given it and the tokens it sampled) is taken as those ids, the
//! completion the trained part, with no rendering or retokenization; its `messages` are then not
//! read. A line that
//! cannot be used becomes a [`SkippedLine`] naming the file, the 1-based line and the reason;
//! nothing is dropped silently and nothing panics. [`ChatLoadReport`] counts what was kept,
//! skipped and truncated.
//!
//! What this is not: no packing, order or masks of batches (`chat.rs`), no streaming of files too
//! big for memory.

use std::fmt;
use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Deserialize;
use stoke_tokenizer::chat::{ChatMessage, ChatOptions, Role};
use stoke_tokenizer::hf::Tokenizer;

use super::SourceError;

/// Why a JSONL line was not used.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum SkipReason {
    BlankLine,
    InvalidUtf8,
    InvalidJson(String),
    NotAnObject,
    MissingMessages,
    MessagesNotAList,
    UnknownRole {
        message: usize,
        role: String,
    },
    BadMessage(String),
    EmptyConversation,
    NoAssistantTurn,
    /// The chat template refused the conversation (e.g. roles that do not alternate).
    Template(String),
    /// `prompt_ids`/`completion_ids` unusable: only one given, empty, or an id outside the
    /// tokenizer's vocabulary.
    TokenIds(String),
    /// After truncation to `seq_len + 1` tokens no assistant token is left as a target.
    NoTrainableTokens {
        tokens: usize,
    },
}

impl fmt::Display for SkipReason {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            SkipReason::BlankLine => write!(f, "blank line"),
            SkipReason::InvalidUtf8 => write!(f, "not valid UTF-8"),
            SkipReason::InvalidJson(err) => write!(f, "invalid JSON: {err}"),
            SkipReason::NotAnObject => write!(f, "not a JSON object"),
            SkipReason::MissingMessages => write!(f, "no `messages` field"),
            SkipReason::MessagesNotAList => write!(f, "`messages` is not a list"),
            SkipReason::UnknownRole { message, role } => {
                write!(f, "messages[{message}]: unknown role {role}")
            }
            SkipReason::BadMessage(err) => write!(f, "malformed message: {err}"),
            SkipReason::EmptyConversation => write!(f, "`messages` is empty"),
            SkipReason::NoAssistantTurn => write!(f, "no assistant message (nothing to train on)"),
            SkipReason::Template(err) => write!(f, "chat template: {err}"),
            SkipReason::TokenIds(err) => write!(f, "token ids: {err}"),
            SkipReason::NoTrainableTokens { tokens } => write!(
                f,
                "no assistant token within the first row ({tokens} tokens rendered)"
            ),
        }
    }
}

/// One unused line, with where it is.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SkippedLine {
    pub path: PathBuf,
    /// 1-based line number.
    pub line: usize,
    pub reason: SkipReason,
}

impl fmt::Display for SkippedLine {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}: {}", self.path.display(), self.line, self.reason)
    }
}

/// What loading the JSONL found.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ChatLoadReport {
    pub path: PathBuf,
    pub lines: usize,
    pub conversations: usize,
    pub skipped: Vec<SkippedLine>,
    /// 1-based lines of the conversations cut to `seq_len + 1` tokens.
    pub truncated_lines: Vec<usize>,
    /// Tokens dropped by truncation.
    pub truncated_tokens: u64,
    /// Tokens kept over all conversations.
    pub tokens: u64,
    /// Targets trained per epoch (assistant tokens that follow a token of the same conversation).
    pub trained_tokens: u64,
}

impl ChatLoadReport {
    /// One line for logs: counts, plus the first skipped lines.
    pub fn summary(&self) -> String {
        let mut text = format!(
            "{}: {} conversations from {} lines, {} skipped, {} truncated ({} tokens dropped); {} tokens, {} trained",
            self.path.display(),
            self.conversations,
            self.lines,
            self.skipped.len(),
            self.truncated_lines.len(),
            self.truncated_tokens,
            self.tokens,
            self.trained_tokens
        );
        for skipped in self.skipped.iter().take(3) {
            text.push_str(&format!("; {skipped}"));
        }
        text
    }
}

/// A rendered conversation, truncated to one row.
pub(super) struct Conversation {
    pub(super) ids: Vec<u32>,
    pub(super) assistant: Vec<bool>,
    /// The teacher's top-k for the completion of a token-id line that carries them.
    pub(super) topk: Option<super::teacher_topk::StoredTopK>,
}

/// The typed form of one line; unknown top-level fields are ignored.
#[derive(Deserialize)]
struct ChatRecord {
    /// Required unless the line carries token ids.
    messages: Option<Vec<ChatMessage>>,
    prompt_ids: Option<Vec<u32>>,
    completion_ids: Option<Vec<u32>>,
    /// One list of k ids per completion token (with `teacher_topk_logprobs`).
    teacher_topk_ids: Option<Vec<Vec<u32>>>,
    /// One list of k log-probs per completion token; `null` where the teacher gave fewer.
    teacher_topk_logprobs: Option<Vec<Vec<Option<f32>>>>,
}

/// A line's `teacher_topk_ids` and `teacher_topk_logprobs`, as parsed.
type TopKFields = (Option<Vec<Vec<u32>>>, Option<Vec<Vec<Option<f32>>>>);

/// A rendered line: ids, assistant mask and, for a token-id line, the teacher's top-k.
type Rendered = (Vec<u32>, Vec<bool>, Option<super::teacher_topk::StoredTopK>);

/// Reads, renders and truncates every line; returns the usable conversations and the report.
pub(super) fn load(
    path: &Path,
    tokenizer: &Tokenizer,
    row_tokens: usize,
) -> Result<(Vec<Conversation>, ChatLoadReport), SourceError> {
    let io_error = |source| SourceError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut reader = BufReader::new(File::open(path).map_err(io_error)?);
    let mut report = ChatLoadReport {
        path: path.to_path_buf(),
        ..Default::default()
    };
    let mut conversations = Vec::new();
    let mut bytes = Vec::new();
    // The k of the first line with a teacher top-k; later lines must match it.
    let mut topk_width: Option<usize> = None;
    loop {
        bytes.clear();
        if reader.read_until(b'\n', &mut bytes).map_err(io_error)? == 0 {
            break;
        }
        report.lines += 1;
        let line = report.lines;
        let rendered = std::str::from_utf8(&bytes)
            .map_err(|_| SkipReason::InvalidUtf8)
            .and_then(|text| render_line(text, tokenizer))
            .and_then(|rendered| match (&rendered.2, topk_width) {
                (Some(topk), Some(k)) if topk.k != k => Err(SkipReason::TokenIds(format!(
                    "teacher top-k of {} entries per token, but earlier lines have {k}",
                    topk.k
                ))),
                _ => Ok(rendered),
            });
        let (mut ids, mut assistant, mut topk) = match rendered {
            Ok(encoded) => encoded,
            Err(reason) => {
                report.skipped.push(SkippedLine {
                    path: path.to_path_buf(),
                    line,
                    reason,
                });
                continue;
            }
        };
        let rendered_tokens = ids.len();
        if rendered_tokens > row_tokens {
            ids.truncate(row_tokens);
            assistant.truncate(row_tokens);
            if let Some(topk) = &mut topk {
                // Completion tokens past the row have no position; their rows are dropped.
                let kept = row_tokens.saturating_sub(topk.prompt_len) * topk.k;
                topk.ids.truncate(kept);
                topk.logprobs.truncate(kept);
            }
        }
        // Position 0 is never a target; a conversation needs an assistant token after it.
        let trained = assistant.iter().skip(1).filter(|&&a| a).count();
        if trained == 0 {
            report.skipped.push(SkippedLine {
                path: path.to_path_buf(),
                line,
                reason: SkipReason::NoTrainableTokens {
                    tokens: rendered_tokens,
                },
            });
            continue;
        }
        if rendered_tokens > row_tokens {
            report.truncated_lines.push(line);
            report.truncated_tokens += (rendered_tokens - row_tokens) as u64;
        }
        report.tokens += ids.len() as u64;
        report.trained_tokens += trained as u64;
        if let Some(topk) = &topk {
            topk_width.get_or_insert(topk.k);
        }
        conversations.push(Conversation {
            ids,
            assistant,
            topk,
        });
    }
    report.conversations = conversations.len();
    Ok((conversations, report))
}

/// One line to (ids, assistant mask), or why it cannot be used.
fn render_line(text: &str, tokenizer: &Tokenizer) -> Result<Rendered, SkipReason> {
    let text = text.trim_end_matches(['\n', '\r']);
    if text.trim().is_empty() {
        return Err(SkipReason::BlankLine);
    }
    let record: ChatRecord = serde_json::from_str(text).map_err(|err| classify(text, err))?;
    let topk = (record.teacher_topk_ids, record.teacher_topk_logprobs);
    match (record.prompt_ids, record.completion_ids) {
        (Some(prompt), Some(completion)) => {
            let prompt_len = prompt.len();
            let completion_len = completion.len();
            let (ids, assistant) = token_ids(prompt, completion, tokenizer)?;
            let topk = teacher_topk(topk, prompt_len, completion_len, tokenizer)?;
            return Ok((ids, assistant, topk));
        }
        (Some(_), None) => {
            return Err(SkipReason::TokenIds(
                "`prompt_ids` without `completion_ids`".into(),
            ));
        }
        (None, Some(_)) => {
            return Err(SkipReason::TokenIds(
                "`completion_ids` without `prompt_ids`".into(),
            ));
        }
        (None, None) => {}
    }
    if topk.0.is_some() || topk.1.is_some() {
        return Err(SkipReason::TokenIds(
            "teacher top-k need `prompt_ids` and `completion_ids` (they are per completion token)"
                .into(),
        ));
    }
    let Some(messages) = record.messages else {
        return Err(SkipReason::MissingMessages);
    };
    if messages.is_empty() {
        return Err(SkipReason::EmptyConversation);
    }
    if !messages.iter().any(|m| m.role == Role::Assistant) {
        return Err(SkipReason::NoAssistantTurn);
    }
    let encoding = tokenizer
        .apply_chat_template(&messages, &ChatOptions::default())
        .map_err(|err| SkipReason::Template(err.to_string()))?;
    Ok((encoding.ids, encoding.assistant_mask, None))
}

/// A token-id line's teacher top-k, checked: both lists or neither, one entry per completion
/// token, the same k (at least 1) at every token, ids inside the vocabulary, log-probs <= 0.
fn teacher_topk(
    (ids, logprobs): TopKFields,
    prompt_len: usize,
    completion_len: usize,
    tokenizer: &Tokenizer,
) -> Result<Option<super::teacher_topk::StoredTopK>, SkipReason> {
    let bad = |message: String| Err(SkipReason::TokenIds(message));
    let (ids, logprobs) = match (ids, logprobs) {
        (None, None) => return Ok(None),
        (Some(ids), Some(logprobs)) => (ids, logprobs),
        _ => {
            return bad("`teacher_topk_ids` and `teacher_topk_logprobs` come together".into());
        }
    };
    if ids.len() != completion_len || logprobs.len() != completion_len {
        return bad(format!(
            "teacher top-k for {} and {} tokens, but the completion has {completion_len}",
            ids.len(),
            logprobs.len()
        ));
    }
    let k = ids.first().map_or(0, Vec::len);
    if k == 0 {
        return bad("`teacher_topk_ids` has no entry".into());
    }
    let vocab = tokenizer.vocab_size();
    let mut flat_ids = Vec::with_capacity(k * completion_len);
    let mut flat_logprobs = Vec::with_capacity(k * completion_len);
    for (t, (row_ids, row_logprobs)) in ids.iter().zip(&logprobs).enumerate() {
        if row_ids.len() != k || row_logprobs.len() != k {
            return bad(format!(
                "teacher top-k at completion token {t}: {} ids and {} log-probs, not {k}",
                row_ids.len(),
                row_logprobs.len()
            ));
        }
        for (&id, &logprob) in row_ids.iter().zip(row_logprobs) {
            if id as usize >= vocab {
                return bad(format!(
                    "`teacher_topk_ids[{t}]` holds {id}, outside the tokenizer's {vocab} ids"
                ));
            }
            let logprob = logprob.unwrap_or(f32::NEG_INFINITY);
            if logprob.is_nan() || logprob > 1e-4 {
                return bad(format!(
                    "`teacher_topk_logprobs[{t}]` holds {logprob}, not a log-probability"
                ));
            }
            flat_ids.push(id);
            flat_logprobs.push(logprob.min(0.0));
        }
    }
    Ok(Some(super::teacher_topk::StoredTopK {
        prompt_len,
        k,
        ids: flat_ids,
        logprobs: flat_logprobs,
    }))
}

/// A line's own token ids: the prompt (not trained) then the completion (trained), checked
/// against the vocabulary.
fn token_ids(
    prompt: Vec<u32>,
    completion: Vec<u32>,
    tokenizer: &Tokenizer,
) -> Result<(Vec<u32>, Vec<bool>), SkipReason> {
    if prompt.is_empty() {
        return Err(SkipReason::TokenIds("`prompt_ids` is empty".into()));
    }
    if completion.is_empty() {
        return Err(SkipReason::TokenIds("`completion_ids` is empty".into()));
    }
    let vocab = tokenizer.vocab_size();
    for (field, ids) in [("prompt_ids", &prompt), ("completion_ids", &completion)] {
        if let Some((index, id)) = ids
            .iter()
            .enumerate()
            .find(|&(_, &id)| id as usize >= vocab)
        {
            return Err(SkipReason::TokenIds(format!(
                "`{field}[{index}]` is {id}, outside the tokenizer's {vocab} ids (data from \
                 another tokenizer?)"
            )));
        }
    }
    let mut assistant = vec![false; prompt.len()];
    assistant.resize(prompt.len() + completion.len(), true);
    let mut ids = prompt;
    ids.extend(completion);
    Ok((ids, assistant))
}

/// Names what is wrong with a line that does not parse as a chat record.
fn classify(text: &str, typed_error: serde_json::Error) -> SkipReason {
    let value: serde_json::Value = match serde_json::from_str(text) {
        Ok(value) => value,
        Err(err) => return SkipReason::InvalidJson(err.to_string()),
    };
    let Some(object) = value.as_object() else {
        return SkipReason::NotAnObject;
    };
    let Some(messages) = object.get("messages") else {
        return SkipReason::MissingMessages;
    };
    let Some(messages) = messages.as_array() else {
        return SkipReason::MessagesNotAList;
    };
    for (index, message) in messages.iter().enumerate() {
        let Some(role) = message.get("role") else {
            return SkipReason::BadMessage(format!("messages[{index}] has no role"));
        };
        if serde_json::from_value::<Role>(role.clone()).is_err() {
            return SkipReason::UnknownRole {
                message: index,
                role: role.to_string(),
            };
        }
    }
    SkipReason::BadMessage(typed_error.to_string())
}
