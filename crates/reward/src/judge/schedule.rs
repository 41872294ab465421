//! The arithmetic of comparative judging, free of I/O: which pairs of a group are compared,
//! how the two orders of a pair combine, and what a ranking is worth to each sample.
//!
//! - **Pair schedule.** A group of up to [`ALL_PAIRS_UP_TO`] samples compares every pair. A
//!   larger group of `n` compares each sample with its [`NEIGHBOURS`] next neighbours on a
//!   circle (pairs `(i, i + d mod n)` for `d = 1..=4`): `4n` pairs, each sample in 8 of them,
//!   first in 4 and second in 4, so the cost is O(n) and no sample is always shown first.
//!   Without swap, the all-pairs schedule shows the lower index first when `i + j` is even and
//!   the higher otherwise, for the same balance.
//! - **Swap.** A pair judged in both orders counts when the two verdicts agree; when they
//!   disagree (the judge followed the position, not the content) the pair is a tie for both
//!   and is counted as inconsistent.
//! - **Win rate.** A sample's pairwise score is its mean over its compared pairs of 1 (win),
//!   0.5 (tie) or 0 (loss).
//! - **Rank score.** In a ranking of `n`, the sample at position `p` (0 = best) scores
//!   `(n - 1 - p) / (n - 1)`: best 1, worst 0; with swap, the mean over the two rankings.
//!
//! What this is not: the calls (`mod.rs`) or the parsing (`verdict.rs`).

use super::verdict::PairVerdict;

/// Groups up to this size compare every pair (at most 28 pairs).
pub const ALL_PAIRS_UP_TO: usize = 8;
/// Larger groups: neighbours on each side compared with each sample.
pub const NEIGHBOURS: usize = 4;

/// The pairs to compare, each in the order shown first (without swap).
pub fn pair_schedule(n: usize) -> Vec<(usize, usize)> {
    if n <= ALL_PAIRS_UP_TO {
        let mut pairs = Vec::with_capacity(n * n.saturating_sub(1) / 2);
        for i in 0..n {
            for j in i + 1..n {
                pairs.push(if (i + j) % 2 == 0 { (i, j) } else { (j, i) });
            }
        }
        return pairs;
    }
    let mut pairs = Vec::with_capacity(n * NEIGHBOURS);
    for distance in 1..=NEIGHBOURS {
        for i in 0..n {
            pairs.push((i, (i + distance) % n));
        }
    }
    pairs
}

/// Who won a pair, in terms of the samples.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PairResult {
    /// The pair's first sample (as scheduled) is better.
    First,
    Second,
    Tie,
}

impl PairResult {
    /// The verdict of a call that showed the pair's samples in the scheduled order
    /// (`swapped = false`) or reversed.
    pub fn of(verdict: PairVerdict, swapped: bool) -> PairResult {
        match (verdict, swapped) {
            (PairVerdict::Tie, _) => PairResult::Tie,
            (PairVerdict::First, false) | (PairVerdict::Second, true) => PairResult::First,
            (PairVerdict::Second, false) | (PairVerdict::First, true) => PairResult::Second,
        }
    }

    /// The points of the pair's first and second sample.
    pub fn points(self) -> (f64, f64) {
        match self {
            PairResult::First => (1.0, 0.0),
            PairResult::Second => (0.0, 1.0),
            PairResult::Tie => (0.5, 0.5),
        }
    }
}

/// Two orders of one pair combined: the result and whether they agreed.
pub fn combine_orders(straight: PairResult, swapped: PairResult) -> (PairResult, bool) {
    if straight == swapped {
        (straight, true)
    } else {
        (PairResult::Tie, false)
    }
}

/// Each sample's score from a ranking (0-based labels, best first) of samples shown in the
/// order `shown` (`shown[k]` is the sample labelled `k + 1`).
pub fn rank_scores(ranking: &[usize], shown: &[usize]) -> Vec<f64> {
    let n = shown.len();
    let mut scores = vec![0.0; n];
    if n < 2 {
        return vec![1.0; n];
    }
    for (position, &label) in ranking.iter().enumerate() {
        scores[shown[label]] = (n - 1 - position) as f64 / (n - 1) as f64;
    }
    scores
}

