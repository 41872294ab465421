//! Remote reference / teacher scoring: the log-probs of sampled completions under a frozen model
//! served by OpenAI-compatible servers (`stoke serve` or vLLM), for the KL term and for on-policy
//! distillation from a teacher too large to hold next to the trainer.
//!
//! One request per group: `POST /v1/completions` with the group's sequences (prompt ids followed
//! by each completion's ids) as a batch of token-id prompts and `prompt_logprobs: 0`, which
//! returns the log-probability of every prompt token given its prefix. The completion's entries
//! are the reference log-probs. `stoke serve` is asked to generate nothing (`echo` with
//! `max_tokens: 0`); vLLM generates one token, which is dropped (so a sequence that filled the
//! context exactly cannot be scored there, and is reported).
//!
//! Prompt log-probs are the model's own distribution (temperature 1), on both servers; the
//! in-process reference scores at the group's sampling temperature. A remote reference therefore
//! refuses a group sampled at another temperature rather than score it differently.
//!
//! Every answer is checked (one choice per sequence; a finite log-prob for every completion token,
//! keyed by that token's id); a failed request is retried on another server (`servers.rs`). The
//! reference never changes: `reference_reset_every` is refused with a remote reference.

use std::sync::Mutex;
use std::time::{Duration, Instant};

use serde_json::{Value, json};
use stoke_model::Transformer;
use stoke_serve::client::Client;
use stoke_tokenizer::hf::Tokenizer;

use crate::error::PipelineError;
use crate::records::ScoredGroup;
use crate::remote::rollout::{check_server, completion_choices};
use crate::remote::servers::{ServerPool, Work, health};
use crate::scheduler::each_on_a_thread;
use crate::service::{ReferenceScoring, RemoteStats};
use crate::settings::{Engine, RemoteReferenceSettings};

/// The reference (or teacher) on remote servers.
pub struct RemoteReference {
    pool: ServerPool,
    engine: Engine,
    model_name: String,
    vocab_size: usize,
    busy: Mutex<Duration>,
}

impl std::fmt::Debug for RemoteReference {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteReference")
            .field("pool", &self.pool)
            .field("model", &self.model_name)
            .finish_non_exhaustive()
    }
}

impl RemoteReference {
    /// Checks every server before the first step (it answers, serves the model, tokenizes as
    /// the run does). `vocab_size` is the policy's: returned ids are checked against it.
    pub fn connect(
        settings: &RemoteReferenceSettings,
        tokenizer: &Tokenizer,
        vocab_size: usize,
    ) -> Result<RemoteReference, PipelineError> {
        let mut model_name = settings.model.clone();
        for url in &settings.pool.servers {
            check_server("reference", url, &settings.pool, &mut model_name, tokenizer)?;
        }
        Ok(RemoteReference {
            pool: ServerPool::new("reference", settings.pool.clone(), Box::new(health)),
            engine: settings.engine,
            model_name: model_name.unwrap_or_default(),
            vocab_size,
            busy: Mutex::new(Duration::ZERO),
        })
    }

    pub fn remote_stats(&self) -> RemoteStats {
        self.pool.stats()
    }

    /// The reference log-probs of one group's samples, from one server.
    fn score_group(&self, client: &Client, group: &ScoredGroup) -> Result<Vec<Vec<f32>>, String> {
        let prompt = &group.rollout.ticket.task.prompt_ids;
        let samples = &group.rollout.samples;
        let sequences: Vec<Vec<u32>> = samples
            .iter()
            .map(|s| prompt.iter().chain(&s.completion_ids).copied().collect())
            .collect();
        let mut body = json!({
            "model": self.model_name,
            "prompt": sequences,
            "prompt_logprobs": 0,
            "temperature": 1.0,
        });
        match self.engine {
            Engine::Stoke => {
                body["echo"] = json!(true);
                body["max_tokens"] = json!(0);
            }
            Engine::Vllm => body["max_tokens"] = json!(1),
        }
        let ordered = completion_choices(client, &body, samples.len())?;
        ordered
            .iter()
            .zip(samples)
            .enumerate()
            .map(|(i, (choice, sample))| {
                completion_logprobs(
                    &choice["prompt_logprobs"],
                    prompt.len(),
                    &sample.completion_ids,
                    self.vocab_size,
                )
                .map_err(|e| format!("sequence {i}: {e}"))
            })
            .collect()
    }
}

