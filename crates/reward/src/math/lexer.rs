//! Tokenizer for LaTeX and plain-text math answers: turns `\dfrac{1}{2}\text{ cm}`, `1,000`,
//! `3{,}5`, `x \le 2` into tokens for the parser in `parser.rs`.
//!
//! What this is not: a LaTeX engine. Layout commands (`\left`, `\displaystyle`, spacing,
//! currency signs) are dropped; `^\circ` is a `Degree` token; unit words and `\text{...}` become
//! `Text` tokens the parser skips after a number or keeps as a word answer, except that a wrapper
//! around a number is unwrapped (`\text{13}`, `\textbf{42}`, `\text{forty-two}`) and the font
//! commands `\textbf`/`\mathbf`/`\textit`/`\boldsymbol` wrap math unless they wrap prose; number
//! words are numbers (`number_words.rs`); `\mathbb{R}` and `ℝ` are the real line; unknown
//! commands are an error (the answer is then unparseable, never silently wrong).
//!
//! Invariants: one pass over the input, `O(n)`; numbers are limited to `MAX_DIGITS` digits;
//! thousands separators (`1,000`, `1{,}000`, `1\,000`) need groups of exactly three digits after a
//! first group of at most three.

use num_bigint::BigInt;
use num_rational::BigRational;
use num_traits::One;

use super::expr::{Func, RelOp};
use super::number::{Literal, read_number};
use super::number_words;

#[derive(Debug, Clone, PartialEq)]
pub enum Token {
    Num(BigRational),
    /// `h:mm`, minutes after midnight.
    Time(u32),
    /// Euler's number (`e`, `\mathrm{e}`).
    E,
    /// `\begin{pmatrix}` and friends; inside, `&` is `Amp` and `\\` is `RowSep`.
    MatrixBegin,
    MatrixEnd,
    Amp,
    RowSep,
    Ident(String),
    Pi,
    Infinity,
    Func(Func),
    Log,
    Sqrt,
    Frac,
    Binom,
    /// `{n \choose k}`: the binomial written between its arguments.
    Choose,
    /// `\mathbb{R}`, `ℝ`: the whole real line.
    Reals,
    /// `^\circ`, `°`: degrees, an angle unit (inside a trig argument, a multiple of pi/180).
    Degree,
    EmptySet,
    Plus,
    Minus,
    PlusMinus,
    Times,
    Divide,
    Caret,
    Underscore,
    Bang,
    Percent,
    LParen,
    RParen,
    LBracket,
    RBracket,
    LBrace,
    RBrace,
    LSetBrace,
    RSetBrace,
    Bar,
    Comma,
    Rel(RelOp),
    Cup,
    Text(String),
}

/// Why an answer could not be tokenized.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LexError(pub String);

/// Words that are units or filler after a number, never variables.
/// Two-letter English words that are filler, never a product of two variables.
const FILLER_WORDS_SHORT: &[&str] = &[
    "is", "to", "of", "so", "be", "it", "we", "as", "at", "by", "on", "if",
];
const UNIT_WORDS_SHORT: &[&str] = &[
    "cm", "mm", "km", "kg", "mg", "ml", "ft", "hr", "in", "yd", "mi", "oz", "lb", "am", "pm", "gb",
    "mb", "kb",
];

/// Whether `rest` (after `\\\\`) starts with a command that cannot begin a new line of prose
/// (`left`, `frac`, `sqrt`, ...): then `\\\\` was an escaped backslash. Before any other name
/// (`\\\\le`) it stays what LaTeX reads, a line break.
fn escaped_structural_command(rest: &str) -> bool {
    const STRUCTURAL: &[&str] = &[
        "left", "right", "frac", "dfrac", "tfrac", "cfrac", "sqrt", "pi", "text", "mathrm",
        "mathbf", "boxed", "begin", "end", "cdot", "times", "infty",
    ];
    let name: String = rest.chars().take_while(char::is_ascii_alphabetic).collect();
    STRUCTURAL.contains(&name.as_str())
}

