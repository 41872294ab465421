//! `reward_model`: completions scored by a learned reward model (a sequence classifier, as
//! `stoke rm` trains), the reward of open-ended tasks that no verifier can check.
//!
//! What it is: the verifier around a [`SequenceScorer`] that the caller provides (this crate has
//! no tensor dependency: `stoke grpo` supplies a scorer over a local model through
//! [`ScorerSource`]). A GRPO group is scored in one call (one batch for the model), then each
//! score goes through the configured post-processing, in this order:
//!
//! 1. `normalize = "group"`: `(s - mean) / (std + 1e-6)` over the group's scores (population
//!    std; a group of one, or of equal scores, gives 0 for every sample). `"none"` (default):
//!    the raw scores. GRPO normalizes advantages by group anyway; this matters where rewards are
//!    mixed (a composite with a verifier) so the reward model's scale does not swamp the rest.
//! 2. `clip = c`: the score is clamped to `[-c, c]` (reward models extrapolate badly far from
//!    their data; clipping bounds what one outlier can do to a group).
//!
//! A scorer that fails (the model cannot be run, a server that does not answer) fails every
//! sample of the call with `Outcome::ScorerError` and the scorer's message: the samples are
//! left out of training, never given a zero the policy did not earn. Scores are `Outcome::Shaped`
//! (a value, not a verdict).
//!
//! ```toml
//! [rewards.helpful]
//! kind = "reward_model"
//! model = "runs/rm/model"     # a *ForSequenceClassification folder with tokenizer files
//! normalize = "group"         # or "none" (default)
//! clip = 5.0                  # optional
//! # url = "http://rm-host:8001"   # optional: scored by `stoke serve --task reward` (or vLLM)
//! # served_model = "rm"           # the name it serves under (default: its first model)
//! # timeout_s = 120
//! ```
//!
//! With `url`, the ids are still made here (the model folder's tokenizer and chat template, the
//! rule `stoke rm` trains with) and sent as token ids, so a served model scores exactly what the
//! same model scores in process.

use std::sync::Arc;

use crate::error::ConfigError;
pub use crate::learned::{
    Normalize, RewardModelConfig, ScoreItem, ScorerSource, SequenceScorer, post_process,
};
use crate::verifier::{Details, Outcome, RewardInput, RewardOutcome, Verifier};

/// The `reward_model` verifier (see the module doc).
#[derive(Clone)]
pub struct RewardModelVerifier {
    scorer: Arc<dyn SequenceScorer>,
    normalize: Normalize,
    clip: Option<f64>,
}

impl std::fmt::Debug for RewardModelVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RewardModelVerifier")
            .field("normalize", &self.normalize)
            .field("clip", &self.clip)
            .finish_non_exhaustive()
    }
}

impl RewardModelVerifier {
    /// Checks the options; the scorer comes from `source` (none: `ConfigError::NeedsScorer`).
    pub fn new(
        config: &RewardModelConfig,
        source: Option<&dyn ScorerSource>,
    ) -> Result<Self, ConfigError> {
        if let Some(clip) = config.clip
            && !(clip.is_finite() && clip > 0.0)
        {
            return Err(ConfigError::invalid(
                "clip",
                format!("must be a finite number > 0, got {clip}"),
            ));
        }
        if !(config.timeout_s.is_finite() && config.timeout_s > 0.0) {
            return Err(ConfigError::invalid(
                "timeout_s",
                format!("must be a number of seconds > 0, got {}", config.timeout_s),
            ));
        }
        if let Some(url) = &config.url
            && !(url.starts_with("http://") || url.starts_with("https://"))
        {
            return Err(ConfigError::invalid(
                "url",
                format!("{url:?} is not an http:// or https:// address"),
            ));
        }
        let source = source.ok_or(ConfigError::NeedsScorer("reward_model"))?;
        let scorer = source
            .scorer(config)
            .map_err(|reason| ConfigError::invalid("model", reason))?;
        Ok(Self::with_scorer(scorer, config.normalize, config.clip))
    }

    /// The verifier over a given scorer.
    pub fn with_scorer(
        scorer: Arc<dyn SequenceScorer>,
        normalize: Normalize,
        clip: Option<f64>,
    ) -> Self {
        RewardModelVerifier {
            scorer,
            normalize,
            clip,
        }
    }
}

