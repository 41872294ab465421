//! An exact-arithmetic calculator tool: `+ - * / // % ^` (also `**`) and parentheses over
//! integers and decimals, evaluated in arbitrary-precision rationals, so a 12-digit product is
//! exact where a float would round.
//!
//! What it is: a pure-Rust evaluator, safe to run in-process (no code execution, bounded input,
//! bounded exponents), offered to the model as the `calculator` tool. What it is not: a Python
//! interpreter (the sandboxed `python` tool is that), or symbolic maths.
//!
//! Results print as integers when whole, as exact decimals when the decimal terminates within
//! 30 digits, else as `p/q (≈ decimal)`. Errors are tool outputs with `failed` set: division by
//! zero, a syntax error naming the character position, a too-large exponent.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::{Signed, ToPrimitive, Zero};
use serde_json::{Value, json};

use crate::tool::{Tool, ToolOutput, ToolSpec, Workspace};

/// Longest expression accepted, in bytes.
pub const MAX_EXPRESSION_BYTES: usize = 1_000;
/// Largest exponent accepted (|e|), and largest result size in decimal digits.
const MAX_EXPONENT: u32 = 4_096;
const MAX_DIGITS: u64 = 10_000;
/// Digits after the point shown for a decimal.
const MAX_DECIMALS: usize = 30;

/// The `calculator` tool.
#[derive(Clone, Copy, Debug, Default)]
pub struct Calculator;

impl Tool for Calculator {
    fn spec(&self) -> ToolSpec {
        ToolSpec {
            name: "calculator".into(),
            description: "Evaluate an arithmetic expression exactly. Supports + - * / // % ^ and parentheses."
                .into(),
            parameters: json!({
                "type": "object",
                "properties": {
                    "expression": {"type": "string", "description": "e.g. \"48213 * 9127 - 5\""}
                },
                "required": ["expression"]
            }),
        }
    }

    fn call(&self, arguments: &Value, _workspace: &mut Workspace) -> ToolOutput {
        let expression = match arguments {
            Value::String(text) => text.as_str(),
            Value::Object(map) => match map.get("expression").and_then(Value::as_str) {
                Some(text) => text,
                None => return ToolOutput::error("error: missing string argument `expression`"),
            },
            _ => return ToolOutput::error("error: arguments must be {\"expression\": \"...\"}"),
        };
        match evaluate(expression) {
            Ok(value) => ToolOutput::ok(format_number(&value)),
            Err(message) => ToolOutput::error(format!("error: {message}")),
        }
    }
}

/// The exact value of `expression`, or why it has none.
pub fn evaluate(expression: &str) -> Result<BigRational, String> {
    if expression.len() > MAX_EXPRESSION_BYTES {
        return Err(format!(
            "the expression has {} bytes (limit {MAX_EXPRESSION_BYTES})",
            expression.len()
        ));
    }
    let tokens = tokenize(expression)?;
    let mut parser = Parser { tokens, next: 0 };
    let value = parser.expression()?;
    match parser.tokens.get(parser.next) {
        None => Ok(value),
        Some((_, at)) => Err(format!("unexpected input at character {}", at + 1)),
    }
}

/// `value` as the tool prints it (see the module doc).
pub fn format_number(value: &BigRational) -> String {
    if value.is_integer() {
        return value.to_integer().to_string();
    }
    let sign = if value.is_negative() { "-" } else { "" };
    let value = value.abs();
    let whole = value.to_integer();
    let mut remainder = value.numer() - &whole * value.denom();
    let mut digits = String::new();
    for _ in 0..MAX_DECIMALS {
        if remainder.is_zero() {
            break;
        }
        remainder *= 10;
        let digit = &remainder / value.denom();
        remainder -= &digit * value.denom();
        digits.push_str(&digit.to_string());
    }
    if remainder.is_zero() {
        format!("{sign}{whole}.{digits}")
    } else {
        let approx = value.to_f64().unwrap_or(f64::NAN);
        format!(
            "{sign}{}/{} (≈ {sign}{approx})",
            value.numer(),
            value.denom()
        )
    }
}

