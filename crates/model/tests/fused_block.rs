//! The fused decoder block (src/transformer/fused_block.rs, stoke_ops::block) against the
//! composition of ops it replaces, on every golden fixture (Llama with GQA/MQA and RoPE scalings,
//! Qwen2 with q/k/v biases, Qwen3 with q/k norms): logits and every parameter's gradient, in f64
//! (where the two forms must agree to rounding, 1e-9 relative), in f32, and in bf16; with causal
//! masks, a left-padded batch and packed documents; and with activation checkpointing, whose
//! gradients must equal the fused block's own bit for bit.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use stoke_model::{Transformer, causal_bias, document_causal_bias};
use stoke_ops::Precision;

/// Logits and gradients of `sum(logits * probe)` (a probe so every logit matters).
fn run(
    model: &Transformer,
    ids: &Tensor,
    positions: &Tensor,
    bias: &Tensor,
) -> (Vec<f64>, Vec<(String, Vec<f64>)>) {
    let logits = model.forward(ids, positions, bias, None).expect("forward");
    let n = logits.elem_count();
    let probe: Vec<f64> = (0..n).map(|i| ((i as f64) * 0.618).sin()).collect();
    let probe = Tensor::from_vec(probe, logits.dims(), &Device::Cpu)
        .and_then(|p| p.to_dtype(logits.dtype()))
        .expect("probe");
    let grads = (&logits * &probe)
        .and_then(|l| l.sum_all())
        .and_then(|l| l.backward())
        .expect("backward");
    let values = |t: &Tensor| -> Vec<f64> {
        t.to_dtype(DType::F64)
            .and_then(|t| t.flatten_all())
            .and_then(|t| t.to_vec1())
            .expect("values")
    };
    let params = model
        .parameters()
        .into_iter()
        .map(|(name, var)| {
            let g = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{name} has no gradient"));
            (name, values(g))
        })
        .collect();
    (values(&logits), params)
}

/// Largest |a - b| over the largest |b| (so a tolerance reads as relative to the tensor).
fn relative(a: &[f64], b: &[f64]) -> f64 {
    assert_eq!(a.len(), b.len());
    let scale = b.iter().fold(0f64, |m, v| m.max(v.abs())).max(1e-30);
    a.iter().zip(b).fold(0f64, |m, (x, y)| m.max((x - y).abs())) / scale
}

fn compare(
    label: &str,
    fused: &Transformer,
    graph: &Transformer,
    ids: &Tensor,
    positions: &Tensor,
    bias: &Tensor,
    tolerance: f64,
) {
    assert!(fused.fused_blocks() && !graph.fused_blocks());
    let (logits_f, grads_f) = run(fused, ids, positions, bias);
    let (logits_g, grads_g) = run(graph, ids, positions, bias);
    let err = relative(&logits_f, &logits_g);
    assert!(
        err <= tolerance,
        "{label}: logits differ by {err:e} (tolerance {tolerance:e})"
    );
    for ((name, a), (other, b)) in grads_f.iter().zip(&grads_g) {
        assert_eq!(name, other);
        assert!(
            b.iter().any(|&v| v != 0.0),
            "{label}: {name} has a zero gradient"
        );
        let err = relative(a, b);
        assert!(
            err <= tolerance,
            "{label}: {name} gradient differs by {err:e} (tolerance {tolerance:e})"
        );
    }
}

fn pair(dir: &std::path::Path, dtype: DType, precision: Precision) -> (Transformer, Transformer) {
    let fused = load(dir)
        .to_dtype(dtype)
        .expect("dtype")
        .with_precision(precision);
    let mut graph = fused
        .to_dtype(dtype)
        .expect("copy")
        .with_precision(precision);
    graph.set_fused_blocks(false);
    (fused, graph)
}

#[test]
fn fused_blocks_match_the_composition_on_every_fixture() {
    for dir in plain_fixture_dirs() {
        let ids = ids_u32(&reference_tensors(&dir)["input_ids_a"]);
        let (batch, len) = ids.dims2().expect("ids");
        let bias = causal_bias(&vec![vec![true; len]; batch], len, &Device::Cpu).expect("bias");
        let positions = arange_positions(batch, len);
        for (dtype, precision, tolerance) in [
            (DType::F64, Precision::F32, 1e-9),
            (DType::F32, Precision::F32, 2e-4),
            (DType::F32, Precision::Bf16, 2e-2),
        ] {
            let (fused, graph) = pair(&dir, dtype, precision);
            let label = format!("{} {dtype:?} {precision}", name(&dir));
            compare(&label, &fused, &graph, &ids, &positions, &bias, tolerance);
        }
    }
}

#[test]
fn fused_blocks_match_on_padded_rows_and_packed_documents() {
    let len = 9;
    for dir in plain_fixture_dirs() {
        let vocab = load(&dir).config().vocab_size as u32;
        let ids: Vec<u32> = (0..2 * len as u32).map(|i| (i * 7 + 3) % vocab).collect();
        let ids = Tensor::from_vec(ids, (2, len), &Device::Cpu).expect("ids");
        // A left-padded row next to a full one.
        let valid = vec![
            vec![true; len],
            [vec![false; 3], vec![true; len - 3]].concat(),
        ];
        let padded = causal_bias(&valid, len, &Device::Cpu).expect("bias");
        // Two rows of packed documents, positions restarting per document.
        let docs = vec![
            vec![0, 0, 0, 1, 1, 1, 1, 2, 2],
            vec![0, 0, 0, 0, 0, 1, 1, 1, 1],
        ];
        let packed = document_causal_bias(&docs, &Device::Cpu).expect("doc bias");
        let mut restart = Vec::new();
        for row in &docs {
            let mut p = 0u32;
            for (i, &d) in row.iter().enumerate() {
                p = if i > 0 && row[i - 1] == d { p + 1 } else { 0 };
                restart.push(p);
            }
        }
        let restart = Tensor::from_vec(restart, (2, len), &Device::Cpu).expect("positions");
        let (fused, graph) = pair(&dir, DType::F64, Precision::F32);
        let label = format!("{} padded", name(&dir));
        compare(
            &label,
            &fused,
            &graph,
            &ids,
            &arange_positions(2, len),
            &padded,
            1e-9,
        );
        let label = format!("{} packed", name(&dir));
        compare(&label, &fused, &graph, &ids, &restart, &packed, 1e-9);
    }
}

#[test]
fn checkpointed_fused_blocks_give_the_same_gradients_bit_for_bit() {
    for dir in plain_fixture_dirs() {
        let ids = ids_u32(&reference_tensors(&dir)["input_ids_a"]);
        let (batch, len) = ids.dims2().expect("ids");
        let bias = causal_bias(&vec![vec![true; len]; batch], len, &Device::Cpu).expect("bias");
        let positions = arange_positions(batch, len);
        for precision in [Precision::F32, Precision::Bf16] {
            let plain = load(&dir).with_precision(precision);
            let mut ckpt = load(&dir).with_precision(precision);
            ckpt.set_activation_checkpointing(true);
            assert!(plain.fused_blocks() && ckpt.fused_blocks());
            let (logits_a, grads_a) = run(&plain, &ids, &positions, &bias);
            let (logits_b, grads_b) = run(&ckpt, &ids, &positions, &bias);
            assert_eq!(logits_a, logits_b, "{}: logits", name(&dir));
            for ((n, a), (_, b)) in grads_a.iter().zip(&grads_b) {
                assert_eq!(a, b, "{} {precision}: {n}", name(&dir));
            }
        }
    }
}
