//! Numbers written in English words inside an answer: "forty-two", "twelve", "one hundred and
//! five", "two thousand and twenty-four", "minus three", and simple fractions: "three
//! quarters", "two-thirds", "a half", "one and a half", "two and three quarters".
//!
//! Scope (everything else is left to the lexer, so it is a word, a unit or an error):
//! - cardinals zero to nineteen, the tens, "hundred" after one to ninety-nine ("twelve hundred"
//!   is 1200), and the scales thousand, million, billion, trillion in descending order, with an
//!   optional "and" before the last part; words joined by spaces or single hyphens;
//! - "a" only before hundred/thousand/million/billion/trillion or a fraction word ("a half");
//! - a fraction is a cardinal followed by half/halves, third(s), quarter(s), fourth(s) ... up to
//!   twelfth(s); an ordinal alone ("fourth") is not a number, nor is "half" alone;
//! - "minus" or "negative" before a number negates it.
//!
//! What this is not: prose reading. The last-number fallback of `plain.rs` reads digits only, so
//! "one of the two sides" in a trailing sentence is never an answer; number words count where
//! an answer is already located (a box, a statement, a short whole answer).
//!
//! Invariants: one left-to-right pass over at most `MAX_WORDS` words; values stay below 10^15,
//! so the arithmetic is `u64` and cannot overflow.

use num_bigint::BigInt;
use num_rational::BigRational;

/// Most words read as one number phrase.
const MAX_WORDS: usize = 40;

fn small(word: &str) -> Option<u64> {
    Some(match word {
        "zero" => 0,
        "one" => 1,
        "two" => 2,
        "three" => 3,
        "four" => 4,
        "five" => 5,
        "six" => 6,
        "seven" => 7,
        "eight" => 8,
        "nine" => 9,
        "ten" => 10,
        "eleven" => 11,
        "twelve" => 12,
        "thirteen" => 13,
        "fourteen" => 14,
        "fifteen" => 15,
        "sixteen" => 16,
        "seventeen" => 17,
        "eighteen" => 18,
        "nineteen" => 19,
        _ => return None,
    })
}

fn tens(word: &str) -> Option<u64> {
    Some(match word {
        "twenty" => 20,
        "thirty" => 30,
        "forty" | "fourty" => 40,
        "fifty" => 50,
        "sixty" => 60,
        "seventy" => 70,
        "eighty" => 80,
        "ninety" => 90,
        _ => return None,
    })
}

fn scale(word: &str) -> Option<u64> {
    Some(match word {
        "thousand" => 1_000,
        "million" => 1_000_000,
        "billion" => 1_000_000_000,
        "trillion" => 1_000_000_000_000,
        _ => return None,
    })
}

/// The denominator a fraction word names ("quarters" is 4).
fn denominator(word: &str) -> Option<u64> {
    Some(match word {
        "half" | "halves" => 2,
        "third" | "thirds" => 3,
        "quarter" | "quarters" | "fourth" | "fourths" => 4,
        "fifth" | "fifths" => 5,
        "sixth" | "sixths" => 6,
        "seventh" | "sevenths" => 7,
        "eighth" | "eighths" => 8,
        "ninth" | "ninths" => 9,
        "tenth" | "tenths" => 10,
        "eleventh" | "elevenths" => 11,
        "twelfth" | "twelfths" => 12,
        _ => return None,
    })
}

/// Whether `word` can begin a number phrase.
fn starts_number(word: &str) -> bool {
    small(word).is_some() || tens(word).is_some()
}