/// Pairs of samples ordered the same way by two score lists, and pairs compared.
pub fn agreeing_pairs(first: &[f64], second: &[f64]) -> (u64, u64) {
    let n = first.len().min(second.len());
    let (mut agree, mut compared) = (0, 0);
    for i in 0..n {
        for j in i + 1..n {
            compared += 1;
            let a = first[i].partial_cmp(&first[j]);
            if a.is_some() && a == second[i].partial_cmp(&second[j]) {
                agree += 1;
            }
        }
    }
    (agree, compared)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashSet;

    #[test]
    fn small_groups_compare_every_pair_once_with_balanced_order() {
        for n in 0..=ALL_PAIRS_UP_TO {
            let pairs = pair_schedule(n);
            assert_eq!(pairs.len(), n * n.saturating_sub(1) / 2);
            let unordered: HashSet<(usize, usize)> =
                pairs.iter().map(|&(a, b)| (a.min(b), a.max(b))).collect();
            assert_eq!(unordered.len(), pairs.len(), "n = {n}");
        }
        let firsts = pair_schedule(8).iter().filter(|p| p.0 == 0).count();
        assert!(
            (2..=5).contains(&firsts),
            "sample 0 is first in {firsts} of 7"
        );
    }

    #[test]
    fn large_groups_compare_each_sample_with_eight_partners() {
        for n in [9, 16, 64] {
            let pairs = pair_schedule(n);
            assert_eq!(pairs.len(), n * NEIGHBOURS);
            let unordered: HashSet<(usize, usize)> =
                pairs.iter().map(|&(a, b)| (a.min(b), a.max(b))).collect();
            assert_eq!(unordered.len(), pairs.len(), "no pair twice, n = {n}");
            for sample in 0..n {
                let first = pairs.iter().filter(|p| p.0 == sample).count();
                let second = pairs.iter().filter(|p| p.1 == sample).count();
                assert_eq!((first, second), (NEIGHBOURS, NEIGHBOURS));
            }
        }
    }

    #[test]
    fn swapped_verdicts_map_back_to_the_samples() {
        assert_eq!(PairResult::of(PairVerdict::First, false), PairResult::First);
        assert_eq!(PairResult::of(PairVerdict::First, true), PairResult::Second);
        assert_eq!(PairResult::of(PairVerdict::Second, true), PairResult::First);
        assert_eq!(PairResult::of(PairVerdict::Tie, true), PairResult::Tie);
    }

    #[test]
    fn disagreeing_orders_are_an_inconsistent_tie() {
        assert_eq!(
            combine_orders(PairResult::First, PairResult::First),
            (PairResult::First, true)
        );
        assert_eq!(
            combine_orders(PairResult::First, PairResult::Second),
            (PairResult::Tie, false)
        );
        assert_eq!(
            combine_orders(PairResult::Tie, PairResult::Second),
            (PairResult::Tie, false)
        );
        assert_eq!(PairResult::Tie.points(), (0.5, 0.5));
    }

    #[test]
    fn rank_scores_run_from_one_for_the_best_to_zero_for_the_worst() {
        // Shown in order 0, 1, 2; ranked label 3 > label 1 > label 2.
        assert_eq!(rank_scores(&[2, 0, 1], &[0, 1, 2]), vec![0.5, 0.0, 1.0]);
        // Shown reversed (label 1 is sample 2): the same ranking of samples.
        assert_eq!(rank_scores(&[0, 2, 1], &[2, 1, 0]), vec![0.5, 0.0, 1.0]);
        assert_eq!(rank_scores(&[0], &[0]), vec![1.0]);
    }

    #[test]
    fn agreeing_pairs_count_same_relative_order() {
        assert_eq!(agreeing_pairs(&[1.0, 0.5, 0.0], &[1.0, 0.5, 0.0]), (3, 3));
        assert_eq!(agreeing_pairs(&[1.0, 0.5, 0.0], &[0.0, 0.5, 1.0]), (0, 3));
        assert_eq!(agreeing_pairs(&[1.0, 0.5, 0.0], &[0.5, 1.0, 0.0]), (2, 3));
    }
}
