//! Preference data: JSONL files of pairs (`prompt`, `chosen`, `rejected`) for DPO, CPO/SimPO and
//! ORPO, or of unpaired labels (`prompt`, `completion`, `label`) for KTO, tokenized in token space.
//!
//! Fields are OpenAI messages or plain strings, as TRL takes them: `prompt` a list of messages
//! (or a string, one user message) and `chosen`/`rejected`/`completion` a list of assistant
//! messages (or a string, one assistant message). With a chat template, the prompt is rendered
//! once with the generation prompt, exactly the ids a sampler would continue from, and each
//! response is the text the template adds after it when the conversation continues with that
//! response (including the end-of-turn marker), tokenized on its own and appended as ids. So
//! the prompt's ids never depend on the response (no BPE merge across the join, TRL #2054), and
//! the pair's two sequences share the prompt prefix token for token. Without a chat template the
//! texts are used raw and each response ends with the EOS token.
//!
//! A line may instead carry the token ids themselves (`prompt_ids`, `chosen_ids`,
//! `rejected_ids`, as `stoke rft` writes them for the policy's own samples); they are used as
//! given, so they must come from the run's tokenizer.
//!
//! Bad input: a line that is not JSON, misses or has an empty `prompt`/`chosen`/`rejected`/
//! `completion`, has a non-boolean `label`, or a prompt of `max_len` tokens or more is an error
//! naming the file and the line. By default such lines are skipped and counted
//! ([`ReadReport`]); with `strict` the first one fails the read. A response that would run past
//! `max_len` is cut to fit (TRL's `keep_start`) and counted. A run never sees a half-read pair:
//! a line becomes an example only when every field tokenized.

use std::path::Path;

use serde_json::Value;
use stoke_tokenizer::chat::{ChatMessage, ChatOptions, Role};
use stoke_tokenizer::hf::Tokenizer;

use crate::error::TrainError;

/// A tokenized preference pair.
#[derive(Clone, Debug, PartialEq)]
pub struct PreferencePair {
    pub prompt_ids: Vec<u32>,
    pub chosen_ids: Vec<u32>,
    pub rejected_ids: Vec<u32>,
    /// The line's optional `margin` (how much better chosen is; reward-model training
    /// subtracts it, as TRL's `RewardTrainer` does).
    pub margin: Option<f64>,
    /// 1-based line in its file.
    pub line: usize,
}

/// A tokenized KTO example.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct LabelledCompletion {
    pub prompt_ids: Vec<u32>,
    pub completion_ids: Vec<u32>,
    /// Desirable (true) or undesirable.
    pub label: bool,
    pub line: usize,
}

/// What a read kept and dropped.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ReadReport {
    /// Examples read.
    pub examples: usize,
    /// `file:line: reason` of every skipped line.
    pub skipped: Vec<String>,
    /// Responses cut to fit `max_len`.
    pub truncated: usize,
}

/// How lines are tokenized.
#[derive(Clone, Copy, Debug)]
pub struct ReadOptions {
    /// Longest prompt + response, in tokens.
    pub max_len: usize,
    /// Fail on the first bad line instead of skipping it.
    pub strict: bool,
}

/// Reads preference pairs from `path`.
pub fn read_pairs(
    path: &Path,
    tokenizer: &Tokenizer,
    options: ReadOptions,
) -> Result<(Vec<PreferencePair>, ReadReport), TrainError> {
    read_lines(path, options, |value, line, report| {
        let (prompt_ids, mut chosen_ids, mut rejected_ids) = if value.get("prompt_ids").is_some() {
            (
                id_field(value, "prompt_ids")?,
                id_field(value, "chosen_ids")?,
                id_field(value, "rejected_ids")?,
            )
        } else {
            let prompt = prompt_field(value)?;
            let chosen = response_field(value, "chosen")?;
            let rejected = response_field(value, "rejected")?;
            let rendered = encode_prompt(tokenizer, &prompt)?;
            check_prompt(&rendered.ids, options.max_len)?;
            let chosen = encode_response(tokenizer, &prompt, &rendered, &chosen, "chosen")?;
            let rejected = encode_response(tokenizer, &prompt, &rendered, &rejected, "rejected")?;
            (rendered.ids, chosen, rejected)
        };
        check_prompt(&prompt_ids, options.max_len)?;
        let room = options.max_len - prompt_ids.len();
        fit(&mut chosen_ids, room, report);
        fit(&mut rejected_ids, room, report);
        let margin = match value.get("margin") {
            None | Some(Value::Null) => None,
            Some(m) => Some(
                m.as_f64()
                    .filter(|m| m.is_finite())
                    .ok_or_else(|| format!("`margin` must be a finite number, got {m}"))?,
            ),
        };
        Ok(PreferencePair {
            prompt_ids,
            chosen_ids,
            rejected_ids,
            margin,
            line,
        })
    })
}

