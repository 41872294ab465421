//! `grpo::update` with a per-token loss mask (multi-turn episodes: the model's tokens
//! interleaved with the environment's). A masked update equals, in loss and in every parameter's
//! gradient, a reference built by hand from `completion_logprobs` with the environment's
//! positions dropped from every sum (token-mean, sequence-mean, with the KL term, split into
//! micro-batches or not); figures count only the model's tokens; the environment's entries are
//! never read (KL, mismatch correction, sequence-level ratio, on-policy distillation); an
//! all-false mask contributes nothing; a mask of the wrong length is refused; `None` and an
//! all-true mask give the same update bit for bit.

mod common;

use candle_core::{Device, Tensor};
use stoke_optim::{AdamWConfig, LrSchedule, OptimizerConfig};
use stoke_train::grpo::opd::OpdConfig;
use stoke_train::grpo::{
    GrpoLoss, KlEstimator, KlPenalty, LossAggregation, MismatchCorrection, PolicyLoss,
    PolicySample, PolicyUpdater, SequenceRow, UpdateOutcome, UpdateSettings, completion_logprobs,
};

use common::{Rng, VOCAB, gradient_values, nano_model, parameter_values};

/// An owned sample with its loss mask; `sample()` borrows it as a `PolicySample`.
#[derive(Clone, Debug)]
struct Owned {
    prompt: Vec<u32>,
    completion: Vec<u32>,
    rollout: Vec<f32>,
    reference: Option<Vec<f32>>,
    advantage: f64,
    loss_mask: Option<Vec<bool>>,
}

impl Owned {
    fn sample(&self) -> PolicySample<'_> {
        PolicySample {
            prompt_ids: &self.prompt,
            completion_ids: &self.completion,
            rollout_logprobs: &self.rollout,
            old_logprobs: None,
            ref_logprobs: self.reference.as_deref(),
            advantage: self.advantage,
            loss_mask: self.loss_mask.as_deref(),
            token_advantages: None,
        }
    }

    /// Whether the loss trains on completion token `t`.
    fn counts(&self, t: usize) -> bool {
        self.loss_mask.as_ref().is_none_or(|mask| mask[t])
    }
}

fn borrowed(owned: &[Owned]) -> Vec<PolicySample<'_>> {
    owned.iter().map(Owned::sample).collect()
}

/// `model` turns (`true`) and `environment` turns (`false`) of the given lengths, in order.
fn turns(spans: &[(usize, bool)]) -> Vec<bool> {
    spans
        .iter()
        .flat_map(|&(len, model)| std::iter::repeat_n(model, len))
        .collect()
}

