//! Final-answer extraction from a completion, in a fixed priority order:
//!
//! 1. Reasoning is skipped: only the text after the last `</think>` is read; a `<think>` that is
//!    never closed leaves no answer (the model never finished).
//! 2. The last `<answer>...</answer>` tag, when present, is the only text read (steps 3-6 then
//!    apply inside it; a tag with nothing recognisable inside is taken whole).
//! 3. The last explicit final-answer statement ("final answer is", "Final Answer:",
//!    `**Answer:**`, "the answer is", `####`) wins over every box before it. A box *after* the
//!    statement is a revision and wins. Inside a statement: its boxes, else the whole statement
//!    without math delimiters, else what follows its last " is ", else its last plain number.
//! 4. Otherwise the last `\boxed{}`/`\fbox{}`. Boxes written together ("`\boxed{-2}` and
//!    `\boxed{1}`", "`\boxed{1}, \boxed{2}`") form one list answer, so hedging over several
//!    boxes answers a list, never the gold scalar; a sentence or words without "and"/"or"
//!    between two boxes separate them and only the last counts.
//! 5. Otherwise the last inline or display math span (`$...$`, `$$...$$`, `\(...\)`, `\[...\]`)
//!    unless a plain number comes after it; a `$...$` holding prose is currency, not math.
//! 6. Otherwise plain text: the whole text when it is a short answer that parses (a value, a
//!    word or two, or a number in words: "one hundred and five"), else its last digit-written
//!    number, and only a standalone one: never part of a word or identifier (`AZYUK2A`), an
//!    exponent, subscript, denominator or operand (`x^2`, `a_2`, `1/2`, `2 + 3`), and never one
//!    qualified or hedged ("at least 12", "not 12", "2 or 3"): then there is no answer.
//!
//! The answer of step 3 or 4 is the *marked answer*. In a completion (never in a reference
//! solution, which is trusted as written) the text after it may revise it, by these rules
//! (`revision.rs` holds the phrase lists):
//!
//! - **Verification and asides are ignored.** Sentences after the marked answer that open
//!   (after one "But", "And", "So" or "Also") with "Check", "Verify", "Verification", "Let me
//!   verify/check", "Let's check", "Double-check", "Sanity check", "Confirm", "Indeed",
//!   "Plugging back", "Note", "Notice", "Recall", "Remark", "By the way" or "For reference", or
//!   that hold ✓, ✔, ✅ or "checks out", take no part in the two rules below: `\boxed{6}`
//!   followed by "Check: 6*7 = 42 ✓" is 6.
//! - **Retraction.** The last retraction cue after the marked answer (after a statement's first
//!   word, so "Answer: No, because ..." is none; outside boxes and math) withdraws it. Cues:
//!   "wait", "actually", "hold on" and "no" (followed by punctuation or "wait") where they open a
//!   clause (at the start, after a line break or one of `. ! ? ; : , ( ) -`, with markdown and
//!   one interjection such as "Hmm," or "But" allowed between); anywhere: "oops",
//!   "correction", "on second thought", "on reflection", "on closer inspection", "looking
//!   again", "scratch that", "never mind", "my mistake", "I made a (...) mistake/error",
//!   "that's/this is wrong/incorrect/not right", "that can't be right", "I was wrong", "I forgot/miscounted/miscalculated/misread/overlooked/double-counted", "let
//!   me recompute/recalculate/redo/recount/reconsider/re-evaluate/rethink/fix that/correct
//!   myself", "recomputing", "recalculating". The answer is then read from the text after the
//!   cue alone, by steps 3-6 and the next rule (where a later answer statement counts even
//!   with no marked answer before it). When that text holds no answer the completion has none
//!   (`Retracted`, never the withdrawn value), unless it only confirms the answer ("Wait, is
//!   that right? Yes.", "Wait, let me verify: ..."): it holds a verification sentence or
//!   yes/correct/right/confirmed/checks out, and no word of error (wrong, mistake, error,
//!   forgot, missed, instead, should be, ...); then the marked answer stands.
//! - **Later answer statement.** Otherwise the last answer statement after the marked answer
//!   replaces it, when the value it states (up to the end of its clause: the sentence's end or
//!   a `, `/`; ` outside math and brackets) parses, is not a word, and no digit follows it in
//!   the rest of the text (verification sentences aside). The statements: a *correction*,
//!   "the correct/actual/right/true/revised/updated/new/final [total] NOUN [of ...]
//!   is/are/equals/= X"; a *conclusion*, "so/thus/therefore/hence/altogether/overall/in
//!   total/finally/which gives [the] NOUN [of ...] is/are/equals/= X"; a *result*,
//!   "giving/which gives/that makes/making/for a total of/we get/I get/comes to X"; and a
//!   *count*, "[so ...] there are/is/were [only/exactly] X" with at most two words after X
//!   besides "in total"/"of them" ("there are 9 distinct triangles"). NOUN is one of answer,
//!   total, sum, result, value, count, number, amount, cost, price, difference, product,
//!   quotient, area, perimeter, volume, length, distance, probability, solution. A correction
//!   always revises; a conclusion, a result or a count only when the text marks a revision: a
//!   contrast between the marked answer and it ("but", "however", "instead", "in fact",
//!   "rather", "carefully", "again", "twice", "recount", "double counts", "overcounts") or a
//!   marked answer presented as tentative in its own sentence ("a common first guess is
//!   `\boxed{12}`", "initially", "at first", "naively", "assuming"). So "`\boxed{18}` There are
//!   9 eggs sold." stays 18, and any other trailing text ("This is because 2 + 3 = 5", "Note
//!   that the discriminant is 16") never overrides.
//!
//! Revisions apply only to a marked answer: a plain-text last number (steps 5-6) is already
//! the latest value written.
//!
//! What this is not: a judge. It locates text; `compare.rs` decides. It may parse a candidate
//! (to choose between a whole statement and its last number) but never compares it to the gold.
//!
//! Invariants: every step is a linear scan (one pass over the text per step, the linear-time
//! `regex` crate, brace matching with a depth limit), so a 1 MB completion costs milliseconds;
//! the answer is at most `MAX_ANSWER_BYTES`, a longer one is an error, never truncated.

