//! Process-reward data: rows in TRL's stepwise-supervision format (the format of TRL's
//! `trl-lib/prm800k` and `trl-lib/math_shepherd` conversions of PRM800K and Math-Shepherd), one
//! JSON object per line:
//!
//! ```json
//! {"prompt": "what is 2+3?", "completions": ["2+3 = 5.", "the answer is 5."], "labels": [true, true]}
//! ```
//!
//! `completions` are the reasoning steps in order, `labels` one per step (`true`: the step is
//! good; 0 and 1 are accepted too, as TRL's `int(label)` does).
//!
//! The rule ([`tokenize_row`]) is TRL 0.29.0's `PRMTrainer.tokenize_row`, token for token (checked
//! by `tests/prm.rs` against `fixtures/prm/trl_prm.json`):
//!
//! 1. the prompt's ids, without special tokens, after the tokenizer's BOS when it has one;
//! 2. each step's ids, without special tokens, each followed by the separator's ids
//!    (`step_separator`, default `"\n"`), each step tokenized on its own (no merge across steps);
//! 3. the step's label (0 or 1) on the last token of the step's separator, no label elsewhere
//!    (TRL's -100); with `train_on_last_step_only` (and not `is_eval`), only the last step keeps
//!    its label;
//! 4. the completion cut to `max_completion_length` tokens, then the whole row to `max_length`
//!    (TRL's defaults: none and 1024); a label cut off is gone.
//!
//! What this is not: no model, no loss (`loss`), no splitting of generated text into steps
//! (`steps`). Errors name the line and the field; a row the rule cannot tokenize faithfully (no
//! steps, labels that do not pair with the steps, a separator of no tokens) is refused, never
//! guessed at.

use std::path::Path;

use serde::{Deserialize, Serialize};
use serde_json::Value;
use stoke_tokenizer::hf::Tokenizer;

use super::PrmError;

/// One stepwise-supervision row.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepwiseRow {
    pub prompt: String,
    /// The reasoning steps, in order (at least one).
    pub completions: Vec<String>,
    /// One per step: whether the step is good.
    pub labels: Vec<bool>,
}

/// How rows become ids and labels: PRMConfig's fields of the same names and defaults.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StepwiseTokenization {
    /// Appended to every step (TRL's `step_separator`); the label sits on its last token.
    #[serde(default = "default_separator")]
    pub step_separator: String,
    /// The whole row is cut to this many tokens (TRL default 1024); `None`: no cut.
    #[serde(default = "default_max_length")]
    pub max_length: Option<usize>,
    /// The completion (steps and separators) is cut to this many tokens first; `None`: no cut.
    #[serde(default)]
    pub max_completion_length: Option<usize>,
    /// Train on the last step's label only (held-out rows keep every label).
    #[serde(default)]
    pub train_on_last_step_only: bool,
}

fn default_separator() -> String {
    "\n".into()
}

fn default_max_length() -> Option<usize> {
    Some(1024)
}

impl Default for StepwiseTokenization {
    fn default() -> Self {
        StepwiseTokenization {
            step_separator: default_separator(),
            max_length: default_max_length(),
            max_completion_length: None,
            train_on_last_step_only: false,
        }
    }
}

/// A tokenized row: the ids and, per id, the label the loss reads (`None`: TRL's -100).
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TokenizedSteps {
    pub input_ids: Vec<u32>,
    /// Same length as `input_ids`: `Some(true)` good step, `Some(false)` bad, `None` unlabelled.
    pub labels: Vec<Option<bool>>,
}

impl TokenizedSteps {
    /// The labels as TRL stores them: 1, 0, or -100 for unlabelled positions.
    pub fn trl_labels(&self) -> Vec<i64> {
        self.labels
            .iter()
            .map(|l| l.map_or(-100, i64::from))
            .collect()
    }

    /// Positions that carry a label.
    pub fn labelled(&self) -> usize {
        self.labels.iter().filter(|l| l.is_some()).count()
    }
}

/// The row of line `line` (1-based, for errors) of a stepwise JSONL file.
pub fn parse_row(value: &Value, line: usize) -> Result<StepwiseRow, PrmError> {
    let row = |field: &'static str, message: String| PrmError::Row {
        line,
        field,
        message,
        file: None,
    };
    let object = value
        .as_object()
        .ok_or_else(|| row("prompt", "the line is not a JSON object".into()))?;
    for key in object.keys() {
        if !["prompt", "completions", "labels"].contains(&key.as_str()) {
            return Err(row(
                "prompt",
                format!("unknown field `{key}` (a row has prompt, completions, labels)"),
            ));
        }
    }
    let prompt = match object.get("prompt") {
        Some(Value::String(s)) => s.clone(),
        Some(other) => return Err(row("prompt", format!("must be a string, found {other}"))),
        None => return Err(row("prompt", "missing".into())),
    };
    let completions: Vec<String> = match object.get("completions") {
        Some(Value::Array(steps)) => steps
            .iter()
            .enumerate()
            .map(|(i, s)| {
                s.as_str().map(str::to_string).ok_or_else(|| {
                    row(
                        "completions",
                        format!("step {i} must be a string, found {s}"),
                    )
                })
            })
            .collect::<Result<_, _>>()?,
        Some(other) => {
            return Err(row(
                "completions",
                format!("must be a list of step strings, found {other}"),
            ));
        }
        None => return Err(row("completions", "missing".into())),
    };
    if completions.is_empty() {
        return Err(row("completions", "has no steps".into()));
    }
    let labels: Vec<bool> = match object.get("labels") {
        Some(Value::Array(labels)) => labels
            .iter()
            .enumerate()
            .map(|(i, l)| match l {
                Value::Bool(b) => Ok(*b),
                Value::Number(n) if n.as_u64() == Some(0) => Ok(false),
                Value::Number(n) if n.as_u64() == Some(1) => Ok(true),
                other => Err(row(
                    "labels",
                    format!("label {i} must be true/false (or 1/0), found {other}"),
                )),
            })
            .collect::<Result<_, _>>()?,
        Some(other) => return Err(row("labels", format!("must be a list, found {other}"))),
        None => return Err(row("labels", "missing".into())),
    };
    if labels.len() != completions.len() {
        return Err(row(
            "labels",
            format!(
                "{} labels for {} steps (one label per step)",
                labels.len(),
                completions.len()
            ),
        ));
    }
    Ok(StepwiseRow {
        prompt,
        completions,
        labels,
    })
}

