//! Text helpers shared by the filters: word tokenization, Python's line and whitespace
//! semantics (the filters follow datatrove, which is Python), duplicate counting, rule numbers,
//! and a hasher for keys that are already hashes.
//!
//! Two word tokenizers: [`WordTokenizer::SpacyEn`] (the default of the datatrove-named filters)
//! is datatrove's English tokenizer, spaCy's rules ported in [`super::spacy_en`];
//! [`WordTokenizer::Simple`] (`word_tokens`, the funnel's tokenizer before that port, about
//! twice as fast) makes a word of each maximal run of alphanumeric characters (with `'`, `-` or
//! `_` allowed between them) and one symbol token of every maximal run of other non-space
//! characters: `"Hello, world..."` gives `["Hello", ",", "world", "..."]`. Neither segments
//! CJK text; the thresholds they feed are the English-tuned Gopher/C4/FineWeb ones anyway.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

use serde::Deserialize;

use super::document::DropReason;
use super::spacy_en::py_isspace;

/// Which word tokenizer a filter uses (`word_tokenizer = "spacy_en" | "simple"`).
#[derive(Clone, Copy, Debug, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "snake_case")]
pub enum WordTokenizer {
    /// datatrove's English word tokenizer (spaCy 3.8's rules): the verdicts match datatrove's.
    #[default]
    SpacyEn,
    /// The funnel's earlier tokenizer: words and symbol runs (see the module doc).
    Simple,
}

impl WordTokenizer {
    pub fn words<'a>(&self, text: &'a str) -> Vec<&'a str> {
        match self {
            WordTokenizer::SpacyEn => super::spacy_en::words(text),
            WordTokenizer::Simple => word_tokens(text),
        }
    }
}

/// Python's `str.splitlines()`: splits at `\n`, `\r\n`, `\r`, `\v`, `\f`, `\x1c`-`\x1e`,
/// U+0085, U+2028 and U+2029; a final terminator adds no empty line; `""` has no lines.
pub fn py_splitlines(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let mut chars = text.char_indices().peekable();
    while let Some((i, c)) = chars.next() {
        let breaks = matches!(
            c,
            '\n' | '\r'
                | '\x0b'
                | '\x0c'
                | '\x1c'
                | '\x1d'
                | '\x1e'
                | '\u{85}'
                | '\u{2028}'
                | '\u{2029}'
        );
        if breaks {
            lines.push(&text[start..i]);
            let mut end = i + c.len_utf8();
            if c == '\r' && chars.peek().is_some_and(|&(_, n)| n == '\n') {
                chars.next();
                end += 1;
            }
            start = end;
        }
    }
    if start < text.len() {
        lines.push(&text[start..]);
    }
    lines
}

/// Python's `str.strip()` (whitespace as `str.isspace` has it).
pub fn py_strip(text: &str) -> &str {
    text.trim_matches(py_isspace)
}

/// Python's `str.split()` with no argument: the runs of non-whitespace.
pub fn py_split(text: &str) -> impl Iterator<Item = &str> {
    text.split(py_isspace).filter(|w| !w.is_empty())
}

/// Python's `re.split("\n+", text)`: splits at runs of newlines and keeps the empty strings a
/// leading or trailing run leaves (`"\n\n"` is two empty lines).
pub fn split_newline_runs(text: &str) -> Vec<&str> {
    let mut lines = Vec::new();
    let mut start = 0;
    let bytes = text.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\n' {
            lines.push(&text[start..i]);
            while i < bytes.len() && bytes[i] == b'\n' {
                i += 1;
            }
            start = i;
        } else {
            i += 1;
        }
    }
    lines.push(&text[start..]);
    lines
}

/// The number each rule of a filter computed, by the rule's name (datatrove's reason name or
/// the quantity), `None` where datatrove would divide by zero or skip the rule.
pub type RuleNumbers = Vec<(&'static str, Option<f64>)>;

/// Runs a filter's rules in order: records each rule's number when asked to, and keeps the
/// first failing rule's reason.
pub struct Rules<'a> {
    record: Option<&'a mut RuleNumbers>,
    verdict: Option<DropReason>,
}

impl<'a> Rules<'a> {
    pub fn new(record: Option<&'a mut RuleNumbers>) -> Self {
        Rules {
            record,
            verdict: None,
        }
    }

    /// Records `value` under `name`; when `fails`, the first failure becomes the verdict.
    /// Returns true when the caller can stop: a verdict is set and nothing is being recorded.
    pub fn rule(
        &mut self,
        name: &'static str,
        value: Option<f64>,
        fails: bool,
        reason: DropReason,
    ) -> bool {
        if let Some(record) = self.record.as_deref_mut() {
            record.push((name, value));
        }
        if fails && self.verdict.is_none() {
            self.verdict = Some(reason);
        }
        self.done()
    }

