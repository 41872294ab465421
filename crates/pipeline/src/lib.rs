//! stoke-pipeline: the runtime of the four-module reinforcement-learning pipeline (rollout,
//! inference, reward, trainer). So far it holds the two pieces every module boundary needs:
//! [`staleness`] (policy versions and the gate that bounds how off-policy a trained sample may be)
//! and [`buffer`] (the bounded, byte-sized, priority-ordered queue with back-pressure that joins
//! two modules).
//!
//! What it is not (yet): the modules themselves, the scheduler that shares CPU threads between
//! generation and training, and weight publication; those build on these two types.

pub mod buffer;
pub mod error;
pub mod records;
pub mod settings;
pub mod staleness;

pub use buffer::{
    BufferCapacity, BufferError, BufferStats, Prioritized, RecordBuffer, SendError, SizeInBytes,
};
pub use error::PipelineError;
pub use records::{
    GroupTicket, RewardFailure, RolloutGroup, Sample, SampleReward, ScoredGroup, Task,
};
pub use settings::{
    EvalSettings, GrpoSettings, KlPlacement, OldLogprobs, PipelineMode, PtxSettings,
    TemperatureSchedule, WeightSync,
};
pub use staleness::{
    GateClosed, GenerationPermit, PolicyVersion, PublishError, StalenessBound, StalenessGate,
};
