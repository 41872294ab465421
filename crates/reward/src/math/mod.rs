//! Math answer equivalence: extracts the completion's final answer and decides, exactly where
//! possible, whether it equals the gold answer.
//!
//! Pipeline: `extract.rs` locates the answer (with `spans.rs` finding boxes, math spans and
//! sentence ends, `plain.rs` judging a plain-text last number and `revision.rs` finding what
//! takes a marked answer back); `lexer.rs` (numbers in `number.rs` and `number_words.rs`, units
//! in `units.rs`) and `parser.rs` turn LaTeX or plain text into an `Expr` (`expr.rs`, with the
//! exact values of logs, trig at multiples of pi and factorial quotients in `closed_form.rs`);
//! `relation.rs` reduces labels, chains and inequalities to canonical values, `matrix.rs`
//! reduces matrix arithmetic, and `compare.rs` decides equivalence and names the rule
//! (`display.rs` prints both sides for `stoke verify --explain`). The LaTeX parser is
//! hand-written: no Rust crate parses LaTeX math into exact values, and the limits below must
//! hold for any input.
//!
//! Extraction, in priority order (details in `extract.rs`): reasoning before the last
//! `</think>` is skipped (an unclosed `<think>` has no answer); the last `<answer>` tag is the
//! only text read; the last final-answer statement ("final answer is", "Final Answer:",
//! `**Answer:**`, "the answer is", `####`) beats every box before it, a box after it is a
//! revision and wins; then the last `\boxed{}`/`\fbox{}`, boxes written together forming one
//! list. In a completion, what follows that marked answer may revise it: a retraction ("Wait,
//! I forgot the 2 eggs; the correct total is 44") withdraws it and the text after the cue is
//! read instead (no answer there: no answer at all, never the withdrawn one), and a later
//! answer statement ("so the total is 44", "there are 9") holding the last value replaces it;
//! verification sentences ("Check: 6*7 = 42 ✓") and other trailing text never do (the exact
//! rule is in `extract.rs`). Then the last math span; then plain text, whose last number counts
//! only when it stands alone (not in `AZYUK2A`, `x^2`, `a_2`, `1/2`, `2 + 3`) and is not
//! qualified ("at least 12", "not 12", "2 or 3"). Ambiguity is `UnparseablePrediction`, never a
//! guess.
//!
//! Gold answers: the whole reference when it parses (`$[0,1)$`, `1,22`), else its answer
//! extracted as from a completion (a MATH solution's last box, GSM8K's `#### 18`).
//!
//! Accepted answer forms: integers, decimals, thousands separators (`1,000`, `1{,}000`,
//! `1\,000`, `10,\!000`, `1 000`), the decimal comma (`3{,}5`; a bare `3,5` or `0,111` when the
//! gold is one number), scientific notation (`1.5e3`, `1.5 \times 10^3`), fractions (`a/b`,
//! `\frac`, `\dfrac`, `\frac12`), mixed numbers (`2\frac{1}{2}`), repeating decimals
//! (`0.\overline{3}`), base-n subscripts (`204_5`), magnitude words ("5 thousand" is 5000),
//! percentages (`P\%` matches `P` at face value, as Math-Verify, and `P/100`; a bare number never
//! matches a gold 100 times it), currency and units (`\$`, `\text{cm}`, "dollars", `^\circ`),
//! `\sqrt`, `\sqrt[n]`, `\pi`, `e`, trig and inverse trig functions with powers (`\sin^2 x`,
//! `\sec`, `\sin^{-1}`; degrees inside a trig argument: `\sin 30^\circ`), logs, factorials,
//! evaluated exactly where the value is rational (`\log_2 8` is 3, `\log_4 8` is 3/2, `\ln e`
//! is 1, `\log 100` is 2 since `\log` without a base is base 10; `\sin\frac{\pi}{6}` is 1/2,
//! `\cos\pi` is -1, `\tan\frac{\pi}{4}` is 1; irrational values such as `\sin\frac{\pi}{4}`
//! compare with surds like `\frac{\sqrt{2}}{2}` within the relative tolerance), binomials
//! (`\binom{5}{2}`, `{5 \choose 2}`, `C(5,2)`; `\binom{n}{0}` is 1 for any n), factorial
//! quotients (`\frac{(n+1)!}{n!}` is n+1; `(n+1)!` is `(n+1) n!`), implicit multiplication,
//! the real line (`\mathbb{R}`, `ℝ`, "all real numbers" as `(-\infty,\infty)`), numbers in
//! words ("forty-two", "one hundred and five", "three quarters": `number_words.rs` gives the
//! scope), font wrappers (`\textbf{42}`, `\mathbf{42}`, `\text{42}` are 42), tuples and intervals
//! (brackets must match: `[1,2)` is not `(1,2)`), sets (unordered; `\emptyset`, `\{\}`), lists
//! of solutions (unordered, repeats ignored), unions, relations (`\geq` is `>=`, sides flipped,
//! linear inequalities solved: `-x > -1` is `x < 1`; an inequality in one variable equals its
//! interval), chained equalities (the last side: `x = 5+5+1 = 11` is 11), `\approx` (the exact
//! side before it), labeled answers (`(p,q)=(3,2)` is `(3,2)`, `f(x)=1` is `1`, `AB=4, CD=5` is
//! `4, 5`; labeled lists on both sides must match label by label), general equations up to a
//! non-zero factor, matrices (`pmatrix`, `bmatrix`, `array`, with sums, products and scalar
//! multiples inside; same shape required; a tuple equals a one-row or one-column matrix), clock
//! times (`1:15` equals only the time 1:15, never the ratio 1/15), ratios (`3:2`),
//! multiple-choice letters (`C`, `(C)`, `\text{C}`) and word answers (`\text{odd}` is `odd`).
//!
//! Not accepted (so never a false accept): a rational approximation of an irrational gold
//! (`1.414` or `\frac{665857}{470832}` for `\sqrt{2}`; a gold written as a decimal does accept the
//! exact value it rounds), a decimal for a rational gold (`0.333` for `\frac13`), a list or
//! hedge for a scalar (`2, 3`, `\boxed{2} or \boxed{3}`), qualified values ("at least 12",
//! `\boxed{12} or more`), arithmetic on infinity (`1^\infty`), units that differ from the gold's
//! (`5 cm` for `5 m`; a side without a unit compares by number), a matrix of another shape,
//! Unicode look-alike digits, `\dots`, `\sum` and other unknown commands (unparseable), a
//! factorial past `MAX_FACTORIAL` (200) that does not cancel in a quotient (`1000000!` is
//! refused, never computed), and an answer taken back with nothing after it.
//!
//! Config (`[reward]` table with `kind = "math"`; every field optional):
//! - `relative_tolerance` (f64, default 1e-6): relative tolerance where a side is irrational
//!   (roots, `\pi`, `e`, trig and logs without a rational value); rational values always
//!   compare exactly, so `0.333` never matches `1/3`, and a closed form with a rational value
//!   (`\log_2 8`, `\sin\frac{\pi}{6}`, `\binom{5}{2}`) is that rational.
//! - `sample_points` (usize, default 6, 2..=32): points at which symbolic answers are compared.
//! - `reject_restated_question` (bool, default true): a prediction that is an expression (not a
//!   bare number) copied verbatim from the prompt and not written as the gold is written scores
//!   `Wrong` (`Simplify 2(x+1)` answered `2(x+1)`).
//! - `require_boxed` (bool, default false): only a `\boxed{}` answer counts; anything else is
//!   `FormatError`.
//! - `last_number_fallback` (bool, default true): with no statement, box or math span, use the
//!   completion's last standalone number; off, such a completion is `FormatError`.
//! - `compare_units` (bool, default true): when gold and prediction both carry known units
//!   (length, mass, volume, time, angle; area and volume powers), they must be the same.
//!
//! Invariants: the gold answer is parsed before anything else and a gold that fails to parse is
//! `UnparseableGold` (score 0) whatever the completion says; all work is bounded (answer length
//! `MAX_ANSWER_BYTES`, `MAX_TOKENS`, `MAX_DEPTH`, `MAX_EXACT_BITS`, matrix sides, list sizes),
//! with no timers or signals; every extraction step is a linear scan.

