//! Group length reward (Kimi k1.5, 2025): within a group of completions of one prompt, with
//! `lambda = 0.5 - (len - min_len) / (max_len - min_len)`, a correct completion scores `lambda`
//! and a wrong one `min(0, lambda)`: short correct answers are rewarded, long wrong ones
//! penalized, and a short wrong answer never gains. All lengths equal gives 0.
//!
//! Config (`kind = "group_length"`):
//! - `length_unit`: `"tokens"` (default; reads `completion_tokens`) or `"chars"` (the
//!   completion's character count, for data without token counts).
//!
//! Reads `correct` (set by a composite's correctness component or supplied with the sample);
//! a sample without it is `MissingField`. This reward is group-level: `score` alone sees a
//! group of one and returns 0; use `score_group`.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::verifier::{Details, RewardInput, RewardOutcome, Verifier};

/// What a completion's length is measured in.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LengthUnit {
    #[default]
    Tokens,
    Chars,
}

impl LengthUnit {
    /// The completion's length, or the name of the missing field.
    pub fn length(self, input: &RewardInput<'_>) -> Result<usize, &'static str> {
        match self {
            LengthUnit::Tokens => input.completion_tokens.ok_or("completion_tokens"),
            LengthUnit::Chars => Ok(input.completion.chars().count()),
        }
    }
}

#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GroupLengthConfig {
    pub length_unit: LengthUnit,
}

#[derive(Debug, Clone)]
pub struct GroupLengthVerifier {
    length_unit: LengthUnit,
}

impl GroupLengthVerifier {
    pub fn new(config: &GroupLengthConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            length_unit: config.length_unit,
        })
    }
}

/// Kimi's `lambda` for one length within `[min_len, max_len]`.
pub fn length_lambda(len: usize, min_len: usize, max_len: usize) -> f64 {
    if max_len == min_len {
        return 0.0;
    }
    0.5 - (len - min_len) as f64 / (max_len - min_len) as f64
}

impl Verifier for GroupLengthVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        self.score_group(std::slice::from_ref(input)).remove(0)
    }

    fn score_group(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        let lengths: Vec<Result<usize, &str>> = group
            .iter()
            .map(|input| self.length_unit.length(input))
            .collect();
        let known: Vec<usize> = lengths
            .iter()
            .filter_map(|l| l.as_ref().ok().copied())
            .collect();
        let min_len = known.iter().copied().min().unwrap_or(0);
        let max_len = known.iter().copied().max().unwrap_or(0);
        group
            .iter()
            .zip(&lengths)
            .map(|(input, length)| {
                let length = match length {
                    Ok(length) => *length,
                    Err(field) => return RewardOutcome::missing(field),
                };
                let Some(correct) = input.correct else {
                    return RewardOutcome::missing("correct");
                };
                let lambda = length_lambda(length, min_len, max_len);
                let score = if correct { lambda } else { lambda.min(0.0) };
                let details = Details {
                    reason: Some(format!(
                        "length {length} in group range [{min_len}, {max_len}]"
                    )),
                    ..Details::default()
                };
                RewardOutcome::shaped(score, details)
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Reference;

    #[test]
    fn kimi_formula_rewards_short_correct_and_penalizes_long_wrong() {
        let reference = Reference::default();
        let verifier = GroupLengthVerifier::new(&GroupLengthConfig::default()).unwrap();
        let group = [
            RewardInput::new("", "", &reference)
                .with_tokens(10)
                .with_correct(true),
            RewardInput::new("", "", &reference)
                .with_tokens(30)
                .with_correct(true),
            RewardInput::new("", "", &reference)
                .with_tokens(10)
                .with_correct(false),
            RewardInput::new("", "", &reference)
                .with_tokens(20)
                .with_correct(false),
        ];
        let scores: Vec<f64> = verifier
            .score_group(&group)
            .iter()
            .map(|o| o.score)
            .collect();
        assert_eq!(scores, vec![0.5, -0.5, 0.0, 0.0]);
        let long_wrong = [group[0], group[3].with_tokens(30)];
        let scores: Vec<f64> = verifier
            .score_group(&long_wrong)
            .iter()
            .map(|o| o.score)
            .collect();
        assert_eq!(scores, vec![0.5, -0.5]);
    }

    #[test]
    fn equal_lengths_score_zero_and_missing_correctness_is_reported() {
        let reference = Reference::default();
        let verifier = GroupLengthVerifier::new(&GroupLengthConfig::default()).unwrap();
        let group = [
            RewardInput::new("", "", &reference)
                .with_tokens(5)
                .with_correct(true),
            RewardInput::new("", "", &reference).with_tokens(5),
        ];
        let outcomes = verifier.score_group(&group);
        assert_eq!(outcomes[0].score, 0.0);
        assert_eq!(outcomes[1].outcome, crate::Outcome::MissingField);
    }
}
