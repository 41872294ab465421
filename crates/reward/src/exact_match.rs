//! Exact and normalized matching: string answers, integers, multiple-choice letters and GSM8K's
//! `#### n`.
//!
//! Config (`kind = "exact_match"`):
//! - `mode`: `"normalized"` (default: lowercase, whitespace collapsed, surrounding quotes, `$`,
//!   brackets and a final period stripped), `"string"` (exact after trimming), `"integer"`
//!   (thousands separators and a `.0` tail ignored, compared as big integers), `"choice"` (a
//!   letter A-J; `(B)`, `B)`, `B.` and "the answer is B" all read as `B`), `"gsm8k"` (the gold's
//!   number after `####`; the prediction's number after its last `####`, else its final answer,
//!   else its last number; compared as exact decimals).
//! - `extract_answer` (bool, default true): compare the completion's final answer (`\boxed{}`,
//!   `<answer>`, "answer is") instead of the whole completion; with none found, the whole
//!   completion is used.
//!
//! What this is not: math equivalence (`1/2` is not `0.5` here; use `math` for that).

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::Num;
use regex::Regex;
use serde::{Deserialize, Serialize};

use crate::error::ConfigError;
use crate::math::extract::{AnswerSource, Extractor, clean_answer};
use crate::verifier::{Details, Outcome, RewardInput, RewardOutcome, Verifier, clip_detail};

/// How the gold and the prediction are compared.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum MatchMode {
    String,
    #[default]
    Normalized,
    Integer,
    Choice,
    Gsm8k,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct ExactMatchConfig {
    pub mode: MatchMode,
    pub extract_answer: bool,
}

impl Default for ExactMatchConfig {
    fn default() -> Self {
        Self {
            mode: MatchMode::Normalized,
            extract_answer: true,
        }
    }
}

#[derive(Debug, Clone)]
pub struct ExactMatchVerifier {
    mode: MatchMode,
    extract_answer: bool,
    extractor: Extractor,
    choice_letter: Regex,
    number: Regex,
}

/// Lowercase, whitespace collapsed, wrapping punctuation removed.
pub fn normalize_text(text: &str) -> String {
    let collapsed = text
        .split_whitespace()
        .collect::<Vec<_>>()
        .join(" ")
        .to_lowercase();
    let trimmed = collapsed
        .trim_matches(|c: char| matches!(c, '"' | '\'' | '`' | '$' | '(' | ')' | '[' | ']' | '*'))
        .trim_end_matches('.')
        .trim();
    trimmed.to_string()
}

/// A decimal number with thousands separators, `$` and a trailing period removed.
fn parse_decimal(text: &str) -> Option<BigRational> {
    let cleaned: String = text
        .trim()
        .trim_end_matches('.')
        .chars()
        .filter(|c| !matches!(c, ',' | '$' | ' '))
        .collect();
    let (negative, digits) = match cleaned.strip_prefix('-') {
        Some(rest) => (true, rest),
        None => (false, cleaned.as_str()),
    };
    let (whole, fraction) = digits.split_once('.').unwrap_or((digits, ""));
    let all_digits = |s: &str| s.bytes().all(|b| b.is_ascii_digit());
    if whole.is_empty() && fraction.is_empty() || !all_digits(whole) || !all_digits(fraction) {
        return None;
    }
    if whole.len() + fraction.len() > 400 {
        return None;
    }
    let numer = BigInt::from_str_radix(&format!("{whole}{fraction}0"), 10).ok()? / BigInt::from(10);
    let value = BigRational::new(numer, num_traits::pow(BigInt::from(10), fraction.len()));
    Some(if negative { -value } else { value })
}

