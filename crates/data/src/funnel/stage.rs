//! The closed set of funnel stages: [`StageFile`] is the `[[stage]]` table of the TOML file
//! (`kind = "..."` plus the stage's own keys, unknown keys rejected), [`Stage`] the validated
//! runtime stage. Every dispatch on the kind of stage happens in this file.
//!
//! Two shapes of stage:
//! - per-document stages (extraction, language, quality filters, PII, safety) look at one
//!   document at a time and run in parallel ([`Stage::apply`]);
//! - ordered stages (the three dedups) keep state across documents: the expensive part
//!   ([`Stage::prepare`]: fingerprints, signatures, line hashes) runs in parallel, the decision
//!   ([`Stage::decide`]) in reading order, so the kept document of a duplicate set is always the
//!   first one read.

use std::path::{Path, PathBuf};

use serde::Deserialize;

use super::c4::{C4File, C4Quality};
use super::document::{Document, Events, Verdict};
use super::exact_dedup::{ExactDedup, ExactDedupFile};
use super::extract::{ExtractFile, Extractor};
use super::fineweb::{FinewebFile, FinewebQuality};
use super::gopher_quality::{GopherQuality, GopherQualityFile};
use super::gopher_repetition::{GopherRepetition, GopherRepetitionFile};
use super::langid::{LanguageFile, LanguageFilter};
use super::line_dedup::{LineDedup, LineDedupFile, UnitHashes};
use super::minhash::{MinHashDedup, MinHashFile};
use super::pii::{PiiFile, PiiRedactor};
use super::repeated_span::{RepeatedSpan, RepeatedSpanFile};
use super::safety::{SafetyFile, SafetyFilter};

#[derive(Clone, Debug, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum StageFile {
    Extract(ExtractFile),
    Language(LanguageFile),
    GopherQuality(GopherQualityFile),
    GopherRepetition(GopherRepetitionFile),
    C4(C4File),
    Fineweb(FinewebFile),
    RepeatedSpan(RepeatedSpanFile),
    Pii(PiiFile),
    Safety(SafetyFile),
    ExactDedup(ExactDedupFile),
    MinhashDedup(MinHashFile),
    LineDedup(LineDedupFile),
}

#[derive(Debug)]
pub enum Stage {
    Extract(Extractor),
    Language(LanguageFilter),
    GopherQuality(GopherQuality),
    GopherRepetition(GopherRepetition),
    C4(C4Quality),
    Fineweb(FinewebQuality),
    RepeatedSpan(RepeatedSpan),
    Pii(PiiRedactor),
    Safety(SafetyFilter),
    ExactDedup(ExactDedup),
    MinhashDedup(MinHashDedup),
    LineDedup(LineDedup),
}

/// What an ordered stage computes in parallel before deciding in order.
#[derive(Debug)]
pub enum Prepared {
    Fingerprint(u128),
    BandKeys(Vec<u64>),
    Units(UnitHashes),
}

fn resolve(base_dir: &Path, path: Option<PathBuf>) -> Option<PathBuf> {
    path.map(|p| base_dir.join(p))
}

impl StageFile {
    /// Validates the stage; relative paths inside it are taken from `base_dir`.
    pub fn validate(self, base_dir: &Path) -> Result<Stage, String> {
        Ok(match self {
            StageFile::Extract(f) => Stage::Extract(f.validate()?),
            StageFile::Language(f) => Stage::Language(f.validate()?),
            StageFile::GopherQuality(f) => Stage::GopherQuality(f.validate()?),
            StageFile::GopherRepetition(f) => Stage::GopherRepetition(f.validate()?),
            StageFile::C4(f) => Stage::C4(f.validate()?),
            StageFile::Fineweb(f) => Stage::Fineweb(f.validate()?),
            StageFile::RepeatedSpan(f) => Stage::RepeatedSpan(f.validate()?),
            StageFile::Pii(f) => Stage::Pii(f.validate()?),
            StageFile::Safety(f) => Stage::Safety(
                SafetyFile {
                    hard_words_file: resolve(base_dir, f.hard_words_file),
                    soft_words_file: resolve(base_dir, f.soft_words_file),
                    blocked_domains_file: resolve(base_dir, f.blocked_domains_file),
                    ..f
                }
                .validate()?,
            ),
            StageFile::ExactDedup(f) => Stage::ExactDedup(
                ExactDedupFile {
                    state_file: resolve(base_dir, f.state_file),
                }
                .validate()?,
            ),
            StageFile::MinhashDedup(f) => Stage::MinhashDedup(f.validate()?),
            StageFile::LineDedup(f) => Stage::LineDedup(f.validate()?),
        })
    }
}