/// Reads KTO examples from `path`.
pub fn read_labelled(
    path: &Path,
    tokenizer: &Tokenizer,
    options: ReadOptions,
) -> Result<(Vec<LabelledCompletion>, ReadReport), TrainError> {
    read_lines(path, options, |value, line, report| {
        let prompt = prompt_field(value)?;
        let completion = response_field(value, "completion")?;
        let label = match value.get("label") {
            Some(Value::Bool(label)) => *label,
            Some(other) => {
                return Err(format!("`label` must be true or false, got {other}"));
            }
            None => return Err("missing field `label`".into()),
        };
        let rendered = encode_prompt(tokenizer, &prompt)?;
        check_prompt(&rendered.ids, options.max_len)?;
        let mut completion_ids =
            encode_response(tokenizer, &prompt, &rendered, &completion, "completion")?;
        fit(
            &mut completion_ids,
            options.max_len - rendered.ids.len(),
            report,
        );
        Ok(LabelledCompletion {
            prompt_ids: rendered.ids,
            completion_ids,
            label,
            line,
        })
    })
}

fn read_lines<T>(
    path: &Path,
    options: ReadOptions,
    mut parse: impl FnMut(&Value, usize, &mut ReadReport) -> Result<T, String>,
) -> Result<(Vec<T>, ReadReport), TrainError> {
    let text = std::fs::read_to_string(path)
        .map_err(|e| TrainError::Other(format!("{}: {e}", path.display())))?;
    let mut out = Vec::new();
    let mut report = ReadReport::default();
    for (index, line) in text.lines().enumerate() {
        let number = index + 1;
        if line.trim().is_empty() {
            continue;
        }
        let parsed = serde_json::from_str::<Value>(line)
            .map_err(|e| format!("not JSON: {e}"))
            .and_then(|value| {
                if value.is_object() {
                    Ok(value)
                } else {
                    Err("not a JSON object".to_string())
                }
            })
            .and_then(|value| parse(&value, number, &mut report));
        match parsed {
            Ok(example) => out.push(example),
            Err(reason) => {
                let message = format!("{}:{number}: {reason}", path.display());
                if options.strict {
                    return Err(TrainError::Other(message));
                }
                report.skipped.push(message);
            }
        }
    }
    report.examples = out.len();
    if out.is_empty() {
        return Err(TrainError::Other(format!(
            "{}: no usable example ({} lines skipped{})",
            path.display(),
            report.skipped.len(),
            report
                .skipped
                .first()
                .map(|first| format!("; first: {first}"))
                .unwrap_or_default()
        )));
    }
    Ok((out, report))
}

/// A prompt or a response: messages, or one plain string.
#[derive(Clone, Debug)]
enum Turns {
    Text(String),
    Messages(Vec<ChatMessage>),
}

/// The ids a reward model scores for a task's `prompt` (one user turn) and a `completion` (the
/// assistant's turn): the row `stoke rm` trains on for a pair with that prompt and response
/// (the prompt through the chat template with the generation prompt, then the response as the
/// template closes it; plain text and an end-of-sequence token without a template).
pub fn scored_conversation(
    tokenizer: &Tokenizer,
    prompt: &str,
    completion: &str,
) -> Result<Vec<u32>, String> {
    let templated = tokenizer.chat_template().is_some();
    let (prompt, response) = if templated {
        (
            Turns::Messages(vec![ChatMessage::user(prompt)]),
            Turns::Messages(vec![ChatMessage::assistant(completion)]),
        )
    } else {
        (
            Turns::Text(prompt.to_string()),
            Turns::Text(completion.to_string()),
        )
    };
    let rendered = encode_prompt(tokenizer, &prompt)?;
    let response = encode_response(tokenizer, &prompt, &rendered, &response, "completion")?;
    Ok([rendered.ids, response].concat())
}

fn prompt_field(value: &Value) -> Result<Turns, String> {
    let turns = turns(value, "prompt")?;
    if let Turns::Messages(messages) = &turns
        && messages.last().is_some_and(|m| m.role == Role::Assistant)
    {
        return Err("`prompt` ends with an assistant turn (the response is that turn)".into());
    }
    Ok(turns)
}

fn response_field(value: &Value, key: &str) -> Result<Turns, String> {
    let turns = turns(value, key)?;
    if let Turns::Messages(messages) = &turns
        && let Some(index) = messages.iter().position(|m| m.role != Role::Assistant)
    {
        return Err(format!(
            "`{key}[{index}]` is a {} message; responses are assistant turns",
            messages[index].role.as_str()
        ));
    }
    Ok(turns)
}

fn turns(value: &Value, key: &str) -> Result<Turns, String> {
    match value.get(key) {
        None | Some(Value::Null) => Err(format!("missing field `{key}`")),
        Some(Value::String(text)) if text.is_empty() => Err(format!("`{key}` is empty")),
        Some(Value::String(text)) => Ok(Turns::Text(text.clone())),
        Some(Value::Array(items)) if items.is_empty() => Err(format!("`{key}` is empty")),
        Some(Value::Array(items)) => {
            let mut messages = Vec::with_capacity(items.len());
            for (index, item) in items.iter().enumerate() {
                let message: ChatMessage = serde_json::from_value(item.clone())
                    .map_err(|e| format!("`{key}[{index}]`: {e}"))?;
                let empty = message
                    .content
                    .as_ref()
                    .is_none_or(|c| c.joined_text().is_empty());
                if empty {
                    return Err(format!("`{key}[{index}]` has no content"));
                }
                messages.push(message);
            }
            Ok(Turns::Messages(messages))
        }
        Some(other) => Err(format!(
            "`{key}` must be a string or a list of messages, got {other}"
        )),
    }
}

