//! Composite reward: a weighted sum of component rewards with correctness gating.
//!
//! One component may be marked `correctness = true`: it is scored first, its verdict becomes
//! the sample's outcome and the `correct` flag every other component sees (length rewards read
//! it), and components with `gate = "when_correct"` / `"when_wrong"` only count when it says so.
//! When any applied component reports a broken record (`UnparseableGold`, `MissingField`) and
//! `skip_on_unparseable_gold` is on, the whole sample takes that outcome with score 0, so the
//! caller excludes it from training rather than teaching the model on a broken gold answer.
//!
//! Config (`kind = "composite"`):
//! ```toml
//! kind = "composite"
//! skip_on_unparseable_gold = true        # default true
//! [[components]]
//! name = "accuracy"                      # default: the component's kind
//! weight = 1.0                           # default 1.0
//! correctness = true                     # default false; at most one component
//! reward = { kind = "math" }
//! [[components]]
//! weight = 0.5
//! gate = "when_correct"                  # "always" (default) | "when_correct" | "when_wrong"
//! reward = { kind = "overlong", max_tokens = 4096, cache_tokens = 512 }
//! ```
//! Weights must be finite; the correctness component's must be >= 0 (other components may be
//! negative: penalty terms). A sum that overflows is reported as 0 (`RewardOutcome::new`).
//! Components are not themselves composite. Every component's value is reported in
//! `details.components`, with `applied` telling whether gating let it count; judge components'
//! figures (`details.judge`) are summed into the sample's.
//!
//! A child of `config.rs` because the two types are recursive: `RewardConfig::Composite` holds
//! component `RewardConfig`s and `Reward::Composite` holds component `Reward`s. Re-exported at
//! the crate root as `stoke_reward::composite`.

use serde::{Deserialize, Serialize};
use stoke_sandbox::Sandbox;

use super::{Reward, RewardConfig};
use crate::error::ConfigError;
use crate::kind::RewardKind;
use crate::reward_model::ScorerSource;
use crate::verifier::{
    ComponentScore, Details, JudgeFigures, Outcome, RewardInput, RewardOutcome, Verifier,
};

/// When a component counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Gate {
    #[default]
    Always,
    WhenCorrect,
    WhenWrong,
}

