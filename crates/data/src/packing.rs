//! Sequence packing: turning documents of any length into fixed-size training rows, and rows into
//! a [`PackedBatch`] with per-document masks.
//!
//! A row holds `capacity = seq_len + 1` tokens: inputs are `row[0..L]`, targets `row[1..L+1]`.
//! Rows never overlap, so every document token lands in exactly one row (none lost, none
//! duplicated), and unused slots are padding.
//!
//! Policies ([`PackingPolicy`]), precisely:
//! - `ConcatChunk`: documents are concatenated in arrival order and cut every `capacity` tokens; a
//!   document that crosses a row boundary continues in the next row. Only the last row can be
//!   padded. Efficiency ~100%.
//! - `BestFitDecreasing { window_docs }`: a document longer than `capacity` is first chunked into
//!   full-capacity pieces (each becomes a full row of its own) plus a remainder piece. Remainder
//!   pieces collect in a window; when it holds `window_docs` pieces they are sorted by length
//!   (decreasing; ties by document id, then offset) and each goes into the open row with the
//!   SMALLEST free space that still fits it (best fit), or a new row. Documents are never split
//!   except by the chunking above; rows are padded. Efficiency depends on the length mix (see the
//!   tests and the README figures).
//! - `BestFitDecreasingSplit { window_docs }`: the same best-fit pass, then the gaps are closed by
//!   splitting: repeatedly the emptiest non-full row gives its pieces to the fullest non-full row
//!   (splitting one piece at the boundary), until at most one row is not full. That last partial
//!   row's pieces are carried into the next window (or padded at the end of the data). Every row
//!   but the very last is full (efficiency 100% minus the final row).
//!
//! Masks ([`PackedBatch`]): `position_ids` restart at 0 at the start of every piece (a piece is a
//! document, or the part of one that falls in this row); `doc_ids` number the pieces of a row
//! 0, 1, 2, ... ([`PAD_DOC`] for padding) so attention can be masked to equal ids; `loss_mask[i]`
//! is true only when input `i` and target `i+1` belong to the same piece, so no document's first
//! token is predicted from the previous document, and padding is never a target.
//!
//! What this is not: it never reads tokens itself; the packer sees document ids and lengths, and
//! [`build_batch`] asks a caller-supplied function for the tokens of each piece.

use std::collections::{BTreeSet, VecDeque};

use serde::{Deserialize, Serialize};

/// `doc_ids` value of a padding position.
pub const PAD_DOC: u32 = u32::MAX;

/// A contiguous part of one document: tokens `[start, start + len)` of document `doc`.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
pub struct DocPiece {
    pub doc: u64,
    pub start: u32,
    pub len: u32,
}

/// One training row: pieces laid out back to back, padded up to the capacity.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedRow {
    pub pieces: Vec<DocPiece>,
}

impl PackedRow {
    /// Real (non-padding) tokens in the row.
    pub fn used(&self) -> usize {
        self.pieces.iter().map(|p| p.len as usize).sum()
    }
}

/// How documents become rows; see the module doc for the exact behaviour of each.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum PackingPolicy {
    ConcatChunk,
    BestFitDecreasing { window_docs: usize },
    BestFitDecreasingSplit { window_docs: usize },
}

/// Tokens placed versus slots emitted, for reporting efficiency.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackingStats {
    pub rows: u64,
    pub real_tokens: u64,
    pub capacity_tokens: u64,
    /// Pieces cut off a document to fill a row (not counting chunking of over-long documents).
    pub splits: u64,
}

impl PackingStats {
    /// Fraction of emitted slots holding real tokens (1.0 when nothing was emitted).
    pub fn efficiency(&self) -> f64 {
        if self.capacity_tokens == 0 {
            1.0
        } else {
            self.real_tokens as f64 / self.capacity_tokens as f64
        }
    }
}

/// The online packer. Its whole state is serializable so a loader cursor can store it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Packer {
    policy: PackingPolicy,
    capacity: u32,
    /// Pieces waiting for the next best-fit window, or the open row of `ConcatChunk`.
    pending: Vec<DocPiece>,
    ready: VecDeque<PackedRow>,
    stats: PackingStats,
}

/// The tokens of one row for a model that reads `seq_len` positions: one more than it reads, so
/// the row holds every input and every target. The one place `seq_len + 1` is written.
pub fn row_tokens(seq_len: usize) -> usize {
    seq_len + 1
}

