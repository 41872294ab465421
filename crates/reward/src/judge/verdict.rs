//! Reading a judge's verdict out of its answer: `Score: N` (pointwise), `Verdict: A|B|tie`
//! (pairwise), `Ranking: 3 > 1 > 2` (listwise).
//!
//! The rule, the same for the three: reasoning in `<think>...</think>` is dropped (an
//! unterminated `<think>` drops the rest of the answer), then the verdict is the **last line**
//! that matches the pattern, case-insensitive, after markdown emphasis, heading and quote marks
//! are stripped (`**Score:** 7`, `### Verdict: B`, `> Ranking: 2 > 1`) and trailing punctuation
//! is tolerated. `Score: 7/10` is read as 7 when the denominator is the scale's top. A line that
//! names the verdict but does not parse (`Score: 11` on 1..10, `Verdict: C`, a ranking with a
//! missing or repeated label) is an error, as is no verdict line, or a different verdict on the
//! line just before the last (ignoring blank lines): a judge that ends with two answers gave
//! none.
//!
//! What this is not: the prompts that ask for these lines (`prompt.rs`). It reads only the
//! judge's own answer, never the graded text. Errors are reasons in words; the caller turns
//! them into `UnparseableVerdict`, never into a score.

use std::sync::LazyLock;

use regex::Regex;

/// The verdict of one pairwise comparison, in the order the judge was shown the two.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum PairVerdict {
    /// The response shown first (A) is better.
    First,
    /// The response shown second (B) is better.
    Second,
    Tie,
}

static SCORE_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^(?:final\s+)?score\s*[:=]\s*(?P<value>[+-]?\d+(?:\.\d+)?)\s*(?:/\s*(?P<out_of>\d+(?:\.\d+)?))?\s*[.!,;)\]]*$",
    )
    .expect("a valid pattern")
});
static SCORE_NAMED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)^(?:final\s+)?score\s*[:=]").expect("a valid pattern"));
static VERDICT_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(
        r"(?i)^(?:final\s+)?verdict\s*[:=]\s*\[?\s*(?:response\s+)?(?P<value>a|b|tie|draw)\s*\]?\s*[.!,;)]*$",
    )
    .expect("a valid pattern")
});
static VERDICT_NAMED: LazyLock<Regex> =
    LazyLock::new(|| Regex::new(r"(?i)^(?:final\s+)?verdict\s*[:=]").expect("a valid pattern"));
static RANKING_LINE: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"(?i)^(?:final\s+)?ranking\s*[:=]\s*(?P<value>.*)$").expect("a valid pattern")
});
static RANK_ITEM: LazyLock<Regex> = LazyLock::new(|| {
    Regex::new(r"^\[?\s*(?:response\s+)?(?P<label>\d{1,4})\s*\]?$").expect("a valid pattern")
});

/// The pointwise score on `[lo, hi]` (not yet mapped to `[0, 1]`).
pub fn parse_score(answer: &str, lo: f64, hi: f64) -> Result<f64, String> {
    let value = last_verdict(answer, "Score", &SCORE_NAMED, |line| {
        let captures = SCORE_LINE
            .captures(line)
            .ok_or_else(|| format!("`{}` is not `Score: N`", shorten(line)))?;
        let value: f64 = captures["value"]
            .parse()
            .map_err(|_| format!("`{}` is not a number", &captures["value"]))?;
        if let Some(out_of) = captures.name("out_of") {
            let out_of: f64 = out_of.as_str().parse().unwrap_or(f64::NAN);
            if out_of != hi {
                return Err(format!(
                    "`{}` is out of {out_of}, not of the scale's top {hi}",
                    shorten(line)
                ));
            }
        }
        if !(lo..=hi).contains(&value) {
            return Err(format!("score {value} is outside the scale [{lo}, {hi}]"));
        }
        // Compared as bits so that 7 and 7.0 agree and two different lines do not.
        Ok(OrdF64(value))
    })?;
    Ok(value.0)
}

/// The pairwise verdict.
pub fn parse_pair(answer: &str) -> Result<PairVerdict, String> {
    last_verdict(answer, "Verdict", &VERDICT_NAMED, |line| {
        let captures = VERDICT_LINE
            .captures(line)
            .ok_or_else(|| format!("`{}` is not `Verdict: A`, `B` or `tie`", shorten(line)))?;
        Ok(match captures["value"].to_ascii_lowercase().as_str() {
            "a" => PairVerdict::First,
            "b" => PairVerdict::Second,
            _ => PairVerdict::Tie,
        })
    })
}