/// `thousand` is 1000: "5 thousand" is 5000, never 5.
fn magnitude(word: &str) -> Option<BigRational> {
    let zeros = match word {
        "hundred" => 2,
        "thousand" => 3,
        "million" => 6,
        "billion" => 9,
        "trillion" => 12,
        _ => return None,
    };
    Some(BigRational::from_integer(num_traits::pow(
        BigInt::from(10),
        zeros,
    )))
}

fn is_layout_command(name: &str) -> bool {
    matches!(
        name,
        "left"
            | "right"
            | "big"
            | "Big"
            | "bigg"
            | "Bigg"
            | "bigl"
            | "bigr"
            | "Bigl"
            | "Bigr"
            | "displaystyle"
            | "textstyle"
            | "quad"
            | "qquad"
            | "circ"
            | "degree"
            | "limits"
            | "nolimits"
            | "phantom"
            | "hspace"
            | "vspace"
            | "space"
            | "enspace"
            | "thinspace"
            | "medspace"
            | "thickspace"
            | "negthinspace"
            | "cr"
            | "newline"
            | "lbrace"
            | "rbrace"
    )
}

/// Commands that only change the font of what they wrap (`\textbf{42}` is 42, `\mathbf{v}` is
/// v); unlike `\text{...}`, their content is math unless it is prose.
fn is_emphasis(name: &str) -> bool {
    matches!(
        name,
        "textbf" | "mathbf" | "textit" | "mathit" | "boldsymbol" | "bm" | "emph"
    )
}

/// Whether `text` holds a word of three or more letters (`Monday`, `meters`), not only symbols,
/// digits and single letters (`x+1`, `(C)`).
fn has_prose_word(text: &str) -> bool {
    text.split(|c: char| !c.is_ascii_alphabetic())
        .any(|word| word.len() >= 3)
}

fn greek(name: &str) -> bool {
    matches!(
        name,
        "alpha"
            | "beta"
            | "gamma"
            | "delta"
            | "epsilon"
            | "varepsilon"
            | "zeta"
            | "eta"
            | "theta"
            | "vartheta"
            | "iota"
            | "kappa"
            | "lambda"
            | "mu"
            | "nu"
            | "xi"
            | "rho"
            | "sigma"
            | "tau"
            | "upsilon"
            | "phi"
            | "varphi"
            | "chi"
            | "psi"
            | "omega"
            | "Gamma"
            | "Delta"
            | "Theta"
            | "Lambda"
            | "Xi"
            | "Sigma"
            | "Phi"
            | "Psi"
            | "Omega"
    )
}

struct Lexer<'a> {
    text: &'a str,
    bytes: &'a [u8],
    pos: usize,
    tokens: Vec<Token>,
    /// Open `\begin{...matrix}` environments: inside them `&` and `\\` separate entries.
    matrix_depth: usize,
    /// How many wrappers (`\textbf{...}`, `\text{...}`) this text is read inside.
    wrappers: usize,
}

/// Most wrappers read inside one another (`\bm{\bm{...}}` must not recurse without bound).
const MAX_WRAPPERS: usize = 8;

/// Tokenizes one answer.
pub fn tokenize(text: &str) -> Result<Vec<Token>, LexError> {
    tokenize_wrapped(text, 0)
}

fn tokenize_wrapped(text: &str, wrappers: usize) -> Result<Vec<Token>, LexError> {
    if wrappers > MAX_WRAPPERS {
        return Err(LexError(format!(
            "more than {MAX_WRAPPERS} nested text commands"
        )));
    }
    let mut lexer = Lexer {
        text,
        bytes: text.as_bytes(),
        pos: 0,
        tokens: Vec::new(),
        matrix_depth: 0,
        wrappers,
    };
    lexer.run()?;
    Ok(lexer.tokens)
}

