//! The narrow traits at the pipeline's module boundaries. The drivers (`driver.rs`), the learner
//! and the held-out evaluation see only these, so a module can move to another machine without
//! a change to the algorithm code:
//!
//! | boundary | trait | in-process | remote (`remote/`) |
//! |---|---|---|---|
//! | tickets -> sampled groups | [`RolloutService`] | [`RolloutModule`] (the engine) | `RemoteRollout`: N OpenAI-compatible servers (`stoke serve`, vLLM) |
//! | group -> rewards | [`RewardService`] | [`RewardPool`] (threads, sandbox) | `RemoteRewards`: N `stoke reward-server`s |
//! | groups -> reference log-probs | [`ReferenceScoring`] | [`InferenceModule`] | (not yet) |
//!
//! What they are not: the staleness gate, the buffers or the weight store, which stay in the
//! trainer's process and are shared by every implementation.
//!
//! Contracts (every implementation):
//! - `generate`: one group per ticket, in ticket order, with the invariants of
//!   [`RolloutGroup`] (equal lengths of ids, log-probs and token versions; versions
//!   non-decreasing and at or above the ticket's permit version). An error stops the run; a
//!   remote implementation errors only when no server can take the work.
//! - `score`: one reward per sample, in sample order, every score finite. Per-sample verifier
//!   failures are rewards with a failure, not errors; an error means the reward module itself
//!   is gone (every remote reward server failed), and stops the run.

use stoke_model::Transformer;

use crate::error::PipelineError;
use crate::inference::InferenceModule;
use crate::records::{GroupTicket, RolloutGroup, ScoredGroup};
use crate::reward::{RewardPool, RewardPoolStats};
use crate::rollout::{RolloutModule, RolloutStats};

/// Per-server counters of a remote module (rollout or reward), for metrics and alerts.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ServerStats {
    pub url: String,
    /// Whether the server is in rotation (a failed server is taken out until it answers again).
    pub alive: bool,
    /// Requests answered.
    pub requests: u64,
    /// Requests that failed on this server (error status, timeout, refused connection, an answer
    /// that broke the API's promises); each was retried elsewhere.
    pub failures: u64,
    /// Requests in flight right now.
    pub in_flight: usize,
    /// Samples returned (rollout) or scored (reward).
    pub samples: u64,
    /// Tokens generated (rollout only).
    pub tokens: u64,
    /// Seconds with at least one request of ours in flight on this server.
    pub busy_seconds: f64,
    /// The newest failure, in words.
    pub last_error: Option<String>,
}

/// What a remote module adds to the run's metrics: the servers, and the retries it made.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct RemoteStats {
    pub servers: Vec<ServerStats>,
    /// Requests sent again to another server after a failure.
    pub retries: u64,
    /// Seconds since the module started (the denominator of each server's utilization).
    pub seconds: f64,
}

/// Tickets in, sampled groups out.
pub trait RolloutService: Send + Sync {
    /// `group_size` samples for every ticket (see the module doc for the contract).
    fn generate(&self, tickets: Vec<GroupTicket>) -> Result<Vec<RolloutGroup>, PipelineError>;
    /// Counters over the module's life.
    fn stats(&self) -> RolloutStats;
    /// Per-server counters when the module is remote.
    fn remote_stats(&self) -> Option<RemoteStats> {
        None
    }
}

/// A sampled group in, the group with one reward per sample out.
pub trait RewardService: Send + Sync {
    fn score(&self, group: RolloutGroup) -> Result<ScoredGroup, PipelineError>;
    /// Counters since the module started (samples scored, verifier panics and timeouts).
    fn stats(&self) -> RewardPoolStats;
    /// The name of reward `index` (what `Task::reward` indexes), for logs.
    fn reward_name(&self, index: usize) -> Option<String>;
    /// Per-server counters when the module is remote.
    fn remote_stats(&self) -> Option<RemoteStats> {
        None
    }
}

/// Log-probs of sampled completions under the reference policy (the KL term), and the reset of
/// that reference to the current policy.
pub trait ReferenceScoring: Send {
    /// Whether reference log-probs are computed at all (beta > 0).
    fn has_reference(&self) -> bool;
    /// Fills `ref_logprobs` of every group, or returns an error and changes none.
    fn add_reference_logprobs(&self, groups: &mut [ScoredGroup]) -> Result<(), PipelineError>;
    /// Makes the reference a copy of `policy` (reference reset every N updates).
    fn reset_reference(&mut self, policy: &Transformer) -> Result<(), PipelineError>;
}

impl RolloutService for RolloutModule {
    fn generate(&self, tickets: Vec<GroupTicket>) -> Result<Vec<RolloutGroup>, PipelineError> {
        RolloutModule::generate(self, tickets)
    }

    fn stats(&self) -> RolloutStats {
        RolloutModule::stats(self)
    }
}

impl RewardService for RewardPool {
    fn score(&self, group: RolloutGroup) -> Result<ScoredGroup, PipelineError> {
        Ok(RewardPool::score(self, group))
    }

    fn stats(&self) -> RewardPoolStats {
        RewardPool::stats(self)
    }

    fn reward_name(&self, index: usize) -> Option<String> {
        self.specs().get(index).map(|spec| spec.name.clone())
    }
}

impl ReferenceScoring for InferenceModule {
    fn has_reference(&self) -> bool {
        InferenceModule::has_reference(self)
    }

    fn add_reference_logprobs(&self, groups: &mut [ScoredGroup]) -> Result<(), PipelineError> {
        InferenceModule::add_reference_logprobs(self, groups)
    }

    fn reset_reference(&mut self, policy: &Transformer) -> Result<(), PipelineError> {
        InferenceModule::reset_reference(self, policy)
    }
}
