//! `grpo::update`: one GRPO optimizer step. Micro-batching equals one batch for every
//! aggregation, the step moves log-probs the advantage's way, non-finite inputs or losses leave
//! the weights alone, EOS-only completions train, the reported figures (clip fractions, KL,
//! mismatch ratio, lr) are right, PTX adds its loss, and the KL-in-reward penalty.

mod common;

use stoke_data::packing::PackedBatch;
use stoke_optim::{AdamWConfig, LrSchedule, OptimizerConfig};
use stoke_train::grpo::{
    GrpoLoss, KlEstimator, KlPenalty, LossAggregation, MismatchCorrection, PolicyLoss,
    PolicySample, PolicyUpdater, SequenceRow, UpdateOutcome, UpdateReport, UpdateSettings,
    completion_logprobs, kl_reward_penalty, token_budget_batches,
};

use common::{Rng, VOCAB, nano_model, parameter_values, random_batch};

/// An owned sample; `sample()` borrows it as a `PolicySample`.
#[derive(Clone, Debug)]
struct Owned {
    prompt: Vec<u32>,
    completion: Vec<u32>,
    rollout: Vec<f32>,
    old: Option<Vec<f32>>,
    reference: Option<Vec<f32>>,
    advantage: f64,
}

impl Owned {
    fn sample(&self) -> PolicySample<'_> {
        PolicySample {
            prompt_ids: &self.prompt,
            completion_ids: &self.completion,
            rollout_logprobs: &self.rollout,
            old_logprobs: self.old.as_deref(),
            ref_logprobs: self.reference.as_deref(),
            advantage: self.advantage,
            loss_mask: None,
            token_advantages: None,
        }
    }
}

fn borrowed(owned: &[Owned]) -> Vec<PolicySample<'_>> {
    owned.iter().map(Owned::sample).collect()
}

fn settings(loss: GrpoLoss, micro_batch_tokens: usize) -> UpdateSettings {
    UpdateSettings {
        loss,
        schedule: LrSchedule::Constant { warmup_steps: 0 },
        clip_grad_norm: None,
        micro_batch_tokens,
        ptx_coef: None,
        use_mismatch_correction: false,
    }
}

fn adamw(lr: f64) -> OptimizerConfig {
    OptimizerConfig::AdamW(AdamWConfig {
        lr,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1e-8,
        weight_decay: 0.0,
        moments: Default::default(),
    })
}

fn updater(seed: u64, lr: f64, settings: UpdateSettings) -> PolicyUpdater {
    PolicyUpdater::new(nano_model(seed), adamw(lr), settings).expect("updater")
}

/// AdamW's first step is `lr * g / (|g| + eps)`: with a small eps it is about `lr * sign(g)`,
/// which hides how large a gradient is and turns rounding-level differences of gradients near
/// eps into visible ones. With `eps = 1` and `lr = 1` the step is `g / (|g| + 1)`, close to `g`
/// for the small gradients of a tiny model, so weights after one step compare the gradients
/// themselves.
fn gradient_revealing_updater(seed: u64, settings: UpdateSettings) -> PolicyUpdater {
    PolicyUpdater::new(nano_model(seed), gradient_revealing_optimizer(), settings).expect("updater")
}

/// AdamW with `lr = 1`, `eps = 1` (see `gradient_revealing_updater`).
fn gradient_revealing_optimizer() -> OptimizerConfig {
    OptimizerConfig::AdamW(AdamWConfig {
        lr: 1.0,
        beta1: 0.9,
        beta2: 0.95,
        eps: 1.0,
        weight_decay: 0.0,
        moments: Default::default(),
    })
}

/// Log-probs of each sample's completion under the updater's current policy, at temperature 1.
fn current_logprobs(updater: &PolicyUpdater, owned: &[Owned]) -> Vec<Vec<f32>> {
    let rows: Vec<SequenceRow<'_>> = owned
        .iter()
        .map(|o| SequenceRow {
            prompt_ids: &o.prompt,
            completion_ids: &o.completion,
        })
        .collect();
    let scores = completion_logprobs(updater.model(), &rows, 1.0, false).expect("scores");
    let values = scores.logprobs.to_vec2::<f32>().expect("f32");
    values
        .into_iter()
        .zip(owned)
        .map(|(row, o)| row[..o.completion.len()].to_vec())
        .collect()
}