    /// Records a number no threshold applies to.
    pub fn record(&mut self, name: &'static str, value: Option<f64>) {
        if let Some(record) = self.record.as_deref_mut() {
            record.push((name, value));
        }
    }

    /// A second threshold on the number just recorded (a maximum after a minimum).
    pub fn also(&mut self, fails: bool, reason: DropReason) -> bool {
        if fails && self.verdict.is_none() {
            self.verdict = Some(reason);
        }
        self.done()
    }

    /// Whether a verdict is set and nothing is being recorded.
    pub fn done(&self) -> bool {
        self.verdict.is_some() && self.record.is_none()
    }

    pub fn verdict(&self) -> Option<DropReason> {
        self.verdict
    }
}

/// Characters in `s` (Python's `len`), without decoding when it is ASCII.
#[inline]
pub fn char_len(s: &str) -> usize {
    if s.is_ascii() {
        s.len()
    } else {
        s.chars().count()
    }
}

/// Runs a filter's rule evaluation with a recorder: its verdict and every rule's number.
pub fn recorded(
    evaluate: impl FnOnce(Option<&mut RuleNumbers>) -> Option<DropReason>,
) -> (Option<DropReason>, RuleNumbers) {
    let mut numbers = RuleNumbers::new();
    let verdict = evaluate(Some(&mut numbers));
    (verdict, numbers)
}

/// Whether a ratio exceeds an optional maximum (`None` on either side: the rule does not fire).
pub fn exceeds(value: Option<f64>, max: Option<f64>) -> bool {
    max.is_some_and(|m| value.is_some_and(|v| v > m))
}

/// `numerator / denominator`, `None` for a zero denominator (Python would raise).
pub fn ratio(numerator: usize, denominator: usize) -> Option<f64> {
    (denominator != 0).then(|| numerator as f64 / denominator as f64)
}

/// Splits text into word and symbol tokens (see the module doc).
pub fn word_tokens(text: &str) -> Vec<&str> {
    if text.is_ascii() {
        ascii_word_tokens(text)
    } else {
        unicode_word_tokens(text)
    }
}

/// `char::is_whitespace` restricted to ASCII.
fn is_ascii_space(b: u8) -> bool {
    matches!(b, b'\t' | b'\n' | b'\x0B' | b'\x0C' | b'\r' | b' ')
}

/// [`word_tokens`] on bytes, for ASCII text (most of a web corpus): the same rules without
/// decoding characters, about twice as fast.
fn ascii_word_tokens(text: &str) -> Vec<&str> {
    let bytes = text.as_bytes();
    let mut tokens = Vec::with_capacity(bytes.len() / 5);
    let mut i = 0;
    while i < bytes.len() {
        if is_ascii_space(bytes[i]) {
            i += 1;
            continue;
        }
        let start = i;
        let is_word = bytes[i].is_ascii_alphanumeric();
        i += 1;
        while i < bytes.len() {
            let next = bytes[i];
            if is_ascii_space(next) {
                break;
            }
            let continues = if is_word {
                next.is_ascii_alphanumeric()
                    || (matches!(next, b'\'' | b'-' | b'_')
                        && bytes.get(i + 1).is_some_and(u8::is_ascii_alphanumeric))
            } else {
                !next.is_ascii_alphanumeric()
            };
            if !continues {
                break;
            }
            i += 1;
        }
        tokens.push(&text[start..i]);
    }
    tokens
}

fn unicode_word_tokens(text: &str) -> Vec<&str> {
    let mut tokens = Vec::with_capacity(text.len() / 5);
    let mut chars = text.char_indices().peekable();
    while let Some((start, c)) = chars.next() {
        if c.is_whitespace() {
            continue;
        }
        let is_word = c.is_alphanumeric();
        let mut end = start + c.len_utf8();
        while let Some(&(i, next)) = chars.peek() {
            if next.is_whitespace() {
                break;
            }
            let continues = if is_word {
                next.is_alphanumeric()
                    || (matches!(next, '\'' | '-' | '_')
                        && text[i + next.len_utf8()..]
                            .chars()
                            .next()
                            .is_some_and(char::is_alphanumeric))
            } else {
                !next.is_alphanumeric()
            };
            if !continues {
                break;
            }
            end = i + next.len_utf8();
            chars.next();
        }
        tokens.push(&text[start..end]);
    }
    tokens
}

/// True when the token holds at least one alphanumeric character (not a pure symbol run).
pub fn is_word(token: &str) -> bool {
    token.chars().any(char::is_alphanumeric)
}

