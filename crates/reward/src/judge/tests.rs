//! The judge verifier over an in-process fake server: scores per mode, failures as outcomes
//! (never scores), retries, the cache, model discovery and the concurrency limit.

use std::sync::Arc;
use std::sync::atomic::Ordering;
use std::time::Duration;

use super::fakes::{FakeJudge, exact_blocks, honest_answer, marker_count};
use super::*;
use crate::verifier::Reference;

fn config(mode: &str, extra: &str) -> JudgeConfig {
    let text = format!(
        "urls = [\"http://judge-1\", \"http://judge-2\", \"http://judge-3\"]\nrubric = \
         \"Count the GOOD markers.\"\nmode = \"{mode}\"\n{extra}"
    );
    toml::from_str(&text).unwrap_or_else(|e| panic!("{text}: {e}"))
}

fn verifier(mode: &str, extra: &str, fake: &Arc<FakeJudge>) -> JudgeVerifier {
    JudgeVerifier::with_transport(&config(mode, extra), fake.clone()).unwrap()
}

fn score_all(verifier: &JudgeVerifier, completions: &[&str]) -> Vec<RewardOutcome> {
    let reference = Reference::default();
    let inputs: Vec<RewardInput<'_>> = completions
        .iter()
        .map(|c| RewardInput::new("Say something good.", c, &reference))
        .collect();
    verifier.score_group(&inputs)
}

fn scores(outcomes: &[RewardOutcome]) -> Vec<f64> {
    outcomes.iter().map(|o| o.score).collect()
}

fn total(outcomes: &[RewardOutcome]) -> JudgeFigures {
    outcomes
        .iter()
        .filter_map(|o| o.details.judge)
        .fold(JudgeFigures::default(), JudgeFigures::plus)
}

fn close(a: &[f64], b: &[f64]) -> bool {
    a.len() == b.len() && a.iter().zip(b).all(|(x, y)| (x - y).abs() < 1e-9)
}

#[test]
fn pointwise_scores_map_the_scale_onto_zero_to_one() {
    let fake = Arc::new(FakeJudge::honest());
    let judge = verifier("pointwise", "", &fake);
    let out = score_all(&judge, &["", "GOOD GOOD GOOD", &"GOOD ".repeat(20)]);
    // Markers 0, 3, 20 give scores 1, 4, 10 on [1, 10].
    assert!(close(&scores(&out), &[0.0, 3.0 / 9.0, 1.0]), "{out:?}");
    for outcome in &out {
        assert_eq!(outcome.outcome, Outcome::Shaped);
        let figures = outcome.details.judge.unwrap();
        assert_eq!(
            (figures.calls, figures.cache_hits, figures.retries),
            (1, 0, 0)
        );
    }
    assert_eq!(fake.calls(), 3);
}

#[test]
fn the_request_is_an_openai_chat_completion() {
    let fake = Arc::new(FakeJudge::honest());
    let judge = verifier(
        "pointwise",
        "model = \"judge-7b\"\ntemperature = 0.5\nmax_tokens = 99",
        &fake,
    );
    score_all(&judge, &["GOOD"]);
    let body = fake.bodies.lock().unwrap()[0].clone();
    assert_eq!(body["model"], "judge-7b");
    assert_eq!(body["temperature"], 0.5);
    assert_eq!(body["max_tokens"], 99);
    assert_eq!(body["messages"][0]["role"], "system");
    assert_eq!(body["messages"][1]["role"], "user");
    let system = body["messages"][0]["content"].as_str().unwrap();
    assert!(
        system.contains("Count the GOOD markers."),
        "the rubric is sent"
    );
    let user = body["messages"][1]["content"].as_str().unwrap();
    let blocks = exact_blocks(user);
    assert_eq!(blocks[0], ("prompt".into(), "Say something good.".into()));
    assert_eq!(blocks[1], ("response".into(), "GOOD".into()));
    assert_eq!(fake.model_calls.load(Ordering::SeqCst), 0);
}

