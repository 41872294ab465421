//! A teacher's top-k log-probs stored with SFT data ([`TeacherTopK`]): what `stoke distill
//! generate` writes with `[model] top_k_logprobs` (or a remote teacher returns), read by the chat
//! reader from a line's `teacher_topk_ids` and `teacher_topk_logprobs` (one list of k per
//! completion token), and looked up by logit distillation at a packed batch's loss positions.
//!
//! A loss position maps to its conversation and offset through the packed piece that holds it
//! (`DocPiece::doc` is the conversation's index, `start` plus the position id its offset), so any
//! packing policy and any order work. What this is not: the divergence (`stoke_ops::distill`).

use stoke_data::packing::PackedBatch;

/// One conversation's stored top-k: row `i` (k ids, k log-probs) is the teacher's distribution
/// for completion token `i`, predicted at position `prompt_len - 1 + i`.
#[derive(Clone, Debug, PartialEq)]
pub struct StoredTopK {
    pub prompt_len: usize,
    /// Entries per completion token.
    pub k: usize,
    pub ids: Vec<u32>,
    /// `-inf` where the teacher returned fewer than k entries.
    pub logprobs: Vec<f32>,
}

/// Every conversation's stored top-k (None for a conversation without), all with the same `k`.
#[derive(Clone, Debug, PartialEq)]
pub struct TeacherTopK {
    pub k: usize,
    pub conversations: Vec<Option<StoredTopK>>,
}

impl TeacherTopK {
    /// `[M, k]` ids and log-probs at the batch's loss positions, in position order (the order
    /// `objective::score_loss_tokens` scores them in), or which position has none.
    pub fn targets(&self, batch: &PackedBatch) -> Result<(Vec<u32>, Vec<f32>), String> {
        let k = self.k;
        let mut ids = Vec::new();
        let mut logprobs = Vec::new();
        for (i, _) in batch.loss_mask.iter().enumerate().filter(|(_, m)| **m) {
            let row = i / batch.seq_len;
            let piece = batch
                .rows
                .get(row)
                .and_then(|r| r.pieces.get(batch.doc_ids[i] as usize))
                .ok_or_else(|| format!("loss position {i} lies in no packed piece"))?;
            let conversation = piece.doc as usize;
            let stored = self
                .conversations
                .get(conversation)
                .and_then(Option::as_ref)
                .ok_or_else(|| {
                    format!(
                        "conversation {conversation} (0-based, among the usable lines) has no \
                         teacher_topk_ids"
                    )
                })?;
            let target = piece.start as usize + batch.position_ids[i] as usize + 1;
            let index = target
                .checked_sub(stored.prompt_len)
                .filter(|&t| (t + 1) * k <= stored.ids.len())
                .ok_or_else(|| {
                    format!(
                        "conversation {conversation}: its trained token at offset {target} is \
                         outside the completion the teacher top-k cover"
                    )
                })?;
            ids.extend_from_slice(&stored.ids[index * k..(index + 1) * k]);
            logprobs.extend_from_slice(&stored.logprobs[index * k..(index + 1) * k]);
        }
        Ok((ids, logprobs))
    }
}
