//! Arithmetic problems written out as training data: a pretraining corpus of plain-text documents
//! and an SFT set of chat records.
//!
//! What it is: rendering and JSONL writing. A pretraining document is a small worksheet of one to
//! three problems with their worked solutions, in one of several framings ([`DocumentStyle`]:
//! "Question:/Answer:", "Problem:/Solution:", "Q:/A:", or a bare story), each ending with a plain
//! sentence that states the answer. A chat record is one OpenAI-format conversation
//! (`{"messages": [{"role": "user", ..}, {"role": "assistant", ..}]}`): the question, then the
//! worked solution ending in the fixed final-answer line `#### <answer>`.
//!
//! The pretraining text deliberately never uses the `####` line: the final-answer format is what
//! SFT teaches, so a pretrained model can know the arithmetic and still miss the format (the
//! evaluation reports a strict and a flexible score to tell the two apart).
//!
//! What it is not: the generator (`arithmetic.rs`) or a tokenizer. Files are written whole and
//! flushed; a write failure names the file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};
use stoke_tokenizer::chat::ChatMessage;

use crate::arithmetic::Problem;

/// How a pretraining document frames its problems.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum DocumentStyle {
    /// `Question: ...` / `Answer: ...` / `The answer is N.`
    QuestionAnswer,
    /// `Problem 1. ...` / `Solution. ...` / `So the answer is N.`
    ProblemSolution,
    /// `Q: ...` / `A: ...` `Answer: N`
    Short,
    /// The story, then the solution as running text: `... That makes N in the end.`
    Story,
}

impl DocumentStyle {
    pub const ALL: [DocumentStyle; 4] = [
        DocumentStyle::QuestionAnswer,
        DocumentStyle::ProblemSolution,
        DocumentStyle::Short,
        DocumentStyle::Story,
    ];
}

/// One worksheet of problems as plain text.
pub fn pretraining_document(problems: &[Problem], style: DocumentStyle) -> String {
    let blocks: Vec<String> = problems
        .iter()
        .enumerate()
        .map(|(i, p)| {
            let (q, s, answer) = (&p.question, &p.solution, p.answer);
            match style {
                DocumentStyle::QuestionAnswer => {
                    format!("Question: {q}\nAnswer: {s} The answer is {answer}.")
                }
                DocumentStyle::ProblemSolution => format!(
                    "Problem {}. {q}\nSolution. {s} So the answer is {answer}.",
                    i + 1
                ),
                DocumentStyle::Short => format!("Q: {q}\nA: {s}\nAnswer: {answer}"),
                DocumentStyle::Story => format!("{q} {s} That makes {answer} in the end."),
            }
        })
        .collect();
    blocks.join("\n\n")
}

/// One SFT conversation in the OpenAI `messages` format.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ChatRecord {
    pub messages: Vec<ChatMessage>,
}

/// The question as the user turn, the worked solution with `#### <answer>` as the assistant turn.
pub fn chat_record(problem: &Problem) -> ChatRecord {
    ChatRecord {
        messages: vec![
            ChatMessage::user(problem.question.clone()),
            ChatMessage::assistant(problem.chat_solution()),
        ],
    }
}

/// What a writer produced.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct WrittenFile {
    pub path: PathBuf,
    /// Lines (documents or conversations).
    pub records: u64,
    pub problems: u64,
    pub bytes: u64,
}

/// Errors of writing data files.
#[derive(Debug, thiserror::Error)]
pub enum CorpusError {
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{path}: encoding a record: {source}")]
    Json {
        path: PathBuf,
        source: serde_json::Error,
    },
}

/// `{"text": ...}` per line.
#[derive(Serialize)]
struct TextRecord<'a> {
    text: &'a str,
}

/// Writes `problems` as pretraining documents (JSONL, field `text`): consecutive problems are
/// grouped into worksheets of 1-3 with a style drawn per document (deterministic in `seed`).
pub fn write_pretraining_jsonl(
    path: &Path,
    problems: &[Problem],
    seed: u64,
) -> Result<WrittenFile, CorpusError> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    let mut out = JsonlWriter::create(path)?;
    let mut rest = problems;
    while !rest.is_empty() {
        let take = rng.random_range(1..=3usize).min(rest.len());
        let style = *DocumentStyle::ALL
            .choose(&mut rng)
            .unwrap_or(&DocumentStyle::QuestionAnswer);
        let text = pretraining_document(&rest[..take], style);
        out.write(&TextRecord { text: &text }, take as u64)?;
        rest = &rest[take..];
    }
    out.finish()
}

/// Writes one chat record per problem (JSONL, OpenAI `messages`).
pub fn write_chat_jsonl(path: &Path, problems: &[Problem]) -> Result<WrittenFile, CorpusError> {
    let mut out = JsonlWriter::create(path)?;
    for problem in problems {
        out.write(&chat_record(problem), 1)?;
    }
    out.finish()
}

/// Writes problems as they are (one `Problem` per line: question, solution, steps, answer), the
/// held-out set's reference file.
pub fn write_problems_jsonl(path: &Path, problems: &[Problem]) -> Result<WrittenFile, CorpusError> {
    let mut out = JsonlWriter::create(path)?;
    for problem in problems {
        out.write(problem, 1)?;
    }
    out.finish()
}

struct JsonlWriter {
    path: PathBuf,
    out: BufWriter<File>,
    written: WrittenFile,
}

impl JsonlWriter {
    fn create(path: &Path) -> Result<Self, CorpusError> {
        let io = |source| CorpusError::Io {
            path: path.to_path_buf(),
            source,
        };
        if let Some(parent) = path.parent().filter(|p| !p.as_os_str().is_empty()) {
            std::fs::create_dir_all(parent).map_err(io)?;
        }
        Ok(JsonlWriter {
            path: path.to_path_buf(),
            out: BufWriter::new(File::create(path).map_err(io)?),
            written: WrittenFile {
                path: path.to_path_buf(),
                ..WrittenFile::default()
            },
        })
    }

    fn write<T: Serialize>(&mut self, record: &T, problems: u64) -> Result<(), CorpusError> {
        let mut line = serde_json::to_string(record).map_err(|source| CorpusError::Json {
            path: self.path.clone(),
            source,
        })?;
        line.push('\n');
        self.out
            .write_all(line.as_bytes())
            .map_err(|source| CorpusError::Io {
                path: self.path.clone(),
                source,
            })?;
        self.written.records += 1;
        self.written.problems += problems;
        self.written.bytes += line.len() as u64;
        Ok(())
    }

    fn finish(mut self) -> Result<WrittenFile, CorpusError> {
        self.out.flush().map_err(|source| CorpusError::Io {
            path: self.path.clone(),
            source,
        })?;
        Ok(self.written)
    }
}
