//! Gopher repetition filter (Rae et al. 2021, table A1), following datatrove's
//! `GopherRepetitionFilter` and its defaults: duplicate paragraph and line fractions (0.30 / 0.30
//! by count, 0.20 / 0.20 by characters), the character share of the most frequent 2/3/4-gram
//! (0.20, 0.18, 0.16) and the character share of duplicated 5..10-grams (0.15 down to 0.10).
//!
//! As in datatrove: an empty text is dropped (`empty`), lines are `re.split("\n+", text)` (a
//! leading or trailing newline leaves an empty line), paragraphs `re.split(r"\n{2,}",
//! text.strip())`, words datatrove's English tokenizer unless `word_tokenizer = "simple"`, and
//! shares are characters over the characters of the whole text.
//!
//! What it is not: a string-exact port. N-grams are compared by a hash of their word hashes
//! (xxh3), not by joined strings: a collision would need two different n-grams with equal 64-bit
//! hashes, and datatrove's duplicated n-grams, joined without spaces, also count `ab c` and
//! `a bc` as one.

use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

use super::document::{Document, DropReason, Verdict};
use super::text::{
    RuleNumbers, Rules, WordTokenizer, char_len, exceeds, find_duplicates, ratio, recorded,
    split_newline_runs, split_paragraphs,
};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct GopherRepetitionFile {
    pub dup_line_frac: Option<f64>,
    pub dup_para_frac: Option<f64>,
    pub dup_line_char_frac: Option<f64>,
    pub dup_para_char_frac: Option<f64>,
    /// `[[n, max_share], ...]` for the most frequent n-gram.
    pub top_n_grams: Vec<(usize, f64)>,
    /// `[[n, max_share], ...]` for all duplicated n-grams.
    pub dup_n_grams: Vec<(usize, f64)>,
    pub word_tokenizer: WordTokenizer,
}

impl Default for GopherRepetitionFile {
    fn default() -> Self {
        GopherRepetitionFile {
            dup_line_frac: Some(0.3),
            dup_para_frac: Some(0.3),
            dup_line_char_frac: Some(0.2),
            dup_para_char_frac: Some(0.2),
            top_n_grams: vec![(2, 0.2), (3, 0.18), (4, 0.16)],
            dup_n_grams: vec![
                (5, 0.15),
                (6, 0.14),
                (7, 0.13),
                (8, 0.12),
                (9, 0.11),
                (10, 0.10),
            ],
            word_tokenizer: WordTokenizer::default(),
        }
    }
}

#[derive(Clone, Debug)]
pub struct GopherRepetition {
    file: GopherRepetitionFile,
}

impl GopherRepetitionFile {
    pub fn validate(self) -> Result<GopherRepetition, String> {
        for &(n, share) in self.top_n_grams.iter().chain(&self.dup_n_grams) {
            if n == 0 || n > u8::MAX as usize {
                return Err(format!("n-gram size must be within 1..=255, got {n}"));
            }
            if !(0.0..=1.0).contains(&share) {
                return Err(format!(
                    "n-gram share for n={n} must be within [0, 1], got {share}"
                ));
            }
        }
        Ok(GopherRepetition { file: self })
    }
}

impl GopherRepetition {
    pub fn apply(&self, doc: Document) -> Verdict {
        match self.check(&doc.text) {
            Some(reason) => Verdict::Drop(doc, reason),
            None => Verdict::Keep(doc),
        }
    }

    pub fn check(&self, text: &str) -> Option<DropReason> {
        self.evaluate(text, None)
    }

    /// The verdict and every rule's number (for agreement checks against datatrove).
    pub fn numbers(&self, text: &str) -> (Option<DropReason>, RuleNumbers) {
        recorded(|record| self.evaluate(text, record))
    }

