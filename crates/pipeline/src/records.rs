//! The typed records that travel between the four modules of the RL pipeline:
//!
//! ```text
//! Task --(gate permit)--> GroupTicket --[rollout]--> RolloutGroup --[reward]--> ScoredGroup
//!      --[inference: ref / recomputed log-probs]--> ScoredGroup --[trainer]--> new weights
//! ```
//!
//! What they are: plain data, one record per GRPO group (one prompt and its `n` samples), since
//! the group is the unit every module works on (advantages are relative within a group; a group
//! reward such as `group_length` needs all samples). What they are not: tensors (the trainer turns
//! a batch of groups into tensors) or strings keyed by name.
//!
//! Invariants:
//! - In a [`Sample`], `completion_ids`, `rollout_logprobs` and `token_versions` have one entry
//!   per generated token (the final stop token included, as the engine reports it).
//! - `token_versions` is non-decreasing; its first entry is the version the sample started with,
//!   which is at least the ticket's `permit.policy_version`.
//! - `loss_mask` is `None` when the model sampled every completion token (single turn), else it
//!   has one entry per completion token, `true` where the model sampled it. An environment token
//!   (`false`: a tool result or a rendered turn appended as ids in a multi-turn episode) has
//!   `rollout_logprobs[t] == 0.0` and repeats the version of the previous model token in
//!   `token_versions` (the sample's starting version before the first model token), so the
//!   versions stay non-decreasing. The trainer trains only on the model's tokens.
//! - In a [`ScoredGroup`], `rewards` has one entry per sample, in sample order; `ref_logprobs`
//!   and `old_logprobs`, when present, have one vector per sample of the sample's length.

use std::collections::BTreeMap;
use std::sync::Arc;

use stoke_reward::{Outcome, Reference};
use stoke_rollout::FinishReason;

use crate::buffer::{Prioritized, SizeInBytes};
use crate::staleness::{GenerationPermit, PolicyVersion};

/// One prompt to train on, resolved: the text the verifier sees, the token ids the policy sees
/// (already rendered with the chat template when the task came as messages), the reference data
/// and which configured reward scores it.
#[derive(Clone, Debug, PartialEq)]
pub struct Task {
    /// Stable name for logs and reports: the JSONL `id`, else `FILE:LINE`, else a generated name.
    pub id: String,
    /// The prompt as the reward sees it (for chat tasks: the last user message).
    pub prompt: String,
    pub prompt_ids: Vec<u32>,
    pub reference: Reference,
    /// Index into the run's reward list (`GrpoRun::rewards`); 0 is the default reward.
    pub reward: usize,
    /// What a multi-turn run's environment reads besides the prompt and the reference
    /// (`EnvTask::data`: a code-repair task's repository and hidden tests); empty otherwise.
    pub data: BTreeMap<String, serde_json::Value>,
}

/// A granted generation: which task, under which sampling seed stream, for which update slot.
#[derive(Clone, Debug)]
pub struct GroupTicket {
    /// Global, gap-free group number, counted from 0 over the whole run in permit order. It is
    /// the engine's prompt number (`first_prompt_number`), so a group's samples depend only on
    /// (seed, group_id, weights) and not on batching.
    pub group_id: u64,
    pub task: Arc<Task>,
    pub permit: GenerationPermit,
    /// Sampling temperature of this group (the temperature schedule at its update slot); the
    /// trainer and the inference module score at the same temperature.
    pub temperature: f32,
}

/// One sampled completion of a group.
#[derive(Clone, Debug, PartialEq)]
pub struct Sample {
    pub completion_ids: Vec<u32>,
    /// Log-probabilities of `completion_ids` under the sampling distribution, from the engine.
    pub rollout_logprobs: Vec<f32>,
    /// The policy version whose weights produced each token (pipeline RL: weights may change
    /// between tokens when they are published in flight).
    pub token_versions: Vec<PolicyVersion>,
    /// Which completion tokens the model sampled (`true`) rather than the environment appended
    /// (`false`); `None`: all of them (single turn). When given, one entry per completion token;
    /// an environment token's `rollout_logprobs` entry is 0.0 and its `token_versions` entry
    /// repeats the previous model token's. Only the model's tokens are trained on.
    pub loss_mask: Option<Vec<bool>>,
    /// Decoded completion (stop string excluded), what the reward reads. For a multi-turn
    /// episode: the model's last turn (its final answer).
    pub text: String,
    pub finish: FinishReason,
    /// What the sample's episode did, for a multi-turn sample (`None`: single turn).
    pub episode: Option<Box<EpisodeSummary>>,
}

