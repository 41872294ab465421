//! Where the trainer's micro-batches come from: the [`BatchSource`] trait and its two
//! implementations, [`ShardSource`] (pretraining over token shards) and [`ChatSource`] (SFT over
//! chat JSONL rendered with the tokenizer's chat template).
//!
//! Every source yields [`PackedBatch`]es: `batch_size x seq_len` inputs, next-token targets,
//! position ids that restart at 0 for every document piece, row-local document ids for document
//! masking ([`stoke_data::packing::PAD_DOC`] on padding), and the loss mask. The trainer treats
//! all sources alike; what differs is which targets the loss mask keeps (every in-document target
//! for pretraining, assistant targets only for SFT).
//!
//! Invariants every source keeps:
//! - `cursor()` taken between two `next_batch()` calls and given to `restore()` on a source opened
//!   over the same data with the same config makes it yield exactly the batches the uninterrupted
//!   source would have yielded next. Cursors are JSON so the checkpoint can store them opaquely.
//! - A cursor from other data or another config is refused with a [`SourceError`], never
//!   silently accepted.
//! - `None` means the configured epochs are exhausted; an unbounded source never returns it.
//!
//! What this is not: no tensors (the trainer turns a batch into tensors), no tokenizing of
//! pretraining text (shards hold token ids already), no background prefetch.

mod chat;
mod chat_jsonl;
mod shards;
pub mod teacher_topk;

use std::path::PathBuf;

pub use chat::{ChatCursor, ChatSource, ChatSourceConfig};
pub use chat_jsonl::{ChatLoadReport, SkipReason, SkippedLine};
pub use shards::ShardSource;
pub use stoke_data::packing::PackedBatch;

use stoke_data::loader::LoaderError;
use stoke_data::shard::ShardError;
use stoke_tokenizer::error::TokenizerError;

/// A stream of packed micro-batches with an exact, serialisable position.
pub trait BatchSource: Send {
    /// Next micro-batch (rows x seq_len, with position ids, doc ids and loss mask), or None when exhausted.
    fn next_batch(&mut self) -> Result<Option<PackedBatch>, SourceError>;
    /// Position to store in a checkpoint; `restore` from it continues with exactly the batches an
    /// uninterrupted source would have yielded.
    fn cursor(&self) -> serde_json::Value;
    fn restore(&mut self, cursor: serde_json::Value) -> Result<(), SourceError>;
}

/// Why a source could not be opened, read or restored.
#[derive(Debug, thiserror::Error)]
pub enum SourceError {
    #[error(transparent)]
    Loader(#[from] LoaderError),
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error(transparent)]
    Tokenizer(#[from] TokenizerError),
    #[error("{path}: {source}")]
    Io {
        path: PathBuf,
        source: std::io::Error,
    },
    #[error("no shards given to the shard source")]
    NoShards,
    #[error("invalid batch source config: {0}")]
    BadConfig(String),
    #[error(
        "{path}: no usable conversation in {lines} lines ({skipped} skipped); first problems: {first_problems}"
    )]
    NoConversations {
        path: PathBuf,
        lines: usize,
        skipped: usize,
        first_problems: String,
    },
    /// The JSON given to `restore` is not this source's cursor record.
    #[error("not a {source_kind} cursor: {message}")]
    BadCursor {
        source_kind: &'static str,
        message: String,
    },
    /// The cursor is well-formed but was taken from other data or another config.
    #[error("{source_kind} cursor does not match this source: {message}")]
    CursorMismatch {
        source_kind: &'static str,
        message: String,
    },
}
