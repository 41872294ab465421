//! The reward pool under failure: verifiers that panic or hang next to good samples, group-level
//! rewards, a reward index out of range, and real `stoke_reward` rewards built from config.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use stoke_pipeline::reward::{RewardPool, RewardSpec};
use stoke_pipeline::{
    GenerationPermit, GroupTicket, RewardFailure, RolloutGroup, Sample, ScoredGroup, Task,
};
use stoke_reward::{
    Details, Outcome, Reference, RewardConfig, RewardInput, RewardOutcome, Verifier,
};
use stoke_rollout::FinishReason;

/// How long the hanging verifier sleeps: far past every timeout used here.
const HANG: Duration = Duration::from_secs(30);
/// Long enough that a loaded 2-core CI machine schedules a good verifier in time.
const TIMEOUT: Duration = Duration::from_millis(500);

/// The scripted panics are expected: the default hook would print each with a backtrace (when
/// RUST_BACKTRACE is set), and symbolizing it can take longer than the timeout itself, turning
/// a panic into a timeout. Panics on the pool's worker threads print one line instead; every
/// other thread keeps the default hook.
fn quiet_worker_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let on_worker = std::thread::current()
                .name()
                .is_some_and(|name| name.starts_with("stoke-reward-"));
            if on_worker {
                eprintln!("reward worker panicked (expected in this test): {info}");
            } else {
                default_hook(info);
            }
        }));
    });
}

/// Scores by the completion text: "panic" panics, "hang" sleeps for `HANG`, anything else is
/// correct exactly when it equals the reference answer.
struct Scripted;

impl Verifier for Scripted {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        match input.completion {
            "panic" => panic!("scripted verifier exploded"),
            "hang" => {
                std::thread::sleep(HANG);
                RewardOutcome::correct(Details::default())
            }
            text if Some(text) == input.reference.answer.as_deref() => {
                RewardOutcome::correct(Details::default())
            }
            _ => RewardOutcome::wrong(Details::default()),
        }
    }
}

/// A group-level reward that counts its calls and scores each sample by its rank in length
/// within the group (0 for the shortest), which only a whole-group call can know.
#[derive(Default)]
struct LengthRank {
    group_calls: AtomicUsize,
}

impl Verifier for LengthRank {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        self.score_group(std::slice::from_ref(input)).remove(0)
    }

    fn score_group(&self, group: &[RewardInput<'_>]) -> Vec<RewardOutcome> {
        self.group_calls.fetch_add(1, Ordering::SeqCst);
        group
            .iter()
            .map(|input| {
                let rank = group
                    .iter()
                    .filter(|other| other.completion_tokens < input.completion_tokens)
                    .count();
                RewardOutcome::shaped(rank as f64, Details::default())
            })
            .collect()
    }
}

fn spec(name: &str, verifier: Arc<dyn Verifier>, group_level: bool) -> RewardSpec {
    quiet_worker_panics();
    RewardSpec {
        name: name.into(),
        verifier,
        group_level,
        dense_process: false,
    }
}

fn group(answer: &str, completions: &[&str], reward: usize) -> RolloutGroup {
    let task = Task {
        id: "task-0".into(),
        prompt: "What is 2 + 2?".into(),
        prompt_ids: vec![1, 2, 3],
        reference: Reference {
            answer: Some(answer.into()),
            ..Reference::default()
        },
        reward,
        data: Default::default(),
    };
    let samples = completions
        .iter()
        .map(|text| {
            // One token per character, so lengths differ with the text.
            let len = text.len().max(1);
            Sample {
                completion_ids: vec![5; len],
                rollout_logprobs: vec![-1.0; len],
                token_versions: vec![Default::default(); len],
                loss_mask: None,
                episode: None,
                text: text.to_string(),
                finish: FinishReason::Length,
            }
        })
        .collect();
    RolloutGroup {
        ticket: GroupTicket {
            group_id: 0,
            task: Arc::new(task),
            permit: GenerationPermit {
                policy_version: Default::default(),
                update_slot: 0,
                permit_index: 0,
            },
            temperature: 1.0,
        },
        samples,
        generate_seconds: 0.0,
    }
}

fn scores(scored: &ScoredGroup) -> Vec<f64> {
    scored.rewards.iter().map(|r| r.score).collect()
}

