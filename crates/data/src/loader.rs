//! The training data loader: reads a set of shards in a seeded, reproducible order for any number
//! of epochs, packs documents into rows ([`crate::packing`]) and yields [`PackedBatch`]es. Its
//! whole position is a small serde record, [`LoaderCursor`], that a checkpoint stores; a loader
//! resumed from a cursor yields exactly the batches an uninterrupted run would have.
//!
//! Order of documents, precisely: documents are numbered globally across the shards in file
//! order (shard 0's documents first). Epoch `e` visits every document once, in a permutation drawn
//! by `ChaCha8Rng` seeded from `(seed, e)` (or in file order when `shuffle` is off): the shared
//! [`EpochCursor`] with [`Shuffle::Splitmix`]. With
//! `shuffle_buffer = K > 0`, documents pass through a buffer of `K`: each draw takes a uniformly
//! random buffered document (so neighbours in a batch come from far apart in the epoch order);
//! the buffer carries over the epoch boundary. With `shuffle` on, the rows each packing window
//! produces are also permuted, so best-fit's length-sorted rows do not end up batched together.
//!
//! Determinism: every random choice comes from counter-based draws (`splitmix64` of seed, stream
//! and a counter stored in the cursor) or from the per-epoch permutation, which is recomputed on
//! resume; no hidden RNG state exists. The cursor also stores the packer (pending pieces, packed
//! rows not yet served) and the buffered document ids, so nothing needs replaying.
//!
//! Data parallelism: rank `r` of `n` ([`DataParallel`]) serves epoch positions `p % n == r`.
//!
//! What this is not: no background prefetch thread (a batch costs a copy of its tokens out of
//! the mapped shards); it never tokenizes.

use rand::SeedableRng;
use rand::seq::SliceRandom;
use rand_chacha::ChaCha8Rng;
use serde::{Deserialize, Serialize};

use crate::epoch::{EpochCursor, EpochPosition, Shuffle, draw};
use crate::packing::{DocPiece, PackedBatch, PackedRow, Packer, PackingPolicy, build_batch};
use crate::shard::{ShardError, ShardReader};

/// Validated loader settings.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderConfig {
    /// Tokens per row fed to the model (rows hold `seq_len + 1` to make the targets).
    pub seq_len: usize,
    /// Rows per batch.
    pub batch_size: usize,
    pub policy: PackingPolicy,
    pub seed: u64,
    /// Permute documents every epoch and rows within each packing window.
    pub shuffle: bool,
    /// Size of the random-order document buffer; 0 turns it off.
    pub shuffle_buffer: usize,
    /// Stop after this many passes over the data; `None` runs forever.
    pub max_epochs: Option<u64>,
    /// Token id written into padding slots (never a trained target).
    pub pad_token: u32,
    /// Which share of each epoch this loader serves.
    #[serde(default)]
    pub data_parallel: DataParallel,
}

/// Data-parallel split: rank `r` of `world_size` serves the documents at positions
/// `p % world_size == r` of each epoch's order, so the ranks together read every document once
/// per epoch, in disjoint sets, each with its own packer.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct DataParallel {
    pub rank: usize,
    pub world_size: usize,
}

impl Default for DataParallel {
    fn default() -> Self {
        DataParallel {
            rank: 0,
            world_size: 1,
        }
    }
}

impl LoaderConfig {
    /// Shuffled, unbounded epochs, a 1,024-document shuffle buffer, best-fit-decreasing packing
    /// over 1,024-document windows with splitting, pad token 0, a single rank.
    pub fn new(seq_len: usize, batch_size: usize, seed: u64) -> Self {
        LoaderConfig {
            seq_len,
            batch_size,
            policy: PackingPolicy::BestFitDecreasingSplit { window_docs: 1024 },
            seed,
            shuffle: true,
            shuffle_buffer: 1024,
            max_epochs: None,
            pad_token: 0,
            data_parallel: DataParallel::default(),
        }
    }
}

/// Everything needed to continue a loader exactly where it stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct LoaderCursor {
    pub seed: u64,
    /// xxh3 of the shard checksums and document counts: a cursor only resumes the same data.
    pub data_fingerprint: u64,
    pub epoch: u64,
    /// Next index into this epoch's document order.
    pub position: u64,
    /// Counter of random draws made so far (shuffle buffer picks and row permutations).
    pub draws: u64,
    /// Global ids of the documents in the shuffle buffer.
    pub buffer: Vec<u64>,
    /// Batches served so far.
    pub batches: u64,
    pub packer: Packer,
    /// Set once the last epoch has been read and the packer flushed.
    pub exhausted: bool,
}

