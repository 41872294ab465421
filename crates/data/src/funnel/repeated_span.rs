//! Repeated-span filter: drops documents in which a span of 1 to 13 whitespace tokens repeats 32
//! or more times in a row (`"a b c a b c a b c ..."`). Such runs are rare in real prose, slip
//! through ratio-based filters when the document is long, and are a known source of loss
//! spikes: the model learns to copy the run and its loss collapses, then jumps.
//!
//! Invariant: a run of `r` consecutive repetitions of a span of `p` tokens is exactly a stretch
//! of `(r - 1) * p` positions where `token[i] == token[i + p]`; the check is one pass per period,
//! O(13 * tokens), on token hashes.

use serde::Deserialize;
use xxhash_rust::xxh3::xxh3_64;

use super::document::{Document, DropReason, Verdict};

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields, default)]
pub struct RepeatedSpanFile {
    pub max_span_tokens: usize,
    pub min_repetitions: usize,
}

impl Default for RepeatedSpanFile {
    fn default() -> Self {
        RepeatedSpanFile {
            max_span_tokens: 13,
            min_repetitions: 32,
        }
    }
}

#[derive(Clone, Debug)]
pub struct RepeatedSpan {
    max_span_tokens: usize,
    min_repetitions: usize,
}

impl RepeatedSpanFile {
    pub fn validate(self) -> Result<RepeatedSpan, String> {
        if self.max_span_tokens == 0 {
            return Err("max_span_tokens must be at least 1".into());
        }
        if self.min_repetitions < 2 {
            return Err(format!(
                "min_repetitions must be at least 2, got {}",
                self.min_repetitions
            ));
        }
        Ok(RepeatedSpan {
            max_span_tokens: self.max_span_tokens,
            min_repetitions: self.min_repetitions,
        })
    }
}

impl RepeatedSpan {
    pub fn apply(&self, doc: Document) -> Verdict {
        if self.longest_run(&doc.text).is_some() {
            Verdict::Drop(doc, DropReason::RepeatedSpan)
        } else {
            Verdict::Keep(doc)
        }
    }

    /// The first (period, start token) at which a span repeats `min_repetitions` times.
    pub fn longest_run(&self, text: &str) -> Option<(usize, usize)> {
        let tokens: Vec<u64> = text
            .split_whitespace()
            .map(|t| xxh3_64(t.as_bytes()))
            .collect();
        for period in 1..=self.max_span_tokens {
            let needed = (self.min_repetitions - 1) * period;
            if tokens.len() < needed + period {
                break;
            }
            let mut run = 0;
            for i in 0..tokens.len() - period {
                if tokens[i] == tokens[i + period] {
                    run += 1;
                    if run >= needed {
                        return Some((period, i + 1 - run));
                    }
                } else {
                    run = 0;
                }
            }
        }
        None
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filter() -> RepeatedSpan {
        RepeatedSpanFile::default().validate().unwrap()
    }

    fn repeated(span: &str, times: usize) -> String {
        format!("start of text {} end of text", vec![span; times].join(" "))
    }

    #[test]
    fn thirty_one_repetitions_pass_thirty_two_fail() {
        for span in ["ha", "the cat sat", "1 2 3 4 5 6 7 8 9 10 11 12 13"] {
            assert_eq!(filter().longest_run(&repeated(span, 31)), None, "{span}");
            assert!(
                filter().longest_run(&repeated(span, 32)).is_some(),
                "{span}"
            );
        }
    }

    #[test]
    fn spans_longer_than_thirteen_tokens_are_not_checked() {
        let span = "1 2 3 4 5 6 7 8 9 10 11 12 13 14";
        assert_eq!(filter().longest_run(&repeated(span, 40)), None);
    }

    #[test]
    fn reports_period_of_the_run() {
        let (period, _) = filter().longest_run(&repeated("a b", 40)).unwrap();
        assert_eq!(period, 2);
    }
}
