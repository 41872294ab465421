//! Bounded work: 1,000 random and adversarial completions (huge numbers, deep nesting,
//! unbalanced LaTeX, megabyte strings, power towers) through every verifier that does not run
//! code. Asserts a generous wall-clock bound for the whole run and for the slowest single call.

use std::sync::Arc;
use std::time::{Duration, Instant};

use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use stoke_reward::StepScore;
use stoke_reward::judge::{JudgeConfig, JudgeTransport, JudgeVerifier, TransportError};
use stoke_reward::process_reward::{ProcessRewardConfig, StepScorer};
use stoke_reward::reward_model::{RewardModelConfig, ScoreItem, ScorerSource, SequenceScorer};
use stoke_reward::{Reference, Reward, RewardConfig, RewardInput, RewardKind, Verifier};

fn adversarial() -> Vec<String> {
    let mut texts = vec![
        "9".repeat(1 << 20),
        format!("\\boxed{{{}}}", "9".repeat(100_000)),
        format!("\\boxed{{{}}}", "9".repeat(1_500)),
        "\\boxed{10^{10^{10^{10}}}}".to_string(),
        "\\boxed{2^{2^{2^{2^{2^{2^{2}}}}}}}".to_string(),
        "\\boxed{(2^{64})^{64}}".to_string(),
        "\\boxed{3!!!!!!}".to_string(),
        "\\boxed{200!}".to_string(),
        "\\boxed{(200!)! - 1}".to_string(),
        format!("\\boxed{{{}1{}}}", "(".repeat(100_000), ")".repeat(100_000)),
        format!("\\boxed{{{}}}", "{".repeat(200_000)),
        format!("\\boxed{{{}", "{".repeat(200_000)),
        "\\frac{".repeat(20_000),
        "\\sqrt{".repeat(20_000),
        "\\left(".repeat(50_000),
        format!("\\boxed{{{}}}", "x^".repeat(700) + "x"),
        format!("\\boxed{{{}}}", "x*".repeat(700) + "x"),
        format!("\\boxed{{{}}}", "1+".repeat(900) + "1"),
        format!("\\boxed{{{}}}", "-".repeat(1_900) + "1"),
        format!("\\boxed{{{}}}", "1/".repeat(900) + "1"),
        format!(
            "\\boxed{{{}}}",
            (0..60)
                .map(|i| format!("{i}x^{i}"))
                .collect::<Vec<_>>()
                .join(",")
        ),
        format!(
            "\\boxed{{\\{{{}\\}}}}",
            (0..64)
                .map(|i| format!("\\sqrt{{{i}}}"))
                .collect::<Vec<_>>()
                .join(",")
        ),
        "a b ".repeat(1 << 18),
        "<think>".repeat(100_000),
        format!("<answer>{}</answer>", "1".repeat(500_000)),
        "The answer is ".repeat(50_000),
        "####".repeat(100_000),
        "[".repeat(1 << 20),
        format!("```json\n{}\n```", "[".repeat(100_000)),
        format!("{{\"a\": \"{}\"}}", "\\\"".repeat(200_000)),
        "{\"a\":".repeat(100_000),
        "\\".repeat(100_000),
        "$".repeat(100_000),
        "1,".repeat(500_000),
        "1.".repeat(500_000),
        "\u{1F600}".repeat(100_000),
        String::new(),
    ];
    let mut rng = StdRng::seed_from_u64(20_261_129);
    let alphabet: Vec<char> = "0123456789+-*/^(){}[]\\,.=<> xyzabc!%$_|frac sqrt boxed text pi"
        .chars()
        .collect();
    while texts.len() < 1_000 {
        let len = match rng.random_range(0..100) {
            0..=79 => rng.random_range(0..200),
            80..=97 => rng.random_range(200..20_000),
            _ => rng.random_range(100_000..300_000),
        };
        let body: String = (0..len)
            .map(|_| alphabet[rng.random_range(0..alphabet.len())])
            .collect();
        texts.push(if rng.random_bool(0.5) {
            format!("\\boxed{{{body}}}")
        } else {
            body
        });
    }
    texts
}

/// Scores a completion by its length in chars: a stand-in for a reward model.
struct LengthScorer;