#[derive(Clone, Debug, PartialEq)]
enum Token {
    Number(BigRational),
    Op(&'static str),
    Open,
    Close,
}

fn tokenize(text: &str) -> Result<Vec<(Token, usize)>, String> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::new();
    let mut i = 0;
    while i < bytes.len() {
        let c = bytes[i];
        let start = i;
        match c {
            b' ' | b'\t' | b'\n' => {
                i += 1;
                continue;
            }
            b'0'..=b'9' | b'.' => {
                // Digit groups: `1,000` and `1_000` are one number.
                while i < bytes.len()
                    && (bytes[i].is_ascii_digit()
                        || bytes[i] == b'.'
                        || (matches!(bytes[i], b',' | b'_') && next_is_digit(bytes, i)))
                {
                    i += 1;
                }
                let literal: String = text[start..i]
                    .chars()
                    .filter(|&c| c != '_' && c != ',')
                    .collect();
                tokens.push((Token::Number(parse_decimal(&literal, start)?), start));
                continue;
            }
            b'(' => tokens.push((Token::Open, start)),
            b')' => tokens.push((Token::Close, start)),
            b'+' => tokens.push((Token::Op("+"), start)),
            b'-' => tokens.push((Token::Op("-"), start)),
            b'%' => tokens.push((Token::Op("%"), start)),
            b'^' => tokens.push((Token::Op("^"), start)),
            b'x' => tokens.push((Token::Op("*"), start)),
            b'*' if bytes.get(i + 1) == Some(&b'*') => {
                tokens.push((Token::Op("^"), start));
                i += 1;
            }
            b'*' => tokens.push((Token::Op("*"), start)),
            b'/' if bytes.get(i + 1) == Some(&b'/') => {
                tokens.push((Token::Op("//"), start));
                i += 1;
            }
            b'/' => tokens.push((Token::Op("/"), start)),
            _ => {
                let shown = text[start..].chars().next().unwrap_or('?');
                if shown == '×' {
                    tokens.push((Token::Op("*"), start));
                    i += shown.len_utf8();
                    continue;
                }
                if shown == '÷' {
                    tokens.push((Token::Op("/"), start));
                    i += shown.len_utf8();
                    continue;
                }
                return Err(format!(
                    "unexpected character {shown:?} at character {}",
                    text[..start].chars().count() + 1
                ));
            }
        }
        i += 1;
    }
    if tokens.is_empty() {
        return Err("the expression is empty".into());
    }
    Ok(tokens)
}

fn next_is_digit(bytes: &[u8], i: usize) -> bool {
    bytes.get(i + 1).is_some_and(u8::is_ascii_digit)
}

fn parse_decimal(literal: &str, at: usize) -> Result<BigRational, String> {
    let bad = || format!("bad number {literal:?} at character {}", at + 1);
    let (whole, fraction) = literal.split_once('.').unwrap_or((literal, ""));
    if (whole.is_empty() && fraction.is_empty()) || fraction.contains('.') {
        return Err(bad());
    }
    let digits = format!("{whole}{fraction}");
    let numerator: BigInt = digits.parse().map_err(|_| bad())?;
    let denominator = BigInt::from(10u32).pow(fraction.len() as u32);
    Ok(BigRational::new(numerator, denominator))
}

struct Parser {
    tokens: Vec<(Token, usize)>,
    next: usize,
}

