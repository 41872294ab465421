//! Format reward: the whole completion must match a regular expression (anchored full match,
//! `.` matching newlines), e.g. `<think>...</think><answer>...</answer>`.
//!
//! Config (`kind = "format_regex"`):
//! - `pattern` (string, default `<think>.*?</think>\s*<answer>.*?</answer>`): the regex, in the
//!   `regex` crate's syntax; it is wrapped as `^(?:pattern)$`, so it must match the whole
//!   completion.
//! - `dot_matches_newline` (bool, default true).
//! - `trim` (bool, default true): ignore leading and trailing whitespace of the completion.
//!
//! Invariant: matching is linear-time in the completion (the `regex` crate has no backtracking);
//! the compiled pattern is bounded by the crate's default size limit.

use regex::{Regex, RegexBuilder};
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::verifier::{Details, Outcome, RewardInput, RewardOutcome, Verifier};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct FormatRegexConfig {
    pub pattern: String,
    pub dot_matches_newline: bool,
    pub trim: bool,
}

impl Default for FormatRegexConfig {
    fn default() -> Self {
        Self {
            pattern: r"<think>.*?</think>\s*<answer>.*?</answer>".to_string(),
            dot_matches_newline: true,
            trim: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct FormatRegexVerifier {
    full_match: Regex,
    trim: bool,
}

impl FormatRegexVerifier {
    pub fn new(config: &FormatRegexConfig) -> Result<Self, ConfigError> {
        let full_match = RegexBuilder::new(&format!("^(?:{})$", config.pattern))
            .dot_matches_new_line(config.dot_matches_newline)
            .build()
            .map_err(|e| ConfigError::invalid("pattern", e.to_string()))?;
        Ok(Self {
            full_match,
            trim: config.trim,
        })
    }
}

impl Verifier for FormatRegexVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let text = if self.trim {
            input.completion.trim()
        } else {
            input.completion
        };
        if self.full_match.is_match(text) {
            RewardOutcome::correct(Details::default())
        } else {
            RewardOutcome::failed(
                Outcome::FormatError,
                "completion does not match the format pattern",
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Reference;

    fn outcome(config: &FormatRegexConfig, completion: &str) -> Outcome {
        let reference = Reference::default();
        FormatRegexVerifier::new(config)
            .unwrap()
            .score(&RewardInput::new("", completion, &reference))
            .outcome
    }

    #[test]
    fn think_answer_format_matches_across_lines() {
        let config = FormatRegexConfig::default();
        assert_eq!(
            outcome(&config, "<think>a\nb</think>\n<answer>4</answer>\n"),
            Outcome::Correct
        );
    }

    #[test]
    fn match_is_anchored_at_both_ends() {
        let config = FormatRegexConfig::default();
        assert_eq!(
            outcome(&config, "preamble <think>a</think><answer>4</answer>"),
            Outcome::FormatError
        );
        assert_eq!(
            outcome(&config, "<think>a</think><answer>4</answer> trailing"),
            Outcome::FormatError
        );
        assert_eq!(outcome(&config, "<answer>4</answer>"), Outcome::FormatError);
    }

    #[test]
    fn dot_newline_flag_is_honoured() {
        let config = FormatRegexConfig {
            dot_matches_newline: false,
            ..FormatRegexConfig::default()
        };
        assert_eq!(
            outcome(&config, "<think>a\nb</think><answer>4</answer>"),
            Outcome::FormatError
        );
    }

    #[test]
    fn invalid_pattern_names_the_field() {
        let config = FormatRegexConfig {
            pattern: "(".into(),
            ..FormatRegexConfig::default()
        };
        let error = FormatRegexVerifier::new(&config).unwrap_err().to_string();
        assert!(error.contains("`pattern`"), "{error}");
    }
}