/// Samples with different prompt and completion lengths and advantages of both signs.
fn fixture(seed: u64) -> Vec<Owned> {
    let mut rng = Rng(seed);
    let shapes = [(4, 6), (7, 2), (3, 9), (5, 5), (2, 1), (6, 8)];
    shapes
        .iter()
        .enumerate()
        .map(|(i, &(p, c))| Owned {
            prompt: (0..p).map(|_| rng.below(VOCAB as u64) as u32).collect(),
            completion: (0..c).map(|_| rng.below(VOCAB as u64) as u32).collect(),
            rollout: vec![0.0; c],
            old: None,
            reference: None,
            advantage: [1.0, -0.5, 0.8, -1.2, 0.3, -0.1][i],
        })
        .collect()
}

/// Gives every other sample old log-probs off the current ones (so ratios differ from 1 and
/// some tokens clip) and the rest none (on-policy).
fn with_old_logprobs(updater: &PolicyUpdater, mut owned: Vec<Owned>) -> Vec<Owned> {
    let current = current_logprobs(updater, &owned);
    for (i, (sample, lp)) in owned.iter_mut().zip(current).enumerate() {
        if i % 2 == 0 {
            let shift = [0.3f32, -0.4, 0.05, -0.1];
            sample.old = Some(
                lp.iter()
                    .enumerate()
                    .map(|(t, x)| x + shift[t % shift.len()])
                    .collect(),
            );
        }
    }
    owned
}

fn max_weight_difference(a: &PolicyUpdater, b: &PolicyUpdater) -> f32 {
    parameter_values(a.model())
        .iter()
        .zip(parameter_values(b.model()))
        .flat_map(|((_, x), (_, y))| {
            x.iter()
                .zip(y)
                .map(|(p, q)| (p - q).abs())
                .collect::<Vec<_>>()
        })
        .fold(0.0, f32::max)
}

/// One batch vs many micro-batches: same loss, grad norm, clip figures and weights.
fn check_micro_batching_is_invisible(aggregation: LossAggregation) {
    let loss = GrpoLoss {
        aggregation,
        ..GrpoLoss::default()
    };
    let mut whole = gradient_revealing_updater(7, settings(loss, 10_000));
    let mut split = gradient_revealing_updater(7, settings(loss, 14));
    let owned = with_old_logprobs(&whole, fixture(21));
    let lengths: Vec<usize> = owned
        .iter()
        .map(|o| o.prompt.len() + o.completion.len())
        .collect();
    assert!(
        token_budget_batches(&lengths, 14).len() >= 4,
        "the split makes micro-batches"
    );
    let a = whole.update(&borrowed(&owned), 1.0, None).expect("whole");
    let b = split.update(&borrowed(&owned), 1.0, None).expect("split");
    assert_eq!(a.outcome, UpdateOutcome::Applied);
    assert_eq!(b.outcome, UpdateOutcome::Applied);
    assert!(
        (a.loss - b.loss).abs() < 1e-6,
        "loss {} vs {}",
        a.loss,
        b.loss
    );
    let rel = (a.grad_norm - b.grad_norm).abs() / a.grad_norm;
    assert!(rel < 1e-5, "grad norm {} vs {}", a.grad_norm, b.grad_norm);
    assert!(a.clip.region > 0.0, "the fixture clips some tokens");
    assert!((a.clip.region - b.clip.region).abs() < 1e-9);
    assert!((a.entropy_mean - b.entropy_mean).abs() < 1e-5);
    let diff = max_weight_difference(&whole, &split);
    assert!(diff < 1e-5, "weights differ by {diff} after one step");
    // The step did move the weights (the comparison above is not between two untouched models).
    let fresh = gradient_revealing_updater(7, settings(loss, 10_000));
    let moved = max_weight_difference(&whole, &fresh);
    assert!(moved > 1e-3, "largest step {moved}");
}

#[test]
fn micro_batching_equals_one_batch_under_token_mean() {
    check_micro_batching_is_invisible(LossAggregation::TokenMean);
}

