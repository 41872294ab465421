//! stoke-model: the decoder-only transformer family (Hugging Face Llama, Qwen2, Qwen3, Gemma 2,
//! Gemma 3 text, SmolLM3, and the mixtures of experts Mixtral, Qwen2-MoE, Qwen3-MoE and OLMoE)
//! with trainable candle `Var` parameters.
//!
//! Layout of the crate (one noun per file):
//! - `config`: HF config.json (4.x and 5.x styles) -> validated `ModelConfig`; `Architecture`
//!   is the single place where the families differ (`config/`: architecture, model_config, rope,
//!   hf_json, validate).
//! - `rotary`: RoPE inverse frequencies (default, linear, llama3, yarn) and cos/sin tables,
//!   reproducing transformers' `modeling_rope_utils`.
//! - `hf_names`: the Hugging Face tensor names and shapes of a config (`parameter_shapes`).
//! - `transformer`: the model and its forward pass, built on stoke-ops' differentiable ops
//!   (`transformer/`: model, forward, layer, attention, mla, mlp, moe_block, init, ...).
//! - `moe`: what MoE layers routed, per-expert load, HF's load-balancing loss, the bias rules.
//! - `qk_clip`: MuonClip's per-head query/key rescaling from the step's max attention logits.
//! - `lora`: LoRA's configuration in PEFT's layout (`LoraConfig`); the adapters themselves (add,
//!   save/load, merge, the base without them) are `transformer/lora.rs`.
//! - `kv_cache`: the explicit cache for generation (the model holds no mutable state).
//! - `decode`: the fused decode step (`Transformer::decode_step`) on a preallocated cache.
//! - `mask`: additive attention biases (causal with padding, block-diagonal for packing).
//! - `activation_checkpoint`: per-block recomputation in the backward pass (memory for time).
//! - `gguf`: GGUF model files: load (dequantized to f32) and export (F32/F16/BF16/Q8_0).
//! - `checkpoint`: safetensors load (single/sharded, f32/bf16/f16) and atomic HF-layout save.
//! - `error`: `ModelError`, naming the file and field/tensor for every bad-input case.
//!
//! Numerics: parameters in f32 on CPU; RMSNorm, softmax and RoPE follow transformers' eager
//! implementation: fixture logits match transformers within 5e-6 (max abs). Call `stoke_ops::numerics::init_compute_threads()`
//! once before using a model (FTZ/DAZ on every compute thread).
//!
//! Performance (examples/train_step_bench.rs; hidden 256, 4 layers, batch 4 x 256 tokens,
//! vocab 8192, one thread): about 510 ms CPU per forward+backward step against about 400 ms
//! for PyTorch 2.15 eager (transformers LlamaForCausalLM) on the same machine. gemm is ~43%
//! of the time. Known hot spots: candle's backward allocates a zero tensor per node and adds
//! into it (memset ~4%); weight gradients arrive transposed (`x @ W^T`) and are accumulated
//! with a strided add; RoPE and the attention-bias add are broadcast binary ops (~15% in
//! `binary_map_vec_par`); the KV cache concatenates per step; q/k/v and gate/up projections
//! are separate matmuls. Softmax, RMSNorm and the target log-probabilities are already fused
//! kernels with closed-form backward (stoke-ops `kernels`).
//!

pub mod activation_checkpoint;
pub mod checkpoint;
pub mod config;
pub mod decode;
pub mod error;
pub mod gguf;
pub mod hf_names;
pub mod kv_cache;
pub mod lora;
pub mod mask;
pub mod moe;
pub mod qk_clip;
pub mod rotary;
pub mod transformer;

pub use config::{Architecture, ModelConfig, Rope, RopeScaling};
pub use error::ModelError;
pub use kv_cache::KvCache;
pub use mask::{causal_bias, document_causal_bias};
pub use stoke_ops::decode::DecodeCache;
pub use transformer::{ForwardRecord, InitScheme, Record, Transformer, parameter_shapes};
