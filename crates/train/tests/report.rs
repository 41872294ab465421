//! The HTML run report and its SVG line charts.

use stoke_train::metrics::{EvalMetrics, MetricRecord, StepMetrics};
use stoke_train::report::{
    ChartSpec, ReportSection, SectionBody, Series, YScale, line_chart_svg, render_report,
    write_report,
};

fn step(step: u64, loss: f64) -> StepMetrics {
    let lr = 1e-3 * (step as f64 / 100.0).min(1.0);
    StepMetrics {
        mfu: 0.05,
        ..StepMetrics::basic(step, loss, lr, 10.0 / step as f64, false).with_progress(
            12_000.0,
            step * 2048,
            step as f64 * 0.2,
        )
    }
}

fn run_records() -> Vec<MetricRecord> {
    let mut records = Vec::new();
    for s in 1..=300 {
        let loss = if s == 150 {
            f64::NAN
        } else {
            2.0 + 5.0 / (s as f64).sqrt()
        };
        records.push(MetricRecord::Step(step(s, loss)));
        if s % 50 == 0 {
            records.push(MetricRecord::Eval(EvalMetrics {
                step: s,
                loss: 2.5 + 4.0 / (s as f64).sqrt(),
                bits_per_byte: 1.0 + 1.0 / (s as f64).sqrt(),
                tokens: 10_000,
            }));
        }
    }
    records.push(MetricRecord::Alert {
        step: 150,
        message: "non-finite loss: loss is NaN <b>".into(),
    });
    records
}

fn count(haystack: &str, needle: &str) -> usize {
    haystack.matches(needle).count()
}

#[test]
fn the_report_has_one_svg_per_chart_and_names_every_series() {
    let html = render_report("run <42>", &run_records(), &[]).unwrap();
    // loss (train + eval), lr, grad norm, tokens/s, eval bits/byte
    assert_eq!(count(&html, "<svg"), 5);
    assert_eq!(count(&html, "</svg>"), 5);
    for name in [
        "train loss",
        "eval loss",
        "grad norm",
        "tokens/s",
        "eval bits/byte",
        "Learning rate",
    ] {
        assert!(html.contains(name), "missing {name}");
    }
    assert!(html.contains("<title>run &lt;42&gt;</title>"));
}

#[test]
fn the_report_never_shows_nan_text_and_escapes_messages() {
    let html = render_report("run", &run_records(), &[]).unwrap();
    // The only "NaN" is inside the escaped alert message, which is the trainer's text.
    assert_eq!(count(&html, "NaN"), 1);
    assert!(html.contains("loss is NaN &lt;b&gt;"));
    assert!(
        html.contains("1 non-finite point(s) not drawn"),
        "the skipped NaN loss is counted"
    );
}

#[test]
fn the_summary_table_has_the_key_figures() {
    let html = render_report("run", &run_records(), &[]).unwrap();
    let expect = [
        "<tr><th>steps</th><td>300</td></tr>",
        "<tr><th>tokens seen</th><td>614,400</td></tr>",
        "<tr><th>mean tokens/s</th><td>12000</td></tr>",
        "<tr><th>mean MFU (vs measured f32 matmul peak)</th><td>5.00%</td></tr>",
        "<tr><th>alerts</th><td>1</td></tr>",
        "<tr><th>best eval loss</th><td>2.731 (step 300)</td></tr>",
    ];
    for row in expect {
        assert!(html.contains(row), "missing {row}");
    }
}

#[test]
fn the_report_is_self_contained() {
    let dir = tempfile::tempdir().unwrap();
    let path = write_report(&dir.path().join("run"), "run", &run_records(), &[]).unwrap();
    assert_eq!(path, dir.path().join("run").join("report.html"));
    let html = std::fs::read_to_string(&path).unwrap();
    assert!(html.starts_with("<!DOCTYPE html>") && html.trim_end().ends_with("</html>"));
    for forbidden in ["<script", "src=", "href=", "@import", "url("] {
        assert!(!html.contains(forbidden), "found {forbidden}");
    }
}

