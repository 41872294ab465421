//! Final-answer extraction from a completion, in priority order: the last `\boxed{...}` (or
//! `\fbox{...}`, nested braces balanced), the last `<answer>...</answer>`, the text after the last
//! "answer is" / "answer:", the rest of the line after the last `####`, else the last number.
//!
//! What this is not: a judge of the answer; `compare.rs` decides. Extraction only locates text.
//!
//! Invariants: every step is a linear scan (memchr-style `rfind`, the linear-time `regex` crate,
//! one brace-matching pass with a depth limit), so a 1 MB completion costs milliseconds; the
//! extracted text is at most `MAX_ANSWER_BYTES`, longer candidates are rejected, not truncated.

use regex::Regex;

/// Longest extracted answer accepted.
pub const MAX_ANSWER_BYTES: usize = 2000;
/// Deepest brace nesting followed inside `\boxed{}`.
const MAX_BRACE_DEPTH: usize = 64;

/// Where the answer was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerSource {
    Boxed,
    AnswerTag,
    AnswerPhrase,
    Hashes,
    LastNumber,
}

/// The phrase patterns, compiled once per verifier.
#[derive(Debug, Clone)]
pub struct Extractor {
    answer_phrase: Regex,
    last_number: Regex,
}

impl Default for Extractor {
    fn default() -> Self {
        Self::new()
    }
}

/// Text of the balanced `{...}` group starting at `open` (an index of `{`), if closed.
fn balanced_group(text: &str, open: usize) -> Option<&str> {
    let mut depth = 0usize;
    for (offset, byte) in text.as_bytes()[open..].iter().enumerate() {
        match byte {
            b'{' => {
                depth += 1;
                if depth > MAX_BRACE_DEPTH {
                    return None;
                }
            }
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(&text[open + 1..open + offset]);
                }
            }
            _ => {}
        }
        if offset > MAX_ANSWER_BYTES + 2 {
            return None;
        }
    }
    None
}

/// The content of the last `\boxed{...}`/`\fbox{...}` (or `\boxed 5`).
pub fn last_boxed(text: &str) -> Option<&str> {
    let boxed = text.rfind("\\boxed");
    let fbox = text.rfind("\\fbox");
    let (start, len) = match (boxed, fbox) {
        (Some(b), Some(f)) if f > b => (f, 5),
        (Some(b), _) => (b, 6),
        (None, Some(f)) => (f, 5),
        (None, None) => return None,
    };
    let rest = &text[start + len..];
    let trimmed = rest.trim_start();
    if trimmed.starts_with('{') {
        let open = start + len + (rest.len() - trimmed.len());
        return balanced_group(text, open);
    }
    if rest.starts_with(' ') {
        // `\boxed 5`: up to the next `$` or whitespace.
        let end = trimmed
            .find(|c: char| c == '$' || c.is_whitespace())
            .unwrap_or(trimmed.len());
        return Some(&trimmed[..end]).filter(|s| !s.is_empty());
    }
    None
}

/// Strips math delimiters and trailing punctuation around an extracted answer.
pub fn clean_answer(answer: &str) -> &str {
    let mut text = answer.trim();
    loop {
        let before = text;
        for (open, close) in [("$$", "$$"), ("$", "$"), ("\\(", "\\)"), ("\\[", "\\]")] {
            if text.len() >= open.len() + close.len()
                && text.starts_with(open)
                && text.ends_with(close)
            {
                text = text[open.len()..text.len() - close.len()].trim();
            }
        }
        text = text.trim_end_matches(['.', '。']).trim();
        text = text.strip_prefix(':').unwrap_or(text).trim();
        if let Some(inner) = text
            .strip_prefix("\\boxed{")
            .and_then(|t| t.strip_suffix('}'))
        {
            text = inner.trim();
        }
        if text == before {
            return text;
        }
    }
}