    fn evaluate(&self, text: &str, record: Option<&mut RuleNumbers>) -> Option<DropReason> {
        let f = &self.file;
        let mut rules = Rules::new(record);
        if text.is_empty() {
            // datatrove drops an empty text before any rule.
            rules.also(true, DropReason::RepetitionEmpty);
            if rules.done() {
                return rules.verdict();
            }
        }
        let text_chars = text.chars().count();
        let paragraphs = split_paragraphs(text);
        let (dup_paras, dup_para_chars) = find_duplicates(paragraphs.iter().copied());
        let para_frac = ratio(dup_paras, paragraphs.len());
        let para_char_frac = ratio(dup_para_chars, text_chars);
        if rules.rule(
            "dup_para_frac",
            para_frac,
            exceeds(para_frac, f.dup_para_frac),
            DropReason::RepetitionDupParaFrac,
        ) || rules.rule(
            "dup_para_char_frac",
            para_char_frac,
            exceeds(para_char_frac, f.dup_para_char_frac),
            DropReason::RepetitionDupParaCharFrac,
        ) {
            return rules.verdict();
        }
        // `re.split("\n+", text)`: a leading or trailing newline run leaves an empty line.
        let lines = split_newline_runs(text);
        let (dup_lines, dup_line_chars) = find_duplicates(lines.iter().copied());
        let line_frac = ratio(dup_lines, lines.len());
        let line_char_frac = ratio(dup_line_chars, text_chars);
        if rules.rule(
            "dup_line_frac",
            line_frac,
            exceeds(line_frac, f.dup_line_frac),
            DropReason::RepetitionDupLineFrac,
        ) || rules.rule(
            "dup_line_char_frac",
            line_char_frac,
            exceeds(line_char_frac, f.dup_line_char_frac),
            DropReason::RepetitionDupLineCharFrac,
        ) {
            return rules.verdict();
        }
        let words = f.word_tokenizer.words(text);
        let hashes: Vec<u64> = words.iter().map(|w| xxh3_64(w.as_bytes())).collect();
        let lengths: Vec<usize> = words.iter().map(|w| char_len(w)).collect();
        let mut table = NgramTable::with_items(words.len());
        let hashes = NgramHashes::new(&hashes);
        for &(n, max_share) in &f.top_n_grams {
            // datatrove skips the rule when there is no n-gram.
            let share = (words.len() >= n)
                .then(|| {
                    ratio(
                        top_ngram_chars(&mut table, &hashes, &lengths, n),
                        text_chars,
                    )
                })
                .flatten();
            if rules.rule(
                top_name(n),
                share,
                exceeds(share, Some(max_share)),
                DropReason::RepetitionTopNGram(n as u8),
            ) {
                return rules.verdict();
            }
        }
        for &(n, max_share) in &f.dup_n_grams {
            let chars = if words.len() < n {
                0
            } else {
                duplicated_ngram_chars(&mut table, &hashes, &lengths, n)
            };
            let share = ratio(chars, text_chars);
            if rules.rule(
                duplicated_name(n),
                share,
                exceeds(share, Some(max_share)),
                DropReason::RepetitionDuplicatedNGrams(n as u8),
            ) {
                return rules.verdict();
            }
        }
        rules.verdict()
    }
}

/// The rule name of the top n-gram share (static for the usual sizes).
fn top_name(n: usize) -> &'static str {
    const NAMES: [&str; 11] = [
        "top_0_gram",
        "top_1_gram",
        "top_2_gram",
        "top_3_gram",
        "top_4_gram",
        "top_5_gram",
        "top_6_gram",
        "top_7_gram",
        "top_8_gram",
        "top_9_gram",
        "top_10_gram",
    ];
    NAMES.get(n).copied().unwrap_or("top_n_gram")
}

/// The rule name of the duplicated n-gram share.
fn duplicated_name(n: usize) -> &'static str {
    const NAMES: [&str; 11] = [
        "duplicated_0_n_grams",
        "duplicated_1_n_grams",
        "duplicated_2_n_grams",
        "duplicated_3_n_grams",
        "duplicated_4_n_grams",
        "duplicated_5_n_grams",
        "duplicated_6_n_grams",
        "duplicated_7_n_grams",
        "duplicated_8_n_grams",
        "duplicated_9_n_grams",
        "duplicated_10_n_grams",
    ];
    NAMES.get(n).copied().unwrap_or("duplicated_n_grams")
}

/// Hashes of every n-gram of a word sequence in O(1) each: a polynomial over the word hashes
/// (mod 2^64) from prefix sums, `H(i, n) = P[i + n] - P[i] * B^n`, then an avalanche step. The
/// word hashes are xxh3 outputs, so the polynomial's weakness on structured inputs does not
/// apply; hashing every n-gram afresh cost ~n multiplies per position for each of 9 sizes.
struct NgramHashes {
    prefix: Vec<u64>,
}

