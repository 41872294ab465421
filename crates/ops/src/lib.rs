//! stoke-ops (see crates/README.md).
