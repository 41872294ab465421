//! The record every funnel stage reads and writes: a [`Document`], and the closed set of reasons
//! a stage may give for removing one ([`DropReason`]).
//!
//! What it is not: a container of arbitrary per-stage state. Stages that learn something about a
//! document (its language, its score) write it into the typed [`Metadata`]; fields of the input
//! record that the funnel does not interpret travel untouched in `Metadata::extra` so that the
//! output keeps them.
//!
//! Invariant: `text` is valid UTF-8 (guaranteed by `String`); `id` is unique within one input
//! file (the reader falls back to `file:line` when the record has no id).

use serde::{Deserialize, Serialize};

/// One unit of text moving through the funnel.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Document {
    pub id: String,
    pub text: String,
    /// The name of the `[[source]]` the document was read from.
    pub source: String,
    #[serde(default)]
    pub metadata: Metadata,
}

/// What the funnel knows about a document besides its text.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct Metadata {
    /// Where the document came from on the web (WARC-Target-URI or an input `url` field).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub url: Option<String>,
    /// Whether `text` still holds markup that the `extract` stage must turn into plain text.
    #[serde(default, skip_serializing_if = "ContentType::is_plain")]
    pub content_type: ContentType,
    /// ISO 639-3 code written by the `language` stage.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub language_score: Option<f64>,
    /// Fields of the input record the funnel does not interpret, kept for the output.
    #[serde(default, skip_serializing_if = "serde_json::Map::is_empty", flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ContentType {
    #[default]
    Plain,
    Html,
}

impl ContentType {
    fn is_plain(&self) -> bool {
        *self == ContentType::Plain
    }
}

impl Document {
    pub fn plain(
        id: impl Into<String>,
        text: impl Into<String>,
        source: impl Into<String>,
    ) -> Self {
        Document {
            id: id.into(),
            text: text.into(),
            source: source.into(),
            metadata: Metadata::default(),
        }
    }

    pub fn byte_len(&self) -> u64 {
        self.text.len() as u64
    }
}

/// Why a stage removed a document. One variant per rule, so the report can say exactly which
/// threshold each removed document failed; the names follow datatrove's where one exists.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum DropReason {
    ExtractionEmpty,
    LanguageUnknown,
    LanguageNotWanted,
    LanguageLowConfidence,
    GopherShortDoc,
    GopherLongDoc,
    GopherBelowAvgWordLength,
    GopherAboveAvgWordLength,
    GopherTooManyHashes,
    GopherTooManyEllipsis,
    GopherTooManyBullets,
    GopherTooManyEndEllipsis,
    GopherBelowAlphaThreshold,
    GopherTooFewStopWords,
    RepetitionEmpty,
    RepetitionDupParaFrac,
    RepetitionDupParaCharFrac,
    RepetitionDupLineFrac,
    RepetitionDupLineCharFrac,
    RepetitionTopNGram(u8),
    RepetitionDuplicatedNGrams(u8),
    C4LoremIpsum,
    C4CurlyBracket,
    C4TooFewSentences,
    FinewebEmpty,
    FinewebLinePunctRatio,
    FinewebShortLineRatio,
    FinewebCharDupRatio,
    FinewebListRatio,
    RepeatedSpan,
    HardBannedWord,
    SoftBannedWords,
    BlockedUrl,
    ExactDuplicate,
    NearDuplicate,
    LineDedupEmptied,
}

