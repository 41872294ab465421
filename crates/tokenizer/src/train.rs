//! Byte-level BPE training: from a corpus to a Hugging Face `tokenizer.json`.
//!
//! The pipeline: texts are pre-split with a GPT-4-style pattern ([`CL100K_PATTERN`]) into pieces
//! that are counted ([`WordCounts`], parallel with rayon; for the cl100k pattern a hand-written
//! splitter, [`cl100k_pieces`], replaces the regex engine, which was the bottleneck); BPE merges
//! are learned on the unique pieces with their counts ([`train_bpe`]); the result ([`TrainedBpe`]) is saved as a
//! `tokenizer.json` with a `Split` + `ByteLevel` pre-tokenizer, a `ByteLevel` decoder, the BPE
//! vocabulary and merges, and the special tokens as added tokens.
//!
//! Two trainers: stoke's own ([`train_bpe`], the rustbpe design: counts in `u64`, incremental
//! pair-count updates, a lazy max-heap) and the `tokenizers` crate's `BpeTrainer`
//! ([`reference_train`]), kept as the reference the tests compare against. Both learn the same
//! merges: ties between equally frequent pairs go to the pair whose (left, right) ids are smallest
//! in the reference's id order (the 256 byte symbols ordered by their ByteLevel characters, then
//! merged tokens in creation order), and merges that recreate an existing token reuse its id, as
//! the reference does. See `train/bpe.rs` for where the two differ (counts wider than `i32`).
//!
//! Ids of a trained tokenizer: 0-255 are the raw bytes, merged tokens follow in merge order, the
//! special tokens come last.
//!
//! What this is not: a tokenizer runtime (encode/decode at scale goes through `crate::hf`);
//! [`TrainedBpe::encode`] is a slow, simple reference encoder used to check the saved file.

mod bpe;
mod corpus;
mod export;
mod split;

pub use bpe::{TrainProgress, WordCounts, train_bpe};
pub use corpus::{BadRecord, CorpusReader, CorpusStats};
pub use export::byte_to_char;
pub use split::cl100k_pieces;

use std::path::{Path, PathBuf};

/// The GPT-4 (cl100k) pre-split pattern: contractions, words with an optional leading
/// non-letter, 1-3 digit numbers, punctuation runs, newlines, and whitespace that does not eat the
/// space before a word.
pub const CL100K_PATTERN: &str = r"'(?i:[sdmt]|ll|ve|re)|[^\r\n\p{L}\p{N}]?+\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]++[\r\n]*|\s*[\r\n]|\s+(?!\S)|\s+";

/// Errors of training and saving.
#[derive(Debug, thiserror::Error)]
pub enum TrainError {
    #[error("invalid pre-split pattern: {0}")]
    Pattern(String),
    #[error(
        "vocabulary size {vocab_size} is too small: it must exceed 256 bytes + {specials} special tokens"
    )]
    VocabTooSmall { vocab_size: usize, specials: usize },
    #[error("duplicate special token {0:?}")]
    DuplicateSpecial(String),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("tokenizers: {0}")]
    Tokenizers(String),
}

/// Settings of a training run.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainerConfig {
    /// Final vocabulary size: 256 bytes + merged tokens + special tokens.
    pub vocab_size: usize,
    pub special_tokens: Vec<String>,
    pub pattern: String,
    /// Show indicatif progress bars on stderr.
    pub show_progress: bool,
}

impl TrainerConfig {
    pub fn new(vocab_size: usize, special_tokens: Vec<String>) -> Self {
        TrainerConfig {
            vocab_size,
            special_tokens,
            pattern: CL100K_PATTERN.to_string(),
            show_progress: false,
        }
    }

    pub fn validate(&self) -> Result<(), TrainError> {
        if self.vocab_size <= 256 + self.special_tokens.len() {
            return Err(TrainError::VocabTooSmall {
                vocab_size: self.vocab_size,
                specials: self.special_tokens.len(),
            });
        }
        let mut seen = std::collections::HashSet::new();
        for s in &self.special_tokens {
            if !seen.insert(s) {
                return Err(TrainError::DuplicateSpecial(s.clone()));
            }
        }
        fancy_regex::Regex::new(&self.pattern).map_err(|e| TrainError::Pattern(e.to_string()))?;
        Ok(())
    }
}

