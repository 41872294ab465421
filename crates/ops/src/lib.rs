//! stoke-ops: differentiable tensor operations for the transformer, and the CPU numerics setup.
//!
//! Every operation here is a composition of candle operations that have a backward rule
//! (checked against candle-core 0.11.1 `backprop.rs`: binary ops and their broadcast forms,
//! `exp`, `log`, `sqrt`, `sqr`, `recip`, `silu`, `neg`, `affine`, `matmul`, `narrow`, `cat`,
//! `reshape`/`transpose`, `sum`, `max` (detached here), `index_select`, `gather`, `to_dtype`).
//! candle's own fused `softmax_last_dim`, `rms_norm`, `layer_norm`, rotary and sdpa kernels
//! build their outputs without a backward and silently cut the graph, so they are not used.
//! Where the compositions were the bottleneck, `kernels` holds fused CPU kernels with
//! hand-written backward (candle `CustomOp1` with `bwd`): the softmax inside `attention` and
//! the target log-probabilities inside `token_logprobs`/`cross_entropy`. The composed
//! `softmax`/`log_softmax` remain for any dimension and as the reference in tests.
//! candle's backward zero-fills and adds a gradient for every graph node, so two ops keep the
//! largest activations out of the graph altogether: `fused_attention` (what `attention` runs on
//! the CPU) and `lm_head::linear_target_logprobs` (LM head + target log-probabilities; the
//! training objective should use it instead of `forward` + `token_logprobs`). See
//! bench/README.md, "Training (issue 5)". Where the loss is the plain sum of the
//! log-probabilities, `lm_head::linear_target_logprob_sum` is that op with its bf16 gradients
//! formed in the forward pass (no logits recomputed in the backward).
//!
//! `dispatch` is the one CPU dispatch point: it detects the CPU's instruction sets, reads the
//! `STOKE_*` kernel variables (its `VARS` table, `docs/src/kernels.md`) and makes every kernel
//! choice; `dispatch::chosen()` describes them for a run's metadata.
//!
//! `block` is a whole decoder layer's forward and hand-written backward on slices (what
//! `stoke-model` trains with: one graph node per layer, no per-op gradient buffers), and `gemm`
//! the products it and the bf16 linear layers take, under the precision policy.
//!
//! Dtypes: operations keep the input dtype (f32 in training, f64 in gradient checks);
//! `rms_norm` computes in f32 when given f16/bf16, as transformers does.
//!
//! Precision (`stoke_types::Precision`): `linear` and `linear_target_logprobs_with` take it.
//! In `Bf16` their products (forward and backward) run through `gemm::product` (bf16-rounded
//! inputs, f32 accumulation, f32 results; AMX or AVX512-BF16 where those outrun f32 FMA, else
//! the f32 kernel on the rounded values; chosen at run time) on f32 tensors;
//! everything else stays f32. `vexp` is the vectorized f32 `exp` of the softmax and SwiGLU
//! kernels.

pub mod activation;
pub mod allocator;
pub mod attention;
pub(crate) mod attention_rows;
pub mod bandwidth;
pub mod bf16;
pub mod block;
pub mod cpu;
pub mod decode;
pub mod dispatch;
pub mod distill;
pub mod fused_attention;
pub mod gemm;
pub mod gradcheck;
pub mod kernels;
pub mod linear;
pub mod lm_head;
pub mod logistic;
pub mod loss;
pub mod masked_softmax;
pub mod matvec;
pub mod norm;
pub mod numerics;
pub mod pages;
pub mod quant;
pub mod rope;
pub mod softmax;
mod step_threads;
pub mod vexp;

pub use activation::swiglu;
/// Query rows the CPU attention kernels take per block: a sequence packed into a longer row at
/// an offset that is a multiple of this is processed in the same blocks, so with the same
/// values in the same order, as on a row of its own.
pub const ATTENTION_ROW_BLOCK: usize = attention_rows::QB;
pub use attention::{attention, attention_with};
pub use linear::linear;
pub use lm_head::{
    linear_target_logprob_sum, linear_target_logprobs, linear_target_logprobs_chunked,
    linear_target_logprobs_with,
};
pub use loss::{cross_entropy, token_logprobs};
pub use norm::rms_norm;
pub use rope::apply_rope;
pub use softmax::{log_softmax, softmax};
pub use stoke_types::Precision;
