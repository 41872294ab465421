//! stoke-pipeline: the runtime of the four-module reinforcement-learning pipeline.
//!
//! ```text
//! tasks --gate--> [rollout] --RolloutGroup--> [reward] --ScoredGroup--> [inference] --> [trainer]
//!                     ^                                                                    |
//!                     +-------------------- published weights (WeightStore) --------------+
//! ```
//!
//! One file per noun:
//! - [`records`]: the typed records passed between modules; [`settings`]: validated run settings;
//!   [`config`]: the TOML file layer that produces them; [`task`]: tasks from JSONL.
//! - the modules: [`rollout`] (generation, weights taken between batches or in flight; multi-turn
//!   episodes with an environment through [`episode`], scored through [`episode_reward`]),
//!   [`inference`] (reference / recomputed old-policy log-probs, batched by token budget),
//!   [`reward`] (verifiers behind a pool that survives panics and hangs), and the trainer
//!   ([`learner`]: rewards -> advantages -> `stoke_train::grpo::update::PolicyUpdater` -> publish).
//! - the joints: [`buffer`] (bounded by records and bytes, priority pop), [`staleness`] (policy
//!   versions and the gate that bounds off-policy lag), [`weights`] (publication of new weights),
//!   [`scheduler`] (sharing CPU threads between modules by measured busy time).
//! - [`driver`] (the sync and async ways to run the modules, the task plan), [`run`] (one whole
//!   run: setup, resume, final model), [`held_out`] (pass@1 / pass@k evaluation), [`monitor`]
//!   (per-update side effects; what a person sees is stoke_train's shared `Monitor`), [`metrics`] and
//!   [`report`] (the records in `metrics.jsonl` and the charts of `report.html`).
//! - the boundaries: [`service`] (one narrow trait per module boundary: rollout, reward,
//!   reference scoring; the drivers see only these) and [`remote`] (their implementations over
//!   HTTP: rollout on `stoke serve` / vLLM servers with weight publication, rewards on
//!   `stoke reward-server`s, reference log-probs on servers of the frozen model).
//! - recipes on top: [`rejection`] (sample `k`, keep the verified-correct, write SFT chat JSONL),
//!   [`rlaif`] (critique and revise against principles with a judge model, write DPO pairs).

pub mod buffer;
pub mod config;
pub mod dense_process;
pub mod driver;
pub mod env_settings;
pub mod episode;
pub mod episode_reward;
pub mod error;
pub mod held_out;
pub mod inference;
pub mod learned_reward;
pub mod learner;
pub mod metrics;
pub mod monitor;
pub mod records;
pub mod rejection;
pub mod remote;
pub mod report;
pub mod reward;
pub mod rlaif;
pub mod rollout;
pub mod run;
pub mod scheduler;
pub mod service;
pub mod settings;
pub mod staleness;
pub mod task;
pub mod weights;

pub use buffer::{
    BufferCapacity, BufferError, BufferStats, Prioritized, RecordBuffer, SendError, SizeInBytes,
};
pub use error::PipelineError;
pub use records::{
    GroupTicket, RewardFailure, RolloutGroup, Sample, SampleReward, ScoredGroup, Task,
};
pub use settings::{
    EvalSettings, GrpoSettings, KlPlacement, Lag, OldLogprobs, PipelineMode, PtxSettings,
    TemperatureSchedule, WeightSync,
};
pub use staleness::{
    GateClosed, GenerationPermit, PolicyVersion, PublishError, StalenessBound, StalenessGate,
};
