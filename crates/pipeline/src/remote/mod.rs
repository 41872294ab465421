//! The RL modules on other machines, over HTTP: rollout on OpenAI-compatible inference servers
//! ([`rollout`]: `stoke serve` or vLLM, with weight publication to them; [`endpoint`]: one such
//! server playing episodes, without), rewards on
//! `stoke reward-server`s ([`reward`]) and reference / teacher log-probs on inference servers
//! of the frozen model ([`reference`]). Both go through one [`servers::ServerPool`]: routing,
//! per-server in-flight limits, retries on another server, per-server counters. They implement
//! the boundary traits of [`crate::service`], so the drivers do not know where a module runs.
//! Their settings (`PoolSettings`, `RemoteRolloutSettings`, ...) are plain records in
//! `settings.rs`, re-exported here.

pub mod endpoint;
pub mod reference;
pub mod reward;
pub mod rollout;
pub mod servers;

pub use crate::settings::{
    Engine, PoolSettings, RemoteReferenceSettings, RemoteRolloutSettings, Routing,
};
pub use endpoint::Endpoint;
pub use reference::RemoteReference;
pub use reward::{RemoteRewards, RewardServerConfig, RunningRewardServer};
pub use rollout::{RemotePublisher, RemoteRollout};
pub use servers::ServerPool;
