//! bf16 mixed precision (`Precision::Bf16`) against f32 on the golden fixtures: logits against
//! transformers' f32 reference, and the gradients of the next-token loss against stoke's own f32
//! gradients (which match transformers, tests/gradients.rs).
//!
//! Stated tolerances (bf16 has an 8-bit significand, relative rounding error <= 2^-9 per
//! operand): logits within 2% of the largest reference logit magnitude, plus 1e-3 absolute;
//! per-parameter gradients within 5% relative L2 distance of the f32 gradients. These are
//! far above what f32 summation order gives (~1e-6) and far below what a wrong product gives
//! (order 1).
//!
//! The block-variant fixtures (Gemma 2/3, SmolLM3, relu²) record PyTorch's own bf16 error on the
//! same checkpoint (`bf16_autocast` in reference.json: `torch.autocast("cpu", bfloat16)`). Gemma's
//! sqrt(hidden)-scaled embeddings and (1 + w) norms widen bf16's error past the stated bounds in
//! PyTorch too (0.16 and 0.30 logits where the bound is 0.08 and 0.13), so there the bound is the
//! larger of the stated one and 1.25x PyTorch's: stoke's bf16 is no worse than the peer's.

mod common;

use candle_core::Tensor;
use common::*;
use stoke_ops::Precision;

/// PyTorch autocast's bf16 error figure `key` on this fixture (0 where none is recorded).
fn autocast_figure(dir: &std::path::Path, key: &str) -> f64 {
    reference_json(dir)["bf16_autocast"][key]
        .as_f64()
        .unwrap_or(0.0)
}

fn abs_max(t: &Tensor) -> f32 {
    t.abs()
        .and_then(|a| a.flatten_all())
        .and_then(|a| a.max(0))
        .and_then(|a| a.to_scalar::<f32>())
        .expect("max")
}

#[test]
fn bf16_logits_stay_within_the_stated_tolerance_of_transformers_f32() {
    for dir in fixture_dirs() {
        let model = load(&dir).with_precision(Precision::Bf16);
        let reference = reference_tensors(&dir);
        for which in ["a", "b"] {
            let want = &reference[&format!("logits_{which}")];
            let got = forward_full(&model, &reference[&format!("input_ids_{which}")]);
            let diff = max_abs_diff(&got, want);
            let bound = (2e-2 * abs_max(want) + 1e-3)
                .max(1.25 * autocast_figure(&dir, &format!("logits_{which}_max_abs_diff")) as f32);
            let f32_diff = max_abs_diff(
                &forward_full(&load(&dir), &reference[&format!("input_ids_{which}")]),
                want,
            );
            eprintln!(
                "{}: logits_{which} bf16 max abs diff {diff:.2e} (bound {bound:.2e}; f32 {f32_diff:.2e})",
                name(&dir)
            );
            assert!(
                diff <= bound,
                "{}: logits_{which} bf16 diff {diff} > {bound}",
                name(&dir)
            );
            // bf16 really ran: its error is well above f32's.
            assert!(diff > f32_diff, "{}: bf16 logits equal f32's", name(&dir));
        }
    }
}

#[test]
fn bf16_gradients_stay_within_the_stated_tolerance_of_f32() {
    for dir in fixture_dirs() {
        let reference = reference_tensors(&dir);
        let ids = &reference["input_ids_a"];
        let exact = gradients(&load(&dir), ids);
        let mixed = gradients(&load(&dir).with_precision(Precision::Bf16), ids);
        let mut worst = (0.0f64, String::new());
        for ((name_f, f), (name_b, b)) in exact.iter().zip(&mixed) {
            assert_eq!(name_f, name_b);
            let norm: f64 = f.iter().map(|&x| (x as f64).powi(2)).sum::<f64>().sqrt();
            let dist: f64 = f
                .iter()
                .zip(b)
                .map(|(&x, &y)| (x as f64 - y as f64).powi(2))
                .sum::<f64>()
                .sqrt();
            let rel = dist / norm.max(1e-12);
            if rel > worst.0 {
                worst = (rel, name_f.clone());
            }
            let bound = 5e-2f64.max(1.25 * autocast_figure(&dir, "grad_worst_relative_l2"));
            assert!(
                rel <= bound,
                "{}: {name_f} relative L2 distance {rel:.3e} (bound {bound:.3e})",
                name(&dir)
            );
        }
        eprintln!(
            "{}: worst relative gradient distance {:.2e} ({})",
            name(&dir),
            worst.0,
            worst.1
        );
        assert!(worst.0 > 0.0, "{}: bf16 gradients equal f32's", name(&dir));
    }
}

/// Weights packed once for inference give the same logits as bf16 with per-call packing up to
/// f32 summation order (the same bf16 values; the packed weights are the GEMM's left operand, or
/// stream through the decode kernel for a few rows): within 1e-5 of the largest logit; a
/// backward through them is an error; unpacking restores the differentiable path.
#[test]
fn packed_inference_weights_match_per_call_packing_and_refuse_a_backward() {
    let dir = &plain_fixture_dirs()[0];
    let reference = reference_tensors(dir);
    let ids = &reference["input_ids_a"];
    let per_call = load(dir).with_precision(Precision::Bf16);
    let mut packed = load(dir);
    packed.pack_weights().expect("pack");
    assert_eq!(packed.precision(), Precision::Bf16);
    assert!(packed.packed_weight_bytes() > 0);
    let want = forward_full(&per_call, ids);
    let got = forward_full(&packed, ids);
    let bound = 1e-5 * abs_max(&want);
    let diff = max_abs_diff(&got, &want);
    assert!(diff <= bound, "packed vs per-call: {diff} > {bound}");
    // Few rows (the decode kernel) as well.
    let last = ids.narrow(1, 0, 3).expect("three tokens");
    let diff = max_abs_diff(
        &forward_full(&packed, &last),
        &forward_full(&per_call, &last),
    );
    assert!(
        diff <= bound,
        "packed vs per-call, 3 rows: {diff} > {bound}"
    );

    let error = loss(&packed, ids)
        .backward()
        .map(|_| ())
        .unwrap_err()
        .to_string();
    assert!(error.contains("packed for inference"), "{error}");
    packed.unpack_weights();
    assert_eq!(packed.packed_weight_bytes(), 0);
    let grads = loss(&packed, ids)
        .backward()
        .expect("backward after unpack");
    assert!(grads.get(packed.lm_head_weight()).is_some());
}
