//! The reward server and the remote reward module, in process on loopback ports:
//! - a remote verdict is the local pool's verdict, components, panics and timeouts included;
//! - bad requests get a 4xx naming the field, and the server keeps serving;
//! - a dead server in the pool is skipped: the group is scored once by another, the retry and the
//!   failure are counted, and the dead server leaves rotation;
//! - a server without one of the run's rewards is refused before the first step;
//! - with every server gone, scoring is an error (the run stops), not silent zeros.

use std::sync::Arc;
use std::time::Duration;

use serde_json::json;
use stoke_pipeline::remote::{
    PoolSettings, RemoteRewards, RewardServerConfig, Routing, RunningRewardServer,
};
use stoke_pipeline::reward::{RewardPool, RewardSpec};
use stoke_pipeline::service::RewardService;
use stoke_pipeline::{GenerationPermit, GroupTicket, RewardFailure, RolloutGroup, Sample, Task};
use stoke_reward::{Details, Reference, RewardConfig, RewardInput, RewardOutcome, Verifier};
use stoke_rollout::FinishReason;
use stoke_serve::client::Client;

/// "panic" panics, "hang" sleeps past the timeout, else correct when equal to the answer.
struct Scripted;

impl Verifier for Scripted {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        match input.completion {
            "panic" => panic!("scripted verifier exploded"),
            "hang" => {
                std::thread::sleep(Duration::from_secs(20));
                RewardOutcome::correct(Details::default())
            }
            text if Some(text) == input.reference.answer.as_deref() => {
                RewardOutcome::correct(Details::default())
            }
            _ => RewardOutcome::wrong(Details::default()),
        }
    }
}

fn specs() -> Vec<RewardSpec> {
    let composite: RewardConfig = serde_json::from_value(json!({
        "kind": "composite", "components": [
            {"name": "accuracy", "correctness": true, "reward": {"kind": "exact_match", "mode": "gsm8k"}},
            {"name": "length", "weight": 0.5, "reward": {"kind": "group_length"}}
        ]
    }))
    .unwrap();
    vec![
        RewardSpec {
            name: "scripted".into(),
            verifier: Arc::new(Scripted),
            group_level: false,
            dense_process: false,
        },
        RewardSpec::from_reward("composite".into(), composite.build(None).unwrap()),
    ]
}

const TIMEOUT: Duration = Duration::from_millis(800);

fn server() -> RunningRewardServer {
    RunningRewardServer::start(
        RewardServerConfig {
            host: "127.0.0.1".into(),
            port: 0,
            rewards: specs(),
            workers: 2,
            timeout: TIMEOUT,
            isolation: "test".into(),
        },
        false,
    )
    .unwrap()
}

fn pool_settings(servers: Vec<String>) -> PoolSettings {
    PoolSettings {
        servers,
        routing: Routing::RoundRobin,
        max_in_flight: 4,
        timeout: Duration::from_secs(30),
        revive_after: Duration::from_secs(3600),
        startup_wait: Duration::ZERO,
    }
}

fn group(answer: &str, completions: &[&str], reward: usize) -> RolloutGroup {
    let task = Arc::new(Task {
        id: "task-0".into(),
        prompt: "What is 2 + 2?".into(),
        prompt_ids: vec![1, 2, 3],
        reference: Reference {
            answer: Some(answer.into()),
            ..Reference::default()
        },
        reward,
        data: Default::default(),
    });
    RolloutGroup {
        ticket: GroupTicket {
            group_id: 0,
            task,
            permit: GenerationPermit {
                policy_version: Default::default(),
                update_slot: 0,
                permit_index: 0,
            },
            temperature: 1.0,
        },
        samples: completions
            .iter()
            .map(|text| Sample {
                completion_ids: vec![5; text.len().max(1)],
                rollout_logprobs: vec![-1.0; text.len().max(1)],
                token_versions: vec![Default::default(); text.len().max(1)],
                loss_mask: None,
                episode: None,
                text: text.to_string(),
                finish: FinishReason::Length,
            })
            .collect(),
        generate_seconds: 0.0,
    }
}

