//! Dense process advantages: a `process_reward` reward with `dense = true` (the run's only
//! reward) shapes every token's advantage with the PRM's step scores, DeepSeekMath's process
//! supervision (`stoke_train::grpo::process_advantage::process_token_advantages`).
//!
//! Where it hooks in: the learner (`learner.rs`, step 2) computes each sample's outcome
//! advantage from its reward as always (the aggregated PRM score, after the KL-in-reward
//! penalty, the configured estimator); then, for the groups the update keeps, this module
//! 1. reads each sample's step scores (`SampleReward::steps`: byte ranges in the completion
//!    text and P(good), from the reward's `details.steps`);
//! 2. maps them to token spans of the sampled completion: the byte offsets of each completion
//!    token come from decoding the ids incrementally with the policy's tokenizer, special tokens
//!    and unknown ids skipped, as the rollout decodes the text the PRM read
//!    ([`token_offsets`]); `prm::token_spans` turns byte ranges into token spans. A step left
//!    with no token of its own (its bytes all in the previous step's last token) is dropped;
//! 3. gives token `t` its outcome advantage plus the sum of the group-normalized step rewards
//!    of the steps ending at or after `t`; the updater takes these `[B, T]` advantages in place
//!    of the per-sample ones.
//!
//! A sample without step scores (its scoring failed) gets its outcome advantage on every token.
//! When some outcome advantage is not finite, the caller skips this (the update is skipped as
//! non-finite anyway).
//!
//! What this is not: scoring (`learned_reward`), the advantage formula (`stoke_train`).

use std::ops::Range;

use stoke_reward::StepScore;
use stoke_tokenizer::error::TokenizerError;
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::grpo::{ScoredSteps, process_token_advantages};
use stoke_train::prm::{Step, StepKind, token_spans};

use crate::error::PipelineError;

/// One sample as the dense advantages read it.
#[derive(Clone, Copy, Debug)]
pub struct DenseSample<'a> {
    /// The reward's scored steps (`None`: no step scores).
    pub steps: Option<&'a [StepScore]>,
    /// Each completion token's bytes in the completion text ([`token_offsets`]).
    pub offsets: &'a [Range<usize>],
    /// The sample's outcome advantage.
    pub outcome_advantage: f64,
}

/// What the dense advantages of one update did, for metrics.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct DenseFigures {
    /// Steps per sample that reached the advantages, mean over the update's samples.
    pub steps_mean: f64,
}

