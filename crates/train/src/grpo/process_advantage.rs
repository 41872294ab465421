//! Advantages from a process reward model (PRM): per-step scores of each completion (P(good) of
//! each step, `prm::score_traces`) turned into GRPO advantages, two ways.
//!
//! **Outcome** ([`outcome_rewards`]): each completion's step scores aggregated into one reward
//! (`StepAggregation`: `min`, `last` or `mean`; a repeated step scores 0, a completion without
//! steps 0, see `prm::steps`), then normalized within the group like any reward
//! (`AdvantageEstimator::advantages`).
//!
//! **Dense** ([`process_token_advantages`]), DeepSeekMath's process supervision (Shao et al.
//! 2024, section 4.1.3): the step rewards of a whole group are normalized together,
//!
//! `r~_j = (r_j - mean(R)) / (std(R) + eps)`, `R` = every step reward of every completion of
//! the group (sample standard deviation, as `advantage`; `std(R) + eps = 0` gives 0),
//!
//! and token `t` of a completion gets the sum of the normalized rewards of its steps that end at
//! or after `t` (a step ends at its last token):
//!
//! `A_t = A_outcome + sum over steps j with end_j >= t of r~_j`
//!
//! so a token is credited with every step it leads to. Tokens after the last step get the outcome
//! advantage alone. `A_outcome` is the completion's outcome advantage (from the aggregated PRM
//! score, a verifier's reward, or 0 for process supervision alone).
//!
//! What this is not: no scoring, no splitting into steps (`prm`), no tensors; the caller lays
//! the returned per-token values out as the `[B, T]` advantages of the update.

use std::ops::Range;

use super::GrpoError;
use serde::{Deserialize, Serialize};

/// How per-step scores become one outcome score.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StepAggregation {
    /// The lowest step score.
    #[default]
    Min,
    /// The last step's score.
    Last,
    /// The mean step score.
    Mean,
}

impl StepAggregation {
    /// The outcome score of one trace's step scores, in order (a repeat's score is 0; see
    /// `prm::step_scores`). No steps: 0.
    pub fn aggregate(self, scores: &[f64]) -> f64 {
        if scores.is_empty() {
            return 0.0;
        }
        match self {
            StepAggregation::Min => scores.iter().copied().fold(f64::INFINITY, f64::min),
            StepAggregation::Last => scores[scores.len() - 1],
            StepAggregation::Mean => scores.iter().sum::<f64>() / scores.len() as f64,
        }
    }
}

/// One completion's steps: where each lies in the completion's tokens, and its reward.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ScoredSteps {
    /// Each step's tokens `[start, end)` in the completion: in order, disjoint, non-empty.
    pub spans: Vec<Range<usize>>,
    /// One per span: the step's reward (a PRM's P(good); 0 for a repeated step).
    pub scores: Vec<f64>,
}

/// Each completion's outcome reward: its step scores aggregated by `aggregation` (no steps: 0).
pub fn outcome_rewards(samples: &[ScoredSteps], aggregation: StepAggregation) -> Vec<f64> {
    samples
        .iter()
        .map(|s| aggregation.aggregate(&s.scores))
        .collect()
}

