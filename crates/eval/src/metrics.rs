//! Evaluation metrics and their standard errors: unbiased pass@k (Chen et al. 2021), maj@n,
//! mean@n, accuracy from log-likelihoods (`acc`, `acc_norm`), bits per byte, and the mean with
//! its analytic standard error (sample standard deviation over the square root of the count,
//! as lm-evaluation-harness's `mean_stderr`).
//!
//! What it is not: a place for grading (the reward crate's verifiers grade) or for sampling.

/// Unbiased pass@k of one problem with `n` samples of which `c` are correct:
/// `1 - C(n - c, k) / C(n, k)`, computed as a product so large `n` stays exact in f64
/// (Chen et al. 2021, "Evaluating Large Language Models Trained on Code", fig. 3).
///
/// `k > n` has no unbiased estimate: `None`.
pub fn pass_at_k(n: usize, c: usize, k: usize) -> Option<f64> {
    if k == 0 || k > n || c > n {
        return None;
    }
    if n - c < k {
        return Some(1.0);
    }
    // prod_{i = n - c + 1}^{n} (1 - k / i)
    let mut fail = 1.0f64;
    for i in (n - c + 1)..=n {
        fail *= 1.0 - k as f64 / i as f64;
    }
    Some(1.0 - fail)
}

/// Mean and analytic standard error (`sd / sqrt(n)`, sample standard deviation with n - 1);
/// the error is 0 for fewer than two values, the mean 0 for none.
pub fn mean_stderr(values: &[f64]) -> (f64, f64) {
    let n = values.len();
    if n == 0 {
        return (0.0, 0.0);
    }
    let mean = values.iter().sum::<f64>() / n as f64;
    if n < 2 {
        return (mean, 0.0);
    }
    let var = values.iter().map(|v| (v - mean) * (v - mean)).sum::<f64>() / (n - 1) as f64;
    (mean, (var / n as f64).sqrt())
}

/// The index of the largest value (the first of equals, as numpy's `argmax`); `None` when empty
/// or when a value is NaN.
pub fn argmax(values: &[f64]) -> Option<usize> {
    if values.is_empty() || values.iter().any(|v| v.is_nan()) {
        return None;
    }
    let mut best = 0;
    for (i, &v) in values.iter().enumerate() {
        if v > values[best] {
            best = i;
        }
    }
    Some(best)
}

/// lm-evaluation-harness's multiple-choice scores of one item: `acc` (the gold choice has the
/// highest log-likelihood) and `acc_norm` (highest log-likelihood per character of the choice
/// text, lm-eval's `len(choice)`: characters, which are bytes for ASCII text).
pub fn multiple_choice(loglikelihoods: &[f64], choices: &[String], gold: usize) -> (f64, f64) {
    let acc = argmax(loglikelihoods) == Some(gold);
    let normed: Vec<f64> = loglikelihoods
        .iter()
        .zip(choices)
        .map(|(ll, c)| ll / c.chars().count().max(1) as f64)
        .collect();
    let acc_norm = argmax(&normed) == Some(gold);
    (f64::from(u8::from(acc)), f64::from(u8::from(acc_norm)))
}

/// Majority vote of `answers` (`None`: no answer extracted, never a winner): the answer given
/// most often, ties to the one seen first.
pub fn majority<'a>(answers: &[Option<&'a str>]) -> Option<&'a str> {
    let mut counts: Vec<(&str, usize)> = Vec::new();
    for answer in answers.iter().flatten() {
        match counts.iter_mut().find(|(a, _)| a == answer) {
            Some((_, c)) => *c += 1,
            None => counts.push((answer, 1)),
        }
    }
    let mut best: Option<(&str, usize)> = None;
    for (a, c) in counts {
        if best.is_none_or(|(_, b)| c > b) {
            best = Some((a, c));
        }
    }
    best.map(|(a, _)| a)
}

