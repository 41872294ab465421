//! A hand-written splitter equivalent to [`super::CL100K_PATTERN`], used for counting when the
//! trainer runs with that pattern. Why hand-written: `fancy-regex` runs the pattern (it needs
//! possessive quantifiers and a lookahead) on its backtracking VM at about 15 MB/s per core,
//! which made pre-splitting the whole cost of training; this splitter is a direct decision
//! procedure over the seven alternatives and is several times faster.
//!
//! Equivalence: the character classes come from `regex-syntax` (the same Unicode tables
//! `fancy-regex` uses for `\p{L}`, `\p{N}` and `\s`), and the tests compare the pieces with
//! `fancy-regex`'s `find_iter` on random strings drawn from every class boundary that matters
//! (letters, numbers, ASCII and Unicode whitespace, CR/LF, apostrophe contractions including the
//! case-folded `ſ`, combining marks, emoji). At each position the alternatives are, in order:
//! 1. `'(?i:[sdmt]|ll|ve|re)`
//! 2. `[^\r\n\p{L}\p{N}]?+\p{L}+` (the optional prefix is possessive)
//! 3. `\p{N}{1,3}`
//! 4. ` ?[^\s\p{L}\p{N}]++[\r\n]*`
//! 5. `\s*[\r\n]` (ends after the LAST CR/LF of the whitespace run)
//! 6. `\s+(?!\S)` (the whole run at the end of the text, else the run minus its last character)
//! 7. `\s+`

use std::sync::OnceLock;

type Ranges = Vec<(char, char)>;

struct Classes {
    letters: Ranges,
    numbers: Ranges,
    spaces: Ranges,
}

fn ranges_of(class: &str) -> Ranges {
    use regex_syntax::hir::{Class, HirKind};
    match regex_syntax::Parser::new()
        .parse(class)
        .map(|hir| hir.kind().clone())
    {
        Ok(HirKind::Class(Class::Unicode(unicode))) => unicode
            .ranges()
            .iter()
            .map(|r| (r.start(), r.end()))
            .collect(),
        // The three classes below are fixed strings that regex-syntax always parses to Unicode
        // classes; an empty table would only make the equivalence tests fail loudly.
        _ => Vec::new(),
    }
}

fn classes() -> &'static Classes {
    static CLASSES: OnceLock<Classes> = OnceLock::new();
    CLASSES.get_or_init(|| Classes {
        letters: ranges_of(r"\p{L}"),
        numbers: ranges_of(r"\p{N}"),
        spaces: ranges_of(r"\s"),
    })
}

fn in_ranges(ranges: &[(char, char)], c: char) -> bool {
    let i = ranges.partition_point(|&(_, end)| end < c);
    i < ranges.len() && ranges[i].0 <= c
}

fn is_letter(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_alphabetic()
    } else {
        in_ranges(&classes().letters, c)
    }
}
fn is_number(c: char) -> bool {
    if c.is_ascii() {
        c.is_ascii_digit()
    } else {
        in_ranges(&classes().numbers, c)
    }
}
fn is_space(c: char) -> bool {
    if c.is_ascii() {
        matches!(c, ' ' | '\t' | '\n' | '\x0B' | '\x0C' | '\r')
    } else {
        in_ranges(&classes().spaces, c)
    }
}
fn is_newline(c: char) -> bool {
    c == '\r' || c == '\n'
}
/// `[^\s\p{L}\p{N}]`
fn is_other(c: char) -> bool {
    !is_space(c) && !is_letter(c) && !is_number(c)
}

/// Byte length of the run of characters of `s` (from its start) satisfying `keep`.
fn run_len(s: &str, keep: impl Fn(char) -> bool) -> usize {
    s.char_indices()
        .find(|&(_, c)| !keep(c))
        .map_or(s.len(), |(i, _)| i)
}

/// Byte length of the `(?i:[sdmt]|ll|ve|re)` match at the start of `s`, or 0.
fn contraction_len(s: &str) -> usize {
    let mut chars = s.chars();
    let first = chars.next();
    // Unicode simple case folding of s, d, m, t: `ſ` (U+017F) folds to `s`.
    if let Some(c @ ('s' | 'S' | 'd' | 'D' | 'm' | 'M' | 't' | 'T' | 'ſ')) = first {
        return c.len_utf8();
    }
    let second = chars.next();
    let pair = |a: char, b: char| {
        first.is_some_and(|c| c.eq_ignore_ascii_case(&a))
            && second.is_some_and(|c| c.eq_ignore_ascii_case(&b))
    };
    if pair('l', 'l') || pair('v', 'e') || pair('r', 'e') {
        2
    } else {
        0
    }
}

/// Byte length of the piece at the start of a non-empty `s`.
fn piece_len(s: &str) -> usize {
    let mut chars = s.chars();
    let Some(c0) = chars.next() else { return 0 };
    let c1 = chars.next();
    let after0 = c0.len_utf8();
    // 1. contractions
    if c0 == '\'' {
        let n = contraction_len(&s[1..]);
        if n > 0 {
            return 1 + n;
        }
    }
    // 2. letters, with one optional non-letter, non-number, non-newline prefix
    if is_letter(c0) {
        return after0 + run_len(&s[after0..], is_letter);
    }
    if !is_number(c0) && !is_newline(c0) && c1.is_some_and(is_letter) {
        return after0 + run_len(&s[after0..], is_letter);
    }
    // 3. numbers, up to three
    if is_number(c0) {
        return s
            .char_indices()
            .take(3)
            .take_while(|&(_, c)| is_number(c))
            .map(|(i, c)| i + c.len_utf8())
            .last()
            .unwrap_or(after0);
    }
    // 4. punctuation run with an optional leading space, then any CR/LF
    let punct_start = if c0 == ' ' && c1.is_some_and(is_other) {
        Some(1)
    } else if is_other(c0) {
        Some(0)
    } else {
        None
    };
    if let Some(start) = punct_start {
        let end = start + run_len(&s[start..], is_other);
        return end + run_len(&s[end..], is_newline);
    }
    // 5-7. whitespace (c0 is whitespace here: every character is a letter, number, other or space)
    let run = run_len(s, is_space);
    if let Some(last_newline) = s[..run].rfind(['\r', '\n']) {
        return last_newline + 1;
    }
    if run == s.len() {
        return run;
    }
    let last_start = s[..run].char_indices().last().map_or(0, |(i, _)| i);
    if last_start > 0 { last_start } else { run }
}

/// The pieces of `text` under the cl100k pattern, in order; they concatenate to `text`.
pub fn cl100k_pieces(text: &str) -> impl Iterator<Item = &str> {
    let mut rest = text;
    std::iter::from_fn(move || {
        if rest.is_empty() {
            return None;
        }
        let n = piece_len(rest).max(rest.chars().next().map_or(1, char::len_utf8));
        let (piece, tail) = rest.split_at(n);
        rest = tail;
        Some(piece)
    })
}