#[test]
fn a_run_without_evaluations_draws_only_the_training_charts() {
    let records: Vec<MetricRecord> = (1..=20).map(|s| MetricRecord::Step(step(s, 3.0))).collect();
    let html = render_report("run", &records, &[]).unwrap();
    assert_eq!(count(&html, "<svg"), 4);
    assert!(!html.contains("eval loss"));
    let empty = render_report("empty", &[], &[]).unwrap();
    assert_eq!(count(&empty, "<svg"), 0);
    assert!(empty.contains("No metric records."));
}

/// Steps that carry the multi-token prediction loss get one more chart, beside the next-token
/// loss.
#[test]
fn an_mtp_run_charts_its_mtp_loss() {
    let records: Vec<MetricRecord> = (1..=20)
        .map(|s| {
            let mut m = step(s, 3.0);
            m.mtp_loss = Some(4.0 - s as f64 * 0.05);
            MetricRecord::Step(m)
        })
        .collect();
    let html = render_report("run", &records, &[]).unwrap();
    assert_eq!(count(&html, "<svg"), 5);
    assert!(html.contains("Multi-token prediction loss"));
    assert!(html.contains("MTP loss"));
}

#[test]
fn sections_add_their_tables_text_and_charts() {
    let chart = ChartSpec::new(
        "Accuracy",
        "stage",
        "exact match",
        vec![Series::new("held-out", vec![(0.0, 0.1), (1.0, 0.6)])],
        YScale::Linear,
    );
    let sections = [
        ReportSection {
            title: "Pretrain & SFT".into(),
            body: SectionBody::Table(vec![("accuracy".into(), "0.6 <best>".into())]),
            charts: vec![chart],
        },
        ReportSection {
            title: "Notes".into(),
            body: SectionBody::Text("one\n\ntwo".into()),
            charts: vec![],
        },
        ReportSection {
            title: "Raw".into(),
            body: SectionBody::Html("<p id=\"raw\">x</p>".into()),
            charts: vec![],
        },
    ];
    let html = render_report("speedrun", &[], &sections).unwrap();
    assert_eq!(count(&html, "<svg"), 1);
    assert!(html.contains("<h2>Pretrain &amp; SFT</h2>"));
    assert!(html.contains("<tr><th>accuracy</th><td>0.6 &lt;best&gt;</td></tr>"));
    assert!(html.contains("<p>one</p>\n<p>two</p>"));
    assert!(html.contains("<p id=\"raw\">x</p>"));
    assert!(html.contains("held-out"));
}

/// The contents of the SVG's `<text>` elements, trimmed.
fn svg_texts(svg: &str) -> Vec<String> {
    svg.split("<text")
        .skip(1)
        .filter_map(|rest| {
            let content = &rest[rest.find('>')? + 1..];
            Some(content[..content.find("</text>")?].trim().to_string())
        })
        .collect()
}

#[test]
fn chart_text_is_svg_text_elements() {
    let svg = line_chart_svg(
        "Loss curve",
        "step",
        "loss",
        &[Series::new("train", vec![(1.0, 3.0), (2.0, 2.5)])],
    )
    .unwrap();
    assert!(svg.trim_start().starts_with("<svg"));
    let texts = svg_texts(&svg);
    for expected in ["Loss curve", "step", "loss", "train"] {
        assert!(
            texts.iter().any(|t| t == expected),
            "no <text> {expected:?} in {texts:?}"
        );
    }
}

