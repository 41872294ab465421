//! Language identification with a confidence threshold.
//!
//! Crate choice: `whatlang` (trigram profiles of 69 languages, pure Rust, no model file, a few
//! hundred MB/s on one core, ships a confidence in [0, 1]). `lingua` is more accurate on short
//! snippets but 10-100x slower and carries hundreds of MB of n-gram models; a fastText-compatible
//! identifier (FineWeb's choice, `lid.176.bin`) needs a 126 MB model file that cannot ship with
//! the repository or be fetched by tests. Pretraining documents are long, where whatlang's
//! accuracy is close to the others, so speed decides.
//!
//! Scores are not fastText's: FineWeb's `>= 0.65` is a fastText probability. whatlang's
//! confidence measures the margin between the best two languages; 0.65 is a sensible default
//! on long text (English prose scores 0.9-1.0) but a run should check the removed samples.
//!
//! Only the first `max_chars` characters are classified (whatlang's cost is linear in length;
//! the first few KB decide the language of a document as well as the whole does).
//! The stage writes the detected language (ISO 639-3) and score into the document's metadata.

use serde::Deserialize;
use whatlang::{Detector, Lang};

use super::document::{Document, DropReason, Verdict};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct LanguageFile {
    /// ISO 639-3 codes to keep (`"eng"`, `"fra"`, ...); empty keeps every language.
    pub languages: Vec<String>,
    pub min_confidence: f64,
    pub max_chars: usize,
}

impl Default for LanguageFile {
    fn default() -> Self {
        LanguageFile {
            languages: vec!["eng".into()],
            min_confidence: 0.65,
            max_chars: 4000,
        }
    }
}

#[derive(Clone, Debug)]
pub struct LanguageFilter {
    wanted: Vec<Lang>,
    min_confidence: f64,
    max_chars: usize,
    detector: Detector,
}

impl LanguageFile {
    pub fn validate(self) -> Result<LanguageFilter, String> {
        let wanted = self
            .languages
            .iter()
            .map(|code| {
                Lang::from_code(code.to_lowercase()).ok_or_else(|| {
                    format!("unknown language code {code:?} (use ISO 639-3 codes such as \"eng\")")
                })
            })
            .collect::<Result<Vec<_>, _>>()?;
        if !(0.0..=1.0).contains(&self.min_confidence) {
            return Err(format!(
                "min_confidence must be within [0, 1], got {}",
                self.min_confidence
            ));
        }
        if self.max_chars == 0 {
            return Err("max_chars must be positive".into());
        }
        Ok(LanguageFilter {
            wanted,
            min_confidence: self.min_confidence,
            max_chars: self.max_chars,
            detector: Detector::new(),
        })
    }
}

impl LanguageFilter {
    pub fn apply(&self, mut doc: Document) -> Verdict {
        let end = doc
            .text
            .char_indices()
            .nth(self.max_chars)
            .map_or(doc.text.len(), |(i, _)| i);
        let Some(info) = self.detector.detect(&doc.text[..end]) else {
            return Verdict::Drop(doc, DropReason::LanguageUnknown);
        };
        doc.metadata.language = Some(info.lang().code().to_string());
        doc.metadata.language_score = Some(info.confidence());
        if !self.wanted.is_empty() && !self.wanted.contains(&info.lang()) {
            return Verdict::Drop(doc, DropReason::LanguageNotWanted);
        }
        if info.confidence() < self.min_confidence {
            return Verdict::Drop(doc, DropReason::LanguageLowConfidence);
        }
        Verdict::Keep(doc)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(file: LanguageFile, text: &str) -> Result<Document, DropReason> {
        match file
            .validate()
            .unwrap()
            .apply(Document::plain("d", text, "s"))
        {
            Verdict::Keep(doc) => Ok(doc),
            Verdict::Drop(_, reason) => Err(reason),
        }
    }

    const ENGLISH: &str = "The quick brown fox jumps over the lazy dog while the farmer watches \
        from the porch of his old house, wondering whether the rain will come before evening.";
    const FRENCH: &str = "Le renard brun rapide saute par-dessus le chien paresseux pendant que le \
        fermier regarde depuis le porche de sa vieille maison, en se demandant s'il pleuvra.";

    #[test]
    fn keeps_english_and_records_score() {
        let doc = run(LanguageFile::default(), ENGLISH).unwrap();
        assert_eq!(doc.metadata.language.as_deref(), Some("eng"));
        assert!(doc.metadata.language_score.unwrap() >= 0.65);
    }

    #[test]
    fn drops_other_languages() {
        assert_eq!(
            run(LanguageFile::default(), FRENCH).unwrap_err(),
            DropReason::LanguageNotWanted
        );
    }

    #[test]
    fn confidence_threshold_applies_at_the_score() {
        let score = run(LanguageFile::default(), ENGLISH)
            .unwrap()
            .metadata
            .language_score
            .unwrap();
        let at = LanguageFile {
            min_confidence: score,
            ..LanguageFile::default()
        };
        assert!(run(at, ENGLISH).is_ok());
        if score < 1.0 {
            let above = LanguageFile {
                min_confidence: (score + 1e-9).min(1.0),
                ..LanguageFile::default()
            };
            assert_eq!(
                run(above, ENGLISH).unwrap_err(),
                DropReason::LanguageLowConfidence
            );
        }
    }

    #[test]
    fn rejects_unknown_codes() {
        let bad = LanguageFile {
            languages: vec!["english".into()],
            ..LanguageFile::default()
        };
        assert!(bad.validate().unwrap_err().contains("english"));
    }
}
