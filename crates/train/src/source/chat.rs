//! [`ChatSource`]: the SFT batch source. It reads chat JSONL (one
//! `{"messages": [{"role": .., "content": ..}, ..]}` per line, OpenAI format; other top-level
//! fields are ignored), renders every conversation with the tokenizer's chat template
//! (`Tokenizer::apply_chat_template`, which also returns the assistant-token mask), keeps the
//! (ids, mask) documents in memory, and packs them into rows with document masking.
//!
//! Loss mask, precisely: position `i` of a row is trained only when input `i` and target `i + 1`
//! belong to the same document piece (the packer's rule) AND the target token is an assistant
//! token of that conversation. So system and user tokens, role headers, padding and the first
//! token of the next conversation are never targets.
//!
//! Order: epoch `e` visits every conversation once, in the shared `stoke_data::epoch::EpochCursor`
//! order for `(seed, e)` (the shard loader's `Shuffle::Splitmix`; file order when `shuffle` is
//! off); with `shuffle` on, the rows each packing window
//! produces are also permuted by a seeded permutation (a counter, `draws`, in the cursor), so
//! best-fit's length-sorted rows are not batched together. The cursor ([`ChatCursor`]) stores the
//! epoch, the position in its order, the draw counter and the whole packer, so a restored source
//! continues exactly; it also stores a fingerprint of the rendered documents and the packing
//! settings, and a cursor from other data or settings is refused.
//!
//! Over-long conversations: a conversation longer than a row (`seq_len + 1` tokens) is truncated
//! to its first `seq_len + 1` tokens (counted in [`ChatLoadReport`]); the rest is dropped. It is
//! truncated rather than split because a tail piece would train without the system prompt and
//! the turns it answers. If nothing trainable is left, the line is skipped (and reported).
//!
//! Packing policy: `BestFitDecreasing` keeps every conversation whole inside one row (the
//! default of [`ChatSourceConfig::new`]). `ConcatChunk` and `BestFitDecreasingSplit` may cut a
//! conversation across two rows; the second piece then starts at position 0 without its head as
//! context. They are accepted (they waste no slots) but are worse SFT data.
//!
//! Bad lines (blank, invalid JSON or UTF-8, no `messages` list, an unknown role, no messages, no
//! assistant turn, a template error such as roles that do not alternate) never stop the source:
//! each is recorded with its file and line in [`ChatSource::skipped`]. Only a file in which no
//! line is usable is an error.
//!
//! What this is not: no streaming of files too big for memory (documents are held as token ids,
//! 5 bytes per token), no data-parallel split, no tool schemas (`tools` is not passed).

use std::fmt;
use std::path::Path;

use serde::{Deserialize, Serialize};
use stoke_data::epoch::{EpochCursor, EpochPosition, Shuffle};
use stoke_data::packing::{
    DocPiece, PackedBatch, PackedRow, Packer, PackingPolicy, PackingStats, build_batch, row_tokens,
};
use stoke_tokenizer::hf::Tokenizer;

use super::chat_jsonl::{ChatLoadReport, Conversation, SkippedLine, load};
use super::{BatchSource, SourceError};

const SOURCE_KIND: &str = "chat source";
/// Mixed into the seed for the row permutations, so they do not repeat the epoch orders.
const ROW_STREAM: u64 = 0xbf58_476d_1ce4_e5b9;

/// SFT source settings (validated by [`ChatSource::open`]).
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatSourceConfig {
    /// Tokens per row fed to the model (rows hold `seq_len + 1` to make the targets).
    pub seq_len: usize,
    /// Rows per micro-batch.
    pub batch_size: usize,
    pub seed: u64,
    /// Permute conversations every epoch and rows within each packing window.
    pub shuffle: bool,
    /// Stop after this many passes; `None` runs forever.
    pub max_epochs: Option<u64>,
    pub policy: PackingPolicy,
}

