//! The next-token objective: document masking in packed batches, soft-capping, z-loss.

mod common;

use common::{Rng, VOCAB, batch_from_docs, nano_model};
use stoke_train::objective::{NextTokenObjective, Objective, score_loss_tokens, soft_cap};

fn doc(rng: &mut Rng, len: usize) -> Vec<u32> {
    (0..len).map(|_| rng.below(VOCAB as u64) as u32).collect()
}

/// A packed row [A | B | C | pad] scores every target exactly as separate forwards of A, B and C
/// do: no token attends across documents, and positions restart per document.
#[test]
fn packed_forward_equals_separate_forwards_per_document() {
    let model = nano_model(7);
    let mut rng = Rng(11);
    let docs = [doc(&mut rng, 9), doc(&mut rng, 14), doc(&mut rng, 6)];
    let packed = batch_from_docs(&[docs.to_vec()], 32);
    let packed_logprobs: Vec<f32> = score_loss_tokens(&model, &packed, None, false)
        .unwrap()
        .unwrap()
        .logprobs
        .to_vec1()
        .unwrap();
    let mut separate = Vec::new();
    for d in &docs {
        let alone = batch_from_docs(&[vec![d.clone()]], d.len() - 1);
        let lp: Vec<f32> = score_loss_tokens(&model, &alone, None, false)
            .unwrap()
            .unwrap()
            .logprobs
            .to_vec1()
            .unwrap();
        assert_eq!(lp.len(), d.len() - 1);
        separate.extend(lp);
    }
    // Targets across a document boundary are masked out: 8 + 13 + 5 loss tokens.
    assert_eq!(packed_logprobs.len(), separate.len());
    for (i, (a, b)) in packed_logprobs.iter().zip(&separate).enumerate() {
        assert!(
            (a - b).abs() < 1e-4,
            "token {i}: packed {a} vs separate {b}"
        );
    }
    // The summed loss is the sum of the per-document losses.
    let objective = NextTokenObjective::plain();
    let out = objective.loss(&model, &packed).unwrap();
    let expected: f64 = separate.iter().map(|&lp| -(lp as f64)).sum();
    assert!(
        (out.nll_sum - expected).abs() < 1e-3 * expected.abs(),
        "{} vs {expected}",
        out.nll_sum
    );
    assert_eq!(out.loss_tokens, 26);
}

#[test]
fn soft_cap_bounds_logits_and_keeps_small_ones() {
    let dev = candle_core::Device::Cpu;
    let logits =
        candle_core::Tensor::new(&[[-500.0f32, -3.0, 0.0, 0.01, 40.0, 1e6]], &dev).unwrap();
    let capped: Vec<f32> = soft_cap(&logits, 30.0)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    for &c in &capped {
        assert!(c.abs() <= 30.0, "{c}");
    }
    assert!(
        (capped[3] - 0.01).abs() < 1e-6,
        "small logits pass nearly unchanged"
    );
    assert!(capped[4] > 20.0 && capped[5] > 29.9, "{capped:?}");
    assert!(capped[0] < -29.9);
}

/// z-loss = coef * sum over loss tokens of logsumexp(logits)^2, computed here by hand from the
/// model's logits; the objective's loss sum is cross-entropy plus that term.
#[test]
fn z_loss_matches_a_hand_computation() {
    let model = nano_model(3);
    let mut rng = Rng(5);
    let batch = batch_from_docs(
        &[
            vec![doc(&mut rng, 12)],
            vec![doc(&mut rng, 7), doc(&mut rng, 5)],
        ],
        16,
    );
    let coef = 1e-2;
    let objective = NextTokenObjective {
        z_loss: coef,
        logit_softcap: None,
        moe_aux_loss_coef: None,
        track_max_logits: false,
        mtp_loss_weight: 0.0,
    };
    let out = objective.loss(&model, &batch).unwrap();
    let scored = score_loss_tokens(&model, &batch, None, true)
        .unwrap()
        .unwrap();
    let logits: Vec<Vec<f32>> = scored
        .logits
        .as_ref()
        .expect("logits kept")
        .to_vec2()
        .unwrap();
    let mut z_expected = 0.0f64;
    let mut nll_expected = 0.0f64;
    for (row, &target) in logits.iter().zip(&scored.target_ids) {
        let max = row.iter().cloned().fold(f32::NEG_INFINITY, f32::max) as f64;
        let lse = max
            + row
                .iter()
                .map(|&x| (x as f64 - max).exp())
                .sum::<f64>()
                .ln();
        z_expected += coef * lse * lse;
        nll_expected += lse - row[target as usize] as f64;
    }
    assert!(
        (out.z_loss_sum - z_expected).abs() < 1e-4 * z_expected,
        "{} vs {z_expected}",
        out.z_loss_sum
    );
    let total = out.loss_sum.to_scalar::<f32>().unwrap() as f64;
    assert!(
        (total - (nll_expected + z_expected)).abs() < 1e-4 * total,
        "{total}"
    );
    assert!(out.z_loss_sum > 0.0);
}