/// The listwise ranking of `n` responses labelled 1..=n: 0-based positions as shown, best
/// first. Every label must appear exactly once.
pub fn parse_ranking(answer: &str, n: usize) -> Result<Vec<usize>, String> {
    last_verdict(answer, "Ranking", &RANKING_LINE, |line| {
        let captures = RANKING_LINE
            .captures(line)
            .ok_or_else(|| format!("`{}` is not a ranking", shorten(line)))?;
        let body = captures["value"].trim_end_matches(['.', '!', ';', ' ']);
        let mut seen = vec![false; n];
        let mut order = Vec::with_capacity(n);
        for item in body.split('>') {
            let item = item.trim();
            let label: usize = RANK_ITEM
                .captures(item)
                .and_then(|c| c["label"].parse().ok())
                .ok_or_else(|| format!("`{}` is not a response label", shorten(item)))?;
            if !(1..=n).contains(&label) {
                return Err(format!("label {label} is not one of 1..={n}"));
            }
            if std::mem::replace(&mut seen[label - 1], true) {
                return Err(format!("label {label} appears twice"));
            }
            order.push(label - 1);
        }
        if order.len() != n {
            let missing: Vec<String> = (1..=n)
                .filter(|label| !seen[label - 1])
                .map(|label| label.to_string())
                .collect();
            return Err(format!(
                "the ranking misses label(s) {}",
                missing.join(", ")
            ));
        }
        Ok(order)
    })
}

/// A float with the equality of its bits, so verdicts can be compared.
#[derive(Debug, Clone, Copy)]
struct OrdF64(f64);

impl PartialEq for OrdF64 {
    fn eq(&self, other: &Self) -> bool {
        self.0.to_bits() == other.0.to_bits()
    }
}

/// The verdict of the last line naming `what` (`named` matches the start of such a line), read
/// by `read`, after the rule of the module doc.
fn last_verdict<T: PartialEq>(
    answer: &str,
    what: &str,
    named: &Regex,
    read: impl Fn(&str) -> Result<T, String>,
) -> Result<T, String> {
    let visible = without_reasoning(answer);
    let lines: Vec<String> = visible.lines().map(plain_line).collect();
    let mut verdict_lines = lines
        .iter()
        .enumerate()
        .rev()
        .filter(|(_, line)| named.is_match(line));
    let Some((last_index, last)) = verdict_lines.next() else {
        return Err(format!("the judge gave no `{what}:` line"));
    };
    let verdict = read(last)?;
    let previous = lines[..last_index]
        .iter()
        .rev()
        .find(|line| !line.is_empty());
    if let Some(previous) = previous
        && named.is_match(previous)
        && read(previous).ok().as_ref() != Some(&verdict)
    {
        return Err(format!(
            "the judge ended with two different verdicts: `{}` then `{}`",
            shorten(previous),
            shorten(last)
        ));
    }
    Ok(verdict)
}

/// The answer without `<think>...</think>` sections; an unterminated one runs to the end.
fn without_reasoning(answer: &str) -> String {
    let mut visible = String::with_capacity(answer.len());
    let mut rest = answer;
    loop {
        let Some(start) = find_ascii_ci(rest, "<think>") else {
            visible.push_str(rest);
            return visible;
        };
        visible.push_str(&rest[..start]);
        let after = &rest[start + "<think>".len()..];
        match find_ascii_ci(after, "</think>") {
            Some(end) => rest = &after[end + "</think>".len()..],
            None => return visible,
        }
    }
}

fn find_ascii_ci(haystack: &str, needle: &str) -> Option<usize> {
    haystack
        .as_bytes()
        .windows(needle.len())
        .position(|window| window.eq_ignore_ascii_case(needle.as_bytes()))
}

/// A line with markdown decoration removed: emphasis and code marks anywhere, and leading
/// heading, quote and list marks.
fn plain_line(line: &str) -> String {
    let without_marks: String = line
        .chars()
        .filter(|c| !matches!(c, '*' | '_' | '`'))
        .collect();
    without_marks
        .trim()
        .trim_start_matches(['#', '>', '-', '+', ' ', '\t'])
        .trim()
        .to_string()
}

