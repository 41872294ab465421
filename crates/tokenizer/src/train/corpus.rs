//! Reading a training corpus: plain text files (one text per line, the line ending kept, as the
//! `tokenizers` crate's `train_from_files` does) and JSONL files (`.jsonl`/`.json`: one document
//! per line, its text in a named field).
//!
//! Bad input never stops the run: an unreadable file, a line that is not UTF-8, a JSONL line that
//! is not JSON or lacks the field is counted as a [`BadRecord`] with its file and line number and
//! skipped. The first [`MAX_KEPT_BAD_RECORDS`] are kept for the report.

use std::fs::File;
use std::io::{BufRead, BufReader};
use std::path::{Path, PathBuf};

/// How many bad records keep their location (the rest are only counted).
pub const MAX_KEPT_BAD_RECORDS: usize = 20;

/// A skipped piece of input and why.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct BadRecord {
    pub path: PathBuf,
    /// 1-based line number; 0 when the whole file failed.
    pub line: u64,
    pub reason: String,
}

impl std::fmt::Display for BadRecord {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        if self.line == 0 {
            write!(f, "{}: {}", self.path.display(), self.reason)
        } else {
            write!(f, "{}:{}: {}", self.path.display(), self.line, self.reason)
        }
    }
}

/// What has been read so far.
#[derive(Clone, Debug, Default)]
pub struct CorpusStats {
    pub files: u64,
    pub texts: u64,
    pub bytes: u64,
    pub bad_records: u64,
    pub first_bad: Vec<BadRecord>,
}

impl CorpusStats {
    fn bad(&mut self, record: BadRecord) {
        self.bad_records += 1;
        if self.first_bad.len() < MAX_KEPT_BAD_RECORDS {
            self.first_bad.push(record);
        }
    }
}

/// Streams texts from a list of files in batches.
pub struct CorpusReader {
    paths: Vec<PathBuf>,
    next_path: usize,
    current: Option<OpenFile>,
    /// JSONL field holding the text.
    field: String,
    pub stats: CorpusStats,
}

struct OpenFile {
    path: PathBuf,
    reader: BufReader<File>,
    line: u64,
    jsonl: bool,
}

fn is_jsonl(path: &Path) -> bool {
    matches!(
        path.extension().and_then(|e| e.to_str()),
        Some("jsonl" | "json" | "ndjson")
    )
}

impl CorpusReader {
    pub fn new(paths: Vec<PathBuf>, field: impl Into<String>) -> Self {
        CorpusReader {
            paths,
            next_path: 0,
            current: None,
            field: field.into(),
            stats: CorpusStats::default(),
        }
    }

    /// Total size of the readable input files in bytes (for a progress bar).
    pub fn total_bytes(&self) -> u64 {
        self.paths
            .iter()
            .filter_map(|p| std::fs::metadata(p).ok())
            .map(|m| m.len())
            .sum()
    }

    /// Up to about `max_bytes` of texts; `None` when every file has been read.
    pub fn next_batch(&mut self, max_bytes: usize) -> Option<Vec<String>> {
        let mut batch = Vec::new();
        let mut size = 0usize;
        let mut buf = Vec::new();
        while size < max_bytes {
            if self.current.is_none() && !self.open_next() {
                break;
            }
            let Some(file) = self.current.as_mut() else {
                break;
            };
            buf.clear();
            match file.reader.read_until(b'\n', &mut buf) {
                Ok(0) => {
                    self.current = None;
                    continue;
                }
                Ok(_) => {}
                Err(e) => {
                    let record = BadRecord {
                        path: file.path.clone(),
                        line: file.line + 1,
                        reason: e.to_string(),
                    };
                    self.current = None;
                    self.stats.bad(record);
                    continue;
                }
            }
            file.line += 1;
            self.stats.bytes += buf.len() as u64;
            let (path, line, jsonl) = (file.path.clone(), file.line, file.jsonl);
            let text = match std::str::from_utf8(&buf) {
                Err(e) => Err(format!("invalid UTF-8 at byte {}", e.valid_up_to())),
                Ok(s) if jsonl => {
                    if s.trim().is_empty() {
                        continue;
                    }
                    extract_field(s, &self.field)
                }
                Ok(s) => Ok(s.to_owned()),
            };
            match text {
                Ok(text) => {
                    size += text.len();
                    self.stats.texts += 1;
                    batch.push(text);
                }
                Err(reason) => self.stats.bad(BadRecord { path, line, reason }),
            }
        }
        if batch.is_empty() && self.current.is_none() && self.next_path >= self.paths.len() {
            None
        } else {
            Some(batch)
        }
    }

    fn open_next(&mut self) -> bool {
        while self.next_path < self.paths.len() {
            let path = self.paths[self.next_path].clone();
            self.next_path += 1;
            match File::open(&path) {
                Ok(file) => {
                    self.stats.files += 1;
                    let jsonl = is_jsonl(&path);
                    self.current = Some(OpenFile {
                        path,
                        reader: BufReader::with_capacity(1 << 20, file),
                        line: 0,
                        jsonl,
                    });
                    return true;
                }
                Err(e) => self.stats.bad(BadRecord {
                    path,
                    line: 0,
                    reason: e.to_string(),
                }),
            }
        }
        false
    }
}

fn extract_field(line: &str, field: &str) -> Result<String, String> {
    let value: serde_json::Value =
        serde_json::from_str(line).map_err(|e| format!("invalid JSON: {e}"))?;
    match value.get(field) {
        Some(serde_json::Value::String(s)) => Ok(s.clone()),
        Some(_) => Err(format!("field `{field}` is not a string")),
        None => Err(format!("missing field `{field}`")),
    }
}
