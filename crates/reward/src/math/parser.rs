//! Recursive-descent parser from the tokens of `lexer.rs` to an `Expr`.
//!
//! Hand-written because no Rust crate parses LaTeX math into exact values: the grammar is small
//! and the parser must enforce limits (depth, token count) that a general tool would not.
//!
//! Grammar (lowest precedence first):
//! ```text
//! answer   := item [\choose sum] (',' item)*    top-level commas make an unordered List
//! item     := relation ('\cup' relation)*
//! relation := sum (relop sum)*                 = < > \le \ge \ne \in
//! sum      := term (('+' | '-' | '\pm') term)*
//! term     := unary (('*' | '/' | \cdot | \times | \div) unary | implicit-product unary | unit)*
//! unary    := ('-' | '+') unary | power
//! power    := postfix ('^' exponent)?          right-associative
//! postfix  := primary ('!' | '%' | '^\circ')*     degrees are pi/180 inside a trig argument
//! primary  := number | variable | \pi | \infty | \mathbb{R} | \frac{a}{b} | \binom{n}{k}
//!           | C(n, k) | \sqrt[n]{a} | function arg
//!           | (list) | [list] | (list] | [list) | {list} | \{list\} | |sum|
//! ```
//! Invariants: at most `MAX_TOKENS` tokens and `MAX_DEPTH` nested constructs, so parse time is
//! linear in the input and the stack stays small whatever the input.

use num_rational::BigRational;
use num_traits::Signed;

use super::expr::{Bracket, Expr, Func};
use super::lexer::{Token, tokenize};
use super::units::{canonical_symbol, canonical_unit, is_qualifier};

