//! Math answer equivalence: extracts the completion's final answer and decides, exactly where
//! possible, whether it equals the gold answer.
//!
//! Pipeline: `extract.rs` locates the answer (`\boxed{}` first, then `<answer>` tags, "answer
//! is", `####`, the last number); `lexer.rs` and `parser.rs` turn LaTeX or plain text into an
//! `Expr` (`expr.rs`); `compare.rs` decides equivalence with big rationals, falling back to f64
//! with a tolerance only for irrational values, and to evaluation at sample points for
//! expressions with variables. The LaTeX parser is hand-written: no Rust crate parses LaTeX math
//! into exact values, and the limits below must hold for any input.
//!
//! Accepted answer forms: integers, decimals, thousands separators (`1,000`, `1{,}000`,
//! `1\,000`), the LaTeX decimal comma (`3{,}5`, and a bare `3,5` when the gold is one number),
//! fractions (`a/b`, `\frac`, `\dfrac`, `\tfrac`, `\frac12`), mixed numbers (`2\frac{1}{2}`),
//! percentages (`P\%` matches `P` at face value, as math-verify, and `P/100`, its value; two
//! percentages compare by value; a bare number never matches a gold 100 times it), units and currency (`\text{cm}`, `\$`, `dollars`,
//! `^\circ`), `\sqrt`, `\sqrt[n]`, `\pi`, powers, implicit multiplication, factorials, tuples
//! and intervals (brackets must match: `[1,2)` is not `(1,2)`), sets and top-level lists
//! (unordered), equations (`x = 3` matches `3`; general equations match up to a non-zero factor),
//! inequalities as intervals (a gold `1<x<2` accepts `(1,2)`), unions, vectors and matrices
//! (`\begin{pmatrix}`, compared entry by entry in order), `\binom`, `\emptyset`, ratios (`3:2`),
//! multiple-choice letters and word answers (`\text{Monday}`).
//!
//! Not accepted: repeating decimals (`0.\overline{3}`), `\dots`, floor/ceiling, `\approx`,
//! scientific `1.5e3` (read as `1.5 e 3`), complex arithmetic (`i` is a variable), and decimal
//! approximations of irrational answers (`1.414` for `\sqrt{2}`) unless `relative_tolerance` is
//! raised.
//!
//! Config (`[reward]` table with `kind = "math"`; every field optional):
//! - `relative_tolerance` (f64, default 1e-9): relative tolerance for irrational values only;
//!   rational values always compare exactly, so `0.333` never matches `1/3`.
//! - `sample_points` (usize, default 6, 2..=32): points at which symbolic answers are compared.
//! - `reject_restated_question` (bool, default true): a prediction that is an expression (not a
//!   bare number) copied verbatim from the prompt and not written as the gold is written scores
//!   `Wrong` (`Simplify 2(x+1)` answered `2(x+1)`).
//! - `require_boxed` (bool, default false): only a `\boxed{}` answer counts; anything else is
//!   `FormatError`.
//! - `last_number_fallback` (bool, default true): with no boxed/tagged/phrased answer, use the
//!   completion's last number.
//!
//! Invariants: the gold answer is parsed before anything else and a gold that fails to parse is
//! `UnparseableGold` (score 0) whatever the completion says; all work is bounded (answer length
//! `MAX_ANSWER_BYTES`, `MAX_TOKENS`, `MAX_DEPTH`, `MAX_EXACT_BITS`), with no timers or signals.

pub mod compare;
pub mod expr;
pub mod extract;
pub mod lexer;
pub mod parser;

use serde::{Deserialize, Serialize};

use crate::config::ConfigError;
use crate::verifier::{Details, Outcome, RewardInput, RewardOutcome, Verifier, clip_detail};
use compare::{Tolerance, equivalent};
use expr::Expr;
use extract::{AnswerSource, Extractor, clean_answer, last_boxed};
use parser::parse_answer;

/// File format of the math reward's options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MathConfig {
    pub relative_tolerance: f64,
    pub sample_points: usize,
    pub reject_restated_question: bool,
    pub require_boxed: bool,
    pub last_number_fallback: bool,
}

impl Default for MathConfig {
    fn default() -> Self {
        Self {
            relative_tolerance: 1e-9,
            sample_points: 6,
            reject_restated_question: true,
            require_boxed: false,
            last_number_fallback: true,
        }
    }
}

/// The math verifier (validated config and compiled extraction patterns).
#[derive(Debug, Clone)]
pub struct MathVerifier {
    tolerance: Tolerance,
    reject_restated_question: bool,
    require_boxed: bool,
    last_number_fallback: bool,
    extractor: Extractor,
}