impl ExactMatchVerifier {
    pub fn new(config: &ExactMatchConfig) -> Result<Self, ConfigError> {
        Ok(Self {
            mode: config.mode,
            extract_answer: config.extract_answer,
            extractor: Extractor::new(),
            choice_letter: Regex::new(r"(?:^|[^A-Za-z])([A-J])(?:$|[^A-Za-z])")
                .expect("static choice regex compiles"),
            number: Regex::new(r"-?\$?\d[\d,]*(?:\.\d+)?").expect("static number regex compiles"),
        })
    }

    /// The part of the completion to compare.
    fn answer_text(&self, completion: &str) -> String {
        if self.extract_answer
            && let Ok(found) = self.extractor.extract(completion)
            && found.source != AnswerSource::LastNumber
        {
            return found.answer;
        }
        completion.trim().to_string()
    }

    fn letter(&self, text: &str) -> Option<String> {
        let captures = self.choice_letter.captures(text.trim())?;
        captures.get(1).map(|m| m.as_str().to_string())
    }

    fn gsm8k_prediction(&self, completion: &str) -> Option<String> {
        if let Some(hashes) = completion.rfind("####") {
            let line = completion[hashes + 4..].lines().next().unwrap_or("");
            return self.number.find(line).map(|m| m.as_str().to_string());
        }
        if let Ok(found) = self.extractor.extract(completion)
            && let Some(number) = self.number.find(&found.answer)
        {
            return Some(number.as_str().to_string());
        }
        self.number
            .find_iter(completion)
            .last()
            .map(|m| m.as_str().to_string())
    }
}

