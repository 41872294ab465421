//! Benchmark-quality analysis of a task over a checkpoint series (`stoke eval quality`): is the
//! task worth watching while a model trains? Four criteria (FineTasks' selection criteria, seed
//! 004), each a number, and one verdict line per task:
//!
//! - **monotonicity**: Spearman's rank correlation of the score with the training step (mean
//!   over runs when several are given);
//! - **noise**: the sampling error of the score (its standard error over items, averaged over
//!   checkpoints), the spread across runs at the same step (when several runs are given), and
//!   the step-to-step jitter (standard deviation of successive differences over sqrt 2, which a
//!   smooth trend barely inflates); the noise is the largest of them; **signal-to-noise** is
//!   the change from the first to the last checkpoint over that noise;
//! - **above random**: the last checkpoint's score minus the random baseline (1 / choices for
//!   multiple choice, taken from the results, or given), in units of its standard error;
//! - **rank consistency**: Kendall's tau-b between the rankings of the runs (several seeds or
//!   models) at consecutive checkpoints, averaged; with one run, between the checkpoints'
//!   order by step and by score.
//!
//! Verdict: `at chance` when no checkpoint is 2 standard errors above random; else `not
//! monotonic` below a Spearman correlation of 0.5; else `noisy` below a signal-to-noise of 2;
//! else `ok`. The main metric is `acc` (multiple choice), `pass@1` (generative) or
//! `bits_per_byte` (perplexity; lower is better, so its sign is flipped for the correlations).
//!
//! What it is not: a significance test between two models; the thresholds are rules of thumb,
//! printed with the numbers so a reader can judge.

use serde::{Deserialize, Serialize};

use crate::harness::TaskResult;
use crate::task::OutputType;

/// One checkpoint of a run: its step and its results (a `series.json` entry).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SeriesPoint {
    pub step: u64,
    pub results: Vec<TaskResult>,
}

/// The analysis of one task.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TaskQuality {
    pub task: String,
    pub metric: String,
    pub runs: usize,
    pub checkpoints: usize,
    pub first: f64,
    pub last: f64,
    pub spearman: f64,
    pub sampling_stderr: f64,
    pub seed_spread: Option<f64>,
    pub jitter: f64,
    pub signal_to_noise: f64,
    pub random_baseline: f64,
    /// The best checkpoint's distance above random in standard errors.
    pub above_random_stderrs: f64,
    pub kendall_tau: f64,
    pub verdict: String,
}

impl TaskQuality {
    /// One line: the verdict and the numbers behind it.
    pub fn line(&self) -> String {
        let spread = self
            .seed_spread
            .map_or(String::new(), |s| format!(", seed spread {s:.4}"));
        format!(
            "{}: {} ({} {:.4} -> {:.4} over {} checkpoints x {} runs; Spearman {:.2}, \
             signal/noise {:.1}, stderr {:.4}{spread}, jitter {:.4}; random {:.4}, best \
             {:.1} stderr above; Kendall tau {:.2})",
            self.task,
            self.verdict,
            self.metric,
            self.first,
            self.last,
            self.checkpoints,
            self.runs,
            self.spearman,
            self.signal_to_noise,
            self.sampling_stderr,
            self.jitter,
            self.random_baseline,
            self.above_random_stderrs,
            self.kendall_tau
        )
    }
}

/// Ranks (1-based, ties averaged).
fn ranks(values: &[f64]) -> Vec<f64> {
    let mut order: Vec<usize> = (0..values.len()).collect();
    order.sort_by(|&a, &b| values[a].total_cmp(&values[b]));
    let mut out = vec![0.0; values.len()];
    let mut i = 0;
    while i < order.len() {
        let mut j = i;
        while j + 1 < order.len() && values[order[j + 1]] == values[order[i]] {
            j += 1;
        }
        let rank = (i + j) as f64 / 2.0 + 1.0;
        for &k in &order[i..=j] {
            out[k] = rank;
        }
        i = j + 1;
    }
    out
}

