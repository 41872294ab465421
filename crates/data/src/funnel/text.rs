//! Text helpers shared by the filters: word tokenization, duplicate counting, and a hasher for
//! keys that are already hashes.
//!
//! Word tokenization is an approximation of the NLTK-style tokenizer datatrove uses: a word is a
//! maximal run of alphanumeric characters (with `'`, `-` or `_` allowed between them), and every
//! maximal run of other non-space characters is one symbol token. `"Hello, world..."` gives
//! `["Hello", ",", "world", "..."]`. What it is not: a language-aware tokenizer (no CJK
//! segmentation); the thresholds it feeds are the English-tuned Gopher/C4/FineWeb ones anyway.

use std::collections::HashSet;
use std::hash::{BuildHasherDefault, Hasher};

/// Splits text into word and symbol tokens (see the module doc).
pub fn word_tokens(text: &str) -> Vec<&str> {
    let mut tokens = Vec::new();
    for piece in text.split_whitespace() {
        let bytes: Vec<(usize, char)> = piece.char_indices().collect();
        let mut start = 0;
        while start < bytes.len() {
            let is_word = bytes[start].1.is_alphanumeric();
            let mut end = start + 1;
            while end < bytes.len() {
                let c = bytes[end].1;
                let continues = if is_word {
                    c.is_alphanumeric()
                        || (matches!(c, '\'' | '-' | '_')
                            && bytes.get(end + 1).is_some_and(|(_, n)| n.is_alphanumeric()))
                } else {
                    !c.is_alphanumeric()
                };
                if !continues {
                    break;
                }
                end += 1;
            }
            let from = bytes[start].0;
            let to = bytes.get(end).map_or(piece.len(), |(i, _)| *i);
            tokens.push(&piece[from..to]);
            start = end;
        }
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
    let mut seen: HashSet<&str> = HashSet::new();
    let (mut duplicate_elements, mut duplicate_chars) = (0, 0);
    for element in elements {
        if !seen.insert(element) {
            duplicate_elements += 1;
            duplicate_chars += element.chars().count();
        }
    }
    (duplicate_elements, duplicate_chars)
}

/// Characters that end a sentence-like line (FineWeb's `TERMINAL_PUNCTUATION`, the common subset).
pub const TERMINAL_PUNCTUATION: &[char] = &[
    '.', '!', '?', '\u{2026}', '\u{3002}', '\u{FF01}', '\u{FF1F}', '\u{FF0E}', '\u{0964}',
    '\u{0589}', '\u{061F}', '\u{06D4}', '\u{037E}', '\u{0387}', '"', '\'', '\u{201D}', '\u{2019}',
    ';', ':',
];

/// Splits on runs of newlines, like Python's `re.split(r"\n+", text)`.
pub fn split_lines_collapsed(text: &str) -> impl Iterator<Item = &str> {
    text.split('\n').filter(|line| !line.is_empty())
}

/// Splits on two or more newlines, like datatrove's `re.split(r"\n{2,}", text.strip())`.
pub fn split_paragraphs(text: &str) -> Vec<&str> {
    let trimmed = text.trim();
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

/// One hash for a sequence of word hashes (an n-gram), xxh3 over their bytes.
pub fn hash_words(word_hashes: &[u64]) -> u64 {
    let mut bytes = [0u8; 8 * 16];
    if word_hashes.len() <= 16 {
        for (i, h) in word_hashes.iter().enumerate() {
            bytes[i * 8..i * 8 + 8].copy_from_slice(&h.to_le_bytes());
        }
        xxhash_rust::xxh3::xxh3_64(&bytes[..word_hashes.len() * 8])
    } else {
        let all: Vec<u8> = word_hashes.iter().flat_map(|h| h.to_le_bytes()).collect();
        xxhash_rust::xxh3::xxh3_64(&all)
    }
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
    fn paragraphs_split_on_blank_lines() {
        assert_eq!(split_paragraphs("\na\nb\n\n\nc\n"), vec!["a\nb", "c"]);
    }

    #[test]
    fn duplicates_count_repeats_and_chars() {
        assert_eq!(find_duplicates(["ab", "c", "ab", "ab"]), (2, 4));
    }
}
