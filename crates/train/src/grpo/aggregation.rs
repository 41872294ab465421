//! Aggregation: how a `[B, T]` per-token loss and its `[B, T]` 0/1 mask become one scalar.
//!
//! - token-mean (DAPO, TRL `dapo`/`bnpo` with one micro-batch): `sum(l * m) / sum(m)`; every
//!   token weighs the same, so long completions are not down-weighted. **stoke's default.**
//! - sequence-mean-token-mean (GRPO original, TRL `grpo`):
//!   `mean_b( sum_t(l * m) / max(sum_t(m), 1) )`; each completion weighs the same, so a token of
//!   a long completion counts less (the length bias Dr. GRPO points out).
//! - sequence-mean-token-sum-normalized (Dr. GRPO, TRL `dr_grpo`):
//!   `sum(l * m) / (B * max_len)` with a constant `max_len` (the maximum completion length), so
//!   the weight of a token depends on neither its completion's length nor the batch's.
//!
//! What this is not: no gradient accumulation. The trainer loop's `Objective` contract returns a
//! loss *sum* and a token count; token-mean maps onto it directly (sum and `sum(m)`), the other
//! two need a per-sequence normaliser and are computed on a whole batch here.

use candle_core::{DType, Tensor};
use serde::{Deserialize, Serialize};

use super::GrpoError;

#[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum LossAggregation {
    #[default]
    TokenMean,
    SequenceMeanTokenMean,
    SequenceMeanTokenSumNorm {
        /// The constant normaliser per sequence (the maximum completion length), >= 1.
        max_len: usize,
    },
}

impl LossAggregation {
    pub fn validate(&self) -> Result<(), GrpoError> {
        if let LossAggregation::SequenceMeanTokenSumNorm { max_len: 0 } = self {
            return Err(GrpoError::config(
                "aggregation.max_len",
                "must be at least 1".to_string(),
            ));
        }
        Ok(())
    }

    /// The scalar loss from `per_token_loss` `[B, T]` and `mask` `[B, T]` (same dtype, 0/1).
    pub fn aggregate(&self, per_token_loss: &Tensor, mask: &Tensor) -> Result<Tensor, GrpoError> {
        let (batch, _) = per_token_loss.dims2()?;
        let masked = (per_token_loss * mask)?;
        let loss = match *self {
            LossAggregation::TokenMean => {
                let tokens = mask.to_dtype(DType::F64)?.sum_all()?.to_scalar::<f64>()?;
                (masked.sum_all()? / tokens.max(1.0))?
            }
            LossAggregation::SequenceMeanTokenMean => {
                let per_seq_tokens = mask.sum(1)?.clamp(1.0, f64::INFINITY)?;
                (masked.sum(1)? / per_seq_tokens)?.mean_all()?
            }
            LossAggregation::SequenceMeanTokenSumNorm { max_len } => {
                (masked.sum_all()? / (batch.max(1) * max_len) as f64)?
            }
        };
        Ok(loss)
    }
}