#[derive(Debug, thiserror::Error)]
pub enum LoaderError {
    #[error(transparent)]
    Shard(#[from] ShardError),
    #[error("the shard set holds no tokens")]
    EmptyDataset,
    #[error("invalid loader config: {0}")]
    BadConfig(String),
    #[error("cursor does not match this data (fingerprint {cursor:#x}, data {data:#x})")]
    CursorMismatch { cursor: u64, data: u64 },
    #[error("cursor refers to document {0}, past the end of the data")]
    BadDocument(u64),
}

/// Reads shards into packed batches; see the module doc for the order.
pub struct Loader {
    config: LoaderConfig,
    shards: Vec<ShardReader>,
    /// `doc_base[i]` = global id of shard `i`'s first document; last entry = total documents.
    doc_base: Vec<u64>,
    /// The epoch order; its position is mirrored in `cursor.epoch` / `cursor.position`.
    epochs: EpochCursor,
    cursor: LoaderCursor,
}

const STREAM_BUFFER: u64 = 0x9e37_79b9_7f4a_7c15;
const STREAM_ROWS: u64 = 0xbf58_476d_1ce4_e5b9;

impl Loader {
    /// A loader at the start of epoch 0.
    pub fn new(shards: Vec<ShardReader>, config: LoaderConfig) -> Result<Self, LoaderError> {
        let fingerprint = fingerprint(&shards);
        let cursor = LoaderCursor {
            seed: config.seed,
            data_fingerprint: fingerprint,
            epoch: 0,
            position: 0,
            draws: 0,
            buffer: Vec::new(),
            batches: 0,
            packer: Packer::new(config.policy, config.seq_len),
            exhausted: false,
        };
        Self::resume(shards, config, cursor)
    }

    /// A loader continuing from `cursor` (taken from a loader over the same shards and config).
    pub fn resume(
        shards: Vec<ShardReader>,
        config: LoaderConfig,
        cursor: LoaderCursor,
    ) -> Result<Self, LoaderError> {
        if config.seq_len == 0 || config.batch_size == 0 {
            return Err(LoaderError::BadConfig(
                "seq_len and batch_size must be positive".into(),
            ));
        }
        let dp = config.data_parallel;
        if dp.world_size == 0 || dp.rank >= dp.world_size {
            return Err(LoaderError::BadConfig(format!(
                "rank {} is outside world size {}",
                dp.rank, dp.world_size
            )));
        }
        if config.max_epochs == Some(0) {
            return Err(LoaderError::BadConfig(
                "max_epochs must be at least 1".into(),
            ));
        }
        let data = fingerprint(&shards);
        if cursor.data_fingerprint != data || cursor.seed != config.seed {
            return Err(LoaderError::CursorMismatch {
                cursor: cursor.data_fingerprint,
                data,
            });
        }
        let mut doc_base = Vec::with_capacity(shards.len() + 1);
        let mut total = 0u64;
        for shard in &shards {
            doc_base.push(total);
            total += shard.num_docs();
        }
        doc_base.push(total);
        if shards.iter().all(|s| s.num_tokens() == 0) {
            return Err(LoaderError::EmptyDataset);
        }
        if let Some(&bad) = cursor.buffer.iter().find(|&&d| d >= total) {
            return Err(LoaderError::BadDocument(bad));
        }
        let epochs = EpochCursor::new(
            total,
            Shuffle::splitmix_if(config.shuffle, config.seed),
            config.max_epochs,
        )
        .at(EpochPosition {
            epoch: cursor.epoch,
            position: cursor.position,
        });
        Ok(Loader {
            config,
            shards,
            doc_base,
            epochs,
            cursor,
        })
    }

    /// The position to store in a checkpoint (taken between batches).
    pub fn cursor(&self) -> &LoaderCursor {
        &self.cursor
    }
    pub fn config(&self) -> &LoaderConfig {
        &self.config
    }
    pub fn num_docs(&self) -> u64 {
        self.doc_base.last().copied().unwrap_or(0)
    }
    pub fn packing_stats(&self) -> crate::packing::PackingStats {
        self.cursor.packer.stats()
    }

