//! What may revise a completion's marked answer after it is written: retraction cues ("Wait, I
//! forgot the 2 eggs"), later answer statements ("the correct total is 44", "there are 9"), the
//! contrast and hedge words that let a conclusion revise ("but", "a first guess"), and, ignored
//! by all of them, verification sentences and asides ("Check: 6*7 = 42 ✓", "Note that ...").
//! `extract.rs` states the rule and applies it; this module only finds the phrases.
//!
//! What this is not: a reader of reasoning. The phrase lists are closed and explicit; a number in
//! a trailing sentence that is neither a cue nor one of these statements never becomes the
//! answer.
//!
//! Invariants: every search is one pass of the linear-time `regex` crate or one scan over the
//! sentences; masking keeps every byte offset (a masked sentence becomes spaces of the same
//! length), so positions found in a masked text are positions in the original.

use std::borrow::Cow;

use regex::Regex;

use super::expr::Expr;
use super::extract::{AnswerSource, Extraction, clean_answer};
use super::parser::parse_answer;
use super::spans::{Span, boxes, math_spans, sentence_end, strip_delimiters};

/// Most later answer statements tried, last first.
const MAX_STATEMENTS_TRIED: usize = 8;
/// Most words after the value of "there are N" (`9 distinct triangles`), fillers removed.
const MAX_COUNT_WORDS_AFTER: usize = 2;
/// Words that may stand before a cue that opens a clause ("Hmm, wait", "But no,").
const INTERJECTIONS: &[&str] = &[
    "hmm", "hm", "hmmm", "oh", "ah", "but", "um", "uh", "ok", "okay", "so", "oops",
];
/// How a verification or an aside opens (lowercase, after leading markdown and one
/// conjunction such as "But" or "So").
const VERIFICATION_OPENINGS: &[&str] = &[
    "note",
    "notice",
    "recall",
    "remark",
    "by the way",
    "as an aside",
    "aside",
    "fun fact",
    "for reference",
    "for comparison",
    "check",
    "checks",
    "checking",
    "to check",
    "verify",
    "verifying",
    "verification",
    "to verify",
    "double-check",
    "double check",
    "sanity check",
    "let me check",
    "let me verify",
    "let me double-check",
    "let me double check",
    "let's check",
    "let's verify",
    "let's double-check",
    "let's double check",
    "let us check",
    "let us verify",
    "we can check",
    "we can verify",
    "confirm",
    "confirming",
    "confirmation",
    "as a check",
    "indeed",
    "plugging back",
    "substituting back",
];
/// Marks that make any sentence a verification.
const VERIFICATION_MARKS: &[&str] = &["✓", "✔", "✅", "checks out"];
/// Words before a stated value that leave it as it is ("there are only 9").
const VALUE_EMPHASIS: &[&str] = &["only", "just", "exactly", "precisely", "actually", "now"];
/// Fillers dropped from the end of "there are 9 ... in total".
const COUNT_FILLERS: &[&str] = &[
    "in total",
    "in all",
    "altogether",
    "of them",
    "total",
    "overall",
];

/// The compiled phrase patterns (once per verifier).
#[derive(Debug, Clone)]
pub struct Revisions {
    cue: Regex,
    statements: [Regex; 4],
    affirmation: Regex,
    contrast: Regex,
    tentative: Regex,
    error: Regex,
}

impl Default for Revisions {
    fn default() -> Self {
        Self::new()
    }
}

/// Whether the clause opens at `start`: after the text's start, a line break or clause
/// punctuation, with markdown and one interjection allowed between ("**Wait**", "Hmm, no").
fn opens_clause(text: &str, start: usize) -> bool {
    let skip = |s: &str| -> usize {
        s.trim_end_matches([' ', '\t', '*', '_', '"', '\'', '>', '#'])
            .len()
    };
    let mut before = &text[..skip(&text[..start])];
    let word_start = before
        .char_indices()
        .rev()
        .find(|(_, c)| !c.is_ascii_alphabetic())
        .map_or(0, |(at, c)| at + c.len_utf8());
    if INTERJECTIONS.contains(&before[word_start..].to_ascii_lowercase().as_str()) {
        before = &before[..skip(&before[..word_start])];
    }
    before.is_empty()
        || before.ends_with(['.', '!', '?', ';', ':', ',', '\n', ')', '(', '-'])
        || before.ends_with(['—', '–'])
}

