//! The verdict of a reward function on one completion, as a closed set, shared by the reward crate
//! (which produces it), the RL trainer (which drops samples whose gold answer is broken) and
//! evaluation (which counts them). Scores and structured details live in `stoke-reward`; this is
//! only the label, so crates that must not depend on the reward crate can still match on it.

use serde::{Deserialize, Serialize};

/// What a reward function concluded about one completion.
///
/// Invariant: only `Correct` (and `Partial`, for graded rewards) may carry a positive correctness
/// score; `UnparseableGold` and `MissingField` mark a broken *dataset* record, never the model's
/// fault, and callers exclude such samples from training and count them as a metric. A failed
/// learned scorer (`ScorerError`) or an unreadable judge verdict (`UnparseableVerdict`) is treated
/// the same way: no verdict, so no reward, not a zero.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RewardOutcomeKind {
    /// The completion satisfies the reference fully.
    Correct,
    /// The completion was understood and does not match the reference.
    Wrong,
    /// Some, not all, of the checks passed (tests, constraints, tags).
    Partial,
    /// The reference (gold answer, tests, schema) could not be parsed: a dataset problem.
    UnparseableGold,
    /// The sample lacks a field this reward needs (gold answer, token count, correctness).
    MissingField,
    /// No answer could be extracted from the completion, or it could not be parsed.
    UnparseablePrediction,
    /// The completion does not have the required shape (format regex, tags, JSON syntax).
    FormatError,
    /// The program ran past its time limit.
    Timeout,
    /// The sandbox could not run the program (setup failure, output limit, internal error).
    SandboxError,
    /// A shaping term (length, repetition) that carries no verdict of its own.
    Shaped,
    /// A learned scorer (a reward model) failed to score the sample: no verdict on the
    /// completion, and not a zero the policy earned.
    ScorerError,
    /// A judge model answered without a verdict that could be read (no verdict line, a number
    /// outside the scale, conflicting verdict lines, an incomplete ranking): no verdict on the
    /// completion either.
    UnparseableVerdict,
}

impl RewardOutcomeKind {
    /// Every variant, in declaration order (for metrics tables).
    pub const ALL: [RewardOutcomeKind; 12] = [
        Self::Correct,
        Self::Wrong,
        Self::Partial,
        Self::UnparseableGold,
        Self::MissingField,
        Self::UnparseablePrediction,
        Self::FormatError,
        Self::Timeout,
        Self::SandboxError,
        Self::Shaped,
        Self::ScorerError,
        Self::UnparseableVerdict,
    ];

    /// The snake_case name used in JSONL output and metrics.
    pub fn name(self) -> &'static str {
        match self {
            Self::Correct => "correct",
            Self::Wrong => "wrong",
            Self::Partial => "partial",
            Self::UnparseableGold => "unparseable_gold",
            Self::MissingField => "missing_field",
            Self::UnparseablePrediction => "unparseable_prediction",
            Self::FormatError => "format_error",
            Self::Timeout => "timeout",
            Self::SandboxError => "sandbox_error",
            Self::Shaped => "shaped",
            Self::ScorerError => "scorer_error",
            Self::UnparseableVerdict => "unparseable_verdict",
        }
    }

    /// True when the record itself is broken (not the model's fault): the sample must be excluded
    /// from training rather than given a zero reward.
    /// A scorer that failed (`ScorerError`) or a judge whose verdict could not be read
    /// (`UnparseableVerdict`) says nothing about the completion either.
    pub fn is_dataset_problem(self) -> bool {
        matches!(
            self,
            Self::UnparseableGold
                | Self::MissingField
                | Self::ScorerError
                | Self::UnparseableVerdict
        )
    }
}
