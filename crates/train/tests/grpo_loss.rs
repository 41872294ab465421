//! GRPO loss math: each piece against hand-computed values on tiny tensors, and the whole loss
//! (value, gradient w.r.t. the current log-probs, clip fractions, KL) against TRL 1.16.0's own
//! `GRPOTrainer._compute_loss` run by `scripts/make_grpo_fixtures.py` (fixtures/grpo/trl_loss.json).

use candle_core::{DType, Device, Tensor, Var};
use serde::Deserialize;
use stoke_train::grpo::{
    AdvantageEstimator, GrpoError, GrpoLoss, GrpoLossFile, KlEstimator, KlPenalty, LossAggregation,
    MismatchCorrection, PolicyBatch, PolicyLoss, RatioLevel, drop_equal_reward_groups,
};

const CPU: Device = Device::Cpu;

fn t2(rows: &[&[f64]]) -> Tensor {
    let cols = rows[0].len();
    let flat: Vec<f64> = rows.iter().flat_map(|r| r.iter().copied()).collect();
    Tensor::from_vec(flat, (rows.len(), cols), &CPU).unwrap()
}

fn t1(values: &[f64]) -> Tensor {
    Tensor::from_slice(values, values.len(), &CPU).unwrap()
}

fn scalar(t: &Tensor) -> f64 {
    t.to_dtype(DType::F64).unwrap().to_scalar::<f64>().unwrap()
}

fn rows(t: &Tensor) -> Vec<Vec<f64>> {
    t.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap()
}

fn assert_close(got: f64, want: f64, tol: f64, what: &str) {
    assert!(
        (got - want).abs() <= tol,
        "{what}: got {got}, want {want} (tol {tol})"
    );
}

fn assert_all_close(got: &[f64], want: &[f64], tol: f64, what: &str) {
    assert_eq!(got.len(), want.len(), "{what}: lengths");
    for (i, (g, w)) in got.iter().zip(want).enumerate() {
        assert_close(*g, *w, tol, &format!("{what}[{i}]"));
    }
}

// ---------------------------------------------------------------- advantages

#[test]
fn grpo_advantage_divides_by_sample_std_plus_eps() {
    let a = AdvantageEstimator::Grpo { eps: 0.01 }
        .advantages(&[1.0, 0.0, 0.0, 1.0, 2.0, 2.0, 2.0, 2.0], 4)
        .unwrap();
    // Group 1: mean 0.5, sample std sqrt(4 * 0.25 / 3) = sqrt(1/3). Group 2: all equal -> 0.
    let d = 0.5 / ((1.0f64 / 3.0).sqrt() + 0.01);
    assert_all_close(&a, &[d, -d, -d, d, 0.0, 0.0, 0.0, 0.0], 1e-12, "grpo");
}

#[test]
fn dr_grpo_advantage_only_subtracts_the_group_mean() {
    let a = AdvantageEstimator::DrGrpo
        .advantages(&[1.0, 0.0, 0.0, 0.0], 4)
        .unwrap();
    assert_all_close(&a, &[0.75, -0.25, -0.25, -0.25], 1e-12, "dr_grpo");
}

#[test]
fn rloo_advantage_uses_the_leave_one_out_mean() {
    let a = AdvantageEstimator::Rloo
        .advantages(&[1.0, 0.0, 0.0, 0.0, 3.0], 1)
        .unwrap();
    assert_all_close(&a, &[0.0; 5], 0.0, "rloo groups of one");
    let a = AdvantageEstimator::Rloo
        .advantages(&[1.0, 0.0, 0.0, 0.0], 4)
        .unwrap();
    assert_all_close(
        &a,
        &[1.0, -1.0 / 3.0, -1.0 / 3.0, -1.0 / 3.0],
        1e-12,
        "rloo",
    );
}

#[test]
fn reinforce_plus_plus_whitens_group_centred_rewards_over_the_batch() {
    let a = AdvantageEstimator::ReinforcePlusPlus { eps: 1e-8 }
        .advantages(&[1.0, 0.0, 1.0, 1.0], 2)
        .unwrap();
    // Centred: [0.5, -0.5, 0, 0]; batch mean 0, sample std sqrt(0.5 / 3).
    let s = (0.5f64 / 3.0).sqrt() + 1e-8;
    assert_all_close(&a, &[0.5 / s, -0.5 / s, 0.0, 0.0], 1e-12, "reinforce++");
}

