//! The run report: one self-contained `report.html` a person opens after (or during) a run.
//!
//! What it is: a summary table (steps, tokens, final and best losses, throughput, MFU, alerts),
//! the alert list, and inline SVG charts of the training curves (train + eval loss, learning rate,
//! gradient norm, tokens/s, eval bits-per-byte), followed by any sections the caller adds (the
//! speedrun adds one per pipeline stage). No JavaScript, no network, no external files: the page
//! works from a mail attachment or an offline CI artifact.
//! What it is not: it reads no files (the caller passes the records, e.g. from
//! `MetricsLog::read_all`) and computes no new metrics beyond summaries of the records.
//!
//! Invariants: every text from records or callers is HTML-escaped except `SectionBody::Html`,
//! which is the caller's trusted markup; non-finite values appear as "not finite", never as
//! "NaN" text; a chart is only drawn for figures that have at least one record.

mod chart;

use std::fmt::Write as _;
use std::fs;
use std::path::{Path, PathBuf};

pub use chart::{ChartSpec, Series, YScale, line_chart_svg};

use crate::metrics::{EvalMetrics, MetricRecord, MetricsError, StepMetrics};

/// A caller's part of the report, e.g. one stage of the speedrun.
#[derive(Clone, Debug, PartialEq)]
pub struct ReportSection {
    pub title: String,
    pub body: SectionBody,
    pub charts: Vec<ChartSpec>,
}

/// What a section shows above its charts.
#[derive(Clone, Debug, PartialEq)]
pub enum SectionBody {
    Empty,
    /// Plain text, escaped; blank lines separate paragraphs.
    Text(String),
    /// Trusted HTML inserted as is.
    Html(String),
    /// Two-column key/value table, escaped.
    Table(Vec<(String, String)>),
}

/// Name of the report file inside the run folder.
pub const REPORT_FILE: &str = "report.html";

/// Writes `<run_dir>/report.html` (atomically: temp file, then rename) and returns its path.
pub fn write_report(
    run_dir: &Path,
    title: &str,
    records: &[MetricRecord],
    sections: &[ReportSection],
) -> Result<PathBuf, MetricsError> {
    let html = render_report(title, records, sections)?;
    fs::create_dir_all(run_dir).map_err(|e| MetricsError::Io {
        path: run_dir.to_path_buf(),
        source: e,
    })?;
    let path = run_dir.join(REPORT_FILE);
    let temp = run_dir.join(format!("{REPORT_FILE}.tmp"));
    fs::write(&temp, html).map_err(|e| MetricsError::Io {
        path: temp.clone(),
        source: e,
    })?;
    fs::rename(&temp, &path).map_err(|e| MetricsError::Io {
        path: path.clone(),
        source: e,
    })?;
    Ok(path)
}

