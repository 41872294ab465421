//! GRPO metrics: batch statistics of hand-made groups, and the JSONL log (round trip, NaN,
//! truncation on resume, torn tail).

use std::io::Write;
use std::sync::Arc;

use stoke_pipeline::metrics::{
    GrpoEvalRecord, GrpoMetricsLog, GrpoRecord, GrpoStepRecord, StepOutcome, batch_stats,
};
use stoke_pipeline::{
    GenerationPermit, GroupTicket, PolicyVersion, RewardFailure, RolloutGroup, Sample,
    SampleReward, ScoredGroup, Task,
};
use stoke_reward::{Outcome, Reference};
use stoke_rollout::FinishReason;

fn ticket(version: u64) -> GroupTicket {
    GroupTicket {
        group_id: 0,
        task: Arc::new(Task {
            id: "t".into(),
            prompt: "p".into(),
            prompt_ids: vec![1, 2],
            reference: Reference::default(),
            reward: 0,
            data: Default::default(),
        }),
        permit: GenerationPermit {
            policy_version: PolicyVersion(version),
            update_slot: version,
            permit_index: 0,
        },
        temperature: 1.0,
    }
}

/// A sample of `len` tokens whose tokens came from `versions` (repeated to the length).
fn sample(len: usize, first_version: u64, finish: FinishReason) -> Sample {
    Sample {
        completion_ids: vec![5; len],
        rollout_logprobs: vec![-1.0; len],
        token_versions: vec![PolicyVersion(first_version); len],
        loss_mask: None,
        episode: None,
        text: "x".repeat(len),
        finish,
    }
}

fn reward(score: f64, outcome: Outcome) -> SampleReward {
    SampleReward {
        score,
        outcome,
        components: vec![("format".into(), score / 2.0)],
        failure: None,
        judge: None,
        steps: None,
    }
}

fn group(samples: Vec<Sample>, rewards: Vec<SampleReward>, version: u64) -> ScoredGroup {
    ScoredGroup::new(
        RolloutGroup {
            ticket: ticket(version),
            samples,
            generate_seconds: 0.5,
        },
        rewards,
        0.25,
    )
}

#[test]
fn batch_stats_of_hand_made_groups() {
    let a = group(
        vec![
            sample(4, 3, FinishReason::Eos { token_id: 2 }),
            sample(8, 3, FinishReason::Length),
        ],
        vec![reward(1.0, Outcome::Correct), reward(0.0, Outcome::Wrong)],
        3,
    );
    let b = group(
        vec![
            sample(2, 2, FinishReason::Eos { token_id: 2 }),
            sample(0, 2, FinishReason::Eos { token_id: 2 }),
        ],
        vec![
            reward(0.0, Outcome::Wrong),
            SampleReward::failed(RewardFailure::TimedOut),
        ],
        2,
    );
    let stats = batch_stats(&[a, b], PolicyVersion(3));
    assert_eq!(stats.groups, 2);
    assert_eq!(stats.samples, 4);
    assert!((stats.reward_mean - 0.25).abs() < 1e-12);
    // Population std of [1, 0, 0, 0]: sqrt(0.1875).
    assert!((stats.reward_std - 0.1875f64.sqrt()).abs() < 1e-12);
    assert!((stats.correct_fraction - 0.25).abs() < 1e-12);
    assert_eq!(stats.tokens, 14);
    assert!((stats.length_mean - 3.5).abs() < 1e-12);
    assert_eq!(stats.length_max, 8);
    assert!((stats.truncated_fraction - 0.25).abs() < 1e-12);
    // Group a: versions 3 (0 behind); group b: version 2 (1 behind), the empty sample falls
    // back to its permit's version.
    assert_eq!(stats.staleness_histogram, vec![2, 2]);
    assert!((stats.staleness_mean() - 0.5).abs() < 1e-12);
    assert_eq!(stats.reward_failures.get("timed_out"), Some(&1));
    assert_eq!(stats.outcomes.get("wrong"), Some(&2));
    assert_eq!(stats.outcomes.get("timeout"), Some(&1));
    // The failed sample reports no component: mean over the three that do.
    assert!((stats.reward_components["format"] - 0.5 / 3.0).abs() < 1e-12);
    // Group b's rewards are all 0: one equal-reward group.
    assert_eq!(stats.equal_reward_groups, 1);
    assert!((stats.rollout_seconds - 1.0).abs() < 1e-12);
    assert!((stats.reward_seconds - 0.5).abs() < 1e-12);

    let mut record = GrpoStepRecord::default();
    stats.apply_to(&mut record);
    assert_eq!(record.samples, 4);
    assert_eq!(record.staleness_histogram, vec![2, 2]);
}

#[test]
fn batch_stats_of_nothing_is_zero() {
    let stats = batch_stats(&[], PolicyVersion(0));
    assert_eq!(stats.samples, 0);
    assert_eq!(stats.reward_mean, 0.0);
    assert!(stats.staleness_histogram.is_empty());
}

fn step(step: u64, loss: f64) -> GrpoRecord {
    GrpoRecord::Step(GrpoStepRecord {
        step,
        policy_version: step,
        loss,
        kl_mean: Some(0.01),
        reward_mean: 0.5,
        staleness_histogram: vec![3, 1],
        ..GrpoStepRecord::default()
    })
}