#[test]
fn panicking_and_hanging_verifiers_fail_alone_and_promptly() {
    let pool = RewardPool::new(
        vec![spec("scripted", Arc::new(Scripted), false)],
        4,
        TIMEOUT,
    )
    .expect("pool");
    let started = Instant::now();
    let scored = pool.score(group("4", &["4", "panic", "hang", "5"], 0));
    let elapsed = started.elapsed();
    // The hang is abandoned at the timeout: the call returns long before the verifier would.
    assert!(
        elapsed < Duration::from_secs(3),
        "score took {elapsed:?} with a {HANG:?} hang"
    );
    assert!(
        elapsed >= TIMEOUT,
        "returned before the timeout: {elapsed:?}"
    );

    let rewards = &scored.rewards;
    assert_eq!(rewards.len(), 4);
    assert_eq!(
        (rewards[0].score, rewards[0].outcome),
        (1.0, Outcome::Correct)
    );
    assert_eq!(rewards[0].failure, None);
    assert_eq!(
        rewards[1].failure,
        Some(RewardFailure::Panicked("scripted verifier exploded".into()))
    );
    assert_eq!(
        (rewards[1].score, rewards[1].outcome),
        (0.0, Outcome::SandboxError)
    );
    assert_eq!(rewards[2].failure, Some(RewardFailure::TimedOut));
    assert_eq!(
        (rewards[2].score, rewards[2].outcome),
        (0.0, Outcome::Timeout)
    );
    assert_eq!(
        (rewards[3].score, rewards[3].outcome),
        (0.0, Outcome::Wrong)
    );
    assert_eq!(rewards[3].failure, None);

    let stats = pool.stats();
    assert_eq!(
        (
            stats.scored,
            stats.panics,
            stats.timeouts,
            stats.abandoned_workers
        ),
        (2, 1, 1, 1)
    );
    assert!(stats.busy_seconds >= TIMEOUT.as_secs_f64() * 0.9);
    assert_eq!(pool.live_workers(), 4, "the hung worker is replaced");

    // The pool keeps working, panics included, with the hung thread still asleep.
    let again = pool.score(group("4", &["4", "4", "panic", "3"], 0));
    assert_eq!(scores(&again), vec![1.0, 1.0, 0.0, 0.0]);
    assert_eq!(pool.stats().scored, 5);
    assert_eq!(pool.stats().panics, 2);
}

#[test]
fn a_single_worker_stuck_on_a_hang_is_replaced_and_the_rest_is_scored() {
    let pool = RewardPool::new(
        vec![spec("scripted", Arc::new(Scripted), false)],
        1,
        TIMEOUT,
    )
    .expect("pool");
    let started = Instant::now();
    // The hang comes first, so with one worker the good samples queue behind it.
    let scored = pool.score(group("4", &["hang", "4", "4"], 0));
    assert!(started.elapsed() < Duration::from_secs(3));
    assert_eq!(scored.rewards[0].failure, Some(RewardFailure::TimedOut));
    // Time spent queued is not charged to a job: the good ones run on the replacement.
    assert_eq!(scores(&scored)[1..], [1.0, 1.0]);
    assert_eq!(pool.live_workers(), 1);
    assert_eq!(pool.stats().abandoned_workers, 1);
}

#[test]
fn group_level_rewards_see_the_whole_group_in_one_call() {
    let verifier = Arc::new(LengthRank::default());
    let pool = RewardPool::new(
        vec![spec("rank", verifier.clone(), true)],
        3,
        Duration::from_secs(10),
    )
    .expect("pool");
    let scored = pool.score(group("", &["aaa", "a", "aaaaa", "aa"], 0));
    assert_eq!(scores(&scored), vec![2.0, 0.0, 3.0, 1.0]);
    assert_eq!(verifier.group_calls.load(Ordering::SeqCst), 1);
    assert_eq!(pool.stats().scored, 4);
}

#[test]
fn a_hanging_group_level_reward_times_out_every_sample_of_the_group() {
    let pool = RewardPool::new(vec![spec("scripted", Arc::new(Scripted), true)], 2, TIMEOUT)
        .expect("pool");
    let scored = pool.score(group("4", &["4", "hang"], 0));
    assert!(
        scored
            .rewards
            .iter()
            .all(|r| r.failure == Some(RewardFailure::TimedOut))
    );
    assert_eq!(pool.stats().timeouts, 2);
    assert_eq!(pool.stats().abandoned_workers, 1);
}

