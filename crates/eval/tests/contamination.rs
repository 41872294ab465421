//! N-gram contamination: planted duplicates found with zero misses, unrelated text with zero
//! hits, across JSONL shards, a folder of .txt + .jsonl.zst + Parquet, document boundaries, bad
//! input and a configurable n.

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use rand::seq::IndexedRandom;
use rand::{Rng, SeedableRng};
use rand_chacha::ChaCha8Rng;
use stoke_eval::contamination::{
    ContaminationError, IndexConfig, NgramIndex, check, index_files, report,
};

fn vocabulary(seed: u64, size: usize) -> Vec<String> {
    let mut rng = ChaCha8Rng::seed_from_u64(seed);
    (0..size)
        .map(|_| {
            let len = rng.random_range(3..9);
            (0..len)
                .map(|_| rng.random_range(b'a'..=b'z') as char)
                .collect()
        })
        .collect()
}

fn words(rng: &mut ChaCha8Rng, vocabulary: &[String], count: usize) -> Vec<String> {
    (0..count)
        .map(|_| vocabulary.choose(rng).cloned().unwrap_or_default())
        .collect()
}

/// The same words with other case and punctuation: what normalization must see through.
fn restyle(rng: &mut ChaCha8Rng, words: &[String]) -> String {
    const SEPARATORS: [&str; 7] = [" ", ", ", " -- ", "; ", "\n", " (", ") "];
    let mut text = String::from("\u{201c}");
    for (i, word) in words.iter().enumerate() {
        if i > 0 {
            text.push_str(SEPARATORS.choose(rng).copied().unwrap_or(" "));
        }
        match rng.random_range(0..3) {
            0 => text.push_str(&word.to_uppercase()),
            1 => {
                text.push_str(&word[..1].to_uppercase());
                text.push_str(&word[1..]);
            }
            _ => text.push_str(word),
        }
    }
    text.push_str(".\u{201d}");
    text
}

struct Fixture {
    documents: Vec<String>,
    /// 50 planted items, then 50 unrelated ones.
    items: Vec<String>,
}

/// 2,000 random documents with 50 eval items planted in distinct documents (restyled), and 50
/// unrelated items drawn from another vocabulary.
fn fixture() -> Fixture {
    let mut rng = ChaCha8Rng::seed_from_u64(7);
    let train = vocabulary(1, 5000);
    let other = vocabulary(2, 5000);
    let mut documents: Vec<String> = (0..2000)
        .map(|_| {
            let count = rng.random_range(60..140);
            words(&mut rng, &train, count).join(" ")
        })
        .collect();
    let mut targets: Vec<usize> = (0..documents.len()).collect();
    let mut items = Vec::new();
    for i in 0..50 {
        let count = rng.random_range(20..40);
        let item = words(&mut rng, &train, count);
        let target = targets.swap_remove(rng.random_range(0..targets.len()));
        let document = &documents[target];
        let cut = document
            .match_indices(' ')
            .map(|(at, _)| at)
            .nth(rng.random_range(0..50))
            .unwrap_or(0);
        let planted = restyle(&mut rng, &item);
        documents[target] = format!("{} {planted} {}", &document[..cut], &document[cut..]);
        items.push(if i % 2 == 0 {
            item.join(" ")
        } else {
            format!("\"{}\"?", item.join(", ").to_uppercase())
        });
    }
    for _ in 0..50 {
        let count = rng.random_range(20..40);
        items.push(words(&mut rng, &other, count).join(" "));
    }
    Fixture { documents, items }
}

fn jsonl(documents: &[String]) -> String {
    documents
        .iter()
        .map(|d| format!("{}\n", serde_json::json!({"id": 1, "text": d})))
        .collect()
}

fn assert_planted_found(index: &NgramIndex, items: &[String]) {
    let report = report(index, items);
    assert_eq!(report.items, 100);
    assert_eq!(
        report.contaminated,
        (0..50).collect::<Vec<_>>(),
        "planted misses or false hits"
    );
    assert_eq!(report.too_short, 0);
    assert!((report.fraction - 0.5).abs() < 1e-12);
    for item in &items[..50] {
        let overlap = check(index, item);
        assert_eq!(
            overlap.matched, overlap.ngrams,
            "every n-gram of a planted item is found"
        );
    }
}

