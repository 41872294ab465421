//! Code against stdin/stdout test cases (competitive-programming style): the program runs once
//! per case with the case's input on stdin; its stdout must equal the expected output after
//! whitespace normalization.
//!
//! Config (`kind = "stdio_tests"`):
//! - `scoring`: `"fraction"` (default: fraction of cases passed) or `"binary"`.
//! - `max_cases` (optional): run only the first N cases (cheap training-time signal).
//! - `comparison`: `"tokens"` (default: whitespace-separated tokens equal) or `"lines"` (lines
//!   equal after trimming trailing whitespace, trailing blank lines ignored).
//! - `extract_fenced_code` (bool, default true).
//!
//! Reads `cases` (`[{input, output}]`); a reference whose expected outputs are all blank is
//! `UnparseableGold` (the empty program would pass it). Cases run concurrently on the sandbox pool; a case that
//! times out counts as failed and makes the outcome `Timeout` unless every other case passed.
//!
//! Integrity: no trusted code runs in the jail (the program is the whole run, one fresh sandbox
//! per case), the expected outputs never enter it, and the comparison is made here in Rust on
//! the captured stdout, which only an exit status of 0 makes count; so nothing the program
//! writes, shadows or patches can reach the judgement. Concurrent cases are kept fair by the
//! sandbox's CPU cgroup (or, without one, by its refusal of `setsid`), so a hostile program
//! cannot time out its neighbours. `tests/code_integrity.rs` holds the forging attempts.

use serde::{Deserialize, Serialize};
use stoke_sandbox::{Program, Sandbox};

use crate::code::{abnormal_outcome, extract_code, run_all};
use crate::error::ConfigError;
use crate::verifier::{Check, Details, Outcome, RewardInput, RewardOutcome, Verifier, clip_detail};

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum CaseScoring {
    #[default]
    Fraction,
    Binary,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OutputComparison {
    #[default]
    Tokens,
    Lines,
}

impl OutputComparison {
    /// Whether `actual` matches `expected` under this normalization.
    pub fn matches(self, actual: &str, expected: &str) -> bool {
        match self {
            OutputComparison::Tokens => actual.split_whitespace().eq(expected.split_whitespace()),
            OutputComparison::Lines => {
                fn lines(text: &str) -> Vec<&str> {
                    let mut lines: Vec<&str> = text.lines().map(str::trim_end).collect();
                    while lines.last().is_some_and(|l| l.is_empty()) {
                        lines.pop();
                    }
                    lines
                }
                lines(actual) == lines(expected)
            }
        }
    }
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct StdioTestsConfig {
    pub scoring: CaseScoring,
    #[serde(skip_serializing_if = "Option::is_none")]
    pub max_cases: Option<usize>,
    pub comparison: OutputComparison,
    pub extract_fenced_code: bool,
}

impl Default for StdioTestsConfig {
    fn default() -> Self {
        Self {
            scoring: CaseScoring::Fraction,
            max_cases: None,
            comparison: OutputComparison::Tokens,
            extract_fenced_code: true,
        }
    }
}

pub struct StdioTestsVerifier {
    config: StdioTestsConfig,
    sandbox: Sandbox,
}

impl StdioTestsVerifier {
    pub fn new(config: &StdioTestsConfig, sandbox: Sandbox) -> Result<Self, ConfigError> {
        if config.max_cases == Some(0) {
            return Err(ConfigError::invalid("max_cases", "must be > 0"));
        }
        Ok(Self {
            config: config.clone(),
            sandbox,
        })
    }
}

impl Verifier for StdioTestsVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let Some(cases) = input.reference.cases.as_deref() else {
            return RewardOutcome::missing("cases");
        };
        if cases.is_empty() {
            return RewardOutcome::failed(Outcome::UnparseableGold, "`cases` is empty");
        }
        // A program that prints nothing matches blank expected outputs; if every case is
        // blank, the empty program would be rewarded in full.
        if cases.iter().all(|case| case.output.trim().is_empty()) {
            return RewardOutcome::failed(
                Outcome::UnparseableGold,
                "every case expects blank output (an empty program would pass)",
            );
        }
        let cases = &cases[..self
            .config
            .max_cases
            .unwrap_or(cases.len())
            .min(cases.len())];
        let code = if self.config.extract_fenced_code {
            extract_code(input.completion)
        } else {
            input.completion
        };
        let programs = cases
            .iter()
            .map(|case| Program::python(code).with_stdin(case.input.as_bytes().to_vec()))
            .collect();
        let results = run_all(&self.sandbox, programs);
        let mut checks = Vec::with_capacity(cases.len());
        let mut abnormal: Option<(Outcome, String)> = None;
        for (index, (case, result)) in cases.iter().zip(&results).enumerate() {
            let passed = result.status.success()
                && self
                    .config
                    .comparison
                    .matches(&result.stdout_text(), &case.output);
            if !passed && abnormal.is_none() {
                abnormal = abnormal_outcome(result);
            }
            checks.push(Check {
                name: format!("case {index}"),
                passed,
            });
        }
        let passed = checks.iter().filter(|c| c.passed).count();
        let total = checks.len();
        let mut details = Details {
            extracted: Some(clip_detail(code)),
            passed: Some(passed),
            total: Some(total),
            isolation: results
                .first()
                .map(|r| r.isolation.level.name().to_string()),
            checks,
            ..Details::default()
        };
        if passed == total {
            return RewardOutcome::correct(details);
        }
        if let Some((outcome, reason)) = abnormal {
            details.reason = Some(reason);
            let score = match self.config.scoring {
                CaseScoring::Fraction => passed as f64 / total as f64,
                CaseScoring::Binary => 0.0,
            };
            return RewardOutcome::new(score, outcome, details);
        }
        match self.config.scoring {
            CaseScoring::Fraction if passed > 0 => {
                RewardOutcome::new(passed as f64 / total as f64, Outcome::Partial, details)
            }
            _ => RewardOutcome::wrong(details),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn token_comparison_ignores_whitespace_layout() {
        assert!(OutputComparison::Tokens.matches("1 2\n3\n\n", "1\n2 3"));
        assert!(!OutputComparison::Tokens.matches("1 2", "12"));
    }

    #[test]
    fn line_comparison_ignores_trailing_space_and_blank_tail_only() {
        assert!(OutputComparison::Lines.matches("a  \nb\n\n", "a\nb"));
        assert!(!OutputComparison::Lines.matches("a b", "a\nb"));
    }
}
