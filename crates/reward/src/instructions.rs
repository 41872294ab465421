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
//!
//! The constraints themselves and their checks are in `constraint.rs` (a task's `Reference` names
//! them too); this module holds the reward kind: its config, scoring and verifier.

use serde::{Deserialize, Serialize};

pub use crate::constraint::{Constraint, Relation};
use crate::error::ConfigError;
use crate::verifier::{Check, Details, Outcome, RewardInput, RewardOutcome, Verifier};

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