/// The log-probs of `completion` (which follows `prompt_len` prompt tokens) from a sequence's
/// `prompt_logprobs` (vLLM's shape: null, then one `{"<id>": {"logprob": ..}}` per token).
fn completion_logprobs(
    entries: &Value,
    prompt_len: usize,
    completion: &[u32],
    vocab_size: usize,
) -> Result<Vec<f32>, String> {
    let entries = entries
        .as_array()
        .ok_or("no `prompt_logprobs` (the server must honour prompt_logprobs)")?;
    if entries.len() < prompt_len + completion.len() {
        return Err(format!(
            "{} prompt log-probs for a sequence of {} tokens",
            entries.len(),
            prompt_len + completion.len()
        ));
    }
    completion
        .iter()
        .enumerate()
        .map(|(j, &id)| {
            if id as usize >= vocab_size {
                return Err(format!("token id {id} is outside the vocabulary"));
            }
            let entry = &entries[prompt_len + j];
            entry[id.to_string()]["logprob"]
                .as_f64()
                .filter(|lp| lp.is_finite() && *lp <= 1e-6)
                .map(|lp| lp as f32)
                .ok_or_else(|| format!("no finite log-prob for token {j} (id {id}): {entry}"))
        })
        .collect()
}

impl ReferenceScoring for RemoteReference {
    fn has_reference(&self) -> bool {
        true
    }

    fn add_reference_logprobs(&self, groups: &mut [ScoredGroup]) -> Result<(), PipelineError> {
        let started = Instant::now();
        for group in groups.iter() {
            let temperature = group.rollout.ticket.temperature;
            if (temperature - 1.0).abs() > 1e-6 {
                return Err(PipelineError::config(
                    "grpo.temperature",
                    format!(
                        "a remote reference scores at temperature 1 (servers' prompt log-probs); \
                         group {} was sampled at {temperature}",
                        group.rollout.ticket.group_id
                    ),
                ));
            }
        }
        let results: Vec<Result<Vec<Vec<f32>>, PipelineError>> =
            each_on_a_thread(groups.iter(), |group| {
                let samples = &group.rollout.samples;
                if samples.iter().all(|s| s.completion_ids.is_empty()) {
                    return Ok(vec![Vec::new(); samples.len()]);
                }
                let what = format!(
                    "reference log-probs of group {}",
                    group.rollout.ticket.group_id
                );
                self.pool.call(&what, |_, client| {
                    let rows = self.score_group(client, group)?;
                    let tokens = rows.iter().map(|r| r.len() as u64).sum();
                    let samples = samples.len() as u64;
                    Ok((rows, Work { samples, tokens }))
                })
            });
        // All or nothing: fill only once every group has its rows.
        let rows: Vec<Vec<Vec<f32>>> = results.into_iter().collect::<Result<_, _>>()?;
        let elapsed = started.elapsed();
        let share = elapsed.as_secs_f64() / groups.len().max(1) as f64;
        for (group, rows) in groups.iter_mut().zip(rows) {
            group.ref_logprobs = Some(rows);
            group.inference_seconds += share;
        }
        *self
            .busy
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner) += elapsed;
        Ok(())
    }

    fn reset_reference(&mut self, _policy: &Transformer) -> Result<(), PipelineError> {
        Err(PipelineError::config(
            "grpo.reference_reset_every",
            "a remote reference is frozen on its servers and cannot be reset to the policy",
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn completion_entries_follow_the_prompt() {
        let entries = json!([
            null,
            {"7": {"logprob": -0.5}},
            {"3": {"logprob": -1.5}, "9": {"logprob": -0.1}},
            {"4": {"logprob": -2.0}},
        ]);
        assert_eq!(
            completion_logprobs(&entries, 2, &[3, 4], 10).unwrap(),
            vec![-1.5, -2.0]
        );
        let wrong_id = completion_logprobs(&entries, 2, &[5, 4], 10).unwrap_err();
        assert!(wrong_id.contains("id 5"), "{wrong_id}");
        let short = completion_logprobs(&entries, 3, &[4, 4], 10).unwrap_err();
        assert!(
            short.contains("4 prompt log-probs for a sequence of 5"),
            "{short}"
        );
        assert!(completion_logprobs(&json!(null), 1, &[1], 10).is_err());
    }
}