#[test]
fn without_a_model_name_the_servers_first_model_is_asked_once() {
    let mut fake = FakeJudge::honest();
    fake.models = vec!["served-judge".into(), "other".into()];
    let fake = Arc::new(fake);
    let judge = verifier("pointwise", "", &fake);
    score_all(&judge, &["a", "b", "c"]);
    score_all(&judge.clone(), &["d"]);
    assert_eq!(fake.model_calls.load(Ordering::SeqCst), 1);
    for body in fake.bodies.lock().unwrap().iter() {
        assert_eq!(body["model"], "served-judge");
    }
}

#[test]
fn an_unreadable_verdict_is_a_failure_left_out_of_training_and_not_cached() {
    let fake = Arc::new(FakeJudge::new(|_, _| {
        Ok("It is quite good, I would say eight.".into())
    }));
    let judge = verifier("pointwise", "", &fake);
    for _ in 0..2 {
        let out = score_all(&judge, &["GOOD"]);
        assert_eq!(out[0].outcome, Outcome::UnparseableVerdict);
        assert_eq!(out[0].score, 0.0);
        assert!(out[0].outcome.is_dataset_problem());
        let reason = out[0].details.reason.as_deref().unwrap();
        assert!(
            reason.contains("Score:") && reason.contains("eight"),
            "{reason}"
        );
    }
    assert_eq!(fake.calls(), 2, "a failure is asked again, not cached");
    assert_eq!(judge.cached_verdicts(), 0);
    let out_of_scale = Arc::new(FakeJudge::new(|_, _| Ok("Score: 11".into())));
    let out = score_all(&verifier("pointwise", "", &out_of_scale), &["x"]);
    assert_eq!(out[0].outcome, Outcome::UnparseableVerdict);
}

#[test]
fn an_unreachable_judge_is_a_scorer_error_after_the_retries() {
    let fake = Arc::new(FakeJudge::new(|_, _| {
        Err(TransportError::Unreachable("connection refused".into()))
    }));
    let judge = verifier("pointwise", "retries = 2", &fake);
    let out = score_all(&judge, &["GOOD"]);
    assert_eq!(out[0].outcome, Outcome::ScorerError);
    assert_eq!(out[0].score, 0.0);
    let reason = out[0].details.reason.as_deref().unwrap();
    assert!(
        reason.contains("3 attempt") && reason.contains("refused"),
        "{reason}"
    );
    assert_eq!(fake.calls(), 3);
    let figures = out[0].details.judge.unwrap();
    assert_eq!((figures.calls, figures.retries), (1, 2));
    // The three servers now cool down: the next request passes two of them over.
    let out = score_all(&judge, &["GOOD GOOD"]);
    assert_eq!(out[0].outcome, Outcome::ScorerError);
    assert!(out[0].details.judge.unwrap().servers_skipped >= 2);
}

#[test]
fn a_failing_server_is_retried_on_the_next_one() {
    let fake = Arc::new(FakeJudge::new(|server, messages| {
        if server == "http://judge-1" {
            Err(TransportError::Status {
                code: 503,
                body: "busy".into(),
            })
        } else {
            Ok(honest_answer(messages))
        }
    }));
    // A named model: no listing request moves the round robin before the first chat.
    let judge = verifier("pointwise", "model = \"m\"", &fake);
    let out = score_all(&judge, &["GOOD"]);
    assert_eq!(out[0].outcome, Outcome::Shaped);
    assert_eq!(out[0].details.judge.unwrap().retries, 1);
    // judge-1 is skipped from now on.
    let out = score_all(&judge, &["GOOD GOOD", "GOOD GOOD GOOD", "x"]);
    let figures = total(&out);
    assert_eq!(figures.retries, 0);
    assert!(figures.servers_skipped >= 1, "{figures:?}");
}

#[test]
fn a_rejected_request_is_not_retried() {
    let fake = Arc::new(FakeJudge::new(|_, _| {
        Err(TransportError::Status {
            code: 404,
            body: "model `judge` not found".into(),
        })
    }));
    let out = score_all(&verifier("pointwise", "retries = 5", &fake), &["GOOD"]);
    assert_eq!(out[0].outcome, Outcome::ScorerError);
    assert!(
        out[0]
            .details
            .reason
            .as_deref()
            .unwrap()
            .contains("not found")
    );
    assert_eq!(fake.calls(), 1);
}

