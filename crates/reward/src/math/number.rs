//! Number literals as answers write them: `1,000`, `1{,}000`, `1\,000`, `10,\!000`, `1 000`,
//! decimals, the LaTeX decimal comma `3{,}5`, repeating decimals `0.\overline{3}`, base-n
//! subscripts `204_5` and clock times `1:15`.
//!
//! What this is not: a general tokenizer (`lexer.rs` calls `read_number` at a digit or `.`).
//!
//! Invariants: at most `MAX_DIGITS` digits; thousands groups are exactly three digits after a
//! first group of one to three; a base-n literal has every digit below its base (2..=36),
//! otherwise it is an error, never a silent decimal; a time is `h:mm` or `hh:mm` with minutes
//! below 60, and only ever equals another time.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Num, One, Zero};

/// Longest number literal accepted (digits before and after the point together).
pub const MAX_DIGITS: usize = 1000;

/// A literal read from the text.
#[derive(Debug, Clone, PartialEq)]
pub enum Literal {
    Value(BigRational),
    /// `h:mm`, as minutes after midnight (12:00 and 0:00 differ, 1:15 is not 13:15).
    Time(u32),
}

fn run_of_digits(bytes: &[u8], from: usize) -> usize {
    bytes[from.min(bytes.len())..]
        .iter()
        .take_while(|b| b.is_ascii_digit())
        .count()
}

/// Length of a thousands separator at `pos` followed by a three-digit group, else 0.
fn separator(text: &str, pos: usize) -> (usize, bool) {
    let rest = &text[pos..];
    let (len, decimal_capable) = if let Some(after) = rest.strip_prefix(",\\!") {
        // `10,\!000`, with optional spaces after (`11,\! 111`).
        let spaces = after.len() - after.trim_start_matches(' ').len();
        (3 + spaces, false)
    } else if let Some(brace) = ["{,}", "{, }"]
        .into_iter()
        .find(|b| rest.trim_start_matches(' ').starts_with(b))
    {
        // `14{,}916`, `14 {, }916`.
        let before = rest.len() - rest.trim_start_matches(' ').len();
        let after_brace = &rest[before + brace.len()..];
        let after = after_brace.len() - after_brace.trim_start_matches(' ').len();
        (before + brace.len() + after, true)
    } else if rest.starts_with("\\,") || rest.starts_with("\\ ") {
        (2, false)
    } else if rest.starts_with(',') || rest.starts_with(' ') {
        (1, false)
    } else {
        (0, false)
    };
    (len, decimal_capable)
}