/// Every row of a stepwise JSONL file (blank lines skipped); the first bad line fails the read.
pub fn read_rows(path: &Path) -> Result<Vec<StepwiseRow>, PrmError> {
    let text = std::fs::read_to_string(path).map_err(|e| PrmError::Io {
        path: path.to_path_buf(),
        message: e.to_string(),
    })?;
    let mut rows = Vec::new();
    for (index, line) in text.lines().enumerate() {
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(line).map_err(|e| PrmError::Row {
            line: index + 1,
            field: "prompt",
            message: format!("not JSON: {e}"),
            file: Some(path.to_path_buf()),
        })?;
        rows.push(parse_row(&value, index + 1).map_err(|e| e.in_file(path))?);
    }
    Ok(rows)
}

/// The separator's ids; an error when it has none (a label would then sit on a step's own last
/// token, or on no token at all for an empty step).
pub fn separator_ids(tokenizer: &Tokenizer, separator: &str) -> Result<Vec<u32>, PrmError> {
    let ids = tokenizer.encode(separator, false)?;
    if ids.is_empty() {
        return Err(PrmError::Config {
            field: "step_separator",
            message: format!("{separator:?} encodes to no tokens; the label needs one"),
        });
    }
    Ok(ids)
}

/// The ids and labels of `row` (see the module doc). `is_eval`: a held-out row, which keeps
/// every label under `train_on_last_step_only`, as TRL's eval set does.
pub fn tokenize_row(
    row: &StepwiseRow,
    tokenizer: &Tokenizer,
    settings: &StepwiseTokenization,
    is_eval: bool,
) -> Result<TokenizedSteps, PrmError> {
    if row.labels.len() != row.completions.len() || row.completions.is_empty() {
        return Err(PrmError::Config {
            field: "labels",
            message: format!(
                "{} labels for {} steps (one label per step, at least one step)",
                row.labels.len(),
                row.completions.len()
            ),
        });
    }
    let separator = separator_ids(tokenizer, &settings.step_separator)?;
    let last = row.labels.len() - 1;
    let mut completion_ids = Vec::new();
    let mut completion_labels = Vec::new();
    for (index, (step, &label)) in row.completions.iter().zip(&row.labels).enumerate() {
        let kept = !settings.train_on_last_step_only || is_eval || index == last;
        completion_ids.extend(tokenizer.encode(step, false)?);
        completion_ids.extend_from_slice(&separator);
        completion_labels.resize(completion_ids.len() - 1, None);
        completion_labels.push(kept.then_some(label));
    }
    if let Some(max) = settings.max_completion_length {
        completion_ids.truncate(max);
        completion_labels.truncate(max);
    }
    let mut input_ids: Vec<u32> = tokenizer.bos_token_id().into_iter().collect();
    input_ids.extend(tokenizer.encode(&row.prompt, false)?);
    let mut labels = vec![None; input_ids.len()];
    input_ids.extend(completion_ids);
    labels.extend(completion_labels);
    if let Some(max) = settings.max_length {
        input_ids.truncate(max);
        labels.truncate(max);
    }
    Ok(TokenizedSteps { input_ids, labels })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn refused(value: Value) -> String {
        parse_row(&value, 7).unwrap_err().to_string()
    }

    #[test]
    fn a_stepwise_row_parses_with_bool_or_01_labels() {
        let row = parse_row(
            &json!({"prompt": "p", "completions": ["a", "b"], "labels": [true, 0]}),
            1,
        )
        .unwrap();
        assert_eq!(row.completions, ["a", "b"]);
        assert_eq!(row.labels, [true, false]);
    }

    #[test]
    fn bad_rows_are_refused_naming_the_line_and_the_field() {
        let cases = [
            (
                json!({"completions": ["a"], "labels": [true]}),
                "`prompt`: missing",
            ),
            (
                json!({"prompt": "p", "completions": [], "labels": []}),
                "`completions`: has no steps",
            ),
            (
                json!({"prompt": "p", "completions": "a", "labels": [true]}),
                "`completions`: must be a list",
            ),
            (
                json!({"prompt": "p", "completions": ["a", 3], "labels": [true, true]}),
                "step 1 must be a string",
            ),
            (
                json!({"prompt": "p", "completions": ["a", "b"], "labels": [true]}),
                "1 labels for 2 steps",
            ),
            (
                json!({"prompt": "p", "completions": ["a"], "labels": [2]}),
                "label 0 must be true/false",
            ),
            (
                json!({"prompt": "p", "completions": ["a"], "labels": [true], "score": 1}),
                "unknown field `score`",
            ),
        ];
        for (value, message) in cases {
            let err = refused(value);
            assert!(err.starts_with("line 7: "), "{err}");
            assert!(err.contains(message), "{err}");
        }
    }
}
