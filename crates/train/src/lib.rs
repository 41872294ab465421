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
pub mod preference;
pub mod prm;
pub mod report;
pub mod run;
pub mod run_folder;
pub mod run_info;
pub mod source;
pub mod spike;
pub mod step;
pub mod trainer;

/// The target log-probabilities of `hidden` through the LM head `head`, the way `model` is set
/// to compute them: in its precision, and in chunks of positions with the logits recomputed in
/// the backward pass when it checkpoints activations (no `[tokens, vocab]` tensor held).
pub fn lm_head_logprobs(
    model: &stoke_model::Transformer,
    hidden: &candle_core::Tensor,
    head: &candle_core::Tensor,
    targets: &candle_core::Tensor,
) -> Result<candle_core::Tensor, error::TrainError> {
    let precision = model.precision();
    Ok(if model.activation_checkpointing() {
        stoke_ops::linear_target_logprobs_chunked(hidden, head, targets, precision)?
    } else {
        stoke_ops::linear_target_logprobs_with(hidden, head, targets, precision)?
    })
}