impl Verifier for RewardModelVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        self.score_group(std::slice::from_ref(input))
            .pop()
            .unwrap_or_else(|| RewardOutcome::failed(Outcome::ScorerError, "no score"))
    }

    fn score_group(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        let items: Vec<ScoreItem<'_>> = group
            .iter()
            .map(|input| ScoreItem {
                prompt: input.prompt,
                completion: input.completion,
            })
            .collect();
        let raw = match self.scorer.score(&items) {
            Ok(raw) if raw.len() == items.len() && raw.iter().all(|s| s.is_finite()) => raw,
            Ok(raw) => {
                let reason = format!(
                    "the reward model gave {} score(s) for {} sample(s), or a non-finite one",
                    raw.len(),
                    items.len()
                );
                return group
                    .iter()
                    .map(|_| RewardOutcome::failed(Outcome::ScorerError, reason.clone()))
                    .collect();
            }
            Err(reason) => {
                return group
                    .iter()
                    .map(|_| RewardOutcome::failed(Outcome::ScorerError, reason.clone()))
                    .collect();
            }
        };
        post_process(&raw, self.normalize, self.clip)
            .into_iter()
            .zip(&raw)
            .map(|(score, raw)| {
                RewardOutcome::shaped(
                    score,
                    Details {
                        extracted: Some(format!("reward model score {raw:.4}")),
                        ..Details::default()
                    },
                )
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Reference;

    /// Scores a completion by its length; fails on the word "fail".
    struct Lengths;

    impl SequenceScorer for Lengths {
        fn score(&self, items: &[ScoreItem<'_>]) -> Result<Vec<f64>, String> {
            if items.iter().any(|i| i.completion.contains("fail")) {
                return Err("the model is down".into());
            }
            Ok(items.iter().map(|i| i.completion.len() as f64).collect())
        }
    }

    fn scores(verifier: &RewardModelVerifier, completions: &[&str]) -> Vec<RewardOutcome> {
        let reference = Reference::default();
        let inputs: Vec<RewardInput<'_>> = completions
            .iter()
            .map(|c| RewardInput::new("q", c, &reference))
            .collect();
        verifier.score_group(&inputs)
    }

    #[test]
    fn raw_normalized_and_clipped_scores_are_the_hand_values() {
        let raw = RewardModelVerifier::with_scorer(Arc::new(Lengths), Normalize::None, None);
        let got: Vec<f64> = scores(&raw, &["a", "abc"])
            .iter()
            .map(|o| o.score)
            .collect();
        assert_eq!(got, vec![1.0, 3.0]);
        assert!(scores(&raw, &["a"])[0].outcome == Outcome::Shaped);
        // Mean 2, std 1: (1 - 2) / 1 and (3 - 2) / 1, up to the 1e-6 guard.
        let group = RewardModelVerifier::with_scorer(Arc::new(Lengths), Normalize::Group, None);
        let got: Vec<f64> = scores(&group, &["a", "abc"])
            .iter()
            .map(|o| o.score)
            .collect();
        assert!(
            (got[0] + 1.0).abs() < 1e-5 && (got[1] - 1.0).abs() < 1e-5,
            "{got:?}"
        );
        // Equal scores normalize to 0, not NaN.
        let same: Vec<f64> = scores(&group, &["ab", "cd"])
            .iter()
            .map(|o| o.score)
            .collect();
        assert_eq!(same, vec![0.0, 0.0]);
        let clipped =
            RewardModelVerifier::with_scorer(Arc::new(Lengths), Normalize::None, Some(2.5));
        let got: Vec<f64> = scores(&clipped, &["a", "abcdef"])
            .iter()
            .map(|o| o.score)
            .collect();
        assert_eq!(got, vec![1.0, 2.5]);
        assert_eq!(
            post_process(&[-9.0], Normalize::None, Some(2.0)),
            vec![-2.0]
        );
    }

    #[test]
    fn a_failing_scorer_fails_the_group_without_a_score() {
        let verifier = RewardModelVerifier::with_scorer(Arc::new(Lengths), Normalize::Group, None);
        let out = scores(&verifier, &["ok", "fail"]);
        assert_eq!(out.len(), 2);
        for outcome in &out {
            assert_eq!(outcome.outcome, Outcome::ScorerError);
            assert_eq!(outcome.score, 0.0);
            assert!(outcome.outcome.is_dataset_problem(), "left out of training");
            assert_eq!(outcome.details.reason.as_deref(), Some("the model is down"));
        }
    }

    #[test]
    fn options_are_checked_and_a_scorer_is_required() {
        let config = RewardModelConfig {
            model: "rm".into(),
            url: None,
            served_model: None,
            timeout_s: 120.0,
            normalize: Normalize::None,
            clip: Some(0.0),
        };
        let err = RewardModelVerifier::new(&config, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("clip"), "{err}");
        let config = RewardModelConfig {
            clip: None,
            ..config
        };
        let err = RewardModelVerifier::new(&config, None).unwrap_err();
        assert!(
            matches!(err, ConfigError::NeedsScorer("reward_model")),
            "{err}"
        );
        let bad_url = RewardModelConfig {
            url: Some("rm-host:8001".into()),
            ..config.clone()
        };
        let err = RewardModelVerifier::new(&bad_url, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("url"), "{err}");
        let bad_timeout = RewardModelConfig {
            timeout_s: 0.0,
            ..config
        };
        let err = RewardModelVerifier::new(&bad_timeout, None)
            .unwrap_err()
            .to_string();
        assert!(err.contains("timeout_s"), "{err}");
    }
}
