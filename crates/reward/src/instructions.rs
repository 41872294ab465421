//! Checkable instruction constraints in the style of IFEval (Zhou et al. 2023): counts of words,
//! sentences, paragraphs and bullet points with "at least"/"at most", required and forbidden
//! keywords, all-lowercase or all-uppercase text, required start and end.
//!
//! Config (`kind = "instructions"`):
//! - `constraints`: a list of tables tagged by `type`:
//!   `{ type = "word_count", relation = "at_least" | "at_most", value = N }`, likewise
//!   `sentence_count`, `paragraph_count` (blocks separated by blank lines or `***`) and
//!   `bullet_count` (lines starting with `* `, `- ` or `+ `);
//!   `{ type = "keywords_required", keywords = [...] }`, `{ type = "keywords_forbidden", ... }`
//!   (case-insensitive whole-word matches); `{ type = "lowercase" }`, `{ type = "uppercase" }`;
//!   `{ type = "starts_with", text = "..." }`, `{ type = "ends_with", text = "..." }` (after
//!   trimming whitespace).
//! - `scoring`: `"fraction"` (default: fraction satisfied) or `"all"` (1 only if all hold).
//!
//! A sample's own `constraints` field (same shape) replaces the config's list, so one run can
//! score a dataset whose prompts each carry their instructions. Invariant: every check is a
//! linear scan of the completion.

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::verifier::{Check, Details, Outcome, RewardInput, RewardOutcome, Verifier};

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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ConstraintScoring {
    #[default]
    Fraction,
    All,
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct InstructionsConfig {
    pub constraints: Vec<Constraint>,
    pub scoring: ConstraintScoring,
}

#[derive(Debug, Clone)]
pub struct InstructionsVerifier {
    constraints: Vec<Constraint>,
    scoring: ConstraintScoring,
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
    fn name(&self) -> String {
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

impl InstructionsVerifier {
    pub fn new(config: &InstructionsConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            constraints: config.constraints.clone(),
            scoring: config.scoring,
        })
    }
}

impl Verifier for InstructionsVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let constraints = input
            .reference
            .constraints
            .as_deref()
            .unwrap_or(&self.constraints);
        if constraints.is_empty() {
            return RewardOutcome::missing("constraints");
        }
        let lower = input.completion.to_lowercase();
        let checks: Vec<Check> = constraints
            .iter()
            .map(|c| Check {
                name: c.name(),
                passed: c.holds(input.completion, &lower),
            })
            .collect();
        let passed = checks.iter().filter(|c| c.passed).count();
        let total = checks.len();
        let outcome = match passed {
            p if p == total => Outcome::Correct,
            0 => Outcome::Wrong,
            _ => Outcome::Partial,
        };
        let score = match self.scoring {
            ConstraintScoring::Fraction => passed as f64 / total as f64,
            ConstraintScoring::All => f64::from(u8::from(passed == total)),
        };
        let outcome = if self.scoring == ConstraintScoring::All && outcome == Outcome::Partial {
            Outcome::Wrong
        } else {
            outcome
        };
        RewardOutcome::new(
            score,
            outcome,
            Details {
                passed: Some(passed),
                total: Some(total),
                checks,
                ..Details::default()
            },
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Reference;

    fn holds(constraint: Constraint, text: &str) -> bool {
        constraint.holds(text, &text.to_lowercase())
    }

    #[test]
    fn counts_respect_at_least_and_at_most() {
        let text = "One two three. Four five!\n\nSecond paragraph here?";
        assert!(holds(
            Constraint::WordCount {
                relation: Relation::AtLeast,
                value: 8
            },
            text
        ));
        assert!(!holds(
            Constraint::WordCount {
                relation: Relation::AtMost,
                value: 7
            },
            text
        ));
        assert!(holds(
            Constraint::SentenceCount {
                relation: Relation::AtLeast,
                value: 3
            },
            text
        ));
        assert!(!holds(
            Constraint::SentenceCount {
                relation: Relation::AtLeast,
                value: 4
            },
            text
        ));
        assert!(holds(
            Constraint::ParagraphCount {
                relation: Relation::AtMost,
                value: 2
            },
            text
        ));
        assert!(!holds(
            Constraint::ParagraphCount {
                relation: Relation::AtMost,
                value: 1
            },
            text
        ));
    }

    #[test]
    fn keywords_match_whole_words_case_insensitively() {
        let text = "The Cat sat.";
        assert!(holds(
            Constraint::KeywordsRequired {
                keywords: vec!["cat".into()]
            },
            text
        ));
        assert!(!holds(
            Constraint::KeywordsRequired {
                keywords: vec!["ca".into()]
            },
            text
        ));
        assert!(!holds(
            Constraint::KeywordsForbidden {
                keywords: vec!["SAT".into()]
            },
            text
        ));
    }

    #[test]
    fn case_start_end_and_bullets() {
        assert!(holds(Constraint::Lowercase {}, "all lower 123"));
        assert!(!holds(Constraint::Uppercase {}, "MOSTLY upper"));
        assert!(holds(
            Constraint::StartsWith {
                text: "Dear".into()
            },
            "  Dear Sir"
        ));
        assert!(holds(
            Constraint::EndsWith {
                text: "Thanks.".into()
            },
            "ok. Thanks.\n"
        ));
        let bullets = "* one\n* two\n- three\nnot one";
        assert!(holds(
            Constraint::BulletCount {
                relation: Relation::AtLeast,
                value: 3
            },
            bullets
        ));
        assert!(!holds(
            Constraint::BulletCount {
                relation: Relation::AtLeast,
                value: 4
            },
            bullets
        ));
    }

    #[test]
    fn fraction_and_all_scoring_and_per_sample_constraints() {
        let config = InstructionsConfig {
            constraints: vec![
                Constraint::Lowercase {},
                Constraint::EndsWith { text: "bye".into() },
            ],
            scoring: ConstraintScoring::Fraction,
        };
        let reference = Reference::default();
        let fraction = InstructionsVerifier::new(&config).unwrap();
        let outcome = fraction.score(&RewardInput::new("", "hello", &reference));
        assert_eq!((outcome.score, outcome.outcome), (0.5, Outcome::Partial));
        let all = InstructionsVerifier::new(&InstructionsConfig {
            scoring: ConstraintScoring::All,
            ..config
        })
        .unwrap();
        assert_eq!(
            all.score(&RewardInput::new("", "hello", &reference)).score,
            0.0
        );
        let per_sample = Reference {
            constraints: Some(vec![Constraint::Lowercase {}]),
            ..Reference::default()
        };
        assert_eq!(
            all.score(&RewardInput::new("", "hello", &per_sample))
                .outcome,
            Outcome::Correct
        );
    }

    #[test]
    fn constraint_tables_reject_unknown_keys() {
        let parsed: Result<Constraint, _> =
            serde_json::from_str(r#"{"type":"lowercase","extra":1}"#);
        assert!(parsed.is_err());
        let parsed: Constraint =
            serde_json::from_str(r#"{"type":"word_count","relation":"at_most","value":3}"#)
                .unwrap();
        assert_eq!(
            parsed,
            Constraint::WordCount {
                relation: Relation::AtMost,
                value: 3
            }
        );
    }
}
