//! A task file (TOML, one task per file, unknown keys rejected) and its items.
//!
//! Vocabulary follows lm-evaluation-harness where it has one: `output_type`
//! (`multiple_choice`, `generate_until`, `loglikelihood_rolling`), `doc_to_text`,
//! `doc_to_target`, `doc_to_choice`, `target_delimiter`, `fewshot_delimiter`, `num_fewshot`,
//! `fewshot_seed`, `description`. A `doc_to_*` value containing `{{` or `{%` is a minijinja
//! template over the document's fields (strict: a missing field is an error naming it and the
//! item); otherwise it names a field.
//!
//! ```toml
//! output_type = "multiple_choice"
//! data = "arith.jsonl"              # relative to the task file
//! doc_to_text = "Question: {{question}}\nAnswer:"
//! doc_to_choice = "choices"         # a field holding a list, or a list of templates
//! doc_to_target = "gold"            # an index, or the text of the right choice
//!
//! [generation]                      # generate_until
//! max_tokens = 256
//! stop = ["\n\n"]
//! n = 1
//! pass_at = [1]
//!
//! [grader]                          # generate_until: any reward kind of stoke-reward
//! kind = "exact_match"
//!
//! [reference]                       # Reference fields other than `answer` (= doc_to_target)
//! tests = "test"
//! entry_point = "entry_point"
//! ```
//!
//! Items render to plain text (the chat template, when asked, renders the conversation to
//! text); targets tokenize it, so a local model and an endpoint see the same token ids.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use rand::SeedableRng;
use rand::seq::index::sample;
use serde::{Deserialize, Serialize};
use serde_json::Value;
use stoke_reward::{Reference, RewardConfig};
use stoke_tokenizer::chat::{ChatMessage, ChatOptions};
use stoke_tokenizer::hf::Tokenizer;

use crate::docs::{Doc, read_docs};

pub use crate::task_error::TaskError;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputType {
    /// Log-likelihood of each choice after the context: `acc`, `acc_norm`.
    MultipleChoice,
    /// Sampled completions graded by a reward: pass@k, mean@n, maj@n.
    GenerateUntil,
    /// The whole text's log-likelihood: bits per byte.
    LoglikelihoodRolling,
}

/// `doc_to_choice`: a field holding a list, or the list of choices itself (fixed letters, say;
/// entries with `{{` are templates).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum ChoiceSpec {
    Field(String),
    List(Vec<String>),
}

fn default_delimiter() -> String {
    " ".into()
}
fn default_fewshot_delimiter() -> String {
    "\n\n".into()
}
fn default_fewshot_seed() -> u64 {
    1234
}

fn is_template(spec: &str) -> bool {
    spec.contains("{{") || spec.contains("{%")
}

/// The file format of a task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TaskFile {
    /// Defaults to the file's stem.
    #[serde(default)]
    pub name: Option<String>,
    pub output_type: OutputType,
    /// Data file (.jsonl, .json, .csv, .parquet), relative to the task file.
    pub data: PathBuf,
    /// Evaluate only the first `limit` documents.
    #[serde(default)]
    pub limit: Option<usize>,
    pub doc_to_text: String,
    #[serde(default)]
    pub doc_to_target: Option<String>,
    #[serde(default)]
    pub doc_to_choice: Option<ChoiceSpec>,
    #[serde(default = "default_delimiter")]
    pub target_delimiter: String,
    #[serde(default = "default_fewshot_delimiter")]
    pub fewshot_delimiter: String,
    /// Text put before the few-shot examples (the system message with a chat template).
    #[serde(default)]
    pub description: String,
    #[serde(default)]
    pub num_fewshot: usize,
    #[serde(default = "default_fewshot_seed")]
    pub fewshot_seed: u64,
    /// Where few-shot examples come from (default: the task's own data, never the item itself).
    #[serde(default)]
    pub fewshot_data: Option<PathBuf>,
    /// Render the prompt with the model's chat template (few-shot examples as earlier turns).
    #[serde(default)]
    pub chat_template: bool,
    #[serde(default)]
    pub generation: GenerationFile,
    #[serde(default)]
    pub grader: Option<RewardConfig>,
    /// Reference fields other than `answer`: `tests`, `entry_point`, `schema`, `cases`, each a
    /// field name or template.
    #[serde(default)]
    pub reference: BTreeMap<String, String>,
}

