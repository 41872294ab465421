//! The GRPO run report: one self-contained `OUT/report.html` (inline SVG, no JavaScript, no
//! network), drawn with `stoke_train::report` so it looks like every other stoke report.
//!
//! What it shows: stoke_train's standard summary and curves (loss, learning rate, gradient norm,
//! tokens/s) fed from the GRPO step records, the alerts, then GRPO's own sections: a summary,
//! rewards and correctness, held-out pass@1 / pass@k, KL / entropy / clip fractions / importance
//! ratio, completion lengths and truncation, staleness, time and utilization per module, and a
//! table of the last step.
//! What it is not: it reads no files (the caller passes the records, e.g. from
//! `GrpoMetricsLog::read_all`) and computes nothing beyond summaries of the records.
//!
//! Invariants: a chart is drawn only when some record carries its figure (no KL chart when beta
//! is 0, no held-out chart without evaluations); non-finite values are left out of charts and
//! say "not finite" in tables.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};

use stoke_train::metrics::{MetricRecord, StepMetrics};
use stoke_train::report::{ChartSpec, ReportSection, SectionBody, Series, YScale, write_report};

use crate::error::PipelineError;
use crate::metrics::{
    GrpoEvalRecord, GrpoRecord, GrpoStepRecord, PerModule, StepOutcome, histogram_mean, significant,
};

/// Writes `out_dir/report.html` and returns its path.
pub fn write_grpo_report(
    out_dir: &Path,
    records: &[GrpoRecord],
    title: &str,
) -> Result<PathBuf, PipelineError> {
    let standard = standard_records(records);
    let sections = grpo_sections(records);
    write_report(out_dir, title, &standard, &sections)
        .map_err(|e| PipelineError::from(stoke_train::error::TrainError::from(e)))
}

/// The step records as stoke_train's records (loss, lr, grad norm, tokens/s, alerts), so the
/// standard summary and curves come for free. MFU is not measured for GRPO (NaN: left out).
pub fn standard_records(records: &[GrpoRecord]) -> Vec<MetricRecord> {
    let mut tokens_seen = 0u64;
    let mut out = Vec::new();
    for record in records {
        match record {
            GrpoRecord::Step(s) => {
                tokens_seen += s.tokens;
                out.push(MetricRecord::Step(standard_step(s, tokens_seen)));
            }
            GrpoRecord::Alert { step, message } => out.push(MetricRecord::Alert {
                step: *step,
                message: message.clone(),
            }),
            GrpoRecord::Eval(_) => {}
        }
    }
    out
}

/// One step record's figures as stoke_train's (what the report's curves and the shared monitor
/// read); `tokens_seen` counts this update's tokens.
pub fn standard_step(s: &GrpoStepRecord, tokens_seen: u64) -> StepMetrics {
    let skipped = s.outcome != StepOutcome::Applied;
    StepMetrics::basic(s.step, s.loss, s.lr, s.grad_norm, skipped).with_progress(
        s.tokens_per_s,
        tokens_seen,
        s.elapsed_s,
    )
}

