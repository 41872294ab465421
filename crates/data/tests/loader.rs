//! Loader: reproducible order, exact resume from a stored cursor (also across epochs), epochs.

use stoke_data::loader::{DataParallel, Loader, LoaderConfig, LoaderCursor};
use stoke_data::packing::{PackedBatch, PackingPolicy};
use stoke_data::shard::{ShardWriter, ShardWriterConfig, open_dir};

fn write_shards(dir: &std::path::Path) -> usize {
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: dir.to_path_buf(),
        prefix: "t".into(),
        vocab_size: 50_000,
        max_tokens_per_shard: 4_000,
    })
    .unwrap();
    let mut state = 5u64;
    let mut total = 0;
    for doc in 0..300u32 {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        let len = 1 + (state >> 33) as usize % 120;
        let tokens: Vec<u32> = (0..len as u32).map(|i| (doc * 131 + i) % 50_000).collect();
        writer.push_document(&tokens).unwrap();
        total += len;
    }
    assert!(writer.finish().unwrap().len() > 3);
    total
}

fn config(policy: PackingPolicy, max_epochs: Option<u64>) -> LoaderConfig {
    LoaderConfig {
        seq_len: 64,
        batch_size: 4,
        policy,
        seed: 1234,
        shuffle: true,
        shuffle_buffer: 16,
        max_epochs,
        pad_token: 0,
        data_parallel: DataParallel::default(),
    }
}

fn run(loader: &mut Loader, n: usize) -> Vec<PackedBatch> {
    (0..n).map_while(|_| loader.next_batch().unwrap()).collect()
}

fn check_resume(policy: PackingPolicy, stop_after: usize) {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    let mut straight = Loader::new(open_dir(dir.path()).unwrap(), config(policy, None)).unwrap();
    let expected = run(&mut straight, stop_after + 40);

    let mut first = Loader::new(open_dir(dir.path()).unwrap(), config(policy, None)).unwrap();
    let head = run(&mut first, stop_after);
    // The cursor goes through JSON as a checkpoint would store it.
    let stored = serde_json::to_string(first.cursor()).unwrap();
    drop(first);
    let cursor: LoaderCursor = serde_json::from_str(&stored).unwrap();
    let mut resumed =
        Loader::resume(open_dir(dir.path()).unwrap(), config(policy, None), cursor).unwrap();
    let tail = run(&mut resumed, 40);
    assert_eq!(head, expected[..stop_after]);
    assert_eq!(tail, expected[stop_after..]);
}

#[test]
fn resume_continues_with_identical_batches_best_fit_split() {
    check_resume(
        PackingPolicy::BestFitDecreasingSplit { window_docs: 32 },
        17,
    );
}

#[test]
fn resume_continues_with_identical_batches_concat_chunk() {
    check_resume(PackingPolicy::ConcatChunk, 23);
}

#[test]
fn resume_across_an_epoch_boundary() {
    // ~18k tokens per epoch / (4 rows * 65) ~ 70 batches per epoch: stop near the boundary.
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    let policy = PackingPolicy::BestFitDecreasingSplit { window_docs: 32 };
    let mut probe = Loader::new(open_dir(dir.path()).unwrap(), config(policy, None)).unwrap();
    let mut boundary = 0;
    while probe.cursor().epoch == 0 {
        probe.next_batch().unwrap();
        boundary += 1;
    }
    for stop in [boundary - 1, boundary, boundary + 1] {
        check_resume(policy, stop);
    }
}

#[test]
fn one_epoch_serves_every_token_once() {
    let dir = tempfile::tempdir().unwrap();
    let total = write_shards(dir.path());
    let policy = PackingPolicy::BestFitDecreasingSplit { window_docs: 32 };
    let mut loader = Loader::new(open_dir(dir.path()).unwrap(), config(policy, Some(1))).unwrap();
    let batches = run(&mut loader, 10_000);
    let served: usize = batches.iter().flat_map(|b| &b.rows).map(|r| r.used()).sum();
    assert_eq!(served, total);
    assert!(loader.next_batch().unwrap().is_none());
}

#[test]
fn different_seeds_give_different_orders() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    let policy = PackingPolicy::ConcatChunk;
    let mut a = Loader::new(open_dir(dir.path()).unwrap(), config(policy, None)).unwrap();
    let mut other = config(policy, None);
    other.seed = 99;
    let mut b = Loader::new(open_dir(dir.path()).unwrap(), other).unwrap();
    assert_ne!(run(&mut a, 3), run(&mut b, 3));
}

#[test]
fn cursor_for_other_data_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    let policy = PackingPolicy::ConcatChunk;
    let loader = Loader::new(open_dir(dir.path()).unwrap(), config(policy, None)).unwrap();
    let mut cursor = loader.cursor().clone();
    cursor.data_fingerprint ^= 1;
    assert!(Loader::resume(open_dir(dir.path()).unwrap(), config(policy, None), cursor).is_err());
}

#[test]
fn ranks_read_disjoint_documents_that_cover_the_epoch() {
    let dir = tempfile::tempdir().unwrap();
    let total = write_shards(dir.path());
    let policy = PackingPolicy::BestFitDecreasingSplit { window_docs: 8 };
    let mut seen: Vec<(u64, u32, u32)> = Vec::new();
    let mut served_tokens = 0;
    for rank in 0..3 {
        let mut cfg = config(policy, Some(1));
        cfg.data_parallel = DataParallel {
            rank,
            world_size: 3,
        };
        let mut loader = Loader::new(open_dir(dir.path()).unwrap(), cfg).unwrap();
        let batches = run(&mut loader, 10_000);
        assert!(!batches.is_empty(), "rank {rank} got nothing");
        for row in batches.iter().flat_map(|b| &b.rows) {
            served_tokens += row.used();
            seen.extend(row.pieces.iter().map(|p| (p.doc, p.start, p.len)));
        }
    }
    assert_eq!(served_tokens, total);
    seen.sort();
    let pieces = seen.len();
    seen.dedup();
    assert_eq!(seen.len(), pieces, "a piece was served twice");
}

#[test]
fn rank_outside_world_is_rejected() {
    let dir = tempfile::tempdir().unwrap();
    write_shards(dir.path());
    let mut cfg = config(PackingPolicy::ConcatChunk, None);
    cfg.data_parallel = DataParallel {
        rank: 2,
        world_size: 2,
    };
    assert!(Loader::new(open_dir(dir.path()).unwrap(), cfg).is_err());
}

#[test]
fn default_config_round_trips_through_json() {
    let cfg = LoaderConfig::new(128, 8, 7);
    let text = serde_json::to_string(&cfg).unwrap();
    assert_eq!(serde_json::from_str::<LoaderConfig>(&text).unwrap(), cfg);
    let bad = text.replace("\"seed\"", "\"sead\"");
    assert!(serde_json::from_str::<LoaderConfig>(&bad).is_err());
}
