//! What a person watching a run sees: a progress line with the key figures, and alerts.
//!
//! What it is: `Monitor` draws an indicatif progress bar on stderr (`step/total | loss | lr | tok/s |
//! ETA`, then the command's own figures), or, when stderr is not a terminal (CI logs, `nohup`) or
//! the run is quiet, prints one plain line every few steps instead (or, [`Monitor::quiet`], only
//! the lines given to `println`). Every training command shows its steps here: `stoke train`
//! through the trainer's observer hook, `stoke dpo` and `stoke grpo` through
//! [`Monitor::on_step_with`]. Each step goes through two alert rules: throughput well below its
//! running median (after a warm-up, since the first steps pay for thread start-up and caches), and
//! a loss spike (loss above what the linear trend of a running window predicts by more than k
//! standard deviations of the window around that trend), plus an alert for every non-finite loss
//! and every skipped step. Alerts are printed above the bar and returned, so the trainer appends
//! them to the metrics log (`Alert::to_record`, or `take_alerts` through the `StepObserver` hook).
//! A command that judges its own steps turns the rules off ([`Monitor::without_alert_rules`]:
//! GRPO, whose loss is no falling curve, alerts on skipped updates and failed rewards itself).
//! What it is not: it does not act on alerts (skipping a batch, tightening the clip is spike.rs and
//! the trainer's job; the rules here are only for a person reading the log), and it writes no files.
//!
//! Invariants: alert decisions depend only on the sequence of steps given (and `replay` rebuilds
//! that state from a resumed log), never on the output mode; printing never fails a run.
//! Throughput alerts depend on wall-clock figures, so they are the one part of a resumed run's
//! log that need not match an uninterrupted run.

use std::collections::VecDeque;
use std::io::{IsTerminal, Write};
use std::time::{Duration, Instant};

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

use crate::metrics::{EvalMetrics, MetricRecord, StepMetrics, ThroughputTracker};

/// Thresholds of the alert rules.
#[derive(Clone, Debug, PartialEq)]
pub struct AlertConfig {
    /// Steps in the throughput median's window.
    pub throughput_window: usize,
    /// Steps of this process after which throughput alerts start (start-up is slow by nature).
    pub throughput_warmup_steps: u64,
    /// Alert when tokens/s < this fraction of the running median.
    pub throughput_drop_ratio: f64,
    /// Steps in the loss window.
    pub loss_window: usize,
    /// Finite losses the window needs before spikes are judged.
    pub loss_min_samples: usize,
    /// k in `loss > predicted + k * spread` (see `LossSpikeDetector`).
    pub loss_spike_sigmas: f64,
    /// Lower bound of the spread as a fraction of the predicted loss, so a flat, smooth loss curve
    /// (spread ~ 0) does not turn every tiny wiggle into a spike.
    pub loss_min_relative_std: f64,
}

impl Default for AlertConfig {
    fn default() -> AlertConfig {
        AlertConfig {
            throughput_window: 50,
            throughput_warmup_steps: 10,
            throughput_drop_ratio: 0.5,
            loss_window: 50,
            loss_min_samples: 20,
            loss_spike_sigmas: 5.0,
            loss_min_relative_std: 0.01,
        }
    }
}

/// The closed set of things the monitor alerts on.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum AlertKind {
    ThroughputDrop,
    LossSpike,
    NonFiniteLoss,
    SkippedStep,
}

impl AlertKind {
    pub fn as_str(self) -> &'static str {
        match self {
            AlertKind::ThroughputDrop => "throughput drop",
            AlertKind::LossSpike => "loss spike",
            AlertKind::NonFiniteLoss => "non-finite loss",
            AlertKind::SkippedStep => "skipped step",
        }
    }
}

#[derive(Clone, Debug, PartialEq)]
pub struct Alert {
    pub step: u64,
    pub kind: AlertKind,
    /// Full sentence, starting with the kind (`"loss spike: ..."`), as written to the log.
    pub message: String,
}

impl Alert {
    fn new(step: u64, kind: AlertKind, detail: String) -> Alert {
        Alert {
            step,
            kind,
            message: format!("{}: {detail}", kind.as_str()),
        }
    }