impl Packer {
    /// A packer for rows of [`row_tokens`]`(seq_len)` tokens. `window_docs` of 0 is treated as 1.
    pub fn new(policy: PackingPolicy, seq_len: usize) -> Self {
        let capacity = u32::try_from(row_tokens(seq_len)).unwrap_or(u32::MAX);
        Packer {
            policy,
            capacity,
            pending: Vec::new(),
            ready: VecDeque::new(),
            stats: PackingStats::default(),
        }
    }

    pub fn capacity(&self) -> usize {
        self.capacity as usize
    }
    pub fn stats(&self) -> PackingStats {
        self.stats
    }
    /// Rows packed and not yet taken.
    pub fn ready_rows(&self) -> usize {
        self.ready.len()
    }

    /// Adds a document of `len` tokens. Empty documents are skipped.
    pub fn push_document(&mut self, doc: u64, len: usize) {
        let mut start = 0usize;
        let cap = self.capacity as usize;
        match self.policy {
            PackingPolicy::ConcatChunk => {
                while start < len {
                    let used: usize = self.pending.iter().map(|p| p.len as usize).sum();
                    let take = (cap - used).min(len - start);
                    self.pending.push(piece(doc, start, take));
                    start += take;
                    if used + take == cap {
                        let pieces = std::mem::take(&mut self.pending);
                        self.emit(PackedRow { pieces });
                    }
                }
            }
            PackingPolicy::BestFitDecreasing { window_docs }
            | PackingPolicy::BestFitDecreasingSplit { window_docs } => {
                while len - start > cap {
                    self.emit(PackedRow {
                        pieces: vec![piece(doc, start, cap)],
                    });
                    start += cap;
                }
                if start < len {
                    self.pending.push(piece(doc, start, len - start));
                }
                if self.pending.len() >= window_docs.max(1) {
                    self.pack_window(false);
                }
            }
        }
    }

    /// Packs everything still pending (end of data): the last rows may be padded.
    pub fn flush(&mut self) {
        match self.policy {
            PackingPolicy::ConcatChunk => {
                if !self.pending.is_empty() {
                    let pieces = std::mem::take(&mut self.pending);
                    self.emit(PackedRow { pieces });
                }
            }
            _ => {
                if !self.pending.is_empty() {
                    self.pack_window(true);
                }
            }
        }
    }

    /// The next finished row, in packing order.
    pub fn pop_row(&mut self) -> Option<PackedRow> {
        self.ready.pop_front()
    }

    /// Reorders the rows waiting to be taken with `permute` (the loader's seeded shuffle).
    pub fn permute_ready(&mut self, permute: impl FnOnce(&mut [PackedRow])) {
        permute(self.ready.make_contiguous());
    }

    fn emit(&mut self, row: PackedRow) {
        self.stats.rows += 1;
        self.stats.real_tokens += row.used() as u64;
        self.stats.capacity_tokens += u64::from(self.capacity);
        self.ready.push_back(row);
    }

    fn pack_window(&mut self, is_final: bool) {
        let mut pieces = std::mem::take(&mut self.pending);
        pieces.sort_by(|a, b| {
            b.len
                .cmp(&a.len)
                .then(a.doc.cmp(&b.doc))
                .then(a.start.cmp(&b.start))
        });
        let mut rows = best_fit(&pieces, self.capacity);
        if matches!(self.policy, PackingPolicy::BestFitDecreasingSplit { .. }) {
            self.stats.splits += pour_until_full(&mut rows, self.capacity);
            if !is_final
                && let Some(last) = rows.last()
                && last.used() < self.capacity as usize
                && let Some(partial) = rows.pop()
            {
                self.pending = partial.pieces;
            }
        }
        for row in rows {
            self.emit(row);
        }
    }
}

fn piece(doc: u64, start: usize, len: usize) -> DocPiece {
    // Both fit in u32: pieces are at most `capacity` long and starts are bounded by a document
    // length that the caller passes as usize but shards bound far below u32::MAX per document.
    DocPiece {
        doc,
        start: start as u32,
        len: len as u32,
    }
}

/// Best fit over pieces already sorted by decreasing length; rows come out in creation order.
fn best_fit(pieces: &[DocPiece], capacity: u32) -> Vec<PackedRow> {
    let mut rows: Vec<PackedRow> = Vec::new();
    let mut free: Vec<u32> = Vec::new();
    // (free space, row index): the first entry at or above a piece's length is the best fit.
    let mut by_free: BTreeSet<(u32, usize)> = BTreeSet::new();
    for p in pieces {
        let best = by_free.range((p.len, 0)..).next().copied();
        let row = match best {
            Some(entry) => {
                by_free.remove(&entry);
                entry.1
            }
            None => {
                rows.push(PackedRow::default());
                free.push(capacity);
                rows.len() - 1
            }
        };
        rows[row].pieces.push(*p);
        free[row] -= p.len;
        if free[row] > 0 {
            by_free.insert((free[row], row));
        }
    }
    rows
}