/// The gold answer's text: datasets store `#### 18` (GSM8K) or a full solution with a box.
fn gold_text(raw: &str) -> &str {
    if let Some(boxed) = last_boxed(raw) {
        return clean_answer(boxed);
    }
    if let Some(hashes) = raw.rfind("####") {
        return clean_answer(&raw[hashes + 4..]);
    }
    clean_answer(raw)
}

fn squash(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
}

/// `3,5` written by a model whose gold is one number: the decimal comma.
fn decimal_comma(text: &str) -> Option<String> {
    let (whole, fraction) = text.split_once(',')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let whole_digits = whole.strip_prefix('-').unwrap_or(whole);
    (digits(whole_digits) && digits(fraction) && fraction.len() != 3)
        .then(|| format!("{whole}.{fraction}"))
}

impl MathVerifier {
    pub fn new(config: &MathConfig) -> Result<Self, ConfigError> {
        if !(config.relative_tolerance >= 0.0 && config.relative_tolerance < 1.0) {
            return Err(ConfigError::invalid(
                "relative_tolerance",
                "must be in [0, 1)",
            ));
        }
        if !(2..=32).contains(&config.sample_points) {
            return Err(ConfigError::invalid("sample_points", "must be in 2..=32"));
        }
        Ok(Self {
            tolerance: Tolerance {
                relative: config.relative_tolerance,
                sample_points: config.sample_points,
            },
            reject_restated_question: config.reject_restated_question,
            require_boxed: config.require_boxed,
            last_number_fallback: config.last_number_fallback,
            extractor: Extractor::new(),
        })
    }

    /// Parses a gold answer as this verifier would (for dataset checks).
    pub fn parse_gold(raw: &str) -> Result<Expr, String> {
        parse_answer(gold_text(raw)).map_err(|e| e.0)
    }

    /// Decides whether `prediction` (an already-extracted answer) matches `gold` (raw gold text).
    pub fn judge(&self, prompt: &str, gold_raw: &str, prediction: &str) -> RewardOutcome {
        let gold = gold_text(gold_raw);
        let prediction = clean_answer(prediction);
        let mut details = Details {
            extracted: Some(clip_detail(prediction)),
            gold: Some(clip_detail(gold)),
            ..Details::default()
        };
        let gold_expr = match parse_answer(gold) {
            Ok(expr) => expr,
            Err(error) => {
                details.reason = Some(format!("gold answer: {}", error.0));
                return RewardOutcome::new(0.0, Outcome::UnparseableGold, details);
            }
        };
        if squash(prediction) == squash(gold) {
            return RewardOutcome::correct(details);
        }
        let comma_fixed = if gold_expr.is_scalar() {
            decimal_comma(prediction.trim())
        } else {
            None
        };
        let parsed = parse_answer(comma_fixed.as_deref().unwrap_or(prediction));
        let pred_expr = match parsed {
            Ok(expr) => expr,
            Err(error) => {
                details.reason = Some(format!("prediction: {}", error.0));
                return RewardOutcome::new(0.0, Outcome::UnparseablePrediction, details);
            }
        };
        if !equivalent(&gold_expr, &pred_expr, &self.tolerance) {
            return RewardOutcome::wrong(details);
        }
        if self.reject_restated_question && !pred_expr.is_literal() {
            let restated = squash(prediction);
            if restated.len() >= 3 && squash(prompt).contains(&restated) {
                details.reason =
                    Some("the prediction restates an expression from the prompt".into());
                return RewardOutcome::wrong(details);
            }
        }
        RewardOutcome::correct(details)
    }
}

impl Verifier for MathVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let Some(gold_raw) = input.reference.answer.as_deref() else {
            return RewardOutcome::missing("answer");
        };
        let Some((prediction, source)) = self.extractor.extract(input.completion) else {
            // The gold is still checked so a broken dataset shows even when the model rambles.
            if let Err(error) = parse_answer(gold_text(gold_raw)) {
                return RewardOutcome::failed(
                    Outcome::UnparseableGold,
                    format!("gold answer: {}", error.0),
                );
            }
            return RewardOutcome::failed(Outcome::UnparseablePrediction, "no final answer found");
        };
        if (self.require_boxed && source != AnswerSource::Boxed)
            || (!self.last_number_fallback && source == AnswerSource::LastNumber)
        {
            if let Err(error) = parse_answer(gold_text(gold_raw)) {
                return RewardOutcome::failed(
                    Outcome::UnparseableGold,
                    format!("gold answer: {}", error.0),
                );
            }
            return RewardOutcome::failed(
                Outcome::FormatError,
                format!("answer found by {source:?}, not accepted"),
            );
        }
        self.judge(input.prompt, gold_raw, prediction)
    }
}