/// The first `most` lowercase words from `pos` with their byte ranges: runs of ASCII letters
/// separated by spaces or a single hyphen. Stops at anything else.
fn words_from(text: &str, pos: usize, most: usize) -> Vec<(String, usize, usize)> {
    let bytes = text.as_bytes();
    let mut words = Vec::new();
    let mut index = pos;
    while words.len() < most {
        let start = index;
        while index < bytes.len() && bytes[index].is_ascii_alphabetic() {
            index += 1;
        }
        if index == start {
            break;
        }
        words.push((text[start..index].to_ascii_lowercase(), start, index));
        let gap_start = index;
        if bytes.get(index) == Some(&b'-') {
            index += 1;
        } else {
            while bytes.get(index) == Some(&b' ') {
                index += 1;
            }
        }
        if index == gap_start || !bytes.get(index).is_some_and(u8::is_ascii_alphabetic) {
            break;
        }
    }
    words
}

/// A whole number read from `words[at..]`: its value and how many words it used.
fn cardinal(words: &[(String, usize, usize)], at: usize) -> Option<(u64, usize)> {
    let mut total = 0u64;
    let mut group = 0u64;
    // What the last word was, to reject "five six" or "twenty thirty".
    let mut has_units = false;
    let mut has_tens = false;
    let mut has_hundred = false;
    let mut last_scale = u64::MAX;
    let mut used = 0;
    let mut index = at;
    let mut any = false;
    while let Some((word, ..)) = words.get(index) {
        let word = word.as_str();
        if word == "and" || word == "a" {
            // "one hundred and five", "a thousand": only where a number goes on.
            let next = words.get(index + 1).map(|w| w.0.as_str());
            let continues = if word == "and" {
                any && (has_hundred || last_scale != u64::MAX)
                    && !has_units
                    && !has_tens
                    && next.is_some_and(starts_number)
            } else {
                !any && next.is_some_and(|n| n == "hundred" || scale(n).is_some())
            };
            if !continues {
                break;
            }
            if word == "a" {
                group = 1;
                has_units = true;
                any = true;
            }
            index += 1;
            continue;
        }
        if let Some(value) = small(word) {
            if has_units || (has_tens && value >= 10) {
                break;
            }
            group += value;
            has_units = true;
        } else if let Some(value) = tens(word) {
            if has_units || has_tens {
                break;
            }
            group += value;
            has_tens = true;
        } else if word == "hundred" {
            if has_hundred || group == 0 || group > 99 {
                break;
            }
            group *= 100;
            has_hundred = true;
            has_units = false;
            has_tens = false;
        } else if let Some(value) = scale(word) {
            if group == 0 || value >= last_scale {
                break;
            }
            total += group * value;
            group = 0;
            last_scale = value;
            has_units = false;
            has_tens = false;
            has_hundred = false;
        } else {
            break;
        }
        any = true;
        index += 1;
        used = index - at;
    }
    (used > 0).then_some((total + group, used))
}

fn rational(numer: u64, denom: u64) -> BigRational {
    BigRational::new(BigInt::from(numer), BigInt::from(denom))
}

/// Reads a number phrase starting at byte `pos` of `text` (the start of a word): its value and
/// the byte offset after its last word, or `None` when no number phrase starts there.
pub fn read_number_words(text: &str, pos: usize) -> Option<(BigRational, usize)> {
    let words = words_from(text, pos, MAX_WORDS);
    let first = words.first()?.0.as_str();
    let (negative, at) = if first == "minus" || first == "negative" {
        (true, 1)
    } else {
        (false, 0)
    };
    let word = |index: usize| words.get(index).map(|w| w.0.as_str());
    let end_of = |index: usize| words[index].2;
    // "a half", "a quarter".
    if word(at) == Some("a")
        && let Some(denom) = word(at + 1).and_then(denominator)
    {
        let value = rational(1, denom);
        return Some((if negative { -value } else { value }, end_of(at + 1)));
    }
    let (whole, used) = cardinal(&words, at)?;
    let mut last = at + used - 1;
    let mut value = BigRational::from_integer(BigInt::from(whole));
    if let Some(denom) = word(last + 1).and_then(denominator) {
        // "three quarters", "two-thirds".
        value = rational(whole, denom);
        last += 1;
    } else if word(last + 1) == Some("and") {
        // "one and a half", "two and three quarters".
        let fraction = if word(last + 2) == Some("a") {
            word(last + 3)
                .and_then(denominator)
                .map(|denom| (rational(1, denom), last + 3))
        } else {
            cardinal(&words, last + 2).and_then(|(numer, used)| {
                let at = last + 2 + used;
                word(at)
                    .and_then(denominator)
                    .map(|denom| (rational(numer, denom), at))
            })
        };
        if let Some((fraction, at)) = fraction {
            value += fraction;
            last = at;
        }
    }
    Some((if negative { -value } else { value }, end_of(last)))
}