fn prompt_messages(prompt: &Turns) -> Vec<ChatMessage> {
    match prompt {
        Turns::Text(text) => vec![ChatMessage::user(text.as_str())],
        Turns::Messages(messages) => messages.clone(),
    }
}

fn response_messages(response: &Turns) -> Vec<ChatMessage> {
    match response {
        Turns::Text(text) => vec![ChatMessage::assistant(text.as_str())],
        Turns::Messages(messages) => messages.clone(),
    }
}

/// A prompt rendered once: its ids and, with a chat template, its text (the prefix each
/// response's rendering must start with).
struct RenderedPrompt {
    ids: Vec<u32>,
    text: String,
}

fn encode_prompt(tokenizer: &Tokenizer, prompt: &Turns) -> Result<RenderedPrompt, String> {
    if tokenizer.chat_template().is_none() {
        return match prompt {
            Turns::Text(text) => Ok(RenderedPrompt {
                ids: tokenizer
                    .encode(text, true)
                    .map_err(|e| format!("prompt: {e}"))?,
                text: text.clone(),
            }),
            Turns::Messages(_) => {
                Err("`prompt` is a list of messages but the tokenizer has no chat template".into())
            }
        };
    }
    let options = ChatOptions {
        add_generation_prompt: true,
        ..ChatOptions::default()
    };
    tokenizer
        .apply_chat_template(&prompt_messages(prompt), &options)
        .map(|encoding| RenderedPrompt {
            ids: encoding.ids,
            text: encoding.text,
        })
        .map_err(|e| format!("prompt: chat template: {e}"))
}

/// Cuts a response to the room left after its prompt (TRL's `keep_start`), counting the cut.
fn fit(ids: &mut Vec<u32>, room: usize, report: &mut ReadReport) {
    if ids.len() > room {
        ids.truncate(room);
        report.truncated += 1;
    }
}

/// The response's ids, to append to the prompt's (see the module doc).
fn encode_response(
    tokenizer: &Tokenizer,
    prompt: &Turns,
    rendered: &RenderedPrompt,
    response: &Turns,
    key: &str,
) -> Result<Vec<u32>, String> {
    let ids = if tokenizer.chat_template().is_none() {
        let Turns::Text(text) = response else {
            return Err(format!(
                "`{key}` is a list of messages but the tokenizer has no chat template"
            ));
        };
        let mut ids = tokenizer
            .encode(text, false)
            .map_err(|e| format!("{key}: {e}"))?;
        ids.extend(tokenizer.eos_token_ids().first().copied());
        ids
    } else {
        let head = tokenizer
            .chat_template()
            .map(|template| template.name().to_string())
            .unwrap_or_default();
        let mut conversation = prompt_messages(prompt);
        conversation.extend(response_messages(response));
        let full = tokenizer
            .apply_chat_template(&conversation, &ChatOptions::default())
            .map_err(|e| format!("{key}: chat template: {e}"))?
            .text;
        let Some(tail) = full.strip_prefix(rendered.text.as_str()) else {
            return Err(format!(
                "{key}: the chat template `{head}` renders the prompt differently once the \
                 response follows it, so the response cannot be appended in token space"
            ));
        };
        tokenizer
            .encode(tail, false)
            .map_err(|e| format!("{key}: {e}"))?
    };
    if ids.is_empty() {
        return Err(format!("`{key}` encodes to no token"));
    }
    Ok(ids)
}

/// Token ids given in the line (`stoke rft` writes the sampled ids next to the texts, so DPO
/// trains on exactly the sampled tokens). They must come from the run's tokenizer.
fn id_field(value: &Value, key: &str) -> Result<Vec<u32>, String> {
    let Some(Value::Array(items)) = value.get(key) else {
        return Err(format!(
            "`{key}` must be a list of token ids (lines with `prompt_ids` carry all three id lists)"
        ));
    };
    if items.is_empty() {
        return Err(format!("`{key}` is empty"));
    }
    items
        .iter()
        .enumerate()
        .map(|(index, item)| {
            item.as_u64()
                .and_then(|id| u32::try_from(id).ok())
                .ok_or_else(|| format!("`{key}[{index}]` is not a token id: {item}"))
        })
        .collect()
}

fn check_prompt(prompt_ids: &[u32], max_len: usize) -> Result<(), String> {
    if prompt_ids.len() >= max_len {
        return Err(format!(
            "the prompt is {} tokens, at or over the sequence limit of {max_len} \
             (no room for a response)",
            prompt_ids.len()
        ));
    }
    Ok(())
}
