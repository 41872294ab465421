//! Metrics log, MFU, throughput median and the monitor's alert rules.

use std::io::Write;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use stoke_train::metrics::{
    EvalMetrics, MetricRecord, MetricsError, MetricsLog, StepMetrics, ThroughputTracker,
    measure_peak_flops_for, mfu,
};
use stoke_train::monitor::{AlertConfig, AlertKind, AlertRules, Monitor};

fn step(step: u64, loss: f64, tokens_per_s: f64) -> StepMetrics {
    StepMetrics {
        mfu: 0.12,
        ..StepMetrics::basic(step, loss, 3e-4, 0.8, false).with_progress(
            tokens_per_s,
            step * 4096,
            step as f64 * 0.5,
        )
    }
}

fn eval(step: u64) -> MetricRecord {
    MetricRecord::Eval(EvalMetrics {
        step,
        loss: 2.5,
        bits_per_byte: 1.1,
        tokens: 1000,
    })
}

/// Steps 1..=n with an eval every 5 steps and an alert at step 7.
fn run_records(n: u64) -> Vec<MetricRecord> {
    let mut records = Vec::new();
    for s in 1..=n {
        records.push(MetricRecord::Step(step(s, 3.0 - s as f64 * 0.01, 1000.0)));
        if s % 5 == 0 {
            records.push(eval(s));
        }
        if s == 7 {
            records.push(MetricRecord::Alert {
                step: s,
                message: "loss spike: test".into(),
            });
        }
    }
    records
}

fn write_log(path: &std::path::Path, records: &[MetricRecord]) {
    let mut log = MetricsLog::open(path, None).unwrap();
    for r in records {
        log.append(r).unwrap();
    }
    log.flush().unwrap();
}

#[test]
fn jsonl_round_trip_keeps_every_record_including_non_finite_values() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let mut records = run_records(12);
    let mut odd = step(13, f64::NAN, f64::INFINITY);
    odd.grad_norm = f64::NEG_INFINITY;
    odd.z_loss = Some(1e-4);
    odd.skipped = true;
    records.push(MetricRecord::Step(odd));
    write_log(&path, &records);

    let read = MetricsLog::read_all(&path).unwrap();
    assert_eq!(read.len(), records.len());
    // NaN != NaN, so compare the non-finite record field by field.
    assert_eq!(&read[..read.len() - 1], &records[..records.len() - 1]);
    let MetricRecord::Step(back) = read.last().unwrap() else {
        panic!("last record is not a step")
    };
    assert!(back.loss.is_nan());
    assert_eq!(back.tokens_per_s, f64::INFINITY);
    assert_eq!(back.grad_norm, f64::NEG_INFINITY);
    assert_eq!(back.z_loss, Some(1e-4));
    assert!(back.skipped);
}

#[test]
fn records_are_tagged_by_kind() {
    let line = serde_json::to_string(&MetricRecord::Alert {
        step: 3,
        message: "x".into(),
    })
    .unwrap();
    assert_eq!(line, r#"{"kind":"alert","step":3,"message":"x"}"#);
    let line = serde_json::to_string(&MetricRecord::Step(step(1, 2.0, 10.0))).unwrap();
    assert!(
        line.starts_with(r#"{"kind":"step","step":1,"loss":2.0"#),
        "{line}"
    );
    assert!(
        !line.contains("z_loss"),
        "absent z_loss is not written: {line}"
    );
}

#[test]
fn resume_truncation_keeps_exactly_the_records_up_to_the_checkpoint_step() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let full = run_records(20);
    write_log(&path, &full);

    // Resume from the checkpoint of step 10, then redo steps 11..=20 as the uninterrupted run did.
    let mut log = MetricsLog::open(&path, Some(10)).unwrap();
    let kept = MetricsLog::read_all(&path).unwrap();
    let expected: Vec<MetricRecord> = full.iter().filter(|r| r.step() <= 10).cloned().collect();
    assert_eq!(kept, expected);
    assert_eq!(
        kept.iter()
            .filter(|r| matches!(r, MetricRecord::Step(_)))
            .count(),
        10
    );
    assert_eq!(
        kept.iter()
            .filter(|r| matches!(r, MetricRecord::Eval(_)))
            .count(),
        2
    );

    for r in full.iter().filter(|r| r.step() > 10) {
        log.append(r).unwrap();
    }
    log.flush().unwrap();
    assert_eq!(
        MetricsLog::read_all(&path).unwrap(),
        full,
        "resumed log equals the uninterrupted one"
    );
    assert!(!dir.path().join("metrics.jsonl.tmp").exists());
}

#[test]
fn resume_drops_a_torn_last_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    write_log(&path, &run_records(6));
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    file.write_all(br#"{"kind":"step","step":7,"lo"#).unwrap();
    drop(file);
    assert!(matches!(
        MetricsLog::read_all(&path),
        Err(MetricsError::BadLine { line: 8, .. })
    ));

    MetricsLog::open(&path, Some(6)).unwrap();
    let kept = MetricsLog::read_all(&path).unwrap();
    assert_eq!(kept, run_records(6));
}

#[test]
fn resume_without_a_log_starts_an_empty_one() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("sub").join("metrics.jsonl");
    let mut log = MetricsLog::open(&path, Some(40)).unwrap();
    log.append(&eval(41)).unwrap();
    assert_eq!(MetricsLog::read_all(&path).unwrap(), vec![eval(41)]);
}