/// With soft-capping the scored logits stay inside the cap.
#[test]
fn objective_applies_the_soft_cap_before_the_loss() {
    let model = nano_model(3);
    let mut rng = Rng(9);
    let batch = batch_from_docs(&[vec![doc(&mut rng, 10)]], 9);
    let capped = score_loss_tokens(&model, &batch, Some(0.05), false)
        .unwrap()
        .unwrap();
    let max = capped
        .logits
        .as_ref()
        .expect("logits kept")
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(max <= 0.05, "{max}");
    let uncapped = score_loss_tokens(&model, &batch, None, true)
        .unwrap()
        .unwrap();
    let raw_max = uncapped
        .logits
        .as_ref()
        .expect("logits kept")
        .abs()
        .unwrap()
        .max_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap();
    assert!(
        raw_max > 0.05,
        "the fixture must have logits the cap changes ({raw_max})"
    );
}

#[test]
fn fused_lm_head_matches_the_materialized_logits_path() {
    let model = nano_model(5);
    let mut rng = Rng(21);
    let batch = batch_from_docs(&[vec![doc(&mut rng, 12), doc(&mut rng, 7)]], 20);
    let fused = score_loss_tokens(&model, &batch, None, false)
        .unwrap()
        .unwrap();
    let composed = score_loss_tokens(&model, &batch, None, true)
        .unwrap()
        .unwrap();
    assert!(fused.logits.is_none() && composed.logits.is_some());
    let a: Vec<f32> = fused.logprobs.to_vec1().unwrap();
    let b: Vec<f32> = composed.logprobs.to_vec1().unwrap();
    assert_eq!(a.len(), b.len());
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
}

fn mtp_fixture() -> (stoke_model::Transformer, std::path::PathBuf) {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models/deepseek_v3_mtp");
    let model =
        stoke_model::Transformer::load(&dir, &candle_core::Device::Cpu).expect("mtp fixture");
    assert_eq!(model.num_mtp_modules(), 2);
    (model, dir)
}