/// Per-token advantages of each completion (see the module doc): `samples` laid out as
/// consecutive groups of `group_size`, `completion_lens[i]` tokens in completion `i`, and
/// `outcome_advantages[i]` its outcome advantage. Errors name the completion and the step.
pub fn process_token_advantages(
    samples: &[ScoredSteps],
    completion_lens: &[usize],
    outcome_advantages: &[f64],
    group_size: usize,
    eps: f64,
) -> Result<Vec<Vec<f64>>, GrpoError> {
    if group_size == 0 {
        return Err(GrpoError::config("group_size", "must be at least 1".into()));
    }
    if !(eps.is_finite() && eps >= 0.0) {
        return Err(GrpoError::config(
            "advantage.eps",
            format!("must be finite and >= 0, got {eps}"),
        ));
    }
    let n = samples.len();
    if completion_lens.len() != n || outcome_advantages.len() != n || !n.is_multiple_of(group_size)
    {
        return Err(GrpoError::Shape(format!(
            "{n} completions' steps, {} lengths and {} outcome advantages in groups of {group_size}",
            completion_lens.len(),
            outcome_advantages.len()
        )));
    }
    for (i, sample) in samples.iter().enumerate() {
        check_steps(i, sample, completion_lens[i])?;
        if !outcome_advantages[i].is_finite() {
            return Err(GrpoError::Shape(format!(
                "completion {i}: outcome advantage {} is not finite",
                outcome_advantages[i]
            )));
        }
    }
    let mut out = Vec::with_capacity(n);
    for (group, start) in samples.chunks(group_size).zip((0..n).step_by(group_size)) {
        let rewards: Vec<f64> = group
            .iter()
            .flat_map(|s| s.scores.iter().copied())
            .collect();
        let mean = super::advantage::mean(&rewards);
        let scale = super::advantage::sample_std(&rewards) + eps;
        let normalized = |r: f64| {
            if scale > 0.0 { (r - mean) / scale } else { 0.0 }
        };
        for (offset, sample) in group.iter().enumerate() {
            let i = start + offset;
            let mut tokens = vec![outcome_advantages[i]; completion_lens[i]];
            // Walk the steps from the last: `suffix` is the sum over the steps ending at or
            // after the current token.
            let mut suffix = 0.0;
            let mut next_end = completion_lens[i];
            for (span, &score) in sample.spans.iter().zip(&sample.scores).rev() {
                for a in &mut tokens[span.end..next_end] {
                    *a += suffix;
                }
                suffix += normalized(score);
                next_end = span.end;
            }
            for a in &mut tokens[..next_end] {
                *a += suffix;
            }
            out.push(tokens);
        }
    }
    Ok(out)
}