#[test]
fn remote_verdicts_are_the_local_pools() {
    let server = server();
    let names = vec!["scripted".to_string(), "composite".to_string()];
    let remote = RemoteRewards::connect(pool_settings(vec![server.url()]), names).unwrap();
    let local = RewardPool::new(specs(), 2, TIMEOUT).unwrap();
    let cases = [
        group("4", &["4", "5", "panic", "hang"], 0),
        group(
            "#### 4",
            &["#### 4", "a longer wrong answer #### 5", "x"],
            1,
        ),
    ];
    for case in cases {
        let here = local.score(case.clone());
        let there = RewardService::score(&remote, case).unwrap();
        assert_eq!(here.rewards.len(), there.rewards.len());
        for (a, b) in here.rewards.iter().zip(&there.rewards) {
            assert_eq!(a.outcome, b.outcome);
            assert_eq!(a.score, b.score);
            assert_eq!(a.components, b.components);
            match (&a.failure, &b.failure) {
                (None, None) | (Some(RewardFailure::TimedOut), Some(RewardFailure::TimedOut)) => {}
                (Some(RewardFailure::Panicked(x)), Some(RewardFailure::Panicked(y))) => {
                    assert!(
                        x.contains("exploded") && y.contains("exploded"),
                        "{x} / {y}"
                    )
                }
                other => panic!("failures differ: {other:?}"),
            }
        }
    }
    let stats = remote.stats();
    assert_eq!((stats.panics, stats.timeouts), (1, 1));
    assert_eq!(stats.scored, 5);
    // A reward index the run does not have fails its samples, as the local pool does.
    let unknown = RewardService::score(&remote, group("4", &["4"], 7)).unwrap();
    assert!(matches!(
        unknown.rewards[0].failure,
        Some(RewardFailure::Panicked(_))
    ));
    server.stop();
}

#[test]
fn bad_requests_get_a_4xx_naming_the_field_and_the_server_keeps_serving() {
    let server = server();
    let client = Client::new(&server.url());
    let (status, body) = client.post_raw("/score", "{not json").unwrap();
    assert_eq!(status, 400, "{body}");
    let (status, body) = client
        .post(
            "/score",
            &json!({"reward": "scripted", "prompt": "p", "samples": [{"text": 3}]}),
        )
        .unwrap();
    assert_eq!(status, 400);
    assert!(body.to_string().contains("samples[0].text"), "{body}");
    let (status, body) = client
        .post(
            "/score",
            &json!({"reward": "nope", "prompt": "p", "samples": []}),
        )
        .unwrap();
    assert_eq!(status, 400);
    assert!(body.to_string().contains("unknown reward `nope`"), "{body}");
    let (status, body) = client
        .post(
            "/score",
            &json!({"reward": "scripted", "prompt": "p", "reference": {"answer": "4"},
                    "samples": [{"text": "4"}, {"text": "5"}], "extra": 1}),
        )
        .unwrap();
    assert_eq!(status, 400, "unknown fields are refused: {body}");
    let (status, body) = client
        .post(
            "/score",
            &json!({"reward": "scripted", "prompt": "p", "reference": {"answer": "4"},
                    "samples": [{"text": "4"}, {"text": "5"}]}),
        )
        .unwrap();
    assert_eq!(status, 200, "{body}");
    assert_eq!(body["rewards"][0]["outcome"], "correct");
    assert_eq!(body["rewards"][1]["outcome"], "wrong");
    let (status, info) = client.get("/info").unwrap();
    assert_eq!(status, 200);
    assert_eq!(info["rewards"], json!(["scripted", "composite"]));
    assert_eq!(info["isolation"], "test");
    server.stop();
}

#[test]
fn a_dead_server_is_skipped_and_counted_and_no_group_is_scored_twice() {
    let live = server();
    let dead = server();
    let dead_url = dead.url();
    let names = vec!["scripted".to_string()];
    let remote =
        RemoteRewards::connect(pool_settings(vec![dead_url.clone(), live.url()]), names).unwrap();
    dead.stop();
    for _ in 0..4 {
        let scored = RewardService::score(&remote, group("4", &["4", "5"], 0)).unwrap();
        assert_eq!(scored.rewards.len(), 2);
        assert!(scored.rewards[0].correct());
    }
    let stats = remote.remote_stats().unwrap();
    let dead_stats = stats.servers.iter().find(|s| s.url == dead_url).unwrap();
    let live_stats = stats.servers.iter().find(|s| s.url != dead_url).unwrap();
    assert!(!dead_stats.alive);
    assert_eq!(
        dead_stats.failures, 1,
        "out of rotation after its first failure"
    );
    assert_eq!(dead_stats.requests, 0);
    assert_eq!(live_stats.requests, 4);
    assert_eq!(live_stats.samples, 8);
    assert_eq!(stats.retries, 1);
    assert_eq!(remote.stats().scored, 8, "each sample scored once");

    live.stop();
    let error = RewardService::score(&remote, group("4", &["4"], 0)).unwrap_err();
    assert!(
        error.to_string().contains("no server left to try"),
        "{error}"
    );
}

#[test]
fn a_server_without_the_runs_rewards_is_refused_naming_it() {
    let server = server();
    let error = RemoteRewards::connect(
        pool_settings(vec![server.url()]),
        vec!["scripted".into(), "math".into()],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains(&server.url()), "{error}");
    assert!(error.contains("has no reward `math`"), "{error}");
    let error = RemoteRewards::connect(
        pool_settings(vec!["http://127.0.0.1:9".into()]),
        vec!["scripted".into()],
    )
    .unwrap_err()
    .to_string();
    assert!(
        error.contains("http://127.0.0.1:9: does not answer"),
        "{error}"
    );
    server.stop();
}
