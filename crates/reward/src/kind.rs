//! `RewardKind`: the bare name of each reward kind (`math`, `exact_match`, ...), for
//! `stoke verify --reward KIND` and for reports.
//!
//! What this is not: a kind's options (`RewardConfig` in `config.rs`) or its verifier
//! (`Reward`). Parsing a name (`RewardKind::from_str`) is defined in `config.rs`: its error,
//! `ConfigError::UnknownKind` (`error.rs`), lists the kinds, so it sits above this module.
//! Invariant: `ALL` lists every variant once.

use std::fmt;

/// The name of a reward kind.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RewardKind {
    Math,
    ExactMatch,
    UnitTests,
    StdioTests,
    FormatRegex,
    TagStructure,
    JsonSchema,
    Overlong,
    GroupLength,
    CosineLength,
    Repetition,
    Instructions,
    Composite,
    RewardModel,
    ProcessReward,
    Judge,
}

impl RewardKind {
    pub const ALL: [RewardKind; 16] = [
        Self::Math,
        Self::ExactMatch,
        Self::UnitTests,
        Self::StdioTests,
        Self::FormatRegex,
        Self::TagStructure,
        Self::JsonSchema,
        Self::Overlong,
        Self::GroupLength,
        Self::CosineLength,
        Self::Repetition,
        Self::Instructions,
        Self::Composite,
        Self::RewardModel,
        Self::ProcessReward,
        Self::Judge,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Self::Math => "math",
            Self::ExactMatch => "exact_match",
            Self::UnitTests => "unit_tests",
            Self::StdioTests => "stdio_tests",
            Self::FormatRegex => "format_regex",
            Self::TagStructure => "tag_structure",
            Self::JsonSchema => "json_schema",
            Self::Overlong => "overlong",
            Self::GroupLength => "group_length",
            Self::CosineLength => "cosine_length",
            Self::Repetition => "repetition",
            Self::Instructions => "instructions",
            Self::Composite => "composite",
            Self::RewardModel => "reward_model",
            Self::ProcessReward => "process_reward",
            Self::Judge => "judge",
        }
    }

    pub fn names() -> Vec<&'static str> {
        Self::ALL.iter().map(|kind| kind.name()).collect()
    }

    /// True for kinds that run code in the sandbox.
    pub fn runs_code(self) -> bool {
        matches!(self, Self::UnitTests | Self::StdioTests)
    }
}

impl fmt::Display for RewardKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}
