//! The closed set of reward kinds: `RewardConfig` (file format: a serde enum tagged by `kind`,
//! one options struct per kind, unknown keys rejected), `RewardKind` (the bare name, for
//! `stoke verify --reward KIND`) and `Reward` (the validated runtime verifier). This is the one
//! place that matches on the kind.
//!
//! What this is not: a plugin registry. Adding a reward kind means adding a variant here, one in
//! `RewardKind` (`kind.rs`) and a file for it; the compiler then lists every match to update.
//! `ConfigError` (`error.rs`) and `RewardKind` are re-exported here, where they were first
//! defined. The composite kind is the child module `composite`: its config and verifier hold
//! `RewardConfig`s and `Reward`s, so it and this module name each other.
//!
//! Invariants: `RewardConfig::build` validates every field (ranges, regexes, schemas that need
//! no input) and fails with the field's name; a built `Reward` never fails on configuration.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::str::FromStr;
use stoke_sandbox::Sandbox;

pub mod composite;

pub use crate::error::ConfigError;
pub use crate::kind::RewardKind;
use composite::{CompositeConfig, CompositeVerifier};

use crate::cosine_length::{CosineLengthConfig, CosineLengthVerifier};
use crate::exact_match::{ExactMatchConfig, ExactMatchVerifier};
use crate::format_regex::{FormatRegexConfig, FormatRegexVerifier};
use crate::group_length::{GroupLengthConfig, GroupLengthVerifier};
use crate::instructions::{InstructionsConfig, InstructionsVerifier};
use crate::json_schema::{JsonSchemaConfig, JsonSchemaVerifier};
use crate::judge::{JudgeConfig, JudgeVerifier};
use crate::math::{MathConfig, MathVerifier};
use crate::overlong::{OverlongConfig, OverlongVerifier};
use crate::process_reward::{ProcessRewardConfig, ProcessRewardVerifier};
use crate::repetition::{RepetitionConfig, RepetitionVerifier};
use crate::reward_model::{RewardModelConfig, RewardModelVerifier, ScorerSource};
use crate::stdio_tests::{StdioTestsConfig, StdioTestsVerifier};
use crate::tag_structure::{TagStructureConfig, TagStructureVerifier};
use crate::unit_tests::{UnitTestsConfig, UnitTestsVerifier};
use crate::verifier::{RewardInput, RewardOutcome, Verifier};

/// File format of a reward: `kind = "math"` plus that kind's options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum RewardConfig {
    Math(MathConfig),
    ExactMatch(ExactMatchConfig),
    UnitTests(UnitTestsConfig),
    StdioTests(StdioTestsConfig),
    FormatRegex(FormatRegexConfig),
    TagStructure(TagStructureConfig),
    JsonSchema(JsonSchemaConfig),
    Overlong(OverlongConfig),
    GroupLength(GroupLengthConfig),
    CosineLength(CosineLengthConfig),
    Repetition(RepetitionConfig),
    Instructions(InstructionsConfig),
    Composite(CompositeConfig),
    RewardModel(RewardModelConfig),
    ProcessReward(ProcessRewardConfig),
    Judge(JudgeConfig),
}

/// Parsing a kind's name (`stoke verify --reward KIND`) sits here rather than in `kind.rs`
/// because its error, `ConfigError::UnknownKind`, lists the kinds and so sits above `kind.rs`.
impl FromStr for RewardKind {
    type Err = ConfigError;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        let normalized = text.trim().replace('-', "_");
        Self::ALL
            .into_iter()
            .find(|kind| kind.name() == normalized)
            .ok_or_else(|| ConfigError::UnknownKind(text.to_string()))
    }
}

impl RewardConfig {
    pub fn kind(&self) -> RewardKind {
        match self {
            Self::Math(_) => RewardKind::Math,
            Self::ExactMatch(_) => RewardKind::ExactMatch,
            Self::UnitTests(_) => RewardKind::UnitTests,
            Self::StdioTests(_) => RewardKind::StdioTests,
            Self::FormatRegex(_) => RewardKind::FormatRegex,
            Self::TagStructure(_) => RewardKind::TagStructure,
            Self::JsonSchema(_) => RewardKind::JsonSchema,
            Self::Overlong(_) => RewardKind::Overlong,
            Self::GroupLength(_) => RewardKind::GroupLength,
            Self::CosineLength(_) => RewardKind::CosineLength,
            Self::Repetition(_) => RewardKind::Repetition,
            Self::Instructions(_) => RewardKind::Instructions,
            Self::Composite(_) => RewardKind::Composite,
            Self::RewardModel(_) => RewardKind::RewardModel,
            Self::ProcessReward(_) => RewardKind::ProcessReward,
            Self::Judge(_) => RewardKind::Judge,
        }
    }