use regex::Regex;

use super::expr::Expr;
use super::number_words::phrase_value;
use super::parser::parse_answer;
use super::plain::{last_number, last_numbers};
use super::revision::{Revisions, mask_verifications};
use super::spans::{Span, boxes, math_spans, sentence_end, strip_delimiters};

/// Longest extracted answer accepted.
pub const MAX_ANSWER_BYTES: usize = 2000;
/// Longest whole plain-text completion read as an answer in itself (`1 000`, `28 percent`).
const MAX_PLAIN_ANSWER_BYTES: usize = 64;
/// Most text between two boxes that still joins them into one answer.
const MAX_BOX_GAP_BYTES: usize = 160;
/// Most words between two joined boxes (`\boxed{1} papers and \boxed{2} bins`).
const MAX_BOX_GAP_WORDS: usize = 6;

/// Where the answer was found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum AnswerSource {
    /// `\boxed{}` (or several joined boxes), possibly inside a statement or tag.
    Boxed,
    /// An `<answer>` tag taken whole.
    AnswerTag,
    /// A final-answer statement ("The final answer is ...", `####`).
    Statement,
    /// The last math span.
    MathSpan,
    /// A short plain-text completion taken whole.
    WholeText,
    /// The last standalone plain-text number.
    LastNumber,
}

/// An extracted answer and where it came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Extraction {
    pub answer: String,
    pub source: AnswerSource,
}

/// Why no answer was extracted.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExtractError {
    /// `<think>` without `</think>`.
    UnclosedReasoning,
    /// Nothing that looks like an answer.
    NoAnswer,
    /// The answer is longer than `MAX_ANSWER_BYTES`.
    TooLong,
    /// The marked answer is taken back ("Wait, I forgot ...") and no new answer follows.
    Retracted,
    /// The only candidate is qualified, hedged or part of a larger expression.
    Ambiguous(&'static str),
}