impl SequenceScorer for LengthScorer {
    fn score(&self, items: &[ScoreItem<'_>]) -> Result<Vec<f64>, String> {
        Ok(items
            .iter()
            .map(|i| i.completion.chars().count() as f64)
            .collect())
    }
}

/// Splits at each "\n" and scores a step by its length: a stand-in for a PRM.
struct LineScorer;

impl StepScorer for LineScorer {
    fn score_steps(&self, items: &[ScoreItem<'_>]) -> Result<Vec<Vec<StepScore>>, String> {
        Ok(items
            .iter()
            .map(|item| {
                let mut start = 0;
                item.completion
                    .split_inclusive('\n')
                    .map(|piece| {
                        let step = StepScore {
                            start,
                            end: start + piece.len(),
                            score: 1.0 / (1.0 + piece.len() as f64),
                        };
                        start += piece.len();
                        step
                    })
                    .collect()
            })
            .collect())
    }
}

struct LengthScorers;

impl ScorerSource for LengthScorers {
    fn scorer(&self, _config: &RewardModelConfig) -> Result<Arc<dyn SequenceScorer>, String> {
        Ok(Arc::new(LengthScorer))
    }

    fn step_scorer(&self, _config: &ProcessRewardConfig) -> Result<Arc<dyn StepScorer>, String> {
        Ok(Arc::new(LineScorer))
    }
}

/// A judge server in the process: scores by the request's size, prefers the first response.
/// The verifier's own work (quoting megabyte completions, hashing them for the cache, parsing
/// the answers) is what is bounded here; the model's cost is the server's.
struct SizeJudge;

impl JudgeTransport for SizeJudge {
    fn chat(
        &self,
        _server: &str,
        body: &serde_json::Value,
        _timeout: Duration,
    ) -> Result<String, TransportError> {
        let user = body["messages"][1]["content"].as_str().unwrap_or_default();
        if user.contains("<response-A-") {
            return Ok("Verdict: A".into());
        }
        Ok(format!("**Score:** {}", 1 + user.len() % 10))
    }

    fn models(&self, _server: &str, _timeout: Duration) -> Result<Vec<String>, TransportError> {
        Ok(vec!["size-judge".into()])
    }
}

fn judge(mode: &str) -> Reward {
    let config: JudgeConfig = serde_json::from_str(&format!(
        r#"{{"urls": ["http://127.0.0.1:9"], "rubric": "Be brief.", "mode": "{mode}"}}"#
    ))
    .unwrap();
    Reward::Judge(JudgeVerifier::with_transport(&config, Arc::new(SizeJudge)).unwrap())
}

fn rewards() -> Vec<Reward> {
    let configs = [
        r#"{"kind": "math"}"#,
        r#"{"kind": "exact_match", "mode": "normalized"}"#,
        r#"{"kind": "exact_match", "mode": "integer"}"#,
        r#"{"kind": "exact_match", "mode": "choice"}"#,
        r#"{"kind": "exact_match", "mode": "gsm8k"}"#,
        r#"{"kind": "format_regex"}"#,
        r#"{"kind": "tag_structure"}"#,
        r#"{"kind": "json_schema", "scoring": "fraction"}"#,
        r#"{"kind": "overlong", "max_tokens": 100, "cache_tokens": 20}"#,
        r#"{"kind": "group_length"}"#,
        r#"{"kind": "cosine_length", "max_tokens": 1000}"#,
        r#"{"kind": "repetition"}"#,
        r#"{"kind": "instructions", "constraints": [{"type": "word_count", "relation": "at_most", "value": 50},
            {"type": "keywords_required", "keywords": ["answer"]}, {"type": "lowercase"}]}"#,
        r#"{"kind": "composite", "components": [
            {"correctness": true, "reward": {"kind": "math"}},
            {"gate": "when_correct", "weight": 0.5, "reward": {"kind": "cosine_length", "max_tokens": 1000}},
            {"reward": {"kind": "repetition"}}]}"#,
        // The verifier's own work (inputs to the scorer, normalization, clipping); the model's
        // cost is the scorer's, so a stand-in scorer reads each completion's length.
        r#"{"kind": "reward_model", "model": "unused", "normalize": "group", "clip": 3.0}"#,
        r#"{"kind": "process_reward", "model": "unused", "aggregation": "mean", "dense": true}"#,
    ];
    let mut rewards: Vec<Reward> = configs
        .iter()
        .map(|text| {
            serde_json::from_str::<RewardConfig>(text)
                .unwrap()
                .build_with(None, Some(&LengthScorers))
                .unwrap()
        })
        .collect();
    rewards.push(judge("pointwise"));
    rewards.push(judge("pairwise"));
    let kinds: Vec<RewardKind> = rewards.iter().map(Reward::kind).collect();
    for kind in RewardKind::ALL.into_iter().filter(|k| !k.runs_code()) {
        assert!(kinds.contains(&kind), "{kind} is not exercised");
    }
    rewards
}

