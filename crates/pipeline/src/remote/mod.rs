//! The RL modules on other machines, over HTTP: rollout on OpenAI-compatible inference servers
//! ([`rollout`]: `stoke serve` or vLLM, with weight publication to them) and rewards on
//! `stoke reward-server`s ([`reward`]). Both go through one [`servers::ServerPool`]: routing,
//! per-server in-flight limits, retries on another server, per-server counters. They implement
//! the boundary traits of [`crate::service`], so the drivers do not know where a module runs.

pub mod reward;
pub mod rollout;
pub mod servers;

pub use reward::{RemoteRewards, RewardServerConfig, RunningRewardServer};
pub use rollout::{Engine, RemotePublisher, RemoteRollout, RemoteRolloutSettings};
pub use servers::{PoolSettings, Routing, ServerPool};
