//! Locating LaTeX structure in free text: `\boxed{}`/`\fbox{}` groups, math spans (`$...$`,
//! `$$...$$`, `\(...\)`, `\[...\]`) and the end of a sentence outside math.
//!
//! What this is not: a LaTeX parser. It finds delimiters and balances braces; `lexer.rs` reads
//! what is inside. A `$...$` pair around prose ("costs $5 for apples and $3") is currency, not
//! math, and is skipped.
//!
//! Invariants: each function is one left-to-right pass (a box nested in a box is not scanned
//! again; an unclosed delimiter ends the scan), so cost is linear in the text; brace depth is
//! limited to `MAX_BRACE_DEPTH`.

use std::ops::Range;

/// Deepest brace nesting followed inside `\boxed{}`.
const MAX_BRACE_DEPTH: usize = 64;
/// Most prose words (three or more lowercase letters, outside commands) a `$...$` may hold.
const MAX_PROSE_WORDS: usize = 1;

/// A located construct: its whole extent and the range of its content.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Span {
    pub start: usize,
    pub end: usize,
    pub content: Range<usize>,
}

/// End (exclusive) of the balanced `{...}` group opening at `open`, if it closes in depth.
fn group_end(bytes: &[u8], open: usize) -> Option<usize> {
    let mut depth = 0usize;
    let mut index = open;
    while index < bytes.len() {
        match bytes[index] {
            b'\\' => index += 1,
            b'{' => {
                depth += 1;
                if depth > MAX_BRACE_DEPTH {
                    return None;
                }
            }
            b'}' => {
                depth -= 1;
                if depth == 0 {
                    return Some(index + 1);
                }
            }
            _ => {}
        }
        index += 1;
    }
    None
}

/// Every top-level `\boxed{...}`/`\fbox{...}` (and `\boxed 5`), in order.
pub fn boxes(text: &str) -> Vec<Span> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut from = 0;
    while let Some(offset) = text[from..].find('\\') {
        let start = from + offset;
        let rest = &text[start..];
        let command_len = if rest.starts_with("\\boxed") {
            6
        } else if rest.starts_with("\\fbox") {
            5
        } else {
            from = start + 1;
            continue;
        };
        let after = start + command_len;
        let gap = text[after..].len() - text[after..].trim_start().len();
        if bytes.get(after + gap) == Some(&b'{') {
            match group_end(bytes, after + gap) {
                Some(end) => {
                    found.push(Span {
                        start,
                        end,
                        content: after + gap + 1..end - 1,
                    });
                    from = end;
                }
                None => from = after,
            }
        } else if gap > 0 {
            // `\boxed 5`: up to the next `$` or whitespace.
            let word_start = after + gap;
            let len = text[word_start..]
                .find(|c: char| c == '$' || c.is_whitespace())
                .unwrap_or(text.len() - word_start);
            if len > 0 {
                found.push(Span {
                    start,
                    end: word_start + len,
                    content: word_start..word_start + len,
                });
            }
            from = word_start + len;
        } else {
            from = after;
        }
        if from >= text.len() {
            break;
        }
    }
    found
}

/// Prose words in the content of a `$...$`: more than `MAX_PROSE_WORDS`, or any after a
/// leading digit (`$3 then $`), make it currency signs around text, not math.
fn words(content: &str) -> usize {
    let bytes = content.as_bytes();
    let mut words = 0;
    let mut index = 0;
    while index < bytes.len() {
        if bytes[index] == b'\\' {
            index += 1;
            while index < bytes.len() && bytes[index].is_ascii_alphabetic() {
                index += 1;
            }
            if (bytes[..index].ends_with(b"text") || bytes[..index].ends_with(b"mbox"))
                && let Some(end) = (bytes.get(index) == Some(&b'{'))
                    .then(|| group_end(bytes, index))
                    .flatten()
            {
                index = end;
            }
            continue;
        }
        let start = index;
        while index < bytes.len() && bytes[index].is_ascii_lowercase() {
            index += 1;
        }
        // A word stands between spaces; `{pmatrix}` and `x_{max}` are not prose.
        let spaced_before = start == 0 || bytes[start - 1].is_ascii_whitespace();
        let spaced_after = index == bytes.len()
            || bytes[index].is_ascii_whitespace()
            || b",.;:".contains(&bytes[index]);
        if index - start >= 3 && spaced_before && spaced_after {
            words += 1;
        }
        if index == start {
            index += 1;
        }
    }
    words
}