/// datatrove's `find_duplicates`: the number of elements equal to an earlier one, and their
/// total length in characters.
pub fn find_duplicates<'a>(elements: impl IntoIterator<Item = &'a str>) -> (usize, usize) {
    let mut seen: HashSet<&str, xxhash_rust::xxh3::Xxh3Builder> = HashSet::default();
    let (mut duplicate_elements, mut duplicate_chars) = (0, 0);
    for element in elements {
        if !seen.insert(element) {
            duplicate_elements += 1;
            duplicate_chars += char_len(element);
        }
    }
    (duplicate_elements, duplicate_chars)
}

/// Characters that end a sentence-like line: datatrove's `TERMINAL_PUNCTUATION` (159 code
/// points across scripts), so the FineWeb filter keeps the same lines as the reference.
pub const TERMINAL_PUNCTUATION: &[char] = &[
    '\u{0021}',
    '\u{002E}',
    '\u{003F}',
    '\u{0589}',
    '\u{061D}',
    '\u{061E}',
    '\u{061F}',
    '\u{06D4}',
    '\u{0700}',
    '\u{0701}',
    '\u{0702}',
    '\u{07F9}',
    '\u{0837}',
    '\u{0839}',
    '\u{083D}',
    '\u{083E}',
    '\u{0964}',
    '\u{0965}',
    '\u{104A}',
    '\u{104B}',
    '\u{1362}',
    '\u{1367}',
    '\u{1368}',
    '\u{166E}',
    '\u{1735}',
    '\u{1736}',
    '\u{17D4}',
    '\u{17D5}',
    '\u{17D6}',
    '\u{17D9}',
    '\u{17DA}',
    '\u{1803}',
    '\u{1809}',
    '\u{1944}',
    '\u{1945}',
    '\u{1AA8}',
    '\u{1AA9}',
    '\u{1AAA}',
    '\u{1AAB}',
    '\u{1B5A}',
    '\u{1B5B}',
    '\u{1B5E}',
    '\u{1B5F}',
    '\u{1B7D}',
    '\u{1B7E}',
    '\u{1C3B}',
    '\u{1C3C}',
    '\u{1C7E}',
    '\u{1C7F}',
    '\u{203C}',
    '\u{203D}',
    '\u{2047}',
    '\u{2048}',
    '\u{2049}',
    '\u{2E2E}',
    '\u{2E3C}',
    '\u{2E53}',
    '\u{2E54}',
    '\u{3002}',
    '\u{A4FF}',
    '\u{A60E}',
    '\u{A60F}',
    '\u{A6F3}',
    '\u{A6F7}',
    '\u{A876}',
    '\u{A877}',
    '\u{A8CE}',
    '\u{A8CF}',
    '\u{A92F}',
    '\u{A9C8}',
    '\u{A9C9}',
    '\u{AA5D}',
    '\u{AA5E}',
    '\u{AA5F}',
    '\u{AAF0}',
    '\u{AAF1}',
    '\u{ABEB}',
    '\u{FE52}',
    '\u{FE56}',
    '\u{FE57}',
    '\u{FF01}',
    '\u{FF0E}',
    '\u{FF1F}',
    '\u{FF61}',
    '\u{10A56}',
    '\u{10A57}',
    '\u{10F55}',
    '\u{10F56}',
    '\u{10F57}',
    '\u{10F58}',
    '\u{10F59}',
    '\u{10F86}',
    '\u{10F87}',
    '\u{10F88}',
    '\u{10F89}',
    '\u{11047}',
    '\u{11048}',
    '\u{110BE}',
    '\u{110BF}',
    '\u{110C0}',
    '\u{110C1}',
    '\u{11141}',
    '\u{11142}',
    '\u{11143}',
    '\u{111C5}',
    '\u{111C6}',
    '\u{111CD}',
    '\u{111DE}',
    '\u{111DF}',
    '\u{11238}',
    '\u{11239}',
    '\u{1123B}',
    '\u{1123C}',
    '\u{112A9}',
    '\u{1144B}',
    '\u{1144C}',
    '\u{115C2}',
    '\u{115C3}',
    '\u{115C9}',
    '\u{115CA}',
    '\u{115CB}',
    '\u{115CC}',
    '\u{115CD}',
    '\u{115CE}',
    '\u{115CF}',
    '\u{115D0}',
    '\u{115D1}',
    '\u{115D2}',
    '\u{115D3}',
    '\u{115D4}',
    '\u{115D5}',
    '\u{115D6}',
    '\u{115D7}',
    '\u{11641}',
    '\u{11642}',
    '\u{1173C}',
    '\u{1173D}',
    '\u{1173E}',
    '\u{11944}',
    '\u{11946}',
    '\u{11A42}',
    '\u{11A43}',
    '\u{11A9B}',
    '\u{11A9C}',
    '\u{11C41}',
    '\u{11C42}',
    '\u{11EF7}',
    '\u{11EF8}',
    '\u{11F43}',
    '\u{11F44}',
    '\u{16A6E}',
    '\u{16A6F}',
    '\u{16AF5}',
    '\u{16B37}',
    '\u{16B38}',
    '\u{16B44}',
    '\u{16E98}',
    '\u{1BC9F}',
    '\u{1DA88}',
];