/// Bits per byte of a text from its total natural-log likelihood and its UTF-8 length.
pub fn bits_per_byte(loglikelihood: f64, bytes: usize) -> f64 {
    if bytes == 0 {
        return 0.0;
    }
    -loglikelihood / (bytes as f64 * std::f64::consts::LN_2)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reference formula, `1 - comb(n - c, k) / comb(n, k)`, with exact binomials.
    fn reference(n: u64, c: u64, k: u64) -> f64 {
        fn comb(n: u64, k: u64) -> f64 {
            if k > n {
                return 0.0;
            }
            let mut r = 1f64;
            for i in 0..k {
                r = r * (n - i) as f64 / (i + 1) as f64;
            }
            r
        }
        1.0 - comb(n - c, k) / comb(n, k)
    }

    #[test]
    fn pass_at_k_is_the_reference_formula() {
        // Hand-computed: n = 5, c = 2, k = 1 -> 2/5; k = 2 -> 1 - C(3,2)/C(5,2) = 1 - 3/10.
        assert!((pass_at_k(5, 2, 1).unwrap() - 0.4).abs() < 1e-12);
        assert!((pass_at_k(5, 2, 2).unwrap() - 0.7).abs() < 1e-12);
        // n = 10, c = 3, k = 5: 1 - C(7,5)/C(10,5) = 1 - 21/252.
        assert!((pass_at_k(10, 3, 5).unwrap() - (1.0 - 21.0 / 252.0)).abs() < 1e-12);
        assert_eq!(pass_at_k(4, 0, 2), Some(0.0));
        assert_eq!(pass_at_k(4, 4, 4), Some(1.0));
        assert_eq!(pass_at_k(4, 3, 2), Some(1.0));
        assert_eq!(pass_at_k(3, 1, 4), None);
        for n in 1..=20u64 {
            for c in 0..=n {
                for k in 1..=n {
                    let got = pass_at_k(n as usize, c as usize, k as usize).unwrap();
                    assert!((got - reference(n, c, k)).abs() < 1e-9, "{n} {c} {k}");
                }
            }
        }
    }

    #[test]
    fn mean_stderr_matches_the_sample_formula() {
        let (m, se) = mean_stderr(&[1.0, 0.0, 1.0, 1.0]);
        assert_eq!(m, 0.75);
        // sd = sqrt(0.25 * 4 / 3 * ... ) : var = ((0.25^2)*3 + 0.75^2) / 3 = 0.25
        assert!((se - (0.25f64 / 4.0).sqrt()).abs() < 1e-12);
        assert_eq!(mean_stderr(&[]), (0.0, 0.0));
        assert_eq!(mean_stderr(&[0.5]), (0.5, 0.0));
    }

    #[test]
    fn multiple_choice_normalizes_by_characters() {
        let choices = vec!["a".to_string(), "abcd".to_string()];
        // Raw: choice 0 wins; per character: -2 vs -1, choice 1 wins.
        assert_eq!(multiple_choice(&[-2.0, -4.0], &choices, 0), (1.0, 0.0));
        assert_eq!(multiple_choice(&[-2.0, -4.0], &choices, 1), (0.0, 1.0));
        // Ties go to the first, as numpy's argmax.
        assert_eq!(multiple_choice(&[-1.0, -1.0], &choices, 0).0, 1.0);
        assert_eq!(multiple_choice(&[f64::NAN, -1.0], &choices, 1), (0.0, 0.0));
    }

    #[test]
    fn majority_counts_answers_and_skips_missing_ones() {
        assert_eq!(
            majority(&[Some("1"), Some("2"), Some("2"), None]),
            Some("2")
        );
        assert_eq!(majority(&[Some("1"), Some("2")]), Some("1"));
        assert_eq!(majority(&[None, None]), None);
    }

    #[test]
    fn bits_per_byte_converts_nats() {
        let bpb = bits_per_byte(-(8.0 * std::f64::consts::LN_2), 4);
        assert!((bpb - 2.0).abs() < 1e-12);
    }
}
