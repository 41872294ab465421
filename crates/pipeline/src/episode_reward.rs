//! The reward of a multi-turn sample: the run's configured reward on the final answer plus the
//! environment's own reward, or a recorded failure when the environment failed.
//!
//! What it is: [`EpisodeRewards`], a [`RewardService`] wrapped around the run's (local pool or
//! remote servers), so every path that scores samples (training, held-out evaluation) scores
//! episodes the same way. For each sample with an episode:
//! - the environment failed (`StopReason::EnvFailed`): the reward is
//!   `SampleReward::failed(RewardFailure::Environment(message))`, score 0, the failure is
//!   counted and reported like a verifier's, and the sample's loss mask is cleared: the model is
//!   not pushed away from turns that an environment's crash cut short (its 0 still enters the
//!   group's reward statistics);
//! - otherwise the environment's reward (per-turn rewards plus its outcome on the final state) is
//!   added to the score, and listed as the `environment` component when it is not 0;
//! - when the environment grades its outcome (`Environment::grades_outcome`, code repair), the
//!   sample's verdict is the environment's: `Correct` when the outcome reward is 1 (the task
//!   solved), else `Wrong`, whatever the configured reward made of the final answer.
//!
//! Samples without an episode pass through unchanged. What it is not: the verifiers (the inner
//! service) or the environment (whose rewards the episode runner recorded).

use stoke_env::StopReason;
use stoke_reward::Outcome;

use crate::error::PipelineError;
use crate::records::{RewardFailure, RolloutGroup, SampleReward, ScoredGroup};
use crate::reward::RewardPoolStats;
use crate::service::{RemoteStats, RewardService};

/// The run's reward service, with episodes' environment rewards and failures applied.
pub struct EpisodeRewards {
    inner: Box<dyn RewardService>,
}

impl EpisodeRewards {
    pub fn new(inner: Box<dyn RewardService>) -> EpisodeRewards {
        EpisodeRewards { inner }
    }
}

impl RewardService for EpisodeRewards {
    fn score(&self, group: RolloutGroup) -> Result<ScoredGroup, PipelineError> {
        let mut scored = self.inner.score(group)?;
        for (sample, reward) in scored.rollout.samples.iter_mut().zip(&mut scored.rewards) {
            let Some(episode) = &sample.episode else {
                continue;
            };
            if let StopReason::EnvFailed { message } = &episode.stop {
                *reward = SampleReward::failed(RewardFailure::Environment(message.clone()));
                sample.loss_mask = Some(vec![false; sample.completion_ids.len()]);
                continue;
            }
            if reward.failure.is_none()
                && episode.env_reward != 0.0
                && episode.env_reward.is_finite()
            {
                reward.score += episode.env_reward;
                reward
                    .components
                    .push(("environment".to_string(), episode.env_reward));
            }
            if reward.failure.is_none() && episode.grades_outcome {
                reward.outcome = if episode.outcome_reward >= 1.0 {
                    Outcome::Correct
                } else {
                    Outcome::Wrong
                };
            }
        }
        Ok(scored)
    }

    fn stats(&self) -> RewardPoolStats {
        self.inner.stats()
    }

    fn reward_name(&self, index: usize) -> Option<String> {
        self.inner.reward_name(index)
    }

    fn remote_stats(&self) -> Option<RemoteStats> {
        self.inner.remote_stats()
    }
}
