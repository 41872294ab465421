//! Tokenizer quality metrics on a text set, and a side-by-side table for two tokenizers.
//!
//! Definitions (after Rust et al. 2021, "How Good is Your Tokenizer?"):
//! - **fertility**: tokens per word, where a word's tokens are the tokens whose byte span
//!   overlaps the word (a byte-level BPE token like `" cats"` carries the space before the word;
//!   it still counts once, for `cats`). Tokens of pure whitespace or punctuation that touch no
//!   word count for no word.
//! - **continued words**: the fraction of words that overlap two or more tokens.
//! - **bytes per token** and **characters per token**: UTF-8 bytes / Unicode scalar values of the
//!   text divided by all tokens of the text (compression; higher is better).
//!
//! Word segmentation ([`WordSegmentation`]): `UnicodeWords` uses the Unicode word boundaries of
//! UAX #29 (the `unicode-segmentation` crate's `unicode_word_indices`: runs of letters, digits,
//! apostrophes within words; punctuation and spaces are not words; each CJK ideograph is a word
//! of its own), `Whitespace` splits on Unicode whitespace (punctuation stays attached).
//!
//! What this is not: it never loads a tokenizer; the caller passes an encoder that returns each
//! token's byte span in the text.

use unicode_segmentation::UnicodeSegmentation;

/// How a text is cut into words for fertility; see the module doc.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum WordSegmentation {
    UnicodeWords,
    Whitespace,
}

impl WordSegmentation {
    /// Byte spans `[start, end)` of the words of `text`, in order.
    pub fn words(self, text: &str) -> Vec<(usize, usize)> {
        match self {
            WordSegmentation::UnicodeWords => text
                .unicode_word_indices()
                .map(|(i, w)| (i, i + w.len()))
                .collect(),
            WordSegmentation::Whitespace => {
                let mut spans = Vec::new();
                let mut start = None;
                for (i, c) in text.char_indices() {
                    match (c.is_whitespace(), start) {
                        (true, Some(s)) => {
                            spans.push((s, i));
                            start = None;
                        }
                        (false, None) => start = Some(i),
                        _ => {}
                    }
                }
                if let Some(s) = start {
                    spans.push((s, text.len()));
                }
                spans
            }
        }
    }
}

/// Counts accumulated over a text set; ratios are derived.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct TokenizerMetrics {
    pub texts: u64,
    pub bytes: u64,
    pub chars: u64,
    pub tokens: u64,
    pub words: u64,
    /// Sum over words of the number of tokens overlapping the word.
    pub word_tokens: u64,
    /// Words overlapping two or more tokens.
    pub continued_words: u64,
}

fn ratio(a: u64, b: u64) -> f64 {
    if b == 0 { 0.0 } else { a as f64 / b as f64 }
}

impl TokenizerMetrics {
    /// Adds one text given the byte spans of its tokens (in any order; empty spans, such as those
    /// of special tokens added by a post-processor, count as tokens but overlap no word).
    pub fn add_text(
        &mut self,
        text: &str,
        token_spans: &[(usize, usize)],
        words: WordSegmentation,
    ) {
        self.texts += 1;
        self.bytes += text.len() as u64;
        self.chars += text.chars().count() as u64;
        self.tokens += token_spans.len() as u64;
        let mut spans: Vec<(usize, usize)> =
            token_spans.iter().copied().filter(|(s, e)| e > s).collect();
        spans.sort_unstable();
        // Sweep: tokens sorted by start; for each word, tokens with start < word end and
        // end > word start. `first` only moves forward past tokens that end before the word.
        let mut first = 0;
        for (ws, we) in words.words(text) {
            while first < spans.len() && spans[first].1 <= ws {
                first += 1;
            }
            let overlapping = spans[first..]
                .iter()
                .take_while(|(s, _)| *s < we)
                .filter(|(_, e)| *e > ws)
                .count();
            self.words += 1;
            self.word_tokens += overlapping as u64;
            if overlapping >= 2 {
                self.continued_words += 1;
            }
        }
    }

    pub fn merge(&mut self, other: &TokenizerMetrics) {
        self.texts += other.texts;
        self.bytes += other.bytes;
        self.chars += other.chars;
        self.tokens += other.tokens;
        self.words += other.words;
        self.word_tokens += other.word_tokens;
        self.continued_words += other.continued_words;
    }

    pub fn fertility(&self) -> f64 {
        ratio(self.word_tokens, self.words)
    }
    pub fn continued_word_fraction(&self) -> f64 {
        ratio(self.continued_words, self.words)
    }
    pub fn bytes_per_token(&self) -> f64 {
        ratio(self.bytes, self.tokens)
    }
    pub fn chars_per_token(&self) -> f64 {
        ratio(self.chars, self.tokens)
    }
}

/// A plain-text table with one column per named tokenizer.
pub fn comparison_table(columns: &[(&str, &TokenizerMetrics)]) -> String {
    type Row = (&'static str, fn(&TokenizerMetrics) -> String);
    let rows: [Row; 8] = [
        ("texts", |m| m.texts.to_string()),
        ("words", |m| m.words.to_string()),
        ("tokens", |m| m.tokens.to_string()),
        ("fertility (tokens/word)", |m| {
            format!("{:.4}", m.fertility())
        }),
        ("continued words", |m| {
            format!("{:.2}%", 100.0 * m.continued_word_fraction())
        }),
        ("bytes per token", |m| format!("{:.4}", m.bytes_per_token())),
        ("chars per token", |m| format!("{:.4}", m.chars_per_token())),
        ("bytes", |m| m.bytes.to_string()),
    ];
    let label_width = rows.iter().map(|(l, _)| l.len()).max().unwrap_or(0);
    let cells: Vec<Vec<String>> = rows
        .iter()
        .map(|(_, f)| columns.iter().map(|(_, m)| f(m)).collect())
        .collect();
    let widths: Vec<usize> = (0..columns.len())
        .map(|c| {
            cells
                .iter()
                .map(|r| r[c].len())
                .chain([columns[c].0.len()])
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = format!("{:label_width$}", "metric");
    for (c, (name, _)) in columns.iter().enumerate() {
        out.push_str(&format!("  {:>w$}", name, w = widths[c]));
    }
    out.push('\n');
    for ((label, _), row) in rows.iter().zip(&cells) {
        out.push_str(&format!("{label:label_width$}"));
        for (c, cell) in row.iter().enumerate() {
            out.push_str(&format!("  {:>w$}", cell, w = widths[c]));
        }
        out.push('\n');
    }
    out
}