    /// The metrics-log record of this alert.
    pub fn to_record(&self) -> MetricRecord {
        MetricRecord::Alert {
            step: self.step,
            message: self.message.clone(),
        }
    }
}

/// The last `window` finite losses, and what they predict for the next step.
///
/// A plain mean + k*std of the window misses spikes while the loss is still falling fast (the
/// downward trend inflates the std), so the window is fitted with a least-squares line, the next
/// loss is predicted by extending it, and the spread is the std of the residuals around the line.
/// On a flat curve this is the window's mean and std.
#[derive(Clone, Debug)]
pub struct LossSpikeDetector {
    window: usize,
    losses: VecDeque<f64>,
}

impl LossSpikeDetector {
    pub fn new(window: usize) -> LossSpikeDetector {
        let window = window.max(2);
        LossSpikeDetector {
            window,
            losses: VecDeque::with_capacity(window),
        }
    }

    /// Adds a finite loss to the window (non-finite ones are ignored).
    pub fn push(&mut self, loss: f64) {
        if !loss.is_finite() {
            return;
        }
        if self.losses.len() == self.window {
            self.losses.pop_front();
        }
        self.losses.push_back(loss);
    }

    pub fn len(&self) -> usize {
        self.losses.len()
    }

    pub fn is_empty(&self) -> bool {
        self.losses.is_empty()
    }

    /// (predicted next loss, residual std) of the window's linear trend; None with < 2 losses.
    pub fn predict(&self) -> Option<(f64, f64)> {
        let n = self.losses.len();
        if n < 2 {
            return None;
        }
        let count = n as f64;
        let mean_x = (count - 1.0) / 2.0;
        let mean_y = self.losses.iter().sum::<f64>() / count;
        let (mut sxy, mut sxx) = (0.0, 0.0);
        for (i, y) in self.losses.iter().enumerate() {
            let dx = i as f64 - mean_x;
            sxy += dx * (y - mean_y);
            sxx += dx * dx;
        }
        let slope = sxy / sxx;
        let residual_variance = self
            .losses
            .iter()
            .enumerate()
            .map(|(i, y)| (y - (mean_y + slope * (i as f64 - mean_x))).powi(2))
            .sum::<f64>()
            / count;
        Some((mean_y + slope * (count - mean_x), residual_variance.sqrt()))
    }
}

/// Alert state: the two running windows and the rules' thresholds. Independent of display.
#[derive(Clone, Debug)]
pub struct AlertRules {
    config: AlertConfig,
    throughput: ThroughputTracker,
    losses: LossSpikeDetector,
    /// Steps observed live by this process (not replayed), for the throughput warm-up.
    live_steps: u64,
}

impl AlertRules {
    pub fn new(config: AlertConfig) -> AlertRules {
        AlertRules {
            throughput: ThroughputTracker::new(config.throughput_window),
            losses: LossSpikeDetector::new(config.loss_window),
            live_steps: 0,
            config,
        }
    }

    /// Judges one step, then adds it to the windows.
    pub fn check(&mut self, m: &StepMetrics) -> Vec<Alert> {
        let mut alerts = Vec::new();
        self.live_steps += 1;
        if m.skipped {
            alerts.push(Alert::new(
                m.step,
                AlertKind::SkippedStep,
                format!(
                    "update not applied (loss {}, grad norm {})",
                    fmt_sig(m.loss),
                    fmt_sig(m.grad_norm)
                ),
            ));
        }
        if !m.loss.is_finite() {
            alerts.push(Alert::new(
                m.step,
                AlertKind::NonFiniteLoss,
                format!("loss is {}", m.loss),
            ));
        } else if let Some(alert) = self.loss_spike(m) {
            alerts.push(alert);
        }
        if let Some(alert) = self.throughput_drop(m) {
            alerts.push(alert);
        }
        self.losses.push(m.loss);
        // Throughput joins the window only past this process's warm-up, so start-up steps never
        // become the reference.
        if self.live_steps > self.config.throughput_warmup_steps {
            self.throughput.push(m.tokens_per_s);
        }
        alerts
    }