impl ChatSourceConfig {
    /// Shuffled, unbounded epochs, best-fit-decreasing packing over 256-conversation windows
    /// (conversations are never cut across rows).
    pub fn new(seq_len: usize, batch_size: usize, seed: u64) -> Self {
        ChatSourceConfig {
            seq_len,
            batch_size,
            seed,
            shuffle: true,
            max_epochs: None,
            policy: PackingPolicy::BestFitDecreasing { window_docs: 256 },
        }
    }

    fn validate(&self) -> Result<(), SourceError> {
        if self.seq_len == 0 || self.batch_size == 0 {
            return Err(SourceError::BadConfig(
                "seq_len and batch_size must be positive".into(),
            ));
        }
        if u32::try_from(row_tokens(self.seq_len)).is_err() {
            return Err(SourceError::BadConfig(format!(
                "seq_len {} does not fit a row",
                self.seq_len
            )));
        }
        if self.max_epochs == Some(0) {
            return Err(SourceError::BadConfig(
                "max_epochs must be at least 1".into(),
            ));
        }
        Ok(())
    }
}

/// Everything needed to continue a chat source exactly where it stopped.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ChatCursor {
    pub seed: u64,
    /// FNV-1a over the rendered documents: a cursor only resumes the same data.
    pub data_fingerprint: u64,
    pub seq_len: usize,
    pub shuffle: bool,
    pub policy: PackingPolicy,
    pub epoch: u64,
    /// Next index into this epoch's conversation order.
    pub position: u64,
    /// Row permutations drawn so far.
    pub draws: u64,
    /// Batches served so far.
    pub batches: u64,
    pub packer: Packer,
    /// Set once the last epoch has been read and the packer flushed.
    pub exhausted: bool,
}

/// SFT: chat JSONL rendered with the chat template; loss only on assistant tokens; packed with
/// document masking. See the module doc.
pub struct ChatSource {
    config: ChatSourceConfig,
    conversations: Vec<Conversation>,
    report: ChatLoadReport,
    pad_token: u32,
    /// The epoch order; its position is mirrored in `cursor.epoch` / `cursor.position`.
    epochs: EpochCursor,
    cursor: ChatCursor,
}

impl fmt::Debug for ChatSource {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ChatSource")
            .field("config", &self.config)
            .field("conversations", &self.conversations.len())
            .field("epoch", &self.cursor.epoch)
            .field("position", &self.cursor.position)
            .finish()
    }
}

impl ChatSource {
    /// Reads and renders every line of `jsonl`; bad lines are recorded, not fatal.
    pub fn open(
        jsonl: &Path,
        tokenizer: &Tokenizer,
        config: ChatSourceConfig,
    ) -> Result<Self, SourceError> {
        config.validate()?;
        // A missing template would fail every line; say so once.
        tokenizer.default_chat_template()?;
        let (conversations, report) = load(jsonl, tokenizer, row_tokens(config.seq_len))?;
        if conversations.is_empty() {
            let first_problems = report
                .skipped
                .iter()
                .take(3)
                .map(|s| format!("line {}: {}", s.line, s.reason))
                .collect::<Vec<_>>()
                .join("; ");
            return Err(SourceError::NoConversations {
                path: jsonl.to_path_buf(),
                lines: report.lines,
                skipped: report.skipped.len(),
                first_problems,
            });
        }
        let pad_token = tokenizer
            .pad_token_id()
            .or_else(|| tokenizer.eos_token_ids().first().copied())
            .unwrap_or(0);
        let cursor = ChatCursor {
            seed: config.seed,
            data_fingerprint: fingerprint(&conversations),
            seq_len: config.seq_len,
            shuffle: config.shuffle,
            policy: config.policy,
            epoch: 0,
            position: 0,
            draws: 0,
            batches: 0,
            packer: Packer::new(config.policy, config.seq_len),
            exhausted: false,
        };
        let epochs = EpochCursor::new(
            conversations.len() as u64,
            Shuffle::splitmix_if(config.shuffle, config.seed),
            config.max_epochs,
        );
        Ok(ChatSource {
            config,
            conversations,
            report,
            pad_token,
            epochs,
            cursor,
        })
    }