fn default_max_tokens() -> usize {
    256
}
fn default_n() -> usize {
    1
}
fn default_top_p() -> f32 {
    1.0
}

/// Sampling settings of a `generate_until` task.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GenerationFile {
    #[serde(default = "default_max_tokens")]
    pub max_tokens: usize,
    #[serde(default)]
    pub temperature: f32,
    #[serde(default = "default_top_p")]
    pub top_p: f32,
    #[serde(default)]
    pub top_k: usize,
    #[serde(default)]
    pub stop: Vec<String>,
    /// Samples per item.
    #[serde(default = "default_n")]
    pub n: usize,
    #[serde(default)]
    pub seed: u64,
    /// The k of pass@k (default: 1, and n when n > 1).
    #[serde(default)]
    pub pass_at: Vec<usize>,
}

impl Default for GenerationFile {
    fn default() -> Self {
        GenerationFile {
            max_tokens: default_max_tokens(),
            temperature: 0.0,
            top_p: 1.0,
            top_k: 0,
            stop: Vec::new(),
            n: 1,
            seed: 0,
            pass_at: Vec::new(),
        }
    }
}

/// A loaded task: its file, documents and few-shot pool.
#[derive(Debug, Clone)]
pub struct Task {
    pub name: String,
    pub file: TaskFile,
    pub path: PathBuf,
    pub docs: Vec<Doc>,
    /// `None`: few-shot examples come from `docs`.
    pub fewshot_docs: Option<Vec<Doc>>,
}

/// What one item asks of the target.
#[derive(Debug, Clone, PartialEq, Serialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Work {
    Choices {
        context: String,
        /// `target_delimiter + choice` for each choice.
        continuations: Vec<String>,
        choices: Vec<String>,
        gold: usize,
    },
    Generate {
        prompt: String,
        /// The document's own prompt (without few-shot examples or chat markup): what code
        /// verifiers see as the prompt.
        bare_prompt: String,
        reference: Reference,
    },
    Rolling {
        text: String,
    },
}

/// One evaluation item.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Item {
    pub index: usize,
    pub location: String,
    pub work: Work,
}

impl Item {
    /// A stable key of what the item asks (for the resume cache): the work and the task's
    /// sampling settings.
    pub fn key(&self, task: &Task) -> String {
        let text = serde_json::to_string(&(&self.work, &task.file.generation))
            .unwrap_or_else(|_| format!("{:?}", self.work));
        format!("{:016x}", xxhash_rust::xxh3::xxh3_64(text.as_bytes()))
    }
}

impl Task {
    /// Reads a task file and its data.
    pub fn load(path: &Path) -> Result<Task, TaskError> {
        let shown = path.display().to_string();
        let file_error = |message: String| TaskError::File {
            path: shown.clone(),
            message,
        };
        let text = std::fs::read_to_string(path).map_err(|e| file_error(e.to_string()))?;
        let file: TaskFile = toml::from_str(&text).map_err(|e| file_error(e.to_string()))?;
        let base = path.parent().unwrap_or(Path::new("."));
        let name = file.name.clone().unwrap_or_else(|| {
            path.file_stem()
                .map(|s| s.to_string_lossy().into_owned())
                .unwrap_or_else(|| "task".into())
        });
        Self::from_file(name, file, base, path)
    }

    /// A task from an already parsed file; relative data paths are taken from `base`.
    pub fn from_file(
        name: String,
        file: TaskFile,
        base: &Path,
        path: &Path,
    ) -> Result<Task, TaskError> {
        Self::check(&file, path)?;
        let mut docs = read_docs(&base.join(&file.data))?;
        if let Some(limit) = file.limit {
            docs.truncate(limit);
        }
        let fewshot_docs = match &file.fewshot_data {
            Some(p) => Some(read_docs(&base.join(p))?),
            None => None,
        };
        Ok(Task {
            name,
            file,
            path: path.to_path_buf(),
            docs,
            fewshot_docs,
        })
    }