    /// A finite loss above the window's trend by more than k spreads.
    fn loss_spike(&self, m: &StepMetrics) -> Option<Alert> {
        if self.losses.len() < self.config.loss_min_samples.max(2) {
            return None;
        }
        let (predicted, spread) = self.losses.predict()?;
        let spread = spread
            .max(self.config.loss_min_relative_std * predicted.abs())
            .max(1e-12);
        let threshold = predicted + self.config.loss_spike_sigmas * spread;
        (m.loss > threshold).then(|| {
            Alert::new(
                m.step,
                AlertKind::LossSpike,
                format!(
                    "loss {} above {} (trend of the last {} steps predicts {}, + {}x spread {})",
                    fmt_sig(m.loss),
                    fmt_sig(threshold),
                    self.losses.len(),
                    fmt_sig(predicted),
                    self.config.loss_spike_sigmas,
                    fmt_sig(spread)
                ),
            )
        })
    }

    /// Tokens/s below the drop ratio times the running median, once past the warm-up.
    fn throughput_drop(&self, m: &StepMetrics) -> Option<Alert> {
        if self.live_steps <= self.config.throughput_warmup_steps || !m.tokens_per_s.is_finite() {
            return None;
        }
        let min_samples = (self.config.throughput_window / 5).max(3);
        let ratio = self
            .throughput
            .ratio_to_median(m.tokens_per_s, min_samples)?;
        (ratio < self.config.throughput_drop_ratio).then(|| {
            Alert::new(
                m.step,
                AlertKind::ThroughputDrop,
                format!(
                    "{} tok/s is {:.2}x the running median {} tok/s",
                    fmt_rate(m.tokens_per_s),
                    ratio,
                    fmt_rate(self.throughput.median().unwrap_or(0.0))
                ),
            )
        })
    }

    /// Adds a step to the windows without judging it (replay of a resumed log; the previous
    /// process's steps are valid throughput references).
    fn observe(&mut self, m: &StepMetrics) {
        self.losses.push(m.loss);
        self.throughput.push(m.tokens_per_s);
    }
}

/// How progress is shown.
enum Display {
    Bar(ProgressBar),
    Lines {
        every: u64,
        sink: Box<dyn Write + Send>,
        last_line: Option<Instant>,
    },
    /// No step lines and no summary: only what is given to `println`.
    Notes {
        sink: Box<dyn Write + Send>,
    },
}

/// Progress display plus alert rules for one run.
pub struct Monitor {
    total_steps: u64,
    display: Display,
    /// None when the command judges its own steps.
    rules: Option<AlertRules>,
    alerts: Vec<Alert>,
    start: Instant,
    /// First step of this process (resumed runs start past 0), for the ETA of plain lines.
    first_step: Option<u64>,
    last_step: Option<StepMetrics>,
    /// Alert records raised through the `StepObserver` path, until the trainer takes them.
    pending_records: Vec<MetricRecord>,
    finished: bool,
    throughput_sum: f64,
    throughput_count: u64,
}

/// Plain lines are printed at least this often even between the every-N-steps lines.
const PLAIN_LINE_MAX_GAP: Duration = Duration::from_secs(30);

impl Monitor {
    /// A bar on stderr when it is a terminal and `quiet` is false; otherwise plain lines on stderr
    /// about 20 times over the run.
    pub fn new(total_steps: u64, quiet: bool) -> Monitor {
        if quiet || !std::io::stderr().is_terminal() {
            return Monitor::plain(
                total_steps,
                (total_steps / 20).max(1),
                Box::new(std::io::stderr()),
            );
        }
        let bar = step_bar(total_steps);
        Monitor::with_display(total_steps, Display::Bar(bar))
    }

    /// Plain lines every `every` steps (and on the first and last step) written to `sink`.
    pub fn plain(total_steps: u64, every: u64, sink: Box<dyn Write + Send>) -> Monitor {
        Monitor::with_display(
            total_steps,
            Display::Lines {
                every: every.max(1),
                sink,
                last_line: None,
            },
        )
    }

    /// No step lines and no summary; lines given to [`Monitor::println`] (evaluations, warnings)
    /// still go to `sink`.
    pub fn quiet(total_steps: u64, sink: Box<dyn Write + Send>) -> Monitor {
        Monitor::with_display(total_steps, Display::Notes { sink })
    }

