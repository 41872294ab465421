//! Training tasks for GRPO: JSONL files of prompts with reference data, turned into [`Task`]
//! records (prompt text for the verifier, prompt token ids for the policy, the reference, and
//! the index of the reward that scores them).
//!
//! One JSON object per line:
//!
//! ```json
//! {"id": "gsm8k-12", "prompt": "What is 2 + 3?", "answer": "5"}
//! {"messages": [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "..."}],
//!  "reward": "code", "tests": "def check(f): ...", "entry_point": "f"}
//! ```
//!
//! - `prompt` (a string) or `messages` (OpenAI-style chat messages), exactly one of them.
//!   Messages are rendered with the tokenizer's chat template with the generation prompt; a plain
//!   prompt is rendered as one user message when the tokenizer has a chat template, else
//!   tokenized as raw text (with the tokenizer's own special tokens, e.g. BOS). The verifier sees
//!   the plain prompt, or the last user message of a conversation.
//! - `id` (string or number): default `FILE:LINE`.
//! - `reward`: the name of a configured reward; default: index 0 (`default`).
//! - reference fields, flattened as `stoke_reward::Reference` names them: `answer` (a string or
//!   a number), `tests`, `entry_point`, `cases`, `schema`, `constraints`.
//! - other fields are ignored (datasets carry their own bookkeeping).
//!
//! A line that cannot be used (blank, bad JSON, not an object, no prompt, malformed messages or
//! reference fields, a chat template error, no tokens) is skipped and reported with its line
//! number and why; the load fails only when no line is usable. A `reward` name that is not
//! configured is an error naming the line: it is a configuration mistake, not a bad record, and
//! skipping it would silently train on a different task mix.
//!
//! What this is not: no batching, shuffling or epochs (the run's scheduler draws tasks), and no
//! arithmetic generation (the CLI draws `stoke_eval` problems and passes them to [`chat_task`]).

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde_json::{Map, Value};
use stoke_reward::Reference;
use stoke_tokenizer::chat::{ChatMessage, ChatOptions, Role};
use stoke_tokenizer::hf::Tokenizer;

use crate::error::PipelineError;
use crate::records::Task;

/// The keys of `stoke_reward::Reference`, read from the top level of a task line.
const REFERENCE_KEYS: [&str; 6] = [
    "answer",
    "tests",
    "entry_point",
    "cases",
    "schema",
    "constraints",
];

/// What loading a JSONL task file found.
#[derive(Clone, Debug)]
pub struct TaskLoad {
    pub tasks: Vec<Arc<Task>>,
    /// (1-based line, why) of every line that was not used.
    pub skipped: Vec<(usize, String)>,
    /// Lines read (blank ones included).
    pub lines: usize,
}

impl TaskLoad {
    /// One line for logs: counts and the first skipped lines with `file:line`.
    pub fn summary(&self, path: &Path) -> String {
        let mut text = format!(
            "{}: {} tasks from {} lines, {} skipped",
            path.display(),
            self.tasks.len(),
            self.lines,
            self.skipped.len()
        );
        for (line, why) in self.skipped.iter().take(3) {
            text.push_str(&format!("; {}:{line}: {why}", path.display()));
        }
        text
    }
}

/// Reads every line of `path`; `reward_names` are the configured rewards in index order.
pub fn load_tasks(
    path: &Path,
    tokenizer: &Tokenizer,
    reward_names: &[String],
) -> Result<TaskLoad, PipelineError> {
    let bytes = std::fs::read(path).map_err(|e| PipelineError::io(path, e))?;
    let file_name = path
        .file_name()
        .map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| path.display().to_string());
    let mut load = TaskLoad {
        tasks: Vec::new(),
        skipped: Vec::new(),
        lines: 0,
    };
    let mut pieces: Vec<&[u8]> = bytes.split(|&b| b == b'\n').collect();
    // A final newline leaves an empty last piece that is not a line.
    if pieces.last().is_some_and(|last| last.is_empty()) {
        pieces.pop();
    }
    for (index, raw) in pieces.into_iter().enumerate() {
        let line = index + 1;
        load.lines = line;
        let parsed = std::str::from_utf8(raw)
            .map_err(|_| LineError::Skip("not valid UTF-8".into()))
            .and_then(|text| parse_line(text, line, &file_name, tokenizer, reward_names));
        match parsed {
            Ok(task) => load.tasks.push(Arc::new(task)),
            Err(LineError::Skip(why)) => load.skipped.push((line, why)),
            Err(LineError::Fatal(reason)) => {
                return Err(PipelineError::Task {
                    file: path.to_path_buf(),
                    line,
                    reason,
                });
            }
        }
    }
    if load.tasks.is_empty() {
        let (line, reason) = match load.skipped.first() {
            Some((line, why)) => (
                *line,
                format!(
                    "no usable task in {} lines ({} skipped; the first: {why})",
                    load.lines,
                    load.skipped.len()
                ),
            ),
            None => (0, "the file holds no task".to_string()),
        };
        return Err(PipelineError::Task {
            file: PathBuf::from(path),
            line,
            reason,
        });
    }
    Ok(load)
}

/// A task whose prompt is one user message (`question`), rendered like a JSONL `prompt`; its
/// reward is index 0. The CLI builds the arithmetic tasks with it.
pub fn chat_task(
    id: String,
    question: &str,
    reference: Reference,
    tokenizer: &Tokenizer,
) -> Result<Task, PipelineError> {
    let prompt_ids = render_plain_prompt(question, tokenizer)?;
    if prompt_ids.is_empty() {
        return Err(PipelineError::config(
            format!("task {id}"),
            "the prompt renders to no tokens",
        ));
    }
    Ok(Task {
        id,
        prompt: question.to_string(),
        prompt_ids,
        reference,
        reward: 0,
        data: Default::default(),
    })
}

