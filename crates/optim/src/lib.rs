//! stoke-optim: optimizers (AdamW, Muon), learning-rate and batch-size schedules, gradient
//! clipping. Works on named parameters (`candle_core::Var`) and their gradients only; it knows no
//! model, no data and no files beyond its own state format.
//!
//! Map: `param` (which rule a parameter gets), `adamw` and `muon` (the update rules and their
//! configs), `quantized` (8-bit AdamW moments), `config` (`OptimizerConfig`: which optimizer, with
//! its settings), `optimizer` (the object the trainer holds), `clip`, `schedule`, `state` (the
//! state file format), `inplace` (fused f32 loops over candle storage), `error`.

mod adamw;
mod clip;
mod config;
mod error;
mod inplace;
mod muon;
mod optimizer;
mod param;
mod quantized;
mod schedule;
mod state;

pub use adamw::{AdamWConfig, MomentFormat};
pub use clip::{clip_grad_norm, clip_to_norm, global_grad_norm};
pub use config::OptimizerConfig;
pub use error::OptimError;
pub use muon::{MuonConfig, NS_COEFFICIENTS, newton_schulz5};
pub use optimizer::Optimizer;
pub use param::{ParamKind, classify};
pub use schedule::{BatchSizeWarmup, DecayShape, LrSchedule, sqrt_batch_lr};