    /// True for a `process_reward` reward with `dense = true` (at the top level: a composite's
    /// components feed only its total).
    pub fn is_dense_process(&self) -> bool {
        matches!(self, Self::ProcessReward(c) if c.dense)
    }

    /// True when this reward (or any component of it) runs code.
    pub fn runs_code(&self) -> bool {
        match self {
            Self::Composite(composite) => composite.components.iter().any(|c| c.reward.runs_code()),
            other => other.kind().runs_code(),
        }
    }

    /// Validates the options and builds the verifier. Code rewards need `sandbox`; a
    /// `reward_model` reward needs a scorer ([`RewardConfig::build_with`]).
    pub fn build(&self, sandbox: Option<Sandbox>) -> Result<Reward, ConfigError> {
        self.build_with(sandbox, None)
    }

    /// [`RewardConfig::build`] with a source of learned scorers, for `reward_model` rewards
    /// (and composites containing them).
    pub fn build_with(
        &self,
        sandbox: Option<Sandbox>,
        scorers: Option<&dyn ScorerSource>,
    ) -> Result<Reward, ConfigError> {
        let need_sandbox =
            |name: &'static str| sandbox.clone().ok_or(ConfigError::NeedsSandbox(name));
        Ok(match self {
            Self::Math(c) => Reward::Math(MathVerifier::new(c)?),
            Self::ExactMatch(c) => Reward::ExactMatch(ExactMatchVerifier::new(c)?),
            Self::UnitTests(c) => {
                Reward::UnitTests(UnitTestsVerifier::new(c, need_sandbox("unit_tests")?)?)
            }
            Self::StdioTests(c) => {
                Reward::StdioTests(StdioTestsVerifier::new(c, need_sandbox("stdio_tests")?)?)
            }
            Self::FormatRegex(c) => Reward::FormatRegex(FormatRegexVerifier::new(c)?),
            Self::TagStructure(c) => Reward::TagStructure(TagStructureVerifier::new(c)?),
            Self::JsonSchema(c) => Reward::JsonSchema(JsonSchemaVerifier::new(c)?),
            Self::Overlong(c) => Reward::Overlong(OverlongVerifier::new(c)?),
            Self::GroupLength(c) => Reward::GroupLength(GroupLengthVerifier::new(c)?),
            Self::CosineLength(c) => Reward::CosineLength(CosineLengthVerifier::new(c)?),
            Self::Repetition(c) => Reward::Repetition(RepetitionVerifier::new(c)?),
            Self::Instructions(c) => Reward::Instructions(InstructionsVerifier::new(c)?),
            Self::Composite(c) => {
                Reward::Composite(CompositeVerifier::new_with(c, sandbox, scorers)?)
            }
            Self::RewardModel(c) => Reward::RewardModel(RewardModelVerifier::new(c, scorers)?),
            Self::ProcessReward(c) => {
                Reward::ProcessReward(ProcessRewardVerifier::new(c, scorers)?)
            }
            Self::Judge(c) => Reward::Judge(JudgeVerifier::new(c)?),
        })
    }

    /// The config of `kind` with every option at its default, when the kind has defaults for
    /// all its options (overlong, cosine_length, instructions, composite, reward_model,
    /// process_reward and judge need a file).
    pub fn default_for(kind: RewardKind) -> Result<RewardConfig, ConfigError> {
        let needs_file = |field: &str| {
            Err(ConfigError::invalid(
                field,
                format!("reward kind `{kind}` needs a --config file"),
            ))
        };
        Ok(match kind {
            RewardKind::Math => Self::Math(MathConfig::default()),
            RewardKind::ExactMatch => Self::ExactMatch(ExactMatchConfig::default()),
            RewardKind::UnitTests => Self::UnitTests(UnitTestsConfig::default()),
            RewardKind::StdioTests => Self::StdioTests(StdioTestsConfig::default()),
            RewardKind::FormatRegex => Self::FormatRegex(FormatRegexConfig::default()),
            RewardKind::TagStructure => Self::TagStructure(TagStructureConfig::default()),
            RewardKind::JsonSchema => Self::JsonSchema(JsonSchemaConfig::default()),
            RewardKind::Overlong => return needs_file("max_tokens"),
            RewardKind::GroupLength => Self::GroupLength(GroupLengthConfig::default()),
            RewardKind::CosineLength => return needs_file("max_tokens"),
            RewardKind::Repetition => Self::Repetition(RepetitionConfig::default()),
            RewardKind::Instructions => return needs_file("constraints"),
            RewardKind::Composite => return needs_file("components"),
            RewardKind::RewardModel | RewardKind::ProcessReward => return needs_file("model"),
            RewardKind::Judge => return needs_file("urls"),
        })
    }
}