#[test]
fn adversarial_completions_finish_in_bounded_time() {
    let texts = adversarial();
    assert_eq!(texts.len(), 1_000);
    let rewards = rewards();
    let golds = [
        "\\frac{1}{2}",
        "x^2+1",
        "(1,2]",
        "B",
        "#### 42",
        "\\text{yes}",
        "\\{1,2,3\\}",
    ];
    let reference_for = |index: usize| Reference {
        answer: Some(golds[index % golds.len()].to_string()),
        schema: Some(
            json!({"type": "object", "properties": {"a": {"type": "string", "pattern": "^(a+)+$"}}}),
        ),
        ..Reference::default()
    };
    let references: Vec<Reference> = (0..texts.len()).map(reference_for).collect();
    let started = Instant::now();
    let mut slowest = (Duration::ZERO, String::new());
    for reward in &rewards {
        for (index, (text, reference)) in texts.iter().zip(&references).enumerate() {
            let input = RewardInput::new("prompt", text, reference)
                .with_tokens(text.len() / 4)
                .with_correct(index % 2 == 0);
            let call = Instant::now();
            let outcome = reward.score(&input);
            let elapsed = call.elapsed();
            assert!(
                outcome.score.is_finite(),
                "{:?} gave a non-finite score on input {index}",
                reward.kind()
            );
            if elapsed > slowest.0 {
                slowest = (
                    elapsed,
                    format!("{} on input {index} ({} bytes)", reward.kind(), text.len()),
                );
            }
        }
        let group: Vec<RewardInput<'_>> = texts[..64]
            .iter()
            .zip(&references)
            .map(|(text, reference)| {
                RewardInput::new("", text, reference)
                    .with_tokens(text.len())
                    .with_correct(true)
            })
            .collect();
        assert_eq!(reward.score_group(&group).len(), 64);
    }
    let total = started.elapsed();
    eprintln!(
        "{} calls in {:.2} s; slowest {:.1} ms: {}",
        rewards.len() * texts.len(),
        total.as_secs_f64(),
        slowest.0.as_secs_f64() * 1e3,
        slowest.1
    );
    // Generous bounds for a loaded 2-core CI machine in the test profile; typical figures are
    // printed above and are far lower.
    assert!(total < Duration::from_secs(120), "total {total:?}");
    assert!(
        slowest.0 < Duration::from_secs(2),
        "slowest call {slowest:?}"
    );
}

#[test]
fn a_pathological_100kb_math_completion_returns_quickly() {
    let reward = RewardConfig::default_for(RewardKind::Math)
        .unwrap()
        .build(None)
        .unwrap();
    let reference = Reference {
        answer: Some("\\frac{1}{2}".into()),
        ..Reference::default()
    };
    let texts = [
        format!("\\boxed{{{}}}", "{".repeat(100_000)),
        format!("{} \\boxed{{1/2}}", "\\frac{".repeat(16_000)),
        format!("answer is {}", "(".repeat(100_000)),
        "1/2 ".repeat(25_000),
    ];
    for text in &texts {
        let started = Instant::now();
        let _ = reward.score(&RewardInput::new("", text, &reference));
        let elapsed = started.elapsed();
        assert!(
            elapsed < Duration::from_millis(500),
            "{elapsed:?} for a {} byte completion",
            text.len()
        );
    }
}