    /// Lines that were not used, with file, line and reason.
    pub fn skipped(&self) -> &[SkippedLine] {
        &self.report.skipped
    }
    pub fn report(&self) -> &ChatLoadReport {
        &self.report
    }
    pub fn config(&self) -> &ChatSourceConfig {
        &self.config
    }
    pub fn num_conversations(&self) -> usize {
        self.conversations.len()
    }

    /// The teacher top-k stored with the data (token-id lines with `teacher_topk_ids`), indexed
    /// like the packed pieces' `doc`; `None` when no line carries any.
    pub fn teacher_topk(&self) -> Option<super::teacher_topk::TeacherTopK> {
        let first = self.conversations.iter().find_map(|c| c.topk.as_ref())?;
        Some(super::teacher_topk::TeacherTopK {
            k: first.k,
            conversations: self.conversations.iter().map(|c| c.topk.clone()).collect(),
        })
    }
    /// The position as its typed record.
    pub fn chat_cursor(&self) -> &ChatCursor {
        &self.cursor
    }
    /// Real versus emitted tokens of the rows packed so far.
    pub fn packing_stats(&self) -> PackingStats {
        self.cursor.packer.stats()
    }

    /// Next conversation of the epoch order, moving to the next epoch when one ends; `None` at
    /// the end of the last epoch.
    fn next_conversation(&mut self) -> Option<u64> {
        let next = self.epochs.next_item();
        let EpochPosition { epoch, position } = self.epochs.position();
        (self.cursor.epoch, self.cursor.position) = (epoch, position);
        next.map(|(_, conversation)| conversation)
    }

    /// Permutes the rows added to the ready queue since it held `before` rows.
    fn shuffle_new_rows(&mut self, before: usize) {
        let draw = self.cursor.draws;
        self.cursor.draws += 1;
        let seed = self.config.seed ^ ROW_STREAM;
        self.cursor.packer.permute_ready(|rows| {
            let fresh = &mut rows[before..];
            // An epoch order is a seeded permutation of 0..n; the draw counter plays the epoch.
            let permutation = Shuffle::Splitmix { seed }.order(fresh.len() as u64, draw);
            let original = fresh.to_vec();
            for (slot, &from) in fresh.iter_mut().zip(&permutation) {
                *slot = original[from as usize].clone();
            }
        });
    }

    fn conversation(&self, piece: &DocPiece) -> Result<(&[u32], &[bool]), SourceError> {
        let mismatch = || SourceError::CursorMismatch {
            source_kind: SOURCE_KIND,
            message: format!(
                "packed piece {piece:?} lies outside the {} conversations",
                self.conversations.len()
            ),
        };
        let conversation = usize::try_from(piece.doc)
            .ok()
            .and_then(|doc| self.conversations.get(doc))
            .ok_or_else(mismatch)?;
        let range = piece.start as usize..piece.start as usize + piece.len as usize;
        match (
            conversation.ids.get(range.clone()),
            conversation.assistant.get(range),
        ) {
            (Some(ids), Some(mask)) => Ok((ids, mask)),
            _ => Err(mismatch()),
        }
    }

    /// Keeps a position's loss only where its target is an assistant token (the packer already
    /// cleared targets in another piece and padding).
    fn mask_to_assistant_targets(
        &self,
        rows: &[PackedRow],
        batch: &mut PackedBatch,
    ) -> Result<(), SourceError> {
        let seq_len = self.config.seq_len;
        let mut assistant_slots = Vec::with_capacity(row_tokens(seq_len));
        for (r, row) in rows.iter().enumerate() {
            assistant_slots.clear();
            for piece in &row.pieces {
                assistant_slots.extend_from_slice(self.conversation(piece)?.1);
            }
            assistant_slots.resize(row_tokens(seq_len), false);
            let mask = &mut batch.loss_mask[r * seq_len..(r + 1) * seq_len];
            for (i, trained) in mask.iter_mut().enumerate() {
                *trained &= assistant_slots[i + 1];
            }
        }
        Ok(())
    }
}