/// A validated, ready-to-run reward function.
pub enum Reward {
    Math(MathVerifier),
    ExactMatch(ExactMatchVerifier),
    UnitTests(UnitTestsVerifier),
    StdioTests(StdioTestsVerifier),
    FormatRegex(FormatRegexVerifier),
    TagStructure(TagStructureVerifier),
    JsonSchema(JsonSchemaVerifier),
    Overlong(OverlongVerifier),
    GroupLength(GroupLengthVerifier),
    CosineLength(CosineLengthVerifier),
    Repetition(RepetitionVerifier),
    Instructions(InstructionsVerifier),
    Composite(CompositeVerifier),
    RewardModel(RewardModelVerifier),
    ProcessReward(ProcessRewardVerifier),
    Judge(JudgeVerifier),
}

impl fmt::Debug for Reward {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "Reward::{}", self.kind())
    }
}

impl Reward {
    pub fn kind(&self) -> RewardKind {
        match self {
            Self::Math(_) => RewardKind::Math,
            Self::ExactMatch(_) => RewardKind::ExactMatch,
            Self::UnitTests(_) => RewardKind::UnitTests,
            Self::StdioTests(_) => RewardKind::StdioTests,
            Self::FormatRegex(_) => RewardKind::FormatRegex,
            Self::TagStructure(_) => RewardKind::TagStructure,
            Self::JsonSchema(_) => RewardKind::JsonSchema,
            Self::Overlong(_) => RewardKind::Overlong,
            Self::GroupLength(_) => RewardKind::GroupLength,
            Self::CosineLength(_) => RewardKind::CosineLength,
            Self::Repetition(_) => RewardKind::Repetition,
            Self::Instructions(_) => RewardKind::Instructions,
            Self::Composite(_) => RewardKind::Composite,
            Self::RewardModel(_) => RewardKind::RewardModel,
            Self::ProcessReward(_) => RewardKind::ProcessReward,
            Self::Judge(_) => RewardKind::Judge,
        }
    }

    fn verifier(&self) -> &dyn Verifier {
        match self {
            Self::Math(v) => v,
            Self::ExactMatch(v) => v,
            Self::UnitTests(v) => v,
            Self::StdioTests(v) => v,
            Self::FormatRegex(v) => v,
            Self::TagStructure(v) => v,
            Self::JsonSchema(v) => v,
            Self::Overlong(v) => v,
            Self::GroupLength(v) => v,
            Self::CosineLength(v) => v,
            Self::Repetition(v) => v,
            Self::Instructions(v) => v,
            Self::Composite(v) => v,
            Self::RewardModel(v) => v,
            Self::ProcessReward(v) => v,
            Self::Judge(v) => v,
        }
    }

    /// True when scoring runs programs (callers then use a pool sized for processes).
    pub fn runs_code(&self) -> bool {
        match self {
            Self::UnitTests(_) | Self::StdioTests(_) => true,
            Self::Composite(composite) => composite.runs_code(),
            _ => false,
        }
    }

    /// True for a `process_reward` with `dense = true`: the learner also folds its step scores
    /// into the token advantages.
    pub fn is_dense_process(&self) -> bool {
        matches!(self, Self::ProcessReward(v) if v.is_dense())
    }

    /// True when the reward compares completions within a group (`score_group` differs from
    /// scoring each alone).
    pub fn is_group_level(&self) -> bool {
        match self {
            // A group is one batch for the model, and `normalize = "group"` reads the group; a
            // judge compares the group's completions (pairwise, listwise) or runs its requests
            // concurrently.
            Self::GroupLength(_)
            | Self::RewardModel(_)
            | Self::ProcessReward(_)
            | Self::Judge(_) => true,
            Self::Composite(composite) => composite.is_group_level(),
            _ => false,
        }
    }
}

impl Verifier for Reward {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        self.verifier().score(input)
    }

    fn score_group(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        self.verifier().score_group(group)
    }
}
