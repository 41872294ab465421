//! Translation between a GGUF file and the Hugging Face folder layout, the way transformers 5.24's
//! GGUF loader does it (`modeling_gguf_pytorch_utils.py`, `integrations/ggml.py`,
//! `integrations/gguf/gguf_tokenizer_mapping.py`), so a model loaded from GGUF by stoke is the
//! model transformers loads from the same file:
//!
//! - `config.json` from the `{arch}.*` keys (llama, qwen2, qwen3; the mixtures of experts
//!   qwen2moe, qwen3moe, olmoe, Mixtral as llama with `expert_count`, and DeepSeek-V3 as
//!   deepseek2, which transformers' GGUF loader does not read: there stoke follows llama.cpp's
//!   converter, see [`DEEPSEEK2`]);
//! - tensor names (`blk.N.attn_q.weight` <-> `model.layers.N.self_attn.q_proj.weight`), and for
//!   llama the inverse of llama.cpp's q/k row permutation (its RoPE pairs adjacent values where
//!   transformers pairs the two halves of a head);
//! - `tokenizer.json` and `tokenizer_config.json` from the `tokenizer.*` keys: byte-level BPE
//!   (`tokenizer.ggml.model = "gpt2"`) with the pre-tokenizer split its `tokenizer.ggml.pre`
//!   names, control tokens as special added tokens, the chat template and the special tokens.
//!
//! - llama.cpp's stacked expert tensors (`ffn_{gate,up,down}_exps`, [experts, out, in]), which
//!   the model loader splits per expert and the exporter stacks again ([`EXPERT_TENSORS`]).
//!
//! And back, for `stoke export --gguf`: the metadata llama.cpp reads for those architectures,
//! the vocabulary and merges from `tokenizer.json`, and the forward permutation.
//!
//! One file per translation, each both ways: `names` (tensor names and the value reorderings),
//! `config` (`config.json`), `tokenizer` (`tokenizer.json`). They depend one way only,
//! `names` -> `config` -> `tokenizer` (an export's metadata carries the tokenizer's keys), and
//! everything is re-exported here, so callers name `stoke_gguf::hf::X`.

mod config;
mod names;
mod tokenizer;

pub use config::{
    ARCHITECTURES, DEEPSEEK2, MOE_ARCHITECTURES, ROPE_FREQS, architecture, gguf_architecture,
    gguf_metadata, hf_config,
};
pub use names::{
    EXPERT_TENSORS, KvB, MLA_K_B, MLA_V_B, expert_tensor, gguf_tensor_name, hf_tensor_name,
    permute_rotary_rows, permute_rows, permuted_heads,
};
pub use tokenizer::{PRE_TOKENIZER_KEY, tokenizer_files, tokenizer_metadata};