impl<'a> Lexer<'a> {
    fn peek(&self) -> Option<u8> {
        self.bytes.get(self.pos).copied()
    }

    fn starts_with(&self, prefix: &str) -> bool {
        self.text[self.pos..].starts_with(prefix)
    }

    fn run(&mut self) -> Result<(), LexError> {
        while let Some(byte) = self.peek() {
            match byte {
                b'&' if self.matrix_depth > 0 => {
                    self.pos += 1;
                    self.tokens.push(Token::Amp);
                }
                b' ' | b'\t' | b'\n' | b'\r' | b'~' | b'&' | b'$' => self.pos += 1,
                b'0'..=b'9' => self.number()?,
                b'.' if self.bytes.get(self.pos + 1).is_some_and(u8::is_ascii_digit) => {
                    self.number()?
                }
                b'a'..=b'z' | b'A'..=b'Z' => self.word(),
                b'\\' => self.command()?,
                b'{' if self.starts_with("{,}") => {
                    self.pos += 3;
                    self.tokens.push(Token::Comma);
                }
                _ => self.symbol(byte)?,
            }
        }
        Ok(())
    }

    fn symbol(&mut self, byte: u8) -> Result<(), LexError> {
        let two = |lexer: &Self, second: u8| lexer.bytes.get(lexer.pos + 1) == Some(&second);
        let (token, width) = match byte {
            b'+' => (Token::Plus, 1),
            b'-' => (Token::Minus, 1),
            b'*' if two(self, b'*') => (Token::Caret, 2),
            b'*' => (Token::Times, 1),
            b'/' => (Token::Divide, 1),
            b'^' => (Token::Caret, 1),
            b'_' => (Token::Underscore, 1),
            b'!' if two(self, b'=') => (Token::Rel(RelOp::NotEq), 2),
            b'!' => (Token::Bang, 1),
            b'%' => (Token::Percent, 1),
            b'(' => (Token::LParen, 1),
            b')' => (Token::RParen, 1),
            b'[' => (Token::LBracket, 1),
            b']' => (Token::RBracket, 1),
            b'{' => (Token::LBrace, 1),
            b'}' => (Token::RBrace, 1),
            b'|' => (Token::Bar, 1),
            b',' | b';' => (Token::Comma, 1),
            // `3:2`, a ratio, read as the quotient.
            b':' => (Token::Divide, 1),
            b'=' if two(self, b'=') => (Token::Rel(RelOp::Eq), 2),
            b'=' => (Token::Rel(RelOp::Eq), 1),
            b'<' if two(self, b'=') => (Token::Rel(RelOp::LessEq), 2),
            b'<' => (Token::Rel(RelOp::Less), 1),
            b'>' if two(self, b'=') => (Token::Rel(RelOp::GreaterEq), 2),
            b'>' => (Token::Rel(RelOp::Greater), 1),
            _ if byte >= 0x80 => return self.unicode(),
            _ => return Err(LexError(format!("unexpected character {:?}", byte as char))),
        };
        self.pos += width;
        self.tokens.push(token);
        Ok(())
    }

    fn unicode(&mut self) -> Result<(), LexError> {
        let ch = self.text[self.pos..].chars().next().unwrap_or('\u{fffd}');
        self.pos += ch.len_utf8();
        let token = match ch {
            '×' | '·' | '⋅' => Token::Times,
            '÷' => Token::Divide,
            '−' | '–' => Token::Minus,
            '±' => Token::PlusMinus,
            '≤' => Token::Rel(RelOp::LessEq),
            '≥' => Token::Rel(RelOp::GreaterEq),
            '≠' => Token::Rel(RelOp::NotEq),
            '∈' => Token::Rel(RelOp::In),
            'π' => Token::Pi,
            '∞' => Token::Infinity,
            '√' => Token::Sqrt,
            '∪' => Token::Cup,
            '²' | '³' => {
                let power = if ch == '²' { 2 } else { 3 };
                self.tokens.push(Token::Caret);
                Token::Num(BigRational::from_integer(BigInt::from(power)))
            }
            '≈' => Token::Rel(RelOp::Approx),
            '°' => Token::Degree,
            'ℝ' => Token::Reals,
            '€' | '£' | '¥' | '\u{a0}' | '\u{2009}' | '\u{202f}' => return Ok(()),
            _ => return Err(LexError(format!("unexpected character {ch:?}"))),
        };
        self.tokens.push(token);
        Ok(())
    }

