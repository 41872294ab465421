//! The rollout module: turns granted [`GroupTicket`]s into [`RolloutGroup`]s (`group_size`
//! sampled completions per ticket) with the generation engine, under the newest published
//! weights.
//!
//! What it is: a thin driver over `stoke_rollout::generate_live`. It batches tickets into as few
//! engine calls as it can, waits for the weight version the tickets were granted with, decodes
//! text with the tokenizer (what the reward reads) and records which weights produced every
//! token. What it is not: the gate (tickets arrive already granted), a reward, or a thread (the
//! caller runs it on whatever thread the scheduler gives it).
//!
//! How a call runs:
//! 1. Wait until the store holds a version >= every ticket's `permit.policy_version` (with
//!    `fixed_lag`: exactly that version, per ticket).
//! 2. Tickets whose prompt the model cannot take (empty, ids outside the vocabulary, no room
//!    below `max_position_embeddings`) are rejected: they come back as a group with no samples
//!    (so the trainer's slot still receives its record and nothing waits for it), counted in
//!    [`RolloutStats`] with the reason. One bad task does not stop a run.
//! 3. The other tickets are grouped by temperature (one engine call per distinct temperature,
//!    in order of first appearance) and each such group is split into runs of consecutive
//!    `group_id`s, one engine call per run. Why runs: the engine numbers prompts
//!    `first_prompt_number + i`, and a ticket's `group_id` is its prompt number, so a group's
//!    samples depend on (seed, group_id, weights) only, never on which tickets share its call.
//!    Group ids are granted gap-free in permit order, so a batch of tickets normally is a single
//!    run; unordered or gapped batches cost extra calls, never other samples.
//! 4. Weights: `WeightSync::BetweenBatches` takes the weights once, after the wait, and uses that
//!    one version for every engine call of this `generate` (every token of every sample has that
//!    version). `WeightSync::InFlight` hands the store itself to the engine as live weights: each
//!    decode step uses the newest published version, and the KV cache carries over.
//!
//! Invariants: one group per ticket, in ticket order, with the ticket moved into it; each
//! accepted group has exactly `group_size` samples in sample order; in every sample
//! `completion_ids`, `rollout_logprobs` and `token_versions` have equal lengths, and
//! `token_versions` is non-decreasing and starts at or above the ticket's permit version.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use stoke_model::{ModelConfig, Transformer};
use stoke_rollout::{
    Completion, Detokenizer, FixedWeights, GenerationRequest, LiveWeights, SamplingParams,
    generate_live,
};
use stoke_tokenizer::hf::Tokenizer;

use crate::episode::{EpisodeGroup, EpisodeRecord, EpisodeSetup, EpisodeStats, env_task};
use crate::error::PipelineError;
use crate::records::{EpisodeSummary, GroupTicket, RolloutGroup, Sample};
use crate::settings::{GrpoSettings, Lag, WeightSync};
use crate::staleness::PolicyVersion;
use crate::weights::WeightStore;

/// What the rollout module needs from the run's settings.
#[derive(Clone, Debug, PartialEq)]
pub struct RolloutSettings {
    /// Samples per ticket (the GRPO group size).
    pub group_size: usize,
    pub max_new_tokens: usize,
    pub top_p: f32,
    pub top_k: Option<usize>,
    /// Base seed of the sampling streams (sample j of group g: stream (seed, g, j)).
    pub seed: u64,
    /// Ids that end a sample (normally the tokenizer's EOS ids); kept in `completion_ids`.
    pub stop_token_ids: Vec<u32>,
    pub weight_sync: WeightSync,
    /// Sample every ticket with exactly its permit's version (a fixed-lag pipeline; the store
    /// must keep enough versions), instead of the newest weights at or above it.
    pub fixed_lag: bool,
}

impl RolloutSettings {
    /// The rollout part of a run's settings; `stop_token_ids` come from the tokenizer.
    pub fn from_grpo(settings: &GrpoSettings, stop_token_ids: Vec<u32>) -> RolloutSettings {
        RolloutSettings {
            group_size: settings.group_size,
            max_new_tokens: settings.max_new_tokens,
            top_p: settings.top_p,
            top_k: settings.top_k,
            seed: settings.seed,
            stop_token_ids,
            weight_sync: settings.weight_sync,
            fixed_lag: settings.lag == Lag::Fixed,
        }
    }
}

