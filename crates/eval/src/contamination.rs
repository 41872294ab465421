//! N-gram contamination detection between evaluation items and a training corpus.
//!
//! What it is: the training side is indexed once ([`index_files`], [`NgramIndex::from_texts`],
//! [`IndexBuilder`]) into a sorted, deduplicated `Vec<u64>` of 64-bit xxh3 hashes of every word
//! n-gram (13 by default, [`IndexConfig::n`]); each evaluation item is then checked ([`check`],
//! [`report`]) by hashing its n-grams the same way and binary-searching them. An item is
//! contaminated when at least one of its n-grams occurs in the training corpus.
//!
//! Normalization ([`normalize`]): text is lowercased (Unicode-aware) and split into words, a word
//! being a maximal run of `char::is_alphanumeric` characters; everything else (spaces,
//! punctuation, line breaks) only separates words. So "The cat, sat" and "the CAT sat" agree.
//! An n-gram hash is the xxh3 of the n words' own xxh3 hashes (little-endian bytes): the same
//! text gives the same hash on every machine and run.
//!
//! Invariants: no false negatives: every n-gram of an indexed document is in the index, so a
//! planted copy of an item (of at least n words) is always found. A false positive needs a 64-bit
//! hash collision (of a word or of an n-gram): probability about `item n-grams × distinct
//! n-grams / 2^64`, about 1e-8 for 10^5 item n-grams against 10^9 indexed ones. Documents are
//! separate: an n-gram never spans two JSONL lines, Parquet rows or files; a `.txt` file is one
//! document, so n-grams do span its line breaks. Items with fewer than n words have no n-gram:
//! they are reported as `too_short` and never counted as contaminated (they are not checked).
//! Bad input is an error naming the file and line (or row), never silently skipped; only blank
//! JSONL lines are skipped.
//!
//! Memory: 8 bytes per distinct n-gram, plus the transient buffer: hashes are appended and the
//! buffer is sorted and deduplicated in place whenever it reaches a threshold, which is then set
//! to `max(max_buffer, 2 × distinct so far)` ([`IndexConfig::max_buffer`], default 2^24). Peak
//! memory is therefore at most about `max(max_buffer, 2 × distinct) × 8` bytes, and about
//! `distinct × 8` resident when n-grams rarely repeat (the reserved tail is never touched).
//! Files are read line by line (JSONL, zstd JSONL, `.txt`) or row group by row group (Parquet),
//! so only one line or row group of text is held at a time.
//!
//! Measured with `cargo run --release -p stoke-eval --example contamination_index -- 1024` on a
//! 2 vCPU Intel Xeon (AVX-512): 1 GiB of JSONL (509,580 documents of 300 random words, 152.9M
//! words) gives 146.8M distinct 13-grams, a 1,120 MiB table, indexed in 23.7 s (43 MiB/s, one
//! thread) at a peak RSS (VmHWM) of 1,125 MiB; the same GiB as one `.txt` document: 153.7M
//! distinct, 25.7 s, peak RSS 1,178 MiB. Random words make every 13-gram distinct, the worst case
//! for memory (one 8-byte hash per word of text, about 1.1 GiB per GiB of text); real corpora
//! repeat n-grams and cost less.
//!
//! What it is not: no scoring (the caller scores the clean subset from
//! [`ContaminationReport::contaminated`]), no fuzzy or token-level matching, no persistence of
//! the index.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

use serde::Serialize;
use xxhash_rust::xxh3::xxh3_64;

/// The default n-gram length in words (GPT-3's contamination study).
pub const DEFAULT_N: usize = 13;

/// How the training side is indexed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct IndexConfig {
    /// N-gram length in words (at least 1).
    pub n: usize,
    /// Hashes buffered before the buffer is sorted and deduplicated in place.
    pub max_buffer: usize,
}

impl Default for IndexConfig {
    fn default() -> Self {
        Self {
            n: DEFAULT_N,
            max_buffer: 1 << 24,
        }
    }
}

/// Why the training side could not be indexed.
#[derive(Debug, thiserror::Error)]
pub enum ContaminationError {
    #[error("the n-gram length must be at least 1")]
    ZeroN,
    #[error("no training files (.jsonl, .ndjson, .jsonl.zst, .txt, .parquet) under {paths}")]
    NoFiles { paths: String },
    #[error("{}: {source}", path.display())]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("{}:{line}: {message}", path.display())]
    Line {
        path: PathBuf,
        line: usize,
        message: String,
    },
    #[error("{}: {message}", path.display())]
    File { path: PathBuf, message: String },
}

