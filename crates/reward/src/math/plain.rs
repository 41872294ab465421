//! The plain-text fallback: the last number of a completion that has no statement, box or math
//! span, taken only when it stands alone.
//!
//! What this is not: a parser of the number (`number.rs` reads it) or of the sentence around
//! it. It looks at the characters and the two words on either side and refuses the number when
//! it is part of a word or identifier (`AZYUK2A`), an exponent, subscript, denominator or operand
//! (`x^2`, `a_2`, `1/2`, `2 + 3`, `5-3`), qualified ("at least 12", "not 12", "~12") or one of
//! several joined by and/or ("2 or 3", "x = 3 and x = -3").
//!
//! Invariants: one regex pass over the text; a refused number is an error, never a step back to
//! an earlier number (an earlier number is an intermediate value).

use regex::Regex;

use super::extract::ExtractError;
use super::spans::Span;

/// The second-to-last and last numbers of a text outside math spans.
pub type LastNumbers<'t> = (Option<regex::Match<'t>>, Option<regex::Match<'t>>);

/// Most text between two plain numbers joined by "and"/"or" (`x = 3 and x = -3`).
const MAX_JOINED_GAP_BYTES: usize = 16;
/// Words that, just before a number, make it part of a list or range ("2 or 3", "5 to 7");
/// `units::is_qualifier` words ("at least", "not") disqualify it too.
const CONNECTIVES: &[&str] = &["or", "and", "to", "no"];
/// Words after a number that make it part of a larger answer ("5 thousand", "2 or 3").
const MAGNITUDES: &[&str] = &["hundred", "thousand", "million", "billion", "trillion"];

/// The last two numbers outside math spans (one regex pass).
pub fn last_numbers<'t>(number: &Regex, text: &'t str, spans: &[Span]) -> LastNumbers<'t> {
    let mut previous = None;
    let mut last = None;
    for found in number.find_iter(text) {
        if !spans
            .iter()
            .any(|s| s.start <= found.start() && found.start() < s.end)
        {
            previous = last.replace(found);
        }
    }
    (previous, last)
}

/// The last standalone number outside math spans, with a following magnitude or unit word.
pub fn last_number(text: &str, numbers: LastNumbers<'_>) -> Result<String, ExtractError> {
    let (previous, last) = numbers;
    let Some(found) = last else {
        return Err(ExtractError::NoAnswer);
    };
    if let Some(previous) = previous {
        // `x = 3 and x = -3`, `3, 4 or 5`: the last of several values joined by and/or.
        let gap = text[previous.end()..found.start()].to_ascii_lowercase();
        if gap.len() <= MAX_JOINED_GAP_BYTES
            && !gap.contains(['.', '\n'])
            && (gap.contains(" and ") || gap.contains(" or "))
        {
            return Err(ExtractError::Ambiguous("the last number is one of several"));
        }
    }
    let (start, end) = (found.start(), found.end());
    let number = found.as_str().trim_end_matches(',');
    let end = end - (found.as_str().len() - number.len());
    let before = &text[..start];
    let after = &text[end..];
    let prev = before.chars().next_back();
    if prev.is_some_and(|c| c.is_alphanumeric() || "_^\\{}/.'".contains(c)) {
        return Err(ExtractError::Ambiguous(
            "the last number is part of a larger expression",
        ));
    }
    let next = after.chars().next();
    if next.is_some_and(|c| "^_/{".contains(c)) {
        return Err(ExtractError::Ambiguous(
            "the last number is part of a larger expression",
        ));
    }
    let next_word: String = after
        .trim_start()
        .chars()
        .take_while(|c| c.is_alphabetic())
        .collect::<String>()
        .to_lowercase();
    if next.is_some_and(char::is_alphabetic) && !super::units::is_unit_word(&next_word) {
        return Err(ExtractError::Ambiguous("the last number is part of a word"));
    }
    let trimmed_before = before.trim_end();
    let sign = if trimmed_before.len() == before.len() && before.ends_with('-') {
        "-"
    } else {
        ""
    };
    let before_sign = before[..before.len() - sign.len()].chars().next_back();
    if !sign.is_empty() && before_sign.is_some_and(char::is_alphanumeric) {
        return Err(ExtractError::Ambiguous("the last number is an operand"));
    }
    if trimmed_before.ends_with(['~', '≈']) {
        return Err(ExtractError::Ambiguous(
            "the last number is qualified or hedged",
        ));
    }
    let operator_before = trimmed_before[..trimmed_before.len() - sign.len()]
        .chars()
        .next_back();
    if sign.is_empty() && operator_before.is_some_and(|c| "+-*×·÷/^".contains(c)) {
        return Err(ExtractError::Ambiguous("the last number is an operand"));
    }
    let next_symbol = after.trim_start().chars().next();
    if next_symbol.is_some_and(|c| "+*×·÷=<>/^".contains(c)) {
        return Err(ExtractError::Ambiguous("the last number is an operand"));
    }
    let words_before: Vec<String> = trimmed_before
        .rsplit(|c: char| c.is_whitespace())
        .take(2)
        .map(|w| {
            w.trim_matches(|c: char| !c.is_alphanumeric() && c != '\'')
                .to_lowercase()
        })
        .collect();
    if words_before
        .iter()
        .any(|w| super::units::is_qualifier(w) || CONNECTIVES.contains(&w.as_str()))
        || next_word == "or"
        || next_word == "and"
    {
        return Err(ExtractError::Ambiguous(
            "the last number is qualified or hedged",
        ));
    }
    let mut answer = format!("{sign}{number}");
    if after.starts_with('%') {
        answer.push('%');
    } else if MAGNITUDES.contains(&next_word.as_str())
        || next_word == "percent"
        || super::units::canonical_unit(&next_word).is_some()
    {
        answer.push(' ');
        answer.push_str(&next_word);
    }
    Ok(answer)
}