#[test]
fn degenerate_charts_render_without_panicking() {
    let cases: Vec<(&str, Vec<Series>)> = vec![
        ("no series", vec![]),
        ("empty series", vec![Series::new("a", vec![])]),
        ("single point", vec![Series::new("a", vec![(5.0, 2.0)])]),
        (
            "constant",
            vec![Series::new("a", (0..50).map(|i| (i as f64, 7.0)).collect())],
        ),
        (
            "constant zero",
            vec![Series::new("a", (0..50).map(|i| (i as f64, 0.0)).collect())],
        ),
        (
            "same x",
            vec![Series::new("a", vec![(3.0, 1.0), (3.0, 2.0)])],
        ),
        (
            "all nan",
            vec![Series::new("a", vec![(1.0, f64::NAN), (f64::NAN, 1.0)])],
        ),
        (
            "mixed",
            vec![
                Series::new(
                    "a",
                    vec![
                        (1.0, f64::INFINITY),
                        (2.0, 1.0),
                        (3.0, f64::NEG_INFINITY),
                        (4.0, 2.0),
                    ],
                ),
                Series::new("b", vec![]),
            ],
        ),
        (
            "huge span",
            vec![Series::new("a", vec![(0.0, -1e308), (1.0, 1e308)])],
        ),
        (
            "tiny values",
            vec![Series::new("a", vec![(0.0, 1e-12), (1.0, 3e-12)])],
        ),
        (
            "unsorted x",
            vec![Series::new("a", vec![(3.0, 1.0), (1.0, 2.0), (2.0, 0.5)])],
        ),
    ];
    for (name, series) in cases {
        match line_chart_svg(name, "x", "y", &series) {
            Ok(svg) => {
                assert_eq!(count(&svg, "<svg"), 1, "{name}");
                assert!(
                    !svg.contains("NaN") && !svg.contains("inf"),
                    "{name}: non-finite text in {svg}"
                );
            }
            // Only a span beyond f64 may be refused, and then with an error naming the chart.
            Err(e) => assert!(
                name == "huge span" && e.to_string().contains("huge span"),
                "{name}: {e}"
            ),
        }
    }
    let empty = line_chart_svg("nothing", "x", "y", &[]).unwrap();
    assert!(empty.contains("no data"));
    let nan = line_chart_svg(
        "nan",
        "x",
        "y",
        &[Series::new("a", vec![(1.0, f64::NAN), (2.0, 1.0)])],
    )
    .unwrap();
    assert!(nan.contains("1 non-finite point(s) not drawn"));
}

#[test]
fn grad_norm_spanning_decades_gets_a_log_axis() {
    let wide = Series::new(
        "g",
        (1..=100)
            .map(|i| (i as f64, 1000.0 / (i * i) as f64))
            .collect(),
    );
    let narrow = Series::new(
        "g",
        (1..=100)
            .map(|i| (i as f64, 1.0 + i as f64 / 100.0))
            .collect(),
    );
    let log = ChartSpec::new("g", "step", "norm", vec![wide], YScale::Auto)
        .render()
        .unwrap();
    let linear = ChartSpec::new("g", "step", "norm", vec![narrow], YScale::Auto)
        .render()
        .unwrap();
    assert!(log.contains("norm (log scale)"));
    assert!(!linear.contains("log scale"));
}

#[test]
fn long_series_are_decimated_to_a_small_svg() {
    let points: Vec<(f64, f64)> = (0..200_000).map(|i| (i as f64, (i % 97) as f64)).collect();
    let svg = line_chart_svg("long", "step", "y", &[Series::new("a", points)]).unwrap();
    assert!(svg.len() < 200_000, "svg is {} bytes", svg.len());
}

#[test]
fn a_band_is_a_shaded_polygon_inside_the_axis_range() {
    // x in [0, 0.2], so every tick label >= 1 is on the y axis.
    let line = vec![(0.0, 0.5), (0.1, 0.6), (0.2, 0.7)];
    let band = vec![(0.0, 0.1, 0.9), (0.1, 0.2, 1.0), (0.2, 0.3, 1.1)];
    let plain = line_chart_svg("acc", "step", "acc", &[Series::new("a", line.clone())]).unwrap();
    let banded = line_chart_svg(
        "acc",
        "step",
        "acc",
        &[Series::new("a", line).with_band(band)],
    )
    .unwrap();
    assert!(!plain.contains("<polygon"), "no band, no polygon");
    assert_eq!(banded.matches("<polygon").count(), 1, "{banded}");
    assert!(
        banded.contains("opacity=\"0.18\""),
        "the band is translucent"
    );
    // The y axis reaches the band's top (1.1), beyond the line's 0.7.
    let ticks = |svg: &str| -> Vec<f64> {
        svg_texts(svg)
            .iter()
            .filter_map(|t| t.parse().ok())
            .collect()
    };
    assert!(
        ticks(&banded).iter().any(|&t| t >= 1.0),
        "{:?}",
        ticks(&banded)
    );
    assert!(
        ticks(&plain).iter().all(|&t| t < 1.0),
        "{:?}",
        ticks(&plain)
    );
}