fn pearson(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len() as f64;
    let (mx, my) = (x.iter().sum::<f64>() / n, y.iter().sum::<f64>() / n);
    let (mut sxy, mut sxx, mut syy) = (0.0, 0.0, 0.0);
    for (a, b) in x.iter().zip(y) {
        sxy += (a - mx) * (b - my);
        sxx += (a - mx) * (a - mx);
        syy += (b - my) * (b - my);
    }
    if sxx == 0.0 || syy == 0.0 {
        return 0.0;
    }
    sxy / (sxx * syy).sqrt()
}

/// Spearman's rank correlation (Pearson's on the tie-averaged ranks); 0 for fewer than two
/// points or a constant series.
pub fn spearman(x: &[f64], y: &[f64]) -> f64 {
    if x.len() < 2 || x.len() != y.len() {
        return 0.0;
    }
    pearson(&ranks(x), &ranks(y))
}

/// Kendall's tau-b (tie-corrected); 0 when either side is constant or has fewer than two
/// values.
pub fn kendall_tau(x: &[f64], y: &[f64]) -> f64 {
    let n = x.len().min(y.len());
    let (mut concordant, mut discordant, mut ties_x, mut ties_y) = (0i64, 0i64, 0i64, 0i64);
    for i in 0..n {
        for j in i + 1..n {
            let dx = x[i].total_cmp(&x[j]) as i64;
            let dy = y[i].total_cmp(&y[j]) as i64;
            match (dx, dy) {
                (0, 0) => {}
                (0, _) => ties_x += 1,
                (_, 0) => ties_y += 1,
                _ if dx == dy => concordant += 1,
                _ => discordant += 1,
            }
        }
    }
    let n0 = (concordant + discordant) as f64;
    let denominator = ((n0 + ties_x as f64) * (n0 + ties_y as f64)).sqrt();
    if denominator == 0.0 {
        return 0.0;
    }
    (concordant - discordant) as f64 / denominator
}

pub fn main_metric(output_type: OutputType) -> (&'static str, f64) {
    match output_type {
        OutputType::MultipleChoice => ("acc", 1.0),
        OutputType::GenerateUntil => ("pass@1", 1.0),
        OutputType::LoglikelihoodRolling => ("bits_per_byte", -1.0),
    }
}

fn std_dev(values: &[f64]) -> f64 {
    if values.len() < 2 {
        return 0.0;
    }
    let mean = values.iter().sum::<f64>() / values.len() as f64;
    (values.iter().map(|v| (v - mean).powi(2)).sum::<f64>() / (values.len() - 1) as f64).sqrt()
}

