//! The data funnel: raw documents in, kept documents out, with a report of exactly what each
//! stage removed and why.
//!
//! A run reads `[[source]]`s (JSONL, JSONL.zst, Parquet, text folders, HTML files, WARC), passes
//! every [`Document`] through the configured `[[stage]]`s in order, writes the kept documents as
//! JSONL (optionally zstd), blends sources by `[mixture]` weights when asked, and writes
//! `report.json`, `funnel.svg` and `removed/<reason>.jsonl` samples.
//!
//! Stages (each its own module, configured by its own table, matched in [`stage`]):
//! `extract` (HTML main text), `language` (whatlang + confidence), `gopher_quality`,
//! `gopher_repetition`, `c4`, `fineweb` (datatrove's filters and defaults), `repeated_span`
//! (32+ repeats of a 1-13 token span), `pii` (redaction), `safety` (Aho-Corasick blocklists),
//! `exact_dedup` (xxh3-128, persisted), `minhash_dedup` (LSH, 14x8), `line_dedup`.
//!
//! What it is not: a tokenizer. With a `[tokenize]` table the run ends by writing the kept
//! documents as token shards through a [`DocumentTokenizer`] the caller supplies (`stoke data
//! run` loads a `tokenizer.json`); the funnel has no tensor or tokenizer dependency.
//!
//! Invariants: output order is reading order (parallel work is per chunk, order preserved), so a
//! run is deterministic for a given config and input; bad input is counted with its location and
//! never fatal unless `run.strict = true`.

pub mod c4;
pub mod config;
pub mod document;
pub mod exact_dedup;
pub mod extract;
pub mod fineweb;
pub mod gopher_quality;
pub mod gopher_repetition;
pub mod input;
pub mod langid;
pub mod line_dedup;
pub mod minhash;
pub mod mixture;
pub mod output;
pub mod pii;
pub mod pipeline;
pub mod repeated_span;
pub mod report;
pub mod safety;
pub mod spacy_en;
#[rustfmt::skip]
mod spacy_en_tables;
pub mod stage;
pub mod text;
pub mod tokenize;
pub mod verdicts;
pub mod warc;

pub use config::{FunnelFile, FunnelPlan};
pub use document::{ContentType, Document, DropReason, Metadata};
pub use pipeline::{Progress, run};
pub use report::FunnelReport;
pub use tokenize::DocumentTokenizer;

/// Why a funnel run could not start or finish.
#[derive(Debug, thiserror::Error)]
pub enum FunnelError {
    #[error("funnel config: {0}")]
    Config(String),
    #[error("bad input at {location}: {error} (run.strict = true stops here)")]
    BadInput { location: String, error: String },
    #[error("funnel output: {0}")]
    Output(String),
}