#[test]
fn dynamic_sampling_keeps_only_groups_with_different_rewards() {
    let kept = drop_equal_reward_groups(&[1.0, 1.0, 0.0, 1.0, 0.0, 0.0], 2).unwrap();
    assert_eq!(kept, vec![1]);
}

#[test]
fn rewards_that_do_not_fill_whole_groups_are_refused() {
    let err = AdvantageEstimator::default()
        .advantages(&[1.0, 0.0, 1.0], 2)
        .unwrap_err();
    assert!(err.to_string().contains("groups of 2"), "{err}");
    assert!(drop_equal_reward_groups(&[1.0], 0).is_err());
    assert!(
        AdvantageEstimator::DrGrpo
            .advantages(&[f64::NAN, 0.0], 2)
            .is_err()
    );
}

// ---------------------------------------------------------------- policy losses

/// Three tokens, one per row: ratio 1.5 with A = +1 (high-clipped), 1.5 with A = -1 (not
/// clipped), 0.5 with A = -1 (low-clipped); eps_low 0.2, eps_high 0.28.
#[test]
fn clipped_surrogate_uses_separate_low_and_high_epsilon() {
    let current = Var::from_tensor(&t2(&[&[1.5f64.ln()], &[1.5f64.ln()], &[0.5f64.ln()]])).unwrap();
    let old = t2(&[&[0.0], &[0.0], &[0.0]]);
    let mask = t2(&[&[1.0], &[1.0], &[1.0]]);
    let loss = PolicyLoss::Clipped {
        epsilon_low: 0.2,
        epsilon_high: 0.28,
        level: RatioLevel::Token,
    };
    let out = loss
        .per_token(current.as_tensor(), &old, &t1(&[1.0, -1.0, -1.0]), &mask)
        .unwrap();
    let per_token: Vec<f64> = rows(&out.per_token_loss).concat();
    assert_all_close(&per_token, &[-1.28, 1.5, 0.8], 1e-12, "per-token loss");
    let grads = out.per_token_loss.sum_all().unwrap().backward().unwrap();
    let grad = rows(grads.get(current.as_tensor()).unwrap()).concat();
    // d/dcur of -rho*A = -rho*A where unclipped; 0 where the clip holds.
    assert_all_close(&grad, &[0.0, 1.5, 0.0], 1e-12, "gradient");
    assert_close(out.clip.low, 1.0 / 3.0, 1e-12, "low clip fraction");
    assert_close(out.clip.high, 1.0 / 3.0, 1e-12, "high clip fraction");
    assert_close(out.clip.region, 2.0 / 3.0, 1e-12, "region clip fraction");
}

#[test]
fn gspo_ratio_is_exp_of_masked_mean_log_ratio_per_sequence() {
    // Log-ratios 0.2 and -0.1 count; the masked 5.0 must not.
    let current = t2(&[&[0.2, -0.1, 5.0]]);
    let old = t2(&[&[0.0, 0.0, 0.0]]);
    let mask = t2(&[&[1.0, 1.0, 0.0]]);
    let loss = PolicyLoss::gspo(0.2, 0.2);
    let ratio = rows(&loss.ratio(&current, &old, &mask).unwrap());
    assert_close(ratio[0][0], 0.05f64.exp(), 1e-12, "sequence ratio");
    let out = loss.per_token(&current, &old, &t1(&[2.0]), &mask).unwrap();
    assert_all_close(
        &rows(&out.per_token_loss)[0],
        &[-2.0 * 0.05f64.exp(); 3],
        1e-12,
        "broadcast loss",
    );
}

