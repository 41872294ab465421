//! C4 quality filter (Raffel et al. 2020), following datatrove's `C4QualityFilter` with its
//! defaults: per line, drop lines with a word over 1000 chars, strip citation markers (`[1]`,
//! `[edit]`, `[citation needed]`), drop lines not ending in terminal punctuation (`. ? ! " '`) or
//! ending in `...`, lines with fewer than 3 words, lines mentioning "javascript", and cookie or
//! policy notices; drop the whole document on "lorem ipsum" or a curly brace, or when fewer than
//! 5 sentences remain. Kept lines are joined with `\n`: this stage rewrites the text.
//!
//! Lines, stripping and word splits follow Python's `splitlines()`, `strip()` and `split()`, and
//! sentences are counted as datatrove counts them, with spaCy's sentencizer over spaCy's tokens
//! ([`super::spacy_en::sentence_count`]): "Google Inc. All rights reserved." is one sentence.

use std::sync::LazyLock;

use regex::Regex;
use serde::Deserialize;

use super::document::{Document, DropReason, Event, Events, Verdict};
use super::spacy_en::sentence_count;
use super::text::{RuleNumbers, py_split, py_splitlines, py_strip};

const END_PUNCTUATION: &[char] = &['.', '?', '!', '"', '\''];
const POLICY_SUBSTRINGS: &[&str] = &[
    "terms of use",
    "privacy policy",
    "cookie policy",
    "uses cookies",
    "use of cookies",
    "use cookies",
];

static CITATION: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"\[\d*\]|\[edit\]|\[citation needed\]").expect("static citation regex")
});

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct C4File {
    pub remove_citations: bool,
    pub filter_no_terminal_punct: bool,
    pub min_num_sentences: usize,
    pub min_words_per_line: usize,
    pub max_word_length: Option<usize>,
    pub filter_lorem_ipsum: bool,
    pub filter_javascript: bool,
    pub filter_curly_bracket: bool,
    pub filter_policy: bool,
}

impl Default for C4File {
    fn default() -> Self {
        C4File {
            remove_citations: true,
            filter_no_terminal_punct: true,
            min_num_sentences: 5,
            min_words_per_line: 3,
            max_word_length: Some(1000),
            filter_lorem_ipsum: true,
            filter_javascript: true,
            filter_curly_bracket: true,
            filter_policy: true,
        }
    }
}

#[derive(Clone, Debug)]
pub struct C4Quality {
    file: C4File,
}

impl C4File {
    pub fn validate(self) -> Result<C4Quality, String> {
        if self.max_word_length == Some(0) {
            return Err("max_word_length must be positive (omit it to disable the rule)".into());
        }
        Ok(C4Quality { file: self })
    }
}

/// What the filter made of a text.
pub struct C4Outcome {
    /// The kept lines joined with `\n`, or why the document is dropped.
    pub result: Result<String, DropReason>,
    /// Sentences counted over the kept lines (up to the line that dropped the document).
    pub sentences: usize,
    /// Lines kept (idem).
    pub kept_lines: usize,
    /// Lines in the text.
    pub total_lines: usize,
}

impl C4Quality {
    pub fn apply(&self, mut doc: Document, events: &mut Events) -> Verdict {
        let outcome = self.evaluate(&doc.text);
        let text = match outcome.result {
            Ok(text) => text,
            Err(reason) => return Verdict::Drop(doc, reason),
        };
        let removed = (outcome.total_lines - outcome.kept_lines) as u64;
        if text != doc.text {
            events.push((Event::DocumentModified, 1));
            doc.text = text;
        }
        if removed > 0 {
            events.push((Event::LinesRemoved, removed));
        }
        Verdict::Keep(doc)
    }

    /// The verdict and the rule numbers (for agreement checks against datatrove).
    pub fn numbers(&self, text: &str) -> (Option<DropReason>, RuleNumbers) {
        let outcome = self.evaluate(text);
        (
            outcome.result.err(),
            vec![
                ("num_sentences", Some(outcome.sentences as f64)),
                ("kept_lines", Some(outcome.kept_lines as f64)),
            ],
        )
    }

