//! Tag-structure reward: partial credit for each required tag that appears exactly once as an
//! `<tag>...</tag>` pair, after the previous tag's pair.
//!
//! Config (`kind = "tag_structure"`):
//! - `tags` (list of names, default `["think", "answer"]`): required tags, in order.
//!
//! Score: fraction of tags that pass (`Correct` when all do, `Partial` when some do,
//! `FormatError` when none do). Invariant: one linear scan per tag.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::verifier::{Check, Details, Outcome, RewardInput, RewardOutcome, Verifier};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct TagStructureConfig {
    pub tags: Vec<String>,
}

impl Default for TagStructureConfig {
    fn default() -> Self {
        Self {
            tags: vec!["think".into(), "answer".into()],
        }
    }
}

#[derive(Debug, Clone)]
pub struct TagStructureVerifier {
    /// `(name, "<name>", "</name>")`.
    tags: Vec<(String, String, String)>,
}

impl TagStructureVerifier {
    pub fn new(config: &TagStructureConfig) -> Result<Self, ConfigError> {
        if config.tags.is_empty() {
            return Err(ConfigError::invalid("tags", "at least one tag is required"));
        }
        let mut tags = Vec::new();
        for name in &config.tags {
            if name.is_empty()
                || !name
                    .chars()
                    .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
            {
                return Err(ConfigError::invalid(
                    "tags",
                    format!("{name:?} is not a tag name"),
                ));
            }
            tags.push((name.clone(), format!("<{name}>"), format!("</{name}>")));
        }
        Ok(Self { tags })
    }
}

impl Verifier for TagStructureVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let text = input.completion;
        let mut previous_close_end = 0usize;
        let mut checks = Vec::with_capacity(self.tags.len());
        for (name, open, close) in &self.tags {
            let passed = match (
                text.matches(open.as_str()).count(),
                text.matches(close.as_str()).count(),
            ) {
                (1, 1) => {
                    let open_at = text.find(open.as_str()).unwrap_or(0);
                    let close_at = text.find(close.as_str()).unwrap_or(0);
                    let in_order =
                        open_at >= previous_close_end && close_at >= open_at + open.len();
                    if in_order {
                        previous_close_end = close_at + close.len();
                    }
                    in_order
                }
                _ => false,
            };
            checks.push(Check {
                name: name.clone(),
                passed,
            });
        }
        let passed = checks.iter().filter(|c| c.passed).count();
        let total = checks.len();
        let outcome = match passed {
            0 => Outcome::FormatError,
            p if p == total => Outcome::Correct,
            _ => Outcome::Partial,
        };
        let details = Details {
            passed: Some(passed),
            total: Some(total),
            checks,
            ..Details::default()
        };
        RewardOutcome::new(passed as f64 / total as f64, outcome, details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Reference;

    fn score(completion: &str) -> (f64, Outcome) {
        let reference = Reference::default();
        let verifier = TagStructureVerifier::new(&TagStructureConfig::default()).unwrap();
        let outcome = verifier.score(&RewardInput::new("", completion, &reference));
        (outcome.score, outcome.outcome)
    }

    #[test]
    fn both_tags_once_in_order_is_full_credit() {
        assert_eq!(
            score("<think>x</think> <answer>1</answer>"),
            (1.0, Outcome::Correct)
        );
    }

    #[test]
    fn a_missing_tag_gives_partial_credit() {
        assert_eq!(score("<think>x</think> 1"), (0.5, Outcome::Partial));
    }

    #[test]
    fn repeated_tags_do_not_count() {
        assert_eq!(
            score("<think>x</think><think>y</think><answer>1</answer>"),
            (0.5, Outcome::Partial)
        );
    }

    #[test]
    fn out_of_order_tags_do_not_count() {
        assert_eq!(
            score("<answer>1</answer><think>x</think>"),
            (0.5, Outcome::Partial)
        );
        assert_eq!(score("</think>x<think>"), (0.0, Outcome::FormatError));
    }
}