    fn number(&mut self) -> Result<(), LexError> {
        let (literal, end) = read_number(self.text, self.pos).map_err(LexError)?;
        self.pos = end;
        self.tokens.push(match literal {
            Literal::Value(value) => Token::Num(value),
            Literal::Time(minutes) => Token::Time(minutes),
        });
        Ok(())
    }

    fn subscript(&mut self, name: &mut String) {
        if self.peek() != Some(b'_') {
            return;
        }
        let rest = &self.bytes[self.pos + 1..];
        match rest.first() {
            Some(b) if b.is_ascii_alphanumeric() => {
                name.push('_');
                name.push(*b as char);
                self.pos += 2;
            }
            Some(b'{') => {
                if let Some(close) = rest.iter().position(|b| *b == b'}')
                    && rest[1..close].iter().all(u8::is_ascii_alphanumeric)
                {
                    name.push('_');
                    name.push_str(&self.text[self.pos + 2..self.pos + 1 + close]);
                    self.pos += close + 2;
                }
            }
            _ => {}
        }
    }

    fn word(&mut self) {
        let start = self.pos;
        if number_words::starts_number_phrase(self.text, start)
            && let Some((value, end)) = number_words::read_number_words(self.text, start)
        {
            // "forty-two", "three quarters": the number the words name.
            self.pos = end;
            self.tokens.push(Token::Num(value));
            return;
        }
        while let Some(b'a'..=b'z' | b'A'..=b'Z') = self.peek() {
            self.pos += 1;
        }
        let word = &self.text[start..self.pos];
        let lower = word.to_ascii_lowercase();
        let token = match lower.as_str() {
            "sqrt" => Token::Sqrt,
            "pi" => Token::Pi,
            "inf" | "infty" | "infinity" => Token::Infinity,
            "abs" => Token::Func(Func::Abs),
            _ if Func::named(&lower).is_some() => {
                Token::Func(Func::named(&lower).unwrap_or(Func::Abs))
            }
            "log" => Token::Log,
            "and" | "or" => Token::Comma,
            "percent" | "pct" | "percentage" => Token::Percent,
            _ if magnitude(&lower).is_some() => {
                self.tokens.push(Token::Times);
                Token::Num(magnitude(&lower).unwrap_or_else(BigRational::one))
            }
            "e" if word == "e" && self.peek() != Some(b'_') => Token::E,
            _ if word.len() == 1 => {
                let mut name = word.to_string();
                self.subscript(&mut name);
                Token::Ident(name)
            }
            // `No` is the word; `NO` stays two variables (`\frac{NO}{BO}`).
            "no" if word != "NO" => Token::Text(lower),
            _ if word.len() == 2
                && !UNIT_WORDS_SHORT.contains(&lower.as_str())
                && !FILLER_WORDS_SHORT.contains(&lower.as_str()) =>
            {
                // `xy`: implicit multiplication of single-letter variables.
                for ch in word.chars() {
                    self.tokens.push(Token::Ident(ch.to_string()));
                }
                return;
            }
            _ => Token::Text(lower),
        };
        self.tokens.push(token);
    }