#[test]
fn a_fresh_open_replaces_an_old_log() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    write_log(&path, &run_records(5));
    MetricsLog::open(&path, None).unwrap();
    assert!(MetricsLog::read_all(&path).unwrap().is_empty());
}

#[test]
fn a_bad_line_is_an_error_naming_the_file_and_line() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let good = serde_json::to_string(&MetricRecord::Step(step(1, 2.0, 5.0))).unwrap();
    std::fs::write(
        &path,
        format!("{good}\n\n{good}\n{{\"kind\":\"step\",\"step\":\"x\"}}\n{good}\n"),
    )
    .unwrap();
    let err = MetricsLog::read_all(&path).unwrap_err();
    assert!(
        matches!(err, MetricsError::BadLine { line: 4, .. }),
        "{err:?}"
    );
    let text = err.to_string();
    assert!(
        text.contains("line 4") && text.contains("metrics.jsonl"),
        "{text}"
    );
    // A bad line in the middle also stops a resume: it is not a torn write.
    assert!(matches!(
        MetricsLog::open(&path, Some(1)),
        Err(MetricsError::BadLine { line: 4, .. })
    ));
}

#[test]
fn mfu_is_six_n_tokens_over_peak() {
    assert!((mfu(1_000_000, 1000.0, 6e9) - 1.0).abs() < 1e-12);
    assert!((mfu(125_000_000, 2000.0, 1.5e13) - 0.1).abs() < 1e-12);
    assert_eq!(mfu(1000, 10.0, 0.0), 0.0);
    assert_eq!(mfu(1000, 10.0, f64::NAN), 0.0);
}

#[test]
fn measured_peak_flops_is_a_plausible_rate() {
    stoke_ops::numerics::init_compute_threads();
    let peak = measure_peak_flops_for(128, Duration::from_millis(20)).unwrap();
    // Any machine that runs the tests does between 10 MFLOP/s and 100 TFLOP/s on f32 matmuls.
    assert!(peak.is_finite() && peak > 1e7 && peak < 1e14, "peak {peak}");
}

#[test]
fn throughput_median_follows_the_window() {
    let mut tracker = ThroughputTracker::new(4);
    assert_eq!(tracker.median(), None);
    for v in [10.0, 1000.0, 20.0] {
        tracker.push(v);
    }
    assert_eq!(tracker.median(), Some(20.0));
    tracker.push(f64::NAN);
    assert_eq!(tracker.len(), 3);
    tracker.push(30.0);
    assert_eq!(tracker.median(), Some(25.0));
    tracker.push(40.0); // 10.0 leaves the window
    assert_eq!(tracker.median(), Some(35.0));
    assert_eq!(tracker.ratio_to_median(17.5, 4), Some(0.5));
    assert_eq!(tracker.ratio_to_median(17.5, 5), None);
}

/// A steady run: loss decays with small noise, throughput jitters by +-5%.
fn steady(n: u64) -> Vec<StepMetrics> {
    (1..=n)
        .map(|s| {
            let noise = ((s * 7919) % 13) as f64 / 13.0 - 0.5; // deterministic, in [-0.5, 0.5)
            let loss = 2.0 + 3.0 * (-(s as f64) / 60.0).exp() + 0.03 * noise;
            let rate = 10_000.0 * (1.0 + 0.1 * noise);
            step(s, loss, rate)
        })
        .collect()
}

#[test]
fn a_steady_run_raises_no_alert() {
    let mut rules = AlertRules::new(AlertConfig::default());
    let alerts: Vec<_> = steady(400).iter().flat_map(|m| rules.check(m)).collect();
    assert!(alerts.is_empty(), "{alerts:?}");
}

#[test]
fn a_throughput_drop_raises_one_alert() {
    let mut rules = AlertRules::new(AlertConfig::default());
    let mut series = steady(200);
    series[150].tokens_per_s = 3_000.0;
    let alerts: Vec<_> = series.iter().flat_map(|m| rules.check(m)).collect();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(
        (alerts[0].step, alerts[0].kind),
        (151, AlertKind::ThroughputDrop)
    );
    assert!(alerts[0].message.starts_with("throughput drop: "));
}

#[test]
fn slow_warm_up_steps_raise_no_throughput_alert() {
    let mut rules = AlertRules::new(AlertConfig::default());
    let mut series = steady(100);
    for m in &mut series[..5] {
        m.tokens_per_s = 500.0;
    }
    let alerts: Vec<_> = series.iter().flat_map(|m| rules.check(m)).collect();
    assert!(alerts.is_empty(), "{alerts:?}");
}