pub mod closed_form;
pub mod compare;
pub mod display;
pub mod expr;
pub mod extract;
pub mod lexer;
pub mod matrix;
pub mod number;
pub mod number_words;
pub mod parser;
pub mod plain;
pub mod relation;
pub mod revision;
pub mod spans;
pub mod units;

use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::verifier::{Details, Outcome, RewardInput, RewardOutcome, Verifier, clip_detail};
use compare::{Tolerance, decide};
use expr::Expr;
use extract::{AnswerSource, Extractor, clean_answer};
use parser::{Parsed, parse_with_units};

/// File format of the math reward's options.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct MathConfig {
    pub relative_tolerance: f64,
    pub sample_points: usize,
    pub reject_restated_question: bool,
    pub require_boxed: bool,
    pub last_number_fallback: bool,
    pub compare_units: bool,
}

impl Default for MathConfig {
    fn default() -> Self {
        Self {
            relative_tolerance: 1e-6,
            sample_points: 6,
            reject_restated_question: true,
            require_boxed: false,
            last_number_fallback: true,
            compare_units: true,
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
    compare_units: bool,
    extractor: Extractor,
}

/// What `stoke verify --explain` prints for one completion: the extracted answer, where it came
/// from, both normalized forms and the rule that decided.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Explanation {
    pub extracted: Option<String>,
    pub source: Option<String>,
    pub gold: Option<String>,
    pub normalized_gold: Option<String>,
    pub normalized_prediction: Option<String>,
    pub rule: String,
    pub outcome: Outcome,
}

fn squash(text: &str) -> String {
    text.chars()
        .filter(|c| !c.is_whitespace())
        .collect::<String>()
        .to_lowercase()
}

/// `3,5` (or `0,111`) written as one number: the decimal comma. A three-digit group after a
/// non-zero first group is a thousands separator instead (`1,000`).
fn decimal_comma(text: &str) -> Option<String> {
    let (whole, fraction) = text.split_once(',')?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    let whole_digits = whole.strip_prefix('-').unwrap_or(whole);
    let zero_whole = whole_digits.bytes().all(|b| b == b'0');
    (digits(whole_digits) && digits(fraction) && (fraction.len() != 3 || zero_whole))
        .then(|| format!("{whole}.{fraction}"))
}

/// The normalized form printed by `--explain`: the parse, then its units if any.
fn normalized(parsed: &Parsed) -> String {
    if parsed.units.is_empty() {
        parsed.expr.to_string()
    } else {
        format!("{} [{}]", parsed.expr, parsed.units.join(" "))
    }
}

/// A gold answer as read: its text and its parse.
struct Gold {
    text: String,
    parsed: Parsed,
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
            compare_units: config.compare_units,
            extractor: Extractor::new(),
        })
    }

    /// The gold answer: the whole reference when it parses as an answer (`$[0,1)$`, `1,22`),
    /// else the answer extracted from it as from a completion (a solution ending in a box,
    /// GSM8K's `#### 18`).
    fn read_gold(&self, raw: &str) -> Result<Gold, String> {
        let whole = spans::strip_delimiters(clean_answer(raw));
        let whole = clean_answer(&whole);
        let whole = decimal_comma(whole).unwrap_or_else(|| whole.to_string());
        if !whole.is_empty()
            && let Ok(parsed) = parse_with_units(&whole)
        {
            return Ok(Gold {
                text: whole,
                parsed,
            });
        }
        let found = self
            .extractor
            .extract_reference(raw)
            .map_err(|e| e.to_string())?;
        let text = decimal_comma(&found.answer).unwrap_or(found.answer);
        let parsed = parse_with_units(&text).map_err(|e| e.0)?;
        Ok(Gold { text, parsed })
    }

    /// Parses a gold answer as this verifier would (for dataset checks).
    pub fn parse_gold(raw: &str) -> Result<Expr, String> {
        Self::new(&MathConfig::default())
            .map_err(|e| e.to_string())?
            .read_gold(raw)
            .map(|gold| gold.parsed.expr)
    }

    /// Decides whether `prediction` (an already-extracted answer) matches `gold` (raw gold text).
    pub fn judge(&self, prompt: &str, gold_raw: &str, prediction: &str) -> RewardOutcome {
        self.judge_explained(prompt, gold_raw, prediction, false).0
    }

    /// Judges an extracted answer; the normalized forms are printed only when `explain` is set
    /// (formatting them costs as much as the comparison).
    fn judge_explained(
        &self,
        prompt: &str,
        gold_raw: &str,
        prediction: &str,
        explain: bool,
    ) -> (RewardOutcome, Explanation) {
        let prediction = clean_answer(prediction);
        let mut explanation = Explanation {
            extracted: Some(clip_detail(prediction)),
            source: None,
            gold: None,
            normalized_gold: None,
            normalized_prediction: None,
            rule: String::new(),
            outcome: Outcome::Wrong,
        };
        let mut details = Details {
            extracted: Some(clip_detail(prediction)),
            ..Details::default()
        };
        let finish = |outcome: RewardOutcome, mut explanation: Explanation, rule: &str| {
            explanation.rule = rule.to_string();
            explanation.outcome = outcome.outcome;
            (outcome, explanation)
        };
        let gold = match self.read_gold(gold_raw) {
            Ok(gold) => gold,
            Err(error) => {
                details.reason = Some(format!("gold answer: {error}"));
                let outcome = RewardOutcome::new(0.0, Outcome::UnparseableGold, details);
                return finish(outcome, explanation, "the gold answer does not parse");
            }
        };
        details.gold = Some(clip_detail(&gold.text));
        explanation.gold = Some(clip_detail(&gold.text));
        if explain {
            explanation.normalized_gold = Some(clip_detail(&normalized(&gold.parsed)));
        }
        if squash(prediction) == squash(&gold.text) {
            explanation.normalized_prediction = explanation.normalized_gold.clone();
            return finish(
                RewardOutcome::correct(details),
                explanation,
                "identical text",
            );
        }
        let comma_fixed = if gold.parsed.expr.is_scalar() {
            decimal_comma(prediction.trim())
        } else {
            None
        };
        let pred = match parse_with_units(comma_fixed.as_deref().unwrap_or(prediction)) {
            Ok(parsed) => parsed,
            Err(error) => {
                details.reason = Some(format!("prediction: {}", error.0));
                let outcome = RewardOutcome::new(0.0, Outcome::UnparseablePrediction, details);
                return finish(outcome, explanation, "the prediction does not parse");
            }
        };
        if explain {
            explanation.normalized_prediction = Some(clip_detail(&normalized(&pred)));
        }
        if self.compare_units
            && !gold.parsed.units.is_empty()
            && !pred.units.is_empty()
            && gold.parsed.units != pred.units
        {
            details.reason = Some(format!(
                "units differ: gold {:?}, prediction {:?}",
                gold.parsed.units, pred.units
            ));
            return finish(RewardOutcome::wrong(details), explanation, "units differ");
        }
        let decision = decide(&gold.parsed.expr, &pred.expr, &self.tolerance);
        if !decision.equal {
            details.reason = Some(format!("not equal ({})", decision.rule));
            return finish(RewardOutcome::wrong(details), explanation, decision.rule);
        }
        if self.reject_restated_question && !pred.expr.is_literal() {
            let restated = squash(prediction);
            if restated.len() >= 3 && squash(prompt).contains(&restated) {
                details.reason =
                    Some("the prediction restates an expression from the prompt".into());
                let outcome = RewardOutcome::wrong(details);
                return finish(outcome, explanation, "restates the prompt");
            }
        }
        finish(RewardOutcome::correct(details), explanation, decision.rule)
    }

    /// Scores a completion and explains the decision (`stoke verify --explain`).
    pub fn explain(&self, input: &RewardInput<'_>) -> (RewardOutcome, Explanation) {
        self.score_explained(input, true)
    }

    fn score_explained(
        &self,
        input: &RewardInput<'_>,
        explain: bool,
    ) -> (RewardOutcome, Explanation) {
        let unexplained = |outcome: RewardOutcome, rule: String| {
            let explanation = Explanation {
                extracted: None,
                source: None,
                gold: input.reference.answer.clone(),
                normalized_gold: None,
                normalized_prediction: None,
                rule,
                outcome: outcome.outcome,
            };
            (outcome, explanation)
        };
        let Some(gold_raw) = input.reference.answer.as_deref() else {
            return unexplained(RewardOutcome::missing("answer"), "no gold answer".into());
        };
        let found = match self.extractor.extract(input.completion) {
            Ok(found) => found,
            Err(error) => {
                // The gold is still checked so a broken dataset shows even when the model rambles.
                if let Err(gold_error) = self.read_gold(gold_raw) {
                    let outcome = RewardOutcome::failed(
                        Outcome::UnparseableGold,
                        format!("gold answer: {gold_error}"),
                    );
                    return unexplained(outcome, "the gold answer does not parse".into());
                }
                let outcome =
                    RewardOutcome::failed(Outcome::UnparseablePrediction, error.to_string());
                return unexplained(outcome, format!("extraction: {error}"));
            }
        };
        if (self.require_boxed && found.source != AnswerSource::Boxed)
            || (!self.last_number_fallback && found.source == AnswerSource::LastNumber)
        {
            if let Err(error) = self.read_gold(gold_raw) {
                let outcome = RewardOutcome::failed(
                    Outcome::UnparseableGold,
                    format!("gold answer: {error}"),
                );
                return unexplained(outcome, "the gold answer does not parse".into());
            }
            let outcome = RewardOutcome::failed(
                Outcome::FormatError,
                format!("answer found by {:?}, not accepted", found.source),
            );
            return unexplained(outcome, "format: answer source not accepted".into());
        }
        let (outcome, mut explanation) =
            self.judge_explained(input.prompt, gold_raw, &found.answer, explain);
        explanation.source = Some(format!("{:?}", found.source));
        (outcome, explanation)
    }
}

impl Verifier for MathVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        self.score_explained(input, false).0
    }
}