const POLY_BASE: u64 = 0x9E37_79B9_7F4A_7C15;

impl NgramHashes {
    fn new(word_hashes: &[u64]) -> Self {
        let mut prefix = Vec::with_capacity(word_hashes.len() + 1);
        prefix.push(0u64);
        for &w in word_hashes {
            let last = *prefix.last().unwrap_or(&0);
            prefix.push(last.wrapping_mul(POLY_BASE).wrapping_add(w));
        }
        NgramHashes { prefix }
    }

    /// `B^n`, computed once per n by the caller.
    fn power(n: usize) -> u64 {
        (0..n).fold(1u64, |acc, _| acc.wrapping_mul(POLY_BASE))
    }

    fn get(&self, start: usize, n: usize, power: u64) -> u64 {
        let raw = self.prefix[start + n].wrapping_sub(self.prefix[start].wrapping_mul(power));
        let mixed = (raw ^ (raw >> 31)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
        mixed ^ (mixed >> 29)
    }
}

/// An open-addressing table keyed by n-gram hashes (linear probing, at most half full), cleared
/// and reused for every n of one document: std's `HashMap` insert and rehash were a third of this
/// filter's time. Values are `(count, first index)`.
struct NgramTable {
    keys: Vec<u64>,
    values: Vec<(u32, u32)>,
    mask: usize,
}

impl NgramTable {
    fn with_items(items: usize) -> Self {
        let capacity = (items * 2).next_power_of_two().max(16);
        NgramTable {
            keys: vec![0; capacity],
            values: vec![(0, 0); capacity],
            mask: capacity - 1,
        }
    }

    fn clear(&mut self) {
        self.keys.fill(0);
    }

    /// The slot of `hash`, inserted with value `(0, first)` when new; and whether it was new.
    fn slot(&mut self, hash: u64, first: u32) -> (usize, bool) {
        let key = hash.max(1); // 0 marks an empty slot
        let mut i = key as usize & self.mask;
        loop {
            match self.keys[i] {
                k if k == key => return (i, false),
                0 => {
                    self.keys[i] = key;
                    self.values[i] = (0, first);
                    return (i, true);
                }
                _ => i = (i + 1) & self.mask,
            }
        }
    }
}

/// Characters of the most frequent n-gram (joined with spaces) times its count; ties go to the
/// n-gram seen first, like Python's `Counter.most_common`.
fn top_ngram_chars(
    table: &mut NgramTable,
    hashes: &NgramHashes,
    lengths: &[usize],
    n: usize,
) -> usize {
    table.clear();
    let power = NgramHashes::power(n);
    let mut best: Option<(u32, u32, usize)> = None; // (count, first index, chars)
    for i in 0..=lengths.len() - n {
        let (slot, _) = table.slot(hashes.get(i, n, power), i as u32);
        table.values[slot].0 += 1;
        let (count, first) = table.values[slot];
        let better = match best {
            None => true,
            Some((c, f, _)) => count > c || (count == c && first < f),
        };
        if better {
            let start = first as usize;
            let chars = lengths[start..start + n].iter().sum::<usize>() + n - 1;
            best = Some((count, first, chars));
        }
    }
    best.map_or(0, |(count, _, chars)| count as usize * chars)
}

/// datatrove's `find_all_duplicate`: walk the n-grams; a repeated one adds its characters
/// (joined without spaces) and skips ahead by n, a new one is remembered.
fn duplicated_ngram_chars(
    table: &mut NgramTable,
    hashes: &NgramHashes,
    lengths: &[usize],
    n: usize,
) -> usize {
    table.clear();
    let power = NgramHashes::power(n);
    let (mut repeated_chars, mut i) = (0, 0);
    while i + n <= lengths.len() {
        if table.slot(hashes.get(i, n, power), 0).1 {
            i += 1;
        } else {
            repeated_chars += lengths[i..i + n].iter().sum::<usize>();
            i += n;
        }
    }
    repeated_chars
}

#[cfg(test)]
mod tests {
    use super::*;

    fn only(file: GopherRepetitionFile) -> GopherRepetition {
        file.validate().unwrap()
    }

    fn off() -> GopherRepetitionFile {
        GopherRepetitionFile {
            dup_line_frac: None,
            dup_para_frac: None,
            dup_line_char_frac: None,
            dup_para_char_frac: None,
            top_n_grams: vec![],
            dup_n_grams: vec![],
            word_tokenizer: WordTokenizer::default(),
        }
    }