    /// datatrove's `C4QualityFilter.filter`: Python's `splitlines()`, `strip()` and `split()`,
    /// sentences counted by its spaCy sentencizer.
    pub fn evaluate(&self, text: &str) -> C4Outcome {
        let f = &self.file;
        let mut kept: Vec<String> = Vec::new();
        let mut sentences = 0;
        let lines = py_splitlines(text);
        let total_lines = lines.len();
        let outcome = |result, sentences, kept: &Vec<String>| C4Outcome {
            result,
            sentences,
            kept_lines: kept.len(),
            total_lines,
        };
        for raw in lines {
            let line = py_strip(raw);
            let words: Vec<&str> = py_split(line).collect();
            if let Some(max) = f.max_word_length
                && words.iter().any(|w| w.chars().count() > max)
            {
                continue;
            }
            let line = if f.remove_citations {
                CITATION.replace_all(line, "").into_owned()
            } else {
                line.to_string()
            };
            if f.filter_no_terminal_punct
                && (!line.ends_with(END_PUNCTUATION) || line.ends_with("..."))
            {
                continue;
            }
            if words.len() < f.min_words_per_line {
                continue;
            }
            let lower = line.to_lowercase();
            if f.filter_lorem_ipsum && lower.contains("lorem ipsum") {
                return outcome(Err(DropReason::C4LoremIpsum), sentences, &kept);
            }
            if f.filter_javascript && lower.contains("javascript") {
                continue;
            }
            if f.filter_curly_bracket && line.contains('{') {
                return outcome(Err(DropReason::C4CurlyBracket), sentences, &kept);
            }
            if f.filter_policy && POLICY_SUBSTRINGS.iter().any(|p| lower.contains(p)) {
                continue;
            }
            if f.min_num_sentences > 0 {
                sentences += sentence_count(&line);
            }
            kept.push(line);
        }
        if sentences < f.min_num_sentences {
            return outcome(Err(DropReason::C4TooFewSentences), sentences, &kept);
        }
        let joined = py_strip(&kept.join("\n")).to_string();
        outcome(Ok(joined), sentences, &kept)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn run(text: &str) -> Result<String, DropReason> {
        let filter = C4File::default().validate().unwrap();
        match filter.apply(Document::plain("d", text, "s"), &mut Vec::new()) {
            Verdict::Keep(doc) => Ok(doc.text),
            Verdict::Drop(_, reason) => Err(reason),
        }
    }

    fn sentences(n: usize) -> Vec<String> {
        (0..n)
            .map(|i| format!("This is sentence number {i}."))
            .collect()
    }

    #[test]
    fn needs_five_sentences() {
        assert_eq!(
            run(&sentences(4).join("\n")),
            Err(DropReason::C4TooFewSentences)
        );
        assert!(run(&sentences(5).join("\n")).is_ok());
        // Two sentences on one line count twice.
        let mut lines = sentences(3);
        lines.push("One more here. And the fifth one!".into());
        assert!(run(&lines.join("\n")).is_ok());
    }

    #[test]
    fn drops_lines_without_terminal_punctuation_or_few_words() {
        let mut lines = sentences(5);
        lines.push("A heading without punctuation".into());
        lines.push("Two words.".into());
        lines.push("Trailing off here...".into());
        lines.push("Three words here.".into());
        let mut expected = sentences(5);
        expected.push("Three words here.".into());
        assert_eq!(run(&lines.join("\n")), Ok(expected.join("\n")));
    }

    #[test]
    fn drops_javascript_and_policy_lines_and_citations() {
        let mut lines = sentences(5);
        lines.push("Please enable JavaScript to view this.".into());
        lines.push("This site uses cookies to work well.".into());
        lines.push("The moon is bright[1] tonight[citation needed].".into());
        let mut expected = sentences(5);
        expected.push("The moon is bright tonight.".into());
        assert_eq!(run(&lines.join("\n")), Ok(expected.join("\n")));
    }

    #[test]
    fn lorem_ipsum_and_curly_brace_drop_the_document() {
        let mut lines = sentences(5);
        lines.push("Lorem ipsum dolor sit amet.".into());
        assert_eq!(run(&lines.join("\n")), Err(DropReason::C4LoremIpsum));
        let mut lines = sentences(5);
        lines.push("function f() { return 1; }.".into());
        assert_eq!(run(&lines.join("\n")), Err(DropReason::C4CurlyBracket));
    }

    #[test]
    fn overlong_word_lines_are_dropped() {
        let mut lines = sentences(5);
        lines.push(format!("a b {} c.", "x".repeat(1000)));
        lines.push(format!("a b {} c.", "x".repeat(1001)));
        let text = run(&lines.join("\n")).unwrap();
        assert_eq!(text.lines().count(), 6);
    }
}
