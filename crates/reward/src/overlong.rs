//! Length penalties in tokens: DAPO's soft overlong punishment and a hard cap.
//!
//! Soft (DAPO, Yu et al. 2025): with `L_max = max_tokens` and `L_cache = cache_tokens`, a
//! completion of `L` tokens scores 0 when `L <= L_max - L_cache`, `((L_max - L_cache) - L) /
//! L_cache` (linear from 0 down to -1) when `L_max - L_cache < L <= L_max`, and -1 beyond `L_max`.
//! Hard: above `hard_cap_tokens` the score is `hard_cap_score` whatever the soft term says.
//!
//! Config (`kind = "overlong"`):
//! - `max_tokens` (required, > 0): `L_max`.
//! - `cache_tokens` (default 0, <= max_tokens): `L_cache`; 0 makes the soft term a step at
//!   `L_max`.
//! - `hard_cap_tokens` (optional): the hard cap.
//! - `hard_cap_score` (f64, default -1).
//!
//! Reads `completion_tokens` (the reward crate has no tokenizer); without it the outcome is
//! `MissingField`. The outcome is `Shaped`: a length term carries no verdict.

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::verifier::{Details, RewardInput, RewardOutcome, Verifier};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OverlongConfig {
    pub max_tokens: usize,
    #[serde(default)]
    pub cache_tokens: usize,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub hard_cap_tokens: Option<usize>,
    #[serde(default = "default_hard_cap_score")]
    pub hard_cap_score: f64,
}

fn default_hard_cap_score() -> f64 {
    -1.0
}

#[derive(Debug, Clone)]
pub struct OverlongVerifier {
    max_tokens: usize,
    cache_tokens: usize,
    hard_cap_tokens: Option<usize>,
    hard_cap_score: f64,
}

impl OverlongVerifier {
    pub fn new(config: &OverlongConfig) -> Result<Self, ConfigError> {
        if config.max_tokens == 0 {
            return Err(ConfigError::invalid("max_tokens", "must be > 0"));
        }
        if config.cache_tokens > config.max_tokens {
            return Err(ConfigError::invalid(
                "cache_tokens",
                "must be <= max_tokens",
            ));
        }
        if config.hard_cap_tokens == Some(0) {
            return Err(ConfigError::invalid("hard_cap_tokens", "must be > 0"));
        }
        if !config.hard_cap_score.is_finite() {
            return Err(ConfigError::invalid("hard_cap_score", "must be finite"));
        }
        Ok(Self {
            max_tokens: config.max_tokens,
            cache_tokens: config.cache_tokens,
            hard_cap_tokens: config.hard_cap_tokens,
            hard_cap_score: config.hard_cap_score,
        })
    }

    /// The penalty for a completion of `tokens` tokens.
    pub fn penalty(&self, tokens: usize) -> f64 {
        if self.hard_cap_tokens.is_some_and(|cap| tokens > cap) {
            return self.hard_cap_score;
        }
        let free = self.max_tokens - self.cache_tokens;
        if tokens <= free {
            0.0
        } else if tokens <= self.max_tokens {
            (free as f64 - tokens as f64) / self.cache_tokens as f64
        } else {
            -1.0
        }
    }
}

impl Verifier for OverlongVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let Some(tokens) = input.completion_tokens else {
            return RewardOutcome::missing("completion_tokens");
        };
        RewardOutcome::shaped(self.penalty(tokens), Details::default())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier(cache_tokens: usize, hard_cap_tokens: Option<usize>) -> OverlongVerifier {
        OverlongVerifier::new(&OverlongConfig {
            max_tokens: 100,
            cache_tokens,
            hard_cap_tokens,
            hard_cap_score: -2.0,
        })
        .unwrap()
    }

    #[test]
    fn soft_penalty_is_zero_then_linear_then_minus_one() {
        let soft = verifier(20, None);
        assert_eq!(soft.penalty(80), 0.0);
        assert!((soft.penalty(90) + 0.5).abs() < 1e-12);
        assert!((soft.penalty(100) + 1.0).abs() < 1e-12);
        assert_eq!(soft.penalty(101), -1.0);
    }

    #[test]
    fn hard_cap_overrides_soft_term() {
        let capped = verifier(20, Some(95));
        assert!((capped.penalty(95) + 0.75).abs() < 1e-12);
        assert_eq!(capped.penalty(96), -2.0);
    }

    #[test]
    fn zero_cache_is_a_step() {
        let step = verifier(0, None);
        assert_eq!(step.penalty(100), 0.0);
        assert_eq!(step.penalty(101), -1.0);
    }

    #[test]
    fn cache_larger_than_max_is_rejected() {
        let config = OverlongConfig {
            max_tokens: 10,
            cache_tokens: 11,
            hard_cap_tokens: None,
            hard_cap_score: -1.0,
        };
        assert!(
            OverlongVerifier::new(&config)
                .unwrap_err()
                .to_string()
                .contains("cache_tokens")
        );
    }
}
