//! stoke-rollout (see crates/README.md).
