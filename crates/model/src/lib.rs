//! stoke-model (see crates/README.md).
