//! Gopher quality filter (Rae et al. 2021, "Scaling Language Models", appendix A), following
//! datatrove's `GopherQualityFilter` rule by rule and with its defaults: 50-100,000 words, mean
//! word length 3-10, `#` and ellipsis per word <= 0.1, bullet-start lines <= 0.9, ellipsis-end
//! lines <= 0.3, >= 80% of words with an alphabetic character, >= 2 distinct Gopher stop words.
//!
//! Words come from datatrove's English tokenizer ([`super::spacy_en`]) unless `word_tokenizer =
//! "simple"`; as in datatrove, the word counts and mean length use non-symbol words (a character
//! outside datatrove's punctuation set), the ratios use all tokens, lines are Python's
//! `splitlines()` and "alphabetic" is Python's `str.isalpha`.

use serde::Deserialize;

use super::document::{Document, DropReason, Verdict};
use super::spacy_en::{is_datatrove_punctuation, py_isalpha, py_isspace};
use super::text::{RuleNumbers, Rules, WordTokenizer, exceeds, py_splitlines, ratio, recorded};

/// The Gopher stop-word list (datatrove's `STOP_WORDS`).
pub const GOPHER_STOP_WORDS: &[&str] = &["the", "be", "to", "of", "and", "that", "have", "with"];

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GopherQualityFile {
    pub min_doc_words: Option<usize>,
    pub max_doc_words: Option<usize>,
    pub min_avg_word_length: Option<f64>,
    pub max_avg_word_length: Option<f64>,
    pub max_symbol_word_ratio: Option<f64>,
    pub max_bullet_lines_ratio: Option<f64>,
    pub max_ellipsis_lines_ratio: Option<f64>,
    pub max_non_alpha_words_ratio: Option<f64>,
    pub min_stop_words: Option<usize>,
    pub stop_words: Vec<String>,
    pub word_tokenizer: WordTokenizer,
}