/// A trained byte-level BPE: token bytes by id, merges in order, special tokens.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct TrainedBpe {
    /// `vocab[id]` = the bytes of token `id`, for the 256 bytes and the merged tokens.
    pub vocab: Vec<Vec<u8>>,
    /// Merges in rank order: `(left, right) -> result` ids.
    pub merges: Vec<((u32, u32), u32)>,
    /// Special tokens; their ids are `vocab.len() + i`.
    pub special_tokens: Vec<String>,
    pub pattern: String,
}

impl TrainedBpe {
    /// Total vocabulary size including special tokens.
    pub fn vocab_size(&self) -> usize {
        self.vocab.len() + self.special_tokens.len()
    }

    /// Merges as the pairs of token strings a `tokenizer.json` lists (ByteLevel characters).
    pub fn merge_strings(&self) -> Vec<(String, String)> {
        self.merges
            .iter()
            .map(|&((a, b), _)| {
                (
                    export::token_string(&self.vocab[a as usize]),
                    export::token_string(&self.vocab[b as usize]),
                )
            })
            .collect()
    }

    /// Encodes plain text (special tokens are not recognized) by applying the merges to every
    /// pre-split piece, lowest rank first. Slow; a reference for tests.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, TrainError> {
        let regex = fancy_regex::Regex::new(&self.pattern)
            .map_err(|e| TrainError::Pattern(e.to_string()))?;
        // Later duplicates of a pair win, as in `tokenizers`' BPE model built from a merge list.
        let mut ranks: ahash::AHashMap<(u32, u32), (usize, u32)> = ahash::AHashMap::new();
        for (rank, &(pair, result)) in self.merges.iter().enumerate() {
            ranks.insert(pair, (rank, result));
        }
        let mut ids = Vec::new();
        for piece in regex.find_iter(text) {
            let piece = piece.map_err(|e| TrainError::Pattern(e.to_string()))?;
            let mut symbols: Vec<u32> = piece.as_str().bytes().map(u32::from).collect();
            loop {
                let best = symbols
                    .windows(2)
                    .enumerate()
                    .filter_map(|(i, w)| ranks.get(&(w[0], w[1])).map(|&(rank, id)| (rank, i, id)))
                    .min();
                let Some((_, i, id)) = best else { break };
                symbols[i] = id;
                symbols.remove(i + 1);
            }
            ids.extend(symbols);
        }
        Ok(ids)
    }

    /// The trained tokenizer as a `tokenizers::Tokenizer`.
    pub fn to_hf(&self) -> Result<tokenizers::Tokenizer, TrainError> {
        export::to_hf(self)
    }

    /// Writes `<dir>/tokenizer.json` (creating `dir`) and returns its path.
    pub fn save(&self, dir: &Path) -> Result<PathBuf, TrainError> {
        std::fs::create_dir_all(dir).map_err(|source| TrainError::Io {
            path: dir.into(),
            source,
        })?;
        let path = dir.join("tokenizer.json");
        self.to_hf()?
            .save(&path, true)
            .map_err(|e| TrainError::Tokenizers(format!("{}: {e}", path.display())))?;
        Ok(path)
    }
}

/// Trains with the `tokenizers` crate's `BpeTrainer` on the same pre-tokenizer, with the full
/// byte alphabet, for comparison and benchmarks. `texts` are the sequences fed to the trainer.
pub fn reference_train<I, S>(
    config: &TrainerConfig,
    texts: I,
) -> Result<tokenizers::Tokenizer, TrainError>
where
    I: Iterator<Item = S> + Send,
    S: AsRef<str> + Send,
{
    config.validate()?;
    use tokenizers::models::TrainerWrapper;
    use tokenizers::models::bpe::BpeTrainerBuilder;
    use tokenizers::pre_tokenizers::byte_level::ByteLevel;
    let specials: Vec<tokenizers::AddedToken> = config
        .special_tokens
        .iter()
        .map(|s| tokenizers::AddedToken::from(s.clone(), true))
        .collect();
    let trainer = BpeTrainerBuilder::new()
        .vocab_size(config.vocab_size)
        .min_frequency(0)
        .show_progress(config.show_progress)
        .special_tokens(specials)
        .initial_alphabet(ByteLevel::alphabet().into_iter().collect())
        .build();
    let mut trainer = TrainerWrapper::BpeTrainer(trainer);
    let mut tokenizer = export::empty_pipeline(&config.pattern)?;
    tokenizer
        .train(&mut trainer, texts)
        .map_err(|e| TrainError::Tokenizers(e.to_string()))?;
    Ok(tokenizer)
}
