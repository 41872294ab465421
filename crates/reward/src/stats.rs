//! `RewardStats`: an aggregate of verdicts for metrics (counts per outcome, mean score, how many
//! records were dataset problems). Mergeable, so parallel workers can each keep one. Also the
//! unbiased pass@k estimator shared by evaluation and the RL pipeline's held-out metrics.

use std::collections::BTreeMap;

use serde::Serialize;

use crate::verifier::{Outcome, RewardOutcome};

/// Counts per outcome and the score sum over every recorded outcome.
#[derive(Debug, Clone, Default, PartialEq, Serialize)]
pub struct RewardStats {
    counts: BTreeMap<Outcome, u64>,
    total: u64,
    score_sum: f64,
}

impl RewardStats {
    pub fn new() -> Self {
        Self::default()
    }

    /// Adds one verdict.
    pub fn record(&mut self, outcome: &RewardOutcome) {
        *self.counts.entry(outcome.outcome).or_insert(0) += 1;
        self.total += 1;
        self.score_sum += outcome.score;
    }

    /// Adds another aggregate into this one.
    pub fn merge(&mut self, other: &RewardStats) {
        for (outcome, count) in &other.counts {
            *self.counts.entry(*outcome).or_insert(0) += count;
        }
        self.total += other.total;
        self.score_sum += other.score_sum;
    }

    /// Verdicts recorded with this outcome.
    pub fn count(&self, outcome: Outcome) -> u64 {
        self.counts.get(&outcome).copied().unwrap_or(0)
    }

    /// Verdicts recorded.
    pub fn total(&self) -> u64 {
        self.total
    }

    /// Mean score over every verdict (0 when empty).
    pub fn mean_score(&self) -> f64 {
        if self.total == 0 {
            0.0
        } else {
            self.score_sum / self.total as f64
        }
    }

    /// Records whose reference was broken or incomplete (excluded from training by the caller).
    pub fn dataset_problems(&self) -> u64 {
        self.counts
            .iter()
            .filter(|(o, _)| o.is_dataset_problem())
            .map(|(_, c)| *c)
            .sum()
    }

    /// `(outcome name, count)` for every outcome seen, in a fixed order.
    pub fn counts(&self) -> impl Iterator<Item = (&'static str, u64)> + '_ {
        self.counts
            .iter()
            .map(|(outcome, count)| (outcome.name(), *count))
    }

    /// One-line summary for logs: `n=10 mean=0.400 correct=4 wrong=6`.
    pub fn summary(&self) -> String {
        let mut line = format!("n={} mean={:.4}", self.total, self.mean_score());
        for (name, count) in self.counts() {
            line.push_str(&format!(" {name}={count}"));
        }
        line
    }
}

/// The unbiased pass@k estimate for one problem from `n` samples of which `correct` are right
/// (Chen et al. 2021): 1 - C(n - c, k) / C(n, k), computed as a stable product.
pub fn pass_at_k(n: usize, correct: usize, k: usize) -> f64 {
    if k == 0 || n == 0 || correct > n {
        return 0.0;
    }
    let k = k.min(n);
    if n - correct < k {
        return 1.0;
    }
    let mut all_wrong = 1.0;
    for i in (n - correct + 1)..=n {
        all_wrong *= 1.0 - k as f64 / i as f64;
    }
    1.0 - all_wrong
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::verifier::Details;

    #[test]
    fn counts_and_mean_merge_across_workers() {
        let mut first = RewardStats::new();
        first.record(&RewardOutcome::correct(Details::default()));
        first.record(&RewardOutcome::wrong(Details::default()));
        let mut second = RewardStats::new();
        second.record(&RewardOutcome::failed(Outcome::UnparseableGold, "bad gold"));
        first.merge(&second);
        assert_eq!(first.total(), 3);
        assert_eq!(first.count(Outcome::Correct), 1);
        assert_eq!(first.dataset_problems(), 1);
        assert!((first.mean_score() - 1.0 / 3.0).abs() < 1e-12);
        assert_eq!(
            first.summary(),
            "n=3 mean=0.3333 correct=1 wrong=1 unparseable_gold=1"
        );
    }
}
