//! `process_reward`: completions scored step by step by a process reward model (a PRM: a token
//! classifier, as `stoke prm` trains), the step scores aggregated into one outcome reward.
//!
//! What it is: the verifier around a [`StepScorer`] that the caller provides (this crate has no
//! tensor dependency: `stoke grpo` supplies one over a local PRM through
//! [`ScorerSource::step_scorer`], which splits each completion into steps with `stoke prm`'s
//! rule, drops empty steps, scores repeats 0 and reads P(good) of the others). A GRPO group is
//! scored in one call, then each completion's step scores become one score:
//!
//! 1. aggregation ([`Aggregation`]): `min` (default: the weakest step), `last` or `mean`; a
//!    completion without steps scores 0 (the rule of `stoke_train::prm::StepAggregation`);
//! 2. `normalize` and `clip` as for `reward_model` ([`post_process`]). Without them the score is
//!    a probability, in `[0, 1]`.
//!
//! The step scores themselves (each step's bytes in the completion and its P(good)) go into the
//! outcome's `details.steps`, where `dense = true` reads them: the learner then adds the
//! normalized step scores to the token advantages (DeepSeekMath's process supervision, see
//! `stoke_pipeline::dense_process`). Dense use needs this reward to be the run's only reward
//! (checked where the run's rewards are resolved).
//!
//! A scorer that fails fails every sample of the call with `Outcome::ScorerError` (left out of
//! training, never a zero the policy did not earn). Scores are `Outcome::Shaped`.
//!
//! ```toml
//! [rewards.default]
//! kind = "process_reward"
//! model = "runs/prm/model"    # a token classifier with two labels (`stoke prm`'s model/)
//! aggregation = "min"         # or "last", "mean"
//! step_separator = "\n"       # the separator the PRM was trained with (`[prm] step_separator`)
//! normalize = "none"          # or "group"
//! # clip = 5.0
//! dense = false               # true: per-step scores also shape the token advantages
//! ```

use std::sync::Arc;

use crate::error::ConfigError;
pub use crate::learned::{
    Aggregation, Normalize, ProcessRewardConfig, ScoreItem, ScorerSource, StepScorer, post_process,
};
use crate::verifier::{Details, Outcome, RewardInput, RewardOutcome, Verifier};

/// The `process_reward` verifier (see the module doc).
#[derive(Clone)]
pub struct ProcessRewardVerifier {
    scorer: Arc<dyn StepScorer>,
    aggregation: Aggregation,
    normalize: Normalize,
    clip: Option<f64>,
    dense: bool,
}

impl std::fmt::Debug for ProcessRewardVerifier {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ProcessRewardVerifier")
            .field("aggregation", &self.aggregation)
            .field("normalize", &self.normalize)
            .field("clip", &self.clip)
            .field("dense", &self.dense)
            .finish_non_exhaustive()
    }
}

impl ProcessRewardVerifier {
    /// Checks the options; the scorer comes from `source` (none: `ConfigError::NeedsScorer`).
    pub fn new(
        config: &ProcessRewardConfig,
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
        if config.step_separator.is_empty() {
            return Err(ConfigError::invalid(
                "step_separator",
                "must not be empty (the PRM's training separator, \"\\n\" by default)",
            ));
        }
        let source = source.ok_or(ConfigError::NeedsScorer("process_reward"))?;
        let scorer = source
            .step_scorer(config)
            .map_err(|reason| ConfigError::invalid("model", reason))?;
        Ok(
            Self::with_scorer(scorer, config.aggregation, config.normalize, config.clip)
                .with_dense(config.dense),
        )
    }

    /// The same verifier, its step scores meant (or not) for dense advantages.
    pub fn with_dense(mut self, dense: bool) -> Self {
        self.dense = dense;
        self
    }

    /// Whether the learner folds this reward's step scores into the token advantages.
    pub fn is_dense(&self) -> bool {
        self.dense
    }

    /// The verifier over a given scorer.
    pub fn with_scorer(
        scorer: Arc<dyn StepScorer>,
        aggregation: Aggregation,
        normalize: Normalize,
        clip: Option<f64>,
    ) -> Self {
        ProcessRewardVerifier {
            scorer,
            aggregation,
            normalize,
            clip,
            dense: false,
        }
    }
}

