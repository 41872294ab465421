//! `stoke dpo`'s run report: `OUT/report.html`, drawn with [`crate::report`] so it looks like
//! `stoke train`'s and `stoke grpo`'s (the same summary table and loss / lr / gradient norm /
//! tokens/s curves), plus one section for the preference figures under TRL's names: the chosen
//! and rejected log-probs (likelihood displacement shows as `logps/chosen` falling), the implicit
//! rewards and their margin, and the reward accuracy; for a reward model (`stoke rm`), its scores
//! (mean, min, max, std) and its pair accuracy and margin.
//!
//! What it is not: it reads no files (the run passes its step records, read from the log so a
//! resumed run's report covers the whole run) and computes nothing but first / last values of
//! what the steps logged.
//!
//! Invariants: a chart is drawn only for figures some step logged with a finite value (CPO and
//! ORPO log no `rewards/*` of a reference); non-finite values are left out of charts.

use std::path::{Path, PathBuf};

use super::record::PairStepRecord;
use crate::metrics::{MetricRecord, MetricsError, StepMetrics};
use crate::report::{ChartSpec, ReportSection, SectionBody, Series, YScale, write_report};
use crate::step::StepOutcome;

/// The step record as the trainer's standard record (loss, lr, grad norm, tokens/s, skipped).
/// MFU is not measured here (NaN: left out of the summary).
pub fn standard_record(report: &PairStepRecord, tokens_seen: u64, elapsed_s: f64) -> MetricRecord {
    MetricRecord::Step(standard_step(report, tokens_seen, elapsed_s))
}

/// [`standard_record`]'s figures (what the shared monitor reads).
pub fn standard_step(report: &PairStepRecord, tokens_seen: u64, elapsed_s: f64) -> StepMetrics {
    let skipped = report.outcome != StepOutcome::Applied;
    StepMetrics::basic(
        report.step,
        report.loss,
        report.lr,
        report.grad_norm,
        skipped,
    )
    .with_progress(report.tokens_per_s, tokens_seen, elapsed_s)
}

/// The charts of the preference figures, in this order; a chart whose figures no step logged
/// is left out.
const CHARTS: &[(&str, &str, &[&str])] = &[
    (
        "log-probs of the responses (summed over tokens)",
        "log-prob",
        &["logps/chosen", "logps/rejected"],
    ),
    (
        "implicit rewards",
        "reward",
        &["rewards/chosen", "rewards/rejected", "rewards/margins"],
    ),
    ("reward accuracy", "share", &["rewards/accuracies"]),
    // `stoke rm`: the reward model's scores and how it ranks the pairs.
    (
        "reward-model scores",
        "reward",
        &["mean_reward", "min_reward", "max_reward", "std_reward"],
    ),
    (
        "reward-model pairs: share ranked right, mean margin",
        "share / reward",
        &["accuracy", "margin"],
    ),
];

/// The preference section: a table of each figure's first and last value, then the charts.
pub fn preference_section(steps: &[PairStepRecord]) -> ReportSection {
    let mut names: Vec<&str> = Vec::new();
    for report in steps {
        for name in report.metrics.keys() {
            if !names.contains(&name.as_str()) {
                names.push(name);
            }
        }
    }
    let finite = |name: &str| -> Vec<(f64, f64)> {
        steps
            .iter()
            .filter_map(|r| {
                r.metric(name)
                    .filter(|v| v.is_finite())
                    .map(|v| (r.step as f64, v))
            })
            .collect()
    };
    let rows = names
        .iter()
        .filter_map(|name| {
            let points = finite(name);
            let (first, last) = (points.first()?, points.last()?);
            Some((
                name.to_string(),
                format!(
                    "{:.4} (step {}) -> {:.4} (step {})",
                    first.1, first.0, last.1, last.0
                ),
            ))
        })
        .collect();
    let charts = CHARTS
        .iter()
        .filter_map(|(title, y_label, figures)| {
            let series: Vec<Series> = figures
                .iter()
                .map(|name| Series::new(*name, finite(name)))
                .filter(|s| !s.points.is_empty())
                .collect();
            (!series.is_empty()).then(|| ChartSpec {
                title: title.to_string(),
                x_label: "step".into(),
                y_label: y_label.to_string(),
                series,
                y_scale: YScale::Linear,
            })
        })
        .collect();
    ReportSection {
        title: "Preference figures (TRL's names)".into(),
        body: SectionBody::Table(rows),
        charts,
    }
}

/// The steps as the trainer's standard records, with running token and time totals.
pub fn standard_records(steps: &[PairStepRecord]) -> Vec<MetricRecord> {
    let (mut tokens, mut seconds) = (0u64, 0f64);
    steps
        .iter()
        .map(|s| {
            tokens += s.tokens as u64;
            seconds += s.seconds;
            standard_record(s, tokens, seconds)
        })
        .collect()
}

/// Writes `out_dir/report.html` for a run's steps and returns its path.
pub fn write_preference_report(
    out_dir: &Path,
    title: &str,
    steps: &[PairStepRecord],
) -> Result<PathBuf, MetricsError> {
    write_report(
        out_dir,
        title,
        &standard_records(steps),
        &[preference_section(steps)],
    )
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::preference::train::PairStepReport;

    fn step(step: u64, chosen: f64, rejected: f64) -> PairStepRecord {
        PairStepRecord::from_report(&PairStepReport {
            step,
            epoch: 0,
            outcome: StepOutcome::Applied,
            loss: 0.69,
            grad_norm: 1.0,
            lr: 1e-6,
            metrics: vec![
                ("logps/chosen", chosen),
                ("logps/rejected", rejected),
                ("rewards/margins", f64::NAN),
            ],
            pairs: 4,
            tokens: 400,
            seconds: 0.5,
        })
    }

    #[test]
    fn the_section_charts_what_was_logged_and_tables_first_and_last() {
        let steps = [step(1, -5.0, -7.0), step(2, -5.5, -9.0)];
        let section = preference_section(&steps);
        let SectionBody::Table(rows) = &section.body else {
            panic!("a table");
        };
        // rewards/margins was never finite: no row, no chart.
        assert_eq!(rows.len(), 2, "{rows:?}");
        assert_eq!(rows[0].0, "logps/chosen");
        assert!(
            rows[0]
                .1
                .starts_with("-5.0000 (step 1) -> -5.5000 (step 2)"),
            "{}",
            rows[0].1
        );
        assert_eq!(section.charts.len(), 1);
        assert_eq!(section.charts[0].series.len(), 2);
        assert_eq!(
            section.charts[0].series[1].points,
            vec![(1.0, -7.0), (2.0, -9.0)]
        );
    }

    #[test]
    fn the_report_page_holds_the_standard_summary_and_the_section() {
        let steps = [step(1, -5.0, -7.0), step(2, -5.5, -9.0)];
        let dir = tempfile::tempdir().expect("tempdir");
        let path = write_preference_report(dir.path(), "dpo", &steps).expect("written");
        let html = std::fs::read_to_string(path).expect("read");
        assert!(html.contains("Preference figures"), "no section");
        assert!(html.contains("logps/rejected"), "no figure");
        assert!(html.contains("<svg"), "no chart");
    }
}