    /// Reads a `{...}` group's raw text (balanced), after a text command.
    fn raw_group(&mut self) -> Result<&'a str, LexError> {
        while self.peek() == Some(b' ') {
            self.pos += 1;
        }
        if self.peek() != Some(b'{') {
            return Err(LexError("text command without a {group}".into()));
        }
        let start = self.pos + 1;
        let mut depth = 0usize;
        for (offset, byte) in self.bytes[self.pos..].iter().enumerate() {
            match byte {
                b'{' => depth += 1,
                b'}' => {
                    depth -= 1;
                    if depth == 0 {
                        let end = self.pos + offset;
                        self.pos = end + 1;
                        return Ok(&self.text[start..end]);
                    }
                }
                _ => {}
            }
        }
        Err(LexError("unbalanced braces in a text command".into()))
    }

    fn command(&mut self) -> Result<(), LexError> {
        self.pos += 1;
        if self.peek() == Some(b'\\') && escaped_structural_command(&self.text[self.pos + 1..]) {
            // `\\frac` is an escaped `\frac` (JSON or Python quoting), not a line break.
            self.pos += 1;
        }
        let start = self.pos;
        while let Some(b'a'..=b'z' | b'A'..=b'Z') = self.peek() {
            self.pos += 1;
        }
        if self.pos == start {
            // One-character command: `\{`, `\%`, `\,`, `\$`, `\\`.
            let Some(byte) = self.peek() else {
                return Err(LexError("trailing backslash".into()));
            };
            self.pos += 1;
            match byte {
                b'{' => self.tokens.push(Token::LSetBrace),
                b'}' => self.tokens.push(Token::RSetBrace),
                b'%' => self.tokens.push(Token::Percent),
                b'\\' if self.matrix_depth > 0 => self.tokens.push(Token::RowSep),
                b'\\' => self.tokens.push(Token::Comma),
                b'$' | b',' | b';' | b':' | b'!' | b' ' | b'>' => {}
                _ => return Err(LexError(format!("unknown command \\{}", byte as char))),
            }
            return Ok(());
        }
        let name = &self.text[start..self.pos];
        if matches!(name, "circ" | "degree") {
            // `^\circ`, `^{\circ}`: degrees, a unit the parser drops (or, inside a trig
            // argument, reads as pi/180); a lone `\circ` (`f \circ g`) is dropped.
            let degree = if self.tokens.last() == Some(&Token::Caret) {
                self.tokens.pop();
                true
            } else if self.tokens.ends_with(&[Token::Caret, Token::LBrace])
                && self.peek() == Some(b'}')
            {
                self.tokens.truncate(self.tokens.len() - 2);
                self.pos += 1;
                true
            } else {
                name == "degree"
            };
            if degree {
                self.tokens.push(Token::Degree);
            }
            return Ok(());
        }
        if name == "mathbb" {
            // `\mathbb{R}` (or `\mathbb R`) is the real line; other sets keep their letter.
            let rest = &self.text[self.pos..];
            let trimmed = rest.trim_start_matches(' ');
            let skip = rest.len() - trimmed.len();
            let len = if trimmed.starts_with("{R}") {
                3
            } else if trimmed.starts_with('R')
                && !trimmed[1..].starts_with(|c: char| c.is_ascii_alphabetic())
            {
                1
            } else {
                return Ok(());
            };
            self.pos += skip + len;
            self.tokens.push(Token::Reals);
            return Ok(());
        }
        if matches!(name, "frac" | "dfrac" | "tfrac") {
            let rest = &self.bytes[self.pos..];
            if rest.len() >= 2 && rest[0].is_ascii_digit() && rest[1].is_ascii_digit() {
                // `\frac12`: TeX takes one character per argument.
                let (numer, denom) = (i64::from(rest[0] - b'0'), i64::from(rest[1] - b'0'));
                self.pos += 2;
                self.tokens.extend([
                    Token::Frac,
                    Token::LBrace,
                    Token::Num(BigRational::from_integer(numer.into())),
                    Token::RBrace,
                    Token::LBrace,
                    Token::Num(BigRational::from_integer(denom.into())),
                    Token::RBrace,
                ]);
                return Ok(());
            }
        }
        let token = match name {
            "frac" | "dfrac" | "tfrac" | "cfrac" => Token::Frac,
            "binom" | "dbinom" | "tbinom" => Token::Binom,
            "choose" => Token::Choose,
            "R" | "RR" | "Reals" | "reals" => Token::Reals,
            "emptyset" | "varnothing" => Token::EmptySet,
            "begin" | "end" => {
                let environment = self.raw_group()?;
                if !environment.ends_with("matrix") && environment != "array" {
                    return Err(LexError(format!("unsupported environment {environment}")));
                }
                if name == "begin" {
                    if environment == "array" {
                        self.raw_group()?; // the column specification `{cc}`
                    }
                    self.matrix_depth += 1;
                    Token::MatrixBegin
                } else {
                    self.matrix_depth = self.matrix_depth.saturating_sub(1);
                    Token::MatrixEnd
                }
            }
            "sqrt" => Token::Sqrt,
            "pi" => Token::Pi,
            "infty" | "infin" => Token::Infinity,
            "cdot" | "times" | "ast" => Token::Times,
            "div" => Token::Divide,
            "pm" => Token::PlusMinus,
            "le" | "leq" | "leqslant" => Token::Rel(RelOp::LessEq),
            "ge" | "geq" | "geqslant" => Token::Rel(RelOp::GreaterEq),
            "lt" => Token::Rel(RelOp::Less),
            "gt" => Token::Rel(RelOp::Greater),
            "ne" | "neq" => Token::Rel(RelOp::NotEq),
            "in" => Token::Rel(RelOp::In),
            "cup" => Token::Cup,
            _ if Func::named(name).is_some() => Token::Func(Func::named(name).unwrap_or(Func::Abs)),
            "log" => Token::Log,
            "approx" | "simeq" => Token::Rel(RelOp::Approx),
            "lvert" | "rvert" | "vert" | "mid" => Token::Bar,
            "langle" => Token::LParen,
            "rangle" => Token::RParen,
            "text" | "textrm" | "mbox" | "mathrm" | "textbf" | "mathbf" | "textit" | "mathit"
            | "operatorname" | "textnormal" | "boldsymbol" | "bm" | "emph" => {
                let content = self.raw_group()?;
                let trimmed = content.trim();
                if name.starts_with("math") && trimmed == "e" {
                    Token::E
                } else if let Some(value) = number_words::phrase_value(trimmed) {
                    // `\text{forty-two}` is 42.
                    Token::Num(value)
                } else if let Some(power) = magnitude(&trimmed.to_ascii_lowercase()) {
                    self.tokens.push(Token::Times);
                    Token::Num(power)
                } else if content.bytes().any(|b| b.is_ascii_alphabetic())
                    && (!is_emphasis(name) || has_prose_word(trimmed))
                {
                    let words: Vec<&str> = content.split_whitespace().collect();
                    let joined = words.join(" ").to_ascii_lowercase();
                    if joined == "and" || joined == "or" {
                        Token::Comma
                    } else {
                        Token::Text(joined)
                    }
                } else {
                    let inner = tokenize_wrapped(content, self.wrappers + 1)?;
                    self.tokens.extend(inner);
                    return Ok(());
                }
            }
            _ if greek(name) => Token::Ident(name.to_string()),
            _ if is_layout_command(name) => return Ok(()),
            _ if name.starts_with("quad") || name.starts_with("qquad") => {
                // `\quadx_2`: a spacing command run into the next word.
                self.pos = start + if name.starts_with("quad") { 4 } else { 5 };
                return Ok(());
            }
            _ => return Err(LexError(format!("unknown command \\{name}"))),
        };
        if let Token::Ident(mut ident) = token {
            self.subscript(&mut ident);
            self.tokens.push(Token::Ident(ident));
        } else {
            self.tokens.push(token);
        }
        Ok(())
    }
}
