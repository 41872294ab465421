//! The inference module: per-token log-probs of sampled completions under a model that is not
//! the sampler, computed without gradients in token-budgeted batches.
//!
//! What it computes:
//! - reference log-probs (`ScoredGroup::ref_logprobs`) under the frozen reference policy, for the
//!   KL penalty (beta > 0); the reference is a deep copy that training never touches, reset to
//!   the current policy every N updates on request ([`InferenceModule::reset_reference`]);
//! - recomputed "old policy" log-probs (`ScoredGroup::old_logprobs`, `old_version`) under the
//!   trainer's weights of a given version, for `OldLogprobs::Recompute` (AReaL's proximal policy).
//!
//! Both score `log softmax(logits / T)` of each completion token given its prefix, with `T` the
//! group's sampling temperature (`GroupTicket::temperature`), the distribution the trainer's
//! ratio compares against. Rows of all groups of a call are pooled: rows of equal temperature
//! are sorted by prompt length with each group's samples together (less padding, and a shared
//! prompt can be packed once) and cut into micro-batches whose padded size stays within
//! `micro_batch_tokens` (`stoke_train::grpo::token_budget_batches`). A row's log-probs do not
//! depend on which rows share its batch (padded keys are masked; see `grpo::sequences`).
//!
//! What it is not: the trainer's forward (that one keeps the graph) or the sampler's log-probs
//! (those come from the engine with the sample). Without a reference (beta = 0) no reference is
//! ever loaded and `add_reference_logprobs` does nothing.
//!
//! Invariants: every filled vector has exactly one entry per completion token of its sample
//! (empty completions get empty vectors without a forward pass), the environment's tokens of a
//! multi-turn sample included (`Sample::loss_mask`: the trainer's loss and the KL-in-reward
//! penalty leave them out, so this module need not know the mask); a call either fills every
//! group or returns an error and changes none.

use std::collections::BTreeMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use candle_core::Tensor;
use stoke_model::Transformer;
use stoke_train::grpo::sequences::{SequenceRow, completion_logprobs, token_budget_batches};

use crate::error::PipelineError;
use crate::records::ScoredGroup;
use crate::staleness::PolicyVersion;

/// Reference and recomputed log-probs for scored groups.
pub struct InferenceModule {
    reference: Option<Transformer>,
    micro_batch_tokens: usize,
    busy: Mutex<Duration>,
}

/// Where one row of a call comes from: group index, sample index.
#[derive(Clone, Copy)]
struct RowSource {
    group: usize,
    sample: usize,
}

impl InferenceModule {
    /// `reference`: the reference policy, owned from here on (None when beta = 0: then it is
    /// never loaded). `micro_batch_tokens`: most padded tokens per forward pass (a row longer
    /// than that is scored alone).
    pub fn new(reference: Option<Transformer>, micro_batch_tokens: usize) -> InferenceModule {
        InferenceModule {
            reference,
            micro_batch_tokens,
            busy: Mutex::new(Duration::ZERO),
        }
    }

    pub fn has_reference(&self) -> bool {
        self.reference.is_some()
    }

    pub fn micro_batch_tokens(&self) -> usize {
        self.micro_batch_tokens
    }

    /// Fills `ref_logprobs` of every group (temperature = the group's ticket temperature),
    /// batching rows across groups by the token budget. No-op without a reference.
    pub fn add_reference_logprobs(&self, groups: &mut [ScoredGroup]) -> Result<(), PipelineError> {
        let Some(reference) = &self.reference else {
            return Ok(());
        };
        let started = Instant::now();
        let logprobs = self.score_groups(reference, groups)?;
        for (group, rows) in groups.iter_mut().zip(logprobs) {
            group.ref_logprobs = Some(rows);
        }
        self.charge(groups, started.elapsed());
        Ok(())
    }

    /// Fills `old_logprobs` and `old_version` under `policy`, the trainer's weights of
    /// `version` (recompute mode).
    pub fn add_recomputed_logprobs(
        &self,
        policy: &Transformer,
        version: PolicyVersion,
        groups: &mut [ScoredGroup],
    ) -> Result<(), PipelineError> {
        let started = Instant::now();
        let logprobs = self.score_groups(policy, groups)?;
        for (group, rows) in groups.iter_mut().zip(logprobs) {
            group.old_logprobs = Some(rows);
            group.old_version = Some(version);
        }
        self.charge(groups, started.elapsed());
        Ok(())
    }

    /// Replaces the reference by a deep copy of `policy` (reference reset every N updates). The
    /// copy has its own storage, so later optimizer steps on `policy` do not reach it.
    pub fn reset_reference(&mut self, policy: &Transformer) -> Result<(), PipelineError> {
        self.reference = Some(policy.snapshot()?);
        Ok(())
    }

    /// Total wall time spent in forward passes since creation.
    pub fn busy_seconds(&self) -> f64 {
        self.busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .as_secs_f64()
    }