    /// Distinct 4-letter words, so no n-gram repeats by accident.
    fn distinct_words(count: usize, offset: usize) -> Vec<String> {
        (offset..offset + count)
            .map(|i| {
                let b = |k: usize| (b'a' + ((i / 26usize.pow(k as u32)) % 26) as u8) as char;
                format!("{}{}{}{}", b(3), b(2), b(1), b(0))
            })
            .collect()
    }

    #[test]
    fn duplicate_line_fraction_threshold() {
        let f = only(GopherRepetitionFile {
            dup_line_frac: Some(0.3),
            ..off()
        });
        let doc = |dups: usize, unique: usize| {
            let mut lines = distinct_words(unique, 0);
            lines.extend(vec!["aaaa".to_string(); dups]);
            lines.join("\n")
        };
        // "aaaa" is also the first distinct word, so `dups` copies are all duplicates.
        assert_eq!(f.check(&doc(3, 7)), None); // 3/10
        assert_eq!(f.check(&doc(4, 7)), Some(DropReason::RepetitionDupLineFrac)); // 4/11
    }

    #[test]
    fn duplicate_paragraph_char_fraction_threshold() {
        let f = only(GopherRepetitionFile {
            dup_para_char_frac: Some(0.2),
            ..off()
        });
        // 4 paragraphs of 9 chars + a duplicate: text = 5*9 + 4*2 separators.
        let doc = |extra: &str| {
            let mut paras: Vec<String> = distinct_words(4, 100)
                .iter()
                .map(|w| format!("{w} {w}"))
                .collect();
            paras.push(paras[0].clone());
            paras.push(extra.to_string());
            paras.join("\n\n")
        };
        // dup chars 9; total = 6 paragraphs + 10 separator chars.
        let long_tail = "x".repeat(8); // total 9*5+8+10 = 63, 9/63 = 0.143 -> keep
        assert_eq!(f.check(&doc(&long_tail)), None);
        let short = only(GopherRepetitionFile {
            dup_para_char_frac: Some(0.14),
            ..off()
        });
        assert_eq!(
            short.check(&doc(&long_tail)),
            Some(DropReason::RepetitionDupParaCharFrac)
        );
    }

    #[test]
    fn top_two_gram_share_threshold() {
        let f = only(GopherRepetitionFile {
            top_n_grams: vec![(2, 0.2)],
            ..off()
        });
        // "ab cd" repeated k times among distinct words; 2-gram chars = 5 * k over text chars.
        let doc = |k: usize, fill: usize| {
            let mut words = distinct_words(fill, 1000);
            for _ in 0..k {
                words.push("ab cd".into());
                words.push(distinct_words(1, 5000 + words.len())[0].clone());
            }
            words.join(" ")
        };
        let share = |text: &str, k: usize| 5.0 * k as f64 / text.chars().count() as f64;
        let keep = doc(4, 15);
        assert!(share(&keep, 4) <= 0.2, "{}", share(&keep, 4));
        assert_eq!(f.check(&keep), None);
        let drop = doc(6, 10);
        assert!(share(&drop, 6) > 0.2, "{}", share(&drop, 6));
        assert_eq!(f.check(&drop), Some(DropReason::RepetitionTopNGram(2)));
    }

    #[test]
    fn duplicated_five_gram_share_threshold() {
        let f = only(GopherRepetitionFile {
            dup_n_grams: vec![(5, 0.15)],
            ..off()
        });
        let span = distinct_words(5, 2000).join(" "); // 5 words, 20 chars without spaces
        let doc = |fill: usize| format!("{span} {} {span}", distinct_words(fill, 3000).join(" "));
        // repeated chars 20 over text chars 24*2 + 5*fill + 1
        let keep = doc(20); // 20 / 149 = 0.134
        assert_eq!(f.check(&keep), None);
        let drop = doc(15); // 20 / 124 = 0.161
        assert_eq!(
            f.check(&drop),
            Some(DropReason::RepetitionDuplicatedNGrams(5))
        );
    }

    #[test]
    fn natural_prose_passes_defaults() {
        let f = only(GopherRepetitionFile::default());
        let text = distinct_words(300, 7).join(" ");
        assert_eq!(f.check(&text), None);
    }
}