/// Lowercased words of `text`: maximal runs of alphanumeric characters.
pub fn normalize(text: &str) -> Vec<String> {
    let mut words = Vec::new();
    for_each_word(text, &mut String::new(), |w| words.push(w.to_string()));
    words
}

/// Calls `f` with each lowercased word of `text`; `word` is a reusable buffer.
fn for_each_word(text: &str, word: &mut String, mut f: impl FnMut(&str)) {
    word.clear();
    for c in text.chars() {
        if c.is_ascii() {
            if c.is_ascii_alphanumeric() {
                word.push(c.to_ascii_lowercase());
                continue;
            }
        } else if c.is_alphanumeric() {
            word.extend(c.to_lowercase());
            continue;
        }
        if !word.is_empty() {
            f(word);
            word.clear();
        }
    }
    if !word.is_empty() {
        f(word);
        word.clear();
    }
}

/// Rolling window of the last words' hashes of one document; yields one hash per full n-gram.
#[derive(Debug, Clone)]
struct Shingler {
    n: usize,
    bytes: Vec<u8>,
}

impl Shingler {
    fn new(n: usize) -> Self {
        Self {
            n,
            bytes: Vec::with_capacity(64 * 8 * n),
        }
    }

    fn reset(&mut self) {
        self.bytes.clear();
    }

    fn push(&mut self, word: &str) -> Option<u64> {
        let need = 8 * self.n;
        if self.bytes.len() >= 64 * need {
            self.bytes.drain(..self.bytes.len() + 8 - need);
        }
        self.bytes
            .extend_from_slice(&xxh3_64(word.as_bytes()).to_le_bytes());
        let len = self.bytes.len();
        (len >= need).then(|| xxh3_64(&self.bytes[len - need..]))
    }
}

/// The hashed n-grams of a training corpus: sorted, distinct, 8 bytes each.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NgramIndex {
    n: usize,
    hashes: Vec<u64>,
    seen: u64,
    documents: u64,
}

impl NgramIndex {
    /// Indexes in-memory documents (each text is one document).
    pub fn from_texts<'a>(
        texts: impl IntoIterator<Item = &'a str>,
        config: &IndexConfig,
    ) -> Result<Self, ContaminationError> {
        let mut builder = IndexBuilder::new(config)?;
        for text in texts {
            builder.add_document(text);
        }
        Ok(builder.finish())
    }

    /// The n-gram length in words.
    pub fn n(&self) -> usize {
        self.n
    }

    /// Distinct n-grams indexed.
    pub fn len(&self) -> usize {
        self.hashes.len()
    }

    pub fn is_empty(&self) -> bool {
        self.hashes.is_empty()
    }

    /// N-grams seen while indexing, duplicates included.
    pub fn ngrams_seen(&self) -> u64 {
        self.seen
    }

    /// Documents indexed.
    pub fn documents(&self) -> u64 {
        self.documents
    }

    /// Bytes held by the hash table.
    pub fn memory_bytes(&self) -> usize {
        self.hashes.capacity() * 8
    }

    fn contains(&self, hash: u64) -> bool {
        self.hashes.binary_search(&hash).is_ok()
    }
}

/// Streaming construction of an [`NgramIndex`], one document at a time.
#[derive(Debug)]
pub struct IndexBuilder {
    shingler: Shingler,
    word: String,
    hashes: Vec<u64>,
    max_buffer: usize,
    threshold: usize,
    seen: u64,
    documents: u64,
}

impl IndexBuilder {
    pub fn new(config: &IndexConfig) -> Result<Self, ContaminationError> {
        if config.n == 0 {
            return Err(ContaminationError::ZeroN);
        }
        let max_buffer = config.max_buffer.max(1);
        Ok(Self {
            shingler: Shingler::new(config.n),
            word: String::new(),
            hashes: Vec::with_capacity(max_buffer.min(1 << 20)),
            max_buffer,
            threshold: max_buffer,
            seen: 0,
            documents: 0,
        })
    }

