//! stoke's port of datatrove's English word tokenizer (spaCy 3.8.18's rules) against the words
//! and sentence counts datatrove itself produced (`scripts/make_funnel_agreement_fixture.py`).
//! `STOKE_SPACY_CASES=/path/cases.jsonl` checks another file of the same format.

use std::path::PathBuf;

use stoke_data::funnel::spacy_en::{sentence_count, words};

#[derive(serde::Deserialize)]
struct Case {
    text: String,
    words: Vec<String>,
    sentences: usize,
}

#[test]
fn words_and_sentence_counts_match_datatrove_case_for_case() {
    let path = std::env::var("STOKE_SPACY_CASES")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/spacy_en_tokens.jsonl")
        });
    let text = std::fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("reading {}: {e}", path.display()));
    let mut cases = 0;
    let mut word_mismatches = Vec::new();
    let mut sentence_mismatches = Vec::new();
    for (line_no, line) in text.lines().enumerate() {
        let case: Case = serde_json::from_str(line)
            .unwrap_or_else(|e| panic!("{}:{}: {e}", path.display(), line_no + 1));
        cases += 1;
        let ours = words(&case.text);
        if ours != case.words {
            let first = ours.iter().zip(&case.words).position(|(a, b)| a != b);
            let at = first.unwrap_or(ours.len().min(case.words.len()));
            word_mismatches.push(format!(
                "line {}: {:?}\n  stoke    {:?}\n  datatrove {:?}",
                line_no + 1,
                case.text.chars().take(120).collect::<String>(),
                &ours[at.saturating_sub(2)..(at + 3).min(ours.len())],
                &case.words[at.saturating_sub(2)..(at + 3).min(case.words.len())],
            ));
        }
        let n = sentence_count(&case.text);
        if n != case.sentences {
            sentence_mismatches.push(format!(
                "line {}: stoke {n}, datatrove {}: {:?}",
                line_no + 1,
                case.sentences,
                case.text.chars().take(120).collect::<String>()
            ));
        }
    }
    assert!(cases > 0, "{} holds no cases", path.display());
    assert!(
        word_mismatches.is_empty() && sentence_mismatches.is_empty(),
        "{} of {cases} word lists and {} sentence counts differ:\n{}\n{}",
        word_mismatches.len(),
        sentence_mismatches.len(),
        word_mismatches
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
        sentence_mismatches
            .iter()
            .take(30)
            .cloned()
            .collect::<Vec<_>>()
            .join("\n"),
    );
}
