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
//! Components are not themselves composite. Every component's value is reported in
//! `details.components`, with `applied` telling whether gating let it count.

use serde::{Deserialize, Serialize};
use stoke_sandbox::Sandbox;

use crate::config::{ConfigError, Reward, RewardConfig, RewardKind};
use crate::verifier::{ComponentScore, Details, Outcome, RewardInput, RewardOutcome, Verifier};

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
                .build(sandbox.clone())
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
                let details = Details {
                    components: scores,
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