/// Why a model with `vocab_size` ids and room for `max_len` positions (named `limit` in the
/// message) cannot take `prompt_ids`: empty, an id outside the vocabulary, or no room left to
/// generate.
pub(crate) fn check_prompt(
    prompt_ids: &[u32],
    vocab_size: usize,
    max_len: usize,
    limit: &str,
) -> Result<(), String> {
    if prompt_ids.is_empty() {
        return Err("the prompt has no tokens".into());
    }
    if let Some(&id) = prompt_ids.iter().find(|&&id| id as usize >= vocab_size) {
        return Err(format!(
            "prompt token id {id} is outside the model's vocabulary (size {vocab_size})"
        ));
    }
    if prompt_ids.len() >= max_len {
        return Err(format!(
            "the prompt has {} tokens, leaving no room below {limit} = {max_len}",
            prompt_ids.len()
        ));
    }
    Ok(())
}

/// Counters over the module's life, for metrics.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RolloutStats {
    pub engine_calls: u64,
    /// Groups generated (rejected tickets not included).
    pub groups: u64,
    pub samples: u64,
    pub prefill_tokens: u64,
    pub generated_tokens: u64,
    /// Seconds inside the engine.
    pub generate_seconds: f64,
    /// Seconds waiting for the tickets' weight version.
    pub wait_seconds: f64,
    /// Samples whose tokens came from more than one version (in-flight switches).
    pub samples_spanning_versions: u64,
    /// Tickets whose prompt the model cannot take (returned as groups without samples).
    pub rejected_tickets: u64,
    /// The largest KV cache one engine call held (bytes).
    pub kv_cache_peak_bytes: u64,
    /// Why the latest rejected ticket was rejected, naming its task.
    pub last_rejection: Option<String>,
    /// Multi-turn episodes (runs with an `[environment]`).
    pub episodes: EpisodeStats,
}

impl RolloutStats {
    /// Counts one generated group: its samples, and those whose tokens span weight versions.
    pub(crate) fn count_group(&mut self, samples: &[Sample]) {
        self.groups += 1;
        self.samples += samples.len() as u64;
        self.samples_spanning_versions += samples
            .iter()
            .filter(|sample| sample.token_versions.first() != sample.token_versions.last())
            .count() as u64;
    }
}

/// The rollout module. `Send + Sync`: several threads may call `generate` at once.
pub struct RolloutModule {
    weights: Arc<WeightStore>,
    tokenizer: Arc<Tokenizer>,
    settings: RolloutSettings,
    /// The model config every published version shares (see `weights.rs`).
    model_config: ModelConfig,
    stats: Mutex<RolloutStats>,
    /// Multi-turn episodes in an environment instead of single completions.
    episodes: Option<EpisodeSetup>,
}

impl std::fmt::Debug for RolloutModule {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RolloutModule")
            .field("settings", &self.settings)
            .finish_non_exhaustive()
    }
}

impl RolloutModule {
    /// Checks the settings (errors name the field).
    pub fn new(
        weights: Arc<WeightStore>,
        tokenizer: Arc<Tokenizer>,
        settings: RolloutSettings,
    ) -> Result<RolloutModule, PipelineError> {
        if settings.group_size == 0 {
            return Err(PipelineError::config("group_size", "must be at least 1"));
        }
        if settings.max_new_tokens == 0 {
            return Err(PipelineError::config(
                "max_new_tokens",
                "must be at least 1",
            ));
        }
        if !(settings.top_p > 0.0 && settings.top_p <= 1.0) {
            return Err(PipelineError::config(
                "top_p",
                format!("must be in (0, 1], got {}", settings.top_p),
            ));
        }
        let model_config = weights.current().0.config().clone();
        if let Some(&id) = settings
            .stop_token_ids
            .iter()
            .find(|&&id| id as usize >= model_config.vocab_size)
        {
            return Err(PipelineError::config(
                "stop_token_ids",
                format!(
                    "id {id} is outside the model's vocabulary (size {})",
                    model_config.vocab_size
                ),
            ));
        }
        Ok(RolloutModule {
            weights,
            tokenizer,
            settings,
            model_config,
            stats: Mutex::new(RolloutStats::default()),
            episodes: None,
        })
    }

    /// The same module playing multi-turn episodes of `setup`'s environment: each sample is an
    /// episode (`episode::EpisodeRunner`), its tasks' prompts rendered from the environment's
    /// opening (`episode::episode_prompts`). Errors: the tokenizer has no chat template.
    pub fn with_episodes(mut self, setup: EpisodeSetup) -> Result<RolloutModule, PipelineError> {
        self.tokenizer
            .default_chat_template()
            .map_err(|e| PipelineError::config("environment", e.to_string()))?;
        self.episodes = Some(setup);
        Ok(self)
    }