    /// Adds one whole document.
    pub fn add_document(&mut self, text: &str) {
        self.start_document();
        self.continue_document(text);
    }

    /// Starts a document: no n-gram spans this boundary.
    fn start_document(&mut self) {
        self.shingler.reset();
        self.documents += 1;
    }

    /// Appends text to the current document (a separator is implied at its end).
    fn continue_document(&mut self, text: &str) {
        let Self {
            shingler,
            word,
            hashes,
            max_buffer,
            threshold,
            seen,
            ..
        } = self;
        for_each_word(text, word, |w| {
            if let Some(hash) = shingler.push(w) {
                *seen += 1;
                hashes.push(hash);
                if hashes.len() >= *threshold {
                    // Room for as many new hashes as there are distinct ones (at least
                    // max_buffer): the buffer stays under 2x distinct, sorts stay amortized.
                    sort_dedup(hashes);
                    *threshold = (*max_buffer).max(2 * hashes.len());
                    hashes.reserve_exact(*threshold - hashes.len());
                }
            }
        });
    }

    pub fn finish(mut self) -> NgramIndex {
        sort_dedup(&mut self.hashes);
        self.hashes.shrink_to_fit();
        NgramIndex {
            n: self.shingler.n,
            hashes: self.hashes,
            seen: self.seen,
            documents: self.documents,
        }
    }
}

fn sort_dedup(hashes: &mut Vec<u64>) {
    hashes.sort_unstable();
    hashes.dedup();
}

#[derive(Debug, Clone, Copy)]
enum Format {
    Jsonl,
    JsonlZst,
    Text,
    Parquet,
}

fn format_of(path: &Path) -> Option<Format> {
    let name = path.file_name()?.to_str()?.to_lowercase();
    if name.ends_with(".jsonl.zst") || name.ends_with(".ndjson.zst") {
        Some(Format::JsonlZst)
    } else if name.ends_with(".jsonl") || name.ends_with(".ndjson") {
        Some(Format::Jsonl)
    } else if name.ends_with(".txt") {
        Some(Format::Text)
    } else if name.ends_with(".parquet") {
        Some(Format::Parquet)
    } else {
        None
    }
}

fn io_error(path: &Path) -> impl FnOnce(std::io::Error) -> ContaminationError + '_ {
    move |source| ContaminationError::Io {
        path: path.to_path_buf(),
        source,
    }
}

/// Files under `dir` (recursively, sorted by name) with a known extension.
fn walk(dir: &Path, files: &mut Vec<(PathBuf, Format)>) -> Result<(), ContaminationError> {
    let mut entries = std::fs::read_dir(dir)
        .map_err(io_error(dir))?
        .collect::<Result<Vec<_>, _>>()
        .map_err(io_error(dir))?;
    entries.sort_by_key(|e| e.file_name());
    for entry in entries {
        let path = entry.path();
        if entry.file_type().map_err(io_error(&path))?.is_dir() {
            walk(&path, files)?;
        } else if let Some(format) = format_of(&path).filter(|_| path.is_file()) {
            files.push((path, format));
        }
    }
    Ok(())
}

/// Indexes training files: each path is a file or a folder (walked recursively in name order,
/// taking files ending in `.jsonl`, `.ndjson`, `.jsonl.zst`, `.ndjson.zst`, `.txt`, `.parquet`).
/// JSONL lines and Parquet rows are documents whose text is the string field `text_field`; a
/// `.txt` file is one document.
pub fn index_files(
    paths: &[PathBuf],
    config: &IndexConfig,
    text_field: &str,
) -> Result<NgramIndex, ContaminationError> {
    let mut files = Vec::new();
    for path in paths {
        if std::fs::metadata(path).map_err(io_error(path))?.is_dir() {
            walk(path, &mut files)?;
        } else {
            let format = format_of(path).ok_or_else(|| ContaminationError::File {
                path: path.clone(),
                message: "unknown training file type (expected .jsonl, .ndjson, .jsonl.zst, \
                          .txt or .parquet)"
                    .into(),
            })?;
            files.push((path.clone(), format));
        }
    }
    if files.is_empty() {
        let shown: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
        return Err(ContaminationError::NoFiles {
            paths: shown.join(", "),
        });
    }
    let mut builder = IndexBuilder::new(config)?;
    for (path, format) in &files {
        let open = || File::open(path).map_err(io_error(path));
        match format {
            Format::Jsonl => read_jsonl(BufReader::new(open()?), path, text_field, &mut builder)?,
            Format::JsonlZst => {
                let decoder = zstd::Decoder::new(open()?).map_err(io_error(path))?;
                read_jsonl(BufReader::new(decoder), path, text_field, &mut builder)?
            }
            Format::Text => read_text(BufReader::new(open()?), path, &mut builder)?,
            Format::Parquet => read_parquet(open()?, path, text_field, &mut builder)?,
        }
    }
    Ok(builder.finish())
}

