//! The optional last step of a run: the kept documents become token shards
//! ([`crate::shard::ShardWriter`]), each document followed by the end-of-text token.
//!
//! The funnel knows no tokenizer (this crate depends on no tokenizer crate): the caller passes a
//! [`DocumentTokenizer`], the narrow trait below; `stoke data run` implements it with the Hugging
//! Face `tokenizer.json` named in the config. Tokenization reads the finished output file back
//! (after the mixture, if any), encodes chunks in parallel and writes shards in output order, so
//! shard document `i` is output line `i`.

use std::io::BufRead;
use std::path::{Path, PathBuf};

use rayon::prelude::*;
use serde::{Deserialize, Serialize};

use super::document::Document;
use crate::shard::{ShardSummary, ShardWriter, ShardWriterConfig};

/// Text to token ids. Implementations must be usable from many threads at once.
pub trait DocumentTokenizer: Sync {
    fn encode(&self, text: &str) -> Result<Vec<u32>, String>;
    /// Every id `encode` returns, and the end-of-text id, is below this.
    fn vocab_size(&self) -> u64;
    /// The id appended after every document.
    fn end_of_text(&self) -> u32;
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TokenizeFile {
    /// A folder holding `tokenizer.json` (read by the caller, see the module doc).
    pub tokenizer: PathBuf,
    /// The end-of-text token appended to every document.
    pub end_of_text: String,
    /// Where the shards go.
    pub output_dir: PathBuf,
    #[serde(default = "default_prefix")]
    pub prefix: String,
    #[serde(default = "default_max_tokens")]
    pub max_tokens_per_shard: u64,
}

fn default_prefix() -> String {
    "shard".into()
}
fn default_max_tokens() -> u64 {
    100_000_000
}

#[derive(Clone, Debug)]
pub struct TokenizeOutput {
    pub tokenizer: PathBuf,
    pub end_of_text: String,
    pub output_dir: PathBuf,
    pub prefix: String,
    pub max_tokens_per_shard: u64,
}

#[derive(Clone, Debug, Default, Serialize)]
pub struct TokenizeReport {
    pub documents: u64,
    pub tokens: u64,
    pub shards: Vec<ShardSummary>,
}

impl TokenizeFile {
    pub fn validate(self, base_dir: &Path) -> Result<TokenizeOutput, String> {
        if self.max_tokens_per_shard == 0 {
            return Err("tokenize.max_tokens_per_shard must be positive".into());
        }
        if self.end_of_text.is_empty() {
            return Err("tokenize.end_of_text must name a token".into());
        }
        Ok(TokenizeOutput {
            tokenizer: base_dir.join(self.tokenizer),
            end_of_text: self.end_of_text,
            output_dir: base_dir.join(self.output_dir),
            prefix: self.prefix,
            max_tokens_per_shard: self.max_tokens_per_shard,
        })
    }
}

/// Reads the JSONL(.zst) output back and writes its documents as shards.
pub fn tokenize_output(
    output: &Path,
    settings: &TokenizeOutput,
    tokenizer: &dyn DocumentTokenizer,
    chunk_size: usize,
) -> Result<TokenizeReport, String> {
    let file = std::fs::File::open(output).map_err(|e| format!("{}: {e}", output.display()))?;
    let reader: Box<dyn BufRead> = if output.extension().is_some_and(|e| e == "zst") {
        Box::new(std::io::BufReader::new(
            zstd::Decoder::new(file).map_err(|e| format!("{}: {e}", output.display()))?,
        ))
    } else {
        Box::new(std::io::BufReader::new(file))
    };
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: settings.output_dir.clone(),
        prefix: settings.prefix.clone(),
        vocab_size: tokenizer.vocab_size(),
        max_tokens_per_shard: settings.max_tokens_per_shard,
    })
    .map_err(|e| e.to_string())?;
    let mut report = TokenizeReport::default();
    let mut lines = reader.lines().enumerate();
    loop {
        let mut chunk: Vec<(usize, String)> = Vec::with_capacity(chunk_size);
        for (number, line) in lines.by_ref() {
            chunk.push((
                number + 1,
                line.map_err(|e| format!("{}: {e}", output.display()))?,
            ));
            if chunk.len() == chunk_size {
                break;
            }
        }
        if chunk.is_empty() {
            break;
        }
        let encoded: Vec<Result<Vec<u32>, String>> = chunk
            .par_iter()
            .map(|(number, line)| {
                let location = format!("{}:{number}", output.display());
                let doc: Document =
                    serde_json::from_str(line).map_err(|e| format!("{location}: {e}"))?;
                let mut ids = tokenizer
                    .encode(&doc.text)
                    .map_err(|e| format!("{location}: {e}"))?;
                ids.push(tokenizer.end_of_text());
                Ok(ids)
            })
            .collect();
        for ids in encoded {
            let ids = ids?;
            report.documents += 1;
            report.tokens += ids.len() as u64;
            writer.push_document(&ids).map_err(|e| e.to_string())?;
        }
    }
    report.shards = writer.finish().map_err(|e| e.to_string())?;
    Ok(report)
}