/// The sentences of `text` from `from` on, as byte ranges (whitespace between them excluded).
fn sentences(text: &str, from: usize) -> Vec<std::ops::Range<usize>> {
    let mut found = Vec::new();
    let mut at = from;
    while at < text.len() {
        let rest = &text[at..];
        let trimmed = rest.trim_start();
        let start = at + (rest.len() - trimmed.len());
        if start >= text.len() {
            break;
        }
        let len = sentence_end(&text[start..]);
        // The terminator (`.`, `!`, `?`, a newline) is one ASCII byte; keep it in the sentence.
        let end = (start + len + 1).min(text.len());
        found.push(start..end);
        at = end;
    }
    found
}

/// Whether a sentence verifies or comments rather than answers: it opens with a verification
/// phrase ("Check:", "Let me verify", "Indeed") or an aside ("Note that", "Recall"), or
/// carries a check mark or "checks out".
fn is_verification(sentence: &str) -> bool {
    let opening = sentence
        .trim_start_matches(|c: char| !c.is_alphanumeric())
        .chars()
        .take(32)
        .collect::<String>()
        .to_lowercase();
    let opening = [
        "but ", "and ", "so ", "also ", "hmm, ", "ok, ", "okay, ", "now, ",
    ]
    .iter()
    .find_map(|word| opening.strip_prefix(word))
    .unwrap_or(&opening);
    let opens = VERIFICATION_OPENINGS.iter().any(|phrase| {
        opening.starts_with(phrase)
            && !opening[phrase.len()..].starts_with(|c: char| c.is_ascii_alphabetic())
    });
    let lower = sentence.to_lowercase();
    opens || VERIFICATION_MARKS.iter().any(|mark| lower.contains(mark))
}

/// `text` with every verification sentence after `from` blanked out (same byte length).
pub fn mask_verifications(text: &str, from: usize) -> Cow<'_, str> {
    let masked: Vec<_> = sentences(text, from)
        .into_iter()
        .filter(|range| is_verification(&text[range.clone()]))
        .collect();
    if masked.is_empty() {
        return Cow::Borrowed(text);
    }
    let mut out = text.to_string();
    for range in masked {
        let blank = " ".repeat(range.len());
        out.replace_range(range, &blank);
    }
    Cow::Owned(out)
}

/// Byte length of the clause at the start of `text`: up to the sentence's end or a `, ` or `; `
/// outside math and brackets.
fn clause_end(text: &str) -> usize {
    let sentence = sentence_end(text);
    let bytes = text.as_bytes();
    let (mut depth, mut in_math, mut index) = (0usize, false, 0);
    while index < sentence {
        match bytes[index] {
            b'\\' => {
                match bytes.get(index + 1) {
                    Some(b'(' | b'[') => in_math = true,
                    Some(b')' | b']') => in_math = false,
                    _ => {}
                }
                index += 1;
            }
            b'$' => in_math = !in_math,
            b'(' | b'[' | b'{' => depth += 1,
            b')' | b']' | b'}' => depth = depth.saturating_sub(1),
            b',' | b';'
                if depth == 0
                    && !in_math
                    && bytes.get(index + 1).is_none_or(u8::is_ascii_whitespace) =>
            {
                return index;
            }
            _ => {}
        }
        index += 1;
    }
    sentence.min(bytes.len())
}

fn inside(spans: &[Span], at: usize) -> bool {
    spans.iter().any(|span| span.start <= at && at < span.end)
}