    /// A task over documents already in memory (a training run's own held-out set); `file.data`
    /// and `file.fewshot_data` are not read (few-shot examples come from `docs`). `origin`
    /// names the task in errors.
    pub fn from_docs(
        name: String,
        file: TaskFile,
        docs: Vec<Doc>,
        origin: &str,
    ) -> Result<Task, TaskError> {
        let path = Path::new(origin);
        Self::check(&file, path)?;
        if file.fewshot_data.is_some() {
            return Err(TaskError::File {
                path: origin.to_string(),
                message: "`fewshot_data` is a file: an in-memory task draws few-shot examples \
                          from its own documents"
                    .into(),
            });
        }
        let mut docs = docs;
        if let Some(limit) = file.limit {
            docs.truncate(limit);
        }
        Ok(Task {
            name,
            file,
            path: path.to_path_buf(),
            docs,
            fewshot_docs: None,
        })
    }

    /// What a task file must hold for its output type.
    fn check(file: &TaskFile, path: &Path) -> Result<(), TaskError> {
        let file_error = |message: String| TaskError::File {
            path: path.display().to_string(),
            message,
        };
        match file.output_type {
            OutputType::MultipleChoice => {
                if file.doc_to_choice.is_none() || file.doc_to_target.is_none() {
                    return Err(file_error(
                        "multiple_choice needs `doc_to_choice` and `doc_to_target`".into(),
                    ));
                }
            }
            OutputType::GenerateUntil => {
                if file.grader.is_none() {
                    return Err(file_error(
                        "generate_until needs a [grader] table (a reward kind)".into(),
                    ));
                }
                if file.generation.n == 0 {
                    return Err(file_error("`generation.n` must be at least 1".into()));
                }
                if let Some(&k) = file
                    .generation
                    .pass_at
                    .iter()
                    .find(|&&k| k == 0 || k > file.generation.n)
                {
                    return Err(file_error(format!(
                        "`generation.pass_at` has {k}: each k must be in 1..=n (n = {})",
                        file.generation.n
                    )));
                }
            }
            OutputType::LoglikelihoodRolling => {}
        }
        for key in file.reference.keys() {
            if !["tests", "entry_point", "schema", "cases"].contains(&key.as_str()) {
                return Err(file_error(format!(
                    "`reference.{key}`: unknown reference field (known: tests, entry_point, \
                     schema, cases; the answer is doc_to_target)"
                )));
            }
        }
        Ok(())
    }

    fn item_error(&self, doc: &Doc, message: impl Into<String>) -> TaskError {
        TaskError::Item {
            task: self.name.clone(),
            location: doc.location.clone(),
            message: message.into(),
        }
    }

    /// `spec` applied to `doc`: a template rendered, or a field's value.
    fn value(&self, doc: &Doc, key: &str, spec: &str) -> Result<Value, TaskError> {
        if is_template(spec) {
            let mut env = minijinja::Environment::new();
            env.set_undefined_behavior(minijinja::UndefinedBehavior::Strict);
            let context: minijinja::Value =
                serde_json::from_value(Value::Object(doc.fields.clone()))
                    .map_err(|e| self.item_error(doc, format!("`{key}`: {e}")))?;
            let text = env
                .render_str(spec, context)
                .map_err(|e| self.item_error(doc, format!("`{key}` template: {e}")))?;
            return Ok(Value::String(text));
        }
        doc.fields.get(spec).cloned().ok_or_else(|| {
            let mut known: Vec<&str> = doc.fields.keys().map(String::as_str).collect();
            known.sort_unstable();
            self.item_error(
                doc,
                format!(
                    "`{key}` names the field `{spec}`, which this document lacks (it has: {})",
                    known.join(", ")
                ),
            )
        })
    }

    fn text(&self, doc: &Doc, key: &str, spec: &str) -> Result<String, TaskError> {
        match self.value(doc, key, spec)? {
            Value::String(s) => Ok(s),
            Value::Number(n) => Ok(n.to_string()),
            Value::Bool(b) => Ok(b.to_string()),
            other => Err(self.item_error(doc, format!("`{key}` should give text, found {other}"))),
        }
    }