fn read_lines(
    mut reader: impl BufRead,
    path: &Path,
    mut f: impl FnMut(&str, usize) -> Result<(), ContaminationError>,
) -> Result<(), ContaminationError> {
    let mut line = String::new();
    for number in 1.. {
        line.clear();
        match reader.read_line(&mut line) {
            Ok(0) => break,
            Ok(_) => f(&line, number)?,
            Err(e) => {
                return Err(ContaminationError::Line {
                    path: path.to_path_buf(),
                    line: number,
                    message: e.to_string(),
                });
            }
        }
    }
    Ok(())
}

fn read_jsonl(
    reader: impl BufRead,
    path: &Path,
    field: &str,
    builder: &mut IndexBuilder,
) -> Result<(), ContaminationError> {
    read_lines(reader, path, |line, number| {
        if line.trim().is_empty() {
            return Ok(());
        }
        let error = |message: String| ContaminationError::Line {
            path: path.to_path_buf(),
            line: number,
            message,
        };
        let value: serde_json::Value =
            serde_json::from_str(line).map_err(|e| error(format!("not JSON: {e}")))?;
        let text = value
            .get(field)
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| error(format!("no string field \"{field}\"")))?;
        builder.add_document(text);
        Ok(())
    })
}

fn read_text(
    reader: impl BufRead,
    path: &Path,
    builder: &mut IndexBuilder,
) -> Result<(), ContaminationError> {
    builder.start_document();
    read_lines(reader, path, |line, _| {
        builder.continue_document(line);
        Ok(())
    })
}

fn read_parquet(
    file: File,
    path: &Path,
    field: &str,
    builder: &mut IndexBuilder,
) -> Result<(), ContaminationError> {
    use parquet::file::reader::{FileReader, SerializedFileReader};
    let error = |message: String| ContaminationError::File {
        path: path.to_path_buf(),
        message,
    };
    let reader = SerializedFileReader::new(file).map_err(|e| error(format!("Parquet: {e}")))?;
    let rows = reader
        .get_row_iter(None)
        .map_err(|e| error(format!("Parquet: {e}")))?;
    for (i, row) in rows.enumerate() {
        let row = row.map_err(|e| error(format!("row {}: Parquet: {e}", i + 1)))?;
        let value = row.to_json_value();
        let text = value
            .get(field)
            .and_then(serde_json::Value::as_str)
            .ok_or_else(|| error(format!("row {}: no string field \"{field}\"", i + 1)))?;
        builder.add_document(text);
    }
    Ok(())
}

/// How much of one item's text occurs in the training corpus.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
pub struct Overlap {
    /// The item's n-grams (0 when it is too short).
    pub ngrams: usize,
    /// Of those, the ones found in the index.
    pub matched: usize,
    /// The first matched n-gram, normalized words joined by one space.
    pub first_match: Option<String>,
    /// Fewer words than n: not checked, never contaminated.
    pub too_short: bool,
}

impl Overlap {
    pub fn contaminated(&self) -> bool {
        self.matched > 0
    }

    /// Matched n-grams over all n-grams (0 for a too-short item).
    pub fn fraction(&self) -> f64 {
        if self.ngrams == 0 {
            0.0
        } else {
            self.matched as f64 / self.ngrams as f64
        }
    }
}

/// Checks one evaluation item against the index.
pub fn check(index: &NgramIndex, text: &str) -> Overlap {
    let words = normalize(text);
    let n = index.n;
    let mut overlap = Overlap {
        ngrams: words.len().saturating_sub(n - 1),
        matched: 0,
        first_match: None,
        too_short: words.len() < n,
    };
    let mut shingler = Shingler::new(n);
    for (i, word) in words.iter().enumerate() {
        if shingler.push(word).is_some_and(|h| index.contains(h)) {
            overlap.matched += 1;
            if overlap.first_match.is_none() {
                overlap.first_match = Some(words[i + 1 - n..=i].join(" "));
            }
        }
    }
    overlap
}