impl DropReason {
    /// The stable name used in `report.json` and for `removed/<name>.jsonl`.
    pub fn name(&self) -> String {
        use DropReason::*;
        let fixed = match self {
            ExtractionEmpty => "extraction_empty",
            LanguageUnknown => "language_unknown",
            LanguageNotWanted => "language_not_wanted",
            LanguageLowConfidence => "language_low_confidence",
            GopherShortDoc => "gopher_short_doc",
            GopherLongDoc => "gopher_long_doc",
            GopherBelowAvgWordLength => "gopher_below_avg_word_length",
            GopherAboveAvgWordLength => "gopher_above_avg_word_length",
            GopherTooManyHashes => "gopher_too_many_hashes",
            GopherTooManyEllipsis => "gopher_too_many_ellipsis",
            GopherTooManyBullets => "gopher_too_many_bullets",
            GopherTooManyEndEllipsis => "gopher_too_many_end_ellipsis",
            GopherBelowAlphaThreshold => "gopher_below_alpha_threshold",
            GopherTooFewStopWords => "gopher_too_few_stop_words",
            RepetitionEmpty => "repetition_empty",
            RepetitionDupParaFrac => "repetition_dup_para_frac",
            RepetitionDupParaCharFrac => "repetition_dup_para_char_frac",
            RepetitionDupLineFrac => "repetition_dup_line_frac",
            RepetitionDupLineCharFrac => "repetition_dup_line_char_frac",
            RepetitionTopNGram(n) => return format!("repetition_top_{n}_gram"),
            RepetitionDuplicatedNGrams(n) => return format!("repetition_duplicated_{n}_n_grams"),
            C4LoremIpsum => "c4_lorem_ipsum",
            C4CurlyBracket => "c4_curly_bracket",
            C4TooFewSentences => "c4_too_few_sentences",
            FinewebEmpty => "fineweb_empty",
            FinewebLinePunctRatio => "fineweb_line_punct_ratio",
            FinewebShortLineRatio => "fineweb_short_line_ratio",
            FinewebCharDupRatio => "fineweb_char_dup_ratio",
            FinewebListRatio => "fineweb_list_ratio",
            RepeatedSpan => "repeated_span",
            HardBannedWord => "hard_banned_word",
            SoftBannedWords => "soft_banned_words",
            BlockedUrl => "blocked_url",
            ExactDuplicate => "exact_duplicate",
            NearDuplicate => "near_duplicate",
            LineDedupEmptied => "line_dedup_emptied",
        };
        fixed.to_string()
    }

    /// The reason datatrove 0.10.1 gives for the same rule (its filters' second return value),
    /// for the four filters that follow it; `None` for stoke's own stages.
    pub fn datatrove_name(&self) -> Option<String> {
        use DropReason::*;
        let fixed = match self {
            GopherShortDoc => "gopher_short_doc",
            GopherLongDoc => "gopher_long_doc",
            GopherBelowAvgWordLength => "gopher_below_avg_threshold",
            GopherAboveAvgWordLength => "gopher_above_avg_threshold",
            GopherTooManyHashes => "gopher_too_many_hashes",
            GopherTooManyEllipsis => "gopher_too_many_ellipsis",
            GopherTooManyBullets => "gopher_too_many_bullets",
            GopherTooManyEndEllipsis => "gopher_too_many_end_ellipsis",
            GopherBelowAlphaThreshold => "gopher_below_alpha_threshold",
            GopherTooFewStopWords => "gopher_enough_stop_words",
            RepetitionEmpty => "empty",
            RepetitionDupParaFrac => "dup_para_frac",
            RepetitionDupParaCharFrac => "dup_para_char_frac",
            RepetitionDupLineFrac => "dup_line_frac",
            RepetitionDupLineCharFrac => "dup_line_char_frac",
            RepetitionTopNGram(n) => return Some(format!("top_{n}_gram")),
            RepetitionDuplicatedNGrams(n) => return Some(format!("duplicated_{n}_n_grams")),
            C4LoremIpsum => "lorem_ipsum",
            C4CurlyBracket => "curly_bracket",
            C4TooFewSentences => "too_few_sentences",
            FinewebEmpty => "empty",
            FinewebLinePunctRatio => "line_punct_ratio",
            FinewebShortLineRatio => "short_line_ratio",
            FinewebCharDupRatio => "char_dup_ratio",
            FinewebListRatio => "list_ratio",
            _ => return None,
        };
        Some(fixed.to_string())
    }
}

/// A stage's decision on one document.
#[derive(Debug)]
pub enum Verdict {
    Keep(Document),
    Drop(Document, DropReason),
}

/// Something a stage did to a kept document that the report counts (redactions, removed lines).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub enum Event {
    EmailRedacted,
    IpAddressRedacted,
    PhoneNumberRedacted,
    CreditCardRedacted,
    LinesRemoved,
    UnitsRemoved,
    DocumentModified,
}

impl Event {
    pub fn name(&self) -> &'static str {
        match self {
            Event::EmailRedacted => "emails_redacted",
            Event::IpAddressRedacted => "ip_addresses_redacted",
            Event::PhoneNumberRedacted => "phone_numbers_redacted",
            Event::CreditCardRedacted => "credit_cards_redacted",
            Event::LinesRemoved => "lines_removed",
            Event::UnitsRemoved => "units_removed",
            Event::DocumentModified => "documents_modified",
        }
    }
}

/// Events a stage recorded while handling one document; empty (no allocation) in the common case.
pub type Events = Vec<(Event, u64)>;