    fn with_display(total_steps: u64, display: Display) -> Monitor {
        Monitor {
            total_steps,
            display,
            rules: Some(AlertRules::new(AlertConfig::default())),
            alerts: Vec::new(),
            start: Instant::now(),
            first_step: None,
            last_step: None,
            pending_records: Vec::new(),
            finished: false,
            throughput_sum: 0.0,
            throughput_count: 0,
        }
    }

    /// Replaces the alert thresholds (before the first step).
    pub fn with_alert_config(mut self, config: AlertConfig) -> Monitor {
        self.rules = Some(AlertRules::new(config));
        self
    }

    /// Turns the shared alert rules off, for a command that judges its own steps and prints its
    /// alerts through [`Monitor::println`]; the summary then counts no alerts.
    pub fn without_alert_rules(mut self) -> Monitor {
        self.rules = None;
        self
    }

    /// Rebuilds the alert windows from the records a resumed run kept, so the alerts of a resumed
    /// run are judged against the same history as an uninterrupted one; moves the bar to the last
    /// step. Prints nothing.
    pub fn replay(&mut self, records: &[MetricRecord]) {
        let mut last = None;
        for record in records {
            if let MetricRecord::Step(m) = record {
                if let Some(rules) = &mut self.rules {
                    rules.observe(m);
                }
                last = Some(m.step);
            }
        }
        if let (Some(step), Display::Bar(bar)) = (last, &self.display) {
            bar.set_position(step);
            bar.reset_eta();
        }
    }

    /// Shows one step; returns its alerts (already printed) for the caller to log.
    pub fn on_step(&mut self, m: &StepMetrics) -> Vec<Alert> {
        self.on_step_with(m, "")
    }

    /// [`Monitor::on_step`] with the objective's own figures after the common ones (`stoke
    /// dpo`'s margin and reward accuracy, say); `detail` may be empty.
    pub fn on_step_with(&mut self, m: &StepMetrics, detail: &str) -> Vec<Alert> {
        let alerts = self
            .rules
            .as_mut()
            .map_or_else(Vec::new, |rules| rules.check(m));
        for alert in &alerts {
            self.println(&format!("[alert] step {}: {}", alert.step, alert.message));
        }
        self.alerts.extend(alerts.iter().cloned());
        let first_step = *self.first_step.get_or_insert(m.step.saturating_sub(1));
        if m.tokens_per_s.is_finite() {
            self.throughput_sum += m.tokens_per_s;
            self.throughput_count += 1;
        }
        let mut figures = format!(
            "loss {} | lr {:.1e} | {} tok/s",
            fmt_loss(m.loss),
            m.lr,
            fmt_rate(m.tokens_per_s)
        );
        if !detail.is_empty() {
            figures = format!("{figures} | {detail}");
        }
        match &mut self.display {
            Display::Bar(bar) => {
                bar.set_position(m.step.min(self.total_steps));
                bar.set_message(figures);
            }
            Display::Lines {
                every,
                sink,
                last_line,
            } => {
                let due = m.step.is_multiple_of(*every)
                    || m.step == first_step + 1
                    || m.step >= self.total_steps
                    || last_line.is_none_or(|t| t.elapsed() >= PLAIN_LINE_MAX_GAP);
                if due {
                    let done = m.step.saturating_sub(first_step) as f64;
                    let remaining = self.total_steps.saturating_sub(m.step) as f64;
                    let eta = self.start.elapsed().as_secs_f64() / done.max(1.0) * remaining;
                    let _ = writeln!(
                        sink,
                        "step {}/{} | {figures} | ETA {}",
                        m.step,
                        self.total_steps,
                        fmt_duration(eta)
                    );
                    *last_line = Some(Instant::now());
                }
            }
            Display::Notes { .. } => {}
        }
        self.last_step = Some(m.clone());
        alerts
    }

    /// Prints an evaluation result above the bar.
    pub fn on_eval(&mut self, m: &EvalMetrics) {
        self.println(&format!(
            "eval step {}: loss {} | {} bits/byte | {} tokens",
            m.step,
            fmt_loss(m.loss),
            fmt_sig(m.bits_per_byte),
            m.tokens
        ));
    }

