//! Shard format: round trips for both token widths, rollover, and clear errors on damage.

use stoke_data::shard::{
    ShardError, ShardReader, ShardWriter, ShardWriterConfig, TokenWidth, open_dir,
};

fn docs(seed: u64, n: usize, vocab: u32) -> Vec<Vec<u32>> {
    let mut state = seed;
    let mut next = move || {
        state = state
            .wrapping_mul(6364136223846793005)
            .wrapping_add(1442695040888963407);
        state >> 33
    };
    (0..n)
        .map(|_| {
            let len = (next() % 50) as usize; // includes empty documents
            (0..len)
                .map(|_| (next() % u64::from(vocab)) as u32)
                .collect()
        })
        .collect()
}

fn write(dir: &std::path::Path, vocab: u64, max_tokens: u64, docs: &[Vec<u32>]) -> usize {
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: dir.to_path_buf(),
        prefix: "train".into(),
        vocab_size: vocab,
        max_tokens_per_shard: max_tokens,
    })
    .unwrap();
    for d in docs {
        writer.push_document(d).unwrap();
    }
    writer.finish().unwrap().len()
}

fn read_all(dir: &std::path::Path) -> Vec<Vec<u32>> {
    let mut out = Vec::new();
    for shard in open_dir(dir).unwrap() {
        for d in 0..shard.num_docs() {
            out.push(shard.document(d).unwrap().to_vec());
        }
    }
    out
}

#[test]
fn u16_round_trip_returns_exactly_the_written_documents() {
    let dir = tempfile::tempdir().unwrap();
    let written = docs(1, 300, 65_536);
    write(dir.path(), 65_536, 1 << 20, &written);
    let shards = open_dir(dir.path()).unwrap();
    assert_eq!(shards[0].width(), TokenWidth::U16);
    assert_eq!(read_all(dir.path()), written);
}

#[test]
fn u32_round_trip_returns_exactly_the_written_documents() {
    let dir = tempfile::tempdir().unwrap();
    let written = docs(2, 300, 200_000);
    write(dir.path(), 200_000, 1 << 20, &written);
    let shards = open_dir(dir.path()).unwrap();
    assert_eq!(shards[0].width(), TokenWidth::U32);
    assert!(written.iter().flatten().any(|&t| t > 65_535));
    assert_eq!(read_all(dir.path()), written);
}

#[test]
fn rollover_splits_by_size_without_splitting_documents() {
    let dir = tempfile::tempdir().unwrap();
    let written = docs(3, 400, 1000);
    let n = write(dir.path(), 1000, 500, &written);
    assert!(n > 5, "expected several shards, got {n}");
    for shard in open_dir(dir.path()).unwrap() {
        assert!(shard.num_tokens() <= 500);
    }
    assert_eq!(read_all(dir.path()), written);
    // No temporary file is left behind.
    for entry in std::fs::read_dir(dir.path()).unwrap() {
        assert!(!entry.unwrap().path().to_string_lossy().ends_with(".tmp"));
    }
}

#[test]
fn token_outside_vocabulary_is_rejected_by_the_writer() {
    let dir = tempfile::tempdir().unwrap();
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: dir.path().to_path_buf(),
        prefix: "x".into(),
        vocab_size: 100,
        max_tokens_per_shard: 1000,
    })
    .unwrap();
    let err = writer.push_document(&[1, 2, 100]).unwrap_err();
    assert!(
        matches!(
            err,
            ShardError::TokenOutOfRange {
                token: 100,
                position: 2,
                ..
            }
        ),
        "{err}"
    );
}

fn one_shard(dir: &std::path::Path) -> std::path::PathBuf {
    write(dir, 1000, 1 << 20, &docs(4, 50, 1000));
    stoke_data::shard::list_shards(dir).unwrap().remove(0)
}

#[test]
fn truncated_file_is_reported_with_its_name() {
    let dir = tempfile::tempdir().unwrap();
    let path = one_shard(dir.path());
    let bytes = std::fs::read(&path).unwrap();
    std::fs::write(&path, &bytes[..bytes.len() - 3]).unwrap();
    let err = ShardReader::open(&path).unwrap_err();
    assert!(matches!(err, ShardError::SizeMismatch { .. }), "{err}");
    assert!(err.to_string().contains(&path.display().to_string()));
}

#[test]
fn flipped_token_byte_fails_the_checksum() {
    let dir = tempfile::tempdir().unwrap();
    let path = one_shard(dir.path());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[70] ^= 0x5a;
    std::fs::write(&path, &bytes).unwrap();
    let err = ShardReader::open(&path).unwrap_err();
    assert!(matches!(err, ShardError::Checksum { .. }), "{err}");
    assert!(err.to_string().contains("train-00000.shard"));
}

#[test]
fn wrong_magic_and_empty_files_are_rejected() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("bogus.shard");
    std::fs::write(&path, vec![7u8; 200]).unwrap();
    assert!(matches!(
        ShardReader::open(&path).unwrap_err(),
        ShardError::BadMagic { .. }
    ));
    std::fs::write(&path, b"").unwrap();
    let err = ShardReader::open(&path).unwrap_err();
    assert!(err.to_string().contains("bogus.shard"), "{err}");
}
