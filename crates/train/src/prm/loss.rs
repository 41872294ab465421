//! The process reward model's loss, as TRL 0.29.0's `PRMTrainer` computes it: the token
//! classifier's logits `[B, T, 2]` (`Transformer::score_tokens`), and with `y_p` the label of a
//! labelled position `p` (the last token of a step's separator, see `data`),
//!
//! `loss = mean over labelled positions p of -log softmax(logits_p)[y_p]`
//!
//! which is transformers' `ForTokenClassification` loss (cross-entropy with `ignore_index` -100,
//! mean reduction) that `Trainer.compute_loss` returns for PRMTrainer. Checked by `tests/prm.rs`
//! against `fixtures/prm/trl_prm.json`. The logits are computed in the model's precision and the
//! loss in f64, as the preference losses.
//!
//! Metrics: `accuracy` (TRL's `compute_accuracy`: the share of labelled positions whose argmax
//! label is the label; a tie goes to label 0, as numpy's argmax), `mean_good_probability` (mean
//! P(good) over the labelled positions) and `labelled_steps`.
//!
//! What this is not: no forward pass, no data. Rows without any labelled position add nothing;
//! a batch without any is an error (TRL's mean would be NaN).

use candle_core::{DType, Tensor};

use super::PrmError;
use super::data::TokenizedSteps;
use crate::preference::PreferenceOutput;

/// The PRM cross-entropy over labelled positions (no settings: the rule is fixed).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct ProcessRewardLoss;

impl ProcessRewardLoss {
    /// The loss over one micro-batch: `logits` `[B, T, labels]` (with the graph; positions past a
    /// row's end are ignored) and the rows they were computed from.
    pub fn loss(
        &self,
        logits: &Tensor,
        rows: &[TokenizedSteps],
    ) -> Result<PreferenceOutput, PrmError> {
        let (batch, len, labels) = logits.dims3()?;
        if batch != rows.len() || rows.iter().any(|r| r.labels.len() > len) {
            return Err(PrmError::Shape(format!(
                "logits {:?} for {} rows of lengths {:?}",
                logits.dims(),
                rows.len(),
                rows.iter().map(|r| r.labels.len()).collect::<Vec<_>>()
            )));
        }
        if labels != 2 {
            return Err(PrmError::Shape(format!(
                "a process reward model has 2 labels (bad, good); these logits have {labels}"
            )));
        }
        let mut positions = Vec::new();
        let mut targets = Vec::new();
        for (b, row) in rows.iter().enumerate() {
            for (t, label) in row.labels.iter().enumerate() {
                if let Some(good) = label {
                    positions.push((b * len + t) as u32);
                    targets.push(u32::from(*good));
                }
            }
        }
        if positions.is_empty() {
            return Err(PrmError::Shape(
                "no labelled step in the batch (every label was cut or masked)".into(),
            ));
        }
        let count = positions.len();
        let device = logits.device();
        let picked = logits
            .reshape((batch * len, labels))?
            .index_select(&Tensor::new(positions.as_slice(), device)?, 0)?
            .to_dtype(DType::F64)?;
        let log_probs = stoke_ops::log_softmax(&picked, 1)?;
        let targets_t = Tensor::new(targets.as_slice(), device)?.reshape((count, 1))?;
        let loss = log_probs.gather(&targets_t, 1)?.mean_all()?.neg()?;

        let values: Vec<Vec<f64>> = picked.detach().to_vec2()?;
        let correct = values
            .iter()
            .zip(&targets)
            .filter(|(v, y)| u32::from(v[1] > v[0]) == **y)
            .count();
        let good: f64 = values.iter().map(|v| good_probability(v[0], v[1])).sum();
        let metrics = vec![
            ("accuracy", correct as f64 / count as f64),
            ("mean_good_probability", good / count as f64),
            ("labelled_steps", count as f64),
        ];
        Ok(PreferenceOutput { loss, metrics })
    }
}

/// P(good) of a two-label logit pair: `softmax([bad, good])[1]`, computed stably.
pub fn good_probability(bad: f64, good: f64) -> f64 {
    1.0 / (1.0 + (bad - good).exp())
}