/// The value of `text` when the whole of it is one number phrase ("forty-two").
pub fn phrase_value(text: &str) -> Option<BigRational> {
    let trimmed = text.trim();
    if !trimmed.starts_with(|c: char| c.is_ascii_alphabetic()) {
        return None;
    }
    let (value, end) = read_number_words(trimmed, 0)?;
    (end == trimmed.len()).then_some(value)
}

/// Whether a number phrase starts at the word at `pos` (used by the lexer before it reads a word).
pub fn starts_number_phrase(text: &str, pos: usize) -> bool {
    let words = words_from(text, pos, 3);
    match words.first().map(|w| w.0.as_str()) {
        Some("minus" | "negative") => words.get(1).is_some_and(|w| {
            starts_number(&w.0)
                || (w.0 == "a" && words.get(2).is_some_and(|n| denominator(&n.0).is_some()))
        }),
        Some("a") => words.get(1).is_some_and(|w| {
            w.0 == "hundred" || scale(&w.0).is_some() || denominator(&w.0).is_some()
        }),
        Some(word) => starts_number(word),
        None => false,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> Option<BigRational> {
        phrase_value(text)
    }

    fn int(n: i64) -> Option<BigRational> {
        Some(BigRational::from_integer(BigInt::from(n)))
    }

    #[test]
    fn cardinals_compounds_and_scales() {
        assert_eq!(value("forty-two"), int(42));
        assert_eq!(value("Forty two"), int(42));
        assert_eq!(value("twelve"), int(12));
        assert_eq!(value("one hundred and five"), int(105));
        assert_eq!(value("twelve hundred"), int(1200));
        assert_eq!(value("two thousand and twenty-four"), int(2024));
        assert_eq!(value("a thousand"), int(1000));
        assert_eq!(value("three million four hundred thousand"), int(3_400_000));
        assert_eq!(value("minus seven"), int(-7));
        assert_eq!(value("zero"), int(0));
    }

    #[test]
    fn fractions_are_a_cardinal_and_a_fraction_word() {
        let r = |n: i64, d: i64| Some(BigRational::new(n.into(), d.into()));
        assert_eq!(value("three quarters"), r(3, 4));
        assert_eq!(value("two-thirds"), r(2, 3));
        assert_eq!(value("a half"), r(1, 2));
        assert_eq!(value("one and a half"), r(3, 2));
        assert_eq!(value("two and three quarters"), r(11, 4));
    }

    #[test]
    fn malformed_phrases_and_other_words_are_not_numbers() {
        assert_eq!(value("five six"), None);
        assert_eq!(value("twenty thirty"), None);
        assert_eq!(value("hundred"), None);
        assert_eq!(value("fourth"), None);
        assert_eq!(value("half"), None);
        assert_eq!(value("one of them"), None);
        assert_eq!(value("thousand million"), None);
        assert_eq!(value("one million one billion"), None);
        assert_eq!(value("tenth"), None);
        assert_eq!(value("often"), None);
        // A phrase stops where the number ends; the lexer reads what follows.
        assert_eq!(
            read_number_words("two and three", 0).map(|(_, end)| end),
            Some(3)
        );
        assert_eq!(
            read_number_words("forty-two apples", 0).map(|(_, end)| end),
            Some(9)
        );
    }
}