impl Default for GopherQualityFile {
    fn default() -> Self {
        GopherQualityFile {
            min_doc_words: Some(50),
            max_doc_words: Some(100_000),
            min_avg_word_length: Some(3.0),
            max_avg_word_length: Some(10.0),
            max_symbol_word_ratio: Some(0.1),
            max_bullet_lines_ratio: Some(0.9),
            max_ellipsis_lines_ratio: Some(0.3),
            max_non_alpha_words_ratio: Some(0.8),
            min_stop_words: Some(2),
            stop_words: GOPHER_STOP_WORDS.iter().map(|w| w.to_string()).collect(),
            word_tokenizer: WordTokenizer::default(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GopherQuality {
    file: GopherQualityFile,
}

impl GopherQualityFile {
    pub fn validate(self) -> Result<GopherQuality, String> {
        for (name, ratio) in [
            ("max_symbol_word_ratio", self.max_symbol_word_ratio),
            ("max_bullet_lines_ratio", self.max_bullet_lines_ratio),
            ("max_ellipsis_lines_ratio", self.max_ellipsis_lines_ratio),
            ("max_non_alpha_words_ratio", self.max_non_alpha_words_ratio),
        ] {
            if let Some(r) = ratio
                && !(0.0..=1.0).contains(&r)
            {
                return Err(format!("{name} must be within [0, 1], got {r}"));
            }
        }
        if let (Some(lo), Some(hi)) = (self.min_doc_words, self.max_doc_words)
            && lo > hi
        {
            return Err(format!("min_doc_words {lo} > max_doc_words {hi}"));
        }
        Ok(GopherQuality { file: self })
    }
}

impl GopherQuality {
    pub fn apply(&self, doc: Document) -> Verdict {
        match self.check(&doc.text) {
            Some(reason) => Verdict::Drop(doc, reason),
            None => Verdict::Keep(doc),
        }
    }

    /// The first rule the text fails, in datatrove's order.
    pub fn check(&self, text: &str) -> Option<DropReason> {
        self.evaluate(text, None)
    }

    /// The verdict and every rule's number (for agreement checks against datatrove).
    pub fn numbers(&self, text: &str) -> (Option<DropReason>, RuleNumbers) {
        recorded(|record| self.evaluate(text, record))
    }

    fn evaluate(&self, text: &str, record: Option<&mut RuleNumbers>) -> Option<DropReason> {
        let f = &self.file;
        let mut rules = Rules::new(record);
        let words = f.word_tokenizer.words(text);
        let n_words = words.len();
        // datatrove's "non-symbol" words: a character outside its punctuation set.
        let non_symbol: Vec<&str> = words
            .iter()
            .copied()
            .filter(|w| w.chars().any(|c| !is_datatrove_punctuation(c)))
            .collect();
        let n_non_symbol = non_symbol.len();
        rules.record("n_words", Some(n_words as f64));
        if rules.rule(
            "n_non_symbol_words",
            Some(n_non_symbol as f64),
            f.min_doc_words.is_some_and(|min| n_non_symbol < min),
            DropReason::GopherShortDoc,
        ) || rules.also(
            f.max_doc_words.is_some_and(|max| n_non_symbol > max),
            DropReason::GopherLongDoc,
        ) {
            return rules.verdict();
        }
        let chars: usize = non_symbol.iter().map(|w| w.chars().count()).sum();
        let mean = ratio(chars, n_non_symbol);
        if rules.rule(
            "avg_word_length",
            mean,
            f.min_avg_word_length
                .is_some_and(|min| mean.is_some_and(|m| m < min)),
            DropReason::GopherBelowAvgWordLength,
        ) || rules.also(
            f.max_avg_word_length
                .is_some_and(|max| mean.is_some_and(|m| m > max)),
            DropReason::GopherAboveAvgWordLength,
        ) {
            return rules.verdict();
        }
        let hashes = ratio(text.matches('#').count(), n_words);
        let ellipses = ratio(
            text.matches("...").count() + text.matches('\u{2026}').count(),
            n_words,
        );
        if rules.rule(
            "hash_ratio",
            hashes,
            exceeds(hashes, f.max_symbol_word_ratio),
            DropReason::GopherTooManyHashes,
        ) || rules.rule(
            "ellipsis_ratio",
            ellipses,
            exceeds(ellipses, f.max_symbol_word_ratio),
            DropReason::GopherTooManyEllipsis,
        ) {
            return rules.verdict();
        }
        let lines = py_splitlines(text);
        let bullets = lines
            .iter()
            .filter(|l| {
                let l = l.trim_start_matches(py_isspace);
                l.starts_with('\u{2022}') || l.starts_with('-')
            })
            .count();
        let bullets = ratio(bullets, lines.len());
        let end_ellipses = lines
            .iter()
            .filter(|l| {
                let l = l.trim_end_matches(py_isspace);
                l.ends_with("...") || l.ends_with('\u{2026}')
            })
            .count();
        let end_ellipses = ratio(end_ellipses, lines.len());
        if rules.rule(
            "bullet_lines_ratio",
            bullets,
            exceeds(bullets, f.max_bullet_lines_ratio),
            DropReason::GopherTooManyBullets,
        ) || rules.rule(
            "end_ellipsis_lines_ratio",
            end_ellipses,
            exceeds(end_ellipses, f.max_ellipsis_lines_ratio),
            DropReason::GopherTooManyEndEllipsis,
        ) {
            return rules.verdict();
        }
        let alpha = words.iter().filter(|w| w.chars().any(py_isalpha)).count();
        let alpha = ratio(alpha, n_words);
        if rules.rule(
            "alpha_words_ratio",
            alpha,
            f.max_non_alpha_words_ratio
                .is_some_and(|min| alpha.is_some_and(|a| a < min)),
            DropReason::GopherBelowAlphaThreshold,
        ) {
            return rules.verdict();
        }
        // Distinct stop words, matched exactly as datatrove's set intersection does ("The" at a
        // sentence start is not "the").
        let found = f
            .stop_words
            .iter()
            .filter(|s| words.contains(&s.as_str()))
            .count();
        rules.rule(
            "stop_words",
            Some(found as f64),
            f.min_stop_words.is_some_and(|min| found < min),
            DropReason::GopherTooFewStopWords,
        );
        rules.verdict()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter() -> GopherQuality {
        GopherQualityFile::default().validate().unwrap()
    }

    /// `n` words of length 4 holding two stop words ("the", "and" count as words too).
    fn words(n: usize) -> String {
        let mut out = vec!["the", "and"];
        out.extend(std::iter::repeat_n("word", n - 2));
        out.join(" ")
    }

    #[test]
    fn word_count_bounds_are_inclusive() {
        let f = filter();
        assert_eq!(f.check(&words(49)), Some(DropReason::GopherShortDoc));
        assert_eq!(f.check(&words(50)), None);
        assert_eq!(f.check(&words(100_000)), None);
        assert_eq!(f.check(&words(100_001)), Some(DropReason::GopherLongDoc));
    }

    #[test]
    fn mean_word_length_bounds() {
        let f = filter();
        // 2 stop words (3 chars) + 98 words: mean exactly 3 passes, just below fails.
        let at_three = format!("the and {}", vec!["abc"; 98].join(" "));
        assert_eq!(f.check(&at_three), None);
        let below = format!("the and {} ab", vec!["abc"; 97].join(" "));
        assert_eq!(f.check(&below), Some(DropReason::GopherBelowAvgWordLength));
        let long = format!("the and {}", vec!["abcdefghijkl"; 98].join(" "));
        assert_eq!(f.check(&long), Some(DropReason::GopherAboveAvgWordLength));
    }

    #[test]
    fn hash_ratio_threshold() {
        let f = filter();
        // 100 word tokens + k '#' tokens: ratio k / (100 + k).
        let with_hashes = |k: usize| format!("{} {}", words(100), vec!["#"; k].join(" "));
        assert_eq!(f.check(&with_hashes(11)), None); // 11/111 = 0.099
        assert_eq!(
            f.check(&with_hashes(12)),
            Some(DropReason::GopherTooManyHashes)
        ); // 0.107
    }

    #[test]
    fn ellipsis_ratio_threshold() {
        let f = filter();
        // 101 word tokens + k "..." tokens mid-line: ratio k / (101 + k).
        let with_ellipses = |k: usize| format!("{} {} end", words(100), vec!["..."; k].join(" "));
        assert_eq!(f.check(&with_ellipses(11)), None); // 11/112 = 0.098
        assert_eq!(
            f.check(&with_ellipses(12)),
            Some(DropReason::GopherTooManyEllipsis)
        ); // 0.106
    }

    #[test]
    fn bullet_and_ellipsis_line_ratios() {
        let f = filter();
        let sentence = "the and word word word word word word word word word word";
        let body = |bullets: usize, plain: usize| {
            let mut lines = vec![format!("- {sentence}"); bullets];
            lines.extend(vec![sentence.to_string(); plain]);
            lines.join("\n")
        };
        assert_eq!(f.check(&body(9, 1)), None); // 0.9
        assert_eq!(
            f.check(&body(19, 1)),
            Some(DropReason::GopherTooManyBullets)
        ); // 0.95
        let ellipsis = |ending: usize, plain: usize| {
            let mut lines =
                vec!["the and word word word word word word word word.".to_string(); plain];
            lines.extend(vec![
                "word word word word word word word word word word..."
                    .to_string();
                ending
            ]);
            lines.join("\n")
        };
        assert_eq!(f.check(&ellipsis(3, 7)), None); // 0.3
        assert_eq!(
            f.check(&ellipsis(4, 6)),
            Some(DropReason::GopherTooManyEndEllipsis)
        );
    }

    #[test]
    fn alphabetic_word_ratio_and_stop_words() {
        let f = filter();
        let numbers = |k: usize| format!("{} {}", words(80), vec!["1234"; k].join(" "));
        assert_eq!(f.check(&numbers(20)), None); // 80/100
        assert_eq!(
            f.check(&numbers(21)),
            Some(DropReason::GopherBelowAlphaThreshold)
        );
        // One distinct stop word, however often, is not enough; case matters as in datatrove.
        let one_stop = format!("the the The {}", vec!["word"; 60].join(" "));
        assert_eq!(f.check(&one_stop), Some(DropReason::GopherTooFewStopWords));
        let two_stops = format!("the and {}", vec!["word"; 60].join(" "));
        assert_eq!(f.check(&two_stops), None);
    }
}
