//! The `Verifier` trait and the records that cross it: what a reward function reads
//! (`RewardInput`: prompt, completion, the task's `Reference`, token count) and what it returns
//! (`RewardOutcome`: a score, a closed-set verdict and structured details).
//!
//! What this is not: a registry. The set of reward kinds is the `RewardConfig` enum in
//! `config.rs`, matched in one place. Verifiers never panic on bad input and never block without
//! bound: pure verifiers bound their work by input size, code verifiers by the sandbox's limits.
//!
//! Invariants: a verdict of `UnparseableGold` or `MissingField` always has score 0 and marks a
//! broken dataset record (callers exclude it from training); `Correct` is never produced from a
//! reference that could not be parsed; every score is finite (`RewardOutcome::new` replaces
//! NaN and infinities by 0 and says so in `details.reason`).

use serde::{Deserialize, Serialize};

pub use stoke_types::RewardOutcomeKind as Outcome;

/// One stdin/stdout test case of a competitive-programming task.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct IoCase {
    /// Bytes fed to the program's standard input.
    pub input: String,
    /// Expected standard output (compared after whitespace normalization).
    pub output: String,
}

/// A task's reference data. Each reward kind reads the fields it needs and reports
/// `MissingField` when one is absent; the rest are ignored.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Reference {
    /// Gold answer (math, exact match): `"42"`, `"\\frac{1}{2}"`, `"B"`, `"#### 18"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub answer: Option<String>,
    /// Unit-test code defining `check(candidate)` (HumanEval style).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tests: Option<String>,
    /// Name of the function under test, passed to `check`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub entry_point: Option<String>,
    /// Stdin/stdout test cases.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cases: Option<Vec<IoCase>>,
    /// JSON Schema the completion's JSON must satisfy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<serde_json::Value>,
    /// Instruction constraints for this sample (replace the `instructions` reward's list).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub constraints: Option<Vec<crate::constraint::Constraint>>,
}

/// Everything a verifier may look at for one completion.
#[derive(Debug, Clone, Copy)]
pub struct RewardInput<'a> {
    /// The prompt the completion answers (HumanEval: the function signature and docstring).
    pub prompt: &'a str,
    /// The model's completion text.
    pub completion: &'a str,
    /// The task's reference data.
    pub reference: &'a Reference,
    /// Length of the completion in tokens (the reward crate has no tokenizer).
    pub completion_tokens: Option<usize>,
    /// Correctness established elsewhere (by a composite's correctness component, or supplied
    /// by the caller); read by the correctness-gated length rewards.
    pub correct: Option<bool>,
}

impl<'a> RewardInput<'a> {
    /// An input with no token count and no external correctness.
    pub fn new(prompt: &'a str, completion: &'a str, reference: &'a Reference) -> Self {
        Self {
            prompt,
            completion,
            reference,
            completion_tokens: None,
            correct: None,
        }
    }

    /// The same input with a token count.
    pub fn with_tokens(mut self, completion_tokens: usize) -> Self {
        self.completion_tokens = Some(completion_tokens);
        self
    }

    /// The same input with correctness supplied.
    pub fn with_correct(mut self, correct: bool) -> Self {
        self.correct = Some(correct);
        self
    }
}

/// One named check and whether it passed (test cases, constraints, tags, schema errors).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Check {
    pub name: String,
    pub passed: bool,
}

/// One component of a composite reward, reported alongside the total.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ComponentScore {
    /// The component's name (its kind unless renamed in the config).
    pub name: String,
    pub weight: f64,
    /// The component's own score, before weighting.
    pub score: f64,
    pub outcome: Outcome,
    /// False when gating switched the component off (its weighted contribution is then 0).
    pub applied: bool,
}

/// Structured details of a verdict. Fields a reward kind does not use stay empty and are not
/// serialized.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Details {
    /// What was extracted from the completion (final answer, code, JSON), truncated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extracted: Option<String>,
    /// The reference as the verifier understood it (normalized gold answer), truncated.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gold: Option<String>,
    /// Checks (tests, cases, constraints, tags) that passed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub passed: Option<usize>,
    /// Checks attempted.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub total: Option<usize>,
    /// Isolation level the sandbox reported for code rewards.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub isolation: Option<String>,
    /// Individual named checks, when the kind has them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub checks: Vec<Check>,
    /// Composite rewards: each component's value.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub components: Vec<ComponentScore>,
    /// Why the verdict is what it is, in words (failure reasons, parse errors).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
    /// LLM-as-judge rewards: what judging this sample cost (a composite sums its components').
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<JudgeFigures>,
    /// Process rewards: each step of the completion and its score, in order (`None`: the
    /// reward does not score steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<StepScore>>,
}