#[test]
fn micro_batching_equals_one_batch_under_sequence_mean_token_mean() {
    check_micro_batching_is_invisible(LossAggregation::SequenceMeanTokenMean);
}

#[test]
fn micro_batching_equals_one_batch_under_dr_grpo() {
    check_micro_batching_is_invisible(LossAggregation::SequenceMeanTokenSumNorm { max_len: 12 });
}

fn single_sample_logprob_change(advantage: f64) -> (f32, f32) {
    let mut updater = updater(8, 1e-2, settings(GrpoLoss::default(), 4096));
    let mut owned = fixture(22);
    owned.truncate(1);
    owned[0].advantage = advantage;
    let before: f32 = current_logprobs(&updater, &owned)[0].iter().sum();
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert_eq!(report.outcome, UpdateOutcome::Applied);
    let after: f32 = current_logprobs(&updater, &owned)[0].iter().sum();
    (before, after)
}

#[test]
fn a_positive_advantage_raises_the_completions_logprob() {
    let (before, after) = single_sample_logprob_change(1.0);
    assert!(after > before + 1e-3, "log-prob {before} -> {after}");
}

#[test]
fn a_negative_advantage_lowers_the_completions_logprob() {
    let (before, after) = single_sample_logprob_change(-1.0);
    assert!(after < before - 1e-3, "log-prob {before} -> {after}");
}

fn assert_skipped_and_untouched(
    updater: &PolicyUpdater,
    before: &[(String, Vec<f32>)],
    report: &UpdateReport,
) {
    assert_eq!(report.outcome, UpdateOutcome::SkippedNonFinite);
    assert!(report.grad_norm.is_nan());
    assert_eq!(updater.optimizer().steps_taken(), 0, "no optimizer step");
    assert_eq!(
        updater.steps(),
        1,
        "the skipped update still counts as a step"
    );
    let after = parameter_values(updater.model());
    for ((name, x), (_, y)) in before.iter().zip(&after) {
        let same = x.iter().zip(y).all(|(a, b)| a.to_bits() == b.to_bits());
        assert!(same, "{name} changed in a skipped update");
    }
}

#[test]
fn a_nan_advantage_skips_the_update_and_leaves_the_weights() {
    let mut updater = updater(9, 1e-2, settings(GrpoLoss::default(), 4096));
    let mut owned = fixture(23);
    owned[3].advantage = f64::NAN;
    let before = parameter_values(updater.model());
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert_skipped_and_untouched(&updater, &before, &report);
}

#[test]
fn a_nan_rollout_logprob_skips_the_update_when_mismatch_correction_reads_it() {
    let mut update_settings = settings(GrpoLoss::default(), 4096);
    update_settings.loss.correction = MismatchCorrection::Tis { cap: 2.0 };
    update_settings.use_mismatch_correction = true;
    let mut updater = updater(10, 1e-2, update_settings);
    let mut owned = fixture(24);
    let current = current_logprobs(&updater, &owned);
    for (sample, lp) in owned.iter_mut().zip(current) {
        sample.rollout = lp;
    }
    owned[2].rollout[1] = f32::NAN;
    let before = parameter_values(updater.model());
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert_skipped_and_untouched(&updater, &before, &report);
}

#[test]
fn a_non_finite_loss_from_the_model_skips_the_update() {
    let mut updater = updater(11, 1e-2, settings(GrpoLoss::default(), 4096));
    let owned = fixture(25);
    // Poison one weight: the forward pass, hence the loss, becomes NaN.
    let (name, var) = updater
        .model()
        .parameters()
        .into_iter()
        .nth(3)
        .expect("a parameter");
    let nan = (var.as_tensor().zeros_like().unwrap() + f64::NAN).unwrap();
    var.set(&nan).unwrap();
    let before = parameter_values(updater.model());
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert!(
        report.loss.is_nan(),
        "{name} poisoned, loss {}",
        report.loss
    );
    assert_skipped_and_untouched(&updater, &before, &report);
}