#[test]
fn a_loss_spike_raises_an_alert() {
    let mut rules = AlertRules::new(AlertConfig::default());
    let mut series = steady(200);
    series[120].loss *= 1.5;
    let alerts: Vec<_> = series.iter().flat_map(|m| rules.check(m)).collect();
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert_eq!(
        (alerts[0].step, alerts[0].kind),
        (121, AlertKind::LossSpike)
    );
}

#[test]
fn skipped_steps_and_non_finite_losses_always_alert() {
    let mut rules = AlertRules::new(AlertConfig::default());
    let mut series = steady(30);
    series[2].skipped = true;
    series[3].loss = f64::NAN;
    let alerts: Vec<_> = series.iter().flat_map(|m| rules.check(m)).collect();
    let kinds: Vec<_> = alerts.iter().map(|a| (a.step, a.kind)).collect();
    assert_eq!(
        kinds,
        vec![(3, AlertKind::SkippedStep), (4, AlertKind::NonFiniteLoss)]
    );
    assert_eq!(
        alerts[1].to_record(),
        MetricRecord::Alert {
            step: 4,
            message: "non-finite loss: loss is NaN".into()
        }
    );
}

/// A `Write` whose bytes the test can read afterwards.
#[derive(Clone, Default)]
struct Captured(Arc<Mutex<Vec<u8>>>);

impl Write for Captured {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        self.0.lock().unwrap().extend_from_slice(buf);
        Ok(buf.len())
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

impl Captured {
    fn text(&self) -> String {
        String::from_utf8(self.0.lock().unwrap().clone()).unwrap()
    }
}

#[test]
fn plain_mode_prints_every_n_steps_and_the_alerts() {
    let out = Captured::default();
    let mut monitor = Monitor::plain(100, 25, Box::new(out.clone()));
    let mut series = steady(100);
    series[60].loss = f64::INFINITY;
    for m in &series {
        monitor.on_step(m);
    }
    monitor.on_eval(&EvalMetrics {
        step: 100,
        loss: 2.2,
        bits_per_byte: 1.05,
        tokens: 5000,
    });
    monitor.finish();
    monitor.finish();
    let text = out.text();
    let progress: Vec<&str> = text.lines().filter(|l| l.starts_with("step ")).collect();
    let steps: Vec<&str> = progress
        .iter()
        .map(|l| l.split(' ').nth(1).unwrap())
        .collect();
    assert_eq!(
        steps,
        vec!["1/100", "25/100", "50/100", "75/100", "100/100"],
        "{text}"
    );
    assert!(
        progress[0].contains("| loss ")
            && progress[0].contains("tok/s")
            && progress[0].contains("ETA")
    );
    assert!(
        text.contains("[alert] step 61: non-finite loss: loss is inf"),
        "{text}"
    );
    assert!(text.contains("eval step 100: loss 2.2000"), "{text}");
    assert!(
        text.lines()
            .last()
            .unwrap()
            .starts_with("done: step 100/100"),
        "{text}"
    );
    assert_eq!(monitor.alerts().len(), 1);
}

#[test]
fn quiet_mode_prints_only_the_lines_it_is_given() {
    let out = Captured::default();
    let mut monitor = Monitor::quiet(10, Box::new(out.clone()));
    for m in &steady(10) {
        monitor.on_step_with(m, "reward 0.5");
    }
    monitor.println("eval @ step 10: pass@1 50.0%");
    monitor.finish();
    assert_eq!(out.text(), "eval @ step 10: pass@1 50.0%\n");
}

#[test]
fn without_alert_rules_nothing_is_judged_and_the_summary_counts_no_alerts() {
    let out = Captured::default();
    let mut monitor = Monitor::plain(10, 5, Box::new(out.clone())).without_alert_rules();
    let mut series = steady(10);
    series[3].loss = f64::NAN;
    series[4].skipped = true;
    for m in &series {
        assert!(monitor.on_step_with(m, "reward 0.5").is_empty());
    }
    monitor.finish();
    let text = out.text();
    assert!(!text.contains("[alert]"), "{text}");
    assert!(text.contains("| reward 0.5 | ETA"), "{text}");
    let summary = text.lines().last().unwrap();
    assert!(
        summary.starts_with("done: step 10/10") && !summary.contains("alert"),
        "{text}"
    );
}

#[test]
fn replay_lets_a_resumed_run_judge_against_the_old_window() {
    let series = steady(150);
    let history: Vec<MetricRecord> = series[..100]
        .iter()
        .cloned()
        .map(MetricRecord::Step)
        .collect();
    let mut spike = series[100].clone();
    spike.loss *= 1.5;

    let mut replayed = Monitor::plain(150, 1000, Box::new(std::io::sink()));
    replayed.replay(&history);
    assert_eq!(
        replayed.on_step(&spike).len(),
        1,
        "spike right after resume is detected"
    );

    let mut fresh = Monitor::plain(150, 1000, Box::new(std::io::sink()));
    assert!(
        fresh.on_step(&spike).is_empty(),
        "without history there is nothing to compare"
    );
}