/// One step of a completion as a process reward model scored it.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct StepScore {
    /// The step's bytes `[start, end)` in the completion text (its separator included).
    pub start: usize,
    pub end: usize,
    /// P(good) from the PRM; 0 for a step that repeats an earlier one.
    pub score: f64,
}

/// What an LLM judge did for one sample. Calls that concern several samples (a pairwise
/// comparison, a listwise ranking) are counted on one of them only, so the figures of a group's
/// samples add up to the group's.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
#[serde(default)]
pub struct JudgeFigures {
    /// Judge requests sent to a server (answered or not; cache hits excluded).
    pub calls: u64,
    /// Judge requests answered from the verdict cache.
    pub cache_hits: u64,
    /// Further attempts after a server failed (each on the next server).
    pub retries: u64,
    /// Servers passed over because they failed within the cooldown.
    pub servers_skipped: u64,
    /// Wall seconds of the requests sent, summed over attempts.
    pub latency_s: f64,
    /// Pairs judged in both orders (`swap = true`), and those whose two verdicts agreed.
    pub compared_pairs: u64,
    pub consistent_pairs: u64,
}

impl JudgeFigures {
    /// The sum of two records (a composite with two judges, a group's total).
    pub fn plus(self, other: JudgeFigures) -> JudgeFigures {
        JudgeFigures {
            calls: self.calls + other.calls,
            cache_hits: self.cache_hits + other.cache_hits,
            retries: self.retries + other.retries,
            servers_skipped: self.servers_skipped + other.servers_skipped,
            latency_s: self.latency_s + other.latency_s,
            compared_pairs: self.compared_pairs + other.compared_pairs,
            consistent_pairs: self.consistent_pairs + other.consistent_pairs,
        }
    }
}

/// Longest text copied into `Details` (extracted answers can be a whole 1 MB completion).
pub const DETAIL_TEXT_LIMIT: usize = 500;

/// `text` cut to at most `DETAIL_TEXT_LIMIT` bytes on a char boundary.
pub fn clip_detail(text: &str) -> String {
    if text.len() <= DETAIL_TEXT_LIMIT {
        return text.to_string();
    }
    let mut end = DETAIL_TEXT_LIMIT;
    while !text.is_char_boundary(end) {
        end -= 1;
    }
    format!("{}...", &text[..end])
}

/// A reward function's answer for one completion.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct RewardOutcome {
    pub score: f64,
    pub outcome: Outcome,
    pub details: Details,
}

impl RewardOutcome {
    /// A non-finite score (an overflowing weighted sum, an extreme configured range) becomes 0
    /// with the reason recorded: one NaN or infinity in a GRPO group poisons the whole group's
    /// mean and standard deviation, and with them every advantage of the batch.
    pub fn new(score: f64, outcome: Outcome, mut details: Details) -> Self {
        if !score.is_finite() {
            let note = format!("non-finite score {score} replaced by 0");
            details.reason = Some(match details.reason.take() {
                Some(reason) => format!("{reason}; {note}"),
                None => note,
            });
            return Self {
                score: 0.0,
                outcome,
                details,
            };
        }
        Self {
            score,
            outcome,
            details,
        }
    }

    /// Score 1, `Correct`.
    pub fn correct(details: Details) -> Self {
        Self::new(1.0, Outcome::Correct, details)
    }

    /// Score 0, `Wrong`.
    pub fn wrong(details: Details) -> Self {
        Self::new(0.0, Outcome::Wrong, details)
    }

    /// Score 0 with a verdict and a reason and nothing else.
    pub fn failed(outcome: Outcome, reason: impl Into<String>) -> Self {
        Self::new(
            0.0,
            outcome,
            Details {
                reason: Some(reason.into()),
                ..Details::default()
            },
        )
    }

    /// Score 0, `MissingField`, naming the field.
    pub fn missing(field: &str) -> Self {
        Self::failed(
            Outcome::MissingField,
            format!("the sample has no `{field}`"),
        )
    }

    /// A shaping term's value (length, repetition): no verdict of its own.
    pub fn shaped(score: f64, details: Details) -> Self {
        Self::new(score, Outcome::Shaped, details)
    }
}

/// A reward function.
///
/// `score` must be cheap to call from many threads at once (`Sync`); code verifiers block on the
/// sandbox, so callers run them on a pool sized for processes rather than cores.
pub trait Verifier: Send + Sync {
    /// Scores one completion.
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome;

    /// Scores a group of completions of the same prompt (GRPO group). Rewards that compare
    /// completions within a group (group length) override this; the default scores each alone.
    fn score_group(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        group.iter().map(|input| self.score(input)).collect()
    }
}