/// What a multi-turn sample's episode did: read by the reward step (the environment's own
/// reward, its failure), the reward-hacking monitors and the metrics.
#[derive(Clone, Debug, PartialEq)]
pub struct EpisodeSummary {
    pub model_turns: usize,
    pub tool_calls: Vec<stoke_env::environment::ToolCallRecord>,
    pub stop: stoke_env::StopReason,
    /// The environment's reward: its per-turn rewards plus its outcome on the final state.
    /// Added to the configured reward's score of the final answer.
    pub env_reward: f64,
    /// The environment's outcome reward on the final state (part of `env_reward`).
    pub outcome_reward: f64,
    /// Whether the environment requires a tool call to solve the task (for the monitor of
    /// episodes that score without one).
    pub requires_tool: bool,
    /// Whether the outcome reward is the task's grade (`Environment::grades_outcome`): the
    /// sample is correct when it is 1.
    pub grades_outcome: bool,
    /// Seconds inside the environment (tools included) and inside tool calls.
    pub env_seconds: f64,
    pub tool_seconds: f64,
    /// The whole episode: prompt, the model's and the environment's segments and messages (for
    /// traces, the report's examples and the re-render check).
    pub transcript: stoke_env::Transcript,
}

impl Sample {
    /// The oldest weights that sampled a token: the version of the first model token (the
    /// first entry without a loss mask); the first entry when no token is the model's;
    /// `fallback` for an empty sample.
    pub fn oldest_version(&self, fallback: PolicyVersion) -> PolicyVersion {
        let first_model_token = self.loss_mask.as_ref().and_then(|mask| {
            self.token_versions
                .iter()
                .zip(mask)
                .find(|(_, sampled)| **sampled)
                .map(|(version, _)| *version)
        });
        first_model_token
            .or_else(|| self.token_versions.first().copied())
            .unwrap_or(fallback)
    }

    /// Completion tokens the model sampled: the tokens the trainer trains on.
    pub fn model_tokens(&self) -> usize {
        self.loss_mask
            .as_ref()
            .map_or(self.completion_ids.len(), |mask| {
                mask.iter().filter(|&&sampled| sampled).count()
            })
    }

    /// Whether the sample hit `max_new_tokens` (or the context end) instead of stopping.
    pub fn truncated(&self) -> bool {
        matches!(self.finish, FinishReason::Length)
    }
}

/// The rollout module's output: `n` samples of one ticket.
#[derive(Clone, Debug)]
pub struct RolloutGroup {
    pub ticket: GroupTicket,
    pub samples: Vec<Sample>,
    /// Wall time of the generation call this group was part of, divided by the groups in it.
    pub generate_seconds: f64,
}

impl RolloutGroup {
    /// A group generated outside the training loop (held-out evaluation, rejection sampling):
    /// the engine's completions of `task`, untouched by the staleness gate, so the ticket's
    /// permit is a placeholder (version 0, slot 0, index `group_id`) and the samples carry no
    /// token versions.
    pub fn offline(
        group_id: u64,
        task: Arc<Task>,
        temperature: f32,
        completions: Vec<stoke_rollout::Completion>,
    ) -> RolloutGroup {
        let samples = completions
            .into_iter()
            .map(|c| Sample {
                token_versions: Vec::new(),
                loss_mask: None,
                episode: None,
                text: c.text.unwrap_or_default(),
                completion_ids: c.token_ids,
                rollout_logprobs: c.logprobs,
                finish: c.finish_reason,
            })
            .collect();
        RolloutGroup {
            ticket: GroupTicket {
                group_id,
                task,
                permit: GenerationPermit {
                    policy_version: PolicyVersion(0),
                    update_slot: 0,
                    permit_index: group_id,
                },
                temperature,
            },
            samples,
            generate_seconds: 0.0,
        }
    }
}

/// Why a sample's reward is not the verifier's verdict.
#[derive(Clone, Debug, PartialEq)]
pub enum RewardFailure {
    /// The verifier panicked; the message is kept.
    Panicked(String),
    /// The verifier did not answer within the pool's timeout.
    TimedOut,
    /// The sample's environment failed (an error, a panic, a hang); the message says which.
    /// The episode ended there; the run continues.
    Environment(String),
}

