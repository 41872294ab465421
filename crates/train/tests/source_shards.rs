//! ShardSource: batches over shards written with ShardWriter, exact resume from a JSON cursor,
//! refusal of foreign cursors, clear errors on bad input.

use std::path::{Path, PathBuf};

use stoke_data::loader::LoaderConfig;
use stoke_data::packing::{PAD_DOC, PackedBatch, PackingPolicy};
use stoke_data::shard::{ShardWriter, ShardWriterConfig};
use stoke_train::source::{BatchSource, ShardSource, SourceError};

const VOCAB: u64 = 5000;

/// Document `d` holds `len(d)` tokens `d * 40 + i`, so every token names its document.
fn doc_tokens(d: u32) -> Vec<u32> {
    let len = 3 + (d * 7) % 29;
    (0..len).map(|i| d * 40 + i).collect()
}

fn write_shards(dir: &Path, docs: u32, prefix: &str) -> Vec<PathBuf> {
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: dir.to_path_buf(),
        prefix: prefix.into(),
        vocab_size: VOCAB,
        max_tokens_per_shard: 400,
    })
    .unwrap();
    for d in 0..docs {
        writer.push_document(&doc_tokens(d)).unwrap();
    }
    writer
        .finish()
        .unwrap()
        .into_iter()
        .map(|s| s.path)
        .collect()
}

fn config(max_epochs: Option<u64>) -> LoaderConfig {
    LoaderConfig {
        max_epochs,
        shuffle_buffer: 8,
        policy: PackingPolicy::BestFitDecreasingSplit { window_docs: 16 },
        ..LoaderConfig::new(32, 3, 7)
    }
}

fn take(source: &mut dyn BatchSource, n: usize) -> Vec<PackedBatch> {
    (0..n).map_while(|_| source.next_batch().unwrap()).collect()
}

#[test]
fn one_epoch_serves_every_document_token_once() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_shards(dir.path(), 60, "a");
    assert!(shards.len() > 1, "the test wants several shards");
    let mut source = ShardSource::open(&shards, config(Some(1))).unwrap();
    let mut seen: Vec<u32> = Vec::new();
    while let Some(batch) = source.next_batch().unwrap() {
        for row in 0..batch.batch_size {
            let at = |i: usize| row * batch.seq_len + i;
            // A row's real tokens: every input, plus the last target when it is real.
            for i in 0..batch.seq_len {
                if batch.doc_ids[at(i)] != PAD_DOC {
                    seen.push(batch.tokens[at(i)]);
                }
            }
            let used: usize = batch.rows[row].used();
            if used == batch.seq_len + 1 {
                seen.push(batch.targets[at(batch.seq_len - 1)]);
            }
        }
    }
    let mut expected: Vec<u32> = (0..60).flat_map(doc_tokens).collect();
    seen.sort_unstable();
    expected.sort_unstable();
    assert_eq!(seen, expected);
    assert!(
        source.next_batch().unwrap().is_none(),
        "stays exhausted after the last epoch"
    );
}

#[test]
fn loss_mask_never_crosses_documents() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_shards(dir.path(), 40, "a");
    let mut source = ShardSource::open(&shards, config(Some(1))).unwrap();
    let mut trained = 0;
    while let Some(batch) = source.next_batch().unwrap() {
        for i in 0..batch.tokens.len() {
            if batch.loss_mask[i] {
                trained += 1;
                // Tokens name their document (token / 40), so input and target must agree.
                assert_eq!(batch.tokens[i] / 40, batch.targets[i] / 40, "position {i}");
                assert_ne!(batch.doc_ids[i], PAD_DOC);
            }
        }
    }
    assert!(trained > 0);
}

#[test]
fn restored_cursor_yields_the_same_following_batches() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_shards(dir.path(), 50, "a");
    // Unbounded epochs: the continuation crosses epoch boundaries.
    let mut uninterrupted = ShardSource::open(&shards, config(None)).unwrap();
    take(&mut uninterrupted, 5);
    let cursor_text = serde_json::to_string(&uninterrupted.cursor()).unwrap();
    let expected = take(&mut uninterrupted, 30);

    let mut resumed = ShardSource::open(&shards, config(None)).unwrap();
    take(&mut resumed, 2); // a different position, overwritten by restore
    resumed
        .restore(serde_json::from_str(&cursor_text).unwrap())
        .unwrap();
    assert_eq!(take(&mut resumed, 30), expected);
    assert!(
        resumed.loader_cursor().epoch >= 1,
        "the continuation should reach a later epoch"
    );
}

#[test]
fn cursor_from_other_shards_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shards_a = write_shards(&dir.path().join("a"), 50, "a");
    let shards_b = write_shards(&dir.path().join("b"), 51, "b");
    let mut a = ShardSource::open(&shards_a, config(None)).unwrap();
    take(&mut a, 2);
    let mut b = ShardSource::open(&shards_b, config(None)).unwrap();
    let before = b.cursor();
    let err = b.restore(a.cursor()).unwrap_err();
    assert!(err.to_string().contains("does not match"), "{err}");
    assert_eq!(
        b.cursor(),
        before,
        "a refused cursor leaves the source as it was"
    );
}

#[test]
fn cursor_with_other_seq_len_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_shards(dir.path(), 50, "a");
    let a = ShardSource::open(&shards, config(None)).unwrap();
    let mut b = ShardSource::open(
        &shards,
        LoaderConfig {
            seq_len: 64,
            ..config(None)
        },
    )
    .unwrap();
    let err = b.restore(a.cursor()).unwrap_err();
    assert!(matches!(err, SourceError::CursorMismatch { .. }), "{err}");
}

#[test]
fn malformed_cursor_is_a_clear_error() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_shards(dir.path(), 10, "a");
    let mut source = ShardSource::open(&shards, config(None)).unwrap();
    let err = source.restore(serde_json::json!({"epoch": 1})).unwrap_err();
    assert!(matches!(err, SourceError::BadCursor { .. }), "{err}");
    assert!(err.to_string().contains("missing field"), "{err}");
}

#[test]
fn corrupt_shard_error_names_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let shards = write_shards(dir.path(), 10, "a");
    let mut bytes = std::fs::read(&shards[0]).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0xff;
    std::fs::write(&shards[0], bytes).unwrap();
    let err = ShardSource::open(&shards, config(None)).unwrap_err();
    assert!(
        err.to_string().contains(&shards[0].display().to_string()),
        "{err}"
    );
}

#[test]
fn no_shards_is_an_error() {
    let err = ShardSource::open(&[], config(None)).unwrap_err();
    assert!(matches!(err, SourceError::NoShards), "{err}");
}