fn check_steps(i: usize, sample: &ScoredSteps, len: usize) -> Result<(), GrpoError> {
    if sample.spans.len() != sample.scores.len() {
        return Err(GrpoError::Shape(format!(
            "completion {i}: {} step spans and {} step scores",
            sample.spans.len(),
            sample.scores.len()
        )));
    }
    let mut previous_end = 0;
    for (j, (span, score)) in sample.spans.iter().zip(&sample.scores).enumerate() {
        if span.start >= span.end || span.start < previous_end || span.end > len {
            return Err(GrpoError::Shape(format!(
                "completion {i} step {j}: tokens {span:?} are not a non-empty span after the \
                 previous step (which ends at {previous_end}) within the {len} tokens"
            )));
        }
        if !score.is_finite() {
            return Err(GrpoError::Shape(format!(
                "completion {i} step {j}: score {score} is not finite"
            )));
        }
        previous_end = span.end;
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::grpo::AdvantageEstimator;

    /// Steps from `(start, end)` token spans and their scores.
    fn steps(spans: &[(usize, usize)], scores: &[f64]) -> ScoredSteps {
        ScoredSteps {
            spans: spans.iter().map(|&(a, b)| a..b).collect(),
            scores: scores.to_vec(),
        }
    }

    fn close(got: &[f64], want: &[f64]) {
        assert_eq!(got.len(), want.len(), "{got:?} vs {want:?}");
        for (g, w) in got.iter().zip(want) {
            assert!((g - w).abs() < 1e-12, "{got:?} vs {want:?}");
        }
    }

    #[test]
    fn outcome_rewards_aggregate_each_completion_then_normalize_in_the_group() {
        let samples = [
            steps(&[(0, 2), (2, 4)], &[0.9, 0.3]),
            steps(&[(0, 3)], &[0.6]),
            steps(&[], &[]),
            steps(&[(0, 1), (1, 2), (2, 3)], &[0.2, 0.8, 0.5]),
        ];
        close(
            &outcome_rewards(&samples, StepAggregation::Min),
            &[0.3, 0.6, 0.0, 0.2],
        );
        close(
            &outcome_rewards(&samples, StepAggregation::Last),
            &[0.3, 0.6, 0.0, 0.5],
        );
        close(
            &outcome_rewards(&samples, StepAggregation::Mean),
            &[0.6, 0.6, 0.0, 0.5],
        );
        // Then GRPO in groups of 2, by hand: group [0.3, 0.6] has mean 0.45, sample std
        // sqrt(2 * 0.15^2) = 0.212132..., so A = -/+ 0.15 / (0.212132 + 0.01).
        let rewards = outcome_rewards(&samples, StepAggregation::Min);
        let advantages = AdvantageEstimator::default()
            .advantages(&rewards, 2)
            .unwrap();
        let a = 0.15 / (0.15 * 2f64.sqrt() + 0.01);
        let b = 0.1 / (0.1 * 2f64.sqrt() + 0.01);
        close(&advantages, &[-a, a, -b, b]);
    }

    /// DeepSeekMath's formula by hand. Group 0: completion 0 has steps ending at tokens 1 and 4
    /// (of 6) scored 1.0 and 0.0, completion 1 one step over all 4 tokens scored 0.5. The group's
    /// step rewards [1, 0, 0.5] have mean 0.5 and sample std 0.5, so with eps = 0 they normalize
    /// to [1, -1, 0]. Group 1 (one completion, one step) has no spread: 0.
    #[test]
    fn dense_advantages_sum_the_normalized_rewards_of_the_steps_each_token_leads_to() {
        let samples = [
            steps(&[(0, 2), (2, 5)], &[1.0, 0.0]),
            steps(&[(0, 4)], &[0.5]),
            steps(&[(1, 3)], &[0.7]),
        ];
        let got = process_token_advantages(&samples, &[6, 4, 3], &[0.0; 3], 1, 0.0).unwrap();
        // Groups of 1: every group has a single completion; completion 0 alone normalizes
        // [1, 0] (mean 0.5, std 0.7071...) to [0.7071, -0.7071].
        let r = 0.5 / 0.5f64.sqrt();
        close(&got[0], &[0.0, 0.0, -r, -r, -r, 0.0]);
        close(&got[1], &[0.0; 4]);
        close(&got[2], &[0.0; 3]);

        let got = process_token_advantages(&samples[..2], &[6, 4], &[0.25, -0.25], 2, 0.0).unwrap();
        // Tokens 0-1 lead to both steps (1 - 1 = 0), tokens 2-4 to the second (-1), token 5
        // to none; each plus the outcome advantage.
        close(&got[0], &[0.25, 0.25, -0.75, -0.75, -0.75, 0.25]);
        close(&got[1], &[-0.25; 4]);

        // eps in the denominator, and a token before the first step leads to all of them.
        let got = process_token_advantages(
            &[
                steps(&[(1, 2), (3, 4)], &[0.9, 0.1]),
                steps(&[(0, 2)], &[0.5]),
            ],
            &[5, 2],
            &[0.0, 0.0],
            2,
            0.1,
        )
        .unwrap();
        let (first, second) = (0.4 / 0.5, -0.4 / 0.5);
        close(
            &got[0],
            &[first + second, first + second, second, second, 0.0],
        );
        close(&got[1], &[0.0, 0.0]);
    }

    #[test]
    fn malformed_steps_are_refused_naming_the_completion_and_step() {
        let cases = [
            (steps(&[(0, 2), (1, 3)], &[0.5, 0.5]), "completion 0 step 1"),
            (steps(&[(0, 9)], &[0.5]), "completion 0 step 0"),
            (steps(&[(2, 2)], &[0.5]), "completion 0 step 0"),
            (steps(&[(0, 2)], &[0.5, 0.1]), "2 step scores"),
            (steps(&[(0, 2)], &[f64::NAN]), "not finite"),
        ];
        for (sample, message) in cases {
            let err = process_token_advantages(&[sample], &[4], &[0.0], 1, 0.01)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{err}");
        }
    }
}