impl std::fmt::Display for ExtractError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::UnclosedReasoning => write!(f, "<think> is never closed"),
            Self::NoAnswer => write!(f, "no final answer found"),
            Self::TooLong => write!(f, "answer longer than {MAX_ANSWER_BYTES} bytes"),
            Self::Retracted => write!(f, "the answer is retracted and no new answer follows"),
            Self::Ambiguous(why) => write!(f, "ambiguous answer: {why}"),
        }
    }
}

/// The phrase patterns, compiled once per verifier.
#[derive(Debug, Clone)]
pub struct Extractor {
    statement: Regex,
    number: Regex,
    revisions: Revisions,
}

/// How a text is read: which of the revision rules (step 4b) apply.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Reading {
    /// A reference solution, trusted as written: no revisions, and its words around a box are
    /// not a hedge.
    Reference,
    /// A completion: a retraction or a later answer statement revises the marked answer.
    Completion,
    /// The text after a retraction cue: a later answer statement may stand without a marked
    /// answer before it.
    AfterRetraction,
}

/// A marked answer (a final-answer statement or the last box group) and where revisions of it
/// are looked for.
struct Marked {
    found: Result<Extraction, ExtractError>,
    /// Where the statement or the first box of the group begins.
    start: usize,
    /// Retraction cues count from here (after the statement's first word, or the box).
    cues_from: usize,
    /// Later statements and verification sentences count from here.
    end: usize,
}

impl Default for Extractor {
    fn default() -> Self {
        Self::new()
    }
}

/// Strips math delimiters, quotes, markdown and trailing punctuation around an answer.
pub fn clean_answer(answer: &str) -> &str {
    let mut text = answer.trim();
    loop {
        let before = text;
        for (open, close) in [
            ("$$", "$$"),
            ("$", "$"),
            ("\\(", "\\)"),
            ("\\[", "\\]"),
            ("\\\"", "\\\""),
            ("\"", "\""),
            ("**", "**"),
            ("`", "`"),
        ] {
            if text.len() >= open.len() + close.len()
                && text.starts_with(open)
                && text.ends_with(close)
            {
                text = text[open.len()..text.len() - close.len()].trim();
            }
        }
        text = text.trim_end_matches(['.', '。']).trim();
        text = text.trim_start_matches([':', '*']).trim();
        text = text.trim_end_matches('*').trim();
        if let Some(inner) = text
            .strip_prefix("\\boxed{")
            .and_then(|t| t.strip_suffix('}'))
            .filter(|inner| balanced(inner))
        {
            text = inner.trim();
        }
        if text == before {
            return text;
        }
    }
}

fn balanced(text: &str) -> bool {
    let mut depth = 0i64;
    for byte in text.bytes() {
        match byte {
            b'{' => depth += 1,
            b'}' => {
                depth -= 1;
                if depth < 0 {
                    return false;
                }
            }
            _ => {}
        }
    }
    depth == 0
}

/// The text after the reasoning section.
fn after_reasoning(text: &str) -> Result<&str, ExtractError> {
    if let Some(end) = text.rfind("</think>") {
        return Ok(&text[end + "</think>".len()..]);
    }
    if text.contains("<think>") {
        return Err(ExtractError::UnclosedReasoning);
    }
    Ok(text)
}

/// Whether the text between two boxes joins them into one list answer.
fn gap_joins(gap: &str) -> bool {
    if gap.len() > MAX_BOX_GAP_BYTES || gap.contains("\n\n") {
        return false;
    }
    let plain = strip_delimiters(gap);
    let plain = plain.replace("\\text", " ").replace("\\quad", " ");
    // Digits in a subscript (`y_2 =`) are a label, not a value between the boxes.
    let without_subscripts: String = plain
        .split('_')
        .enumerate()
        .map(|(i, part)| {
            if i == 0 {
                part
            } else {
                part.trim_start_matches(|c: char| c.is_ascii_alphanumeric() || c == '{' || c == '}')
            }
        })
        .collect();
    if without_subscripts.bytes().any(|b| b.is_ascii_digit()) {
        return false;
    }
    let trimmed = plain.trim();
    if trimmed.contains(". ") || trimmed.ends_with('.') || trimmed.contains(['!', '?']) {
        return false;
    }
    let words: Vec<String> = plain
        .split(|c: char| !c.is_ascii_alphabetic())
        .filter(|w| !w.is_empty())
        .map(str::to_ascii_lowercase)
        .collect();
    words.is_empty()
        || (words.len() <= MAX_BOX_GAP_WORDS && words.iter().any(|w| w == "and" || w == "or"))
}