    /// The next batch: `batch_size` rows, or fewer for the final batch of the last epoch;
    /// `None` once every epoch has been served.
    pub fn next_batch(&mut self) -> Result<Option<PackedBatch>, LoaderError> {
        while self.cursor.packer.ready_rows() < self.config.batch_size && !self.cursor.exhausted {
            let before = self.cursor.packer.ready_rows();
            match self.next_document()? {
                Some((doc, len)) => self.cursor.packer.push_document(doc, len),
                None => {
                    self.cursor.packer.flush();
                    self.cursor.exhausted = true;
                }
            }
            if self.config.shuffle && self.cursor.packer.ready_rows() > before + 1 {
                self.shuffle_new_rows(before);
            }
        }
        let take = self.config.batch_size.min(self.cursor.packer.ready_rows());
        if take == 0 {
            return Ok(None);
        }
        let rows: Vec<PackedRow> = (0..take)
            .filter_map(|_| self.cursor.packer.pop_row())
            .collect();
        let batch = build_batch(
            &rows,
            self.config.seq_len,
            self.config.pad_token,
            |p, out| self.fetch(p, out),
        )?;
        self.cursor.batches += 1;
        Ok(Some(batch))
    }

    /// Permutes the rows added to the ready queue since it held `before` rows.
    fn shuffle_new_rows(&mut self, before: usize) {
        let counter = self.cursor.draws;
        self.cursor.draws += 1;
        let seed = draw(self.config.seed, STREAM_ROWS, counter);
        self.cursor.packer.permute_ready(|rows| {
            let mut rng = ChaCha8Rng::seed_from_u64(seed);
            rows[before..].shuffle(&mut rng);
        });
    }

    fn fetch(&self, p: &DocPiece, out: &mut Vec<u32>) -> Result<(), LoaderError> {
        let (shard, local) = self.locate(p.doc)?;
        let tokens = self.shards[shard]
            .document(local)
            .ok_or(LoaderError::BadDocument(p.doc))?;
        let (start, end) = (p.start as usize, p.start as usize + p.len as usize);
        if end > tokens.len() {
            return Err(LoaderError::BadDocument(p.doc));
        }
        tokens.slice(start..end).extend_into(out);
        Ok(())
    }

    fn locate(&self, doc: u64) -> Result<(usize, u64), LoaderError> {
        if doc >= self.num_docs() {
            return Err(LoaderError::BadDocument(doc));
        }
        // The last shard whose first document is <= doc (empty shards share a base; skip them).
        let shard = self.doc_base.partition_point(|&base| base <= doc) - 1;
        Ok((shard, doc - self.doc_base[shard]))
    }

    fn doc_len(&self, doc: u64) -> Result<usize, LoaderError> {
        let (shard, local) = self.locate(doc)?;
        self.shards[shard]
            .doc_len(local)
            .ok_or(LoaderError::BadDocument(doc))
    }

    /// Next document through the shuffle buffer, with its length; `None` at the end of the data.
    fn next_document(&mut self) -> Result<Option<(u64, usize)>, LoaderError> {
        let k = self.config.shuffle_buffer;
        let doc = if k == 0 {
            self.next_in_order()
        } else {
            while self.cursor.buffer.len() < k {
                match self.next_in_order() {
                    Some(doc) => self.cursor.buffer.push(doc),
                    None => break,
                }
            }
            if self.cursor.buffer.is_empty() {
                None
            } else {
                let pick = draw(self.config.seed, STREAM_BUFFER, self.cursor.draws);
                self.cursor.draws += 1;
                let index = (pick % self.cursor.buffer.len() as u64) as usize;
                Some(self.cursor.buffer.swap_remove(index))
            }
        };
        match doc {
            Some(doc) => Ok(Some((doc, self.doc_len(doc)?))),
            None => Ok(None),
        }
    }

    /// Next document of the epoch order, moving to the next epoch when one ends.
    fn next_in_order(&mut self) -> Option<u64> {
        let DataParallel { rank, world_size } = self.config.data_parallel;
        loop {
            let (position, doc) = self.next_position()?;
            if position % world_size as u64 == rank as u64 {
                return Some(doc);
            }
        }
    }

    /// The next position of the epoch order (any rank's) and its document.
    fn next_position(&mut self) -> Option<(u64, u64)> {
        let next = self.epochs.next_item();
        let EpochPosition { epoch, position } = self.epochs.position();
        (self.cursor.epoch, self.cursor.position) = (epoch, position);
        next
    }
}

/// The document order of one epoch (the loader's [`Shuffle::Splitmix`] order).
pub fn epoch_order(num_docs: u64, seed: u64, epoch: u64, shuffle: bool) -> Vec<u64> {
    Shuffle::splitmix_if(shuffle, seed).order(num_docs, epoch)
}

fn fingerprint(shards: &[ShardReader]) -> u64 {
    let mut bytes = Vec::with_capacity(shards.len() * 16);
    for shard in shards {
        bytes.extend_from_slice(&shard.checksum().to_le_bytes());
        bytes.extend_from_slice(&shard.num_docs().to_le_bytes());
    }
    xxhash_rust::xxh3::xxh3_64(&bytes)
}