/// `cm` with power 2 is `cm^2`; other powers are kept by name only for 2 and 3.
fn squared(unit: &'static str, power: &Expr) -> &'static str {
    let power = if *power == Expr::int(2) {
        2
    } else if *power == Expr::int(3) {
        3
    } else {
        return unit;
    };
    super::units::powered(unit, power)
}

/// Deepest nesting accepted (brackets, groups, unary signs, exponents together).
pub const MAX_DEPTH: usize = 48;
/// Most tokens accepted in one answer.
pub const MAX_TOKENS: usize = 1500;

/// Why an answer could not be parsed.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ParseError(pub String);

/// A parsed answer with the canonical units written after its values (`5\text{ cm}`: `cm`).
#[derive(Debug, Clone, PartialEq)]
pub struct Parsed {
    pub expr: Expr,
    pub units: Vec<&'static str>,
}

/// Parses one answer (already extracted from the completion).
pub fn parse_answer(text: &str) -> Result<Expr, ParseError> {
    parse_with_units(text).map(|parsed| parsed.expr)
}

/// Parses one answer and reports its units.
pub fn parse_with_units(text: &str) -> Result<Parsed, ParseError> {
    let tokens = tokenize(text).map_err(|e| ParseError(e.0))?;
    if tokens.is_empty() {
        return Err(ParseError("empty answer".into()));
    }
    if tokens.len() > MAX_TOKENS {
        return Err(ParseError(format!(
            "answer longer than {MAX_TOKENS} tokens"
        )));
    }
    if tokens.iter().all(|t| matches!(t, Token::Text(_))) {
        let words: Vec<&str> = tokens
            .iter()
            .filter_map(|t| {
                if let Token::Text(w) = t {
                    Some(w.as_str())
                } else {
                    None
                }
            })
            .collect();
        let phrase = words.join(" ");
        let expr = if REAL_LINE_WORDS.contains(&phrase.as_str()) {
            real_line()
        } else {
            Expr::Text(phrase)
        };
        return Ok(Parsed {
            expr,
            units: Vec::new(),
        });
    }
    let mut parser = Parser {
        tokens,
        pos: 0,
        depth: 0,
        abs_depth: 0,
        angle_argument: false,
        units: Vec::new(),
    };
    let mut items = parser.items()?;
    if parser.pos != parser.tokens.len() {
        return Err(ParseError(format!(
            "unexpected {:?}",
            parser.tokens[parser.pos]
        )));
    }
    let expr = if items.len() == 1 {
        items.remove(0)
    } else {
        Expr::List(items)
    };
    let mut units = parser.units;
    units.sort_unstable();
    units.dedup();
    Ok(Parsed { expr, units })
}

struct Parser {
    tokens: Vec<Token>,
    pos: usize,
    depth: usize,
    abs_depth: usize,
    /// Inside the argument of `\sin` and the other trig functions: `30^\circ` is pi/6 there.
    angle_argument: bool,
    units: Vec<&'static str>,
}

/// A word that qualifies or hedges a value ("at least 12", "not 12"): such an answer has no
/// single value and is unparseable rather than read as 12.
/// Words that may stand before a value without changing it: currency codes and "it is".
const LEAD_WORDS: &[&str] = &[
    "usd", "rs", "inr", "eur", "gbp", "cny", "rmb", "jpy", "cad", "aud", "it", "is", "it's", "its",
    "equals", "total", "answer", "the", "be",
];

fn qualified(words: &str) -> bool {
    words.split_whitespace().any(is_qualifier)
}

fn err<T>(message: impl Into<String>) -> Result<T, ParseError> {
    Err(ParseError(message.into()))
}

fn is_integer_literal(expr: &Expr) -> bool {
    matches!(expr, Expr::Num(n) if n.is_integer())
}

impl Parser {
    fn peek(&self) -> Option<&Token> {
        self.tokens.get(self.pos)
    }

    fn eat(&mut self, token: &Token) -> bool {
        if self.peek() == Some(token) {
            self.pos += 1;
            true
        } else {
            false
        }
    }

    fn enter(&mut self) -> Result<(), ParseError> {
        self.depth += 1;
        if self.depth > MAX_DEPTH {
            err(format!("nesting deeper than {MAX_DEPTH}"))
        } else {
            Ok(())
        }
    }

    fn leave(&mut self) {
        self.depth -= 1;
    }

    /// Comma-separated items up to a closing token or the end (the closer is not consumed).
    fn items(&mut self) -> Result<Vec<Expr>, ParseError> {
        let mut first = self.item()?;
        if self.eat(&Token::Choose) {
            // `{n \choose k}`: TeX's infix binomial, over the whole group.
            let k = self.sum()?;
            first = binomial(first, k);
        }
        let mut items = vec![first];
        while self.eat(&Token::Comma) {
            // `19, 46, and 82`: the "and" after a comma adds no item.
            while self.eat(&Token::Comma) {}
            if matches!(
                self.peek(),
                None | Some(Token::RParen | Token::RBracket | Token::RBrace | Token::RSetBrace)
            ) {
                break; // trailing comma
            }
            items.push(self.item()?);
        }
        Ok(items)
    }

    fn item(&mut self) -> Result<Expr, ParseError> {
        let first = self.relation()?;
        if self.peek() != Some(&Token::Cup) {
            return Ok(first);
        }
        let mut parts = vec![first];
        while self.eat(&Token::Cup) {
            parts.push(self.relation()?);
        }
        Ok(Expr::Union(parts))
    }

    fn relation(&mut self) -> Result<Expr, ParseError> {
        // A leading word before a value ("USD 5", "\\text{Area} = 5") is a label; a word with no
        // value after it is a word answer in a list (`\\text{(A)}, \\text{(C)}`).
        let mut words = Vec::new();
        while let Some(Token::Text(word)) = self.peek() {
            words.push(word.clone());
            self.pos += 1;
        }
        if qualified(&words.join(" ")) {
            return err(format!("qualified answer ({})", words.join(" ")));
        }
        // The words end the element (end of input, a separator or a closing bracket).
        let element_ends = matches!(
            self.peek(),
            None | Some(
                Token::Comma
                    | Token::Cup
                    | Token::RParen
                    | Token::RBracket
                    | Token::RBrace
                    | Token::RSetBrace
            )
        );
        if !element_ends
            && !matches!(self.peek(), Some(Token::Rel(_)))
            && !words
                .iter()
                .all(|w| w.split_whitespace().all(|w| LEAD_WORDS.contains(&w)))
        {
            // "ext 13", "the largest n is 34": prose before a value is not a label.
            return err(format!("words before a value ({})", words.join(" ")));
        }
        if !words.is_empty() && element_ends {
            return Ok(Expr::Text(words.join(" ")));
        }
        let mut operands = vec![self.sum()?];
        let mut ops = Vec::new();
        while let Some(Token::Rel(op)) = self.peek() {
            ops.push(*op);
            self.pos += 1;
            operands.push(self.sum()?);
        }
        Ok(if ops.is_empty() {
            operands.remove(0)
        } else {
            Expr::Relation(operands, ops)
        })
    }

    fn sum(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.term()?;
        let mut plus_minus: Option<Expr> = None;
        loop {
            match self.peek() {
                Some(Token::Plus) => {
                    self.pos += 1;
                    left = Expr::Add(Box::new(left), Box::new(self.term()?));
                }
                Some(Token::Minus) => {
                    self.pos += 1;
                    left = Expr::Sub(Box::new(left), Box::new(self.term()?));
                }
                Some(Token::PlusMinus) => {
                    self.pos += 1;
                    if plus_minus.is_some() {
                        return err("more than one \\pm");
                    }
                    let right = self.term()?;
                    plus_minus = Some(Expr::Sub(Box::new(left.clone()), Box::new(right.clone())));
                    left = Expr::Add(Box::new(left), Box::new(right));
                }
                _ => break,
            }
        }
        Ok(match plus_minus {
            // `a \pm b` is the set {a + b, a - b}; terms after the \pm apply to the + branch
            // only, which is rare enough to accept.
            Some(minus_branch) => Expr::Set(vec![left, minus_branch]),
            None => left,
        })
    }

    fn starts_primary(&self) -> bool {
        match self.peek() {
            Some(
                Token::Num(_)
                | Token::Time(_)
                | Token::E
                | Token::MatrixBegin
                | Token::Ident(_)
                | Token::Pi
                | Token::Infinity
                | Token::Frac
                | Token::Binom
                | Token::Reals
                | Token::EmptySet
                | Token::Sqrt
                | Token::Func(_)
                | Token::Log
                | Token::LParen
                | Token::LBrace
                | Token::LSetBrace,
            ) => true,
            Some(Token::Bar) => self.abs_depth == 0,
            _ => false,
        }
    }

    fn term(&mut self) -> Result<Expr, ParseError> {
        let mut left = self.unary()?;
        loop {
            match self.peek() {
                Some(Token::Times) => {
                    self.pos += 1;
                    left = Expr::Mul(Box::new(left), Box::new(self.unary()?));
                }
                Some(Token::Divide) => {
                    self.pos += 1;
                    left = Expr::Div(Box::new(left), Box::new(self.unary()?));
                }
                Some(Token::Text(word)) => {
                    // A unit after a value, possibly with a power (`\text{cm}^2`).
                    let word = word.clone();
                    if qualified(&word) {
                        return err(format!("qualified answer ({word})"));
                    }
                    self.pos += 1;
                    if self.starts_primary()
                        && !matches!(self.peek(), Some(Token::LParen | Token::LBrace))
                    {
                        // "10 which is 1000": words between two values join nothing.
                        return err(format!("words between values ({word})"));
                    }
                    let unit = canonical_symbol(word.trim())
                        .or_else(|| word.split_whitespace().find_map(canonical_unit));
                    if self.eat(&Token::Caret) {
                        let power = self.argument()?;
                        if let Some(unit) = unit {
                            self.units.push(squared(unit, &power));
                        }
                    } else if let Some(unit) = unit {
                        let squared_word = word.contains("square") || word.starts_with("sq ");
                        self.units.push(if squared_word {
                            squared(unit, &Expr::int(2))
                        } else {
                            unit
                        });
                    }
                }
                _ if self.starts_primary() => {
                    if matches!(self.peek(), Some(Token::Num(_)))
                        && matches!(
                            self.tokens.get(self.pos.wrapping_sub(1)),
                            Some(Token::Num(_))
                        )
                    {
                        // `2 3` is two numbers, not their product 6: ambiguous, never a guess.
                        return err("two numbers side by side");
                    }
                    let starts_fraction = self.peek() == Some(&Token::Frac);
                    let right = self.power()?;
                    left = match (&left, &right) {
                        // `2\frac{1}{2}` is the mixed number 5/2.
                        (Expr::Num(whole), Expr::Div(n, d))
                            if starts_fraction
                                && whole.is_integer()
                                && is_integer_literal(n)
                                && is_integer_literal(d) =>
                        {
                            if whole.is_negative() {
                                Expr::Sub(Box::new(left), Box::new(right))
                            } else {
                                Expr::Add(Box::new(left), Box::new(right))
                            }
                        }
                        _ => Expr::Mul(Box::new(left), Box::new(right)),
                    };
                }
                _ => break,
            }
        }
        Ok(left)
    }

    fn unary(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let result = match self.peek() {
            Some(Token::Minus) => {
                self.pos += 1;
                self.unary().map(|inner| match inner {
                    Expr::Num(value) => Expr::Num(-value),
                    other => Expr::Neg(Box::new(other)),
                })
            }
            Some(Token::Plus) => {
                self.pos += 1;
                self.unary()
            }
            Some(Token::PlusMinus) => {
                // `\pm 2` is the set {2, -2}.
                self.pos += 1;
                self.unary()
                    .map(|inner| Expr::Set(vec![inner.clone(), negate(inner)]))
            }
            _ => self.power(),
        };
        self.leave();
        result
    }

    fn power(&mut self) -> Result<Expr, ParseError> {
        let base = self.postfix()?;
        if !self.eat(&Token::Caret) {
            return Ok(base);
        }
        self.enter()?;
        let exponent = match self.peek() {
            Some(Token::Minus) => {
                self.pos += 1;
                self.power().map(|e| Expr::Neg(Box::new(e)))
            }
            Some(Token::Plus) => {
                self.pos += 1;
                self.power()
            }
            _ => self.power(),
        };
        self.leave();
        Ok(Expr::Pow(Box::new(base), Box::new(exponent?)))
    }

    fn postfix(&mut self) -> Result<Expr, ParseError> {
        let mut value = self.primary()?;
        loop {
            if self.eat(&Token::Bang) {
                value = Expr::Factorial(Box::new(value));
            } else if self.eat(&Token::Percent) {
                value = Expr::Percent(Box::new(value));
            } else if self.eat(&Token::Degree) {
                // `30^\circ` in `\sin 30^\circ` is pi/6; elsewhere degrees are a dropped unit
                // (`90^\circ` is 90).
                if self.angle_argument {
                    value = Expr::Mul(
                        Box::new(value),
                        Box::new(Expr::Div(Box::new(Expr::Pi), Box::new(Expr::int(180)))),
                    );
                }
            } else {
                return Ok(value);
            }
        }
    }

    /// A `{...}` argument, or a single primary when the braces are omitted (`\sqrt 2`).
    fn argument(&mut self) -> Result<Expr, ParseError> {
        if self.peek() == Some(&Token::LBrace) {
            self.primary()
        } else {
            self.postfix()
        }
    }

    fn primary(&mut self) -> Result<Expr, ParseError> {
        self.enter()?;
        let result = self.primary_inner();
        self.leave();
        result
    }

    fn primary_inner(&mut self) -> Result<Expr, ParseError> {
        let Some(token) = self.peek().cloned() else {
            return err("unexpected end of answer");
        };
        self.pos += 1;
        match token {
            Token::Num(value) => Ok(Expr::Num(value)),
            Token::Ident(name) if name == "C" && self.pair_in_parens() => {
                // `C(5, 2)`: the binomial coefficient (otherwise `C` times a group).
                self.pos += 1;
                let n = self.sum()?;
                if !self.eat(&Token::Comma) {
                    return err("C(n, k) without a comma");
                }
                let k = self.sum()?;
                if !self.eat(&Token::RParen) {
                    return err("unclosed C(n, k)");
                }
                Ok(binomial(n, k))
            }
            Token::Ident(name) => Ok(Expr::Var(name)),
            Token::Reals => Ok(real_line()),
            Token::E => Ok(Expr::E),
            Token::Time(minutes) => Ok(Expr::Time(minutes)),
            Token::MatrixBegin => self.matrix(),
            Token::Pi => Ok(Expr::Pi),
            Token::Infinity => Ok(Expr::Infinity),
            Token::Frac => {
                let numer = self.argument()?;
                let denom = self.argument()?;
                Ok(Expr::Div(Box::new(numer), Box::new(denom)))
            }
            Token::Binom => {
                let n = self.argument()?;
                let k = self.argument()?;
                Ok(binomial(n, k))
            }
            Token::EmptySet => Ok(Expr::Set(Vec::new())),
            Token::Sqrt => {
                let index = if self.eat(&Token::LBracket) {
                    let index = self.sum()?;
                    if !self.eat(&Token::RBracket) {
                        return err("\\sqrt[ without ]");
                    }
                    Some(Box::new(index))
                } else {
                    None
                };
                Ok(Expr::Root(Box::new(self.argument()?), index))
            }
            Token::Func(func) => {
                // `\sin^2 x` is (sin x)^2; `\sin^{-1} x` is arcsin x.
                if self.eat(&Token::Caret) {
                    let power = self.argument()?;
                    let argument = self.function_argument_of(func)?;
                    if power == Expr::int(-1)
                        && let Some(inverse) = func.inverse()
                    {
                        return Ok(Expr::Apply(inverse, Box::new(argument)));
                    }
                    return Ok(Expr::Pow(
                        Box::new(Expr::Apply(func, Box::new(argument))),
                        Box::new(power),
                    ));
                }
                Ok(Expr::Apply(
                    func,
                    Box::new(self.function_argument_of(func)?),
                ))
            }
            Token::Log => {
                if self.eat(&Token::Underscore) {
                    let base = self.argument()?;
                    let value = self.function_argument()?;
                    Ok(Expr::LogBase(Box::new(base), Box::new(value)))
                } else {
                    Ok(Expr::Apply(
                        Func::Log10,
                        Box::new(self.function_argument()?),
                    ))
                }
            }
            Token::LParen | Token::LBracket => {
                let open = if token == Token::LParen {
                    Bracket::Round
                } else {
                    Bracket::Square
                };
                let mut items = self.items()?;
                let close = match self.peek() {
                    Some(Token::RParen) => Bracket::Round,
                    Some(Token::RBracket) => Bracket::Square,
                    _ => return err("unclosed bracket"),
                };
                self.pos += 1;
                if items.len() == 1 {
                    if open != close {
                        return err("mismatched brackets around one value");
                    }
                    Ok(items.remove(0))
                } else {
                    Ok(Expr::Tuple(items, open, close))
                }
            }
            Token::LBrace => {
                let mut items = self.items()?;
                if !self.eat(&Token::RBrace) {
                    return err("unclosed {");
                }
                // `{1, 3}` is a TeX group around a list, not set notation (that is `\{1, 3\}`).
                Ok(if items.len() == 1 {
                    items.remove(0)
                } else {
                    Expr::List(items)
                })
            }
            Token::LSetBrace => {
                if self.eat(&Token::RSetBrace) {
                    return Ok(Expr::Set(Vec::new()));
                }
                let items = self.items()?;
                if !self.eat(&Token::RSetBrace) {
                    return err("unclosed \\{");
                }
                Ok(Expr::Set(items))
            }
            Token::Bar => {
                self.abs_depth += 1;
                let inner = self.sum();
                self.abs_depth -= 1;
                let inner = inner?;
                if !self.eat(&Token::Bar) {
                    return err("unclosed |");
                }
                Ok(Expr::Apply(Func::Abs, Box::new(inner)))
            }
            other => err(format!("unexpected {other:?}")),
        }
    }

    /// Rows of a matrix up to `\end{...}`: `&` between entries, `\\` between rows.
    fn matrix(&mut self) -> Result<Expr, ParseError> {
        let mut rows: Vec<Vec<Expr>> = Vec::new();
        let mut row = Vec::new();
        loop {
            match self.peek() {
                Some(Token::MatrixEnd) => {
                    self.pos += 1;
                    break;
                }
                Some(Token::RowSep) => {
                    self.pos += 1;
                    if !row.is_empty() {
                        rows.push(std::mem::take(&mut row));
                    }
                }
                Some(Token::Amp) => return err("empty matrix entry"),
                None => return err("unclosed matrix"),
                _ => {
                    row.push(self.sum()?);
                    if !self.eat(&Token::Amp)
                        && !matches!(self.peek(), Some(Token::RowSep | Token::MatrixEnd))
                    {
                        return err("unexpected token in a matrix");
                    }
                }
            }
        }
        if !row.is_empty() {
            rows.push(row);
        }
        let width = rows.first().map_or(0, Vec::len);
        if width == 0 || rows.iter().any(|r| r.len() != width) {
            return err("ragged or empty matrix");
        }
        Ok(Expr::Matrix(rows))
    }

    /// Whether the tokens ahead are `( a , b )`: a round group with exactly one top-level comma
    /// (a look-ahead, so the parse never backtracks).
    fn pair_in_parens(&self) -> bool {
        if self.peek() != Some(&Token::LParen) {
            return false;
        }
        let mut depth = 0usize;
        let mut commas = 0;
        for token in &self.tokens[self.pos..] {
            match token {
                Token::LParen | Token::LBracket | Token::LBrace | Token::LSetBrace => depth += 1,
                Token::RParen | Token::RBracket | Token::RBrace | Token::RSetBrace => {
                    depth -= 1;
                    if depth == 0 {
                        return *token == Token::RParen && commas == 1;
                    }
                }
                Token::Comma if depth == 1 => commas += 1,
                _ => {}
            }
        }
        false
    }

    /// The argument of `func`; degrees inside it are an angle when `func` takes one.
    fn function_argument_of(&mut self, func: Func) -> Result<Expr, ParseError> {
        let outer = self.angle_argument;
        self.angle_argument = func.takes_angle();
        let argument = self.function_argument();
        self.angle_argument = outer;
        argument
    }

    fn function_argument(&mut self) -> Result<Expr, ParseError> {
        match self.peek() {
            Some(Token::LParen | Token::LBrace) => self.primary(),
            _ => self.power(),
        }
    }
}

/// Word answers that name the whole real line.
const REAL_LINE_WORDS: &[&str] = &[
    "all real numbers",
    "all reals",
    "all real values",
    "real numbers",
    "the real numbers",
    "every real number",
];

/// The whole real line, `(-\infty, \infty)`: what `\mathbb{R}` and "all real numbers" name.
fn real_line() -> Expr {
    Expr::Tuple(
        vec![Expr::Neg(Box::new(Expr::Infinity)), Expr::Infinity],
        Bracket::Round,
        Bracket::Round,
    )
}

/// `\binom{n}{k}` as `n! / (k! (n-k)!)`; `closed_form.rs` evaluates the factorials in pairs,
/// so `\binom{n}{2}` is `n(n-1)/2` for any `n` and `\binom{10^9}{5}` stays cheap.
fn binomial(n: Expr, k: Expr) -> Expr {
    let n_minus_k = Expr::Sub(Box::new(n.clone()), Box::new(k.clone()));
    let denominator = Expr::Mul(
        Box::new(Expr::Factorial(Box::new(k))),
        Box::new(Expr::Factorial(Box::new(n_minus_k))),
    );
    Expr::Div(
        Box::new(Expr::Factorial(Box::new(n))),
        Box::new(denominator),
    )
}

/// `-x` for a parsed value, folding literal numbers (used when normalizing relations).
pub fn negate(expr: Expr) -> Expr {
    match expr {
        Expr::Num(value) => Expr::Num(-value),
        other => Expr::Neg(Box::new(other)),
    }
}

/// A rational literal (used by tests and the comparison's sample points).
pub fn rational(numer: i64, denom: i64) -> Expr {
    Expr::Num(BigRational::new(numer.into(), denom.into()))
}