#[test]
fn an_eos_only_completion_trains() {
    let mut updater = updater(12, 1e-2, settings(GrpoLoss::default(), 4096));
    let eos = 2u32;
    let owned = vec![Owned {
        prompt: vec![5, 6, 7],
        completion: vec![eos],
        rollout: vec![-5.0],
        old: None,
        reference: None,
        advantage: 1.0,
    }];
    let before = parameter_values(updater.model());
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert_eq!(report.outcome, UpdateOutcome::Applied);
    assert_eq!(report.tokens, 1);
    assert!(report.loss.is_finite() && report.grad_norm > 0.0);
    assert_ne!(before, parameter_values(updater.model()));
}

#[test]
fn no_samples_or_no_tokens_skip_as_empty() {
    let mut updater = updater(13, 1e-2, settings(GrpoLoss::default(), 4096));
    let report = updater.update(&[], 1.0, None).expect("no samples");
    assert_eq!(report.outcome, UpdateOutcome::SkippedEmpty);
    let owned = vec![Owned {
        prompt: vec![5, 6],
        completion: vec![],
        rollout: vec![],
        old: None,
        reference: None,
        advantage: 1.0,
    }];
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("no tokens");
    assert_eq!(report.outcome, UpdateOutcome::SkippedEmpty);
    assert_eq!(updater.optimizer().steps_taken(), 0);
    assert_eq!(updater.steps(), 2);
}

#[test]
fn malformed_samples_are_refused_with_the_sample_named_and_nothing_counted() {
    let mut updater = updater(14, 1e-2, settings(GrpoLoss::default(), 4096));
    let mut owned = fixture(26);
    owned[1].old = Some(vec![0.0; owned[1].completion.len() + 1]);
    let err = updater.update(&borrowed(&owned), 1.0, None).unwrap_err();
    assert!(err.to_string().contains("policy sample 1"), "{err}");
    assert!(err.to_string().contains("old_logprobs"), "{err}");
    assert_eq!(updater.steps(), 0);

    let mut with_kl = settings(GrpoLoss::default(), 4096);
    with_kl.loss.kl = KlPenalty::new(KlEstimator::K3, 0.1).expect("beta");
    let mut updater = self::updater(14, 1e-2, with_kl);
    let err = updater
        .update(&borrowed(&fixture(26)), 1.0, None)
        .unwrap_err();
    assert!(err.to_string().contains("ref_logprobs"), "{err}");
}

/// Sample 0: A > 0, ratio e (high-clipped); sample 1: A < 0, ratio 1 (not clipped);
/// sample 2: A < 0, ratio 1/e (low-clipped).
fn clip_fixture(updater: &PolicyUpdater) -> Vec<Owned> {
    let mut owned = fixture(27);
    owned.truncate(3);
    let current = current_logprobs(updater, &owned);
    let shifts = [-1.0f32, 0.0, 1.0];
    let advantages = [1.0, -1.0, -1.0];
    for (i, (sample, lp)) in owned.iter_mut().zip(current).enumerate() {
        sample.old = Some(lp.iter().map(|x| x + shifts[i]).collect());
        sample.advantage = advantages[i];
    }
    owned
}

#[test]
fn clip_fractions_count_tokens_across_micro_batches() {
    let mut updater = updater(15, 1e-3, settings(GrpoLoss::default(), 12));
    let owned = clip_fixture(&updater);
    let tokens: Vec<f64> = owned.iter().map(|o| o.completion.len() as f64).collect();
    let total: f64 = tokens.iter().sum();
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert!(
        (report.clip.high - tokens[0] / total).abs() < 1e-9,
        "{:?}",
        report.clip
    );
    assert!(
        (report.clip.low - tokens[2] / total).abs() < 1e-9,
        "{:?}",
        report.clip
    );
    let region = (tokens[0] + tokens[2]) / total;
    assert!(
        (report.clip.region - region).abs() < 1e-9,
        "{:?}",
        report.clip
    );
}