/// Whether the two words before `start` or after `end` qualify the value between
/// ("at least \boxed{12}", "\boxed{12} or more", "not \boxed{12}").
fn qualified_around(text: &str, start: usize, end: usize) -> bool {
    let words = |part: &str| -> Vec<String> {
        part.split(|c: char| !(c.is_alphanumeric() || c == '\''))
            .filter(|w| !w.is_empty())
            .map(str::to_lowercase)
            .collect()
    };
    let before = text[..start].rsplit('\n').next().unwrap_or("");
    let after = text[end..].split('\n').next().unwrap_or("");
    let before = words(before);
    let after = words(after);
    before
        .iter()
        .rev()
        .take(2)
        .chain(after.iter().take(2))
        .any(|w| super::units::is_qualifier(w))
}

/// A known unit word right after a box (`$\boxed{5}$ cm`), outside any math.
fn unit_after(rest: &str) -> Option<&str> {
    let rest = rest.trim_start_matches(['$', ' ', '\\', ')', ']']);
    let word_len = rest
        .find(|c: char| !c.is_ascii_alphabetic())
        .unwrap_or(rest.len());
    let word = &rest[..word_len];
    super::units::canonical_unit(word).map(|_| word)
}

/// The answer of the last box in `text` and the boxes written together with it.
fn box_group(text: &str, found: &[Span], strict: bool) -> Option<Result<String, ExtractError>> {
    let last = found.len().checked_sub(1)?;
    let mut first = last;
    while first > 0 && gap_joins(&text[found[first - 1].end..found[first].start]) {
        first -= 1;
    }
    if strict && qualified_around(text, found[first].start, found[last].end) {
        return Some(Err(ExtractError::Ambiguous(
            "the boxed answer is qualified",
        )));
    }
    let parts: Vec<&str> = found[first..=last]
        .iter()
        .map(|span| clean_answer(&text[span.content.clone()]))
        .collect();
    if first == last
        && let Some(unit) = unit_after(&text[found[last].end..])
    {
        // `$\boxed{5}$ cm`: the unit written after the box is part of the answer.
        return Some(Ok(format!("{} \\text{{ {unit}}}", parts[0])));
    }
    if parts.iter().any(|part| part.is_empty()) {
        // An empty box among the group: no answer, whatever the others say.
        return Some(Err(ExtractError::NoAnswer));
    }
    Some(Ok(parts.join(", ")))
}

impl Extractor {
    pub fn new() -> Self {
        Self {
            // Fixed patterns: a failure to compile is a programming error caught by every test.
            // ASCII classes and word boundaries keep both patterns on the regex crate's DFA.
            statement: Regex::new(
                r"(?i-u)(?:\bfinal\s+answer\b(?:\s*\*{0,2}\s*(?:is\b|:|=))?|\bthe\s+answers?\s+(?:is|are)\b:?|\banswers?\s*\*{0,2}\s*(?::|=)|\banswer\s+(?:is|are)\b:?|\banswer\b\s*(?:\$|\\\(|\\\[)|####)",
            )
            .expect("static statement regex compiles"),
            number: Regex::new(r"[0-9](?:[0-9,]|\{,\})*(?:\.[0-9]+)?(?:/[0-9]+(?:\.[0-9]+)?)?|\.[0-9]+").expect("static number regex compiles"),
            revisions: Revisions::new(),
        }
    }

