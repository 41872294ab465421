//! Activation checkpointing (`Transformer::set_activation_checkpointing`) against the plain
//! graph on every golden fixture: the same logits and bit-identical gradients, in f32 and bf16
//! (the recomputation is the same sequence of operations, see src/activation_checkpoint.rs).

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use stoke_model::causal_bias;
use stoke_ops::Precision;

#[test]
fn checkpointed_gradients_equal_the_plain_ones_bit_for_bit() {
    for dir in fixture_dirs() {
        let ids = &reference_tensors(&dir)["input_ids_a"];
        for precision in [Precision::F32, Precision::Bf16] {
            let plain = load(&dir).with_precision(precision);
            let mut ckpt = load(&dir).with_precision(precision);
            ckpt.set_activation_checkpointing(true);
            assert_eq!(
                max_abs_diff(&forward_full(&plain, ids), &forward_full(&ckpt, ids)),
                0.0,
                "{}: logits differ",
                name(&dir)
            );
            let want = gradients(&plain, ids);
            let got = gradients(&ckpt, ids);
            assert_eq!(want.len(), got.len());
            for ((n, a), (m, b)) in want.iter().zip(&got) {
                assert_eq!(n, m);
                // (Zero only where the graph cannot reach: an unrouted expert, AFMoE's
                // expert_bias; `gradients` refuses any other missing gradient.)
                assert!(
                    a.iter().any(|&g| g != 0.0)
                        || n.contains(".experts.")
                        || n.ends_with("mlp.expert_bias")
                        || n.ends_with("e_score_correction_bias")
                        || is_mtp_parameter(n, plain.config()),
                    "{}: {n} has no gradient",
                    name(&dir)
                );
                assert_eq!(a, b, "{}: {n} ({precision}) differs", name(&dir));
            }
        }
    }
}

/// Padded rows (a left-padded batch of two) and f64 parameters: still exact.
#[test]
fn checkpointing_is_exact_on_padded_batches_in_f64() {
    let dir = &plain_fixture_dirs()[0];
    let plain = load(dir).to_dtype(DType::F64).expect("f64");
    let mut ckpt = plain.to_dtype(DType::F64).expect("copy");
    ckpt.set_activation_checkpointing(true);
    let len = 7;
    let ids: Vec<u32> = (0..2 * len as u32).map(|i| (i * 5 + 3) % 50).collect();
    let ids = Tensor::from_vec(ids, (2, len), &Device::Cpu).expect("ids");
    let valid = vec![
        vec![true; len],
        [vec![false; 3], vec![true; len - 3]].concat(),
    ];
    let bias = causal_bias(&valid, len, &Device::Cpu).expect("bias");
    let positions = arange_positions(2, len);
    let grads = |model: &stoke_model::Transformer| {
        let logits = model
            .forward(&ids, &positions, &bias, None)
            .expect("forward");
        let store = logits
            .sqr()
            .and_then(|l| l.mean_all())
            .expect("loss")
            .backward()
            .expect("bwd");
        model
            .parameters()
            .into_iter()
            .map(|(_, v)| {
                let g = store.get(v.as_tensor()).expect("gradient");
                g.flatten_all()
                    .and_then(|g| g.to_vec1::<f64>())
                    .expect("values")
            })
            .collect::<Vec<_>>()
    };
    assert_eq!(grads(&plain), grads(&ckpt));
}
