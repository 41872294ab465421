//! Speedrun stage 1: the data, generated (nothing is downloaded).
//!
//! Writes, under `<out>/data/`: `corpus.jsonl` (pretraining documents, training split),
//! `corpus_eval.jsonl` (documents of held-out problems, for the pretraining evaluation loss),
//! `sft.jsonl` (chat conversations, training split), `held_out.jsonl` (the held-out problems with
//! answers) and `held_out_chat.jsonl` (the same problems as conversations, the SFT evaluation
//! loss). Held-out problems are disjoint from the training split by construction
//! (`stoke_eval::arithmetic`), so neither pretraining nor SFT ever sees an evaluation question.

use std::path::Path;

use anyhow::Context;
use serde::Serialize;
use stoke_eval::arithmetic::{ArithmeticTask, Problem, Split};
use stoke_eval::corpus::{
    WrittenFile, write_chat_jsonl, write_pretraining_jsonl, write_problems_jsonl,
};

use super::recipe::Recipe;

/// The generated files and the held-out problems (kept in memory for the evaluation).
#[derive(Debug)]
pub struct GeneratedData {
    pub corpus: WrittenFile,
    pub corpus_eval: WrittenFile,
    pub sft: WrittenFile,
    pub held_out_chat: WrittenFile,
    pub held_out: Vec<Problem>,
    /// Texts for tokenizer training: the corpus documents and the SFT replies.
    pub tokenizer_texts: Vec<String>,
}

/// Figures for the summary and the report card.
#[derive(Clone, Debug, Serialize)]
pub struct DataStats {
    pub levels: Vec<&'static str>,
    pub corpus_documents: u64,
    pub corpus_problems: u64,
    pub corpus_bytes: u64,
    pub sft_conversations: u64,
    pub held_out_problems: usize,
    pub example_document: String,
}

/// Draws the problems and writes every data file.
pub fn generate(recipe: &Recipe, out: &Path, seed: u64) -> anyhow::Result<GeneratedData> {
    let dir = out.join("data");
    let task = ArithmeticTask::new(recipe.levels.clone(), recipe.held_out_fraction)?;
    // Different seeds per file so the corpus, the SFT set and the evaluation sets are separate
    // draws (the held-out split is fixed by question text, whatever the seed).
    let corpus_problems = task.problems(Split::Train, recipe.corpus_problems, seed)?;
    let sft_problems = task.problems(Split::Train, recipe.sft_problems, seed ^ 0x5f7)?;
    let held_out = task.problems(Split::HeldOut, recipe.held_out_problems, seed)?;
    let corpus_eval_problems =
        task.problems(Split::HeldOut, recipe.corpus_eval_problems, seed ^ 0xe7a1)?;

    let corpus = write_pretraining_jsonl(&dir.join("corpus.jsonl"), &corpus_problems, seed)?;
    let corpus_eval =
        write_pretraining_jsonl(&dir.join("corpus_eval.jsonl"), &corpus_eval_problems, seed)?;
    let sft = write_chat_jsonl(&dir.join("sft.jsonl"), &sft_problems)?;
    let held_out_chat = write_chat_jsonl(&dir.join("held_out_chat.jsonl"), &held_out)?;
    write_problems_jsonl(&dir.join("held_out.jsonl"), &held_out)?;

    let mut tokenizer_texts = read_texts(&corpus.path)?;
    tokenizer_texts.extend(sft_problems.iter().map(Problem::chat_solution));
    Ok(GeneratedData {
        corpus,
        corpus_eval,
        sft,
        held_out_chat,
        held_out,
        tokenizer_texts,
    })
}

impl GeneratedData {
    pub fn stats(&self, recipe: &Recipe) -> DataStats {
        DataStats {
            levels: recipe.levels.iter().map(|l| l.name()).collect(),
            corpus_documents: self.corpus.records,
            corpus_problems: self.corpus.problems,
            corpus_bytes: self.corpus.bytes,
            sft_conversations: self.sft.records,
            held_out_problems: self.held_out.len(),
            example_document: self.tokenizer_texts.first().cloned().unwrap_or_default(),
        }
    }
}

#[derive(serde::Deserialize)]
struct TextRecord {
    text: String,
}

/// The `text` field of every line of a JSONL file this stage wrote.
pub fn read_texts(path: &Path) -> anyhow::Result<Vec<String>> {
    let content =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    content
        .lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str::<TextRecord>(line)
                .map(|r| r.text)
                .with_context(|| format!("{}: line {}", path.display(), i + 1))
        })
        .collect()
}