    fn choices(&self, doc: &Doc) -> Result<Vec<String>, TaskError> {
        let choices = match self.file.doc_to_choice.as_ref() {
            // A list holds the choices themselves (templates where they have `{{`), as an
            // lm-eval YAML list does: "A" is the letter, not a field.
            Some(ChoiceSpec::List(entries)) => entries
                .iter()
                .map(|t| {
                    if is_template(t) {
                        self.text(doc, "doc_to_choice", t)
                    } else {
                        Ok(t.clone())
                    }
                })
                .collect::<Result<Vec<_>, _>>()?,
            Some(ChoiceSpec::Field(spec)) => match self.value(doc, "doc_to_choice", spec)? {
                Value::Array(values) => values
                    .into_iter()
                    .map(|v| match v {
                        Value::String(s) => Ok(s),
                        Value::Number(n) => Ok(n.to_string()),
                        other => Err(self.item_error(
                            doc,
                            format!("`doc_to_choice`: choice {other} is not text"),
                        )),
                    })
                    .collect::<Result<Vec<_>, _>>()?,
                other => {
                    return Err(self.item_error(
                        doc,
                        format!("`doc_to_choice` should give a list of choices, found {other}"),
                    ));
                }
            },
            None => return Err(self.item_error(doc, "no `doc_to_choice`")),
        };
        if choices.len() < 2 {
            return Err(self.item_error(doc, "`doc_to_choice` gives fewer than two choices"));
        }
        Ok(choices)
    }

    fn gold(&self, doc: &Doc, choices: &[String]) -> Result<usize, TaskError> {
        let spec = self.file.doc_to_target.as_deref().unwrap_or("");
        let value = self.value(doc, "doc_to_target", spec)?;
        let index = match &value {
            Value::Number(n) => n.as_u64().map(|n| n as usize),
            Value::String(s) => s
                .trim()
                .parse::<usize>()
                .ok()
                .filter(|&i| i < choices.len() && !choices.iter().any(|c| c == s))
                .or_else(|| choices.iter().position(|c| c == s)),
            _ => None,
        };
        match index {
            Some(i) if i < choices.len() => Ok(i),
            _ => Err(self.item_error(
                doc,
                format!(
                    "`doc_to_target` gives {value}: neither an index below {} nor one of the \
                     choices",
                    choices.len()
                ),
            )),
        }
    }

    /// The answer shown after a few-shot example.
    fn shot_answer(&self, doc: &Doc) -> Result<String, TaskError> {
        match self.file.output_type {
            OutputType::MultipleChoice => {
                let choices = self.choices(doc)?;
                Ok(choices[self.gold(doc, &choices)?].clone())
            }
            _ => {
                let spec = self.file.doc_to_target.as_deref().ok_or_else(|| {
                    self.item_error(doc, "few-shot examples need `doc_to_target`")
                })?;
                self.text(doc, "doc_to_target", spec)
            }
        }
    }

    /// The few-shot examples of item `index` (seeded by `fewshot_seed` and the index, never the
    /// item itself when the examples come from the task's own data).
    fn shots(&self, index: usize) -> Result<Vec<(String, String)>, TaskError> {
        let k = self.file.num_fewshot;
        if k == 0 {
            return Ok(Vec::new());
        }
        let (pool, own) = match &self.fewshot_docs {
            Some(docs) => (docs.as_slice(), false),
            None => (self.docs.as_slice(), true),
        };
        let candidates: Vec<usize> = (0..pool.len()).filter(|&i| !own || i != index).collect();
        if candidates.len() < k {
            return Err(TaskError::File {
                path: self.path.display().to_string(),
                message: format!(
                    "num_fewshot = {k} but only {} documents can serve as examples",
                    candidates.len()
                ),
            });
        }
        let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(
            self.file.fewshot_seed ^ (index as u64).wrapping_mul(0x9E37_79B9_7F4A_7C15),
        );
        sample(&mut rng, candidates.len(), k)
            .into_iter()
            .map(|i| {
                let doc = &pool[candidates[i]];
                Ok((
                    self.text(doc, "doc_to_text", &self.file.doc_to_text)?,
                    self.shot_answer(doc)?,
                ))
            })
            .collect()
    }

