//! GGUF, llama.cpp's model file format: reading (metadata, tensor directory, dequantization of
//! F32/F16/BF16, Q8_0, Q4_0/Q4_1/Q5_0/Q5_1 and the Q4_K/Q5_K/Q6_K k-quants), writing (F32, F16,
//! BF16, Q8_0), and the translation to and from the Hugging Face layout that `stoke-model` and
//! `stoke-tokenizer` load (`hf`).
//!
//! A format crate with no stoke dependencies, so the tokenizer crate (which builds
//! `tokenizer.json` from GGUF metadata) and the model crate (which loads its weights) can share it.

pub mod error;
pub mod hf;
pub mod quant;
pub mod read;
pub mod write;

pub use error::GgufError;
pub use quant::GgmlType;
pub use read::{GgufFile, TensorInfo, Value, is_gguf};
pub use write::{TensorSpec, write_gguf};