    /// Adds `elapsed` to the module's busy time and shares it among the groups by their
    /// completion tokens (what the forward passes cost).
    fn charge(&self, groups: &mut [ScoredGroup], elapsed: Duration) {
        *self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += elapsed;
        let tokens = |group: &ScoredGroup| -> usize {
            group
                .rollout
                .samples
                .iter()
                .map(|s| s.completion_ids.len())
                .sum()
        };
        let total: usize = groups.iter().map(tokens).sum();
        let share = |group: &ScoredGroup| match total {
            0 => 1.0 / groups.len() as f64,
            _ => tokens(group) as f64 / total as f64,
        };
        let shares: Vec<f64> = groups.iter().map(share).collect();
        for (group, share) in groups.iter_mut().zip(shares) {
            group.inference_seconds += elapsed.as_secs_f64() * share;
        }
    }

    /// Per group, per sample, per completion token: log-probs under `model` at the group's
    /// temperature. Nothing in `groups` is changed.
    fn score_groups(
        &self,
        model: &Transformer,
        groups: &[ScoredGroup],
    ) -> Result<Vec<Vec<Vec<f32>>>, PipelineError> {
        let mut logprobs: Vec<Vec<Vec<f32>>> = groups
            .iter()
            .map(|group| vec![Vec::new(); group.rollout.samples.len()])
            .collect();
        // Rows by temperature (its bits: equal temperatures share batches, nothing else does).
        // Empty completions need no forward pass and keep their empty vectors.
        let mut by_temperature: BTreeMap<u32, Vec<RowSource>> = BTreeMap::new();
        for (group_index, group) in groups.iter().enumerate() {
            let temperature = group.rollout.ticket.temperature;
            if !(temperature.is_finite() && temperature > 0.0) {
                return Err(row_error(
                    group,
                    None,
                    format!("temperature {temperature} is not finite and > 0"),
                ));
            }
            for (sample_index, sample) in group.rollout.samples.iter().enumerate() {
                if sample.completion_ids.is_empty() {
                    continue;
                }
                check_row(model, group, sample_index)?;
                by_temperature
                    .entry(temperature.to_bits())
                    .or_default()
                    .push(RowSource {
                        group: group_index,
                        sample: sample_index,
                    });
            }
        }
        let row_of = |source: &RowSource| {
            let group = &groups[source.group];
            SequenceRow {
                prompt_ids: &group.rollout.ticket.task.prompt_ids,
                completion_ids: &group.rollout.samples[source.sample].completion_ids,
            }
        };
        for (temperature_bits, mut sources) in by_temperature {
            let temperature = f32::from_bits(temperature_bits);
            // Similar prompt lengths together (less padding), and the samples of a group next to
            // each other, so the scorer can pack a shared prompt once (shared-prefix layout).
            sources.sort_by_key(|source| {
                let prompt = groups[source.group].rollout.ticket.task.prompt_ids.len();
                (prompt, source.group, source.sample)
            });
            let lengths: Vec<usize> = sources.iter().map(|s| row_of(s).len()).collect();
            for batch in token_budget_batches(&lengths, self.micro_batch_tokens) {
                let batch_sources = &sources[batch];
                let rows: Vec<SequenceRow<'_>> = batch_sources.iter().map(row_of).collect();
                let scores = completion_logprobs(model, &rows, temperature, false)?;
                let values = detached_rows(&scores.logprobs)?;
                for ((source, row), mut values) in batch_sources.iter().zip(&rows).zip(values) {
                    values.truncate(row.completion_ids.len());
                    logprobs[source.group][source.sample] = values;
                }
            }
        }
        Ok(logprobs)
    }
}

/// `[B, Tc]` log-probs as host vectors (the graph is dropped with the tensor).
fn detached_rows(logprobs: &Tensor) -> Result<Vec<Vec<f32>>, PipelineError> {
    Ok(logprobs.detach().to_vec2::<f32>()?)
}

/// Checks one row up front, so a bad record is named by its task and sample rather than by its
/// position in some micro-batch.
fn check_row(
    model: &Transformer,
    group: &ScoredGroup,
    sample_index: usize,
) -> Result<(), PipelineError> {
    let config = model.config();
    let prompt = &group.rollout.ticket.task.prompt_ids;
    let completion = &group.rollout.samples[sample_index].completion_ids;
    if prompt.is_empty() {
        return Err(row_error(
            group,
            Some(sample_index),
            "the prompt has no tokens".into(),
        ));
    }
    let len = prompt.len() + completion.len();
    if len > config.max_position_embeddings {
        return Err(row_error(
            group,
            Some(sample_index),
            format!(
                "{len} tokens exceed max_position_embeddings = {}",
                config.max_position_embeddings
            ),
        ));
    }
    if let Some(id) = prompt
        .iter()
        .chain(completion)
        .find(|id| **id as usize >= config.vocab_size)
    {
        return Err(row_error(
            group,
            Some(sample_index),
            format!(
                "token id {id} is outside the vocabulary (vocab_size = {})",
                config.vocab_size
            ),
        ));
    }
    Ok(())
}

fn row_error(group: &ScoredGroup, sample: Option<usize>, reason: String) -> PipelineError {
    let ticket = &group.rollout.ticket;
    let sample = sample.map_or(String::new(), |s| format!(", sample {s}"));
    PipelineError::ModuleStopped {
        module: "inference",
        reason: format!(
            "task `{}` (group {}{sample}): {reason}",
            ticket.task.id, ticket.group_id
        ),
    }
}