/// Whether the line's last character is in [`TERMINAL_PUNCTUATION`] (sorted: binary search).
pub fn ends_with_terminal_punctuation(line: &str) -> bool {
    line.chars()
        .next_back()
        .is_some_and(|c| TERMINAL_PUNCTUATION.binary_search(&c).is_ok())
}

/// Splits on two or more newlines, like datatrove's `re.split(r"\n{2,}", text.strip())`.
pub fn split_paragraphs(text: &str) -> Vec<&str> {
    let trimmed = py_strip(text);
    let mut paragraphs = Vec::new();
    let mut start = 0;
    let bytes = trimmed.as_bytes();
    let mut i = 0;
    while i < bytes.len() {
        if bytes[i] == b'\n' && bytes.get(i + 1) == Some(&b'\n') {
            paragraphs.push(&trimmed[start..i]);
            while i < bytes.len() && bytes[i] == b'\n' {
                i += 1;
            }
            start = i;
        } else {
            i += 1;
        }
    }
    paragraphs.push(&trimmed[start..]);
    paragraphs
}

/// One hash for a sequence of word hashes (an n-gram). The word hashes are xxh3 outputs, so a
/// multiply-xor chain over them is enough (xxh3 over the bytes again cost 8% of a run), with a
/// final avalanche so that nearby n-grams land in unrelated buckets.
pub fn hash_words(word_hashes: &[u64]) -> u64 {
    const K: u64 = 0x9E37_79B9_7F4A_7C15;
    let mut h = (word_hashes.len() as u64).wrapping_mul(K);
    for &w in word_hashes {
        h = (h.rotate_left(23) ^ w).wrapping_mul(K);
    }
    h ^= h >> 29;
    h = h.wrapping_mul(0xBF58_476D_1CE4_E5B9);
    h ^ (h >> 32)
}

/// A `Hasher` for `u64` keys that already are good hashes (xxh3 outputs): hashing them again
/// would only cost time.
#[derive(Default)]
pub struct PrehashedHasher(u64);

impl Hasher for PrehashedHasher {
    fn finish(&self) -> u64 {
        self.0
    }
    fn write(&mut self, bytes: &[u8]) {
        for &b in bytes {
            self.0 = self.0.rotate_left(8) ^ u64::from(b);
        }
    }
    fn write_u64(&mut self, value: u64) {
        self.0 = value;
    }
}

pub type PrehashedMap<V> = std::collections::HashMap<u64, V, BuildHasherDefault<PrehashedHasher>>;
pub type PrehashedSet = std::collections::HashSet<u64, BuildHasherDefault<PrehashedHasher>>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_split_words_from_punctuation() {
        assert_eq!(
            word_tokens("Hello, world... it's re-done #1"),
            vec!["Hello", ",", "world", "...", "it's", "re-done", "#", "1"]
        );
    }

    #[test]
    fn ascii_fast_path_matches_the_unicode_path() {
        let text = "It's a re-done #1 test... (really)! \t\x0Bx_y -- 'q' a-";
        assert!(text.is_ascii());
        assert_eq!(ascii_word_tokens(text), unicode_word_tokens(text));
        assert_eq!(word_tokens("café, naïve"), vec!["café", ",", "naïve"]);
    }

    #[test]
    fn paragraphs_split_on_blank_lines() {
        assert_eq!(split_paragraphs("\na\nb\n\n\nc\n"), vec!["a\nb", "c"]);
    }

    #[test]
    fn terminal_punctuation_is_sorted_for_binary_search() {
        assert!(TERMINAL_PUNCTUATION.windows(2).all(|w| w[0] < w[1]));
        assert!(
            ends_with_terminal_punctuation("done.") && ends_with_terminal_punctuation("完了。")
        );
        assert!(!ends_with_terminal_punctuation("quoted\"") && !ends_with_terminal_punctuation(""));
    }

    #[test]
    fn duplicates_count_repeats_and_chars() {
        assert_eq!(find_duplicates(["ab", "c", "ab", "ab"]), (2, 4));
    }
}
