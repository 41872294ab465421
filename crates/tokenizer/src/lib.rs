//! Tokenizers for stoke: Hugging Face `tokenizer.json` loading (via the `tokenizers` crate),
//! chat templates from `tokenizer_config.json` rendered with `minijinja`, byte-level BPE training,
//! tokenizer quality metrics, and tool calls parsed out of generated text (`tool_calls`). Knows
//! nothing of tensors or models.

pub mod chat;
pub mod error;
pub mod hf;
pub mod metrics;
pub mod tool_calls;
pub mod train;