impl Stage {
    pub fn name(&self) -> &'static str {
        match self {
            Stage::Extract(_) => "extract",
            Stage::Language(_) => "language",
            Stage::GopherQuality(_) => "gopher_quality",
            Stage::GopherRepetition(_) => "gopher_repetition",
            Stage::C4(_) => "c4",
            Stage::Fineweb(_) => "fineweb",
            Stage::RepeatedSpan(_) => "repeated_span",
            Stage::Pii(_) => "pii",
            Stage::Safety(_) => "safety",
            Stage::ExactDedup(_) => "exact_dedup",
            Stage::MinhashDedup(_) => "minhash_dedup",
            Stage::LineDedup(_) => "line_dedup",
        }
    }

    pub fn is_ordered(&self) -> bool {
        matches!(
            self,
            Stage::ExactDedup(_) | Stage::MinhashDedup(_) | Stage::LineDedup(_)
        )
    }

    /// Runs a per-document stage. Ordered stages are never passed here (the pipeline asks
    /// [`Stage::is_ordered`] first); should one be, the document passes unchanged.
    pub fn apply(&self, doc: Document, events: &mut Events) -> Verdict {
        match self {
            Stage::Extract(s) => s.apply(doc),
            Stage::Language(s) => s.apply(doc),
            Stage::GopherQuality(s) => s.apply(doc),
            Stage::GopherRepetition(s) => s.apply(doc),
            Stage::C4(s) => s.apply(doc, events),
            Stage::Fineweb(s) => s.apply(doc),
            Stage::RepeatedSpan(s) => s.apply(doc),
            Stage::Pii(s) => s.apply(doc, events),
            Stage::Safety(s) => s.apply(doc),
            Stage::ExactDedup(_) | Stage::MinhashDedup(_) | Stage::LineDedup(_) => {
                Verdict::Keep(doc)
            }
        }
    }

    /// The parallel half of an ordered stage; `None` for per-document stages.
    pub fn prepare(&self, doc: &Document) -> Option<Prepared> {
        match self {
            Stage::ExactDedup(_) => Some(Prepared::Fingerprint(ExactDedup::fingerprint(&doc.text))),
            Stage::MinhashDedup(s) => Some(Prepared::BandKeys(
                s.hasher.band_keys(&s.hasher.signature(&doc.text)),
            )),
            Stage::LineDedup(s) => Some(Prepared::Units(s.unit_hashes(&doc.text))),
            _ => None,
        }
    }

    /// The in-order half of an ordered stage.
    pub fn decide(&mut self, doc: Document, prepared: Prepared, events: &mut Events) -> Verdict {
        match (self, prepared) {
            (Stage::ExactDedup(s), Prepared::Fingerprint(f)) => s.decide(doc, f),
            (Stage::MinhashDedup(s), Prepared::BandKeys(keys)) => s.decide(doc, &keys),
            (Stage::LineDedup(s), Prepared::Units(units)) => s.decide(doc, units, events),
            (_, _) => Verdict::Keep(doc),
        }
    }

    /// Work to do once the input is exhausted (persisting dedup state).
    pub fn finish(&mut self) -> Result<(), String> {
        match self {
            Stage::ExactDedup(s) => s.persist(),
            _ => Ok(()),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, Deserialize)]
    #[serde(deny_unknown_fields)]
    struct Stages {
        stage: Vec<StageFile>,
    }

    #[test]
    fn every_kind_parses_with_defaults() {
        let kinds = [
            "extract",
            "language",
            "gopher_quality",
            "gopher_repetition",
            "c4",
            "fineweb",
            "repeated_span",
            "pii",
            "exact_dedup",
            "minhash_dedup",
            "line_dedup",
        ];
        let toml_text: String = kinds
            .iter()
            .map(|k| format!("[[stage]]\nkind = \"{k}\"\n"))
            .collect();
        let parsed: Stages = toml::from_str(&toml_text).unwrap();
        let names: Vec<&str> = parsed
            .stage
            .into_iter()
            .map(|s| s.validate(Path::new(".")).unwrap().name())
            .collect();
        assert_eq!(names, kinds);
    }

    #[test]
    fn unknown_keys_and_kinds_are_rejected() {
        let typo =
            toml::from_str::<Stages>("[[stage]]\nkind = \"gopher_quality\"\nmin_doc_word = 3\n");
        assert!(typo.unwrap_err().to_string().contains("min_doc_word"));
        let kind = toml::from_str::<Stages>("[[stage]]\nkind = \"gopher\"\n");
        assert!(kind.unwrap_err().to_string().contains("gopher"));
    }
}
