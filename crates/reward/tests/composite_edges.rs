//! Edge cases of the composite and length rewards: empty groups, groups of one, all-equal
//! lengths (the min-max division), weights that overflow, configured values that produce
//! non-finite scores, and negative weights.

use stoke_reward::composite::{CompositeConfig, CompositeVerifier};
use stoke_reward::cosine_length::{CosineLengthConfig, CosineLengthVerifier};
use stoke_reward::group_length::{GroupLengthConfig, GroupLengthVerifier};
use stoke_reward::{Outcome, Reference, RewardInput, Verifier};

fn composite(json: &str) -> Result<CompositeVerifier, String> {
    let config: CompositeConfig = serde_json::from_str(json).map_err(|e| e.to_string())?;
    CompositeVerifier::new(&config, None).map_err(|e| e.to_string())
}

const MATH_AND_GROUP_LENGTH: &str = r#"{"components": [
    {"name": "accuracy", "correctness": true, "reward": {"kind": "math"}},
    {"name": "length", "weight": 0.5, "reward": {"kind": "group_length"}}
]}"#;

fn answer(gold: &str) -> Reference {
    Reference {
        answer: Some(gold.into()),
        ..Reference::default()
    }
}

#[test]
fn composite_empty_group_scores_nothing_without_panicking() {
    let verifier = composite(MATH_AND_GROUP_LENGTH).unwrap();
    assert!(verifier.score_group(&[]).is_empty());
    let group_length = GroupLengthVerifier::new(&GroupLengthConfig::default()).unwrap();
    assert!(group_length.score_group(&[]).is_empty());
}

#[test]
fn group_length_group_of_one_and_equal_lengths_score_zero_not_nan() {
    let reference = answer("4");
    let verifier = composite(MATH_AND_GROUP_LENGTH).unwrap();
    let one = verifier.score(&RewardInput::new("", "\\boxed{4}", &reference).with_tokens(7));
    assert_eq!((one.score, one.outcome), (1.0, Outcome::Correct), "{one:?}");
    let equal: Vec<RewardInput<'_>> = ["\\boxed{4}", "\\boxed{5}", "\\boxed{4}"]
        .iter()
        .map(|c| RewardInput::new("", c, &reference).with_tokens(9))
        .collect();
    let scores: Vec<f64> = verifier
        .score_group(&equal)
        .iter()
        .map(|o| o.score)
        .collect();
    assert_eq!(scores, vec![1.0, 0.0, 1.0]);
    let zero_lengths: Vec<RewardInput<'_>> = (0..3)
        .map(|_| RewardInput::new("", "\\boxed{4}", &reference).with_tokens(0))
        .collect();
    assert!(
        verifier
            .score_group(&zero_lengths)
            .iter()
            .all(|o| o.score == 1.0)
    );
}

#[test]
fn composite_overflowing_weights_never_yield_a_non_finite_score() {
    let verifier = composite(
        r#"{"components": [
            {"correctness": true, "weight": 1e308, "reward": {"kind": "math"}},
            {"weight": 1e308, "reward": {"kind": "exact_match"}}
        ]}"#,
    );
    // Either the config is refused, or the score stays finite.
    if let Ok(verifier) = verifier {
        let outcome = verifier.score(&RewardInput::new("", "\\boxed{4}", &answer("4")));
        assert!(outcome.score.is_finite(), "{outcome:?}");
    }
}

#[test]
fn cosine_length_extreme_ranges_never_yield_a_non_finite_score() {
    let config = CosineLengthConfig {
        correct_at_zero: f64::MAX,
        correct_at_max: -f64::MAX,
        ..CosineLengthConfig::with_max_tokens(100)
    };
    // Either refused, or finite at every length.
    if let Ok(verifier) = CosineLengthVerifier::new(&config) {
        let reference = Reference::default();
        for tokens in [0, 1, 50, 99, 100, 1000] {
            let outcome = verifier.score(
                &RewardInput::new("", "", &reference)
                    .with_tokens(tokens)
                    .with_correct(true),
            );
            assert!(outcome.score.is_finite(), "{tokens}: {outcome:?}");
        }
    }
}

#[test]
fn composite_rejects_a_negative_weight_on_the_correctness_component() {
    // A negative correctness weight pays the policy for wrong answers: a config mistake.
    let error = composite(
        r#"{"components": [{"correctness": true, "weight": -1.0, "reward": {"kind": "math"}}]}"#,
    )
    .err()
    .expect("refused");
    assert!(error.contains("components[0].weight"), "{error}");
}

#[test]
fn composite_negative_weights_on_penalty_terms_subtract() {
    let verifier = composite(
        r#"{"components": [
            {"correctness": true, "reward": {"kind": "math"}},
            {"weight": -0.5, "reward": {"kind": "tag_structure", "tags": ["answer"]}}
        ]}"#,
    )
    .unwrap();
    let outcome = verifier.score(&RewardInput::new(
        "",
        "<answer>\\boxed{4}</answer>",
        &answer("4"),
    ));
    assert!((outcome.score - 0.5).abs() < 1e-12, "{outcome:?}");
}

#[test]
fn composite_rejects_non_finite_weights() {
    for weight in ["1e999", "-1e999"] {
        let json = format!(
            r#"{{"components": [{{"correctness": true, "reward": {{"kind": "math"}}}}, {{"weight": {weight}, "reward": {{"kind": "overlong", "max_tokens": 10}}}}]}}"#
        );
        assert!(composite(&json).is_err(), "{weight}");
    }
}
