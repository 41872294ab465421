//! Loader throughput: `cargo run --release -p stoke-data --example loader_throughput`. Writes
//! 20M tokens of lognormal-length documents to shards in a temporary folder, then times shard
//! writing and one epoch of batches (seq_len 2048, batch 8) for each packing policy.

use std::time::Instant;

use stoke_data::loader::{Loader, LoaderConfig};
use stoke_data::packing::PackingPolicy;
use stoke_data::shard::{ShardWriter, ShardWriterConfig, open_dir};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let dir = std::env::temp_dir().join(format!("stoke-loader-bench-{}", std::process::id()));
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: dir.clone(),
        prefix: "bench".into(),
        vocab_size: 50_257,
        max_tokens_per_shard: 5_000_000,
    })?;
    let mut state = 1u64;
    let mut uniform = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        ((state >> 11) as f64 + 0.5) / (1u64 << 53) as f64
    };
    let started = Instant::now();
    let (mut tokens, mut docs) = (0usize, 0usize);
    let mut doc = Vec::new();
    while tokens < 20_000_000 {
        let z = (-2.0 * uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * uniform()).cos();
        let len = ((600.0 * (1.0 * z).exp()) as usize).clamp(1, 50_000);
        doc.clear();
        doc.extend((0..len).map(|i| ((docs * 31 + i) % 50_257) as u32));
        writer.push_document(&doc)?;
        tokens += len;
        docs += 1;
    }
    let shards = writer.finish()?;
    let write_seconds = started.elapsed().as_secs_f64();
    println!(
        "wrote {tokens} tokens, {docs} documents, {} shards: {:.1} M tokens/s",
        shards.len(),
        tokens as f64 / 1e6 / write_seconds
    );
    for policy in [
        PackingPolicy::ConcatChunk,
        PackingPolicy::BestFitDecreasing { window_docs: 1024 },
        PackingPolicy::BestFitDecreasingSplit { window_docs: 1024 },
    ] {
        let mut config = LoaderConfig::new(2048, 8, 0);
        config.policy = policy;
        config.max_epochs = Some(1);
        let mut loader = Loader::new(open_dir(&dir)?, config)?;
        let started = Instant::now();
        let (mut batches, mut served) = (0usize, 0usize);
        while let Some(batch) = loader.next_batch()? {
            batches += 1;
            served += batch.tokens.len();
        }
        let seconds = started.elapsed().as_secs_f64();
        println!(
            "{policy:?}: {batches} batches, {:.1} M slots/s, efficiency {:.4}",
            served as f64 / 1e6 / seconds,
            loader.packing_stats().efficiency()
        );
    }
    std::fs::remove_dir_all(&dir)?;
    Ok(())
}