/// GRPO's sections of the report (the speedrun's report can embed them too).
pub fn grpo_sections(records: &[GrpoRecord]) -> Vec<ReportSection> {
    let steps: Vec<&GrpoStepRecord> = records
        .iter()
        .filter_map(|r| match r {
            GrpoRecord::Step(s) => Some(s),
            _ => None,
        })
        .collect();
    let evals: Vec<&GrpoEvalRecord> = records
        .iter()
        .filter_map(|r| match r {
            GrpoRecord::Eval(e) => Some(e),
            _ => None,
        })
        .collect();
    let mut sections = vec![ReportSection {
        title: "GRPO summary".into(),
        body: SectionBody::Table(summary_rows(&steps, &evals)),
        charts: Vec::new(),
    }];
    let step_series = |name: &str, value: &dyn Fn(&GrpoStepRecord) -> f64| {
        Series::new(
            name,
            steps.iter().map(|s| (s.step as f64, value(s))).collect(),
        )
    };
    let chart = |title: &str, y: &str, series: Vec<Series>| {
        ChartSpec::new(title, "step", y, series, YScale::Linear)
    };

    if !steps.is_empty() {
        let mut reward = vec![
            step_series("reward mean", &|s| s.reward_mean),
            step_series("reward std", &|s| s.reward_std),
        ];
        let components: BTreeSet<&String> = steps
            .iter()
            .flat_map(|s| s.reward_components.keys())
            .collect();
        for name in components {
            reward.push(Series::new(
                format!("component {name}"),
                steps
                    .iter()
                    .filter_map(|s| s.reward_components.get(name).map(|v| (s.step as f64, *v)))
                    .collect(),
            ));
        }
        sections.push(ReportSection {
            title: "Rewards".into(),
            body: SectionBody::Empty,
            charts: vec![
                chart("Reward", "reward", reward),
                chart(
                    "Correct fraction (training samples)",
                    "fraction",
                    vec![step_series("correct", &|s| s.correct_fraction)],
                ),
            ],
        });
    }

    if !evals.is_empty() {
        let eval_series = |name: &str, value: fn(&GrpoEvalRecord) -> f64| {
            Series::new(
                name,
                evals.iter().map(|e| (e.step as f64, value(e))).collect(),
            )
        };
        let k = evals.last().map_or(0, |e| e.k);
        sections.push(ReportSection {
            title: "Held-out evaluation".into(),
            body: SectionBody::Empty,
            charts: vec![
                chart(
                    "Held-out pass@1 and pass@k",
                    "pass rate",
                    vec![
                        eval_series("greedy pass@1", |e| e.greedy_pass_at_1),
                        eval_series("pass@1", |e| e.pass_at_1),
                        eval_series(&format!("pass@{k}"), |e| e.pass_at_k),
                    ],
                ),
                chart(
                    "Held-out completion length",
                    "tokens",
                    vec![eval_series("mean length (greedy)", |e| e.mean_length)],
                ),
            ],
        });
    }

    if !steps.is_empty() {
        let mut policy = Vec::new();
        if steps.iter().any(|s| s.kl_mean.is_some()) {
            policy.push(chart(
                "KL to the reference",
                "KL",
                vec![Series::new(
                    "kl mean",
                    steps
                        .iter()
                        .filter_map(|s| s.kl_mean.map(|kl| (s.step as f64, kl)))
                        .collect(),
                )],
            ));
        }
        policy.push(chart(
            "Entropy",
            "nats per token",
            vec![step_series("entropy", &|s| s.entropy_mean)],
        ));
        policy.push(chart(
            "Clip fractions",
            "fraction",
            vec![
                step_series("low", &|s| s.clip_low_fraction),
                step_series("high", &|s| s.clip_high_fraction),
                step_series("region", &|s| s.clip_region_fraction),
            ],
        ));
        if steps.iter().any(|s| s.ratio.is_some()) {
            let ratio_series = |name: &str, value: fn(&crate::metrics::RatioRecord) -> f64| {
                Series::new(
                    name,
                    steps
                        .iter()
                        .filter_map(|s| s.ratio.as_ref().map(|r| (s.step as f64, value(r))))
                        .collect(),
                )
            };
            policy.push(chart(
                "Trainer / rollout importance ratio",
                "ratio",
                vec![
                    ratio_series("mean", |r| r.mean),
                    ratio_series("min", |r| r.min),
                    ratio_series("max", |r| r.max),
                    ratio_series("ESS fraction", |r| r.ess_fraction),
                ],
            ));
        }
        if steps.iter().any(|s| s.ptx_loss.is_some()) {
            policy.push(chart(
                "Pretraining (PTX) loss",
                "loss",
                vec![Series::new(
                    "ptx loss",
                    steps
                        .iter()
                        .filter_map(|s| s.ptx_loss.map(|l| (s.step as f64, l)))
                        .collect(),
                )],
            ));
        }
        sections.push(ReportSection {
            title: "Policy".into(),
            body: SectionBody::Empty,
            charts: policy,
        });

        sections.push(ReportSection {
            title: "Completions".into(),
            body: SectionBody::Empty,
            charts: vec![
                chart(
                    "Completion length",
                    "tokens",
                    vec![
                        step_series("mean", &|s| s.length_mean),
                        step_series("max", &|s| s.length_max as f64),
                    ],
                ),
                chart(
                    "Truncated completions",
                    "fraction",
                    vec![step_series("hit max_new_tokens", &|s| s.truncated_fraction)],
                ),
            ],
        });

        // Multi-turn runs: what the episodes did, and the reward-hacking monitors.
        if steps.iter().any(|s| s.episodes.is_some()) {
            let episode =
                |s: &GrpoStepRecord, f: fn(&crate::metrics::EpisodeBatchRecord) -> f64| {
                    s.episodes.as_ref().map_or(0.0, f)
                };
            sections.push(ReportSection {
                title: "Episodes".into(),
                body: SectionBody::Empty,
                charts: vec![
                    chart(
                        "Turns and tool calls per episode",
                        "count",
                        vec![
                            step_series("model turns", &|s| episode(s, |e| e.turns_mean)),
                            step_series("tool calls", &|s| episode(s, |e| e.tool_calls_mean)),
                        ],
                    ),
                    chart(
                        "Tokens per update",
                        "tokens",
                        vec![
                            step_series("model (trained)", &|s| {
                                episode(s, |e| e.model_tokens as f64)
                            }),
                            step_series("environment (masked)", &|s| {
                                episode(s, |e| e.env_tokens as f64)
                            }),
                        ],
                    ),
                    chart(
                        "Reward-hacking monitors",
                        "count",
                        vec![
                            step_series("calls touching the grader", &|s| {
                                episode(s, |e| e.touched_grader as f64)
                            }),
                            step_series("correct without the required tool", &|s| {
                                episode(s, |e| e.correct_without_tool as f64)
                            }),
                            step_series("failed tool calls", &|s| {
                                episode(s, |e| e.tool_failures as f64)
                            }),
                        ],
                    ),
                    chart(
                        "Time in the environment",
                        "seconds",
                        vec![
                            step_series("environment", &|s| episode(s, |e| e.env_seconds)),
                            step_series("tools", &|s| episode(s, |e| e.tool_seconds)),
                        ],
                    ),
                ],
            });
        }

        let deepest = steps
            .iter()
            .map(|s| s.staleness_histogram.len())
            .max()
            .unwrap_or(0);
        let mut staleness = vec![step_series("mean versions behind", &|s| {
            histogram_mean(&s.staleness_histogram)
        })];
        for d in 0..deepest.min(6) {
            staleness.push(step_series(&format!("share {d} behind"), &move |s| {
                let total: u64 = s.staleness_histogram.iter().sum();
                let count = s.staleness_histogram.get(d).copied().unwrap_or(0);
                if total == 0 {
                    0.0
                } else {
                    count as f64 / total as f64
                }
            }));
        }
        sections.push(ReportSection {
            title: "Staleness".into(),
            body: SectionBody::Text(
                "Versions between the weights that generated a sample's oldest token and the \
                 weights the update started from (0: on-policy)."
                    .into(),
            ),
            charts: vec![chart("Staleness", "versions / share", staleness)],
        });

        // One series per module of a per-module figure.
        let per_module = |figures: &dyn Fn(&GrpoStepRecord) -> PerModule| -> Vec<Series> {
            PerModule::NAMES
                .iter()
                .enumerate()
                .map(|(i, name)| step_series(name, &|s| figures(s).values()[i]))
                .collect()
        };
        let mut seconds = per_module(&|s| s.seconds.busy);
        seconds.push(step_series("trainer waiting", &|s| s.seconds.waiting));
        sections.push(ReportSection {
            title: "Modules".into(),
            body: SectionBody::Empty,
            charts: vec![
                chart("Seconds per module per step", "seconds", seconds),
                chart(
                    "Utilization per module",
                    "busy share",
                    per_module(&|s| s.utilization),
                ),
                chart(
                    "Samples per second",
                    "samples/s",
                    vec![step_series("samples/s", &|s| s.samples_per_s)],
                ),
            ],
        });
    }

    if let Some(last) = steps.iter().max_by_key(|s| s.step) {
        sections.push(ReportSection {
            title: format!("Last step ({})", last.step),
            body: SectionBody::Table(last_step_rows(last)),
            charts: Vec::new(),
        });
    }
    sections
}