/// A group of three episodes of one prompt (model A, environment E, model B: the shape of a
/// tool call), one more prompt's episode that starts with environment tokens, and a
/// single-turn sample without a mask. The environment's rollout log-probs are 0.0, as the
/// records store them.
fn episodes(seed: u64) -> Vec<Owned> {
    let mut rng = Rng(seed);
    let mut ids =
        |n: usize| -> Vec<u32> { (0..n).map(|_| rng.below(VOCAB as u64) as u32).collect() };
    let prompt = ids(5);
    let masks = [
        Some(turns(&[(3, true), (4, false), (2, true)])),
        Some(turns(&[(2, true), (2, false), (5, true)])),
        Some(turns(&[(1, true), (6, false), (1, true), (1, false)])),
        Some(turns(&[(2, false), (4, true), (3, false), (1, true)])),
        None,
    ];
    let advantages = [1.0, -0.7, 0.4, -1.1, 0.6];
    masks
        .into_iter()
        .zip(advantages)
        .enumerate()
        .map(|(i, (loss_mask, advantage))| {
            let len = loss_mask.as_ref().map_or(6, Vec::len);
            let rollout = (0..len)
                .map(|t| match &loss_mask {
                    Some(mask) if !mask[t] => 0.0,
                    _ => -1.5,
                })
                .collect();
            Owned {
                prompt: if i < 3 { prompt.clone() } else { ids(3 + i) },
                completion: ids(len),
                rollout,
                reference: None,
                advantage,
                loss_mask,
            }
        })
        .collect()
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

/// AdamW with `lr = 1`, `eps = 1` and no decay: its first step is exactly `g / (|g| + 1)`
/// (`m = (1 - b1) g`, `v = (1 - b2) g^2`, both bias-corrected back to `g` and `g^2`), so the
/// weights after one step give every parameter's gradient.
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

fn updater(seed: u64, settings: UpdateSettings) -> PolicyUpdater {
    PolicyUpdater::new(nano_model(seed), gradient_revealing_optimizer(), settings).expect("updater")
}

/// Per-token log-probs of every completion under `nano_model(seed)`, without the graph.
fn logprob_rows(seed: u64, owned: &[Owned]) -> Vec<Vec<f32>> {
    let model = nano_model(seed);
    let rows: Vec<SequenceRow<'_>> = owned
        .iter()
        .map(|o| SequenceRow {
            prompt_ids: &o.prompt,
            completion_ids: &o.completion,
        })
        .collect();
    completion_logprobs(&model, &rows, 1.0, false)
        .expect("scores")
        .logprob_rows()
        .expect("rows")
}

/// The GRPO loss of an on-policy update (ratio 1, so the clipped surrogate is `-A * ratio` with
/// its gradient `-A * d log p`), plus `beta * k3` when `beta` is given, over the tokens `counts`
/// keeps, aggregated as `aggregation` does, written out by hand: each kept position is picked
/// out of the `[B, T]` log-probs by index, so a dropped position cannot reach the sums. Returns
/// the loss and every parameter's gradient.
fn reference(
    seed: u64,
    owned: &[Owned],
    aggregation: LossAggregation,
    beta: Option<f64>,
    counts: impl Fn(&Owned, usize) -> bool,
) -> (f64, Vec<Vec<f32>>) {
    let model = nano_model(seed);
    let rows: Vec<SequenceRow<'_>> = owned
        .iter()
        .map(|o| SequenceRow {
            prompt_ids: &o.prompt,
            completion_ids: &o.completion,
        })
        .collect();
    let scores = completion_logprobs(&model, &rows, 1.0, false).expect("scores");
    let device = Device::Cpu;
    let zero = || Tensor::zeros((), candle_core::DType::F32, &device).unwrap();
    let mut token_sum = zero();
    let mut sequence_mean_sum = zero();
    let mut kept_tokens = 0usize;
    for (b, sample) in owned.iter().enumerate() {
        let kept: Vec<u32> = (0..sample.completion.len())
            .filter(|&t| counts(sample, t))
            .map(|t| t as u32)
            .collect();
        if kept.is_empty() {
            continue;
        }
        let index = Tensor::new(kept.as_slice(), &device).unwrap();
        let current = scores
            .logprobs
            .get(b)
            .unwrap()
            .index_select(&index, 0)
            .unwrap();
        let ratio = (&current - current.detach()).unwrap().exp().unwrap();
        let mut per_token = (ratio * -sample.advantage).unwrap();
        if let Some(beta) = beta {
            let reference = sample.reference.as_ref().expect("reference log-probs");
            let kept_reference: Vec<f32> = kept.iter().map(|&t| reference[t as usize]).collect();
            let reference = Tensor::new(kept_reference.as_slice(), &device).unwrap();
            let log_r = (reference - &current).unwrap();
            let k3 = ((log_r.exp().unwrap() - &log_r).unwrap() - 1.0).unwrap();
            per_token = (per_token + (k3 * beta).unwrap()).unwrap();
        }
        let sum = per_token.sum_all().unwrap();
        sequence_mean_sum = (sequence_mean_sum + (&sum / kept.len() as f64).unwrap()).unwrap();
        token_sum = (token_sum + sum).unwrap();
        kept_tokens += kept.len();
    }
    let loss = match aggregation {
        LossAggregation::TokenMean => (token_sum / kept_tokens as f64).unwrap(),
        LossAggregation::SequenceMeanTokenMean => (sequence_mean_sum / owned.len() as f64).unwrap(),
        LossAggregation::SequenceMeanTokenSumNorm { max_len } => {
            (token_sum / (owned.len() * max_len) as f64).unwrap()
        }
    };
    let value = loss.to_scalar::<f32>().unwrap() as f64;
    let grads = loss.backward().unwrap();
    (value, gradient_values(&model, &grads))
}

/// The weights one gradient-revealing AdamW step from `nano_model(seed)` with `gradients`.
fn stepped_weights(seed: u64, gradients: &[Vec<f32>]) -> Vec<Vec<f32>> {
    parameter_values(&nano_model(seed))
        .into_iter()
        .zip(gradients)
        .map(|((_, weights), grads)| {
            weights
                .iter()
                .zip(grads)
                .map(|(w, g)| w - g / (g.abs() + 1.0))
                .collect()
        })
        .collect()
}

fn max_difference(a: &[Vec<f32>], b: &[Vec<f32>]) -> f32 {
    a.iter()
        .zip(b)
        .flat_map(|(x, y)| x.iter().zip(y).map(|(p, q)| (p - q).abs()))
        .fold(0.0, f32::max)
}

fn weights(updater: &PolicyUpdater) -> Vec<Vec<f32>> {
    parameter_values(updater.model())
        .into_iter()
        .map(|(_, values)| values)
        .collect()
}

/// The masked update (whole and split into micro-batches) against the hand-written reference,
/// and against the reference that keeps every token (which must differ, or the test would
/// prove nothing).
fn check_against_reference(aggregation: LossAggregation, beta: Option<f64>) {
    const SEED: u64 = 41;
    let mut owned = episodes(7);
    if beta.is_some() {
        let current = logprob_rows(SEED, &owned);
        for (sample, lp) in owned.iter_mut().zip(current) {
            let shift = [0.3f32, -0.2, 0.1, -0.4];
            sample.reference = Some(
                lp.iter()
                    .enumerate()
                    .map(|(t, x)| x + shift[t % shift.len()])
                    .collect(),
            );
        }
    }
    let loss = GrpoLoss {
        aggregation,
        kl: beta.map(|beta| {
            KlPenalty::new(KlEstimator::K3, beta)
                .expect("beta")
                .expect("on")
        }),
        ..GrpoLoss::default()
    };
    let (expected_loss, gradients) = reference(SEED, &owned, aggregation, beta, Owned::counts);
    let expected = stepped_weights(SEED, &gradients);
    let (_, all_gradients) = reference(SEED, &owned, aggregation, beta, |_, _| true);
    let unmasked = stepped_weights(SEED, &all_gradients);
    let mask_matters = max_difference(&expected, &unmasked);
    assert!(
        mask_matters > 1e-4,
        "masking changes the step by {mask_matters}"
    );

    for micro_batch_tokens in [10_000, 16] {
        let mut updater = updater(SEED, settings(loss, micro_batch_tokens));
        let report = updater
            .update(&borrowed(&owned), 1.0, None)
            .expect("update");
        assert_eq!(report.outcome, UpdateOutcome::Applied);
        let loss_tokens: usize = owned
            .iter()
            .map(|o| (0..o.completion.len()).filter(|&t| o.counts(t)).count())
            .sum();
        assert_eq!(report.tokens, loss_tokens);
        assert!(
            (report.loss - expected_loss).abs() < 1e-5,
            "micro-batch tokens {micro_batch_tokens}: loss {} vs reference {expected_loss}",
            report.loss
        );
        let diff = max_difference(&weights(&updater), &expected);
        assert!(
            diff < mask_matters / 100.0 && diff < 1e-6,
            "micro-batch tokens {micro_batch_tokens}: weights differ from the reference by \
             {diff} (the mask moves them by {mask_matters})"
        );
    }
}

#[test]
fn a_masked_update_equals_the_reference_without_the_environments_tokens_under_token_mean() {
    check_against_reference(LossAggregation::TokenMean, None);
}

#[test]
fn a_masked_update_equals_the_reference_without_the_environments_tokens_under_sequence_mean() {
    check_against_reference(LossAggregation::SequenceMeanTokenMean, None);
}

#[test]
fn a_masked_update_equals_the_reference_without_the_environments_tokens_under_dr_grpo() {
    check_against_reference(
        LossAggregation::SequenceMeanTokenSumNorm { max_len: 12 },
        None,
    );
}

#[test]
fn a_masked_update_equals_the_reference_without_the_environments_tokens_with_the_kl_term() {
    check_against_reference(LossAggregation::TokenMean, Some(0.1));
    check_against_reference(LossAggregation::SequenceMeanTokenMean, Some(0.1));
}

/// Settings that read every per-token input: KL term, TIS mismatch correction.
fn reading_everything() -> UpdateSettings {
    let mut update_settings = settings(GrpoLoss::default(), 10_000);
    update_settings.loss.kl = KlPenalty::new(KlEstimator::K3, 0.05).expect("beta");
    update_settings.loss.correction = MismatchCorrection::Tis { cap: 2.0 };
    update_settings.use_mismatch_correction = true;
    update_settings
}

/// `episodes` with reference log-probs `current + 0.2` and rollout log-probs `current - 0.1`
/// on the model's tokens (0.0 on the environment's).
fn episodes_with_inputs(seed: u64) -> Vec<Owned> {
    let mut owned = episodes(8);
    let current = logprob_rows(seed, &owned);
    for (sample, lp) in owned.iter_mut().zip(current) {
        sample.reference = Some(lp.iter().map(|x| x + 0.2).collect());
        sample.rollout = lp
            .iter()
            .enumerate()
            .map(|(t, x)| if sample.counts(t) { x - 0.1 } else { 0.0 })
            .collect();
    }
    owned
}

#[test]
fn figures_count_only_the_models_tokens() {
    const SEED: u64 = 42;
    let owned = episodes_with_inputs(SEED);
    let loss_tokens: usize = owned
        .iter()
        .map(|o| (0..o.completion.len()).filter(|&t| o.counts(t)).count())
        .sum();
    let all_tokens: usize = owned.iter().map(|o| o.completion.len()).sum();
    assert!(loss_tokens < all_tokens);

    let mut updater = updater(SEED, reading_everything());
    let report = updater
        .update(&borrowed(&owned), 1.0, None)
        .expect("update");
    assert_eq!(report.outcome, UpdateOutcome::Applied);
    assert_eq!(report.tokens, loss_tokens);
    // On the model's tokens the KL estimate is k3 at log(ref/current) = 0.2 and the
    // trainer/rollout ratio e^0.1; the environment's tokens (rollout 0.0: ratio far from
    // e^0.1) would pull both figures off.
    let k3 = 0.2f64.exp() - 0.2 - 1.0;
    let kl = report.kl_mean.expect("KL on");
    assert!((kl - k3).abs() < 1e-5, "kl {kl} vs {k3}");
    let stats = report.mismatch.expect("correction on");
    assert_eq!(stats.tokens, loss_tokens);
    assert!((stats.min - 0.1f64.exp()).abs() < 1e-5, "{stats:?}");
    assert!((stats.max - 0.1f64.exp()).abs() < 1e-5, "{stats:?}");
    assert_eq!(stats.fraction_corrected, 0.0);
}

#[test]
fn the_environments_entries_are_never_read() {
    const SEED: u64 = 46;
    let owned = episodes_with_inputs(SEED);
    // Garbage at the environment's positions of every per-token input.
    let mut poisoned = owned.clone();
    for sample in &mut poisoned {
        let masked: Vec<usize> = (0..sample.completion.len())
            .filter(|&t| !sample.counts(t))
            .collect();
        for t in masked {
            sample.rollout[t] = f32::NAN;
            sample.reference.as_mut().expect("reference")[t] = f32::INFINITY;
        }
    }
    let mut sequence_level = reading_everything();
    sequence_level.loss.policy = PolicyLoss::gspo(3e-4, 4e-4);
    sequence_level.loss.correction = MismatchCorrection::IcePop {
        alpha: 0.5,
        beta: 5.0,
    };
    let mut distillation = settings(GrpoLoss::default(), 10_000);
    distillation.loss.distill = Some(OpdConfig {
        kl_coef: 1.0,
        reward_weight: 0.5,
    });
    for (name, update_settings) in [
        ("KL + TIS", reading_everything()),
        ("GSPO + IcePop", sequence_level),
        ("on-policy distillation", distillation),
    ] {
        let mut clean = updater(SEED, update_settings.clone());
        let mut dirty = updater(SEED, update_settings);
        let report = clean.update(&borrowed(&owned), 1.0, None).expect("clean");
        let poisoned_report = dirty
            .update(&borrowed(&poisoned), 1.0, None)
            .expect("poisoned");
        assert_eq!(report.outcome, UpdateOutcome::Applied, "{name}");
        assert_eq!(poisoned_report.outcome, UpdateOutcome::Applied, "{name}");
        assert_eq!(
            poisoned_report.loss.to_bits(),
            report.loss.to_bits(),
            "{name}"
        );
        assert_eq!(weights(&dirty), weights(&clean), "{name}");
    }
}

#[test]
fn an_all_false_mask_contributes_nothing() {
    const SEED: u64 = 43;
    let owned = episodes_with_inputs(SEED);
    let mut silenced = owned.clone();
    silenced[1].loss_mask = Some(vec![false; silenced[1].completion.len()]);
    // Token-mean: the same update as without the sample at all.
    let without: Vec<Owned> = owned
        .iter()
        .enumerate()
        .filter(|(i, _)| *i != 1)
        .map(|(_, o)| o.clone())
        .collect();
    let mut a = updater(SEED, reading_everything());
    let mut b = updater(SEED, reading_everything());
    let with_silent = a.update(&borrowed(&silenced), 1.0, None).expect("update");
    let dropped = b.update(&borrowed(&without), 1.0, None).expect("update");
    assert_eq!(with_silent.tokens, dropped.tokens);
    assert!((with_silent.loss - dropped.loss).abs() < 1e-6);
    assert!((with_silent.kl_mean.unwrap() - dropped.kl_mean.unwrap()).abs() < 1e-6);
    let diff = max_difference(&weights(&a), &weights(&b));
    assert!(diff < 1e-6, "weights differ by {diff}");
    let fresh = weights(&updater(SEED, reading_everything()));
    assert!(
        max_difference(&weights(&a), &fresh) > 1e-4,
        "the update moved the weights"
    );

    // Every sample silenced: nothing to train on.
    let mut none_left = owned.clone();
    for sample in &mut none_left {
        sample.loss_mask = Some(vec![false; sample.completion.len()]);
    }
    let mut c = updater(SEED, reading_everything());
    let report = c.update(&borrowed(&none_left), 1.0, None).expect("update");
    assert_eq!(report.outcome, UpdateOutcome::SkippedEmpty);
    assert_eq!(report.tokens, 0);
    assert_eq!(c.optimizer().steps_taken(), 0);
    assert_eq!(weights(&c), fresh);
}

#[test]
fn a_loss_mask_of_the_wrong_length_is_refused_naming_the_sample_and_the_field() {
    let mut owned = episodes(9);
    let len = owned[2].completion.len();
    owned[2].loss_mask = Some(vec![true; len - 1]);
    let mut updater = updater(44, settings(GrpoLoss::default(), 10_000));
    let err = updater.update(&borrowed(&owned), 1.0, None).unwrap_err();
    let message = err.to_string();
    assert!(message.contains("policy sample 2"), "{message}");
    assert!(message.contains("loss_mask"), "{message}");
    assert!(
        message.contains(&format!("{len} completion tokens")),
        "{message}"
    );
    assert_eq!(updater.steps(), 0);
    assert_eq!(updater.optimizer().steps_taken(), 0);
}

#[test]
fn no_mask_and_an_all_true_mask_give_bit_identical_updates() {
    const SEED: u64 = 45;
    let mut single_turn = episodes_with_inputs(SEED);
    for sample in &mut single_turn {
        sample.loss_mask = None;
    }
    let mut all_true = single_turn.clone();
    for sample in &mut all_true {
        sample.loss_mask = Some(vec![true; sample.completion.len()]);
    }
    for aggregation in [
        LossAggregation::TokenMean,
        LossAggregation::SequenceMeanTokenMean,
    ] {
        let mut update_settings = reading_everything();
        update_settings.loss.aggregation = aggregation;
        update_settings.micro_batch_tokens = 20;
        let mut a = updater(SEED, update_settings.clone());
        let mut b = updater(SEED, update_settings);
        let x = a.update(&borrowed(&single_turn), 1.0, None).expect("none");
        let y = b.update(&borrowed(&all_true), 1.0, None).expect("all true");
        assert_eq!(x.outcome, UpdateOutcome::Applied);
        assert_eq!(x.loss.to_bits(), y.loss.to_bits());
        assert_eq!(x.grad_norm.to_bits(), y.grad_norm.to_bits());
        assert_eq!(x.tokens, y.tokens);
        assert_eq!(x.kl_mean, y.kl_mean);
        assert_eq!(x.mismatch, y.mismatch);
        assert_eq!(x.entropy_mean.to_bits(), y.entropy_mean.to_bits());
        assert_eq!(weights(&a), weights(&b));
    }
}
