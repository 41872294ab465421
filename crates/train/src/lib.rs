//! stoke-train: one trainer loop for every objective. The loop owns gradient accumulation,
//! clipping, schedules, loss-spike and NaN handling, evaluation, checkpoints/resume and monitoring;
//! an objective turns a batch into a loss and metrics.

pub mod checkpoint;
pub mod config;
pub mod error;
pub mod eval;
pub mod grpo;
pub mod metrics;
pub mod monitor;
pub mod objective;
pub mod report;
pub mod run;
pub mod source;
pub mod spike;
pub mod trainer;