impl Gate {
    fn applies(self, correct: Option<bool>) -> bool {
        match self {
            Gate::Always => true,
            Gate::WhenCorrect => correct == Some(true),
            Gate::WhenWrong => correct == Some(false),
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ComponentConfig {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    #[serde(default = "default_weight")]
    pub weight: f64,
    #[serde(default)]
    pub gate: Gate,
    #[serde(default)]
    pub correctness: bool,
    pub reward: RewardConfig,
}

fn default_weight() -> f64 {
    1.0
}

fn default_true() -> bool {
    true
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct CompositeConfig {
    pub components: Vec<ComponentConfig>,
    #[serde(default = "default_true")]
    pub skip_on_unparseable_gold: bool,
}

struct Component {
    name: String,
    weight: f64,
    gate: Gate,
    reward: Reward,
}

pub struct CompositeVerifier {
    components: Vec<Component>,
    correctness: Option<usize>,
    skip_on_unparseable_gold: bool,
}

impl CompositeVerifier {
    pub fn new(config: &CompositeConfig, sandbox: Option<Sandbox>) -> Result<Self, ConfigError> {
        Self::new_with(config, sandbox, None)
    }

    /// [`CompositeVerifier::new`] with a source of learned scorers for `reward_model`
    /// components.
    pub fn new_with(
        config: &CompositeConfig,
        sandbox: Option<Sandbox>,
        scorers: Option<&dyn ScorerSource>,
    ) -> Result<Self, ConfigError> {
        if config.components.is_empty() {
            return Err(ConfigError::invalid(
                "components",
                "at least one component is required",
            ));
        }
        let mut components = Vec::new();
        let mut correctness = None;
        for (index, component) in config.components.iter().enumerate() {
            let field = |name: &str| format!("components[{index}].{name}");
            if component.reward.kind() == RewardKind::Composite {
                return Err(ConfigError::invalid(
                    field("reward"),
                    "components cannot be composite",
                ));
            }
            if component.reward.is_dense_process() {
                return Err(ConfigError::invalid(
                    field("reward.dense"),
                    "a dense process_reward shapes the token advantages and must be the run's \
                     only reward, not a composite's component (use dense = false here)",
                ));
            }
            if !component.weight.is_finite() {
                return Err(ConfigError::invalid(field("weight"), "must be finite"));
            }
            if component.correctness {
                if correctness.is_some() {
                    return Err(ConfigError::invalid(
                        field("correctness"),
                        "only one component decides correctness",
                    ));
                }
                if component.weight < 0.0 {
                    return Err(ConfigError::invalid(
                        field("weight"),
                        "the correctness component's weight must be >= 0 (a negative one pays for wrong answers)",
                    ));
                }
                if component.gate != Gate::Always {
                    return Err(ConfigError::invalid(
                        field("gate"),
                        "the correctness component cannot be gated",
                    ));
                }
                correctness = Some(index);
            }
            let reward = component
                .reward
                .build_with(sandbox.clone(), scorers)
                .map_err(|error| match error {
                    ConfigError::Invalid {
                        field: inner,
                        message,
                    } => ConfigError::invalid(field(&format!("reward.{inner}")), message),
                    other => other,
                })?;
            let name = component
                .name
                .clone()
                .unwrap_or_else(|| component.reward.kind().name().to_string());
            components.push(Component {
                name,
                weight: component.weight,
                gate: component.gate,
                reward,
            });
        }
        if correctness.is_none()
            && let Some(index) = components.iter().position(|c| c.gate != Gate::Always)
        {
            return Err(ConfigError::invalid(
                format!("components[{index}].gate"),
                "gating needs a component with `correctness = true`",
            ));
        }
        Ok(Self {
            components,
            correctness,
            skip_on_unparseable_gold: config.skip_on_unparseable_gold,
        })
    }

    pub fn runs_code(&self) -> bool {
        self.components.iter().any(|c| c.reward.runs_code())
    }

    pub fn is_group_level(&self) -> bool {
        self.components.iter().any(|c| c.reward.is_group_level())
    }
}

impl Verifier for CompositeVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        self.score_group(std::slice::from_ref(input)).remove(0)
    }

    fn score_group(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        let correctness_outcomes = self
            .correctness
            .map(|index| self.components[index].reward.score_group(group));
        let inputs: Vec<RewardInput<'_>> = match &correctness_outcomes {
            Some(outcomes) => group
                .iter()
                .zip(outcomes)
                .map(|(input, outcome)| RewardInput {
                    correct: Some(outcome.outcome == Outcome::Correct),
                    ..*input
                })
                .collect(),
            None => group.to_vec(),
        };
        let mut per_component: Vec<Vec<RewardOutcome>> = Vec::with_capacity(self.components.len());
        for (index, component) in self.components.iter().enumerate() {
            match (&correctness_outcomes, self.correctness) {
                (Some(outcomes), Some(correctness)) if correctness == index => {
                    per_component.push(outcomes.clone())
                }
                _ => per_component.push(component.reward.score_group(&inputs)),
            }
        }
        (0..group.len())
            .map(|sample| {
                let correct = inputs[sample].correct;
                let mut total = 0.0;
                let mut problem: Option<Outcome> = None;
                let mut scores = Vec::with_capacity(self.components.len());
                for (component, outcomes) in self.components.iter().zip(&per_component) {
                    let outcome = &outcomes[sample];
                    let applied = component.gate.applies(correct);
                    if applied {
                        total += component.weight * outcome.score;
                        if outcome.outcome.is_dataset_problem()
                            && problem != Some(Outcome::UnparseableGold)
                        {
                            problem = Some(outcome.outcome);
                        }
                    }
                    scores.push(ComponentScore {
                        name: component.name.clone(),
                        weight: component.weight,
                        score: outcome.score,
                        outcome: outcome.outcome,
                        applied,
                    });
                }
                let correctness_details = correctness_outcomes
                    .as_ref()
                    .map(|outcomes| outcomes[sample].details.clone())
                    .unwrap_or_default();
                // Judge components' costs travel up so the run's metrics count them.
                let judge = per_component
                    .iter()
                    .filter_map(|outcomes| outcomes[sample].details.judge)
                    .reduce(JudgeFigures::plus);
                let details = Details {
                    components: scores,
                    judge,
                    ..correctness_details
                };
                match problem {
                    Some(problem) if self.skip_on_unparseable_gold => {
                        RewardOutcome::new(0.0, problem, details)
                    }
                    _ => {
                        let outcome = correctness_outcomes
                            .as_ref()
                            .map_or(Outcome::Shaped, |outcomes| outcomes[sample].outcome);
                        RewardOutcome::new(total, outcome, details)
                    }
                }
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Reference;

    fn composite(toml_like_json: &str) -> CompositeVerifier {
        let config: CompositeConfig = serde_json::from_str(toml_like_json).unwrap();
        CompositeVerifier::new(&config, None).unwrap()
    }

    const GATED: &str = r#"{"components": [
        {"name": "accuracy", "correctness": true, "reward": {"kind": "math"}},
        {"name": "length", "weight": 0.5, "gate": "when_correct",
         "reward": {"kind": "cosine_length", "max_tokens": 100, "correct_at_zero": 1.0, "correct_at_max": 0.0}},
        {"name": "format", "weight": 0.25, "reward": {"kind": "tag_structure", "tags": ["answer"]}}
    ]}"#;

    fn score(
        verifier: &CompositeVerifier,
        gold: &str,
        completion: &str,
        tokens: usize,
    ) -> RewardOutcome {
        let reference = Reference {
            answer: Some(gold.into()),
            ..Reference::default()
        };
        verifier.score(&RewardInput::new("", completion, &reference).with_tokens(tokens))
    }

    #[test]
    fn gated_terms_count_only_when_the_correctness_component_says_so() {
        let verifier = composite(GATED);
        let right = score(&verifier, "4", "<answer>4</answer>", 0);
        // 1 (accuracy) + 0.5 * 1.0 (length at 0 tokens) + 0.25 * 1 (tag present).
        assert!((right.score - 1.75).abs() < 1e-12, "{right:?}");
        assert_eq!(right.outcome, Outcome::Correct);
        let wrong = score(&verifier, "4", "<answer>5</answer>", 0);
        // Length gated off; format still counts.
        assert!((wrong.score - 0.25).abs() < 1e-12, "{wrong:?}");
        assert_eq!(wrong.outcome, Outcome::Wrong);
        let length = &wrong.details.components[1];
        assert_eq!((length.name.as_str(), length.applied), ("length", false));
    }

    #[test]
    fn every_component_value_is_reported() {
        let outcome = score(&composite(GATED), "4", "<answer>4</answer>", 50);
        let names: Vec<&str> = outcome
            .details
            .components
            .iter()
            .map(|c| c.name.as_str())
            .collect();
        assert_eq!(names, ["accuracy", "length", "format"]);
        assert!((outcome.details.components[1].score - 0.5).abs() < 1e-12);
        assert_eq!(outcome.details.extracted.as_deref(), Some("4"));
    }

    #[test]
    fn unparseable_gold_makes_the_whole_sample_unparseable_gold() {
        let outcome = score(&composite(GATED), "\\frac{1}{", "<answer>4</answer>", 0);
        assert_eq!(
            (outcome.score, outcome.outcome),
            (0.0, Outcome::UnparseableGold)
        );
        let keep = composite(&GATED.replacen(
            "{\"components\"",
            "{\"skip_on_unparseable_gold\": false, \"components\"",
            1,
        ));
        let outcome = score(&keep, "\\frac{1}{", "<answer>4</answer>", 0);
        assert_eq!(outcome.outcome, Outcome::UnparseableGold);
        assert!(
            (outcome.score - 0.25).abs() < 1e-12,
            "format term still counts: {outcome:?}"
        );
    }

    #[test]
    fn missing_token_counts_mark_the_sample_as_a_dataset_problem() {
        let verifier = composite(GATED);
        let reference = Reference {
            answer: Some("4".into()),
            ..Reference::default()
        };
        let outcome = verifier.score(&RewardInput::new("", "<answer>4</answer>", &reference));
        assert_eq!(outcome.outcome, Outcome::MissingField);
    }

    #[test]
    fn group_components_see_correctness_from_the_correctness_component() {
        let verifier = composite(
            r#"{"components": [{"correctness": true, "reward": {"kind": "math"}},
                {"reward": {"kind": "group_length"}}]}"#,
        );
        assert!(verifier.is_group_level());
        let reference = Reference {
            answer: Some("4".into()),
            ..Reference::default()
        };
        let group = [
            RewardInput::new("", "\\boxed{4}", &reference).with_tokens(10),
            RewardInput::new("", "\\boxed{4}", &reference).with_tokens(20),
            RewardInput::new("", "\\boxed{5}", &reference).with_tokens(10),
        ];
        let scores: Vec<f64> = verifier
            .score_group(&group)
            .iter()
            .map(|o| o.score)
            .collect();
        assert_eq!(scores, [1.5, 0.5, 0.0]);
    }

