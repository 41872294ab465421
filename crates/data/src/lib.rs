//! The data funnel (extraction, language id, filters, PII redaction, dedup, mixtures) and the
//! token data every trainer reads (shards, loader, packing, the epoch cursor every reader of
//! training items shares). No tensor dependency.

pub mod epoch;
pub mod funnel;
pub mod loader;
pub mod packing;
pub mod shard;
