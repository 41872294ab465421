//! What a person watching a GRPO run sees: a progress bar on a terminal (`step/total | reward |
//! correct | s/step | ETA`), or one plain line every few updates when stderr is not a terminal or
//! the run is quiet (quiet runs print only evaluations and warnings).
//!
//! What it is not: the metrics log (every figure goes to `metrics.jsonl`) or an alert rule set;
//! printing never fails a run.

use std::io::IsTerminal;
use std::time::Duration;

use indicatif::{ProgressBar, ProgressDrawTarget, ProgressStyle};

/// Plain-line mode prints every this many updates (and the first and last).
const PLAIN_EVERY: u64 = 5;

pub struct Progress {
    bar: Option<ProgressBar>,
    total: u64,
    quiet: bool,
}

/// The figures of one update shown to the user.
#[derive(Clone, Copy, Debug, Default)]
pub struct ProgressLine {
    pub step: u64,
    pub reward_mean: f64,
    pub correct_fraction: f64,
    pub kl: Option<f64>,
    pub seconds_per_step: f64,
    pub samples_per_second: f64,
    pub skipped: bool,
}

impl Progress {
    pub fn new(first_step: u64, total: u64, quiet: bool) -> Progress {
        let bar = (!quiet && std::io::stderr().is_terminal()).then(|| {
            let bar = ProgressBar::with_draw_target(Some(total), ProgressDrawTarget::stderr());
            let style =
                ProgressStyle::with_template("grpo {pos}/{len} [{bar:30}] {msg} | ETA {eta}")
                    .unwrap_or_else(|_| ProgressStyle::default_bar())
                    .progress_chars("=> ");
            bar.set_style(style);
            bar.set_position(first_step);
            bar.enable_steady_tick(Duration::from_millis(500));
            bar
        });
        Progress { bar, total, quiet }
    }

    pub fn step(&self, line: &ProgressLine) {
        let kl = line
            .kl
            .map(|kl| format!(" | kl {kl:.4}"))
            .unwrap_or_default();
        let skipped = if line.skipped {
            " | SKIPPED (non-finite)"
        } else {
            ""
        };
        let text = format!(
            "reward {:.3} | correct {:.1}%{kl} | {:.2} s/step | {:.1} samples/s{skipped}",
            line.reward_mean,
            100.0 * line.correct_fraction,
            line.seconds_per_step,
            line.samples_per_second,
        );
        match &self.bar {
            Some(bar) => {
                bar.set_position(line.step);
                bar.set_message(text);
            }
            None if !self.quiet
                && (line.step == 1
                    || line.step.is_multiple_of(PLAIN_EVERY)
                    || line.step == self.total) =>
            {
                eprintln!("grpo step {}/{} | {text}", line.step, self.total);
            }
            None => {}
        }
    }

    /// A line shown in every mode (evaluations, warnings, checkpoints).
    pub fn note(&self, text: &str) {
        match &self.bar {
            Some(bar) => bar.println(text),
            None => eprintln!("{text}"),
        }
    }

    pub fn finish(&self) {
        if let Some(bar) = &self.bar {
            bar.finish_and_clear();
        }
    }
}