/// The multi-token prediction loss against transformers' `MtpModel` (the fixture's
/// `mtp{d}_loss_a`, each module's mean next-next-token cross-entropy on input a): the term's
/// unweighted sum is 10 · loss_0 + 9 · loss_1 over 19 predictions, it is weighted λ / 2, and
/// its gradient reaches the modules.
#[test]
fn the_mtp_loss_matches_transformers_mtp_modules() {
    let (model, dir) = mtp_fixture();
    let reference: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(dir.join("reference.json")).unwrap())
            .unwrap();
    let tensors = candle_core::safetensors::load(
        dir.join("reference.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    let ids: Vec<u32> = tensors["input_ids_a"]
        .to_dtype(candle_core::DType::U32)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let batch = batch_from_docs(&[vec![ids.clone()]], ids.len() - 1);
    let weight = 0.3;
    let objective = NextTokenObjective {
        mtp_loss_weight: weight,
        ..NextTokenObjective::plain()
    };
    let out = objective.loss(&model, &batch).unwrap();
    let loss0 = reference["mtp0_loss_a"].as_f64().unwrap();
    let loss1 = reference["mtp1_loss_a"].as_f64().unwrap();
    assert_eq!(out.figures.mtp_tokens, 19);
    let want = 10.0 * loss0 + 9.0 * loss1;
    assert!(
        (out.figures.mtp_nll_sum - want).abs() < 1e-3,
        "{} vs {want}",
        out.figures.mtp_nll_sum
    );
    // The loss sum is the main cross-entropy plus λ / 2 times the MTP sum.
    let total = out.loss_sum.to_scalar::<f32>().unwrap() as f64;
    let expected = out.nll_sum + weight / 2.0 * out.figures.mtp_nll_sum;
    assert!((total - expected).abs() < 1e-3, "{total} vs {expected}");
    let grads = out.loss_sum.backward().unwrap();
    for (name, var) in model.parameters() {
        if name.starts_with("model.layers.2.eh_proj") || name.starts_with("model.layers.3.eh_proj")
        {
            let g = grads.get(var.as_tensor()).expect("an MTP gradient");
            let norm = g
                .sqr()
                .unwrap()
                .sum_all()
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            assert!(norm > 0.0, "{name}");
        }
    }
    // Off (weight 0): the same main loss, no MTP term.
    let plain = NextTokenObjective::plain().loss(&model, &batch).unwrap();
    assert_eq!(plain.figures.mtp_tokens, 0);
    assert!((plain.nll_sum - out.nll_sum).abs() < 1e-9);
}

/// Packed documents: no MTP prediction crosses a document boundary or reads another
/// document's tokens, so a packed row [A | B] gives the sum of A's and B's own MTP losses.
#[test]
fn mtp_predictions_stay_inside_their_documents() {
    let (model, _) = mtp_fixture();
    let mut rng = Rng(9);
    let vocab = model.config().vocab_size as u64;
    let mut doc = |len: usize| -> Vec<u32> { (0..len).map(|_| rng.below(vocab) as u32).collect() };
    let docs = [doc(9), doc(12)];
    let objective = NextTokenObjective {
        mtp_loss_weight: 1.0,
        ..NextTokenObjective::plain()
    };
    let packed = objective
        .loss(&model, &batch_from_docs(&[docs.to_vec()], 24))
        .unwrap();
    let (mut sum, mut count) = (0.0, 0);
    for d in &docs {
        let alone = objective
            .loss(&model, &batch_from_docs(&[vec![d.clone()]], d.len() - 1))
            .unwrap();
        sum += alone.figures.mtp_nll_sum;
        count += alone.figures.mtp_tokens;
    }
    // Per document of n tokens: n - 2 predictions at depth 0 (tokens 2..n), n - 3 at depth 1.
    assert_eq!(count, (9 - 2) + (9 - 3) + (12 - 2) + (12 - 3));
    assert_eq!(packed.figures.mtp_tokens, count);
    assert!(
        (packed.figures.mtp_nll_sum - sum).abs() < 1e-3,
        "{} vs {sum}",
        packed.figures.mtp_nll_sum
    );
}

/// In bf16 the next-token objective differentiates the summed head
/// (`stoke_ops::linear_target_logprob_sum`, gradients formed in the forward pass). Its loss and
/// every parameter's gradient match the per-row head's (`score_loss_tokens`, then a sum) up to
/// bf16 rounding, and the per-row values it reports beside the sum are that head's.
#[test]
fn the_bf16_objective_s_summed_head_matches_the_per_row_head() {
    let model = nano_model(9).with_precision(stoke_types::Precision::Bf16);
    let mut rng = Rng(5);
    let batch = batch_from_docs(&[vec![doc(&mut rng, 15), doc(&mut rng, 10)]], 28);
    let out = NextTokenObjective::plain().loss(&model, &batch).unwrap();
    let summed_grads = out.loss_sum.backward().unwrap();

    let rows = score_loss_tokens(&model, &batch, None, false)
        .unwrap()
        .unwrap();
    assert!(rows.logprob_sum.is_none());
    let want = rows.logprobs.neg().unwrap().sum_all().unwrap();
    let want_grads = want.backward().unwrap();
    let want_nll = want.to_scalar::<f32>().unwrap() as f64;
    assert!(
        (out.nll_sum - want_nll).abs() <= 1e-5 * want_nll.abs(),
        "{} vs {want_nll}",
        out.nll_sum
    );
    let got = common::gradient_values(&model, &summed_grads);
    let reference = common::gradient_values(&model, &want_grads);
    assert_eq!(got.len(), reference.len());
    for (i, (g, w)) in got.iter().zip(&reference).enumerate() {
        let size = w.iter().fold(0f32, |m, v| m.max(v.abs()));
        let diff = g.iter().zip(w).fold(0f32, |m, (a, b)| m.max((a - b).abs()));
        assert!(size > 0.0, "parameter {i} has no gradient");
        assert!(diff <= 2e-2 * size, "parameter {i}: {diff} at scale {size}");
    }

    let summed =
        stoke_train::objective::score_loss_tokens_tracked(&model, &batch, None, false, false, true)
            .unwrap()
            .unwrap();
    assert!(summed.logprob_sum.is_some());
    let a: Vec<f32> = summed.logprobs.to_vec1().unwrap();
    let b: Vec<f32> = rows.logprobs.to_vec1().unwrap();
    assert_eq!(a, b);
}
