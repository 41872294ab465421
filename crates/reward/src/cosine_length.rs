//! Cosine-scaled length reward (Yeo et al. 2025, "Demystifying Long Chain-of-Thought Reasoning
//! in LLMs"): a correct answer earns more the shorter it is, a wrong answer is penalized less the
//! longer it is (encouraging more thinking when wrong), and running past the limit is penalized.
//!
//! `CosFn(L, L_max, at_max, at_zero) = at_max + 0.5 (at_zero - at_max) (1 + cos(pi L / L_max))`,
//! with separate `(at_zero, at_max)` pairs for correct and wrong answers, and `exceed_score` when
//! `L >= L_max`.
//!
//! Config (`kind = "cosine_length"`; defaults are the paper's):
//! - `max_tokens` (required, > 0): `L_max`.
//! - `correct_at_zero` (2.0), `correct_at_max` (1.0): the correct-answer range.
//! - `wrong_at_zero` (-10.0), `wrong_at_max` (0.0): the wrong-answer range.
//! - `exceed_score` (-10.0).
//!
//! Reads `completion_tokens` and `correct`.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::verifier::{Details, RewardInput, RewardOutcome, Verifier};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CosineLengthConfig {
    pub max_tokens: usize,
    #[serde(default = "defaults::correct_at_zero")]
    pub correct_at_zero: f64,
    #[serde(default = "defaults::correct_at_max")]
    pub correct_at_max: f64,
    #[serde(default = "defaults::wrong_at_zero")]
    pub wrong_at_zero: f64,
    #[serde(default = "defaults::wrong_at_max")]
    pub wrong_at_max: f64,
    #[serde(default = "defaults::exceed_score")]
    pub exceed_score: f64,
}

mod defaults {
    pub fn correct_at_zero() -> f64 {
        2.0
    }
    pub fn correct_at_max() -> f64 {
        1.0
    }
    pub fn wrong_at_zero() -> f64 {
        -10.0
    }
    pub fn wrong_at_max() -> f64 {
        0.0
    }
    pub fn exceed_score() -> f64 {
        -10.0
    }
}

impl CosineLengthConfig {
    /// The paper's values with this `max_tokens`.
    pub fn with_max_tokens(max_tokens: usize) -> Self {
        Self {
            max_tokens,
            correct_at_zero: defaults::correct_at_zero(),
            correct_at_max: defaults::correct_at_max(),
            wrong_at_zero: defaults::wrong_at_zero(),
            wrong_at_max: defaults::wrong_at_max(),
            exceed_score: defaults::exceed_score(),
        }
    }
}

#[derive(Debug, Clone)]
pub struct CosineLengthVerifier {
    config: CosineLengthConfig,
}

impl CosineLengthVerifier {
    pub fn new(config: &CosineLengthConfig) -> Result<Self, ConfigError> {
        if config.max_tokens == 0 {
            return Err(ConfigError::invalid("max_tokens", "must be > 0"));
        }
        let values = [
            ("correct_at_zero", config.correct_at_zero),
            ("correct_at_max", config.correct_at_max),
            ("wrong_at_zero", config.wrong_at_zero),
            ("wrong_at_max", config.wrong_at_max),
            ("exceed_score", config.exceed_score),
        ];
        if let Some((field, _)) = values.iter().find(|(_, v)| !v.is_finite()) {
            return Err(ConfigError::invalid(*field, "must be finite"));
        }
        Ok(Self {
            config: config.clone(),
        })
    }

    /// The reward for a completion of `tokens` tokens.
    pub fn value(&self, tokens: usize, correct: bool) -> f64 {
        let c = &self.config;
        if tokens >= c.max_tokens {
            return c.exceed_score;
        }
        let (at_zero, at_max) = if correct {
            (c.correct_at_zero, c.correct_at_max)
        } else {
            (c.wrong_at_zero, c.wrong_at_max)
        };
        let progress = std::f64::consts::PI * tokens as f64 / c.max_tokens as f64;
        at_max + 0.5 * (at_zero - at_max) * (1.0 + progress.cos())
    }
}

impl Verifier for CosineLengthVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let Some(tokens) = input.completion_tokens else {
            return RewardOutcome::missing("completion_tokens");
        };
        let Some(correct) = input.correct else {
            return RewardOutcome::missing("correct");
        };
        RewardOutcome::shaped(self.value(tokens, correct), Details::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn endpoints_match_the_configured_ranges() {
        let verifier =
            CosineLengthVerifier::new(&CosineLengthConfig::with_max_tokens(1000)).unwrap();
        assert!((verifier.value(0, true) - 2.0).abs() < 1e-12);
        assert!((verifier.value(500, true) - 1.5).abs() < 1e-12);
        assert!((verifier.value(999, true) - 1.0).abs() < 1e-4);
        assert!((verifier.value(0, false) + 10.0).abs() < 1e-12);
        assert!((verifier.value(500, false) + 5.0).abs() < 1e-12);
        assert_eq!(verifier.value(1000, true), -10.0);
    }

    #[test]
    fn correct_reward_falls_and_wrong_penalty_shrinks_with_length() {
        let verifier =
            CosineLengthVerifier::new(&CosineLengthConfig::with_max_tokens(1000)).unwrap();
        assert!(verifier.value(100, true) > verifier.value(800, true));
        assert!(verifier.value(100, false) < verifier.value(800, false));
    }
}