impl BatchSource for ChatSource {
    fn next_batch(&mut self) -> Result<Option<PackedBatch>, SourceError> {
        let batch_size = self.config.batch_size;
        while self.cursor.packer.ready_rows() < batch_size && !self.cursor.exhausted {
            let before = self.cursor.packer.ready_rows();
            match self.next_conversation() {
                Some(doc) => {
                    let len = self.conversations[doc as usize].ids.len();
                    self.cursor.packer.push_document(doc, len);
                }
                None => {
                    self.cursor.packer.flush();
                    self.cursor.exhausted = true;
                }
            }
            if self.config.shuffle && self.cursor.packer.ready_rows() > before + 1 {
                self.shuffle_new_rows(before);
            }
        }
        let take = batch_size.min(self.cursor.packer.ready_rows());
        if take == 0 {
            return Ok(None);
        }
        let rows: Vec<PackedRow> = (0..take)
            .filter_map(|_| self.cursor.packer.pop_row())
            .collect();
        let mut batch = build_batch(&rows, self.config.seq_len, self.pad_token, |piece, out| {
            out.extend_from_slice(self.conversation(piece)?.0);
            Ok::<(), SourceError>(())
        })?;
        self.mask_to_assistant_targets(&rows, &mut batch)?;
        self.cursor.batches += 1;
        Ok(Some(batch))
    }

    fn cursor(&self) -> serde_json::Value {
        // Plain numbers, booleans, enums and the packer's vectors: serialising cannot fail.
        serde_json::to_value(&self.cursor).expect("a ChatCursor always serialises")
    }

    fn restore(&mut self, cursor: serde_json::Value) -> Result<(), SourceError> {
        let cursor: ChatCursor =
            serde_json::from_value(cursor).map_err(|err| SourceError::BadCursor {
                source_kind: SOURCE_KIND,
                message: err.to_string(),
            })?;
        let mismatch = |message: String| SourceError::CursorMismatch {
            source_kind: SOURCE_KIND,
            message,
        };
        let ours = &self.cursor;
        if cursor.data_fingerprint != ours.data_fingerprint {
            return Err(mismatch(format!(
                "data fingerprint {:#x}, this data {:#x}",
                cursor.data_fingerprint, ours.data_fingerprint
            )));
        }
        if (cursor.seed, cursor.seq_len, cursor.shuffle, cursor.policy)
            != (ours.seed, ours.seq_len, ours.shuffle, ours.policy)
            || cursor.packer.capacity() != row_tokens(self.config.seq_len)
        {
            return Err(mismatch(format!(
                "cursor has seed {}, seq_len {}, shuffle {}, {:?}; this source {}, {}, {}, {:?}",
                cursor.seed,
                cursor.seq_len,
                cursor.shuffle,
                cursor.policy,
                ours.seed,
                ours.seq_len,
                ours.shuffle,
                ours.policy
            )));
        }
        if cursor.position > self.conversations.len() as u64 {
            return Err(mismatch(format!(
                "position {} is past the {} conversations",
                cursor.position,
                self.conversations.len()
            )));
        }
        self.epochs.seek(EpochPosition {
            epoch: cursor.epoch,
            position: cursor.position,
        });
        self.cursor = cursor;
        Ok(())
    }
}

/// FNV-1a (64-bit) over every conversation's length, ids and mask. A resume check, not a
/// security hash; hand-written to keep a hashing crate out of stoke-train for twenty lines.
fn fingerprint(conversations: &[Conversation]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    let mut eat = |bytes: &[u8]| {
        for &b in bytes {
            hash ^= u64::from(b);
            hash = hash.wrapping_mul(PRIME);
        }
    };
    for conversation in conversations {
        eat(&(conversation.ids.len() as u64).to_le_bytes());
        for (&id, &assistant) in conversation.ids.iter().zip(&conversation.assistant) {
            eat(&id.to_le_bytes());
            eat(&[u8::from(assistant)]);
        }
    }
    hash
}