fn value(v: f64) -> String {
    if v.is_finite() {
        significant(v)
    } else {
        "not finite".into()
    }
}

fn percent(v: f64) -> String {
    if v.is_finite() {
        format!("{:.1}%", 100.0 * v)
    } else {
        "not finite".into()
    }
}

fn summary_rows(steps: &[&GrpoStepRecord], evals: &[&GrpoEvalRecord]) -> Vec<(String, String)> {
    let mut rows = Vec::new();
    let mut row = |key: &str, text: String| rows.push((key.to_string(), text));
    if let (Some(first), Some(last)) = (steps.first(), steps.iter().max_by_key(|s| s.step)) {
        row("updates", last.step.to_string());
        row(
            "reward mean (first -> last step)",
            format!(
                "{} -> {}",
                value(first.reward_mean),
                value(last.reward_mean)
            ),
        );
        if let Some(best) = steps
            .iter()
            .filter(|s| s.reward_mean.is_finite())
            .max_by(|a, b| a.reward_mean.total_cmp(&b.reward_mean))
        {
            row(
                "best reward mean",
                format!("{} (step {})", value(best.reward_mean), best.step),
            );
        }
        row(
            "correct fraction (first -> last step)",
            format!(
                "{} -> {}",
                percent(first.correct_fraction),
                percent(last.correct_fraction)
            ),
        );
        let samples: usize = steps.iter().map(|s| s.samples).sum();
        row("samples trained on", samples.to_string());
        let dropped: usize = steps.iter().map(|s| s.groups_dropped).sum();
        row("groups dropped (equal rewards)", dropped.to_string());
        let skipped = steps
            .iter()
            .filter(|s| s.outcome != StepOutcome::Applied)
            .count();
        row("skipped updates", skipped.to_string());
        let mut failures = std::collections::BTreeMap::<&str, u64>::new();
        for s in steps {
            for (kind, count) in &s.reward_failures {
                *failures.entry(kind.as_str()).or_default() += count;
            }
        }
        row(
            "reward failures",
            if failures.is_empty() {
                "none".into()
            } else {
                failures
                    .iter()
                    .map(|(kind, count)| format!("{kind} {count}"))
                    .collect::<Vec<_>>()
                    .join(", ")
            },
        );
        let mut histogram = Vec::<u64>::new();
        for s in steps {
            if histogram.len() < s.staleness_histogram.len() {
                histogram.resize(s.staleness_histogram.len(), 0);
            }
            for (d, count) in s.staleness_histogram.iter().enumerate() {
                histogram[d] += count;
            }
        }
        row(
            "mean staleness (versions)",
            format!("{:.3}", histogram_mean(&histogram)),
        );
        let rates: Vec<f64> = steps
            .iter()
            .map(|s| s.samples_per_s)
            .filter(|v| v.is_finite())
            .collect();
        if !rates.is_empty() {
            row(
                "mean samples/s",
                format!("{:.2}", rates.iter().sum::<f64>() / rates.len() as f64),
            );
        }
    }
    if let (Some(first), Some(last)) = (evals.first(), evals.iter().max_by_key(|e| e.step)) {
        row(
            "held-out greedy pass@1 (first -> last eval)",
            format!(
                "{} (step {}) -> {} (step {})",
                percent(first.greedy_pass_at_1),
                first.step,
                percent(last.greedy_pass_at_1),
                last.step
            ),
        );
        row(
            &format!("held-out pass@1 / pass@{} (last eval)", last.k),
            format!("{} / {}", percent(last.pass_at_1), percent(last.pass_at_k)),
        );
        row("held-out problems", last.problems.to_string());
    }
    if rows.is_empty() {
        rows.push(("records".into(), "none".into()));
    }
    rows
}

