//! The steps of a generated reasoning trace, and how their PRM scores aggregate into one.
//!
//! **Splitting** ([`StepRule::split`]): the completion text is cut at every occurrence of the
//! separator (`"\n"` by default, the separator the PRM was trained with; `"\n\n"` splits at
//! blank lines). Each piece, with the separator that ends it, is a step, after two hack checks
//! (the "empty logical frame" failure: a policy padding its trace with steps that say nothing to
//! collect per-step reward):
//!
//! - **empty**: a piece that is empty or whitespace only is not a step. It is not shown to the
//!   PRM and not scored; the trace scores exactly as it does without it.
//! - **repeat**: a piece equal to an earlier step of the same trace, after whitespace
//!   normalization (runs of whitespace as one space, ends trimmed), is a [`StepKind::Repeat`].
//!   It is not shown to the PRM (the steps after it are scored in the same context as without
//!   it) and it scores 0, the lowest probability there is.
//!
//! **Aggregation** ([`StepAggregation`]) of the per-step scores (P(good) in `[0, 1]`) into one
//! outcome score: `min` (the weakest step, the usual choice for best-of-n: one wrong step sinks a
//! trace), `last` (the final step's score) or `mean`. A repeat enters as 0; a trace without steps
//! scores 0. Hence padding never raises the score: an empty step changes nothing under any
//! aggregation, and a repeated step sets `min` to 0, lowers `mean` (unless every step is already
//! 0), and sets `last` to 0 when it ends the trace (elsewhere `last` is unchanged).
//!
//! What this is not: no tokenizer for the PRM's input (`scorer`), no model, no advantages
//! (`grpo::process_advantage`). Offsets are byte offsets into the completion text.

use std::ops::Range;

/// Where a trace splits into steps.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct StepRule {
    /// Non-empty; a step ends after each occurrence.
    pub separator: String,
}

impl Default for StepRule {
    fn default() -> Self {
        StepRule {
            separator: "\n".into(),
        }
    }
}

/// Whether a step is scored by the PRM.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum StepKind {
    /// A new step: shown to the PRM and scored.
    Scored,
    /// Repeats step `of` (an index into the same split) verbatim after whitespace
    /// normalization: not shown to the PRM, scores 0.
    Repeat { of: usize },
}

/// One step of a trace.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Step {
    /// The step's text, without its separator.
    pub text: String,
    /// The bytes of the completion the step covers: its text and the separator after it (when
    /// there is one), so that consecutive steps tile the text apart from the empty pieces.
    pub bytes: Range<usize>,
    pub kind: StepKind,
}

impl StepRule {
    /// The steps of `completion` (see the module doc); empty pieces are left out.
    pub fn split(&self, completion: &str) -> Vec<Step> {
        let mut steps: Vec<Step> = Vec::new();
        let mut seen: Vec<(String, usize)> = Vec::new();
        let mut start = 0;
        while start < completion.len() {
            let (text_end, end) = match completion[start..].find(self.separator.as_str()) {
                Some(at) if !self.separator.is_empty() => {
                    (start + at, start + at + self.separator.len())
                }
                _ => (completion.len(), completion.len()),
            };
            let text = &completion[start..text_end];
            let normalized = normalize(text);
            if !normalized.is_empty() {
                let kind = match seen.iter().find(|(seen, _)| *seen == normalized) {
                    Some(&(_, of)) => StepKind::Repeat { of },
                    None => {
                        seen.push((normalized, steps.len()));
                        StepKind::Scored
                    }
                };
                steps.push(Step {
                    text: text.to_string(),
                    bytes: start..end,
                    kind,
                });
            }
            start = end;
        }
        steps
    }
}

/// Whitespace runs as one space, ends trimmed.
fn normalize(text: &str) -> String {
    text.split_whitespace().collect::<Vec<_>>().join(" ")
}

pub use crate::grpo::process_advantage::StepAggregation;

/// Every step's score, in order: the PRM's scores of the scored steps (`scored`, one per
/// [`StepKind::Scored`] step, in order) and 0 for each repeat. `None` when the counts differ.
pub fn step_scores(steps: &[Step], scored: &[f64]) -> Option<Vec<f64>> {
    let wanted = steps.iter().filter(|s| s.kind == StepKind::Scored).count();
    if wanted != scored.len() {
        return None;
    }
    let mut next = scored.iter();
    Some(
        steps
            .iter()
            .map(|s| match s.kind {
                StepKind::Scored => *next.next().unwrap_or(&0.0),
                StepKind::Repeat { .. } => 0.0,
            })
            .collect(),
    )
}

/// The token span of each step in the policy's completion tokens, from the tokens' byte
/// offsets (`offsets[i]`: token `i`'s bytes in the completion text, as the tokenizer reports
/// them): a step starts at the token holding its first byte and ends after the token holding its
/// last byte, never before the previous step's end (a token shared by two steps is the earlier
/// one's). Tokens of dropped blank pieces belong to no step. Steps are in order and disjoint, as
/// `split` returns them.
pub fn token_spans(steps: &[Step], offsets: &[Range<usize>]) -> Vec<Range<usize>> {
    let token_of = |byte: usize| {
        offsets
            .iter()
            .position(|o| o.start <= byte && byte < o.end)
            .or_else(|| offsets.iter().position(|o| o.start >= byte))
            .unwrap_or(offsets.len())
    };
    let mut spans = Vec::with_capacity(steps.len());
    let mut previous_end = 0;
    for step in steps {
        let first = token_of(step.bytes.start).max(previous_end);
        let end = if step.bytes.is_empty() {
            first
        } else {
            (token_of(step.bytes.end - 1) + 1)
                .min(offsets.len())
                .max(first)
        };
        spans.push(first..end);
        previous_end = end;
    }
    spans
}

