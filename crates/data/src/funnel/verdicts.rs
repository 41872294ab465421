//! Each document's verdict under each of the four datatrove-named filters (Gopher quality,
//! Gopher repetition, C4, FineWeb), every filter run alone with its defaults, with the number
//! each rule computed: what `stoke data verdicts` writes, and what `scripts/funnel_agreement.py`
//! and the agreement test set beside datatrove's, document for document.
//!
//! One JSON object per document: `{"id", "<filter>": {"keep", "reason", "numbers"}}`, the reason
//! in datatrove's words (`gopher_below_alpha_threshold`, `too_few_sentences`, ...).

use std::io::{BufRead, BufWriter, Write};
use std::path::Path;

use rayon::prelude::*;
use serde_json::{Map, Value, json};

use super::c4::{C4File, C4Quality};
use super::document::DropReason;
use super::fineweb::{FinewebFile, FinewebQuality};
use super::gopher_quality::{GopherQuality, GopherQualityFile};
use super::gopher_repetition::{GopherRepetition, GopherRepetitionFile};
use super::text::RuleNumbers;

/// The filters, in the order of the output object.
pub const FILTERS: [&str; 4] = ["gopher_quality", "gopher_repetition", "c4", "fineweb"];

/// The four filters with their defaults.
pub struct DefaultFilters {
    gopher_quality: GopherQuality,
    gopher_repetition: GopherRepetition,
    c4: C4Quality,
    fineweb: FinewebQuality,
}

impl Default for DefaultFilters {
    fn default() -> Self {
        // The defaults validate by construction; a failure here is a bug in a default.
        DefaultFilters {
            gopher_quality: GopherQualityFile::default()
                .validate()
                .expect("gopher_quality defaults"),
            gopher_repetition: GopherRepetitionFile::default()
                .validate()
                .expect("gopher_repetition defaults"),
            c4: C4File::default().validate().expect("c4 defaults"),
            fineweb: FinewebFile::default().validate().expect("fineweb defaults"),
        }
    }
}

fn entry(verdict: Option<DropReason>, numbers: RuleNumbers) -> Value {
    let numbers: Map<String, Value> = numbers
        .into_iter()
        .map(|(name, value)| (name.to_string(), value.map_or(Value::Null, |v| json!(v))))
        .collect();
    json!({
        "keep": verdict.is_none(),
        "reason": verdict.map(|r| r.datatrove_name().unwrap_or_else(|| r.name())),
        "numbers": numbers,
    })
}

impl DefaultFilters {
    /// The verdict and rule numbers of one filter (one of [`FILTERS`]).
    pub fn verdict(&self, filter: &str, text: &str) -> Option<(Option<DropReason>, RuleNumbers)> {
        Some(match filter {
            "gopher_quality" => self.gopher_quality.numbers(text),
            "gopher_repetition" => self.gopher_repetition.numbers(text),
            "c4" => self.c4.numbers(text),
            "fineweb" => self.fineweb.numbers(text),
            _ => return None,
        })
    }

    /// Every filter's entry for one text.
    pub fn verdicts(&self, text: &str) -> Map<String, Value> {
        FILTERS
            .iter()
            .filter_map(|&f| {
                self.verdict(f, text)
                    .map(|(v, n)| (f.to_string(), entry(v, n)))
            })
            .collect()
    }
}

/// Reads `{"id", "text"}` JSONL from `input` and writes one verdict line per document, in
/// order, to `output` (written under a temporary name, then renamed). Returns the number of
/// documents. A line that is not a JSON object with a string `text` is an error naming
/// `file:line`; nothing is written then.
pub fn write_verdicts(input: &Path, output: &Path) -> Result<usize, String> {
    let file = std::fs::File::open(input).map_err(|e| format!("{}: {e}", input.display()))?;
    let mut docs: Vec<(Value, String)> = Vec::new();
    for (i, line) in std::io::BufReader::new(file).lines().enumerate() {
        let at = || format!("{}:{}", input.display(), i + 1);
        let line = line.map_err(|e| format!("{}: {e}", at()))?;
        if line.trim().is_empty() {
            continue;
        }
        let value: Value = serde_json::from_str(&line).map_err(|e| format!("{}: {e}", at()))?;
        let text = value
            .get("text")
            .and_then(Value::as_str)
            .ok_or_else(|| format!("{}: no string field \"text\"", at()))?
            .to_string();
        let id = value.get("id").cloned().unwrap_or_else(|| json!(i + 1));
        docs.push((id, text));
    }
    let filters = DefaultFilters::default();
    let lines: Vec<String> = docs
        .par_iter()
        .map(|(id, text)| {
            let mut object = Map::new();
            object.insert("id".into(), id.clone());
            object.extend(filters.verdicts(text));
            Value::Object(object).to_string()
        })
        .collect();
    let partial = output.with_extension("partial");
    let write = || -> std::io::Result<()> {
        let mut out = BufWriter::new(std::fs::File::create(&partial)?);
        for line in &lines {
            writeln!(out, "{line}")?;
        }
        out.into_inner().map_err(|e| e.into_error())?.sync_all()?;
        std::fs::rename(&partial, output)
    };
    write().map_err(|e| {
        let _ = std::fs::remove_file(&partial);
        format!("{}: {e}", output.display())
    })?;
    Ok(lines.len())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_one_line_per_document_in_order_with_datatrove_reasons() {
        let dir = tempfile::tempdir().unwrap();
        let input = dir.path().join("in.jsonl");
        std::fs::write(
            &input,
            "{\"id\": \"a\", \"text\": \"\"}\n\n{\"text\": \"too short.\"}\n",
        )
        .unwrap();
        let output = dir.path().join("out.jsonl");
        assert_eq!(write_verdicts(&input, &output).unwrap(), 2);
        let lines: Vec<Value> = std::fs::read_to_string(&output)
            .unwrap()
            .lines()
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
        assert_eq!(lines[0]["id"], "a");
        assert_eq!(lines[0]["gopher_repetition"]["reason"], "empty");
        assert_eq!(
            lines[1]["id"], 3,
            "a record without an id gets its line number"
        );
        assert_eq!(lines[1]["gopher_quality"]["reason"], "gopher_short_doc");
        assert_eq!(
            lines[1]["gopher_quality"]["numbers"]["n_non_symbol_words"],
            2.0
        );
        assert_eq!(lines[1]["c4"]["keep"], false);
    }

    #[test]
    fn a_bad_line_is_an_error_naming_file_and_line_and_writes_nothing() {
        let dir = tempfile::tempdir().unwrap();
        let output = dir.path().join("out.jsonl");
        for (content, expected) in [
            ("{\"text\": \"fine\"}\n{not json\n", "in.jsonl:2"),
            (
                "{\"text\": \"fine\"}\n{\"text\": 7}\n",
                "in.jsonl:2: no string field \"text\"",
            ),
        ] {
            let input = dir.path().join("in.jsonl");
            std::fs::write(&input, content).unwrap();
            let error = write_verdicts(&input, &output).unwrap_err();
            assert!(error.contains(expected), "{error}");
            assert!(!output.exists(), "nothing is written on a bad input");
        }
    }
}