fn shorten(text: &str) -> String {
    const MAX: usize = 80;
    match text.char_indices().nth(MAX) {
        Some((end, _)) => format!("{}...", &text[..end]),
        None => text.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn score(answer: &str) -> Result<f64, String> {
        parse_score(answer, 1.0, 10.0)
    }

    #[test]
    fn plain_and_decorated_score_lines_parse() {
        assert_eq!(score("Good answer.\nScore: 7"), Ok(7.0));
        assert_eq!(score("**Score:** 7"), Ok(7.0));
        assert_eq!(score("**Score: 8**"), Ok(8.0));
        assert_eq!(score("### Score: 6"), Ok(6.0));
        assert_eq!(score("> Score: 6"), Ok(6.0));
        assert_eq!(score("- score = 5"), Ok(5.0));
        assert_eq!(score("Score: 7/10"), Ok(7.0));
        assert_eq!(score("Score: 7 / 10."), Ok(7.0));
        assert_eq!(score("Score: 7.5"), Ok(7.5));
        assert_eq!(score("SCORE: 9!"), Ok(9.0));
        assert_eq!(score("Final score: 4"), Ok(4.0));
        assert_eq!(score("`Score: 3`"), Ok(3.0));
        assert_eq!(score("Score: 10\n\n"), Ok(10.0));
    }

    #[test]
    fn the_last_score_line_wins_over_earlier_drafts() {
        assert_eq!(
            score("Score: 3\nOn reflection the proof is fine.\nScore: 8"),
            Ok(8.0)
        );
        assert_eq!(score("Score: 8\nThanks for reading."), Ok(8.0));
    }

    #[test]
    fn two_different_verdicts_at_the_end_are_unparseable() {
        let error = score("Score: 3\nScore: 9").unwrap_err();
        assert!(error.contains("two different"), "{error}");
        assert!(score("Score: 3\n\nScore: 9").is_err());
        // The same verdict twice is one verdict.
        assert_eq!(score("Score: 9\nScore: 9.0"), Ok(9.0));
    }

    #[test]
    fn scores_outside_the_scale_or_on_another_scale_are_unparseable() {
        assert!(score("Score: 11").unwrap_err().contains("outside"));
        assert!(score("Score: 0").is_err());
        assert!(score("Score: -3").is_err());
        assert!(score("Score: 4/5").unwrap_err().contains("out of 5"));
        assert_eq!(parse_score("Score: -1", -2.0, 2.0), Ok(-1.0));
    }

    #[test]
    fn no_verdict_or_a_malformed_one_is_unparseable() {
        assert!(score("").unwrap_err().contains("no `Score:`"));
        assert!(score("I would give it a seven.").is_err());
        assert!(score("Score: seven").is_err());
        assert!(score("Score: 7 because it is mostly right").is_err());
        assert!(score("The score: 7 is what I think").is_err());
        // A named but broken last line is not rescued by an earlier good one.
        assert!(score("Score: 7\nScore: high").is_err());
    }

    #[test]
    fn reasoning_sections_are_not_read() {
        assert_eq!(score("<think>Score: 2</think>\nScore: 9"), Ok(9.0));
        assert!(score("<think>Score: 2</think>").is_err());
        // An answer cut inside its reasoning has no verdict, whatever the draft said.
        assert_eq!(score("Score: 5\n<THINK>maybe Score: 2"), Ok(5.0));
        assert!(score("<think>Score: 2\n").is_err());
    }

    #[test]
    fn pair_verdicts_parse() {
        assert_eq!(parse_pair("Verdict: A"), Ok(PairVerdict::First));
        assert_eq!(parse_pair("**Verdict:** b."), Ok(PairVerdict::Second));
        assert_eq!(parse_pair("Verdict: [B]"), Ok(PairVerdict::Second));
        assert_eq!(parse_pair("Verdict: Response A"), Ok(PairVerdict::First));
        assert_eq!(parse_pair("verdict: tie"), Ok(PairVerdict::Tie));
        assert_eq!(parse_pair("Final verdict: Draw"), Ok(PairVerdict::Tie));
        assert_eq!(
            parse_pair("Verdict: B\nHaving checked again,\nVerdict: A"),
            Ok(PairVerdict::First)
        );
        assert!(parse_pair("Verdict: C").is_err());
        assert!(parse_pair("Verdict: A or B").is_err());
        assert!(parse_pair("Verdict: A\nVerdict: B").is_err());
        assert!(parse_pair("A is better").is_err());
    }

    #[test]
    fn rankings_parse_into_shown_positions() {
        assert_eq!(parse_ranking("Ranking: 3 > 1 > 2", 3), Ok(vec![2, 0, 1]));
        assert_eq!(
            parse_ranking("**Ranking:** [2] > [1] > [3].", 3),
            Ok(vec![1, 0, 2])
        );
        assert_eq!(parse_ranking("ranking: 1", 1), Ok(vec![0]));
    }

    #[test]
    fn rankings_with_missing_repeated_or_unknown_labels_are_unparseable() {
        assert!(
            parse_ranking("Ranking: 3 > 1", 3)
                .unwrap_err()
                .contains("misses")
        );
        assert!(
            parse_ranking("Ranking: 1 > 1 > 2", 3)
                .unwrap_err()
                .contains("twice")
        );
        assert!(parse_ranking("Ranking: 1 > 2 > 4", 3).is_err());
        assert!(parse_ranking("Ranking: 1 > 2 = 3", 3).is_err());
        assert!(parse_ranking("Ranking: 1 > > 2 > 3", 3).is_err());
        assert!(parse_ranking("Ranking: 1 > 2 > 3\nRanking: 3 > 2 > 1", 3).is_err());
        assert!(parse_ranking("The best is 2", 3).is_err());
    }

    #[test]
    fn huge_answers_parse_in_linear_time() {
        let answer = format!("{}\nScore: 4", "reasoning about Score: 1\n".repeat(100_000));
        assert_eq!(score(&answer), Ok(4.0));
        let answer = "<think>".repeat(100_000);
        assert!(score(&answer).is_err());
    }
}
