//! The PRM training loop's state and one step: the tokenized rows in a seeded epoch order (the
//! preference pairs' shuffle, `seed ^ epoch`), `rows_per_micro_batch` rows per micro-batch,
//! `micro_batches` micro-batches per optimizer step through the shared micro-batch loop
//! (`step::accumulate`) and step engine (`StepEngine`: clipping, schedule, non-finite handling).
//! Each micro-batch is scored as one right-padded batch (`Transformer::score_tokens`) and its
//! loss is `ProcessRewardLoss`, weighted by its share of the step's rows.
//!
//! What this is not: the run (config, folder, log, checkpoints: `run`), the data rule (`data`)
//! or the loss (`loss`).

use std::time::Instant;

use stoke_data::epoch::{EpochCursor, EpochPosition, Shuffle};
use stoke_model::Transformer;

use super::data::TokenizedSteps;
use super::loss::ProcessRewardLoss;
use crate::error::TrainError;
use crate::preference::train::PairStepReport;
use crate::step::{MicroLoss, StepEngine, accumulate};

/// The loop's state.
pub struct PrmTrainer {
    model: Transformer,
    engine: StepEngine,
    rows: Vec<TokenizedSteps>,
    rows_per_micro_batch: usize,
    micro_batches: usize,
    order: EpochCursor,
    /// The epoch of the rows taken last (what the step reports).
    epoch: u64,
}

impl PrmTrainer {
    /// Checks that the pieces fit: a token classifier with two labels, rows with a label each,
    /// micro-batches of at least one row.
    pub fn new(
        model: Transformer,
        engine: StepEngine,
        rows: Vec<TokenizedSteps>,
        rows_per_micro_batch: usize,
        micro_batches: usize,
        seed: u64,
    ) -> Result<PrmTrainer, TrainError> {
        if !model.is_token_classifier() || model.config().score_labels != Some(2) {
            return Err(TrainError::Other(
                "a process reward model trains a token classifier with 2 labels \
                 (Transformer::to_token_classifier(2, seed))"
                    .into(),
            ));
        }
        if rows.is_empty() {
            return Err(TrainError::Other("prm: no rows to train on".into()));
        }
        if let Some(i) = rows.iter().position(|r| r.labelled() == 0) {
            return Err(TrainError::Other(format!(
                "prm: row {} has no labelled step left (cut by max_length or \
                 max_completion_length?)",
                i + 1
            )));
        }
        if rows_per_micro_batch == 0 || micro_batches == 0 {
            return Err(TrainError::Other(
                "data.rows_per_micro_batch and data.micro_batches must be at least 1".into(),
            ));
        }
        let order = EpochCursor::new(rows.len() as u64, Shuffle::SeedXorEpoch { seed }, None);
        Ok(PrmTrainer {
            model,
            engine,
            rows,
            rows_per_micro_batch,
            micro_batches,
            order,
            epoch: 0,
        })
    }

    pub fn model(&self) -> &Transformer {
        &self.model
    }

    pub fn engine(&self) -> &StepEngine {
        &self.engine
    }

    /// The data cursor a checkpoint keeps: the epoch and the position in its order.
    pub fn cursor(&self) -> EpochPosition {
        self.order.position()
    }

    /// Continues from a checkpoint: the engine's state and the data cursor (the weights and
    /// the optimizer state are loaded by the caller).
    pub fn restore(
        &mut self,
        engine: crate::step::EngineState,
        cursor: EpochPosition,
    ) -> Result<(), TrainError> {
        if cursor.position > self.rows.len() as u64 {
            return Err(TrainError::Resume(format!(
                "the checkpoint's data cursor is at row {} of an epoch, but the data has {} \
                 rows: not the same data",
                cursor.position,
                self.rows.len()
            )));
        }
        self.engine.restore(engine)?;
        self.epoch = cursor.epoch;
        self.order.seek(cursor);
        Ok(())
    }

    /// One optimizer step.
    pub fn step(&mut self) -> Result<PairStepReport, TrainError> {
        let started = Instant::now();
        let per = self.rows_per_micro_batch;
        let total = per * self.micro_batches;
        let mut indices = Vec::with_capacity(total);
        while indices.len() < total {
            let (_, row) = self.order.next_item().expect("the PRM loop has rows");
            indices.push(row as usize);
        }
        self.epoch = self.order.position().epoch;
        let mut sums: Vec<(&'static str, f64)> = Vec::new();
        let mut tokens = 0usize;
        let accumulated = accumulate(self.engine.gradients(), indices.chunks(per), |chunk| {
            let batch: Vec<TokenizedSteps> = chunk.iter().map(|&i| self.rows[i].clone()).collect();
            tokens += batch.iter().map(|r| r.input_ids.len()).sum::<usize>();
            let ids: Vec<&[u32]> = batch.iter().map(|r| r.input_ids.as_slice()).collect();
            let out = ProcessRewardLoss.loss(&self.model.score_tokens(&ids)?, &batch)?;
            let weight = chunk.len() as f64 / total as f64;
            for (name, value) in &out.metrics {
                match sums.iter_mut().find(|(key, _)| key == name) {
                    Some((_, sum)) => *sum += weight * value,
                    None => sums.push((name, weight * value)),
                }
            }
            let value = out.loss.to_scalar::<f64>()?;
            Ok(Some(MicroLoss::new(out.loss, value, weight)))
        })?;
        let loss = accumulated.loss;
        let result = self.engine.finish(loss, accumulated.grads)?;
        if result.stop {
            return Err(TrainError::NonFinite {
                step: self.engine.steps(),
                consecutive: result.consecutive_bad_steps,
                loss,
                grad_norm: result.grad_norm,
            });
        }
        Ok(PairStepReport {
            step: self.engine.steps(),
            epoch: self.epoch,
            outcome: result.outcome,
            loss,
            grad_norm: result.grad_norm,
            lr: result.lr,
            metrics: sums,
            pairs: total,
            tokens,
            seconds: started.elapsed().as_secs_f64(),
        })
    }
}

/// A PRM's figures on held-out `rows` (16 rows per forward pass, no graph kept): the loss and
/// `accuracy` over every labelled step of them at once (each batch weighted by its labelled
/// steps), and `labelled_steps`.
pub fn evaluate_prm(
    model: &Transformer,
    rows: &[TokenizedSteps],
) -> Result<Vec<(&'static str, f64)>, TrainError> {
    let (mut loss, mut accuracy, mut good, mut steps) = (0.0, 0.0, 0.0, 0.0);
    for chunk in rows.chunks(16) {
        let ids: Vec<&[u32]> = chunk.iter().map(|r| r.input_ids.as_slice()).collect();
        let logits = model.score_tokens(&ids)?.detach();
        let out = ProcessRewardLoss.loss(&logits, chunk)?;
        let n = out.metric("labelled_steps").unwrap_or(0.0);
        loss += n * out.loss.to_scalar::<f64>()?;
        accuracy += n * out.metric("accuracy").unwrap_or(f64::NAN);
        good += n * out.metric("mean_good_probability").unwrap_or(f64::NAN);
        steps += n;
    }
    if steps == 0.0 {
        return Err(TrainError::Other(
            "data.eval: no labelled step to score".into(),
        ));
    }
    Ok(vec![
        ("loss", loss / steps),
        ("accuracy", accuracy / steps),
        ("mean_good_probability", good / steps),
        ("labelled_steps", steps),
    ])
}