#[test]
fn cispo_weight_is_clipped_and_detached() {
    // Ratios 3 (clipped to 2) and 0.5; advantage 1.5.
    let current = Var::from_tensor(&t2(&[&[3.0f64.ln(), 0.5f64.ln()]])).unwrap();
    let old = t2(&[&[0.0, 0.0]]);
    let mask = t2(&[&[1.0, 1.0]]);
    let loss = PolicyLoss::Cispo {
        max_ratio: 2.0,
        level: RatioLevel::Token,
    };
    let out = loss
        .per_token(current.as_tensor(), &old, &t1(&[1.5]), &mask)
        .unwrap();
    assert_all_close(
        &rows(&out.per_token_loss)[0],
        &[-2.0 * 1.5 * 3.0f64.ln(), -0.5 * 1.5 * 0.5f64.ln()],
        1e-12,
        "loss",
    );
    let grads = out.per_token_loss.sum_all().unwrap().backward().unwrap();
    // The weight is a constant: d/dcur = -w * A, even for the clipped token.
    assert_all_close(
        &rows(grads.get(current.as_tensor()).unwrap())[0],
        &[-3.0, -0.75],
        1e-12,
        "gradient",
    );
    assert_close(out.clip.high, 0.5, 1e-12, "cispo clip fraction");
}

// ---------------------------------------------------------------- aggregation, KL, correction

#[test]
fn aggregations_weigh_tokens_and_sequences_as_documented() {
    let loss = t2(&[&[1.0, 2.0, 3.0], &[4.0, 9.0, 9.0]]);
    let mask = t2(&[&[1.0, 1.0, 1.0], &[1.0, 0.0, 0.0]]);
    let token_mean = LossAggregation::TokenMean.aggregate(&loss, &mask).unwrap();
    let seq_mean = LossAggregation::SequenceMeanTokenMean
        .aggregate(&loss, &mask)
        .unwrap();
    let sum_norm = LossAggregation::SequenceMeanTokenSumNorm { max_len: 5 }
        .aggregate(&loss, &mask)
        .unwrap();
    assert_close(scalar(&token_mean), 10.0 / 4.0, 1e-12, "token-mean");
    assert_close(
        scalar(&seq_mean),
        (2.0 + 4.0) / 2.0,
        1e-12,
        "sequence-mean-token-mean",
    );
    assert_close(
        scalar(&sum_norm),
        10.0 / (2.0 * 5.0),
        1e-12,
        "sequence-mean-token-sum-norm",
    );
}

#[test]
fn kl_estimators_match_schulman_definitions() {
    // cur = 0, ref = ln 2: log r = ln 2, r = 2.
    let current = t2(&[&[0.0]]);
    let reference = t2(&[&[2.0f64.ln()]]);
    let ln2 = 2.0f64.ln();
    let k = |e: KlEstimator| rows(&e.per_token(&current, &reference).unwrap())[0][0];
    assert_close(k(KlEstimator::K1), -ln2, 1e-12, "k1");
    assert_close(k(KlEstimator::K2), ln2 * ln2 / 2.0, 1e-12, "k2");
    assert_close(k(KlEstimator::K3), 1.0 - ln2, 1e-12, "k3");
}

#[test]
fn zero_beta_means_no_kl_term_and_negative_beta_is_refused() {
    assert_eq!(KlPenalty::new(KlEstimator::K3, 0.0).unwrap(), None);
    let err = KlPenalty::new(KlEstimator::K3, -0.1).unwrap_err();
    assert!(err.to_string().contains("beta"), "{err}");
}

#[test]
fn tis_truncates_the_ratio_at_the_cap() {
    // Ratios 3, 1, 0.25 and a masked 10.
    let trainer = t2(&[&[3.0f64.ln(), 0.0, 0.25f64.ln(), 10.0f64.ln()]]);
    let rollout = t2(&[&[0.0, 0.0, 0.0, 0.0]]);
    let mask = t2(&[&[1.0, 1.0, 1.0, 0.0]]);
    let out = MismatchCorrection::Tis { cap: 2.0 }
        .weights(&trainer, &rollout, &mask)
        .unwrap();
    assert_all_close(
        &rows(&out.weights)[0][..3],
        &[2.0, 1.0, 0.25],
        1e-12,
        "weights",
    );
    let s = out.stats;
    assert_eq!(s.tokens, 3);
    assert_close(s.mean, 4.25 / 3.0, 1e-12, "mean");
    assert_close(s.min, 0.25, 1e-12, "min");
    assert_close(s.max, 3.0, 1e-12, "max (masked 10 excluded)");
    assert_close(s.fraction_corrected, 1.0 / 3.0, 1e-12, "fraction corrected");
    assert_close(
        s.effective_sample_size,
        4.25 * 4.25 / (9.0 + 1.0 + 0.0625),
        1e-12,
        "ess",
    );
}