fn eval(step: u64) -> GrpoRecord {
    GrpoRecord::Eval(GrpoEvalRecord {
        step,
        greedy_pass_at_1: 0.25,
        pass_at_1: 0.2,
        pass_at_k: 0.6,
        k: 4,
        problems: 8,
        mean_length: 12.0,
        seconds: 1.5,
        turns_mean: (step > 0).then_some(2.5),
        tool_calls_mean: (step > 0).then_some(1.25),
        tool_use_rate: (step > 0).then_some(0.75),
        env_outcome_mean: (step > 0).then_some(0.5),
    })
}

#[test]
fn log_round_trips_records_including_nan() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let records = vec![
        eval(0),
        step(1, 0.5),
        step(2, f64::NAN),
        GrpoRecord::Alert {
            step: 2,
            message: "non-finite loss".into(),
        },
    ];
    let mut log = GrpoMetricsLog::open(&path, None).unwrap();
    for record in &records {
        log.append(record).unwrap();
    }
    log.flush().unwrap();
    let read = GrpoMetricsLog::read_all(&path).unwrap();
    assert_eq!(read.len(), 4);
    assert_eq!(read[0], records[0]);
    assert_eq!(read[1], records[1]);
    match &read[2] {
        GrpoRecord::Step(s) => {
            assert!(s.loss.is_nan());
            assert_eq!(s.outcome, StepOutcome::Applied);
        }
        other => panic!("expected a step, got {other:?}"),
    }
    assert_eq!(read[3], records[3]);
}

#[test]
fn resume_truncates_after_the_checkpoint_step_and_a_torn_tail() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let mut log = GrpoMetricsLog::open(&path, None).unwrap();
    for record in [eval(0), step(1, 1.0), step(2, 0.9), eval(2), step(3, 0.8)] {
        log.append(&record).unwrap();
    }
    drop(log);
    // A kill in the middle of a write leaves half a line.
    let mut file = std::fs::OpenOptions::new()
        .append(true)
        .open(&path)
        .unwrap();
    file.write_all(br#"{"kind":"step","step":4,"los"#).unwrap();
    drop(file);

    let mut log = GrpoMetricsLog::open(&path, Some(2)).unwrap();
    log.append(&step(3, 0.7)).unwrap();
    let steps: Vec<u64> = GrpoMetricsLog::read_all(&path)
        .unwrap()
        .iter()
        .map(GrpoRecord::step)
        .collect();
    assert_eq!(steps, [0, 1, 2, 2, 3]);
}

#[test]
fn a_bad_line_in_the_middle_is_an_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("metrics.jsonl");
    let first = serde_json::to_string(&step(1, 1.0)).unwrap();
    std::fs::write(&path, format!("{first}\nnot json\n{first}\n")).unwrap();
    match GrpoMetricsLog::read_all(&path) {
        Err(stoke_train::metrics::MetricsError::BadLine { line, .. }) => assert_eq!(line, 2),
        other => panic!("expected a line error, got {other:?}"),
    }
}

#[test]
fn console_line_names_the_figures() {
    let GrpoRecord::Step(mut record) = step(3, 0.25) else {
        unreachable!()
    };
    record.reward_failures.insert("panicked".into(), 2);
    record.outcome = StepOutcome::SkippedNonFinite;
    let line = record.console_line(10);
    assert!(line.starts_with("step 3/10 reward 0.5000"), "{line}");
    assert!(line.contains("stale 0.25"), "{line}");
    assert!(line.contains("reward failures 2"), "{line}");
    assert!(line.contains("skipped_non_finite"), "{line}");
}

#[test]
fn report_writes_html_with_the_chart_titles() {
    let dir = tempfile::tempdir().unwrap();
    let mut records = vec![eval(0)];
    for s in 1..=4u64 {
        let GrpoRecord::Step(mut record) = step(s, 0.5 / s as f64) else {
            unreachable!()
        };
        record.tokens = 100;
        record
            .reward_components
            .insert("format".into(), 0.1 * s as f64);
        record.reward_failures.insert("panicked".into(), 1);
        records.push(GrpoRecord::Step(record));
    }
    records.push(eval(4));
    records.push(GrpoRecord::Alert {
        step: 3,
        message: "reward worker <panicked>".into(),
    });
    let path =
        stoke_pipeline::report::write_grpo_report(dir.path(), &records, "grpo <tiny>").unwrap();
    assert_eq!(path, dir.path().join("report.html"));
    let html = std::fs::read_to_string(&path).unwrap();
    for title in [
        "Reward",
        "Correct fraction (training samples)",
        "Held-out pass@1 and pass@k",
        "KL to the reference",
        "Entropy",
        "Clip fractions",
        "Completion length",
        "Truncated completions",
        "Staleness",
        "Seconds per module per step",
        "Utilization per module",
        "Throughput",
        "Last step (4)",
    ] {
        assert!(html.contains(title), "missing {title:?}");
    }
    // Titles and messages from records are escaped.
    assert!(html.contains("grpo &lt;tiny&gt;"));
    assert!(html.contains("reward worker &lt;panicked&gt;"));
    assert!(
        html.contains("panicked 4"),
        "failures are summed over steps"
    );
    // No ratio records, no ratio chart.
    assert!(!html.contains("importance ratio"));
}
