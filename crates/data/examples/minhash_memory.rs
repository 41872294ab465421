//! Memory of global MinHash clustering: observes N documents' band keys (14 bands, distinct
//! keys, one document in ten a near duplicate of an earlier one) and finishes the clusters.
//! Measure the process's peak memory at N and at 0 (the difference is the clustering state):
//!
//!     cargo run --release -p stoke-data --example minhash_memory -- 1000000
//!
//! The documents themselves wait in the spool on disk, not in memory.

use stoke_data::funnel::minhash::MinHashFile;

fn main() {
    let n: u64 = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(1_000_000);
    let mut dedup = MinHashFile::default().validate().expect("defaults");
    let bands = dedup.hasher.bands() as u64;
    let mix = |x: u64| xxhash_rust::xxh3::xxh3_64(&x.to_le_bytes());
    let mut keys = vec![0u64; bands as usize];
    for doc in 0..n {
        // A near duplicate shares its first band with the document ten before it.
        let twin = doc % 10 == 9;
        for (band, key) in keys.iter_mut().enumerate() {
            let source = if twin && band == 0 { doc - 9 } else { doc };
            *key = mix(source * bands + band as u64);
        }
        dedup.observe(&keys);
    }
    dedup.finish_clusters();
    println!(
        "{n} documents, {} clusters with duplicates",
        dedup.clusters_with_duplicates
    );
}