/// Closes gaps by moving tokens from the emptiest non-full row into the fullest non-full row,
/// splitting one piece at a time. Leaves full rows first, then at most one partial row last.
/// Returns the number of splits.
fn pour_until_full(rows: &mut Vec<PackedRow>, capacity: u32) -> u64 {
    let cap = capacity as usize;
    let (mut full, mut open): (Vec<PackedRow>, Vec<PackedRow>) = std::mem::take(rows)
        .into_iter()
        .partition(|r| r.used() == cap);
    // Fullest first; the stable sort keeps the order deterministic among equal fills.
    open.sort_by_key(|r| std::cmp::Reverse(r.used()));
    let mut splits = 0;
    while open.len() >= 2 {
        let Some(mut donor) = open.pop() else { break };
        let receiver = &mut open[0];
        let mut gap = cap - receiver.used();
        while gap > 0 {
            let Some(mut p) = donor.pieces.pop() else {
                break;
            };
            if p.len as usize <= gap {
                gap -= p.len as usize;
                receiver.pieces.push(p);
            } else {
                receiver.pieces.push(DocPiece {
                    doc: p.doc,
                    start: p.start,
                    len: gap as u32,
                });
                p.start += gap as u32;
                p.len -= gap as u32;
                donor.pieces.push(p);
                splits += 1;
                gap = 0;
            }
        }
        if gap == 0 {
            full.push(open.remove(0));
        }
        if !donor.pieces.is_empty() {
            // The donor keeps its place as the emptiest row.
            open.push(donor);
        }
    }
    full.extend(open);
    *rows = full;
    splits
}

/// A batch of `batch_size` packed rows, flattened row-major as `[batch_size * seq_len]`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackedBatch {
    pub batch_size: usize,
    pub seq_len: usize,
    /// Model inputs.
    pub tokens: Vec<u32>,
    /// Next-token targets (`tokens` shifted by one within the row).
    pub targets: Vec<u32>,
    /// Position of each input inside its piece, restarting at 0.
    pub position_ids: Vec<u32>,
    /// Row-local piece number of each input ([`PAD_DOC`] for padding): attend only to equal ids.
    pub doc_ids: Vec<u32>,
    /// Whether the target at this position is trained on.
    pub loss_mask: Vec<bool>,
    /// Where each row's tokens came from.
    pub rows: Vec<PackedRow>,
}

impl PackedBatch {
    /// Number of positions whose loss counts.
    pub fn num_loss_tokens(&self) -> usize {
        self.loss_mask.iter().filter(|&&m| m).count()
    }
}

/// Lays out `rows` (at most `seq_len + 1` tokens each) as a batch. `fetch` appends the tokens of
/// a piece to the given vector; its error aborts the batch.
pub fn build_batch<E>(
    rows: &[PackedRow],
    seq_len: usize,
    pad_token: u32,
    mut fetch: impl FnMut(&DocPiece, &mut Vec<u32>) -> Result<(), E>,
) -> Result<PackedBatch, E> {
    let cap = seq_len + 1;
    let n = rows.len() * seq_len;
    let mut batch = PackedBatch {
        batch_size: rows.len(),
        seq_len,
        tokens: Vec::with_capacity(n),
        targets: Vec::with_capacity(n),
        position_ids: Vec::with_capacity(n),
        doc_ids: Vec::with_capacity(n),
        loss_mask: Vec::with_capacity(n),
        rows: rows.to_vec(),
    };
    let mut flat = Vec::with_capacity(cap);
    let mut segment = Vec::with_capacity(cap);
    let mut position = Vec::with_capacity(cap);
    for row in rows {
        flat.clear();
        segment.clear();
        position.clear();
        for (i, p) in row.pieces.iter().enumerate() {
            let before = flat.len();
            fetch(p, &mut flat)?;
            let got = flat.len() - before;
            segment.extend(std::iter::repeat_n(i as u32, got));
            position.extend(0..got as u32);
        }
        flat.truncate(cap);
        segment.truncate(cap);
        position.truncate(cap);
        flat.resize(cap, pad_token);
        segment.resize(cap, PAD_DOC);
        position.resize(cap, 0);
        for i in 0..seq_len {
            batch.tokens.push(flat[i]);
            batch.targets.push(flat[i + 1]);
            batch.position_ids.push(position[i]);
            batch.doc_ids.push(segment[i]);
            batch
                .loss_mask
                .push(segment[i] != PAD_DOC && segment[i] == segment[i + 1]);
        }
    }
    Ok(batch)
}
