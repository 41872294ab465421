//! The Gopher quality, Gopher repetition, C4 and FineWeb filters against datatrove 0.10.1,
//! document for document: `tests/fixtures/datatrove_agreement.jsonl` holds 405 documents (Debian
//! descriptions, copyright files, changelogs, man pages, Python docstrings, PyPI descriptions,
//! Shakespeare, and synthetic text aimed at each rule and threshold) with datatrove's verdict,
//! reason and every rule's number, made by `scripts/make_funnel_agreement_fixture.py`.
//! `STOKE_AGREEMENT_FIXTURE=/path.jsonl` checks another file of the same format.
//!
//! Every verdict, reason and number must agree (numbers within 1e-9); a failure lists each
//! disagreement with both sides' numbers.

use std::path::PathBuf;

use serde_json::Value;
use stoke_data::funnel::verdicts::{DefaultFilters, FILTERS};

fn fixture() -> (PathBuf, Vec<Value>) {
    let path = std::env::var("STOKE_AGREEMENT_FIXTURE")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("tests/fixtures/datatrove_agreement.jsonl")
        });
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let docs = text
        .lines()
        .enumerate()
        .map(|(i, line)| {
            serde_json::from_str(line)
                .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), i + 1))
        })
        .collect();
    (path, docs)
}

fn same_number(a: Option<f64>, b: Option<f64>) -> bool {
    match (a, b) {
        (None, None) => true,
        (Some(a), Some(b)) => (a - b).abs() <= 1e-9,
        _ => false,
    }
}

#[test]
fn every_filter_agrees_with_datatrove_document_for_document() {
    let (path, docs) = fixture();
    assert!(
        docs.len() >= 100,
        "{} holds only {} documents",
        path.display(),
        docs.len()
    );
    let filters = DefaultFilters::default();
    let mut problems = Vec::new();
    let mut checked = 0;
    for doc in &docs {
        let id = doc["id"].as_str().unwrap_or("?");
        let text = doc["text"].as_str().expect("fixture documents have a text");
        for filter in FILTERS {
            let theirs = &doc["datatrove"][filter];
            assert!(theirs.is_object(), "{id}: no datatrove result for {filter}");
            let (verdict, numbers) = filters.verdict(filter, text).expect("a known filter");
            checked += 1;
            let our_reason = verdict.map(|r| r.datatrove_name().unwrap_or_else(|| r.name()));
            let their_reason = theirs["reason"].as_str().map(str::to_string);
            let keep_differs = verdict.is_none() != theirs["keep"].as_bool().unwrap_or(false);
            let mut differing = Vec::new();
            for (name, ours) in &numbers {
                let Some(their) = theirs["numbers"].get(*name) else {
                    differing.push(format!(
                        "{name}: stoke {ours:?}, datatrove has no such number"
                    ));
                    continue;
                };
                if !same_number(*ours, their.as_f64()) {
                    differing.push(format!("{name}: stoke {ours:?}, datatrove {their}"));
                }
            }
            if let Some(their_numbers) = theirs["numbers"].as_object() {
                for name in their_numbers.keys() {
                    if !numbers.iter().any(|(n, _)| n == name) {
                        differing.push(format!("{name}: missing on stoke's side"));
                    }
                }
            }
            if keep_differs || our_reason != their_reason || !differing.is_empty() {
                problems.push(format!(
                    "{id} [{filter}]: stoke {our_reason:?}, datatrove {their_reason:?}; {}; text {:?}",
                    differing.join(", "),
                    text.chars().take(100).collect::<String>()
                ));
            }
        }
    }
    assert!(
        problems.is_empty(),
        "{} of {checked} (document, filter) pairs in {} disagree with datatrove:\n{}",
        problems.len(),
        path.display(),
        problems.join("\n")
    );
}

#[test]
fn a_document_with_newlines_only_is_dropped_as_datatrove_drops_it() {
    // Edge semantics the issue names: `"\n\n"` is two empty, duplicate lines for the repetition
    // filter, and an empty document is `empty` there.
    let filters = DefaultFilters::default();
    let reason = |filter: &str, text: &str| {
        filters
            .verdict(filter, text)
            .and_then(|(v, _)| v)
            .and_then(|r| r.datatrove_name())
    };
    assert_eq!(reason("gopher_repetition", "").as_deref(), Some("empty"));
    assert_eq!(
        reason("gopher_repetition", "\n\n").as_deref(),
        Some("dup_line_frac")
    );
    assert_eq!(reason("fineweb", " \n\t\n").as_deref(), Some("empty"));
    assert_eq!(reason("c4", "").as_deref(), Some("too_few_sentences"));
}