#[cfg(test)]
mod tests {
    use super::*;

    fn kinds(steps: &[Step]) -> Vec<StepKind> {
        steps.iter().map(|s| s.kind).collect()
    }

    #[test]
    fn splitting_drops_blank_pieces_and_marks_repeats_after_whitespace_normalization() {
        let steps = StepRule::default().split("a = 1\n\n  \nb  =  2\na =   1 \nc\n");
        let texts: Vec<&str> = steps.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(texts, ["a = 1", "b  =  2", "a =   1 ", "c"]);
        assert_eq!(
            kinds(&steps),
            [
                StepKind::Scored,
                StepKind::Scored,
                StepKind::Repeat { of: 0 },
                StepKind::Scored
            ]
        );
        // Bytes cover the text and its separator.
        assert_eq!(steps[0].bytes, 0..6);
        assert_eq!(steps[1].bytes, 10..18);
        assert_eq!(steps[2].bytes, 18..27);
        assert_eq!(steps[3].bytes, 27..29);
    }

    #[test]
    fn a_blank_line_separator_keeps_single_newlines_inside_a_step() {
        let rule = StepRule {
            separator: "\n\n".into(),
        };
        let steps = rule.split("x\ny\n\nz");
        let texts: Vec<&str> = steps.iter().map(|s| s.text.as_str()).collect();
        assert_eq!(texts, ["x\ny", "z"]);
        assert_eq!(steps[1].bytes, 5..6);
    }

    #[test]
    fn aggregations_by_hand() {
        let scores = [0.9, 0.2, 0.6];
        assert_eq!(StepAggregation::Min.aggregate(&scores), 0.2);
        assert_eq!(StepAggregation::Last.aggregate(&scores), 0.6);
        assert!((StepAggregation::Mean.aggregate(&scores) - 1.7 / 3.0).abs() < 1e-15);
        for a in [
            StepAggregation::Min,
            StepAggregation::Last,
            StepAggregation::Mean,
        ] {
            assert_eq!(a.aggregate(&[]), 0.0, "{a:?}: a trace without steps");
        }
    }

    /// The "empty logical frame" hack: padding a trace with empty steps or repeating its best
    /// step never raises its score, under every aggregation. The PRM is stood in for by a fixed
    /// score per distinct step text (its context does not change: repeats and empty pieces are
    /// not shown to it).
    #[test]
    fn empty_or_repeated_steps_never_raise_the_aggregate() {
        let prm = |text: &str| match text.trim() {
            "good" => 0.95,
            "fine" => 0.7,
            "weak" => 0.3,
            other => panic!("no score for {other:?}"),
        };
        let score = |trace: &str, aggregation: StepAggregation| {
            let steps = StepRule::default().split(trace);
            let scored: Vec<f64> = steps
                .iter()
                .filter(|s| s.kind == StepKind::Scored)
                .map(|s| prm(&s.text))
                .collect();
            aggregation.aggregate(&step_scores(&steps, &scored).unwrap())
        };
        let base = "fine\nweak\ngood\n";
        let padded = [
            "fine\n\n\nweak\n   \ngood\n\n\n",
            "\n\nfine\nweak\ngood\n \t \n",
            "fine\nweak\ngood\ngood\n",
            "fine\nweak\ngood\n  good \ngood\n",
            "fine\ngood\nweak\ngood\n",
            "fine\nfine\nfine\nweak\ngood\n",
        ];
        for aggregation in [
            StepAggregation::Min,
            StepAggregation::Last,
            StepAggregation::Mean,
        ] {
            let before = score(base, aggregation);
            for trace in padded {
                let after = score(trace, aggregation);
                assert!(
                    after <= before,
                    "{aggregation:?}: {trace:?} scores {after}, above {before} without padding"
                );
            }
            // Empty steps change nothing at all.
            assert_eq!(score(padded[0], aggregation), before);
            assert_eq!(score(padded[1], aggregation), before);
        }
        // A repeat scores 0: min is sunk, mean lowered, last sunk when the repeat ends the trace.
        assert_eq!(score(padded[2], StepAggregation::Min), 0.0);
        assert!((score(padded[2], StepAggregation::Mean) - 1.95 / 4.0).abs() < 1e-12);
        assert_eq!(score(padded[2], StepAggregation::Last), 0.0);
        assert_eq!(score(padded[5], StepAggregation::Last), 0.95);
    }

    #[test]
    fn token_spans_follow_the_tokens_that_hold_each_steps_bytes() {
        // "ab\ncd\n\nef": steps "ab\n" 0..3, "cd\n" 3..6, "ef" 7..9 (the blank piece dropped).
        let steps = StepRule::default().split("ab\ncd\n\nef");
        assert_eq!(steps.len(), 3);
        // Tokens: "ab" "\n" "c" "d\n" "\n" "ef".
        let offsets = [0..2, 2..3, 3..4, 4..6, 6..7, 7..9];
        assert_eq!(token_spans(&steps, &offsets), [0..2, 2..4, 5..6]);
        // A token across a step boundary ("b\nc") belongs to the earlier step.
        let offsets = [0..1, 1..4, 4..6, 6..9];
        assert_eq!(token_spans(&steps, &offsets), [0..2, 2..3, 3..4]);
    }
}
