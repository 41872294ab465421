//! Records shared between stoke's stages: token ids and the typed values that cross crate
//! boundaries. This crate holds data definitions only: no I/O, no tensors, no behaviour beyond
//! small constructors, so every other crate can depend on it.

/// A token id in a tokenizer's vocabulary.
pub type TokenId = u32;

pub mod precision;
pub mod reward;

pub use precision::Precision;
pub use reward::RewardOutcomeKind;
