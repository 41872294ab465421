//! N-gram repetition penalty: `(1 - unique_ngrams / total_ngrams) * max_penalty` over the
//! completion's whitespace-separated words (the "repetition penalty" reward of open-r1 and
//! Demystifying Long CoT).
//!
//! Config (`kind = "repetition"`):
//! - `ngram_size` (default 3, >= 1).
//! - `max_penalty` (default -1.0, <= 0): the value when every n-gram is a repeat.
//! - `max_words` (default 100000): only the first `max_words` words are read (bounds the work).
//!
//! A completion shorter than one n-gram scores 0. The outcome is `Shaped`.

use std::collections::HashSet;
use std::hash::{DefaultHasher, Hash, Hasher};

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::verifier::{Details, RewardInput, RewardOutcome, Verifier};

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RepetitionConfig {
    pub ngram_size: usize,
    pub max_penalty: f64,
    pub max_words: usize,
}

impl Default for RepetitionConfig {
    fn default() -> Self {
        Self {
            ngram_size: 3,
            max_penalty: -1.0,
            max_words: 100_000,
        }
    }
}

#[derive(Debug, Clone)]
pub struct RepetitionVerifier {
    config: RepetitionConfig,
}

impl RepetitionVerifier {
    pub fn new(config: &RepetitionConfig) -> Result<Self, ConfigError> {
        if config.ngram_size == 0 || config.ngram_size > 64 {
            return Err(ConfigError::invalid("ngram_size", "must be in 1..=64"));
        }
        if !(config.max_penalty <= 0.0 && config.max_penalty.is_finite()) {
            return Err(ConfigError::invalid(
                "max_penalty",
                "must be a finite value <= 0",
            ));
        }
        if config.max_words == 0 {
            return Err(ConfigError::invalid("max_words", "must be > 0"));
        }
        Ok(Self {
            config: config.clone(),
        })
    }

    /// Fraction of n-grams that repeat an earlier one.
    pub fn repeated_fraction(&self, text: &str) -> f64 {
        let words: Vec<&str> = text
            .split_whitespace()
            .take(self.config.max_words)
            .collect();
        let n = self.config.ngram_size;
        if words.len() < n {
            return 0.0;
        }
        let total = words.len() - n + 1;
        // N-grams are hashed rather than stored; a 64-bit collision among at most 100k n-grams
        // is negligible next to the penalty's own noise.
        let unique: HashSet<u64> = words
            .windows(n)
            .map(|gram| {
                let mut hasher = DefaultHasher::new();
                gram.hash(&mut hasher);
                hasher.finish()
            })
            .collect();
        1.0 - unique.len() as f64 / total as f64
    }
}

impl Verifier for RepetitionVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let fraction = self.repeated_fraction(input.completion);
        let details = Details {
            reason: Some(format!(
                "{:.3} of {}-grams repeated",
                fraction, self.config.ngram_size
            )),
            ..Details::default()
        };
        RewardOutcome::shaped(fraction * self.config.max_penalty, details)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verifier(ngram_size: usize) -> RepetitionVerifier {
        RepetitionVerifier::new(&RepetitionConfig {
            ngram_size,
            ..RepetitionConfig::default()
        })
        .unwrap()
    }

    #[test]
    fn text_without_repeats_has_no_penalty() {
        assert_eq!(verifier(2).repeated_fraction("a b c d e"), 0.0);
        assert_eq!(verifier(3).repeated_fraction("too short"), 0.0);
    }

    #[test]
    fn looping_text_is_penalized_by_its_repeated_fraction() {
        // "a b a b a b": bigrams ab ba ab ba ab -> 2 unique of 5.
        assert!((verifier(2).repeated_fraction("a b a b a b") - 0.6).abs() < 1e-12);
        let looping = "the cat sat ".repeat(100);
        assert!(verifier(3).repeated_fraction(&looping) > 0.95);
    }
}