impl Revisions {
    pub fn new() -> Self {
        // Fixed patterns: a failure to compile is a programming error caught by every test.
        // ASCII classes and word boundaries keep them on the regex crate's DFA.
        let compile = |pattern: &str| Regex::new(pattern).expect("static revision regex compiles");
        const NOUNS: &str = r"(?:answer|total|sum|result|value|count|number|amount|cost|price|difference|product|quotient|area|perimeter|volume|length|distance|probability|solution)s?";
        const OF: &str = r"(?:\s+(?:of|for|in)\s+[a-z ]{1,40}?)?";
        const VERB: &str =
            r"\s*(?:(?:is|are|was|equals|comes\s+to|should\s+be|would\s+be|will\s+be)\b|=|:)";
        const MARKER: &str = r"(?:so|thus|therefore|hence|altogether|overall|in\s+total|in\s+all|all\s+in\s+all|finally|which\s+gives|this\s+gives|that\s+gives|giving)";
        Self {
            cue: compile(concat!(
                r"(?i-u)\b(?:wait|actually|hold\s+on|no|oops|whoops|correction|on\s+second\s+thought",
                r"|scratch\s+that|never\s*mind|my\s+(?:mistake|bad|error)",
                r"|(?:on|upon)\s+(?:further\s+)?reflection|on\s+closer\s+(?:inspection|look)|looking\s+again",
                r"|(?:i|we)\s+(?:have\s+|had\s+)?made\s+(?:a|an)\s+(?:[a-z]+\s+)?(?:mistake|error)",
                r"|(?:that|this|it)(?:'s|\s+is|\s+was)\s+(?:wrong|incorrect|not\s+right|not\s+correct|a\s+mistake|an\s+error)",
                r"|that\s+can(?:'t|not)\s+be\s+right|(?:i|we)\s+(?:was|were)\s+wrong",
                r"|(?:i|we)\s+(?:forgot|miscounted|miscalculated|misread|overlooked|double[- ]counted)",
                r"|(?:let\s+me|let's|let\s+us)\s+(?:re-?compute|re-?calculate|re-?do|re-?count|re-?consider|re-?evaluate|re-?think|fix\s+(?:that|this)|correct\s+(?:that|this|myself))",
                r"|re-?computing|re-?calculating)\b",
            )),
            statements: [
                // "the correct total is 44"
                compile(&format!(
                    r"(?i-u)\b(?:correct(?:ed)?|actual|right|true|real|revised|updated|new|fixed|final)\s+(?:total\s+)?{NOUNS}{OF}{VERB}"
                )),
                // "so the total is 44"
                compile(&format!(
                    r"(?i-u)\b{MARKER}\b,?\s+(?:the\s+|a\s+|our\s+)?(?:total\s+|final\s+|new\s+)?{NOUNS}{OF}{VERB}"
                )),
                // "there are 9"
                compile(&format!(
                    r"(?i-u)\b(?:{MARKER}\b,?\s+|then\s+|now\s+)?there(?:'s|\s+(?:are|is|were|was|will\s+be|would\s+be))\b"
                )),
                // "giving 44", "we get 44"
                compile(
                    r"(?i-u)\b(?:giving|which\s+gives|that\s+gives|this\s+gives|which\s+makes|that\s+makes|making|for\s+a\s+total\s+of|(?:we|i)\s+(?:get|got|obtain)|to\s+get|comes\s+to)\b",
                ),
            ],
            contrast: compile(
                r"(?i-u)\b(?:but|however|though|although|instead|in\s+fact|rather|careful(?:ly)?|correctly|again|twice|re-?count\w*|re-?check\w*|double[- ]count\w*|over-?count\w*)\b",
            ),
            tentative: compile(
                r"(?i-u)\b(?:guess(?:ed|es)?|initially|at\s+first|first\s+thought|naive(?:ly)?|tempting|might\s+think|assum(?:e|ed|ing))\b",
            ),
            affirmation: compile(
                r"(?i-u)\b(?:yes|yep|correct|right|confirmed|confirms|verified|checks?\s+out|consistent|holds)\b",
            ),
            error: compile(
                r"(?i-u)\b(?:wrong|incorrect|mistake|error|forgot|miscount\w*|miscalculat\w*|misread|overlooked|missed|not\s+right|not\s+correct|isn't|off\s+by|should\s+be|instead|oops)\b",
            ),
        }
    }