impl Verifier for ProcessRewardVerifier {
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
        let fail = |reason: String| {
            group
                .iter()
                .map(|_| RewardOutcome::failed(Outcome::ScorerError, reason.clone()))
                .collect()
        };
        let steps = match self.scorer.score_steps(&items) {
            Ok(steps) if steps.len() == items.len() => steps,
            Ok(steps) => {
                return fail(format!(
                    "the process reward model gave steps for {} sample(s) of {}",
                    steps.len(),
                    items.len()
                ));
            }
            Err(reason) => return fail(reason),
        };
        for (steps, item) in steps.iter().zip(&items) {
            if let Some(bad) = steps.iter().find(|s| {
                !(s.score.is_finite() && s.start <= s.end && s.end <= item.completion.len())
            }) {
                return fail(format!(
                    "the process reward model gave a step {bad:?} that is not finite or not \
                     within the completion's {} bytes",
                    item.completion.len()
                ));
            }
        }
        let raw: Vec<f64> = steps
            .iter()
            .map(|steps| {
                let scores: Vec<f64> = steps.iter().map(|s| s.score).collect();
                self.aggregation.aggregate(&scores)
            })
            .collect();
        post_process(&raw, self.normalize, self.clip)
            .into_iter()
            .zip(raw.iter().zip(steps))
            .map(|(score, (raw, steps))| {
                RewardOutcome::shaped(
                    score,
                    Details {
                        extracted: Some(format!(
                            "process reward {raw:.4} over {} step(s)",
                            steps.len()
                        )),
                        steps: Some(steps),
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
    use crate::verifier::StepScore;

    /// Splits at "\n"; a step scores 0.9, or 0.2 when it contains "bad"; fails on "fail".
    struct Lines;

    impl StepScorer for Lines {
        fn score_steps(&self, items: &[ScoreItem<'_>]) -> Result<Vec<Vec<StepScore>>, String> {
            if items.iter().any(|i| i.completion.contains("fail")) {
                return Err("the PRM is down".into());
            }
            Ok(items
                .iter()
                .map(|item| {
                    let mut start = 0;
                    item.completion
                        .split_inclusive('\n')
                        .map(|piece| {
                            let step = StepScore {
                                start,
                                end: start + piece.len(),
                                score: if piece.contains("bad") { 0.2 } else { 0.9 },
                            };
                            start += piece.len();
                            step
                        })
                        .collect()
                })
                .collect())
        }
    }

    fn outcomes(verifier: &ProcessRewardVerifier, completions: &[&str]) -> Vec<RewardOutcome> {
        let reference = Reference::default();
        let inputs: Vec<RewardInput<'_>> = completions
            .iter()
            .map(|c| RewardInput::new("q", c, &reference))
            .collect();
        verifier.score_group(&inputs)
    }

    #[test]
    fn step_scores_aggregate_into_the_score_and_reach_the_details() {
        let traces = ["a\nbad\nc", "a\nb\n", ""];
        let scores = |aggregation| {
            let verifier = ProcessRewardVerifier::with_scorer(
                Arc::new(Lines),
                aggregation,
                Normalize::None,
                None,
            );
            outcomes(&verifier, &traces)
                .iter()
                .map(|o| o.score)
                .collect::<Vec<f64>>()
        };
        assert_eq!(scores(Aggregation::Min), vec![0.2, 0.9, 0.0]);
        assert_eq!(scores(Aggregation::Last), vec![0.9, 0.9, 0.0]);
        let mean = scores(Aggregation::Mean);
        assert!((mean[0] - 2.0 / 3.0).abs() < 1e-12 && mean[1] == 0.9 && mean[2] == 0.0);

        let verifier = ProcessRewardVerifier::with_scorer(
            Arc::new(Lines),
            Aggregation::Min,
            Normalize::None,
            None,
        );
        let out = outcomes(&verifier, &traces);
        assert_eq!(out[0].outcome, Outcome::Shaped);
        let steps = out[0].details.steps.as_ref().unwrap();
        assert_eq!(
            steps
                .iter()
                .map(|s| (s.start, s.end, s.score))
                .collect::<Vec<_>>(),
            vec![(0, 2, 0.9), (2, 6, 0.2), (6, 7, 0.9)]
        );
        assert_eq!(out[2].details.steps.as_deref(), Some(&[][..]));
        // Group normalization and clipping as reward_model's: [0.2, 0.9] -> [-1, 1], clipped.
        let normalized = ProcessRewardVerifier::with_scorer(
            Arc::new(Lines),
            Aggregation::Min,
            Normalize::Group,
            Some(0.5),
        );
        let got: Vec<f64> = outcomes(&normalized, &traces[..2])
            .iter()
            .map(|o| o.score)
            .collect();
        assert_eq!(got, vec![-0.5, 0.5]);
    }

    #[test]
    fn a_failing_scorer_fails_the_group_without_a_score() {
        let verifier = ProcessRewardVerifier::with_scorer(
            Arc::new(Lines),
            Aggregation::Min,
            Normalize::None,
            None,
        );
        for outcome in outcomes(&verifier, &["ok", "fail"]) {
            assert_eq!(outcome.outcome, Outcome::ScorerError);
            assert_eq!(outcome.score, 0.0);
            assert!(outcome.details.steps.is_none());
            assert_eq!(outcome.details.reason.as_deref(), Some("the PRM is down"));
        }
    }

    #[test]
    fn options_are_checked_and_a_scorer_is_required() {
        let config: ProcessRewardConfig =
            serde_json::from_str(r#"{"model": "prm", "clip": -1.0}"#).unwrap();
        assert_eq!(config.step_separator, "\n");
        assert_eq!(config.aggregation, Aggregation::Min);
        assert!(!config.dense);
        let err = ProcessRewardVerifier::new(&config, None).unwrap_err();
        assert!(err.to_string().contains("clip"), "{err}");
        let empty = ProcessRewardConfig {
            clip: None,
            step_separator: String::new(),
            ..config.clone()
        };
        let err = ProcessRewardVerifier::new(&empty, None).unwrap_err();
        assert!(err.to_string().contains("step_separator"), "{err}");
        let fine = ProcessRewardConfig {
            clip: None,
            ..config
        };
        let err = ProcessRewardVerifier::new(&fine, None).unwrap_err();
        assert!(
            matches!(err, ConfigError::NeedsScorer("process_reward")),
            "{err}"
        );
        assert!(
            serde_json::from_str::<ProcessRewardConfig>(r#"{"model": "p", "agg": "min"}"#).is_err()
        );
    }
}