    /// The context text of item `index`: description, few-shot examples and the document's
    /// text, or the same as a conversation rendered with the chat template.
    fn context(
        &self,
        index: usize,
        text: &str,
        tokenizer: Option<&Tokenizer>,
    ) -> Result<String, TaskError> {
        let shots = self.shots(index)?;
        let f = &self.file;
        if !f.chat_template {
            let mut out = f.description.clone();
            for (question, answer) in &shots {
                out.push_str(question);
                out.push_str(&f.target_delimiter);
                out.push_str(answer);
                out.push_str(&f.fewshot_delimiter);
            }
            out.push_str(text);
            return Ok(out);
        }
        let doc = &self.docs[index];
        let tokenizer = tokenizer.ok_or_else(|| {
            self.item_error(doc, "chat_template = true needs the model's tokenizer")
        })?;
        let mut messages = Vec::new();
        if !f.description.is_empty() {
            messages.push(ChatMessage::system(f.description.clone()));
        }
        for (question, answer) in shots {
            messages.push(ChatMessage::user(question));
            messages.push(ChatMessage::assistant(answer));
        }
        messages.push(ChatMessage::user(text.to_string()));
        let options = ChatOptions {
            add_generation_prompt: true,
            ..Default::default()
        };
        tokenizer
            .apply_chat_template(&messages, &options)
            .map(|e| e.text)
            .map_err(|e| self.item_error(doc, format!("chat template: {e}")))
    }

    /// Each document's own text and answer (no few-shot examples, no chat markup): what a
    /// contamination check looks for in training data.
    pub fn bare_texts(&self) -> Result<Vec<String>, TaskError> {
        self.docs
            .iter()
            .map(|doc| {
                let mut text = self.text(doc, "doc_to_text", &self.file.doc_to_text)?;
                let answer = match self.file.output_type {
                    OutputType::MultipleChoice => Some(self.shot_answer(doc)?),
                    OutputType::GenerateUntil => self
                        .file
                        .doc_to_target
                        .as_ref()
                        .map(|spec| self.text(doc, "doc_to_target", spec))
                        .transpose()?,
                    OutputType::LoglikelihoodRolling => None,
                };
                if let Some(answer) = answer {
                    text.push_str(&self.file.target_delimiter);
                    text.push_str(&answer);
                }
                Ok(text)
            })
            .collect()
    }

    /// Every item of the task (the tokenizer renders chat templates).
    pub fn items(&self, tokenizer: Option<&Tokenizer>) -> Result<Vec<Item>, TaskError> {
        self.docs
            .iter()
            .enumerate()
            .map(|(index, doc)| {
                let text = self.text(doc, "doc_to_text", &self.file.doc_to_text)?;
                let work = match self.file.output_type {
                    OutputType::MultipleChoice => {
                        let choices = self.choices(doc)?;
                        let gold = self.gold(doc, &choices)?;
                        Work::Choices {
                            context: self.context(index, &text, tokenizer)?,
                            continuations: choices
                                .iter()
                                .map(|c| format!("{}{c}", self.file.target_delimiter))
                                .collect(),
                            choices,
                            gold,
                        }
                    }
                    OutputType::GenerateUntil => Work::Generate {
                        prompt: self.context(index, &text, tokenizer)?,
                        reference: self.reference(doc)?,
                        bare_prompt: text,
                    },
                    OutputType::LoglikelihoodRolling => Work::Rolling { text },
                };
                Ok(Item {
                    index,
                    location: doc.location.clone(),
                    work,
                })
            })
            .collect()
    }

    fn reference(&self, doc: &Doc) -> Result<Reference, TaskError> {
        let mut reference = Reference::default();
        if let Some(spec) = &self.file.doc_to_target {
            reference.answer = Some(self.text(doc, "doc_to_target", spec)?);
        }
        for (key, spec) in &self.file.reference {
            let field = format!("reference.{key}");
            match key.as_str() {
                "tests" => reference.tests = Some(self.text(doc, &field, spec)?),
                "entry_point" => reference.entry_point = Some(self.text(doc, &field, spec)?),
                "schema" => {
                    reference.schema = Some(match self.value(doc, &field, spec)? {
                        Value::String(s) => serde_json::from_str(&s).map_err(|e| {
                            self.item_error(doc, format!("`{field}` is not JSON: {e}"))
                        })?,
                        other => other,
                    })
                }
                "cases" => {
                    let value = match self.value(doc, &field, spec)? {
                        Value::String(s) => serde_json::from_str(&s).map_err(|e| {
                            self.item_error(doc, format!("`{field}` is not JSON: {e}"))
                        })?,
                        other => other,
                    };
                    reference.cases = Some(
                        serde_json::from_value(value)
                            .map_err(|e| self.item_error(doc, format!("`{field}`: {e}")))?,
                    );
                }
                other => {
                    return Err(self
                        .item_error(doc, format!("`reference.{other}`: unknown reference field")));
                }
            }
        }
        Ok(reference)
    }
}
