//! stoke-sandbox (see crates/README.md).
