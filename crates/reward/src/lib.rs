//! stoke-reward (see crates/README.md).