/// The reward module's verdict on one sample.
#[derive(Clone, Debug, PartialEq)]
pub struct SampleReward {
    /// The scalar reward the advantages use (0 when `failure` is set).
    pub score: f64,
    pub outcome: Outcome,
    /// Composite rewards: (component name, component score before weighting).
    pub components: Vec<(String, f64)>,
    pub failure: Option<RewardFailure>,
    /// LLM-judge rewards: what judging the sample cost (`stoke_reward::JudgeFigures`).
    pub judge: Option<stoke_reward::JudgeFigures>,
    /// Process rewards: each step's bytes in the completion text and its score (`None`: the
    /// reward scores no steps). Read by the learner's dense process advantages.
    pub steps: Option<Vec<stoke_reward::StepScore>>,
}

impl SampleReward {
    /// The zero reward recorded for a sample whose scoring failed.
    pub fn failed(failure: RewardFailure) -> SampleReward {
        let outcome = match failure {
            RewardFailure::TimedOut => Outcome::Timeout,
            RewardFailure::Panicked(_) | RewardFailure::Environment(_) => Outcome::SandboxError,
        };
        SampleReward {
            score: 0.0,
            outcome,
            components: Vec::new(),
            failure: Some(failure),
            judge: None,
            steps: None,
        }
    }

    pub fn correct(&self) -> bool {
        self.outcome == Outcome::Correct
    }
}

/// A group with rewards and, when the configuration needs them, extra log-probs.
#[derive(Clone, Debug)]
pub struct ScoredGroup {
    pub rollout: RolloutGroup,
    pub rewards: Vec<SampleReward>,
    pub reward_seconds: f64,
    /// Per sample, per token log-probs under the reference policy (present when beta > 0).
    pub ref_logprobs: Option<Vec<Vec<f32>>>,
    /// Per sample, per token log-probs recomputed by the inference module under the trainer's
    /// weights of version `old_version` (recompute mode only).
    pub old_logprobs: Option<Vec<Vec<f32>>>,
    pub old_version: Option<PolicyVersion>,
    pub inference_seconds: f64,
}

impl ScoredGroup {
    /// A group fresh from the reward module (no inference yet).
    pub fn new(rollout: RolloutGroup, rewards: Vec<SampleReward>, reward_seconds: f64) -> Self {
        ScoredGroup {
            rollout,
            rewards,
            reward_seconds,
            ref_logprobs: None,
            old_logprobs: None,
            old_version: None,
            inference_seconds: 0.0,
        }
    }

    pub fn update_slot(&self) -> u64 {
        self.rollout.ticket.permit.update_slot
    }
}

fn sample_bytes(sample: &Sample) -> u64 {
    (sample.completion_ids.len() * 4
        + sample.rollout_logprobs.len() * 4
        + sample.token_versions.len() * 8
        + sample.loss_mask.as_ref().map_or(0, Vec::len)
        + sample.episode.as_ref().map_or(0, |episode| {
            // The transcript repeats the ids (4 bytes), log-probs (4) and versions (8), plus
            // the prompt ids and about as much message text as ids.
            episode.transcript.prompt_ids.len() * 4 + sample.completion_ids.len() * 20
        })
        + sample.text.len()
        + std::mem::size_of::<Sample>()) as u64
}

fn task_bytes(task: &Task) -> u64 {
    // The task is shared (Arc) by all records of its group, but a buffer holding one group is
    // what keeps it alive, so it is counted once per record.
    (task.prompt.len() + task.prompt_ids.len() * 4 + task.id.len() + std::mem::size_of::<Task>())
        as u64
}

impl SizeInBytes for GroupTicket {
    fn size_in_bytes(&self) -> u64 {
        task_bytes(&self.task) + std::mem::size_of::<GroupTicket>() as u64
    }
}

impl Prioritized for GroupTicket {
    fn priority_key(&self) -> u64 {
        self.permit.update_slot
    }
}

impl SizeInBytes for RolloutGroup {
    fn size_in_bytes(&self) -> u64 {
        self.ticket.size_in_bytes() + self.samples.iter().map(sample_bytes).sum::<u64>()
    }
}

impl Prioritized for RolloutGroup {
    /// Oldest update slot first: the trainer waits for exactly those.
    fn priority_key(&self) -> u64 {
        self.ticket.permit.update_slot
    }
}

