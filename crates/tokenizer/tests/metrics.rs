//! Tokenizer metrics on hand-computed examples.

use stoke_tokenizer::metrics::{TokenizerMetrics, WordSegmentation, comparison_table};

/// "unbelievable cats run" tokenized as [un][believ][able][ cats][ run].
fn example() -> (&'static str, Vec<(usize, usize)>) {
    (
        "unbelievable cats run",
        vec![(0, 2), (2, 8), (8, 12), (12, 17), (17, 21)],
    )
}

#[test]
fn hand_computed_example() {
    let (text, spans) = example();
    let mut m = TokenizerMetrics::default();
    m.add_text(text, &spans, WordSegmentation::UnicodeWords);
    assert_eq!(
        (m.words, m.tokens, m.word_tokens, m.continued_words),
        (3, 5, 5, 1)
    );
    assert!((m.fertility() - 5.0 / 3.0).abs() < 1e-12);
    assert!((m.continued_word_fraction() - 1.0 / 3.0).abs() < 1e-12);
    assert!((m.bytes_per_token() - 21.0 / 5.0).abs() < 1e-12);
    assert!((m.chars_per_token() - 21.0 / 5.0).abs() < 1e-12);
}

#[test]
fn a_token_spanning_two_words_counts_for_both() {
    // "ab cd" as [ab c][d]: "ab" has 1 token, "cd" overlaps 2.
    let mut m = TokenizerMetrics::default();
    m.add_text("ab cd", &[(0, 4), (4, 5)], WordSegmentation::Whitespace);
    assert_eq!((m.words, m.word_tokens, m.continued_words), (2, 3, 1));
}

#[test]
fn chars_and_bytes_differ_on_unicode() {
    // "né é" = 6 bytes, 4 chars; tokens [né][ é].
    let mut m = TokenizerMetrics::default();
    m.add_text("né é", &[(0, 3), (3, 6)], WordSegmentation::UnicodeWords);
    assert_eq!((m.bytes, m.chars, m.tokens), (6, 4, 2));
    assert_eq!(m.chars_per_token(), 2.0);
    assert_eq!(m.bytes_per_token(), 3.0);
    assert_eq!(m.continued_words, 0);
}

#[test]
fn segmentations_differ_on_punctuation() {
    let text = "Hello, world! x-y";
    assert_eq!(
        WordSegmentation::Whitespace.words(text),
        vec![(0, 6), (7, 13), (14, 17)]
    );
    assert_eq!(
        WordSegmentation::UnicodeWords.words(text),
        vec![(0, 5), (7, 12), (14, 15), (16, 17)]
    );
}

#[test]
fn punctuation_only_tokens_touch_no_word() {
    let mut m = TokenizerMetrics::default();
    m.add_text("hi !!", &[(0, 2), (2, 5)], WordSegmentation::UnicodeWords);
    assert_eq!((m.words, m.word_tokens, m.tokens), (1, 1, 2));
}

#[test]
fn table_lists_both_tokenizers() {
    let (text, spans) = example();
    let mut a = TokenizerMetrics::default();
    a.add_text(text, &spans, WordSegmentation::UnicodeWords);
    let mut b = TokenizerMetrics::default();
    b.add_text(text, &[(0, 12), (12, 21)], WordSegmentation::UnicodeWords);
    let table = comparison_table(&[("small", &a), ("big", &b)]);
    assert!(table.contains("small") && table.contains("big"), "{table}");
    let fertility = table.lines().find(|l| l.starts_with("fertility")).unwrap();
    assert!(
        fertility.contains("1.6667") && fertility.contains("1.0000"),
        "{fertility}"
    );
}