#[test]
fn icepop_zeroes_tokens_outside_the_band() {
    // Ratios 3 (kept), 0.25 (below 0.5), 6 (above 5), 1 (kept).
    let trainer = t2(&[&[3.0f64.ln(), 0.25f64.ln(), 6.0f64.ln(), 0.0]]);
    let rollout = t2(&[&[0.0; 4]]);
    let mask = t2(&[&[1.0; 4]]);
    let out = MismatchCorrection::IcePop {
        alpha: 0.5,
        beta: 5.0,
    }
    .weights(&trainer, &rollout, &mask)
    .unwrap();
    assert_all_close(
        &rows(&out.weights)[0],
        &[3.0, 0.0, 0.0, 1.0],
        1e-12,
        "weights",
    );
    assert_close(
        out.stats.fraction_corrected,
        0.5,
        1e-12,
        "fraction corrected",
    );
}

#[test]
fn equal_trainer_and_rollout_logprobs_give_full_effective_sample_size() {
    let lp = t2(&[&[-1.0, -2.0, -0.5]]);
    let out = MismatchCorrection::None
        .weights(&lp, &lp, &t2(&[&[1.0; 3]]))
        .unwrap();
    assert_close(out.stats.effective_sample_size, 3.0, 1e-12, "ess");
    assert_close(out.stats.fraction_corrected, 0.0, 0.0, "fraction corrected");
}

// ---------------------------------------------------------------- config and input checks

#[test]
fn config_defaults_and_unknown_keys() {
    let loss = toml::from_str::<GrpoLossFile>("")
        .unwrap()
        .into_config()
        .unwrap();
    assert_eq!(loss, GrpoLoss::default());
    assert_eq!(loss.aggregation, LossAggregation::TokenMean);
    assert_eq!(loss.advantage, AdvantageEstimator::Grpo { eps: 0.01 });
    let parsed: GrpoLossFile = toml::from_str(
        "beta = 0.04\nkl_estimator = \"k2\"\n[policy]\nkind = \"clipped\"\nepsilon_high = 0.28\nlevel = \"sequence\"\n[correction]\nkind = \"ice_pop\"\n",
    )
    .unwrap();
    let loss = parsed.into_config().unwrap();
    assert_eq!(
        loss.policy,
        PolicyLoss::Clipped {
            epsilon_low: 0.2,
            epsilon_high: 0.28,
            level: RatioLevel::Sequence
        }
    );
    assert_eq!(
        loss.kl,
        Some(KlPenalty {
            estimator: KlEstimator::K2,
            beta: 0.04
        })
    );
    assert_eq!(
        loss.correction,
        MismatchCorrection::IcePop {
            alpha: 0.5,
            beta: 5.0
        }
    );
    let err = toml::from_str::<GrpoLossFile>("[policy]\nkind = \"clipped\"\nepsilon = 0.2\n")
        .unwrap_err();
    assert!(err.to_string().contains("epsilon"), "{err}");
}

#[test]
fn invalid_epsilon_is_refused_naming_the_field() {
    let file: GrpoLossFile =
        toml::from_str("[policy]\nkind = \"clipped\"\nepsilon_low = 1.5\n").unwrap();
    let err = file.into_config().unwrap_err();
    assert!(
        matches!(
            err,
            GrpoError::Config {
                field: "policy.epsilon_low",
                ..
            }
        ),
        "{err}"
    );
}

#[test]
fn mismatched_shapes_and_missing_reference_are_errors() {
    let lp = t2(&[&[-1.0, -2.0]]);
    let mask = t2(&[&[1.0, 1.0]]);
    let short = t2(&[&[-1.0]]);
    let adv = t1(&[1.0]);
    let batch = PolicyBatch {
        current_logprobs: &lp,
        old_logprobs: &short,
        ref_logprobs: None,
        rollout_logprobs: None,
        advantages: &adv,
        mask: &mask,
    };
    let err = GrpoLoss::default().compute(&batch).unwrap_err();
    assert!(err.to_string().contains("old log-probs"), "{err}");
    let with_kl = GrpoLoss {
        kl: KlPenalty::new(KlEstimator::K3, 0.1).unwrap(),
        ..GrpoLoss::default()
    };
    let batch = PolicyBatch {
        old_logprobs: &lp,
        ..batch
    };
    let err = with_kl.compute(&batch).unwrap_err();
    assert!(err.to_string().contains("reference"), "{err}");
}

