//! `report.html` of an evaluation over checkpoints (`stoke eval run --checkpoints`, `stoke eval
//! quality --report`): per task, one chart per metric across training steps, each run a line
//! with its 95% confidence band (value ± 1.96 standard errors) and the random baseline as a
//! flat line where the task has one; a table of every value with its standard error; and the
//! quality verdict when the analysis was run.
//!
//! What it is not: a new computation. Values and standard errors are the harness's
//! (`results.json`), verdicts the quality analysis's; the page only draws them, through the run
//! report's renderer (self-contained HTML, inline SVG).

use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::{Path, PathBuf};

use stoke_eval::quality::{SeriesPoint, TaskQuality, main_metric};
use stoke_eval::{Metric, TaskResult};
use stoke_train::report::{ChartSpec, ReportSection, SectionBody, Series, YScale, escape};

/// z of a two-sided 95% normal interval.
const Z95: f64 = 1.96;

/// A run's name and its checkpoints.
pub struct Run<'a> {
    pub label: String,
    pub points: &'a [SeriesPoint],
}

fn result<'a>(point: &'a SeriesPoint, task: &str) -> Option<&'a TaskResult> {
    point.results.iter().find(|r| r.task == task)
}

/// The report's sections: one per task, in the first run's order.
pub fn sections(runs: &[Run<'_>], analysis: &[TaskQuality]) -> Vec<ReportSection> {
    let mut tasks: Vec<(String, stoke_eval::OutputType)> = Vec::new();
    for run in runs {
        for point in run.points {
            for r in &point.results {
                if !tasks.iter().any(|(t, _)| *t == r.task) {
                    tasks.push((r.task.clone(), r.output_type));
                }
            }
        }
    }
    tasks
        .iter()
        .map(|(task, output_type)| {
            let (main, _) = main_metric(*output_type);
            let mut metrics: BTreeSet<String> = BTreeSet::new();
            for run in runs {
                for point in run.points {
                    if let Some(r) = result(point, task) {
                        metrics.extend(r.metrics.keys().cloned());
                    }
                }
            }
            // The main metric first.
            let mut ordered: Vec<String> = metrics.iter().filter(|m| *m == main).cloned().collect();
            ordered.extend(metrics.iter().filter(|m| *m != main).cloned());
            let charts = ordered
                .iter()
                .map(|metric| chart(runs, task, metric, metric == main))
                .collect();
            ReportSection {
                title: format!("Task {task}"),
                body: SectionBody::Html(body(runs, task, &ordered, analysis)),
                charts,
            }
        })
        .collect()
}

fn chart(runs: &[Run<'_>], task: &str, metric: &str, main: bool) -> ChartSpec {
    let mut series = Vec::new();
    let mut steps = Vec::new();
    let mut baseline = None;
    for run in runs {
        let mut points = Vec::new();
        let mut band = Vec::new();
        for point in run.points {
            let Some(r) = result(point, task) else {
                continue;
            };
            if main && baseline.is_none() {
                baseline = r.random_baseline;
            }
            if let Some(m) = r.metrics.get(metric) {
                let x = point.step as f64;
                points.push((x, m.value));
                band.push((x, m.value - Z95 * m.stderr, m.value + Z95 * m.stderr));
                steps.push(x);
            }
        }
        series.push(Series::new(run.label.clone(), points).with_band(band));
    }
    if let Some(b) = baseline {
        let lo = steps.iter().copied().fold(f64::INFINITY, f64::min);
        let hi = steps.iter().copied().fold(f64::NEG_INFINITY, f64::max);
        if lo.is_finite() {
            series.push(Series::new("random baseline", vec![(lo, b), (hi, b)]));
        }
    }
    ChartSpec {
        title: format!("{task}: {metric} (95% band)"),
        x_label: "step".into(),
        y_label: metric.into(),
        series,
        y_scale: YScale::Linear,
    }
}

fn cell(metric: Option<&Metric>) -> String {
    metric.map_or("-".into(), |m| format!("{:.4} ± {:.4}", m.value, m.stderr))
}

fn body(runs: &[Run<'_>], task: &str, metrics: &[String], analysis: &[TaskQuality]) -> String {
    let mut html = String::new();
    if let Some(q) = analysis.iter().find(|q| q.task == task) {
        let _ = writeln!(html, "<p><b>{}</b></p>", escape(&q.line()));
    }
    html.push_str("<table>\n<tr><th>run</th><th>step</th>");
    for m in metrics {
        let _ = write!(html, "<th>{} ± stderr</th>", escape(m));
    }
    html.push_str("<th>items</th></tr>\n");
    for run in runs {
        for point in run.points {
            let Some(r) = result(point, task) else {
                continue;
            };
            let _ = write!(
                html,
                "<tr><td>{}</td><td>{}</td>",
                escape(&run.label),
                point.step
            );
            for m in metrics {
                let _ = write!(html, "<td>{}</td>", cell(r.metrics.get(m)));
            }
            let _ = writeln!(html, "<td>{}</td></tr>", r.items);
        }
    }
    html.push_str("</table>\n");
    html
}

/// Writes `dir/report.html`.
pub fn write(
    dir: &Path,
    title: &str,
    runs: &[Run<'_>],
    analysis: &[TaskQuality],
) -> anyhow::Result<PathBuf> {
    let path = stoke_train::report::write_report(dir, title, &[], &sections(runs, analysis))?;
    eprintln!("report: {}", path.display());
    Ok(path)
}
