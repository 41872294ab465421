//! The data funnel (extraction, language id, filters, PII redaction, dedup, mixtures) and the
//! token data every trainer reads (shards, loader, packing). No tensor dependency.

pub mod funnel;
pub mod loader;
pub mod packing;
pub mod shard;