/// The analysis of every task found in the first run, over `runs` (each a series sorted or not;
/// runs are aligned by step, keeping the steps every run has). `random_baseline` overrides the
/// one in the results (`(task, value)`).
pub fn analyze(
    runs: &[Vec<SeriesPoint>],
    random_baseline: &[(String, f64)],
) -> Result<Vec<TaskQuality>, String> {
    let Some(first_run) = runs.first() else {
        return Err("no series given".into());
    };
    let mut steps: Vec<u64> = first_run.iter().map(|p| p.step).collect();
    steps.sort_unstable();
    steps.dedup();
    steps.retain(|s| runs.iter().all(|run| run.iter().any(|p| p.step == *s)));
    if steps.len() < 2 {
        return Err(format!(
            "the series share {} checkpoint step(s); the analysis needs at least two",
            steps.len()
        ));
    }
    let tasks: Vec<&TaskResult> = first_run
        .iter()
        .find(|p| p.step == steps[0])
        .map(|p| p.results.iter().collect())
        .unwrap_or_default();
    let mut out = Vec::new();
    for task in tasks {
        let (metric, sign) = main_metric(task.output_type);
        // scores[run][checkpoint], stderrs likewise.
        let mut scores = Vec::new();
        let mut stderrs = Vec::new();
        let mut baseline = task.random_baseline.unwrap_or(0.0);
        for run in runs {
            let mut s = Vec::new();
            for step in &steps {
                let point = run.iter().find(|p| p.step == *step);
                let result = point.and_then(|p| p.results.iter().find(|r| r.task == task.task));
                let Some(m) = result.and_then(|r| r.metrics.get(metric)) else {
                    return Err(format!(
                        "task {} has no `{metric}` at step {step} in every series",
                        task.task
                    ));
                };
                if let Some(b) = result.and_then(|r| r.random_baseline) {
                    baseline = b;
                }
                s.push(m.value);
                stderrs.push(m.stderr);
            }
            scores.push(s);
        }
        if let Some((_, b)) = random_baseline.iter().find(|(t, _)| *t == task.task) {
            baseline = *b;
        }
        let k = steps.len();
        let step_values: Vec<f64> = steps.iter().map(|&s| s as f64).collect();
        let signed = |v: &[f64]| v.iter().map(|x| sign * x).collect::<Vec<_>>();
        let spearman_mean = scores
            .iter()
            .map(|s| spearman(&step_values, &signed(s)))
            .sum::<f64>()
            / scores.len() as f64;
        let mean_at = |c: usize| scores.iter().map(|s| s[c]).sum::<f64>() / scores.len() as f64;
        let means: Vec<f64> = (0..k).map(mean_at).collect();
        let sampling = stderrs.iter().sum::<f64>() / stderrs.len().max(1) as f64;
        let seed_spread = (runs.len() > 1).then(|| {
            (0..k)
                .map(|c| std_dev(&scores.iter().map(|s| s[c]).collect::<Vec<_>>()))
                .sum::<f64>()
                / k as f64
        });
        let diffs: Vec<f64> = means.windows(2).map(|w| w[1] - w[0]).collect();
        let jitter = std_dev(&diffs) / std::f64::consts::SQRT_2;
        let noise = sampling.max(seed_spread.unwrap_or(0.0)).max(jitter);
        let signal = sign * (means[k - 1] - means[0]);
        let signal_to_noise = if noise > 0.0 {
            signal / noise
        } else if signal > 0.0 {
            f64::INFINITY
        } else {
            0.0
        };
        // Distance above random of the best checkpoint, in its own standard errors (the
        // sampling error of a score at chance is what tells chance from skill).
        let above_random_stderrs = (0..k)
            .map(|c| {
                let se =
                    (0..runs.len()).map(|r| stderrs[r * k + c]).sum::<f64>() / runs.len() as f64;
                let d = sign * (means[c] - baseline);
                if se > 0.0 {
                    d / se
                } else if d > 0.0 {
                    f64::INFINITY
                } else {
                    0.0
                }
            })
            .fold(f64::NEG_INFINITY, f64::max);
        let kendall = if runs.len() > 1 {
            let taus: Vec<f64> = (0..k - 1)
                .map(|c| {
                    let a: Vec<f64> = scores.iter().map(|s| sign * s[c]).collect();
                    let b: Vec<f64> = scores.iter().map(|s| sign * s[c + 1]).collect();
                    kendall_tau(&a, &b)
                })
                .collect();
            taus.iter().sum::<f64>() / taus.len() as f64
        } else {
            kendall_tau(&step_values, &signed(&means))
        };
        let verdict =
            if task.output_type != OutputType::LoglikelihoodRolling && above_random_stderrs < 2.0 {
                "at chance"
            } else if spearman_mean < 0.5 {
                "not monotonic"
            } else if signal_to_noise < 2.0 {
                "noisy"
            } else {
                "ok"
            };
        out.push(TaskQuality {
            task: task.task.clone(),
            metric: metric.into(),
            runs: runs.len(),
            checkpoints: k,
            first: means[0],
            last: means[k - 1],
            spearman: spearman_mean,
            sampling_stderr: sampling,
            seed_spread,
            jitter,
            signal_to_noise,
            random_baseline: baseline,
            above_random_stderrs,
            kendall_tau: kendall,
            verdict: verdict.into(),
        });
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use super::*;
    use crate::harness::Metric;

    #[test]
    fn rank_correlations_match_hand_computed_values() {
        let x = [1.0, 2.0, 3.0, 4.0, 5.0];
        assert!((spearman(&x, &[2.0, 4.0, 6.0, 8.0, 10.0]) - 1.0).abs() < 1e-12);
        assert!((spearman(&x, &[5.0, 4.0, 3.0, 2.0, 1.0]) + 1.0).abs() < 1e-12);
        // d = (0, 0, -1, 1, 0): 1 - 6 * 2 / (5 * 24) = 0.9.
        assert!((spearman(&x, &[1.0, 2.0, 4.0, 3.0, 5.0]) - 0.9).abs() < 1e-12);
        // One discordant pair of 10: (9 - 1) / 10.
        assert!((kendall_tau(&x, &[1.0, 2.0, 4.0, 3.0, 5.0]) - 0.8).abs() < 1e-12);
        // tau-b with a tie in y: pairs 6, concordant 5, tie 1: 5 / sqrt(6 * 5).
        let tau = kendall_tau(&[1.0, 2.0, 3.0, 4.0], &[1.0, 2.0, 2.0, 3.0]);
        assert!((tau - 5.0 / 30f64.sqrt()).abs() < 1e-12);
        assert_eq!(kendall_tau(&x, &[1.0; 5]), 0.0);
        assert_eq!(spearman(&x, &[1.0; 5]), 0.0);
    }

    fn point(step: u64, task: &str, kind: OutputType, value: f64, stderr: f64) -> SeriesPoint {
        let metric = main_metric(kind).0;
        SeriesPoint {
            step,
            results: vec![TaskResult {
                task: task.into(),
                target: "t".into(),
                output_type: kind,
                items: 200,
                resumed: 0,
                metrics: BTreeMap::from([(metric.to_string(), Metric { value, stderr })]),
                random_baseline: (kind == OutputType::MultipleChoice).then_some(0.25),
            }],
        }
    }

    #[test]
    fn a_task_at_chance_is_flagged_and_a_rising_one_passes() {
        let chance = [0.25, 0.24, 0.27, 0.26, 0.25];
        let rising = [0.02, 0.10, 0.21, 0.35, 0.48];
        let run = |values: &[f64], task: &str, kind| {
            values
                .iter()
                .enumerate()
                .map(|(i, &v)| point(100 * (i as u64 + 1), task, kind, v, 0.03))
                .collect::<Vec<_>>()
        };
        let at_chance = analyze(&[run(&chance, "mc", OutputType::MultipleChoice)], &[]).unwrap();
        assert_eq!(at_chance[0].verdict, "at chance", "{}", at_chance[0].line());
        let good = analyze(&[run(&rising, "arith", OutputType::GenerateUntil)], &[]).unwrap();
        assert_eq!(good[0].verdict, "ok", "{}", good[0].line());
        assert!((good[0].spearman - 1.0).abs() < 1e-12);
        assert!((good[0].kendall_tau - 1.0).abs() < 1e-12);
        // Falling bits per byte is progress.
        let bpb = [2.0, 1.8, 1.5, 1.3, 1.2];
        let ppl = analyze(&[run(&bpb, "ppl", OutputType::LoglikelihoodRolling)], &[]).unwrap();
        assert_eq!(ppl[0].verdict, "ok", "{}", ppl[0].line());
        // A zig-zag is not monotonic.
        let zig = [0.40, 0.60, 0.38, 0.62, 0.41];
        let noisy = analyze(&[run(&zig, "zig", OutputType::GenerateUntil)], &[]).unwrap();
        assert_eq!(noisy[0].verdict, "not monotonic", "{}", noisy[0].line());
    }

    #[test]
    fn several_runs_give_seed_spread_and_rank_consistency() {
        let run = |offset: f64| {
            (0..4)
                .map(|i| {
                    point(
                        i + 1,
                        "t",
                        OutputType::GenerateUntil,
                        0.1 * i as f64 + offset,
                        0.01,
                    )
                })
                .collect::<Vec<_>>()
        };
        let q = analyze(&[run(0.0), run(0.05), run(0.1)], &[]).unwrap();
        // The runs keep their order at every step: tau = 1; spread = sd(0, .05, .1) = 0.05.
        assert!((q[0].kendall_tau - 1.0).abs() < 1e-12);
        assert!((q[0].seed_spread.unwrap() - 0.05).abs() < 1e-12);
        assert!(analyze(&[run(0.0)[..1].to_vec()], &[]).is_err());
    }
}