    /// Finds the final answer of `completion`, already cleaned (`clean_answer`).
    pub fn extract(&self, completion: &str) -> Result<Extraction, ExtractError> {
        self.extract_with(completion, Reading::Completion)
    }

    /// Finds the answer of a reference solution: as `extract`, but the reference's own words
    /// around its box ("between $\boxed{12 \text{ and } 13}$") are trusted, not read as a hedge.
    pub fn extract_reference(&self, reference: &str) -> Result<Extraction, ExtractError> {
        self.extract_with(reference, Reading::Reference)
    }

    fn extract_with(&self, completion: &str, reading: Reading) -> Result<Extraction, ExtractError> {
        let text = after_reasoning(completion)?;
        let found = match answer_tag(text) {
            Some(inner) => self.locate(inner, reading).or_else(|error| {
                let whole = clean_answer(inner);
                if whole.is_empty()
                    || matches!(error, ExtractError::Ambiguous(_) | ExtractError::Retracted)
                {
                    Err(error)
                } else {
                    Ok(Extraction {
                        answer: whole.to_string(),
                        source: AnswerSource::AnswerTag,
                    })
                }
            })?,
            None => self.locate(text, reading)?,
        };
        let answer = clean_answer(&found.answer);
        if answer.is_empty() {
            return Err(ExtractError::NoAnswer);
        }
        if answer.len() > MAX_ANSWER_BYTES {
            return Err(ExtractError::TooLong);
        }
        Ok(Extraction {
            answer: answer.to_string(),
            source: found.source,
        })
    }

    /// The marked answer (step 3 or 4): the last final-answer statement unless a box follows
    /// its sentence, else the last box group.
    fn marked(&self, text: &str, found_boxes: &[Span], strict: bool) -> Option<Marked> {
        let last_box_start = found_boxes.last().map(|span| span.start);
        if let Some(statement) = self.statement.find_iter(text).last() {
            let body = statement_body(text, statement.end());
            // A box after the statement's sentence is a revision: the box wins.
            if last_box_start.is_none_or(|start| start < body.end)
                && let Some(found) = self.resolve_statement(&text[body.clone()], strict)
            {
                // A cue may follow the statement's first word ("42, wait, no, 44"), not be it
                // ("Answer: No, because ...").
                let first_word_end = text[body.clone()]
                    .find(char::is_whitespace)
                    .map_or(body.end, |at| body.start + at);
                return Some(Marked {
                    found,
                    start: statement.start(),
                    cues_from: first_word_end,
                    end: body.end,
                });
            }
        }
        let group = box_group(text, found_boxes, strict)?;
        let end = found_boxes.last().map_or(text.len(), |span| span.end);
        let start = found_boxes.last().map_or(0, |span| span.start);
        Some(Marked {
            start,
            found: group.map(|answer| Extraction {
                answer,
                source: AnswerSource::Boxed,
            }),
            cues_from: end,
            end,
        })
    }

    /// Step 4b: a retraction or a later answer statement after the marked answer.
    fn revise(&self, text: &str, marked: Marked) -> Result<Extraction, ExtractError> {
        let masked = mask_verifications(text, marked.end);
        if let Some(cue_end) = self.revisions.last_retraction(&masked, marked.cues_from) {
            let tail = &text[cue_end..];
            let masked_tail = mask_verifications(tail, 0);
            return match self.locate(&masked_tail, Reading::AfterRetraction) {
                Err(ExtractError::NoAnswer) if self.revisions.affirms(tail, &masked_tail) => {
                    marked.found
                }
                Err(ExtractError::NoAnswer) => Err(ExtractError::Retracted),
                other => other,
            };
        }
        let tentative = self.revisions.tentative(text, marked.start);
        match self
            .revisions
            .later_statement(&masked, marked.end, tentative)
        {
            Some(found) => Ok(found),
            None => marked.found,
        }
    }