    /// Prints a line above the bar (or as a plain line), e.g. "checkpoint saved".
    pub fn println(&mut self, line: &str) {
        match &mut self.display {
            Display::Bar(bar) => bar.println(line),
            Display::Lines { sink, .. } | Display::Notes { sink } => {
                let _ = writeln!(sink, "{line}");
            }
        }
    }

    /// Alerts raised so far by this process.
    pub fn alerts(&self) -> &[Alert] {
        &self.alerts
    }

    /// Ends the display with a one-line summary (once; later calls do nothing).
    pub fn finish(&mut self) {
        if std::mem::replace(&mut self.finished, true) {
            return;
        }
        let steps = self.last_step.as_ref().map_or(0, |m| m.step);
        let mean_rate = if self.throughput_count > 0 {
            self.throughput_sum / self.throughput_count as f64
        } else {
            0.0
        };
        let mut summary = format!(
            "done: step {steps}/{} in {} | mean {} tok/s",
            self.total_steps,
            fmt_duration(self.start.elapsed().as_secs_f64()),
            fmt_rate(mean_rate),
        );
        if self.rules.is_some() {
            summary = format!("{summary} | {} alert(s)", self.alerts.len());
        }
        match &mut self.display {
            Display::Bar(bar) => {
                bar.finish();
                bar.println(&summary);
            }
            Display::Lines { sink, .. } => {
                let _ = writeln!(sink, "{summary}");
                let _ = sink.flush();
            }
            Display::Notes { sink } => {
                let _ = sink.flush();
            }
        }
    }
}

/// The trainer drives the monitor through its observer hook; alerts go to the metrics log
/// through `take_alerts`.
impl crate::trainer::StepObserver for Monitor {
    fn on_step(&mut self, _report: &crate::trainer::StepReport, metrics: &StepMetrics) {
        let alerts = Monitor::on_step(self, metrics);
        self.pending_records
            .extend(alerts.iter().map(Alert::to_record));
    }

    fn on_eval(&mut self, metrics: &EvalMetrics) {
        Monitor::on_eval(self, metrics);
    }

    fn on_checkpoint(&mut self, step: u64, path: &std::path::Path) {
        self.println(&format!("checkpoint step {step}: {}", path.display()));
    }

    fn finish(&mut self) {
        Monitor::finish(self);
    }

    fn take_alerts(&mut self) -> Vec<MetricRecord> {
        std::mem::take(&mut self.pending_records)
    }
}

/// Loss with 4 decimals (what a person compares step to step); non-finite values by name.
fn fmt_loss(loss: f64) -> String {
    if loss.is_finite() {
        format!("{loss:.4}")
    } else {
        format!("{loss}")
    }
}

/// A value with 4 significant digits, in exponent form when very small or large.
fn fmt_sig(value: f64) -> String {
    if !value.is_finite() {
        format!("{value}")
    } else {
        crate::metrics::format_significant(value, 1e5)
    }
}

/// Tokens per second as `950`, `12.3k`, `1.25M`.
fn fmt_rate(rate: f64) -> String {
    if !rate.is_finite() {
        format!("{rate}")
    } else if rate >= 1e6 {
        format!("{:.2}M", rate / 1e6)
    } else if rate >= 1e4 {
        format!("{:.1}k", rate / 1e3)
    } else {
        format!("{rate:.0}")
    }
}

/// Seconds as `45s`, `3m07s`, `2h05m`.
fn fmt_duration(seconds: f64) -> String {
    if !seconds.is_finite() || seconds < 0.0 {
        return "?".into();
    }
    let s = seconds.round() as u64;
    match s {
        0..60 => format!("{s}s"),
        60..3600 => format!("{}m{:02}s", s / 60, s % 60),
        _ => format!("{}h{:02}m", s / 3600, (s % 3600) / 60),
    }
}

/// The progress bar of long runs: position, the caller's message, ETA; the bar takes the width
/// that is left, so the figures fit an 80-column terminal.
pub fn step_bar(total: u64) -> ProgressBar {
    let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
    let style =
        ProgressStyle::with_template("{pos}/{len} | {msg} | ETA {eta} {wide_bar:.cyan/blue}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> ");
    bar.set_style(style);
    bar
}