/// The report page as a string (what `write_report` writes).
pub fn render_report(
    title: &str,
    records: &[MetricRecord],
    sections: &[ReportSection],
) -> Result<String, MetricsError> {
    let steps: Vec<&StepMetrics> = records
        .iter()
        .filter_map(|r| {
            if let MetricRecord::Step(m) = r {
                Some(m)
            } else {
                None
            }
        })
        .collect();
    let evals: Vec<&EvalMetrics> = records
        .iter()
        .filter_map(|r| {
            if let MetricRecord::Eval(m) = r {
                Some(m)
            } else {
                None
            }
        })
        .collect();
    let alerts: Vec<(u64, &str)> = records
        .iter()
        .filter_map(|r| match r {
            MetricRecord::Alert { step, message } => Some((*step, message.as_str())),
            _ => None,
        })
        .collect();

    let mut html = String::with_capacity(64 * 1024);
    let _ = write!(
        html,
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n<title>{}</title>\n<style>{STYLE}</style>\n</head>\n<body>\n<h1>{}</h1>\n",
        escape(title),
        escape(title)
    );

    // A page of caller sections only (an evaluation report) has no training summary.
    if !records.is_empty() {
        html.push_str("<h2>Summary</h2>\n");
        push_table(&mut html, &summary_rows(&steps, &evals, alerts.len()));
    } else if sections.is_empty() {
        html.push_str("<h2>Summary</h2>\n<p>No metric records.</p>\n");
    }

    if !alerts.is_empty() {
        html.push_str("<h2>Alerts</h2>\n<ul class=\"alerts\">\n");
        for (step, message) in &alerts {
            let _ = writeln!(html, "<li>step {step}: {}</li>", escape(message));
        }
        html.push_str("</ul>\n");
    }

    let charts = training_charts(&steps, &evals);
    if !charts.is_empty() {
        html.push_str("<h2>Training curves</h2>\n");
        for chart in &charts {
            push_chart(&mut html, chart)?;
        }
    }

    for section in sections {
        let _ = writeln!(html, "<h2>{}</h2>", escape(&section.title));
        match &section.body {
            SectionBody::Empty => {}
            SectionBody::Text(text) => {
                for paragraph in text.split("\n\n").filter(|p| !p.trim().is_empty()) {
                    let _ = writeln!(html, "<p>{}</p>", escape(paragraph.trim()));
                }
            }
            SectionBody::Html(markup) => {
                html.push_str(markup);
                html.push('\n');
            }
            SectionBody::Table(rows) => push_table(&mut html, rows),
        }
        for chart in &section.charts {
            push_chart(&mut html, chart)?;
        }
    }
    html.push_str("</body>\n</html>\n");
    Ok(html)
}

/// The page style of every report (runs, evaluations, the speedrun's report card): `.tok` marks
/// a token, `.ok` / `.bad` a right / wrong answer.
const STYLE: &str = "body{font-family:system-ui,sans-serif;max-width:900px;margin:2em auto;padding:0 1em;color:#222}\
table{border-collapse:collapse;margin:0.5em 0}td,th{border:1px solid #ccc;padding:3px 10px;text-align:left;vertical-align:top}\
td:nth-child(2){font-variant-numeric:tabular-nums}figure{margin:1em 0}svg{max-width:100%;height:auto}\
pre{background:#f6f6f6;padding:0.6em;white-space:pre-wrap}\
.tok{border:1px solid #9ab;border-radius:3px;padding:0 1px;margin:1px;display:inline-block;white-space:pre;font-family:monospace}\
ul.alerts li{color:#a33}.ok{color:#262}.bad{color:#a33}";

/// The standard curves, each only when some record carries it.
fn training_charts(steps: &[&StepMetrics], evals: &[&EvalMetrics]) -> Vec<ChartSpec> {
    let step_series = |name: &str, value: fn(&StepMetrics) -> f64| {
        Series::new(
            name,
            steps.iter().map(|m| (m.step as f64, value(m))).collect(),
        )
    };
    let eval_series = |name: &str, value: fn(&EvalMetrics) -> f64| {
        Series::new(
            name,
            evals.iter().map(|m| (m.step as f64, value(m))).collect(),
        )
    };
    let mut charts = Vec::new();
    let mut loss = Vec::new();
    if !steps.is_empty() {
        loss.push(step_series("train loss", |m| m.loss));
    }
    if !evals.is_empty() {
        loss.push(eval_series("eval loss", |m| m.loss));
    }
    if !loss.is_empty() {
        charts.push(ChartSpec::new("Loss", "step", "loss", loss, YScale::Linear));
    }
    if !steps.is_empty() {
        charts.push(ChartSpec::new(
            "Learning rate",
            "step",
            "lr",
            vec![step_series("lr", |m| m.lr)],
            YScale::Linear,
        ));
        charts.push(ChartSpec::new(
            "Gradient norm (before clipping)",
            "step",
            "grad norm",
            vec![step_series("grad norm", |m| m.grad_norm)],
            YScale::Auto,
        ));
        charts.push(ChartSpec::new(
            "Throughput",
            "step",
            "tokens/s",
            vec![step_series("tokens/s", |m| m.tokens_per_s)],
            YScale::Linear,
        ));
    }
    charts.extend(moe_charts(steps));
    let mtp: Vec<(f64, f64)> = steps
        .iter()
        .filter_map(|m| m.mtp_loss.map(|v| (m.step as f64, v)))
        .collect();
    if !mtp.is_empty() {
        charts.push(ChartSpec::new(
            "Multi-token prediction loss (mean cross-entropy of the MTP modules)",
            "step",
            "loss",
            vec![
                step_series("next-token loss", |m| m.loss),
                Series::new("MTP loss", mtp),
            ],
            YScale::Auto,
        ));
    }
    let logits: Vec<(f64, f64)> = steps
        .iter()
        .filter_map(|m| m.max_attn_logit.map(|v| (m.step as f64, v)))
        .collect();
    if !logits.is_empty() {
        charts.push(ChartSpec::new(
            "Largest attention logit (MuonClip: before each step's QK-clip)",
            "step",
            "max logit",
            vec![Series::new("max attention logit", logits)],
            YScale::Linear,
        ));
    }
    if !evals.is_empty() {
        charts.push(ChartSpec::new(
            "Eval bits per byte",
            "step",
            "bits/byte",
            vec![eval_series("eval bits/byte", |m| m.bits_per_byte)],
            YScale::Linear,
        ));
    }
    charts
}

