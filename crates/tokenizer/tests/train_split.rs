//! The hand-written cl100k splitter gives exactly fancy-regex's pieces for the pattern.

use stoke_tokenizer::train::{CL100K_PATTERN, cl100k_pieces};

fn regex_pieces(text: &str) -> Vec<String> {
    static REGEX: std::sync::OnceLock<fancy_regex::Regex> = std::sync::OnceLock::new();
    let regex = REGEX.get_or_init(|| fancy_regex::Regex::new(CL100K_PATTERN).unwrap());
    regex
        .find_iter(text)
        .map(|m| m.unwrap().as_str().to_owned())
        .collect()
}

fn ours(text: &str) -> Vec<String> {
    cl100k_pieces(text).map(str::to_owned).collect()
}

/// Characters from every class boundary the pattern cares about.
const ALPHABET: &[&str] = &[
    "a", "Z", "s", "S", "t", "l", "L", "v", "e", "E", "r", "d", "m", "ſ", "é", "ß", "日", "本",
    "ж", "0", "7", "٣", "Ⅻ", "½", "'", "'", "'s", "'LL", "'Ve", "'re", "'ſ", "'x", " ", " ", " ",
    "\t", "\n", "\r", "\r\n", "\u{b}", "\u{c}", "\u{85}", "\u{a0}", "\u{3000}", "\u{2028}", ".",
    ",", "!", "?", "-", "\"", "(", "#", "$", "\u{301}", "😀", "🚀", "_", "/", "\\",
];

#[test]
fn random_strings_split_like_the_regex() {
    let mut state = 0x1234_5678_9abc_def0u64;
    let mut next = move || {
        state ^= state << 13;
        state ^= state >> 7;
        state ^= state << 17;
        state
    };
    let mut pieces = 0;
    for _ in 0..3000 {
        let len = 1 + next() % 24;
        let text: String = (0..len)
            .map(|_| ALPHABET[(next() % ALPHABET.len() as u64) as usize])
            .collect();
        let expected = regex_pieces(&text);
        assert_eq!(ours(&text), expected, "text {text:?}");
        pieces += expected.len();
    }
    assert!(pieces > 10_000);
}

#[test]
fn known_cases() {
    let cases = [
        "Hello world! It's 12345 o'clock, we'll  see...\n\n  \tok  ",
        "   leading and trailing   \r\n\r\n",
        "x\u{a0}y \u{3000}z 1/2 ½ ٣٣٣٣",
        "'S 'SS 'LLama 'vE're",
        "",
    ];
    for text in cases {
        assert_eq!(ours(text), regex_pieces(text), "text {text:?}");
        assert_eq!(ours(text).concat(), text);
    }
}