#[test]
fn verdicts_are_cached_across_clones_and_count_as_hits() {
    let fake = Arc::new(FakeJudge::honest());
    let judge = verifier("pointwise", "", &fake);
    score_all(&judge, &["GOOD", "GOOD GOOD"]);
    let out = score_all(&judge.clone(), &["GOOD", "GOOD GOOD", "new"]);
    assert_eq!(fake.calls(), 3);
    assert!(close(&scores(&out), &[1.0 / 9.0, 2.0 / 9.0, 0.0]));
    let figures = total(&out);
    assert_eq!((figures.calls, figures.cache_hits), (1, 2));
    // Without a cache every request goes out.
    let fake = Arc::new(FakeJudge::honest());
    let judge = verifier("pointwise", "cache_size = 0", &fake);
    score_all(&judge, &["GOOD"]);
    score_all(&judge, &["GOOD"]);
    assert_eq!(fake.calls(), 2);
}

#[test]
fn requests_in_flight_stay_within_max_concurrency_across_groups() {
    let mut fake = FakeJudge::honest();
    fake.delay = Duration::from_millis(20);
    let fake = Arc::new(fake);
    let judge = verifier("pointwise", "max_concurrency = 3\ncache_size = 0", &fake);
    let texts: Vec<String> = (0..12).map(|i| "GOOD ".repeat(i % 9)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    std::thread::scope(|scope| {
        for _ in 0..2 {
            let judge = judge.clone();
            let refs = &refs;
            scope.spawn(move || {
                let out = score_all(&judge, refs);
                assert!(out.iter().all(|o| o.outcome == Outcome::Shaped));
            });
        }
    });
    let max = fake.max_in_flight.load(Ordering::SeqCst);
    assert!((2..=3).contains(&max), "{max} requests in flight");
    assert_eq!(fake.calls(), 24);
}

#[test]
fn pairwise_scores_are_win_rates_and_swap_agreement_is_counted() {
    let fake = Arc::new(FakeJudge::honest());
    let judge = verifier("pairwise", "cache_size = 0", &fake);
    let out = score_all(&judge, &["GOOD GOOD GOOD", "GOOD GOOD", "GOOD", "GOOD"]);
    // Sample 0 beats all; 1 beats 2 and 3; 2 and 3 tie each other and lose the rest.
    let expected = [1.0, 2.0 / 3.0, 0.5 / 3.0, 0.5 / 3.0];
    assert!(close(&scores(&out), &expected), "{:?}", scores(&out));
    let figures = total(&out);
    assert_eq!(fake.calls(), 12, "6 pairs in both orders");
    assert_eq!(
        (
            figures.calls,
            figures.compared_pairs,
            figures.consistent_pairs
        ),
        (12, 6, 6)
    );
    assert!(out.iter().all(|o| o.outcome == Outcome::Shaped));
}

#[test]
fn a_judge_that_follows_the_position_gives_ties_and_zero_consistency() {
    let fake = Arc::new(FakeJudge::new(|_, _| Ok("Verdict: A".into())));
    let out = score_all(&verifier("pairwise", "", &fake), &["GOOD GOOD", "GOOD", ""]);
    assert!(close(&scores(&out), &[0.5, 0.5, 0.5]));
    let figures = total(&out);
    assert_eq!((figures.compared_pairs, figures.consistent_pairs), (3, 0));
    // Without swap the bias goes straight into the scores: the pair is shown with sample 1
    // first (the schedule balances positions), so the worse sample wins.
    let fake = Arc::new(FakeJudge::new(|_, _| Ok("Verdict: A".into())));
    let out = score_all(
        &verifier("pairwise", "swap = false", &fake),
        &["GOOD GOOD", ""],
    );
    assert_eq!(fake.calls(), 1);
    assert!(close(&scores(&out), &[0.0, 1.0]), "{out:?}");
    assert_eq!(total(&out).compared_pairs, 0);
}

#[test]
fn failed_comparisons_are_left_out_and_a_sample_without_any_fails() {
    // The judge cannot read a response that says BROKEN: every comparison with it fails.
    let fake = Arc::new(FakeJudge::new(|_, messages| {
        if exact_blocks(&messages.user)
            .iter()
            .any(|(_, b)| b.contains("BROKEN"))
        {
            Ok("Both are fine.".into())
        } else {
            Ok(honest_answer(messages))
        }
    }));
    let out = score_all(
        &verifier("pairwise", "", &fake),
        &["GOOD GOOD", "GOOD", "BROKEN"],
    );
    assert!(close(&scores(&out)[..2], &[1.0, 0.0]), "{out:?}");
    assert_eq!(out[0].details.passed, Some(1));
    assert_eq!(out[0].details.total, Some(2));
    assert!(
        out[0]
            .details
            .reason
            .as_deref()
            .unwrap()
            .contains("left out")
    );
    assert_eq!(out[2].outcome, Outcome::UnparseableVerdict);
    assert_eq!(out[2].score, 0.0);
}

#[test]
fn large_pairwise_groups_compare_each_sample_with_a_bounded_set_of_partners() {
    let fake = Arc::new(FakeJudge::honest());
    let texts: Vec<String> = (0..12).map(|i| "GOOD ".repeat(i)).collect();
    let refs: Vec<&str> = texts.iter().map(String::as_str).collect();
    let out = score_all(&verifier("pairwise", "", &fake), &refs);
    assert_eq!(fake.calls(), 12 * schedule::NEIGHBOURS * 2);
    for outcome in &out {
        assert_eq!(outcome.details.passed, Some(2 * schedule::NEIGHBOURS));
    }
    assert!(out[11].score > out[0].score);
}

#[test]
fn listwise_scores_are_mean_normalized_ranks() {
    let fake = Arc::new(FakeJudge::honest());
    let out = score_all(
        &verifier("listwise", "", &fake),
        &["GOOD", "GOOD GOOD GOOD", ""],
    );
    assert!(close(&scores(&out), &[0.5, 1.0, 0.0]), "{out:?}");
    assert_eq!(fake.calls(), 2, "the group in both orders");
    let figures = total(&out);
    assert_eq!((figures.compared_pairs, figures.consistent_pairs), (3, 3));
    assert_eq!(
        out[0].details.judge.unwrap().calls,
        2,
        "counted on the first sample"
    );
    assert_eq!(out[1].details.judge.unwrap().calls, 0);
    // A judge that ranks by position is cancelled by the swap.
    let fake = Arc::new(FakeJudge::new(|_, _| Ok("Ranking: 1 > 2 > 3".into())));
    let out = score_all(
        &verifier("listwise", "", &fake),
        &["GOOD", "GOOD GOOD GOOD", ""],
    );
    assert!(close(&scores(&out), &[0.5, 0.5, 0.5]));
    assert_eq!(total(&out).consistent_pairs, 0);
}

#[test]
fn an_incomplete_ranking_fails_the_whole_group() {
    let fake = Arc::new(FakeJudge::new(|_, _| Ok("Ranking: 2 > 1".into())));
    let out = score_all(&verifier("listwise", "", &fake), &["a", "b", "c"]);
    for outcome in &out {
        assert_eq!(outcome.outcome, Outcome::UnparseableVerdict);
        assert!(
            outcome
                .details
                .reason
                .as_deref()
                .unwrap()
                .contains("misses")
        );
    }
}

#[test]
fn comparative_modes_need_two_completions() {
    for mode in ["pairwise", "listwise"] {
        let fake = Arc::new(FakeJudge::honest());
        let judge = verifier(mode, "", &fake);
        let reference = Reference::default();
        let outcome = judge.score(&RewardInput::new("q", "GOOD", &reference));
        assert_eq!(outcome.outcome, Outcome::ScorerError, "{mode}");
        assert!(outcome.details.reason.unwrap().contains("group of 1"));
        assert_eq!(fake.calls(), 0);
        assert!(judge.score_group(&[]).is_empty());
    }
}

#[test]
fn the_honest_fake_reads_markers_only_inside_quotes() {
    // A self-check of the test double the other tests rely on.
    let quoting = Quoting {
        nonce: "00000000abcd".into(),
        neutralize: true,
    };
    let messages = prompt::pointwise("r", (1.0, 10.0), "GOOD GOOD", "GOOD", &quoting);
    assert_eq!(honest_answer(&messages), "Looks fine.\nScore: 2");
    assert_eq!(marker_count("GOODGOOD"), 2);
}
