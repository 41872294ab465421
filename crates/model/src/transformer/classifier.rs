//! A classifier's head: the `score` linear layer that replaces the LM head of a reward model.
//! A sequence classifier (`*ForSequenceClassification`, `stoke rm`) scores each sequence once, at
//! its last token that is not padding (`sequence_scores`, `score_sequences`); a token classifier
//! (`*ForTokenClassification`, a process reward model) scores every position (`token_scores`,
//! `score_tokens`), with the head's bias when it has one. Both return what transformers returns
//! as `logits` for the same ids.
//!
//! What it is not: the body's forward pass (`forward`), making a classifier out of a causal LM
//! (`init`), or any loss (the trainer's objectives).
//!
//! Invariants: each entry point refuses the other kind of classifier and a causal LM, with an
//! error naming what it needs; rows are right-padded with id 0 under a causal mask, so a row's
//! scores do not depend on the other rows of the batch.

use super::model::Transformer;
use crate::config::ScoreKind;
use crate::error::ModelError;
use candle_core::Tensor;

impl Transformer {
    /// The `score` weight, if this is a classifier of `kind` (the bias flag aside); else an
    /// error naming `what` and what it needs.
    fn classifier_head(&self, what: &str, kind: ScoreKind) -> Result<&Tensor, ModelError> {
        let same_kind = matches!(
            (kind, self.config.score_kind),
            (ScoreKind::Sequence, ScoreKind::Sequence)
                | (ScoreKind::Token { .. }, ScoreKind::Token { .. })
        );
        let needed = match kind {
            ScoreKind::Sequence => "a sequence classifier (*ForSequenceClassification)",
            ScoreKind::Token { .. } => "a token classifier (*ForTokenClassification)",
        };
        match &self.score {
            Some(score) if same_kind => Ok(score),
            Some(_) => Err(ModelError::InvalidArgument(format!(
                "{what} needs {needed}; this is a {} classifier",
                match self.config.score_kind {
                    ScoreKind::Sequence => "sequence",
                    ScoreKind::Token { .. } => "token",
                }
            ))),
            None => Err(ModelError::InvalidArgument(format!(
                "{what} needs {needed} (a `score` head); this is a causal LM"
            ))),
        }
    }

    /// A sequence classifier's scores `[B, labels]` from hidden states `[B, T, hidden]`: the
    /// `score` head at `positions[b]`, row `b`'s scored token (see [`Transformer::scored_position`]).
    /// Errors: not a classifier, or a position per row missing or past `T`.
    pub fn sequence_scores(
        &self,
        hidden: &Tensor,
        positions: &[usize],
    ) -> Result<Tensor, ModelError> {
        let score = self.classifier_head("sequence_scores", ScoreKind::Sequence)?;
        let (batch, len, width) = hidden.dims3()?;
        if positions.len() != batch || positions.iter().any(|&p| p >= len) {
            return Err(ModelError::InvalidArgument(format!(
                "sequence_scores: {} positions for {batch} rows of {len} tokens: {positions:?}",
                positions.len()
            )));
        }
        let rows: Vec<u32> = positions
            .iter()
            .enumerate()
            .map(|(b, &p)| (b * len + p) as u32)
            .collect();
        let rows = Tensor::new(rows.as_slice(), hidden.device())?;
        let picked = hidden
            .reshape((batch * len, width))?
            .index_select(&rows, 0)?;
        Ok(stoke_ops::linear(&picked, score, self.precision)?)
    }

    /// A sequence classifier's scores `[rows, labels]` of whole token sequences (each on its own
    /// row, right-padded, causal): what transformers' `*ForSequenceClassification` returns as
    /// `logits` for the same ids. Differentiable. Errors: not a classifier, or an empty row.
    pub fn score_sequences(&self, rows: &[&[u32]]) -> Result<Tensor, ModelError> {
        let hidden = self.padded_hidden("score_sequences", rows)?;
        let scored: Vec<usize> = rows.iter().map(|r| self.scored_position(r)).collect();
        self.sequence_scores(&hidden, &scored)
    }

    /// The token a sequence classifier scores in a row of `ids` (transformers' rule): the last
    /// one that is not the config's `pad_token_id`, position 0 when every token is padding, the
    /// last position when the config has no pad token.
    pub fn scored_position(&self, ids: &[u32]) -> usize {
        let pad = self
            .config
            .source_fields
            .get("pad_token_id")
            .and_then(serde_json::Value::as_u64);
        match pad {
            Some(pad) => ids
                .iter()
                .rposition(|&id| u64::from(id) != pad)
                .unwrap_or(0),
            None => ids.len().saturating_sub(1),
        }
    }

    /// A token classifier's scores `[B, T, labels]` from hidden states `[B, T, hidden]`: the
    /// `score` head (and its bias) at every position. Errors: not a token classifier.
    pub fn token_scores(&self, hidden: &Tensor) -> Result<Tensor, ModelError> {
        let score = self.classifier_head("token_scores", ScoreKind::Token { bias: true })?;
        let (batch, len, width) = hidden.dims3()?;
        let flat = hidden.reshape((batch * len, width))?;
        let logits = stoke_ops::linear(&flat, score, self.precision)?;
        let logits = match &self.score_bias {
            Some(bias) => logits.broadcast_add(bias)?,
            None => logits,
        };
        Ok(logits.reshape((batch, len, score.dim(0)?))?)
    }

    /// A token classifier's scores `[rows, T, labels]` of whole token sequences (each on its own
    /// row, right-padded to the longest, `T`, causal): what transformers'
    /// `*ForTokenClassification` returns as `logits` for the same ids at every real position.
    /// The positions past a row's end are padding and hold no meaningful score. Differentiable.
    /// Errors: not a token classifier, or an empty row.
    pub fn score_tokens(&self, rows: &[&[u32]]) -> Result<Tensor, ModelError> {
        let hidden = self.padded_hidden("score_tokens", rows)?;
        self.token_scores(&hidden)
    }

    /// The final-normed hidden states `[rows, T, hidden]` of `rows` right-padded with id 0 to
    /// the longest (`T`), each row attending causally to its own tokens only.
    fn padded_hidden(&self, what: &str, rows: &[&[u32]]) -> Result<Tensor, ModelError> {
        let len = rows.iter().map(|r| r.len()).max().unwrap_or(0);
        if rows.is_empty() || rows.iter().any(|r| r.is_empty()) {
            return Err(ModelError::InvalidArgument(format!(
                "{what}: every row needs at least one token"
            )));
        }
        let device = self.device();
        let mut ids = Vec::with_capacity(rows.len() * len);
        let mut valid = Vec::with_capacity(rows.len());
        for row in rows {
            ids.extend_from_slice(row);
            ids.extend(std::iter::repeat_n(0u32, len - row.len()));
            valid.push((0..len).map(|j| j < row.len()).collect::<Vec<bool>>());
        }
        let input = Tensor::from_vec(ids, (rows.len(), len), device)?;
        let positions: Vec<u32> = (0..rows.len()).flat_map(|_| 0..len as u32).collect();
        let positions = Tensor::from_vec(positions, (rows.len(), len), device)?;
        let bias = crate::mask::causal_bias(&valid, len, device)?;
        self.forward_hidden(&input, &positions, &bias, None)
    }
}
