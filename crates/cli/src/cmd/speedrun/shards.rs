//! Speedrun stage 3: the pretraining corpus tokenized into token shards.
//!
//! Each document is encoded (no special tokens added), `<|endoftext|>` is appended, and the
//! documents go through `stoke_data::shard::ShardWriter` into `<out>/shards/train/` and
//! `<out>/shards/eval/` (the held-out documents of the evaluation loss). The trainer's loader packs
//! them into rows with document masking.

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use rayon::prelude::*;
use serde::Serialize;
use stoke_data::shard::{ShardWriter, ShardWriterConfig};
use stoke_tokenizer::hf::Tokenizer;

use super::tokenizer::END_OF_TEXT;

/// One shard folder.
#[derive(Clone, Debug, Serialize)]
pub struct ShardSet {
    pub dir: PathBuf,
    pub documents: u64,
    pub tokens: u64,
    pub shards: usize,
}

/// Figures for the summary and the report card.
#[derive(Clone, Debug, Serialize)]
pub struct ShardStats {
    pub train: ShardSet,
    pub eval: ShardSet,
    pub mean_document_tokens: f64,
    pub seconds: f64,
}

/// Tokenizes `train_texts` and `eval_texts` into `<out>/shards/{train,eval}`.
pub fn write_shards(
    tokenizer: &Tokenizer,
    train_texts: &[String],
    eval_texts: &[String],
    out: &Path,
) -> anyhow::Result<ShardStats> {
    let started = Instant::now();
    let train = write_set(tokenizer, train_texts, &out.join("shards").join("train"))?;
    let eval = write_set(tokenizer, eval_texts, &out.join("shards").join("eval"))?;
    Ok(ShardStats {
        mean_document_tokens: train.tokens as f64 / train.documents.max(1) as f64,
        train,
        eval,
        seconds: started.elapsed().as_secs_f64(),
    })
}

fn write_set(tokenizer: &Tokenizer, texts: &[String], dir: &Path) -> anyhow::Result<ShardSet> {
    let end_of_text = tokenizer
        .token_to_id(END_OF_TEXT)
        .with_context(|| format!("{END_OF_TEXT} is not in the tokenizer"))?;
    let documents: Vec<Vec<u32>> = texts
        .par_iter()
        .map(|text| {
            let mut ids = tokenizer.encode(text, false)?;
            ids.push(end_of_text);
            Ok(ids)
        })
        .collect::<Result<_, stoke_tokenizer::error::TokenizerError>>()
        .context("tokenizing the corpus")?;
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: dir.to_path_buf(),
        prefix: "corpus".into(),
        vocab_size: tokenizer.vocab_size() as u64,
        max_tokens_per_shard: 50_000_000,
    })
    .with_context(|| format!("creating shards in {}", dir.display()))?;
    let mut tokens = 0u64;
    for document in &documents {
        tokens += document.len() as u64;
        writer.push_document(document)?;
    }
    let shards = writer.finish()?;
    Ok(ShardSet {
        dir: dir.to_path_buf(),
        documents: documents.len() as u64,
        tokens,
        shards: shards.len(),
    })
}