#[test]
fn sequence_level_clip_fractions_count_completions() {
    let loss = GrpoLoss {
        policy: PolicyLoss::gspo(0.2, 0.2),
        ..GrpoLoss::default()
    };
    let mut updater = updater(16, 1e-3, settings(loss, 12));
    let owned = clip_fixture(&updater);
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert!(
        (report.clip.high - 1.0 / 3.0).abs() < 1e-9,
        "{:?}",
        report.clip
    );
    assert!(
        (report.clip.low - 1.0 / 3.0).abs() < 1e-9,
        "{:?}",
        report.clip
    );
    assert!(
        (report.clip.region - 2.0 / 3.0).abs() < 1e-9,
        "{:?}",
        report.clip
    );
}

#[test]
fn kl_and_mismatch_figures_combine_across_micro_batches() {
    let mut update_settings = settings(GrpoLoss::default(), 12);
    update_settings.loss.kl = KlPenalty::new(KlEstimator::K3, 0.05).expect("beta");
    update_settings.loss.correction = MismatchCorrection::Tis { cap: 2.0 };
    update_settings.use_mismatch_correction = true;
    let mut updater = updater(17, 1e-3, update_settings);
    let mut owned = fixture(28);
    let current = current_logprobs(&updater, &owned);
    for (sample, lp) in owned.iter_mut().zip(current) {
        // ratio trainer/rollout = e^0.1 on every token; log(ref/current) = 0.2.
        sample.rollout = lp.iter().map(|x| x - 0.1).collect();
        sample.reference = Some(lp.iter().map(|x| x + 0.2).collect());
    }
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert_eq!(report.outcome, UpdateOutcome::Applied);
    let k3 = 0.2f64.exp() - 0.2 - 1.0;
    let kl = report.kl_mean.expect("KL on");
    assert!((kl - k3).abs() < 1e-5, "kl {kl} vs {k3}");
    let stats = report.mismatch.expect("correction on");
    let total: usize = owned.iter().map(|o| o.completion.len()).sum();
    assert_eq!(stats.tokens, total);
    assert!((stats.mean - 0.1f64.exp()).abs() < 1e-5, "{stats:?}");
    assert!((stats.min - 0.1f64.exp()).abs() < 1e-5 && (stats.max - stats.min).abs() < 1e-5);
    assert!(
        (stats.effective_sample_size - total as f64).abs() < 1e-3,
        "{stats:?}"
    );
    assert_eq!(stats.fraction_corrected, 0.0);
}

#[test]
fn the_learning_rate_follows_the_schedule_from_the_step_count() {
    let mut update_settings = settings(GrpoLoss::default(), 4096);
    let schedule = LrSchedule::Constant { warmup_steps: 10 };
    update_settings.schedule = schedule.clone();
    let mut updater = updater(18, 1e-2, update_settings);
    let owned = fixture(29);
    let first = updater.update(&borrowed(&owned), 1.0, None).expect("first");
    assert!((first.lr - 1e-2 * schedule.lr_factor(0)).abs() < 1e-15);
    updater.set_steps(5);
    let resumed = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("resumed");
    assert!((resumed.lr - 1e-2 * schedule.lr_factor(5)).abs() < 1e-15);
    assert!(resumed.lr > first.lr);
    assert_eq!(updater.steps(), 6);
}

fn ptx_batch() -> PackedBatch {
    random_batch(&mut Rng(30), 2, 16)
}

#[test]
fn ptx_adds_its_scaled_next_token_loss() {
    let owned = fixture(31);
    let mut plain = updater(19, 1e-3, settings(GrpoLoss::default(), 4096));
    let mut mixed_settings = settings(GrpoLoss::default(), 4096);
    mixed_settings.ptx_coef = Some(0.5);
    let mut mixed = updater(19, 1e-3, mixed_settings);
    let batch = ptx_batch();
    let without = plain
        .update(&borrowed(&owned), 1.0, Some(&batch))
        .expect("plain");
    let with = mixed
        .update(&borrowed(&owned), 1.0, Some(&batch))
        .expect("mixed");
    assert_eq!(
        without.ptx_loss, None,
        "no coefficient: the batch is ignored"
    );
    let ptx = with.ptx_loss.expect("PTX ran");
    // A near-uniform tiny model: the next-token loss is about ln(vocab).
    assert!((ptx - (VOCAB as f64).ln()).abs() < 0.5, "ptx loss {ptx}");
    assert!((with.loss - (without.loss + 0.5 * ptx)).abs() < 1e-5);
    assert!(
        max_weight_difference(&plain, &mixed) > 1e-6,
        "PTX changed the gradient"
    );
}