/// Mixture-of-experts charts, when the steps carry expert loads: the max load violation
/// (MaxVio, worst layer) and the mean violation over the steps, and per MoE layer every
/// expert's share of the slots (a 10-step moving average: single steps of a small batch are
/// noisy). A balanced layer's lines sit at 1 / experts; a collapsed expert's at 0.
fn moe_charts(steps: &[&StepMetrics]) -> Vec<ChartSpec> {
    let with_moe: Vec<(&StepMetrics, &crate::metrics::MoeMetrics)> = steps
        .iter()
        .filter_map(|m| m.moe.as_ref().map(|moe| (*m, moe)))
        .collect();
    if with_moe.is_empty() {
        return Vec::new();
    }
    let series = |name: &str, value: fn(&crate::metrics::MoeMetrics) -> f64| {
        Series::new(
            name,
            with_moe
                .iter()
                .map(|(m, moe)| (m.step as f64, value(moe)))
                .collect(),
        )
    };
    let mut charts = vec![ChartSpec::new(
        "MoE load violation",
        "step",
        "violation",
        vec![
            series("max violation (worst layer)", |m| m.max_violation),
            series("mean violation (layer mean)", |m| m.mean_violation),
        ],
        YScale::Linear,
    )];
    let dropped: Vec<(f64, f64)> = with_moe
        .iter()
        .filter_map(|(m, moe)| moe.dropped_share.map(|d| (m.step as f64, d)))
        .collect();
    if !dropped.is_empty() {
        charts.push(ChartSpec::new(
            "MoE pairs dropped by the expert capacity",
            "step",
            "share of (token, slot) pairs",
            vec![Series::new("dropped share", dropped)],
            YScale::Linear,
        ));
    }
    let layers: Vec<usize> = with_moe[0].1.expert_load.iter().map(|(l, _)| *l).collect();
    const WINDOW: usize = 10;
    for (slot, layer) in layers.iter().enumerate() {
        let experts = with_moe[0].1.expert_load[slot].1.len();
        let lines = (0..experts)
            .map(|e| {
                let raw: Vec<(f64, f64)> = with_moe
                    .iter()
                    .filter_map(|(m, moe)| {
                        let (l, shares) = moe.expert_load.get(slot)?;
                        (l == layer).then(|| (m.step as f64, shares.get(e).copied().unwrap_or(0.0)))
                    })
                    .collect();
                let smoothed = raw
                    .iter()
                    .enumerate()
                    .map(|(i, &(x, _))| {
                        let from = i.saturating_sub(WINDOW - 1);
                        let window = &raw[from..=i];
                        (
                            x,
                            window.iter().map(|p| p.1).sum::<f64>() / window.len() as f64,
                        )
                    })
                    .collect();
                Series::new(format!("expert {e}"), smoothed)
            })
            .collect();
        charts.push(ChartSpec::new(
            &format!("Expert load, layer {layer} (share of slots, {WINDOW}-step mean)"),
            "step",
            "share",
            lines,
            YScale::Linear,
        ));
    }
    charts
}