/// Contamination of a set of evaluation items.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct ContaminationReport {
    /// N-gram length in words.
    pub n: usize,
    /// Items checked.
    pub items: usize,
    /// Indices (into the items) of the contaminated ones, ascending.
    pub contaminated: Vec<usize>,
    /// Contaminated items over all items (0 when there are none).
    pub fraction: f64,
    /// Items with fewer than n words (not checked, counted clean).
    pub too_short: usize,
}

/// Checks every item; see [`check`].
pub fn report(index: &NgramIndex, texts: &[String]) -> ContaminationReport {
    let mut contaminated = Vec::new();
    let mut too_short = 0;
    for (i, text) in texts.iter().enumerate() {
        let overlap = check(index, text);
        too_short += usize::from(overlap.too_short);
        if overlap.contaminated() {
            contaminated.push(i);
        }
    }
    let fraction = if texts.is_empty() {
        0.0
    } else {
        contaminated.len() as f64 / texts.len() as f64
    };
    ContaminationReport {
        n: index.n,
        items: texts.len(),
        contaminated,
        fraction,
        too_short,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn normalize_lowercases_and_splits_on_non_alphanumerics() {
        assert_eq!(
            normalize("The  CAT, sat--on\nthe mat."),
            ["the", "cat", "sat", "on", "the", "mat"]
        );
        assert_eq!(normalize("x=3*y_2; (z)"), ["x", "3", "y", "2", "z"]);
        assert!(normalize(" ,.;:!? \t\n").is_empty());
    }

    #[test]
    fn normalize_is_unicode_aware() {
        assert_eq!(normalize("Ärger ÜBER Straße"), ["ärger", "über", "straße"]);
        assert_eq!(normalize("ΣΟΦΙΑ—мир «Привет»"), ["σοφια", "мир", "привет"]);
        assert_eq!(normalize("中文，测试"), ["中文", "测试"]);
        assert_eq!(normalize("née’s café"), ["née", "s", "café"]);
    }

    #[test]
    fn same_words_hash_the_same_whatever_the_punctuation() {
        let config = IndexConfig {
            n: 3,
            max_buffer: 4,
        };
        let index = NgramIndex::from_texts(["Alpha beta, GAMMA delta!"], &config).unwrap();
        assert_eq!(index.len(), 2);
        let overlap = check(&index, "...alpha BETA gamma...");
        assert_eq!((overlap.ngrams, overlap.matched), (1, 1));
        assert_eq!(overlap.first_match.as_deref(), Some("alpha beta gamma"));
        assert!(check(&index, "alpha beta").too_short);
        assert!(!check(&index, "alpha gamma beta").contaminated());
    }

    #[test]
    fn the_buffer_stays_under_twice_the_distinct_count() {
        let document: Vec<String> = (0..1000).map(|i| format!("w{i}")).collect();
        let document = document.join(" ");
        let config = IndexConfig {
            n: 1,
            max_buffer: 64,
        };
        let mut builder = IndexBuilder::new(&config).unwrap();
        for _ in 0..50 {
            builder.add_document(&document);
            assert!(builder.hashes.len() <= builder.threshold && builder.threshold <= 2000);
        }
        let index = builder.finish();
        assert_eq!((index.len(), index.ngrams_seen()), (1000, 50_000));
    }

    #[test]
    fn long_documents_roll_the_window() {
        let text: Vec<String> = (0..2000).map(|i| format!("w{i}")).collect();
        let config = IndexConfig {
            n: 5,
            max_buffer: 100,
        };
        let index = NgramIndex::from_texts([text.join(" ").as_str()], &config).unwrap();
        assert_eq!(index.len(), 1996);
        assert!(check(&index, &text[1500..1505].join(" ")).contaminated());
        assert!(matches!(
            NgramIndex::from_texts(
                [""],
                &IndexConfig {
                    n: 0,
                    max_buffer: 1
                }
            ),
            Err(ContaminationError::ZeroN)
        ));
    }
}