fn last_step_rows(s: &GrpoStepRecord) -> Vec<(String, String)> {
    let mut rows: Vec<(String, String)> = vec![
        ("policy version".into(), s.policy_version.to_string()),
        ("outcome".into(), s.outcome.name().into()),
        ("reward mean".into(), value(s.reward_mean)),
        ("reward std".into(), value(s.reward_std)),
        ("correct fraction".into(), percent(s.correct_fraction)),
        (
            "groups / samples".into(),
            format!("{} / {}", s.groups, s.samples),
        ),
        ("loss".into(), value(s.loss)),
        ("grad norm".into(), value(s.grad_norm)),
        ("lr".into(), value(s.lr)),
        ("kl mean".into(), s.kl_mean.map_or("off".into(), value)),
        ("entropy".into(), value(s.entropy_mean)),
        (
            "clip low / high / region".into(),
            format!(
                "{} / {} / {}",
                percent(s.clip_low_fraction),
                percent(s.clip_high_fraction),
                percent(s.clip_region_fraction)
            ),
        ),
        (
            "length mean / max".into(),
            format!("{:.1} / {}", s.length_mean, s.length_max),
        ),
        ("truncated".into(), percent(s.truncated_fraction)),
        (
            "staleness histogram".into(),
            format!("{:?}", s.staleness_histogram),
        ),
        (
            "seconds rollout / reward / inference / trainer / waiting".into(),
            format!(
                "{:.2} / {:.2} / {:.2} / {:.2} / {:.2}",
                s.seconds.busy.rollout,
                s.seconds.busy.reward,
                s.seconds.busy.inference,
                s.seconds.busy.trainer,
                s.seconds.waiting
            ),
        ),
        ("tokens/s".into(), format!("{:.1}", s.tokens_per_s)),
        ("samples/s".into(), format!("{:.2}", s.samples_per_s)),
        ("temperature".into(), value(s.temperature)),
        ("elapsed".into(), format!("{:.1} s", s.elapsed_s)),
    ];
    for (name, mean) in &s.reward_components {
        rows.push((format!("component {name}"), value(*mean)));
    }
    for (kind, count) in &s.reward_failures {
        rows.push((format!("reward failures: {kind}"), count.to_string()));
    }
    for (outcome, count) in &s.outcomes {
        rows.push((format!("verdict {outcome}"), count.to_string()));
    }
    rows
}