    pub fn settings(&self) -> &RolloutSettings {
        &self.settings
    }

    pub fn stats(&self) -> RolloutStats {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Generates `group_size` samples for every ticket (see the module doc for batching, waiting
    /// and weights). Returns one group per ticket, in ticket order. Errors: the weight store
    /// closed before the needed version (`ModuleStopped`), or the engine failed.
    pub fn generate(&self, tickets: Vec<GroupTicket>) -> Result<Vec<RolloutGroup>, PipelineError> {
        if tickets.is_empty() {
            return Ok(Vec::new());
        }
        let wait_started = Instant::now();
        let versions = self.weights_for(&tickets)?;
        let wait_seconds = wait_started.elapsed().as_secs_f64();
        let mut rejections = Vec::new();
        let accepted: Vec<usize> = (0..tickets.len())
            .filter(
                |&index| match self.check_prompt(&tickets[index].task.prompt_ids) {
                    Ok(()) => true,
                    Err(reason) => {
                        rejections.push(format!("task {}: {reason}", tickets[index].task.id));
                        false
                    }
                },
            )
            .collect();

        let mut results: Vec<(Vec<Sample>, f64)> = vec![(Vec::new(), 0.0); tickets.len()];
        let mut call_stats = RolloutStats::default();
        for (model, version, indices) in versions {
            let fixed = FixedWeights {
                model,
                version: version.0,
            };
            let weights: &dyn LiveWeights = match self.settings.weight_sync {
                WeightSync::BetweenBatches => &fixed,
                WeightSync::InFlight => &*self.weights,
            };
            let accepted: Vec<usize> = accepted
                .iter()
                .copied()
                .filter(|index| indices.contains(index))
                .collect();
            for call in engine_calls(&tickets, &accepted) {
                self.generate_call(weights, &tickets, &call, &mut results, &mut call_stats)?;
            }
        }

        self.record(call_stats, wait_seconds, rejections);
        Ok(tickets
            .into_iter()
            .zip(results)
            .map(|(ticket, (samples, generate_seconds))| RolloutGroup {
                ticket,
                samples,
                generate_seconds,
            })
            .collect())
    }

    /// One engine call over the tickets at `call` (consecutive group ids, one temperature);
    /// each ticket's samples go to `results[index]`.
    fn generate_call(
        &self,
        weights: &dyn LiveWeights,
        tickets: &[GroupTicket],
        call: &[usize],
        results: &mut [(Vec<Sample>, f64)],
        call_stats: &mut RolloutStats,
    ) -> Result<(), PipelineError> {
        let first = &tickets[call[0]];
        if let Some(setup) = &self.episodes {
            return self.play_call(setup, weights, tickets, call, results, call_stats);
        }
        let request = GenerationRequest {
            prompts: call
                .iter()
                .map(|&index| tickets[index].task.prompt_ids.clone())
                .collect(),
            params: self.sampling_params(first.temperature),
            first_prompt_number: first.group_id,
            streams: None,
        };
        let started = Instant::now();
        let detokenizer: &dyn Detokenizer = &*self.tokenizer;
        let generation = generate_live(weights, &request, Some(detokenizer))?;
        let seconds = started.elapsed().as_secs_f64();
        call_stats.engine_calls += 1;
        call_stats.generate_seconds += seconds;
        call_stats.prefill_tokens += generation.output.prefill_tokens as u64;
        call_stats.generated_tokens += generation.output.generated_tokens as u64;
        call_stats.kv_cache_peak_bytes = call_stats
            .kv_cache_peak_bytes
            .max(generation.output.kv_cache_bytes as u64);
        let per_group = seconds / call.len() as f64;
        let prompts = generation
            .output
            .completions
            .into_iter()
            .zip(generation.token_versions);
        for (&index, (completions, versions)) in call.iter().zip(prompts) {
            let samples: Vec<Sample> = completions
                .into_iter()
                .zip(versions)
                .map(|(completion, versions)| to_sample(completion, versions))
                .collect();
            call_stats.count_group(&samples);
            results[index] = (samples, per_group);
        }
        Ok(())
    }

    /// [`RolloutModule::generate_call`] for a run with an environment: one episode per sample.
    fn play_call(
        &self,
        setup: &EpisodeSetup,
        weights: &dyn LiveWeights,
        tickets: &[GroupTicket],
        call: &[usize],
        results: &mut [(Vec<Sample>, f64)],
        call_stats: &mut RolloutStats,
    ) -> Result<(), PipelineError> {
        let template = self
            .tokenizer
            .default_chat_template()
            .map_err(|e| PipelineError::config("environment", e.to_string()))?;
        let runner = setup.runner(&self.tokenizer, template);
        let groups = call
            .iter()
            .map(|&index| {
                let ticket = &tickets[index];
                let task = env_task(&ticket.task);
                let opening = setup.env.opening(&task).map_err(|e| {
                    PipelineError::config("environment", format!("task {}: {e}", task.id))
                })?;
                Ok(EpisodeGroup {
                    group_id: ticket.group_id,
                    task: Arc::new(task),
                    opening,
                    prompt_ids: ticket.task.prompt_ids.clone(),
                })
            })
            .collect::<Result<Vec<_>, PipelineError>>()?;
        let params = self.sampling_params(tickets[call[0]].temperature);
        let started = Instant::now();
        let mut stats = EpisodeStats::default();
        let records = runner.run(weights, &params, &groups, &mut stats)?;
        let seconds = started.elapsed().as_secs_f64();
        call_stats.engine_calls += stats.engine_calls;
        call_stats.generate_seconds += stats.generate_seconds;
        call_stats.generated_tokens += stats.generated_tokens;
        call_stats.prefill_tokens += groups
            .iter()
            .map(|g| g.prompt_ids.len() as u64)
            .sum::<u64>();
        call_stats.episodes.add(&stats);
        let per_group = seconds / call.len() as f64;
        for (&index, episodes) in call.iter().zip(records) {
            let samples: Vec<Sample> = episodes
                .into_iter()
                .map(|record| episode_sample(record, setup.env.as_ref()))
                .collect();
            call_stats.count_group(&samples);
            results[index] = (samples, per_group);
        }
        Ok(())
    }

    /// The weights each ticket samples with: bounded lag takes the newest weights once every
    /// ticket's version is out (one entry for all tickets); fixed lag takes exactly each
    /// ticket's version (one entry per distinct version, oldest first).
    #[allow(clippy::type_complexity)]
    fn weights_for(
        &self,
        tickets: &[GroupTicket],
    ) -> Result<Vec<(Arc<Transformer>, PolicyVersion, Vec<usize>)>, PipelineError> {
        if !self.settings.fixed_lag {
            let needed = tickets
                .iter()
                .map(|ticket| ticket.permit.policy_version)
                .max()
                .unwrap_or_default();
            let (model, version) =
                self.weights
                    .wait_for(needed)
                    .ok_or_else(|| PipelineError::ModuleStopped {
                        module: "rollout",
                        reason: format!(
                            "the weight store closed before version {} was published",
                            needed.0
                        ),
                    })?;
            return Ok(vec![(model, version, (0..tickets.len()).collect())]);
        }
        let mut versions: Vec<PolicyVersion> = tickets
            .iter()
            .map(|ticket| ticket.permit.policy_version)
            .collect();
        versions.sort_unstable();
        versions.dedup();
        versions
            .into_iter()
            .map(|version| {
                let model = self.weights.wait_for_exact(version)?;
                let indices = (0..tickets.len())
                    .filter(|&index| tickets[index].permit.policy_version == version)
                    .collect();
                Ok((model, version, indices))
            })
            .collect()
    }

    fn sampling_params(&self, temperature: f32) -> SamplingParams {
        SamplingParams {
            max_new_tokens: self.settings.max_new_tokens,
            temperature,
            top_k: self.settings.top_k,
            top_p: self.settings.top_p,
            seed: self.settings.seed,
            n: self.settings.group_size,
            stop_token_ids: self.settings.stop_token_ids.clone(),
            stop_strings: Vec::new(),
        }
    }

    /// The engine's prompt checks, done per ticket so one bad task rejects only its own group.
    fn check_prompt(&self, prompt_ids: &[u32]) -> Result<(), String> {
        let config = &self.model_config;
        check_prompt(
            prompt_ids,
            config.vocab_size,
            config.max_position_embeddings,
            "max_position_embeddings",
        )
    }

    fn record(&self, call: RolloutStats, wait_seconds: f64, rejections: Vec<String>) {
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.engine_calls += call.engine_calls;
        stats.groups += call.groups;
        stats.samples += call.samples;
        stats.prefill_tokens += call.prefill_tokens;
        stats.generated_tokens += call.generated_tokens;
        stats.generate_seconds += call.generate_seconds;
        stats.samples_spanning_versions += call.samples_spanning_versions;
        stats.kv_cache_peak_bytes = stats.kv_cache_peak_bytes.max(call.kv_cache_peak_bytes);
        stats.wait_seconds += wait_seconds;
        stats.episodes.add(&call.episodes);
        stats.rejected_tickets += rejections.len() as u64;
        if let Some(last) = rejections.into_iter().last() {
            stats.last_rejection = Some(last);
        }
    }
}

/// Ticket indices per engine call: `accepted` grouped by temperature (bit-equal, in order of
/// first appearance), each group sorted by `group_id` and split where ids stop being
/// consecutive.
fn engine_calls(tickets: &[GroupTicket], accepted: &[usize]) -> Vec<Vec<usize>> {
    let mut by_temperature: Vec<(u32, Vec<usize>)> = Vec::new();
    for &index in accepted {
        let bits = tickets[index].temperature.to_bits();
        match by_temperature.iter_mut().find(|(key, _)| *key == bits) {
            Some((_, indices)) => indices.push(index),
            None => by_temperature.push((bits, vec![index])),
        }
    }
    let mut calls = Vec::new();
    for (_, mut indices) in by_temperature {
        indices.sort_by_key(|&index| tickets[index].group_id);
        let mut run: Vec<usize> = Vec::new();
        for index in indices {
            let continues = run.last().is_some_and(|&last| {
                tickets[last].group_id.checked_add(1) == Some(tickets[index].group_id)
            });
            if !continues && !run.is_empty() {
                calls.push(std::mem::take(&mut run));
            }
            run.push(index);
        }
        if !run.is_empty() {
            calls.push(run);
        }
    }
    calls
}

/// A played episode as the pipeline's sample: the transcript's ids after the prompt, its loss
/// mask, log-probs and versions, the final answer as the text the reward reads.
pub(crate) fn episode_sample(record: EpisodeRecord, env: &dyn stoke_env::Environment) -> Sample {
    let env_reward = record.env_reward();
    let transcript = record.transcript;
    Sample {
        completion_ids: transcript.completion_ids(),
        rollout_logprobs: transcript.logprobs(),
        token_versions: transcript
            .versions()
            .into_iter()
            .map(PolicyVersion)
            .collect(),
        loss_mask: Some(transcript.loss_mask()),
        text: transcript.final_text().to_string(),
        finish: record.finish,
        episode: Some(Box::new(EpisodeSummary {
            model_turns: transcript.model_turns(),
            tool_seconds: record.tool_calls.iter().map(|call| call.seconds).sum(),
            tool_calls: record.tool_calls,
            stop: record.stop,
            env_reward,
            outcome_reward: record.outcome_reward,
            requires_tool: env.requires_tool(),
            grades_outcome: env.grades_outcome(),
            env_seconds: record.env_seconds,
            transcript,
        })),
    }
}

fn to_sample(completion: Completion, versions: Vec<u64>) -> Sample {
    Sample {
        completion_ids: completion.token_ids,
        rollout_logprobs: completion.logprobs,
        token_versions: versions.into_iter().map(PolicyVersion).collect(),
        loss_mask: None,
        episode: None,
        text: completion.text.unwrap_or_default(),
        finish: completion.finish_reason,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::records::Task;
    use crate::staleness::GenerationPermit;
    use stoke_reward::Reference;

    fn ticket(group_id: u64, temperature: f32) -> GroupTicket {
        GroupTicket {
            group_id,
            task: Arc::new(Task {
                id: format!("t{group_id}"),
                prompt: String::new(),
                prompt_ids: vec![1],
                reference: Reference::default(),
                reward: 0,
                data: Default::default(),
            }),
            permit: GenerationPermit {
                policy_version: PolicyVersion(0),
                update_slot: 0,
                permit_index: group_id,
            },
            temperature,
        }
    }

    #[test]
    fn calls_split_by_temperature_then_by_consecutive_group_ids() {
        let tickets = vec![
            ticket(4, 1.0),
            ticket(2, 1.0),
            ticket(3, 1.0),
            ticket(10, 0.5),
            ticket(6, 1.0),
            ticket(11, 0.5),
        ];
        let calls = engine_calls(&tickets, &[0, 1, 2, 3, 4, 5]);
        // Temperature 1.0 first (first seen): ids 2, 3, 4 are one run, 6 another; then 0.5.
        assert_eq!(calls, vec![vec![1, 2, 0], vec![4], vec![3, 5]]);
        // Rejected tickets are left out and can split a run.
        let calls = engine_calls(&tickets, &[0, 1, 3, 5]);
        assert_eq!(calls, vec![vec![1], vec![0], vec![3, 5]]);
    }
}