    /// The end of the last retraction cue at or after `from`, outside boxes and math: the text
    /// after it is what the completion answers now.
    pub fn last_retraction(&self, text: &str, from: usize) -> Option<usize> {
        let candidates: Vec<regex::Match<'_>> = self.cue.find_iter(&text[from..]).collect();
        if candidates.is_empty() {
            return None;
        }
        let protected: Vec<Span> = boxes(text).into_iter().chain(math_spans(text)).collect();
        let mut last = None;
        for found in candidates {
            let (start, end) = (from + found.start(), from + found.end());
            if inside(&protected, start) {
                continue;
            }
            let cue = &text[start..end];
            let word = cue.to_ascii_lowercase();
            let clause_cue = ["wait", "actually", "hold", "no"]
                .iter()
                .any(|w| word.split_whitespace().next() == Some(w));
            if clause_cue && !opens_clause(text, start) {
                continue;
            }
            if word == "no" {
                // "No, ...", "No. ...", "no wait": not the word in "no solutions".
                let after = text[end..].trim_start_matches(' ');
                let punctuated = after.starts_with([',', '.', '!', ';', ':', '-', '—', '–']);
                if !punctuated && !after.to_ascii_lowercase().starts_with("wait") {
                    continue;
                }
            }
            last = Some(end);
        }
        last
    }

    /// Whether the sentence that holds the marked answer, before `start`, presents it as
    /// tentative ("a common first guess is \\boxed{12}", "initially 12").
    pub fn tentative(&self, text: &str, start: usize) -> bool {
        let before = &text[..start];
        let sentence_start = before.rfind(['.', '!', '?', '\n']).map_or(0, |at| at + 1);
        self.tentative.is_match(&before[sentence_start..])
    }

    /// The last later answer statement after `from` whose value parses and is the last value of
    /// the text (no digit follows it): a correction ("the correct total is 44"), a conclusion
    /// ("so the total is 44"), a count ("there are 9") or a result ("giving 44"). A correction
    /// counts always; the others only when the text marks a revision: `signalled` (a
    /// retraction before it, or a marked answer presented as tentative) or a contrast word
    /// between `from` and it ("but", "however", "instead", "in fact", "carefully").
    pub fn later_statement(&self, text: &str, from: usize, signalled: bool) -> Option<Extraction> {
        let contrast = self
            .contrast
            .find(&text[from..])
            .map_or(usize::MAX, |found| from + found.start());
        let mut candidates: Vec<(usize, usize, bool)> = Vec::new();
        for (kind, pattern) in self.statements.iter().enumerate() {
            let (correction, count) = (kind == 0, kind == 2);
            for found in pattern.find_iter(&text[from..]) {
                let (start, end) = (from + found.start(), from + found.end());
                if !(correction || signalled || contrast < start) {
                    continue;
                }
                candidates.push((start, end, count));
            }
        }
        candidates.sort_unstable_by_key(|candidate| std::cmp::Reverse(candidate.0));
        candidates
            .into_iter()
            .take(MAX_STATEMENTS_TRIED)
            .find_map(|(_, end, count)| self.statement_value(text, end, count))
    }

    /// The value after a later answer statement's verb, when it is a clean, final value.
    fn statement_value(&self, text: &str, verb_end: usize, count: bool) -> Option<Extraction> {
        let rest = &text[verb_end..];
        let start = verb_end + (rest.len() - rest.trim_start().len());
        let end = start + clause_end(&text[start..]);
        if text[end..].bytes().any(|b| b.is_ascii_digit()) {
            return None;
        }
        let plain = strip_delimiters(&text[start..end]);
        let mut value = clean_answer(&plain);
        // "there are only 9", "the total is exactly 44": the value itself.
        for emphasis in VALUE_EMPHASIS {
            if let Some(rest) = value
                .strip_prefix(emphasis)
                .filter(|rest| rest.starts_with(' '))
            {
                value = rest.trim_start();
            }
        }
        if count {
            // "9 distinct triangles in total": a count and at most two words.
            let lower = value.to_ascii_lowercase();
            if let Some(filler) = COUNT_FILLERS
                .iter()
                .find(|f| lower.ends_with(*f) && lower[..lower.len() - f.len()].ends_with(' '))
            {
                value = value[..value.len() - filler.len()].trim_end();
            }
            if value.split_whitespace().count() > 1 + MAX_COUNT_WORDS_AFTER {
                return None;
            }
        }
        let value = value.split_whitespace().collect::<Vec<_>>().join(" ");
        match parse_answer(&value).ok()? {
            Expr::Text(_) => None,
            _ => Some(Extraction {
                answer: value,
                source: AnswerSource::Statement,
            }),
        }
    }