// ---------------------------------------------------------------- TRL oracle

#[derive(Deserialize)]
struct TrlFixture {
    trl_version: String,
    max_completion_length: usize,
    current_logprobs: Vec<Vec<f64>>,
    old_logprobs: Vec<Vec<f64>>,
    ref_logprobs: Vec<Vec<f64>>,
    advantages: Vec<f64>,
    mask: Vec<Vec<f64>>,
    cases: Vec<TrlCase>,
}

#[derive(Deserialize)]
struct TrlCase {
    name: String,
    loss_type: String,
    importance_sampling_level: String,
    epsilon_low: f64,
    epsilon_high: f64,
    beta: f64,
    loss: f64,
    grad_current_logprobs: Vec<Vec<f64>>,
    clip_low: Option<f64>,
    clip_high: Option<f64>,
    clip_region: Option<f64>,
    kl: Option<f64>,
}

fn tensor2(values: &[Vec<f64>]) -> Tensor {
    let refs: Vec<&[f64]> = values.iter().map(|r| r.as_slice()).collect();
    t2(&refs)
}

/// stoke's configuration equal to a TRL `loss_type` (see the `grpo` module doc for the mapping).
fn stoke_loss_for(case: &TrlCase, max_len: usize) -> GrpoLoss {
    let level = match case.importance_sampling_level.as_str() {
        "token" => RatioLevel::Token,
        "sequence" => RatioLevel::Sequence,
        other => panic!("{}: unknown level {other}", case.name),
    };
    let (policy, aggregation) = match case.loss_type.as_str() {
        "grpo" => (None, LossAggregation::SequenceMeanTokenMean),
        "bnpo" | "dapo" => (None, LossAggregation::TokenMean),
        "dr_grpo" => (None, LossAggregation::SequenceMeanTokenSumNorm { max_len }),
        "cispo" => (
            Some(PolicyLoss::Cispo {
                max_ratio: case.epsilon_high,
                level,
            }),
            LossAggregation::TokenMean,
        ),
        other => panic!("{}: unknown loss type {other}", case.name),
    };
    let policy = policy.unwrap_or(PolicyLoss::Clipped {
        epsilon_low: case.epsilon_low,
        epsilon_high: case.epsilon_high,
        level,
    });
    GrpoLoss {
        policy,
        aggregation,
        kl: KlPenalty::new(KlEstimator::K3, case.beta).unwrap(),
        ..GrpoLoss::default()
    }
}

#[test]
fn losses_gradients_and_metrics_match_trl_grpo_trainer() {
    let fixture: TrlFixture =
        serde_json::from_str(include_str!("../../../fixtures/grpo/trl_loss.json")).unwrap();
    assert_eq!(fixture.trl_version, "1.16.0");
    assert!(fixture.cases.len() >= 11, "fixture lost cases");
    let old = tensor2(&fixture.old_logprobs);
    let reference = tensor2(&fixture.ref_logprobs);
    let mask = tensor2(&fixture.mask);
    let advantages = t1(&fixture.advantages);
    let mut report = Vec::new();
    for case in &fixture.cases {
        let current = Var::from_tensor(&tensor2(&fixture.current_logprobs)).unwrap();
        let loss = stoke_loss_for(case, fixture.max_completion_length);
        let batch = PolicyBatch {
            current_logprobs: current.as_tensor(),
            old_logprobs: &old,
            ref_logprobs: Some(&reference),
            rollout_logprobs: None,
            advantages: &advantages,
            mask: &mask,
        };
        let out = loss.compute(&batch).unwrap();
        let loss_diff = (scalar(&out.loss) - case.loss).abs();
        assert!(
            loss_diff <= 1e-6,
            "{}: loss {} vs TRL {}",
            case.name,
            scalar(&out.loss),
            case.loss
        );
        let grads = out.loss.backward().unwrap();
        let grad = rows(grads.get(current.as_tensor()).unwrap()).concat();
        let trl_grad = case.grad_current_logprobs.concat();
        let grad_diff = grad
            .iter()
            .zip(&trl_grad)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0, f64::max);
        assert!(
            grad_diff <= 1e-6,
            "{}: gradient differs by {grad_diff}",
            case.name
        );
        if let Some(high) = case.clip_high {
            assert_close(
                out.clip.high,
                high,
                1e-12,
                &format!("{}: high clip fraction", case.name),
            );
        }
        if let Some(low) = case.clip_low {
            assert_close(
                out.clip.low,
                low,
                1e-12,
                &format!("{}: low clip fraction", case.name),
            );
        }
        if let Some(region) = case.clip_region {
            assert_close(
                out.clip.region,
                region,
                1e-12,
                &format!("{}: region clip fraction", case.name),
            );
        }
        match (case.kl, out.kl_mean) {
            (Some(trl), Some(ours)) => assert_close(ours, trl, 1e-9, &format!("{}: kl", case.name)),
            (None, None) => {}
            (trl, ours) => panic!(
                "{}: KL reported by TRL {trl:?}, by stoke {ours:?}",
                case.name
            ),
        }
        report.push(format!(
            "{}: |loss diff| {loss_diff:.1e}, max |grad diff| {grad_diff:.1e}",
            case.name
        ));
    }
    // Shown with --nocapture: the figures the closing note quotes.
    println!("{}", report.join("\n"));
}

