//! [`ShardSource`]: the pretraining batch source, a thin [`BatchSource`] over
//! [`stoke_data::loader::Loader`]. Document order, shuffling, packing and the loss mask (every
//! target inside the same document piece) are the loader's; see `stoke_data::loader` and
//! `stoke_data::packing` for the exact rules.
//!
//! The cursor is the loader's [`LoaderCursor`] as JSON. Restoring reopens the shards (without
//! re-hashing them: they were verified when the source was opened, and the loader compares the
//! data fingerprint stored in the cursor) and resumes the loader from the cursor, so a restored
//! source yields exactly the batches the uninterrupted one would have.
//!
//! What this is not: it never tokenizes and never changes the loader's order or masks.

use std::path::PathBuf;

use stoke_data::loader::{Loader, LoaderConfig, LoaderCursor};
use stoke_data::packing::{PackedBatch, PackingStats};
use stoke_data::shard::ShardReader;

use super::{BatchSource, SourceError};

const SOURCE_KIND: &str = "shard source";

/// Pretraining: token shards through `stoke_data::loader::Loader`.
pub struct ShardSource {
    paths: Vec<PathBuf>,
    loader: Loader,
}

impl std::fmt::Debug for ShardSource {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShardSource")
            .field("paths", &self.paths)
            .field("cursor", self.loader.cursor())
            .finish()
    }
}

impl ShardSource {
    /// Opens and verifies (size, checksum, index) every shard and starts at epoch 0.
    pub fn open(shards: &[PathBuf], config: LoaderConfig) -> Result<Self, SourceError> {
        if shards.is_empty() {
            return Err(SourceError::NoShards);
        }
        let readers = shards
            .iter()
            .map(ShardReader::open)
            .collect::<Result<Vec<_>, _>>()?;
        let loader = Loader::new(readers, config)?;
        Ok(ShardSource {
            paths: shards.to_vec(),
            loader,
        })
    }

    /// The loader's position as its typed record.
    pub fn loader_cursor(&self) -> &LoaderCursor {
        self.loader.cursor()
    }
    pub fn config(&self) -> &LoaderConfig {
        self.loader.config()
    }
    /// Documents across all shards.
    pub fn num_docs(&self) -> u64 {
        self.loader.num_docs()
    }
    /// Real versus emitted tokens of the rows packed so far.
    pub fn packing_stats(&self) -> PackingStats {
        self.loader.packing_stats()
    }
}

impl BatchSource for ShardSource {
    fn next_batch(&mut self) -> Result<Option<PackedBatch>, SourceError> {
        Ok(self.loader.next_batch()?)
    }

    fn cursor(&self) -> serde_json::Value {
        // A LoaderCursor is plain numbers, vectors and structs: serialising it cannot fail.
        serde_json::to_value(self.loader.cursor()).expect("a LoaderCursor always serialises")
    }

    fn restore(&mut self, cursor: serde_json::Value) -> Result<(), SourceError> {
        let cursor: LoaderCursor =
            serde_json::from_value(cursor).map_err(|err| SourceError::BadCursor {
                source_kind: SOURCE_KIND,
                message: err.to_string(),
            })?;
        let config = self.loader.config().clone();
        if cursor.packer.capacity() != stoke_data::packing::row_tokens(config.seq_len) {
            return Err(SourceError::CursorMismatch {
                source_kind: SOURCE_KIND,
                message: format!(
                    "cursor packs rows of {} tokens, this source seq_len {} (+1)",
                    cursor.packer.capacity(),
                    config.seq_len
                ),
            });
        }
        let readers = self
            .paths
            .iter()
            .map(ShardReader::open_unverified)
            .collect::<Result<Vec<_>, _>>()?;
        // Built aside and swapped in only on success: a refused cursor leaves the source as it was.
        self.loader = Loader::resume(readers, config, cursor)?;
        Ok(())
    }
}