#[test]
fn planted_duplicates_in_jsonl_shards_are_all_found_and_unrelated_items_are_not() {
    let fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    for (shard, chunk) in fixture.documents.chunks(500).enumerate() {
        // Every shard repeats the first 100 documents: the in-place dedup removes them.
        let mut text = jsonl(chunk);
        text.push_str(&jsonl(&fixture.documents[..100]));
        std::fs::write(dir.path().join(format!("shard-{shard}.jsonl")), text).unwrap();
    }
    let small = IndexConfig {
        n: 13,
        max_buffer: 4096,
    };
    let index = index_files(&[dir.path().to_path_buf()], &small, "text").unwrap();
    assert_eq!(index.documents(), 2400);
    assert!(index.ngrams_seen() > index.len() as u64);
    assert_planted_found(&index, &fixture.items);

    // The dedup path (run dozens of times above) changes nothing: same index as one final sort.
    let texts = fixture.documents.iter().map(String::as_str);
    let whole = NgramIndex::from_texts(texts, &IndexConfig::default()).unwrap();
    assert_eq!((index.len(), index.n()), (whole.len(), 13));
    assert!(index.memory_bytes() < index.len() * 8 + 4096);
    assert_planted_found(&whole, &fixture.items);
}

fn write_parquet(path: &Path, texts: &[String]) {
    use parquet::data_type::{ByteArray, ByteArrayType};
    use parquet::file::properties::WriterProperties;
    use parquet::file::writer::SerializedFileWriter;
    use parquet::schema::parser::parse_message_type;
    let schema = "message doc { REQUIRED BYTE_ARRAY content (UTF8); }";
    let schema = Arc::new(parse_message_type(schema).unwrap());
    let properties = Arc::new(WriterProperties::builder().build());
    let mut writer =
        SerializedFileWriter::new(std::fs::File::create(path).unwrap(), schema, properties)
            .unwrap();
    let mut group = writer.next_row_group().unwrap();
    let values: Vec<ByteArray> = texts.iter().map(|t| t.as_str().into()).collect();
    let mut column = group.next_column().unwrap().unwrap();
    column
        .typed::<ByteArrayType>()
        .write_batch(&values, None, None)
        .unwrap();
    column.close().unwrap();
    group.close().unwrap();
    writer.close().unwrap();
}

#[test]
fn planted_duplicates_in_a_folder_of_txt_zst_and_parquet_are_all_found() {
    let fixture = fixture();
    let dir = tempfile::tempdir().unwrap();
    let corpus = dir.path().join("corpus");
    let nested = corpus.join("a/b");
    std::fs::create_dir_all(&nested).unwrap();
    // Documents 0..700 as the lines of one .txt, 700..1400 as zstd JSONL, 1400.. as Parquet.
    let documents = &fixture.documents;
    std::fs::write(corpus.join("part.txt"), documents[..700].join("\n")).unwrap();
    let compressed = zstd::encode_all(jsonl(&documents[700..1400]).as_bytes(), 3).unwrap();
    std::fs::write(nested.join("part.jsonl.zst"), compressed).unwrap();
    std::fs::write(corpus.join("README.md"), "not training data").unwrap();
    let parquet = dir.path().join("rest.parquet");
    write_parquet(&parquet, &documents[1400..]);

    let config = IndexConfig {
        n: 13,
        max_buffer: 1000,
    };
    let folder = index_files(std::slice::from_ref(&corpus), &config, "text").unwrap();
    assert_eq!(folder.documents(), 701);
    let separate = NgramIndex::from_texts(
        documents[..1400].iter().map(String::as_str),
        &IndexConfig::default(),
    )
    .unwrap();
    assert!(
        folder.len() > separate.len(),
        "the .txt adds n-grams across its line breaks"
    );
    let rows = index_files(std::slice::from_ref(&parquet), &config, "content").unwrap();
    assert_eq!(rows.documents(), 600);

    // Planted items are found in whichever file holds them; unrelated ones nowhere.
    let mut found = report(&folder, &fixture.items).contaminated;
    found.extend(report(&rows, &fixture.items).contaminated);
    found.sort_unstable();
    assert_eq!(found, (0..50).collect::<Vec<_>>());

    // One text field for all: the JSONL lines have no "content", an error at the first line.
    let message = index_files(&[corpus, parquet], &config, "content")
        .unwrap_err()
        .to_string();
    assert!(message.contains("part.jsonl.zst:1"), "{message}");
}