#[test]
fn mismatch_weights_multiply_the_policy_loss_before_aggregation() {
    // Policy ratio 1 with A = 1 gives -1 per token; trainer/rollout ratios 3 (TIS-capped to 2) and 1.
    let current = t2(&[&[0.0, 0.0]]);
    let rollout = t2(&[&[-(3.0f64.ln()), 0.0]]);
    let mask = t2(&[&[1.0, 1.0]]);
    let adv = t1(&[1.0]);
    let loss = GrpoLoss {
        correction: MismatchCorrection::Tis { cap: 2.0 },
        ..GrpoLoss::default()
    };
    let batch = PolicyBatch {
        current_logprobs: &current,
        old_logprobs: &current,
        ref_logprobs: None,
        rollout_logprobs: Some(&rollout),
        advantages: &adv,
        mask: &mask,
    };
    let out = loss.compute(&batch).unwrap();
    assert_close(
        scalar(&out.loss),
        (-2.0 - 1.0) / 2.0,
        1e-12,
        "token-mean of weighted loss",
    );
    let stats = out
        .mismatch
        .expect("rollout log-probs given, stats expected");
    assert_close(stats.max, 3.0, 1e-12, "raw ratio max");
}

#[test]
fn f32_inputs_give_the_f64_loss_to_single_precision() {
    // Training runs in f32; the TRL cases are f64. Same inputs, both dtypes, default loss + KL.
    let fixture: TrlFixture =
        serde_json::from_str(include_str!("../../../fixtures/grpo/trl_loss.json")).unwrap();
    let loss = GrpoLoss {
        kl: KlPenalty::new(KlEstimator::K3, 0.04).unwrap(),
        ..GrpoLoss::default()
    };
    let run = |dtype: DType| {
        let cast = |t: Tensor| t.to_dtype(dtype).unwrap();
        let current = cast(tensor2(&fixture.current_logprobs));
        let old = cast(tensor2(&fixture.old_logprobs));
        let reference = cast(tensor2(&fixture.ref_logprobs));
        let mask = cast(tensor2(&fixture.mask));
        let advantages = cast(t1(&fixture.advantages));
        let batch = PolicyBatch {
            current_logprobs: &current,
            old_logprobs: &old,
            ref_logprobs: Some(&reference),
            rollout_logprobs: None,
            advantages: &advantages,
            mask: &mask,
        };
        scalar(&loss.compute(&batch).unwrap().loss)
    };
    assert_close(run(DType::F32), run(DType::F64), 1e-5, "f32 vs f64 loss");
}

#[test]
fn mixed_dtypes_are_an_error_naming_the_input() {
    let lp = t2(&[&[-1.0, -2.0]]);
    let mask = t2(&[&[1.0, 1.0]]).to_dtype(DType::F32).unwrap();
    let adv = t1(&[1.0]);
    let batch = PolicyBatch {
        current_logprobs: &lp,
        old_logprobs: &lp,
        ref_logprobs: None,
        rollout_logprobs: None,
        advantages: &adv,
        mask: &mask,
    };
    let err = GrpoLoss::default().compute(&batch).unwrap_err();
    assert!(err.to_string().contains("mask: dtype F32"), "{err}");
}