    fn locate(&self, text: &str, reading: Reading) -> Result<Extraction, ExtractError> {
        let strict = reading != Reading::Reference;
        let found_boxes = boxes(text);
        if let Some(marked) = self.marked(text, &found_boxes, strict) {
            return match reading {
                Reading::Reference => marked.found,
                Reading::Completion => self.revise(text, marked),
                Reading::AfterRetraction => {
                    let masked = mask_verifications(text, marked.end);
                    match self.revisions.later_statement(&masked, marked.end, true) {
                        Some(found) => Ok(found),
                        None => marked.found,
                    }
                }
            };
        }
        if reading == Reading::AfterRetraction
            && let Some(found) = self.revisions.later_statement(text, 0, true)
        {
            return Ok(found);
        }
        let spans = math_spans(text);
        let numbers = last_numbers(&self.number, text, &spans);
        let plain_number = numbers.1.map(|m| m.start());
        if let Some(span) = spans.last()
            && plain_number.is_none_or(|start| start < span.end)
        {
            return Ok(Extraction {
                answer: text[span.content.clone()].to_string(),
                source: AnswerSource::MathSpan,
            });
        }
        let whole = clean_answer(text);
        // A short answer in itself: a value (`1 000`, `28 percent`) or a word or two (`odd`);
        // a sentence of prose ("I do not know") is no answer.
        let answer_like = whole.bytes().any(|b| b.is_ascii_digit() || b == b'\\')
            || whole.split_whitespace().count() <= 2
            || phrase_value(whole).is_some();
        // After a retraction a lone word ("Yes.") affirms and a list of words and values
        // ("6 × 7 = 42, so yes, 42 is correct") is prose: neither answers.
        let parses = |whole: &str| match parse_answer(whole) {
            Ok(Expr::Text(_) | Expr::List(_)) => reading != Reading::AfterRetraction,
            Ok(_) => true,
            Err(_) => false,
        };
        if !whole.is_empty()
            && whole.len() <= MAX_PLAIN_ANSWER_BYTES
            && answer_like
            && parses(whole)
        {
            return Ok(Extraction {
                answer: whole.to_string(),
                source: AnswerSource::WholeText,
            });
        }
        last_number(text, numbers).map(|answer| Extraction {
            answer,
            source: AnswerSource::LastNumber,
        })
    }

    /// The answer inside a final-answer statement, `None` when the statement holds nothing.
    fn resolve_statement(
        &self,
        body: &str,
        strict: bool,
    ) -> Option<Result<Extraction, ExtractError>> {
        let statement = |answer: String| {
            Some(Ok(Extraction {
                answer,
                source: AnswerSource::Statement,
            }))
        };
        let inner_boxes = boxes(body);
        if let Some(answer) = box_group(body, &inner_boxes, strict) {
            return Some(answer.map(|answer| Extraction {
                answer,
                source: AnswerSource::Boxed,
            }));
        }
        let whole = clean_answer(body);
        if whole.is_empty() {
            return None;
        }
        let plain = strip_delimiters(whole);
        let plain = clean_answer(&plain);
        if parse_answer(plain).is_ok() {
            return statement(plain.to_string());
        }
        // "The largest $n$ is 34": what follows the last " is ".
        if let Some(at) = plain.rfind(" is ").or_else(|| plain.rfind(" are ")) {
            let tail = clean_answer(plain[at..].trim_start().split_once(' ').map_or("", |s| s.1));
            if parse_answer(tail).is_ok() {
                return statement(tail.to_string());
            }
        }
        let spans = math_spans(whole);
        let numbers = last_numbers(&self.number, whole, &spans);
        let plain_number = numbers.1.map(|m| m.start());
        if let Some(span) = spans.last()
            && plain_number.is_none_or(|start| start < span.end)
        {
            return statement(whole[span.content.clone()].to_string());
        }
        match last_number(whole, numbers) {
            Ok(answer) => statement(answer),
            // Prose with no value ("Answer: let us compute"): look further on.
            Err(ExtractError::NoAnswer) => None,
            Err(error) => Some(Err(error)),
        }
    }
}

