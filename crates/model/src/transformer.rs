//! The decoder-only transformer (Llama / Qwen2 / Qwen3 / Gemma 2-3 / SmolLM3) with trainable
//! parameters. The families differ by config only (`ModelConfig`: activation, sandwich and (1 + w)
//! norms, embedding scale, attention scale and soft-caps, sliding-window and NoPE layers).
//!
//! What it is: embeddings -> N x [RMSNorm -> attention (GQA, RoPE, optional q/k/v/o biases,
//! optional per-head q/k RMSNorm) -> residual -> RMSNorm -> MLP (SwiGLU) -> residual] ->
//! RMSNorm -> LM head (tied to the embeddings or separate). Every parameter is a candle `Var`
//! named as in Hugging Face checkpoints; `parameters()` lists them sorted by name.
//! All computation goes through stoke-ops' differentiable compositions, so `loss.backward()`
//! reaches every parameter.
//!
//! What it is not: stateful. The KV cache is passed to `forward`; positions and the attention
//! bias come from the caller (so left padding, right padding and packed documents are all
//! expressed by the caller, see mask.rs). No dropout (HF's attention_dropout is 0 for these
//! models). Variants (MoE MLPs, other norms) extend `Mlp` / `Architecture` locally.
//!
//! Invariants: `parameter_shapes(config)` is the single list of tensor names and shapes used
//! by `init`, `load`, `save` and `num_parameters`; the parameter dtype is uniform (f32
//! normally; `to_dtype(F64)` exists for finite-difference checks).
//!
//! Layout (one noun per file; this file only declares them and re-exports the public names):
//! - `model`: `Transformer`, its parameters and the modules assembled over them; whole-model
//!   copies, freezing, switches, the MoE balancing bias and capacity.
//! - `forward`: the forward pass behind its entry points, `mtp_hidden`, the LM head.
//! - `classifier`: a reward model's `score` head in place of the LM head (per sequence or per
//!   token).
//! - `context`: what a forward pass shares across layers, and what a recorded pass returns.
//! - `layer`: a decoder layer and the multi-token prediction module around one.
//! - `attention`: grouped-query self-attention and the attention choice of a layer.
//! - `mla`: multi-head latent attention (DeepSeek-V2/V3).
//! - `mlp`: the feed-forward block, dense or `moe_block`, the mixture of experts.
//! - `linear`: a linear layer (bias, LoRA adapter, bf16 packed copy).
//! - `ops`: the family's RMSNorm weight convention and gated activation.
//! - `init`: random initialisation (`InitScheme`).
//! - `lora`: LoRA adapters on the linear layers (their config is `crate::lora`).
//! - `packing`: bf16 packed weights and the inference-only copy.
//! - `fused_block`: a decoder layer as one graph node with a hand-written backward.
//!
//! The tensor names and shapes (`parameter_shapes`, `EMBED_TOKENS`, ...) are
//! `crate::hf_names`'s, re-exported here. The submodules import each other without cycles:
//! `model` builds the modules; `init`, `packing`, `lora`, `forward` and `classifier` add methods to
//! `Transformer`.

mod attention;
mod classifier;
mod context;
mod forward;
mod fused_block;
mod init;
mod layer;
pub(crate) mod linear;
mod lora;
mod mla;
mod mlp;
mod model;
mod moe_block;
mod ops;
mod packing;

pub use crate::hf_names::{EMBED_TOKENS, FINAL_NORM, LM_HEAD, parameter_shapes};
pub use context::{ForwardRecord, LayerLogits, Record};
pub use init::InitScheme;
pub use model::Transformer;