    #[test]
    fn invalid_composites_are_rejected_with_the_field() {
        let gate_without_correctness =
            r#"{"components": [{"gate": "when_correct", "reward": {"kind": "repetition"}}]}"#;
        let config: CompositeConfig = serde_json::from_str(gate_without_correctness).unwrap();
        let error = CompositeVerifier::new(&config, None)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("components[0].gate"), "{error}");
        let two = r#"{"components": [{"correctness": true, "reward": {"kind": "math"}},
            {"correctness": true, "reward": {"kind": "math"}}]}"#;
        let config: CompositeConfig = serde_json::from_str(two).unwrap();
        assert!(CompositeVerifier::new(&config, None).is_err());
        let nested_bad = r#"{"components": [{"reward": {"kind": "overlong", "max_tokens": 0}}]}"#;
        let config: CompositeConfig = serde_json::from_str(nested_bad).unwrap();
        let error = CompositeVerifier::new(&config, None)
            .err()
            .unwrap()
            .to_string();
        assert!(error.contains("components[0].reward.max_tokens"), "{error}");
        let code = r#"{"components": [{"reward": {"kind": "unit_tests"}}]}"#;
        let config: CompositeConfig = serde_json::from_str(code).unwrap();
        assert!(
            CompositeVerifier::new(&config, None)
                .err()
                .unwrap()
                .to_string()
                .contains("sandbox")
        );
    }
}