#[test]
fn a_reward_index_out_of_range_fails_the_samples_without_panicking() {
    let pool = RewardPool::new(
        vec![spec("scripted", Arc::new(Scripted), false)],
        1,
        TIMEOUT,
    )
    .expect("pool");
    let scored = pool.score(group("4", &["4", "4"], 3));
    assert_eq!(scored.rewards.len(), 2);
    for reward in &scored.rewards {
        assert_eq!(reward.score, 0.0);
        match &reward.failure {
            Some(RewardFailure::Panicked(reason)) => {
                assert!(reason.contains("reward index 3"), "{reason}")
            }
            other => panic!("expected a failure naming the index, got {other:?}"),
        }
    }
    assert_eq!(pool.stats().unknown_reward, 2);
    assert_eq!(pool.stats().scored, 0);
}

#[test]
fn exact_match_from_config_scores_gsm8k_answers() {
    let config: RewardConfig =
        serde_json::from_str(r#"{"kind": "exact_match", "mode": "gsm8k"}"#).expect("config");
    let reward = config.build(None).expect("reward builds");
    let spec = RewardSpec::from_reward("default".into(), reward);
    assert!(!spec.group_level);
    let pool = RewardPool::new(vec![spec], 2, Duration::from_secs(10)).expect("pool");
    let scored = pool.score(group(
        "#### 4",
        &["2 + 2 = 4\n#### 4", "#### 5", "no number"],
        0,
    ));
    let outcomes: Vec<Outcome> = scored.rewards.iter().map(|r| r.outcome).collect();
    assert_eq!(scores(&scored), vec![1.0, 0.0, 0.0]);
    assert_eq!(outcomes[..2], [Outcome::Correct, Outcome::Wrong]);
    assert!(scored.reward_seconds >= 0.0);
}

#[test]
fn composite_rewards_report_components_and_run_as_one_group_job() {
    let config: RewardConfig = serde_json::from_str(
        r#"{"kind": "composite", "components": [
            {"name": "accuracy", "correctness": true, "reward": {"kind": "exact_match", "mode": "gsm8k"}},
            {"name": "length", "weight": 0.5, "reward": {"kind": "group_length"}}
        ]}"#,
    )
    .expect("config");
    let spec = RewardSpec::from_reward("shaped".into(), config.build(None).expect("builds"));
    assert!(
        spec.group_level,
        "group_length makes the composite group-level"
    );
    let pool = RewardPool::new(vec![spec], 2, Duration::from_secs(10)).expect("pool");
    // Token counts follow text length: the short correct answer gets the length bonus.
    let scored = pool.score(group("#### 4", &["#### 4", "so the answer: #### 4"], 0));
    let short = &scored.rewards[0];
    let long = &scored.rewards[1];
    let names: Vec<&str> = short.components.iter().map(|(n, _)| n.as_str()).collect();
    assert_eq!(names, ["accuracy", "length"]);
    assert_eq!(short.components[1].1, 0.5);
    assert_eq!(long.components[1].1, -0.5);
    assert!(short.score > long.score);
    assert!(short.correct() && long.correct());
}

#[test]
fn several_threads_can_score_on_one_pool() {
    let pool = RewardPool::new(
        vec![spec("scripted", Arc::new(Scripted), false)],
        3,
        TIMEOUT,
    )
    .expect("pool");
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..4)
            .map(|_| scope.spawn(|| pool.score(group("4", &["4", "x", "4"], 0))))
            .collect();
        for handle in handles {
            let scored = handle.join().expect("caller thread");
            assert_eq!(scores(&scored), vec![1.0, 0.0, 1.0]);
        }
    });
    assert_eq!(pool.stats().scored, 12);
    pool.shutdown();
}

#[test]
fn shutting_down_does_not_wait_for_an_abandoned_verifier() {
    let pool = RewardPool::new(
        vec![spec("scripted", Arc::new(Scripted), false)],
        2,
        TIMEOUT,
    )
    .expect("pool");
    let scored = pool.score(group("4", &["hang"], 0));
    assert_eq!(scored.rewards[0].failure, Some(RewardFailure::TimedOut));
    let started = Instant::now();
    pool.shutdown();
    assert!(
        started.elapsed() < Duration::from_secs(3),
        "shutdown joined the hung thread: {:?}",
        started.elapsed()
    );
}
