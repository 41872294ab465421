//! FineWeb quality filter (Penedo et al. 2024), following datatrove's `FineWebQualityFilter` and
//! its defaults: at least 12% of non-empty lines end in terminal punctuation, at most 67% of
//! lines are short (<= 30 chars), duplicated lines hold at most 1% of the characters (newlines
//! excluded), and at most 0.3 newlines per word.
//!
//! As in datatrove, lines are split at `\n` and whitespace-only lines skipped (none left:
//! `empty`), and words come from datatrove's English tokenizer (`word_tokenizer = "simple"`
//! for the funnel's faster one).
//!
//! What it is not: a rewrite; this stage only keeps or drops.

use serde::Deserialize;

use super::document::{Document, DropReason, Verdict};
use super::text::{
    RuleNumbers, Rules, WordTokenizer, ends_with_terminal_punctuation, find_duplicates, py_strip,
    ratio, recorded,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FinewebFile {
    pub line_punct_thr: f64,
    pub line_punct_exclude_zero: bool,
    pub short_line_thr: f64,
    pub short_line_length: usize,
    pub char_duplicates_ratio: f64,
    pub new_line_ratio: f64,
    pub word_tokenizer: WordTokenizer,
}

impl Default for FinewebFile {
    fn default() -> Self {
        FinewebFile {
            line_punct_thr: 0.12,
            line_punct_exclude_zero: false,
            short_line_thr: 0.67,
            short_line_length: 30,
            char_duplicates_ratio: 0.01,
            new_line_ratio: 0.3,
            word_tokenizer: WordTokenizer::default(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct FinewebQuality {
    file: FinewebFile,
}

impl FinewebFile {
    pub fn validate(self) -> Result<FinewebQuality, String> {
        for (name, v) in [
            ("line_punct_thr", self.line_punct_thr),
            ("short_line_thr", self.short_line_thr),
            ("char_duplicates_ratio", self.char_duplicates_ratio),
        ] {
            if !(0.0..=1.0).contains(&v) {
                return Err(format!("{name} must be within [0, 1], got {v}"));
            }
        }
        if self.new_line_ratio < 0.0 {
            return Err(format!(
                "new_line_ratio must be >= 0, got {}",
                self.new_line_ratio
            ));
        }
        Ok(FinewebQuality { file: self })
    }
}

impl FinewebQuality {
    pub fn apply(&self, doc: Document) -> Verdict {
        match self.check(&doc.text) {
            Some(reason) => Verdict::Drop(doc, reason),
            None => Verdict::Keep(doc),
        }
    }

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
        // Lines split at `\n` only; a line of Python whitespace counts as empty.
        let lines: Vec<&str> = text
            .split('\n')
            .filter(|l| !py_strip(l).is_empty())
            .collect();
        if lines.is_empty() {
            rules.also(true, DropReason::FinewebEmpty);
            if rules.done() {
                return rules.verdict();
            }
        }
        let punct = lines
            .iter()
            .filter(|l| ends_with_terminal_punctuation(l))
            .count();
        let punct = ratio(punct, lines.len());
        let fails =
            punct.is_some_and(|p| p < f.line_punct_thr && !(p == 0.0 && f.line_punct_exclude_zero));
        if rules.rule(
            "line_punct_ratio",
            punct,
            fails,
            DropReason::FinewebLinePunctRatio,
        ) {
            return rules.verdict();
        }
        let short = lines
            .iter()
            .filter(|l| l.chars().count() <= f.short_line_length)
            .count();
        let short = ratio(short, lines.len());
        if rules.rule(
            "short_line_ratio",
            short,
            short.is_some_and(|s| s > f.short_line_thr),
            DropReason::FinewebShortLineRatio,
        ) {
            return rules.verdict();
        }
        let chars_without_newlines = text.chars().filter(|&c| c != '\n').count();
        let (_, dup_chars) = find_duplicates(lines.iter().copied());
        let dup = ratio(dup_chars, chars_without_newlines);
        if rules.rule(
            "char_dup_ratio",
            dup,
            dup.is_some_and(|d| d > f.char_duplicates_ratio),
            DropReason::FinewebCharDupRatio,
        ) {
            return rules.verdict();
        }
        let words = f.word_tokenizer.words(text).len();
        let list = ratio(text.matches('\n').count(), words);
        rules.rule(
            "list_ratio",
            list,
            list.is_some_and(|l| l > f.new_line_ratio),
            DropReason::FinewebListRatio,
        );
        rules.verdict()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter() -> FinewebQuality {
        FinewebFile::default().validate().unwrap()
    }

    const LONG_SENTENCE: &str = "this line is long enough to not be short at all.";
    const LONG_NO_PUNCT: &str = "this line is long enough to not be short at all";

    fn unique(line: &str, i: usize) -> String {
        format!("{i} {line}")
    }

    #[test]
    fn terminal_punctuation_line_ratio() {
        let doc = |punct: usize, plain: usize| {
            let mut lines: Vec<String> = (0..punct).map(|i| unique(LONG_SENTENCE, i)).collect();
            lines.extend((0..plain).map(|i| unique(LONG_NO_PUNCT, 1000 + i)));
            lines.join("\n")
        };
        assert_eq!(filter().check(&doc(3, 22)), None); // 0.12
        assert_eq!(
            filter().check(&doc(2, 22)),
            Some(DropReason::FinewebLinePunctRatio)
        ); // 0.083
    }

    #[test]
    fn short_line_ratio() {
        let doc = |short: usize, long: usize| {
            let mut lines: Vec<String> = (0..short).map(|i| format!("short line {i}.")).collect();
            lines.extend((0..long).map(|i| unique(LONG_SENTENCE, i)));
            lines.join("\n")
        };
        // The newline/word ratio stays low: short lines hold 3 words each.
        assert_eq!(filter().check(&doc(67, 33)), None);
        assert_eq!(
            filter().check(&doc(68, 32)),
            Some(DropReason::FinewebShortLineRatio)
        );
    }

    #[test]
    fn duplicated_line_characters() {
        let base: Vec<String> = (0..99).map(|i| unique(LONG_SENTENCE, i)).collect();
        let total: usize = base.iter().map(|l| l.chars().count()).sum();
        // A duplicate of a 10-char line: 10 / (total + 10) against 0.01.
        let mut small = base.clone();
        small.push("dup line a.".into());
        small.push("dup line a.".into());
        let ratio = 11.0 / (total + 22) as f64;
        assert!(ratio <= 0.01, "{ratio}");
        assert_eq!(filter().check(&small.join("\n")), None);
        let mut big = base.clone();
        big.push(base[0].clone());
        big.push(base[1].clone());
        big.push(base[2].clone());
        assert_eq!(
            filter().check(&big.join("\n")),
            Some(DropReason::FinewebCharDupRatio)
        );
    }

    #[test]
    fn newline_per_word_ratio() {
        // Lines of 3 words separated by one newline: 1 newline per 3 words = 0.333 > 0.3.
        let list: Vec<String> = (0..40).map(|i| format!("item number {i}.")).collect();
        let relaxed = FinewebFile {
            short_line_thr: 1.0,
            char_duplicates_ratio: 1.0,
            ..FinewebFile::default()
        }
        .validate()
        .unwrap();
        // "item number 7." = 4 tokens (3 words and "."): 39 newlines / 160 tokens = 0.24.
        assert_eq!(relaxed.check(&list.join("\n")), None);
        let list: Vec<String> = (0..40).map(|i| format!("item {i}")).collect();
        assert_eq!(
            relaxed.check(&list.join("\n.\n")),
            Some(DropReason::FinewebListRatio)
        );
    }
}