/// Reads a number at `pos`; returns the literal and the position after it.
pub fn read_number(text: &str, pos: usize) -> Result<(Literal, usize), String> {
    let bytes = text.as_bytes();
    let mut cursor = pos;
    let first_group = run_of_digits(bytes, cursor);
    let mut digits = text[cursor..cursor + first_group].to_string();
    cursor += first_group;
    if let Some(time) = clock_time(text, pos, first_group) {
        return Ok(time);
    }
    let mut fraction = String::new();
    if (1..=3).contains(&first_group) {
        loop {
            let (sep_len, decimal_capable) = separator(text, cursor);
            if sep_len == 0 {
                break;
            }
            let group_start = cursor + sep_len;
            let group_len = run_of_digits(bytes, group_start);
            // A space separates thousands only between bare digit groups (`1 000`).
            let spaced = text[cursor..].starts_with(' ');
            let after = bytes.get(group_start + group_len).copied();
            if group_len == 3 && !(spaced && after.is_some_and(|b| b == b'.' || b == b',')) {
                digits.push_str(&text[group_start..group_start + 3]);
                cursor = group_start + 3;
            } else {
                if decimal_capable && group_len > 0 {
                    // `3{,}5`: the LaTeX decimal comma.
                    fraction.push_str(&text[group_start..group_start + group_len]);
                    cursor = group_start + group_len;
                }
                break;
            }
        }
    }
    let mut repeating = String::new();
    if fraction.is_empty() && bytes.get(cursor) == Some(&b'.') {
        let fraction_len = run_of_digits(bytes, cursor + 1);
        let overline = repeating_part(text, cursor + 1 + fraction_len);
        if fraction_len > 0 || overline.is_some() {
            fraction.push_str(&text[cursor + 1..cursor + 1 + fraction_len]);
            cursor += 1 + fraction_len;
            if let Some((part, end)) = overline {
                repeating = part;
                cursor = end;
            }
        }
    }
    if digits.len() + fraction.len() + repeating.len() > MAX_DIGITS {
        return Err(format!("number longer than {MAX_DIGITS} digits"));
    }
    if fraction.is_empty()
        && repeating.is_empty()
        && let Some((value, end)) = base_subscript(text, cursor, &digits)?
    {
        return Ok((Literal::Value(value), end));
    }
    let mut value = decimal_value(&digits, &fraction, &repeating)?;
    if repeating.is_empty()
        && let Some((exponent, end)) = scientific_exponent(text, cursor)
    {
        // `1.5e3`, `2E-4`: scientific notation, bounded like any exact power.
        let power = num_traits::pow(
            BigRational::from_integer(10.into()),
            exponent.unsigned_abs() as usize,
        );
        value = if exponent < 0 {
            value / power
        } else {
            value * power
        };
        cursor = end;
    }
    Ok((Literal::Value(value), cursor))
}

/// `e3`, `E-4` right after a number and not followed by a letter: the exponent (at most 400).
fn scientific_exponent(text: &str, pos: usize) -> Option<(i64, usize)> {
    let bytes = text.as_bytes();
    if !matches!(bytes.get(pos), Some(b'e' | b'E')) {
        return None;
    }
    let sign_len = usize::from(matches!(bytes.get(pos + 1), Some(b'-' | b'+')));
    let digits = run_of_digits(bytes, pos + 1 + sign_len);
    let end = pos + 1 + sign_len + digits;
    if digits == 0 || digits > 3 || bytes.get(end).is_some_and(u8::is_ascii_alphanumeric) {
        return None;
    }
    let magnitude: i64 = text[pos + 1 + sign_len..end].parse().ok()?;
    let exponent = if bytes[pos + 1] == b'-' {
        -magnitude
    } else {
        magnitude
    };
    (magnitude <= 400).then_some((exponent, end))
}

/// `h:mm` at `pos` (`first_group` digits already counted), not part of a longer number.
fn clock_time(text: &str, pos: usize, first_group: usize) -> Option<(Literal, usize)> {
    let bytes = text.as_bytes();
    let colon = pos + first_group;
    if !(1..=2).contains(&first_group) || bytes.get(colon) != Some(&b':') {
        return None;
    }
    let minutes_len = run_of_digits(bytes, colon + 1);
    let next = bytes.get(colon + 1 + minutes_len);
    if minutes_len != 2 || next.is_some_and(|b| *b == b'.' || *b == b':') {
        return None;
    }
    let hours: u32 = text[pos..colon].parse().ok()?;
    let minutes: u32 = text[colon + 1..colon + 3].parse().ok()?;
    (hours <= 24 && minutes < 60).then_some((Literal::Time(hours * 60 + minutes), colon + 3))
}

/// `\overline{3}` (or `\overline3`, `\dot{3}`) right after the decimal digits.
fn repeating_part(text: &str, pos: usize) -> Option<(String, usize)> {
    let rest = &text[pos..];
    let command = ["\\overline", "\\dot", "\\bar"]
        .into_iter()
        .find(|c| rest.starts_with(c))?;
    let after = pos + command.len();
    let bytes = text.as_bytes();
    if bytes.get(after) == Some(&b'{') {
        let len = run_of_digits(bytes, after + 1);
        (len > 0 && bytes.get(after + 1 + len) == Some(&b'}')).then(|| {
            (
                text[after + 1..after + 1 + len].to_string(),
                after + len + 2,
            )
        })
    } else {
        let len = run_of_digits(bytes, after).min(1);
        (len > 0).then(|| (text[after..after + 1].to_string(), after + 1))
    }
}