impl Extractor {
    pub fn new() -> Self {
        Self {
            // Fixed patterns: a failure to compile is a programming error caught by every test.
            answer_phrase: Regex::new(r"(?i)(?:final\s+answer|answer)\s*(?:is|:|=)\s*:?")
                .expect("static answer-phrase regex compiles"),
            last_number: Regex::new(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
                .expect("static number regex compiles"),
        }
    }

    /// Finds the final answer of `completion`, already cleaned (`clean_answer`). `None` when no
    /// candidate exists or the candidate is longer than `MAX_ANSWER_BYTES`.
    pub fn extract<'t>(&self, completion: &'t str) -> Option<(&'t str, AnswerSource)> {
        let found = self.locate(completion)?;
        let answer = clean_answer(found.0);
        (!answer.is_empty() && answer.len() <= MAX_ANSWER_BYTES).then_some((answer, found.1))
    }

    fn locate<'t>(&self, completion: &'t str) -> Option<(&'t str, AnswerSource)> {
        if let Some(boxed) = last_boxed(completion) {
            return Some((boxed, AnswerSource::Boxed));
        }
        if let Some(open) = completion.rfind("<answer>") {
            let inner = &completion[open + "<answer>".len()..];
            let inner = inner
                .find("</answer>")
                .map_or(inner, |close| &inner[..close]);
            // `<answer>The answer is 5</answer>`: the phrase inside the tag still marks it.
            if let Some(found) = self.answer_phrase.find_iter(inner).last() {
                return Some((&inner[found.end()..], AnswerSource::AnswerTag));
            }
            return Some((inner, AnswerSource::AnswerTag));
        }
        if let Some(found) = self.answer_phrase.find_iter(completion).last() {
            let rest = &completion[found.end()..];
            let line = rest
                .split('\n')
                .find(|l| !l.trim().is_empty())
                .unwrap_or("");
            // Up to the end of the sentence: a period followed by a space.
            let sentence = line.find(". ").map_or(line, |end| &line[..end]);
            return Some((sentence, AnswerSource::AnswerPhrase));
        }
        if let Some(hashes) = completion.rfind("####") {
            let rest = &completion[hashes + 4..];
            let line = rest.split('\n').next().unwrap_or("");
            return Some((line, AnswerSource::Hashes));
        }
        let number = self.last_number.find_iter(completion).last()?;
        Some((
            number.as_str().trim_end_matches(','),
            AnswerSource::LastNumber,
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxed_with_nested_braces_wins_over_everything() {
        let text = "The answer is 3. #### 4\n So $\\boxed{\\frac{1}{\\sqrt{2}}}$.";
        let (answer, source) = Extractor::new().extract(text).unwrap();
        assert_eq!(answer, "\\frac{1}{\\sqrt{2}}");
        assert_eq!(source, AnswerSource::Boxed);
    }

    #[test]
    fn last_boxed_is_taken() {
        assert_eq!(last_boxed("\\boxed{1} then \\boxed{2}"), Some("2"));
        assert_eq!(last_boxed("\\boxed 7$"), Some("7"));
        assert_eq!(last_boxed("\\boxed{unclosed"), None);
    }

    #[test]
    fn answer_tags_then_phrases_then_hashes_then_last_number() {
        let extractor = Extractor::new();
        assert_eq!(extractor.extract("<answer> 12 </answer>").unwrap().0, "12");
        let tagged_phrase = "<answer>The final answer is 12.</answer>";
        assert_eq!(extractor.extract(tagged_phrase).unwrap().0, "12");
        assert_eq!(
            extractor.extract("so the answer is $5$. Done").unwrap().0,
            "5"
        );
        assert_eq!(extractor.extract("Final Answer: 7\n").unwrap().0, "7");
        assert_eq!(extractor.extract("work\n#### 1,234").unwrap().0, "1,234");
        assert_eq!(
            extractor.extract("we get 3 then 4.5 apples").unwrap(),
            ("4.5", AnswerSource::LastNumber)
        );
        assert_eq!(extractor.extract("no digits here"), None);
    }

    #[test]
    fn deep_boxed_nesting_is_rejected_not_recursed() {
        let text = format!("\\boxed{}{}", "{".repeat(10_000), "}".repeat(10_000));
        assert_eq!(last_boxed(&text), None);
    }
}