impl Parser {
    fn peek_op(&self) -> Option<&'static str> {
        match self.tokens.get(self.next) {
            Some((Token::Op(op), _)) => Some(op),
            _ => None,
        }
    }

    fn expression(&mut self) -> Result<BigRational, String> {
        let mut value = self.term()?;
        while let Some(op @ ("+" | "-")) = self.peek_op() {
            self.next += 1;
            let right = self.term()?;
            value = if op == "+" {
                value + right
            } else {
                value - right
            };
        }
        Ok(value)
    }

    fn term(&mut self) -> Result<BigRational, String> {
        let mut value = self.unary()?;
        while let Some(op @ ("*" | "/" | "//" | "%")) = self.peek_op() {
            self.next += 1;
            let right = self.unary()?;
            if op != "*" && right.is_zero() {
                return Err("division by zero".into());
            }
            value = match op {
                "*" => value * right,
                "/" => value / right,
                // Python's floor division and modulo (the result takes the divisor's sign).
                "//" => (value / right).floor(),
                _ => {
                    let quotient = (&value / &right).floor();
                    value - right * quotient
                }
            };
            check_size(&value)?;
        }
        Ok(value)
    }

    fn unary(&mut self) -> Result<BigRational, String> {
        match self.peek_op() {
            Some("-") => {
                self.next += 1;
                Ok(-self.unary()?)
            }
            Some("+") => {
                self.next += 1;
                self.unary()
            }
            _ => self.power(),
        }
    }

    /// Right-associative, binding tighter than unary minus on its left (`-2^2` = -4).
    fn power(&mut self) -> Result<BigRational, String> {
        let base = self.primary()?;
        if self.peek_op() != Some("^") {
            return Ok(base);
        }
        self.next += 1;
        let exponent = self.unary()?;
        if !exponent.is_integer() {
            return Err("only whole-number exponents are supported".into());
        }
        let exponent = exponent.to_integer();
        let magnitude = exponent
            .abs()
            .to_u32()
            .filter(|&e| e <= MAX_EXPONENT)
            .ok_or_else(|| format!("exponent {exponent} is larger than {MAX_EXPONENT}"))?;
        if base.is_zero() && exponent.is_negative() {
            return Err("division by zero".into());
        }
        let raised = BigRational::new(base.numer().pow(magnitude), base.denom().pow(magnitude));
        check_size(&raised)?;
        Ok(if exponent.is_negative() {
            raised.recip()
        } else {
            raised
        })
    }

    fn primary(&mut self) -> Result<BigRational, String> {
        let Some((token, at)) = self.tokens.get(self.next).cloned() else {
            return Err("the expression ends early".into());
        };
        self.next += 1;
        match token {
            Token::Number(value) => Ok(value),
            Token::Open => {
                let value = self.expression()?;
                match self.tokens.get(self.next) {
                    Some((Token::Close, _)) => {
                        self.next += 1;
                        Ok(value)
                    }
                    _ => Err(format!(
                        "unclosed parenthesis opened at character {}",
                        at + 1
                    )),
                }
            }
            Token::Close => Err(format!("unexpected ')' at character {}", at + 1)),
            Token::Op(op) => Err(format!("unexpected {op:?} at character {}", at + 1)),
        }
    }
}

fn check_size(value: &BigRational) -> Result<(), String> {
    let bits = value.numer().bits() + value.denom().bits();
    // log10(2) ≈ 0.30103: bits * 0.30103 decimal digits.
    if bits * 30_103 / 100_000 > MAX_DIGITS {
        return Err(format!("the result has more than {MAX_DIGITS} digits"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn eval(text: &str) -> String {
        format_number(&evaluate(text).unwrap())
    }

    #[test]
    fn large_products_are_exact() {
        assert_eq!(eval("48213 * 9127"), "440040051");
        assert_eq!(
            eval("123456789012 * 987654321098"),
            "121932631136585886175176"
        );
        assert_eq!(eval("2^100"), "1267650600228229401496703205376");
    }

    #[test]
    fn precedence_associativity_and_python_division() {
        assert_eq!(eval("2 + 3 * 4"), "14");
        assert_eq!(eval("(2 + 3) * 4"), "20");
        assert_eq!(eval("2 ^ 3 ^ 2"), "512");
        assert_eq!(eval("-2 ^ 2"), "-4");
        assert_eq!(eval("7 // 2"), "3");
        assert_eq!(eval("-7 // 2"), "-4");
        assert_eq!(eval("-7 % 3"), "2");
        assert_eq!(eval("1 / 8"), "0.125");
        assert_eq!(eval("1.5 * 4"), "6");
        assert_eq!(eval("1,000 + 1"), "1001");
        assert_eq!(eval("6 × 7 ÷ 2"), "21");
        assert!(eval("1 / 3").starts_with("1/3 (≈ 0.333"));
    }

    #[test]
    fn errors_say_what_went_wrong() {
        assert_eq!(evaluate("1 / 0").unwrap_err(), "division by zero");
        assert!(evaluate("2 + ").unwrap_err().contains("ends early"));
        assert!(
            evaluate("(1 + 2")
                .unwrap_err()
                .contains("unclosed parenthesis")
        );
        assert!(evaluate("2 $ 3").unwrap_err().contains("character 3"));
        assert!(evaluate("2 ^ 100000").unwrap_err().contains("exponent"));
        assert!(evaluate("import os").is_err());
        let output = Calculator.call(&json!({"expr": "1"}), &mut Workspace::default());
        assert!(output.failed && output.content.contains("expression"));
    }
}