impl Verifier for ExactMatchVerifier {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let Some(gold_raw) = input.reference.answer.as_deref() else {
            return RewardOutcome::missing("answer");
        };
        let unparseable_gold =
            |why: &str| RewardOutcome::failed(Outcome::UnparseableGold, why.to_string());
        let (gold, prediction, equal): (String, Option<String>, bool) = match self.mode {
            MatchMode::String => {
                let gold = gold_raw.trim();
                if gold.is_empty() {
                    // An empty completion would match it.
                    return unparseable_gold("gold answer is empty");
                }
                let prediction = self.answer_text(input.completion);
                (
                    gold.to_string(),
                    Some(prediction.to_string()),
                    prediction == gold,
                )
            }
            MatchMode::Normalized => {
                let gold = normalize_text(clean_answer(gold_raw));
                if gold.is_empty() {
                    return unparseable_gold("gold answer is empty");
                }
                let prediction = normalize_text(&self.answer_text(input.completion));
                let equal = prediction == gold;
                (gold, Some(prediction), equal)
            }
            MatchMode::Integer | MatchMode::Gsm8k => {
                let gold_text = match gold_raw.rfind("####") {
                    Some(hashes) => &gold_raw[hashes + 4..],
                    None => gold_raw,
                };
                let Some(gold) = parse_decimal(clean_answer(gold_text)) else {
                    return unparseable_gold("gold answer is not a number");
                };
                if self.mode == MatchMode::Integer && !gold.is_integer() {
                    return unparseable_gold("gold answer is not an integer");
                }
                let prediction_text = if self.mode == MatchMode::Gsm8k {
                    self.gsm8k_prediction(input.completion)
                } else {
                    let answer = self.answer_text(input.completion);
                    self.number
                        .find_iter(&answer)
                        .last()
                        .map(|m| m.as_str().to_string())
                };
                let prediction = prediction_text.as_deref().and_then(parse_decimal);
                let equal = prediction.as_ref() == Some(&gold);
                (gold.to_string(), prediction_text, equal)
            }
            MatchMode::Choice => {
                let Some(gold) = self.letter(clean_answer(gold_raw)) else {
                    return unparseable_gold("gold answer is not a letter A-J");
                };
                let prediction = self.letter(&self.answer_text(input.completion));
                let equal = prediction.as_deref() == Some(gold.as_str());
                (gold, prediction, equal)
            }
        };
        let details = Details {
            extracted: prediction.as_deref().map(clip_detail),
            gold: Some(clip_detail(&gold)),
            ..Details::default()
        };
        match (prediction, equal) {
            (_, true) => RewardOutcome::correct(details),
            (None, false) => RewardOutcome::new(0.0, Outcome::UnparseablePrediction, details),
            (Some(_), false) => RewardOutcome::wrong(details),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Reference;

    fn score(mode: MatchMode, gold: &str, completion: &str) -> Outcome {
        let verifier = ExactMatchVerifier::new(&ExactMatchConfig {
            mode,
            extract_answer: true,
        })
        .unwrap();
        let reference = Reference {
            answer: Some(gold.into()),
            ..Reference::default()
        };
        verifier
            .score(&RewardInput::new("", completion, &reference))
            .outcome
    }

    #[test]
    fn exact_match_string_mode_rejects_empty_gold_instead_of_matching_empty_completion() {
        assert_eq!(score(MatchMode::String, "", ""), Outcome::UnparseableGold);
        assert_eq!(
            score(MatchMode::String, "  \n", "  "),
            Outcome::UnparseableGold
        );
        assert_eq!(
            score(MatchMode::Normalized, "\"\"", ""),
            Outcome::UnparseableGold
        );
        assert_eq!(score(MatchMode::String, "yes", "yes"), Outcome::Correct);
    }

    #[test]
    fn normalized_ignores_case_space_and_wrapping() {
        assert_eq!(
            score(MatchMode::Normalized, "Paris", "The answer is \"paris\"."),
            Outcome::Correct
        );
        assert_eq!(
            score(MatchMode::Normalized, "New  York", "new york"),
            Outcome::Correct
        );
        assert_eq!(
            score(MatchMode::Normalized, "Paris", "London"),
            Outcome::Wrong
        );
    }

    #[test]
    fn string_mode_is_case_sensitive() {
        assert_eq!(score(MatchMode::String, "Paris", "paris"), Outcome::Wrong);
        assert_eq!(
            score(MatchMode::String, "Paris", " Paris\n"),
            Outcome::Correct
        );
    }

    #[test]
    fn integer_mode_reads_separators() {
        assert_eq!(
            score(MatchMode::Integer, "1234", "so \\boxed{1,234}"),
            Outcome::Correct
        );
        assert_eq!(
            score(MatchMode::Integer, "1234", "so \\boxed{1235}"),
            Outcome::Wrong
        );
        assert_eq!(
            score(MatchMode::Integer, "12.5", "12.5"),
            Outcome::UnparseableGold
        );
    }

    #[test]
    fn choice_mode_reads_letters_in_many_shapes() {
        assert_eq!(
            score(MatchMode::Choice, "(B)", "The answer is (B)."),
            Outcome::Correct
        );
        assert_eq!(
            score(MatchMode::Choice, "B", "\\boxed{B}"),
            Outcome::Correct
        );
        assert_eq!(
            score(MatchMode::Choice, "B", "The answer is C"),
            Outcome::Wrong
        );
        assert_eq!(
            score(MatchMode::Choice, "banana", "B"),
            Outcome::UnparseableGold
        );
    }

    #[test]
    fn gsm8k_mode_reads_hashes_on_both_sides() {
        let gold = "Natalia sold 48/2 = 24 clips.\n#### 72";
        assert_eq!(
            score(MatchMode::Gsm8k, gold, "She sold 72 clips.\n#### 72"),
            Outcome::Correct
        );
        assert_eq!(
            score(MatchMode::Gsm8k, gold, "total $72.00"),
            Outcome::Correct
        );
        assert_eq!(score(MatchMode::Gsm8k, gold, "#### 1,072"), Outcome::Wrong);
        assert_eq!(
            score(MatchMode::Gsm8k, gold, "no number"),
            Outcome::UnparseablePrediction
        );
        assert_eq!(
            score(MatchMode::Gsm8k, "#### seventy", "72"),
            Outcome::UnparseableGold
        );
    }
}