#[test]
fn temperature_changes_the_update() {
    let owned = fixture(32);
    let mut cold = updater(20, 1e-3, settings(GrpoLoss::default(), 4096));
    let mut hot = updater(20, 1e-3, settings(GrpoLoss::default(), 4096));
    let a = cold.update(&borrowed(&owned), 0.5, None).expect("cold");
    let b = hot.update(&borrowed(&owned), 1.0, None).expect("hot");
    assert!((a.entropy_mean - b.entropy_mean).abs() > 1e-3);
    assert!(max_weight_difference(&cold, &hot) > 1e-6);
}

#[test]
fn kl_reward_penalty_is_beta_times_the_summed_k1() {
    let rollout = [-1.0f32, -2.0, -0.5];
    let reference = [-1.5f32, -1.0, -0.5];
    // 0.1 * ((-1 + 1.5) + (-2 + 1) + 0) = 0.1 * -0.5
    assert!((kl_reward_penalty(&rollout, &reference, None, 0.1) + 0.05).abs() < 1e-12);
    assert_eq!(kl_reward_penalty(&rollout, &reference, None, 0.0), 0.0);
    assert_eq!(kl_reward_penalty(&[], &[], None, 1.0), 0.0);
    // Multi-turn: the environment's token (the second) is left out of the sum.
    let mask = [true, false, true];
    assert!((kl_reward_penalty(&rollout, &reference, Some(&mask), 0.1) - 0.05).abs() < 1e-12);
    let all = [true; 3];
    assert_eq!(
        kl_reward_penalty(&rollout, &reference, Some(&all), 0.1),
        kl_reward_penalty(&rollout, &reference, None, 0.1)
    );
}

#[test]
fn update_settings_are_validated_with_the_field_named() {
    let mut bad = settings(GrpoLoss::default(), 0);
    let err = PolicyUpdater::new(nano_model(1), adamw(1e-3), bad.clone()).unwrap_err();
    assert!(err.to_string().contains("micro_batch_tokens"), "{err}");
    bad.micro_batch_tokens = 16;
    bad.clip_grad_norm = Some(f64::NAN);
    let err = PolicyUpdater::new(nano_model(1), adamw(1e-3), bad.clone()).unwrap_err();
    assert!(err.to_string().contains("clip_grad_norm"), "{err}");
    bad.clip_grad_norm = Some(1.0);
    bad.ptx_coef = Some(-1.0);
    let err = PolicyUpdater::new(nano_model(1), adamw(1e-3), bad).unwrap_err();
    assert!(err.to_string().contains("ptx"), "{err}");
}

/// Activation checkpointing (and the chunked LM head it switches on) changes memory, not the
/// update: loss, grad norm and the weights after one step are bit-identical.
#[test]
fn activation_checkpointing_leaves_the_update_bit_identical() {
    let loss = GrpoLoss::default();
    let mut plain = gradient_revealing_updater(7, settings(loss, 10_000));
    let mut model = nano_model(7);
    model.set_activation_checkpointing(true);
    let mut ckpt = PolicyUpdater::new(
        model,
        gradient_revealing_optimizer(),
        settings(loss, 10_000),
    )
    .expect("updater");
    let owned = with_old_logprobs(&plain, fixture(21));
    let a = plain.update(&borrowed(&owned), 1.0, None).expect("plain");
    let b = ckpt
        .update(&borrowed(&owned), 1.0, None)
        .expect("checkpointed");
    assert_eq!(a.outcome, UpdateOutcome::Applied);
    assert_eq!(a.loss.to_bits(), b.loss.to_bits());
    assert_eq!(a.grad_norm.to_bits(), b.grad_norm.to_bits());
    assert_eq!(max_weight_difference(&plain, &ckpt), 0.0);
    let fresh = gradient_revealing_updater(7, settings(loss, 10_000));
    assert!(
        max_weight_difference(&plain, &fresh) > 1e-3,
        "the step moved the weights"
    );
}