fn summary_rows(
    steps: &[&StepMetrics],
    evals: &[&EvalMetrics],
    alerts: usize,
) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut row = |key: &str, value: String| rows.push((key.to_string(), value));
    if let Some(last) = steps.iter().max_by_key(|m| m.step) {
        row("steps", last.step.to_string());
        row("tokens seen", group_thousands(last.tokens_seen));
        row("wall-clock time", fmt_seconds(last.elapsed_s));
        row("final train loss", fmt_value(last.loss));
        if let Some(best) = best_by(steps.iter().map(|m| (m.step, m.loss))) {
            row(
                "best train loss",
                format!("{} (step {})", fmt_value(best.1), best.0),
            );
        }
        let rates: Vec<f64> = steps
            .iter()
            .map(|m| m.tokens_per_s)
            .filter(|v| v.is_finite())
            .collect();
        if !rates.is_empty() {
            row(
                "mean tokens/s",
                format!("{:.0}", rates.iter().sum::<f64>() / rates.len() as f64),
            );
        }
        let mfus: Vec<f64> = steps
            .iter()
            .map(|m| m.mfu)
            .filter(|v| v.is_finite())
            .collect();
        if !mfus.is_empty() {
            row(
                "mean MFU (vs measured f32 matmul peak)",
                format!(
                    "{:.2}%",
                    100.0 * mfus.iter().sum::<f64>() / mfus.len() as f64
                ),
            );
        }
        let skipped = steps.iter().filter(|m| m.skipped).count();
        row("skipped steps", skipped.to_string());
    }
    if let Some(last) = evals.iter().max_by_key(|m| m.step) {
        row(
            "final eval loss",
            format!("{} (step {})", fmt_value(last.loss), last.step),
        );
        if let Some(best) = best_by(evals.iter().map(|m| (m.step, m.loss))) {
            row(
                "best eval loss",
                format!("{} (step {})", fmt_value(best.1), best.0),
            );
        }
        row("final eval bits/byte", fmt_value(last.bits_per_byte));
        if let Some(best) = best_by(evals.iter().map(|m| (m.step, m.bits_per_byte))) {
            row(
                "best eval bits/byte",
                format!("{} (step {})", fmt_value(best.1), best.0),
            );
        }
    }
    row("alerts", alerts.to_string());
    rows
}

/// (step, value) with the smallest finite value.
fn best_by(values: impl Iterator<Item = (u64, f64)>) -> Option<(u64, f64)> {
    values
        .filter(|(_, v)| v.is_finite())
        .min_by(|a, b| a.1.total_cmp(&b.1))
}

fn push_chart(html: &mut String, chart: &ChartSpec) -> Result<(), MetricsError> {
    html.push_str("<figure>\n");
    html.push_str(&chart.render()?);
    html.push_str("\n</figure>\n");
    Ok(())
}

fn push_table(html: &mut String, rows: &[(String, String)]) {
    html.push_str("<table>\n");
    for (key, value) in rows {
        let _ = writeln!(
            html,
            "<tr><th>{}</th><td>{}</td></tr>",
            escape(key),
            escape(value)
        );
    }
    html.push_str("</table>\n");
}

/// A figure with 4 significant digits; "not finite" for NaN and infinities.
fn fmt_value(value: f64) -> String {
    if !value.is_finite() {
        return "not finite".into();
    }
    crate::metrics::format_significant(value, 1e6)
}

fn fmt_seconds(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "not finite".into();
    }
    if seconds < 120.0 {
        format!("{seconds:.1} s")
    } else {
        format!("{:.1} min", seconds / 60.0)
    }
}

fn group_thousands(n: u64) -> String {
    let digits = n.to_string();
    let mut out = String::with_capacity(digits.len() + digits.len() / 3);
    for (i, c) in digits.chars().enumerate() {
        if i > 0 && (digits.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// HTML text escaping (element content and double-quoted attributes).
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            _ => out.push(c),
        }
    }
    out
}