/// Every math span, in order; unclosed delimiters end the scan.
pub fn math_spans(text: &str) -> Vec<Span> {
    let bytes = text.as_bytes();
    let mut found = Vec::new();
    let mut index = 0;
    while index < bytes.len() {
        let (open_len, close) = match bytes[index] {
            b'\\' => match bytes.get(index + 1) {
                Some(b'(') => (2, "\\)"),
                Some(b'[') => (2, "\\]"),
                _ => {
                    index += 2;
                    continue;
                }
            },
            b'$' if bytes.get(index + 1) == Some(&b'$') => (2, "$$"),
            b'$' => (1, "$"),
            _ => {
                index += 1;
                continue;
            }
        };
        let content_start = index + open_len;
        let Some(offset) = find_unescaped(&text[content_start..], close) else {
            if close == "$" {
                // A lone `$` is a currency sign; keep scanning after it.
                index += 1;
                continue;
            }
            break;
        };
        let content_end = content_start + offset;
        let content = &text[content_start..content_end];
        let currency = content.starts_with(|c: char| c.is_ascii_digit()) && words(content) > 0;
        if close == "$"
            && (content.trim().is_empty() || currency || words(content) > MAX_PROSE_WORDS)
        {
            index += 1;
            continue;
        }
        found.push(Span {
            start: index,
            end: content_end + close.len(),
            content: content_start..content_end,
        });
        index = content_end + close.len();
    }
    found
}

/// Offset of the first `close` in `text` not escaped by a backslash (`\$` is a dollar sign).
fn find_unescaped(text: &str, close: &str) -> Option<usize> {
    let mut from = 0;
    while let Some(offset) = text[from..].find(close) {
        let at = from + offset;
        let escaped = close.starts_with('$') && at > 0 && text.as_bytes()[at - 1] == b'\\';
        if !escaped {
            return Some(at);
        }
        from = at + 1;
    }
    None
}

/// Text without math delimiters (`$`, `$$`, `\(`, `\)`, `\[`, `\]`); `\$` stays.
pub fn strip_delimiters(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    let mut chars = text.chars().peekable();
    while let Some(ch) = chars.next() {
        match ch {
            '$' => out.push(' '),
            '\\' => match chars.peek() {
                Some('(' | ')' | '[' | ']') => {
                    chars.next();
                    out.push(' ');
                }
                Some(&next) => {
                    out.push('\\');
                    out.push(next);
                    chars.next();
                }
                None => out.push('\\'),
            },
            _ => out.push(ch),
        }
    }
    out
}

/// Byte length of the first sentence of `text`: up to a newline, or a `.`, `!` or `?` followed
/// by whitespace or the end, outside math and braces.
pub fn sentence_end(text: &str) -> usize {
    let bytes = text.as_bytes();
    let mut in_math: Option<&str> = None;
    let mut depth = 0usize;
    let mut index = 0;
    while index < bytes.len() {
        let rest = &bytes[index..];
        if let Some(close) = in_math {
            if rest.starts_with(close.as_bytes()) {
                in_math = None;
                index += close.len();
            } else {
                index += if bytes[index] == b'\\' { 2 } else { 1 };
            }
            continue;
        }
        match bytes[index] {
            b'\\' if rest.starts_with(b"\\(") => in_math = Some("\\)"),
            b'\\' if rest.starts_with(b"\\[") => in_math = Some("\\]"),
            b'\\' => {
                index += 2;
                continue;
            }
            b'$' if rest.starts_with(b"$$") => {
                in_math = Some("$$");
                index += 2;
                continue;
            }
            b'$' => in_math = Some("$"),
            b'{' => depth += 1,
            b'}' => depth = depth.saturating_sub(1),
            b'\n' if depth == 0 && index > 0 => return index,
            b'.' | b'!' | b'?' if depth == 0 => {
                let next = bytes.get(index + 1);
                // `4! = 24` is a factorial, not an exclamation.
                let factorial =
                    bytes[index] == b'!' && index > 0 && !bytes[index - 1].is_ascii_alphabetic();
                if next.is_none_or(|b| b.is_ascii_whitespace()) && !factorial {
                    return index;
                }
            }
            _ => {}
        }
        index += 1;
    }
    bytes.len().min(index)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn boxes_are_found_in_order_and_nested_ones_are_not_repeated() {
        let text = "a \\boxed{1} b \\fbox{\\frac{1}{2}} c \\boxed{\\boxed{3}} \\boxed 7$";
        let contents: Vec<&str> = boxes(text)
            .iter()
            .map(|s| &text[s.content.clone()])
            .collect();
        assert_eq!(contents, ["1", "\\frac{1}{2}", "\\boxed{3}", "7"]);
        assert!(boxes("\\boxed{unclosed").is_empty());
    }

    #[test]
    fn math_spans_skip_currency_and_escaped_dollars() {
        let text = "pay $5 for apples and $3 then $x = \\$4$ and \\(y\\)";
        let contents: Vec<&str> = math_spans(text)
            .iter()
            .map(|s| &text[s.content.clone()])
            .collect();
        assert_eq!(contents, ["x = \\$4", "y"]);
    }

    #[test]
    fn sentences_end_outside_math() {
        assert_eq!(sentence_end("$3.5$ apples. Then"), 12);
        assert_eq!(sentence_end("16386.16. I hope"), 8);
        assert_eq!(sentence_end("\\[ a.\n b \\] x\ny"), 13);
    }
}