/// Per-token advantages of `samples` (consecutive groups of `group_size`), see the module doc.
pub fn token_advantages(
    samples: &[DenseSample<'_>],
    group_size: usize,
    eps: f64,
) -> Result<(Vec<Vec<f64>>, DenseFigures), PipelineError> {
    let scored: Vec<ScoredSteps> = samples
        .iter()
        .map(|s| spans_of(s.steps.unwrap_or_default(), s.offsets))
        .collect();
    let lens: Vec<usize> = samples.iter().map(|s| s.offsets.len()).collect();
    let outcome: Vec<f64> = samples.iter().map(|s| s.outcome_advantage).collect();
    let advantages = process_token_advantages(&scored, &lens, &outcome, group_size, eps)?;
    let steps: usize = scored.iter().map(|s| s.spans.len()).sum();
    let figures = DenseFigures {
        steps_mean: steps as f64 / samples.len().max(1) as f64,
    };
    Ok((advantages, figures))
}

/// The steps' token spans and scores; steps without a token of their own are dropped.
fn spans_of(steps: &[StepScore], offsets: &[Range<usize>]) -> ScoredSteps {
    let as_steps: Vec<Step> = steps
        .iter()
        .map(|s| Step {
            text: String::new(),
            bytes: s.start..s.end,
            kind: StepKind::Scored,
        })
        .collect();
    let mut out = ScoredSteps::default();
    for (span, step) in token_spans(&as_steps, offsets).into_iter().zip(steps) {
        if !span.is_empty() {
            out.spans.push(span);
            out.scores.push(step.score);
        }
    }
    out
}

/// Each token's bytes in the decoded completion: ids decoded one at a time with special tokens
/// skipped (ids the tokenizer does not know decode to nothing, as in the rollout's text). A
/// token whose bytes complete only with a later one (part of a character) gets an empty range
/// at the point it was reached.
pub fn token_offsets(
    tokenizer: &Tokenizer,
    ids: &[u32],
) -> Result<Vec<Range<usize>>, TokenizerError> {
    let mut stream = tokenizer.decode_stream(true);
    let mut offsets = Vec::with_capacity(ids.len());
    let mut at = 0;
    for &id in ids {
        if tokenizer.id_to_token(id).is_none() {
            offsets.push(at..at);
            continue;
        }
        let piece = stream.step(tokenizer, id)?;
        let end = at + piece.map_or(0, |p| p.len());
        offsets.push(at..end);
        at = end;
    }
    Ok(offsets)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    fn step(start: usize, end: usize, score: f64) -> StepScore {
        StepScore { start, end, score }
    }

    /// A group of 2. Sample 0: "ab\ncd\n" in tokens "ab" "\n" "cd" "\n" (bytes 0..2, 2..3,
    /// 3..5, 5..6), steps "ab\n" (tokens 0..2) scored 1.0 and "cd\n" (tokens 2..4) scored 0.0.
    /// Sample 1: "x\ny" in tokens "x\n" "y" "!" (0..2, 2..3, 3..4), one step "x\n" (token 0)
    /// scored 0.5, then tokens after the last step. The group's step rewards [1, 0, 0.5] have
    /// mean 0.5 and sample std 0.5: normalized (eps 0) [1, -1, 0]. Outcome advantages 0.3 and
    /// -0.3.
    #[test]
    fn a_two_sample_group_gets_the_hand_computed_token_advantages() {
        let offsets0 = [0..2, 2..3, 3..5, 5..6];
        let offsets1 = [0..2, 2..3, 3..4];
        let steps0 = [step(0, 3, 1.0), step(3, 6, 0.0)];
        let steps1 = [step(0, 2, 0.5)];
        let samples = [
            DenseSample {
                steps: Some(&steps0),
                offsets: &offsets0,
                outcome_advantage: 0.3,
            },
            DenseSample {
                steps: Some(&steps1),
                offsets: &offsets1,
                outcome_advantage: -0.3,
            },
        ];
        let (got, figures) = token_advantages(&samples, 2, 0.0).unwrap();
        // Tokens 0-1 lead to both steps (1 - 1), tokens 2-3 to the second (-1).
        close(&got[0], &[0.3, 0.3, -0.7, -0.7]);
        // Token 0 leads to the step scored 0 after normalization; tokens 1-2 follow it.
        close(&got[1], &[-0.3, -0.3, -0.3]);
        assert_eq!(figures.steps_mean, 1.5);

        // Without step scores (a failed scoring), sample 1 has no steps: the group's rewards
        // are [1, 0] (mean 0.5, sample std 0.7071), normalized to [0.7071, -0.7071].
        let samples = [
            samples[0],
            DenseSample {
                steps: None,
                ..samples[1]
            },
        ];
        let (got, figures) = token_advantages(&samples, 2, 0.0).unwrap();
        let r = 0.5 / 0.5f64.sqrt();
        close(&got[0], &[0.3, 0.3, 0.3 - r, 0.3 - r]);
        close(&got[1], &[-0.3; 3]);
        assert_eq!(figures.steps_mean, 1.0);
    }

    #[test]
    fn a_step_inside_the_previous_steps_last_token_is_dropped() {
        // One token "a\nb\n" holds both steps: the second has no token of its own.
        let offsets = [Range { start: 0, end: 4 }];
        let steps = [step(0, 2, 0.9), step(2, 4, 0.1)];
        let got = spans_of(&steps, &offsets);
        assert_eq!(got.spans, vec![0..1]);
        assert_eq!(got.scores, vec![0.9]);
    }
}