enum LineError {
    /// The line is skipped and reported.
    Skip(String),
    /// The load stops (a configuration mistake).
    Fatal(String),
}

fn skip(why: impl Into<String>) -> LineError {
    LineError::Skip(why.into())
}

fn parse_line(
    text: &str,
    line: usize,
    file_name: &str,
    tokenizer: &Tokenizer,
    reward_names: &[String],
) -> Result<Task, LineError> {
    let text = text.trim_end_matches('\r');
    if text.trim().is_empty() {
        return Err(skip("blank line"));
    }
    let value: Value =
        serde_json::from_str(text).map_err(|e| skip(format!("invalid JSON: {e}")))?;
    let Value::Object(object) = value else {
        return Err(skip("not a JSON object"));
    };

    let reward = match object.get("reward") {
        None | Some(Value::Null) => 0,
        Some(Value::String(name)) => reward_names
            .iter()
            .position(|known| known == name)
            .ok_or_else(|| {
                LineError::Fatal(format!(
                    "reward `{name}` is not configured (configured: {})",
                    reward_names.join(", ")
                ))
            })?,
        Some(other) => return Err(skip(format!("`reward` must be a string, got {other}"))),
    };
    let id = match object.get("id") {
        None | Some(Value::Null) => format!("{file_name}:{line}"),
        Some(Value::String(id)) => id.clone(),
        Some(Value::Number(n)) => n.to_string(),
        Some(other) => {
            return Err(skip(format!(
                "`id` must be a string or number, got {other}"
            )));
        }
    };
    let reference = reference_of(&object)?;

    let (prompt, prompt_ids) = match (object.get("prompt"), object.get("messages")) {
        (Some(_), Some(_)) => return Err(skip("set either `prompt` or `messages`, not both")),
        (None, None) => return Err(skip("no `prompt` or `messages` field")),
        (Some(Value::String(prompt)), None) => {
            if prompt.trim().is_empty() {
                return Err(skip("`prompt` is empty"));
            }
            let ids = render_plain_prompt(prompt, tokenizer).map_err(|e| skip(e.to_string()))?;
            (prompt.clone(), ids)
        }
        (Some(_), None) => return Err(skip("`prompt` must be a string")),
        (None, Some(messages)) => render_messages(messages, tokenizer)?,
    };
    if prompt_ids.is_empty() {
        return Err(skip("the prompt renders to no tokens"));
    }
    Ok(Task {
        id,
        prompt,
        prompt_ids,
        reference,
        reward,
        data: Default::default(),
    })
}

/// The reference fields of a line (`answer` may be a number: GSM8K-style files write them so).
fn reference_of(object: &Map<String, Value>) -> Result<Reference, LineError> {
    let mut fields = Map::new();
    for key in REFERENCE_KEYS {
        match object.get(key) {
            None | Some(Value::Null) => {}
            Some(Value::Number(n)) if key == "answer" => {
                fields.insert(key.to_string(), Value::String(n.to_string()));
            }
            Some(value) => {
                fields.insert(key.to_string(), value.clone());
            }
        }
    }
    serde_json::from_value(Value::Object(fields))
        .map_err(|e| skip(format!("malformed reference field: {e}")))
}

/// A plain prompt: one user message through the chat template, or raw text without one.
fn render_plain_prompt(prompt: &str, tokenizer: &Tokenizer) -> Result<Vec<u32>, PipelineError> {
    if tokenizer.chat_template().is_some() {
        let options = ChatOptions {
            add_generation_prompt: true,
            ..ChatOptions::default()
        };
        Ok(tokenizer
            .apply_chat_template(&[ChatMessage::user(prompt)], &options)?
            .ids)
    } else {
        Ok(tokenizer.encode(prompt, true)?)
    }
}

/// A conversation: rendered with the generation prompt; the verifier's prompt is the last user
/// message.
fn render_messages(
    messages: &Value,
    tokenizer: &Tokenizer,
) -> Result<(String, Vec<u32>), LineError> {
    let Value::Array(items) = messages else {
        return Err(skip("`messages` is not a list"));
    };
    if items.is_empty() {
        return Err(skip("`messages` is empty"));
    }
    let mut parsed = Vec::with_capacity(items.len());
    for (index, item) in items.iter().enumerate() {
        let message: ChatMessage = serde_json::from_value(item.clone())
            .map_err(|e| skip(format!("messages[{index}]: {e}")))?;
        parsed.push(message);
    }
    if parsed.last().is_some_and(|m| m.role == Role::Assistant) {
        return Err(skip(
            "the last message is an assistant turn (the policy writes that turn)",
        ));
    }
    let prompt = parsed
        .iter()
        .rev()
        .find(|m| m.role == Role::User)
        .and_then(|m| m.content.as_ref())
        .map(|content| content.joined_text())
        .ok_or_else(|| skip("no user message with content"))?;
    if tokenizer.chat_template().is_none() {
        return Err(skip(
            "`messages` need a chat template and the tokenizer has none (use `prompt`)",
        ));
    }
    let options = ChatOptions {
        add_generation_prompt: true,
        ..ChatOptions::default()
    };
    let encoding = tokenizer
        .apply_chat_template(&parsed, &options)
        .map_err(|e| skip(format!("chat template: {e}")))?;
    Ok((prompt, encoding.ids))
}