#[test]
fn documents_are_separate_but_a_txt_file_spans_its_lines() {
    let item: Vec<String> = (0..20).map(|i| format!("token{i}")).collect();
    let (first, second) = (item[..10].join(" "), item[10..].join(" "));
    let dir = tempfile::tempdir().unwrap();
    let jsonl_path = dir.path().join("docs.jsonl");
    std::fs::write(
        &jsonl_path,
        jsonl(&[format!("lead in {first}"), format!("{second} tail")]),
    )
    .unwrap();
    let txt_path = dir.path().join("doc.txt");
    std::fs::write(&txt_path, format!("lead in {first}\n{second} tail\n")).unwrap();
    let config = IndexConfig::default();
    let item = item.join(" ");

    let index = index_files(&[jsonl_path], &config, "text").unwrap();
    assert!(
        !check(&index, &item).contaminated(),
        "no n-gram spans two JSONL documents"
    );
    let index = index_files(&[txt_path], &config, "text").unwrap();
    let overlap = check(&index, &item);
    assert_eq!((overlap.ngrams, overlap.matched), (8, 8));
    assert_eq!(
        overlap.first_match.as_deref(),
        Some(&*item.split(' ').take(13).collect::<Vec<_>>().join(" "))
    );
}

#[test]
fn bad_input_is_an_error_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("file.jsonl");
    std::fs::write(&path, "{\"text\": \"fine\"}\n\n{not json\n").unwrap();
    let config = IndexConfig::default();
    let message = index_files(&[path], &config, "text")
        .unwrap_err()
        .to_string();
    assert!(message.contains("file.jsonl:3"), "{message}");

    let path = dir.path().join("other.ndjson");
    std::fs::write(&path, "{\"text\": \"fine\"}\n{\"body\": \"no text\"}\n").unwrap();
    let message = index_files(&[path], &config, "text")
        .unwrap_err()
        .to_string();
    assert!(
        message.contains("other.ndjson:2") && message.contains("\"text\""),
        "{message}"
    );

    let path = dir.path().join("latin1.txt");
    std::fs::File::create(&path)
        .unwrap()
        .write_all(b"ok\ncaf\xe9\n")
        .unwrap();
    let message = index_files(&[path], &config, "text")
        .unwrap_err()
        .to_string();
    assert!(message.contains("latin1.txt:2"), "{message}");

    let path = dir.path().join("notes.md");
    std::fs::write(&path, "x").unwrap();
    assert!(matches!(
        index_files(&[path], &config, "text"),
        Err(ContaminationError::File { .. })
    ));
    let empty = dir.path().join("empty");
    std::fs::create_dir(&empty).unwrap();
    assert!(matches!(
        index_files(&[empty], &config, "text"),
        Err(ContaminationError::NoFiles { .. })
    ));
    let missing = PathBuf::from("/nonexistent/corpus");
    assert!(matches!(
        index_files(&[missing], &config, "text"),
        Err(ContaminationError::Io { .. })
    ));
}

#[test]
fn n_is_configurable() {
    let shared = "one two three four five six seven eight";
    let corpus = format!("alpha beta gamma {shared} delta epsilon");
    let item = format!("zeta eta theta iota kappa {shared} lambda mu nu xi omicron pi");
    let index = |n| NgramIndex::from_texts([corpus.as_str()], &IndexConfig { n, max_buffer: 64 });
    let eight = check(&index(8).unwrap(), &item);
    assert_eq!((eight.ngrams, eight.matched), (12, 1));
    assert_eq!(eight.first_match.as_deref(), Some(shared));
    assert!((eight.fraction() - 1.0 / 12.0).abs() < 1e-12);
    let thirteen = index(13).unwrap();
    let overlap = check(&thirteen, &item);
    assert!(!overlap.contaminated() && !overlap.too_short);
    assert_eq!(overlap.ngrams, 7);

    // Fewer than n words: reported too short, never contaminated.
    let short = report(&thirteen, &[shared.to_string(), item]);
    assert_eq!(
        (short.too_short, short.contaminated.len(), short.fraction),
        (1, 0, 0.0)
    );
    assert!(check(&thirteen, shared).too_short);
}