    /// Whether text after a retraction cue, holding no new answer, only confirms the answer
    /// ("Wait, is that right? Yes."; "Wait, let me verify: ... ✓"): it verifies or affirms,
    /// and names no error.
    pub fn affirms(&self, tail: &str, masked_tail: &str) -> bool {
        let verified = tail != masked_tail;
        (verified || self.affirmation.is_match(tail)) && !self.error.is_match(tail)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cues_open_a_clause_and_skip_boxes() {
        let revisions = Revisions::new();
        let cue = |text: &str| {
            revisions
                .last_retraction(text, 0)
                .map(|end| text[end..].to_string())
        };
        assert_eq!(cue("#### 42\nWait, the eggs"), Some(", the eggs".into()));
        // The last cue counts.
        assert_eq!(cue("#### 42\nWait, I forgot 2"), Some(" 2".into()));
        assert_eq!(cue("42, wait, no, 44"), Some(", 44".into()));
        assert_eq!(cue("Hmm, no. It is 5"), Some(". It is 5".into()));
        assert_eq!(cue("we wait 5 minutes"), None);
        assert_eq!(cue("there are no solutions"), None);
        assert_eq!(cue("the answer is actually 4"), None);
        assert_eq!(cue("$\\text{wait}$ and \\boxed{No, 3}"), None);
        assert_eq!(cue("Let me recompute: 3"), Some(": 3".into()));
    }

    #[test]
    fn verification_sentences_are_masked_in_place() {
        let text = "\\boxed{6}. Check: 6*7 = 42 ✓\nSo it is 6.";
        let masked = mask_verifications(text, 10);
        assert_eq!(masked.len(), text.len());
        assert!(!masked.contains("42"));
        assert!(masked.contains("So it is 6."));
        assert_eq!(mask_verifications("Check 5", 0), "       ");
        assert_eq!(mask_verifications("Checkers: 5", 0), "Checkers: 5");
    }

    #[test]
    fn later_statements_need_a_clean_final_value() {
        let revisions = Revisions::new();
        let value = |text: &str| {
            revisions
                .later_statement(text, 0, true)
                .map(|found| found.answer)
        };
        assert_eq!(value("so the correct total is 44."), Some("44".into()));
        assert_eq!(value("Counting again, there are 9."), Some("9".into()));
        assert_eq!(value("So the total is $44$ eggs."), Some("44 eggs".into()));
        assert_eq!(
            value("there are 9 triangles in total."),
            Some("9 triangles".into())
        );
        assert_eq!(value("So the total is 12, and each gets 4."), None);
        assert_eq!(value("There are 3 cases to consider."), None);
        assert_eq!(value("there are no solutions."), None);
        assert_eq!(value("Note that the sum is 16."), None);
        assert_eq!(value("so the total is at least 12."), None);
    }

    #[test]
    fn conclusions_and_counts_revise_only_when_the_text_says_so() {
        let revisions = Revisions::new();
        let value = |text: &str, signalled: bool| {
            revisions
                .later_statement(text, 0, signalled)
                .map(|found| found.answer)
        };
        assert_eq!(value("There are 9 eggs sold.", false), None);
        assert_eq!(value("Thus the number sold is 9.", false), None);
        assert_eq!(
            value("But the corners repeat, so there are 9.", false),
            Some("9".into())
        );
        assert_eq!(
            value("There are 9 eggs sold.", true),
            Some("9 eggs sold".into())
        );
        assert_eq!(value("The correct total is 44.", false), Some("44".into()));
        assert!(revisions.tentative("A common first guess is \\boxed{12}", 24));
        assert!(!revisions.tentative("So the answer is \\boxed{12}", 17));
    }
}