/// `204_5`, `13_{5}`, `8_{10}`: the digits read in that base.
fn base_subscript(
    text: &str,
    pos: usize,
    digits: &str,
) -> Result<Option<(BigRational, usize)>, String> {
    let bytes = text.as_bytes();
    if bytes.get(pos) != Some(&b'_') || digits.is_empty() {
        return Ok(None);
    }
    let (base_start, braced) = if bytes.get(pos + 1) == Some(&b'{') {
        (pos + 2, true)
    } else {
        (pos + 1, false)
    };
    let len = run_of_digits(bytes, base_start);
    if len == 0 || len > 2 || (braced && bytes.get(base_start + len) != Some(&b'}')) {
        return Ok(None);
    }
    let base: u32 = text[base_start..base_start + len]
        .parse()
        .map_err(|_| "bad base".to_string())?;
    if !(2..=36).contains(&base) {
        return Err(format!("base {base} out of range"));
    }
    let value = BigInt::from_str_radix(digits, base)
        .map_err(|_| format!("{digits} is not a base-{base} number"))?;
    let end = base_start + len + usize::from(braced);
    Ok(Some((BigRational::from_integer(value), end)))
}

fn decimal_value(digits: &str, fraction: &str, repeating: &str) -> Result<BigRational, String> {
    let mut all = digits.to_string();
    all.push_str(fraction);
    if all.is_empty() {
        all.push('0');
    }
    let parse = |s: &str| BigInt::from_str_radix(s, 10).map_err(|e| e.to_string());
    let numer = parse(&all)?;
    let scale = num_traits::pow(BigInt::from(10), fraction.len());
    let mut value = if scale.is_one() {
        BigRational::from_integer(numer)
    } else {
        BigRational::new(numer, scale.clone())
    };
    if !repeating.is_empty() {
        // 0.1\overline{6} = 0.1 + 6 / (10 * (10^1 - 1)).
        let period = num_traits::pow(BigInt::from(10), repeating.len()) - BigInt::one();
        let tail = BigRational::new(parse(repeating)?, scale * period);
        if !tail.is_zero() {
            value += tail;
        }
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn value(text: &str) -> (Literal, usize) {
        read_number(text, 0).unwrap()
    }

    fn rational(n: i64, d: i64) -> Literal {
        Literal::Value(BigRational::new(n.into(), d.into()))
    }

    #[test]
    fn separators_decimals_and_repeating_decimals() {
        assert_eq!(value("1,000,000").0, rational(1_000_000, 1));
        assert_eq!(value("11,\\! 111").0, rational(11_111, 1));
        assert_eq!(value("1 000").0, rational(1000, 1));
        assert_eq!(value("32, 349"), (rational(32, 1), 2));
        assert_eq!(value("3{,}5").0, rational(7, 2));
        assert_eq!(value("14 {, }916").0, rational(14_916, 1));
        assert_eq!(value("0.\\overline{3}").0, rational(1, 3));
        assert_eq!(value("0.1\\overline{6}").0, rational(1, 6));
    }

    #[test]
    fn base_n_subscripts_and_times() {
        assert_eq!(value("204_5").0, rational(54, 1));
        assert_eq!(value("8_{10}").0, rational(8, 1));
        assert!(read_number("29_5", 0).is_err());
        assert_eq!(value("1:15").0, Literal::Time(75));
        assert_eq!(value("1.5e3").0, rational(1500, 1));
        assert_eq!(value("2E-2").0, rational(1, 50));
        assert_eq!(value("2ex"), (rational(2, 1), 1));
        assert_eq!(value("3:2").0, rational(3, 1));
    }
}
