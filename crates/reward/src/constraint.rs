//! One checkable instruction (`Constraint`, IFEval style: counts with "at least"/"at most",
//! keywords, case, start and end) and its check on a completion; the file format of each is
//! described in `instructions.rs`.
//!
//! What this is not: a reward. The `instructions` reward kind (`instructions.rs`) scores a list of
//! these; a task's `Reference` (`verifier.rs`) may carry its own list, which is why the type sits
//! below both. Invariant: every check is a linear scan of the text.

use serde::{Deserialize, Serialize};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Relation {
    AtLeast,
    AtMost,
}

impl Relation {
    fn holds(self, count: usize, value: usize) -> bool {
        match self {
            Relation::AtLeast => count >= value,
            Relation::AtMost => count <= value,
        }
    }
}

/// One checkable instruction.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "type", rename_all = "snake_case", deny_unknown_fields)]
pub enum Constraint {
    WordCount { relation: Relation, value: usize },
    SentenceCount { relation: Relation, value: usize },
    ParagraphCount { relation: Relation, value: usize },
    BulletCount { relation: Relation, value: usize },
    KeywordsRequired { keywords: Vec<String> },
    KeywordsForbidden { keywords: Vec<String> },
    Lowercase {},
    Uppercase {},
    StartsWith { text: String },
    EndsWith { text: String },
}

fn word_count(text: &str) -> usize {
    text.split_whitespace()
        .filter(|w| w.chars().any(char::is_alphanumeric))
        .count()
}

fn sentence_count(text: &str) -> usize {
    let mut count = 0;
    let mut in_sentence = false;
    for ch in text.chars() {
        if matches!(ch, '.' | '!' | '?') {
            if in_sentence {
                count += 1;
            }
            in_sentence = false;
        } else if ch.is_alphanumeric() {
            in_sentence = true;
        }
    }
    count + usize::from(in_sentence)
}

fn paragraph_count(text: &str) -> usize {
    let mut count = 0;
    let mut in_paragraph = false;
    for line in text.lines() {
        let blank = line.trim().is_empty() || line.trim() == "***";
        if !blank && !in_paragraph {
            count += 1;
        }
        in_paragraph = !blank;
    }
    count
}

fn bullet_count(text: &str) -> usize {
    text.lines()
        .map(str::trim_start)
        .filter(|l| l.starts_with("* ") || l.starts_with("- ") || l.starts_with("+ "))
        .count()
}

/// Case-insensitive whole-word (or whole-phrase) containment.
fn contains_word(text_lower: &str, keyword: &str) -> bool {
    let keyword = keyword.to_lowercase();
    if keyword.is_empty() {
        return true;
    }
    let is_word = |c: Option<char>| c.is_some_and(char::is_alphanumeric);
    text_lower.match_indices(&keyword).any(|(at, _)| {
        !is_word(text_lower[..at].chars().next_back())
            && !is_word(text_lower[at + keyword.len()..].chars().next())
    })
}

impl Constraint {
    /// The check's name in `Details::checks` (`word_count AtLeast 3`).
    pub(crate) fn name(&self) -> String {
        match self {
            Constraint::WordCount { relation, value } => format!("word_count {relation:?} {value}"),
            Constraint::SentenceCount { relation, value } => {
                format!("sentence_count {relation:?} {value}")
            }
            Constraint::ParagraphCount { relation, value } => {
                format!("paragraph_count {relation:?} {value}")
            }
            Constraint::BulletCount { relation, value } => {
                format!("bullet_count {relation:?} {value}")
            }
            Constraint::KeywordsRequired { keywords } => format!("keywords_required {keywords:?}"),
            Constraint::KeywordsForbidden { keywords } => {
                format!("keywords_forbidden {keywords:?}")
            }
            Constraint::Lowercase {} => "lowercase".into(),
            Constraint::Uppercase {} => "uppercase".into(),
            Constraint::StartsWith { text } => format!("starts_with {text:?}"),
            Constraint::EndsWith { text } => format!("ends_with {text:?}"),
        }
    }

    /// Whether `text` satisfies the constraint (`lower` is `text` lowercased, computed once).
    pub fn holds(&self, text: &str, lower: &str) -> bool {
        match self {
            Constraint::WordCount { relation, value } => relation.holds(word_count(text), *value),
            Constraint::SentenceCount { relation, value } => {
                relation.holds(sentence_count(text), *value)
            }
            Constraint::ParagraphCount { relation, value } => {
                relation.holds(paragraph_count(text), *value)
            }
            Constraint::BulletCount { relation, value } => {
                relation.holds(bullet_count(text), *value)
            }
            Constraint::KeywordsRequired { keywords } => {
                keywords.iter().all(|k| contains_word(lower, k))
            }
            Constraint::KeywordsForbidden { keywords } => {
                !keywords.iter().any(|k| contains_word(lower, k))
            }
            Constraint::Lowercase {} => !text.chars().any(char::is_uppercase),
            Constraint::Uppercase {} => !text.chars().any(char::is_lowercase),
            Constraint::StartsWith { text: start } => text.trim_start().starts_with(start.as_str()),
            Constraint::EndsWith { text: end } => text.trim_end().ends_with(end.as_str()),
        }
    }
}