/// The text of `<answer>...</answer>` (the last tag; an unclosed tag runs to the end).
fn answer_tag(text: &str) -> Option<&str> {
    let open = text.rfind("<answer>")?;
    let inner = &text[open + "<answer>".len()..];
    Some(
        inner
            .find("</answer>")
            .map_or(inner, |close| &inner[..close]),
    )
}

/// The range of the statement after a final-answer phrase: blank lines skipped, up to the
/// sentence's end.
fn statement_body(text: &str, from: usize) -> std::ops::Range<usize> {
    let rest = &text[from..];
    let trimmed = rest.trim_start_matches(|c: char| c.is_whitespace() || c == '*' || c == ':');
    let start = from + (rest.len() - trimmed.len());
    let trimmed = trimmed.split("<|im_start|>").next().unwrap_or(trimmed);
    start..start + sentence_end(trimmed)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn answer(text: &str) -> Result<(String, AnswerSource), ExtractError> {
        Extractor::new()
            .extract(text)
            .map(|found| (found.answer, found.source))
    }

    #[test]
    fn a_later_final_statement_wins_over_an_earlier_box() {
        let text = "so \\boxed{255} is the interest. Final Answer: The final answer is $10,455$. I hope it is correct.";
        assert_eq!(answer(text).unwrap().0, "10,455");
    }

    #[test]
    fn a_later_box_revises_an_earlier_statement() {
        let text = "The answer is 3. Wait, that is wrong: \\boxed{4}";
        assert_eq!(answer(text).unwrap(), ("4".into(), AnswerSource::Boxed));
    }

    #[test]
    fn boxes_written_together_form_a_list() {
        assert_eq!(
            answer("\\boxed{-2} \\text{ and } \\boxed{1}").unwrap().0,
            "-2, 1"
        );
        assert_eq!(answer("\\boxed{3} or \\boxed{4}").unwrap().0, "3, 4");
        assert_eq!(
            answer("\\boxed{1} no no no no no \\boxed{2}").unwrap().0,
            "2"
        );
        assert_eq!(
            answer("\\boxed{3}. Then we check: \\boxed{4}").unwrap().0,
            "4"
        );
    }

    #[test]
    fn reasoning_is_skipped_and_an_unclosed_think_has_no_answer() {
        assert_eq!(answer("<think>\\boxed{1}</think> so 2").unwrap().0, "2");
        assert_eq!(
            answer("<think>\\boxed{1}"),
            Err(ExtractError::UnclosedReasoning)
        );
    }

    #[test]
    fn answer_tags_are_read_inside() {
        assert_eq!(
            answer("\\boxed{5}<answer>The answer is 12.</answer>")
                .unwrap()
                .0,
            "12"
        );
        assert_eq!(answer("<answer> 12 </answer>").unwrap().0, "12");
    }

    #[test]
    fn statements_of_every_form() {
        assert_eq!(answer("**Answer:** 18").unwrap().0, "18");
        assert_eq!(answer("work\n#### 1,234").unwrap().0, "1,234");
        assert_eq!(
            answer("The answer is 17 + 1 = 18.").unwrap().0,
            "17 + 1 = 18"
        );
        assert_eq!(
            answer("Final Answer: The largest $n$ is 34.").unwrap().0,
            "34"
        );
        assert_eq!(answer("Answer \\( 9 \\)").unwrap().0, "9");
    }

    #[test]
    fn the_last_number_is_standalone_or_nothing() {
        assert_eq!(
            answer("we get 3 then 4.5 apples").unwrap(),
            ("4.5".into(), AnswerSource::LastNumber)
        );
        assert!(answer("AZYUK2A").is_err());
        assert!(answer("it is at least 12 I think").is_err());
        assert!(answer("maybe it is 2 or 3 in the end").is_err());
        assert!(answer("we get x^2 in the end").is_err());
        assert_eq!(answer("no digits here"), Err(ExtractError::NoAnswer));
    }

    #[test]
    fn deep_boxed_nesting_is_rejected_not_recursed() {
        let text = format!("\\boxed{}{}", "{".repeat(10_000), "}".repeat(10_000));
        assert!(answer(&text).is_err());
    }
}