impl SizeInBytes for ScoredGroup {
    fn size_in_bytes(&self) -> u64 {
        let logprob_bytes = |lp: &Option<Vec<Vec<f32>>>| {
            lp.as_ref()
                .map_or(0, |rows| rows.iter().map(|r| r.len() as u64 * 4).sum())
        };
        let reward_bytes: u64 = self
            .rewards
            .iter()
            .map(|r| {
                std::mem::size_of::<SampleReward>() as u64
                    + r.components
                        .iter()
                        .map(|(name, _)| name.len() as u64 + 8)
                        .sum::<u64>()
            })
            .sum();
        self.rollout.size_in_bytes()
            + reward_bytes
            + logprob_bytes(&self.ref_logprobs)
            + logprob_bytes(&self.old_logprobs)
    }
}

impl Prioritized for ScoredGroup {
    fn priority_key(&self) -> u64 {
        self.update_slot()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ticket(slot: u64) -> GroupTicket {
        GroupTicket {
            group_id: slot,
            task: Arc::new(Task {
                id: "t".into(),
                prompt: "2+2?".into(),
                prompt_ids: vec![1, 2, 3],
                reference: Reference::default(),
                reward: 0,
                data: Default::default(),
            }),
            permit: GenerationPermit {
                policy_version: PolicyVersion(0),
                update_slot: slot,
                permit_index: slot,
            },
            temperature: 1.0,
        }
    }

    fn sample(len: usize) -> Sample {
        Sample {
            completion_ids: vec![7; len],
            rollout_logprobs: vec![-0.5; len],
            token_versions: vec![PolicyVersion(0); len],
            loss_mask: None,
            episode: None,
            text: "x".repeat(len),
            finish: FinishReason::Length,
        }
    }

    #[test]
    fn bytes_grow_with_completion_length() {
        let short = RolloutGroup {
            ticket: ticket(0),
            samples: vec![sample(2)],
            generate_seconds: 0.0,
        };
        let long = RolloutGroup {
            ticket: ticket(0),
            samples: vec![sample(200)],
            generate_seconds: 0.0,
        };
        // 4 (id) + 4 (log-prob) + 8 (version) + 1 (text byte) per token.
        assert_eq!(long.size_in_bytes(), short.size_in_bytes() + 198 * 17);
    }

    #[test]
    fn a_loss_mask_counts_one_byte_per_token() {
        let group = |loss_mask: Option<Vec<bool>>| RolloutGroup {
            ticket: ticket(0),
            samples: vec![Sample {
                loss_mask,
                ..sample(10)
            }],
            generate_seconds: 0.0,
        };
        let masked = group(Some(vec![true; 10])).size_in_bytes();
        assert_eq!(masked, group(None).size_in_bytes() + 10);
    }

    #[test]
    fn oldest_version_and_model_tokens_read_only_the_models_tokens() {
        // An environment token before the first model token carries the starting version 1;
        // the model's tokens were sampled by versions 2 and 3.
        let versions = [1, 2, 2, 2, 3].map(PolicyVersion).to_vec();
        let multi_turn = Sample {
            token_versions: versions,
            loss_mask: Some(vec![false, true, false, false, true]),
            ..sample(5)
        };
        assert_eq!(
            multi_turn.oldest_version(PolicyVersion(0)),
            PolicyVersion(2)
        );
        assert_eq!(multi_turn.model_tokens(), 2);
        let environment_only = Sample {
            loss_mask: Some(vec![false; 5]),
            ..multi_turn.clone()
        };
        assert_eq!(
            environment_only.oldest_version(PolicyVersion(0)),
            PolicyVersion(1)
        );
        assert_eq!(environment_only.model_tokens(), 0);
        let single_turn = Sample {
            loss_mask: None,
            episode: None,
            ..multi_turn
        };
        assert_eq!(
            single_turn.oldest_version(PolicyVersion(0)),
            PolicyVersion(1)
        );
        assert_eq!(single_turn.model_tokens(), 5);
    }

    #[test]
    fn priority_is_the_update_slot() {
        let group = ScoredGroup::new(
            RolloutGroup {
                ticket: ticket(5),
                samples: vec![],
                generate_seconds: 0.0,
            },
            vec![],
            0.0,
        );
        assert_eq!(group.priority_key(), 5);
    }

    #[test]
    fn failed_reward_is_zero_and_names_the_failure() {
        let reward = SampleReward::failed(RewardFailure::TimedOut);
        assert_eq!(reward.score, 0.0);
        assert_eq!(reward.outcome, Outcome::Timeout);
        assert!(!reward.correct());
        let oldest = sample(0).oldest_version(PolicyVersion(3));
        assert_eq!(oldest, PolicyVersion(3));
    }
}
