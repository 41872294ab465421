//! Gradients of the next-token loss: they match transformers' loss and gradients on the
//! fixtures, reach every parameter, and agree with finite differences in f64.

mod common;

use candle_core::{DType, Device, Tensor, Var};
use common::*;
use stoke_model::{Transformer, causal_bias};
use stoke_ops::gradcheck::check_gradients;

/// Mean next-token cross-entropy over one unpadded sequence `ids` [1, L] (i64 or u32):
/// positions 0..L-2 predict tokens 1..L-1 (the fixtures' `loss_definition`).
fn next_token_loss(model: &Transformer, ids: &Tensor) -> candle_core::Result<Tensor> {
    let (_, len) = ids.dims2()?;
    let bias =
        causal_bias(&[vec![true; len]], len, &Device::Cpu).map_err(candle_core::Error::wrap)?;
    let logits = model
        .forward(&ids_u32(ids), &arange_positions(1, len), &bias, None)
        .map_err(candle_core::Error::wrap)?;
    let vocab = logits.dim(2)?;
    let inputs = logits.squeeze(0)?.narrow(0, 0, len - 1)?;
    let targets = ids_u32(ids).squeeze(0)?.narrow(0, 1, len - 1)?;
    let mask = Tensor::ones(len - 1, model.dtype(), &Device::Cpu)?;
    debug_assert_eq!(inputs.dims(), [len - 1, vocab]);
    stoke_ops::cross_entropy(&inputs, &targets, &mask)
}

fn close(got: f64, want: f64, rel: f64, abs: f64) -> bool {
    (got - want).abs() <= rel * want.abs() + abs
}

#[test]
fn loss_and_gradients_match_transformers_on_every_fixture() {
    for dir in fixture_dirs() {
        let model = load(&dir);
        let reference = reference_tensors(&dir);
        let expected = reference_json(&dir);
        let fixture = name(&dir);
        let loss = next_token_loss(&model, &reference["input_ids_a"]).expect("loss");
        let loss_value = loss.to_scalar::<f32>().expect("scalar") as f64;
        let want_loss = expected["loss_a"].as_f64().expect("loss_a");
        assert!(
            close(loss_value, want_loss, 1e-3, 0.0),
            "{fixture}: loss {loss_value} vs {want_loss}"
        );

        let grads = loss.backward().expect("backward");
        // transformers' DeepseekV3ForCausalLM holds no MTP modules (their logits are checked
        // in parity.rs).
        let params: std::collections::BTreeMap<String, Var> = model
            .parameters()
            .into_iter()
            .filter(|(n, _)| !is_mtp_parameter(n, model.config()))
            .collect();
        let norms = expected["grad_norms"].as_object().expect("grad_norms");
        assert_eq!(
            norms.len(),
            params.len(),
            "{fixture}: parameter count differs from transformers"
        );
        for (param_name, want) in norms {
            let var = params
                .get(param_name)
                .unwrap_or_else(|| panic!("{fixture}: no parameter {param_name}"));
            let want = want.as_f64().expect("norm value");
            let Some(grad) = grads.get(var.as_tensor()) else {
                // Outside the graph: an expert no token reached, or a stored selection bias
                // (AFMoE's expert_bias, DeepSeek-V3's e_score_correction_bias: it only moves
                // the top-k choice); transformers' gradient is 0 there too.
                assert_eq!(want, 0.0, "{fixture}: no grad for {param_name}");
                continue;
            };
            let norm = grad
                .sqr()
                .and_then(|g| g.sum_all())
                .and_then(|g| g.to_scalar::<f32>())
                .expect("norm") as f64;
            assert!(
                close(norm.sqrt(), want, 1e-3, 0.0),
                "{fixture}: |grad {param_name}| {} vs {want}",
                norm.sqrt()
            );
        }
        let samples = expected["grad_samples"].as_object().expect("grad_samples");
        for (param_name, entries) in samples {
            let var = &params[param_name];
            // Outside the graph (an expert no token reached): zeros, as transformers' are.
            let flat: Vec<f32> = match grads.get(var.as_tensor()) {
                Some(grad) => grad.flatten_all().and_then(|g| g.to_vec1()).expect("flat"),
                None => vec![0.0; var.elem_count()],
            };
            for entry in entries.as_array().expect("list") {
                let index = entry[0].as_u64().expect("index") as usize;
                let want = entry[1].as_f64().expect("value");
                let got = flat[index] as f64;
                assert!(
                    close(got, want, 1e-3, 1e-6),
                    "{fixture}: {param_name}[{index}] {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn every_parameter_receives_a_finite_nonzero_gradient() {
    stoke_ops::numerics::init_compute_threads();
    let ids = Tensor::new(&[[5u32, 17, 3, 40, 22, 9, 31, 2]], &Device::Cpu).expect("ids");
    for (label, json) in [("llama", TINY_LLAMA), ("qwen3 tied yarn", TINY_QWEN3_TIED)] {
        let model = Transformer::init(tiny_config(json), &Device::Cpu, 7).expect("init");
        let grads = next_token_loss(&model, &ids)
            .and_then(|l| l.backward())
            .expect("backward");
        for (param_name, var) in model.parameters() {
            let grad = grads
                .get(var.as_tensor())
                .unwrap_or_else(|| panic!("{label}: {param_name} has no gradient"));
            let values: Vec<f32> = grad
                .flatten_all()
                .and_then(|g| g.to_vec1())
                .expect("values");
            assert!(
                values.iter().all(|v| v.is_finite()),
                "{label}: {param_name} has a non-finite gradient"
            );
            assert!(
                values.iter().any(|v| *v != 0.0),
                "{label}: {param_name} has an all-zero gradient"
            );
        }
    }
}

#[test]
fn gradients_agree_with_finite_differences_in_f64() {
    stoke_ops::numerics::init_compute_threads();
    let ids = Tensor::new(&[[5u32, 17, 3, 40, 22, 9]], &Device::Cpu).expect("ids");
    for (label, json) in [("llama", TINY_LLAMA), ("qwen3 tied yarn", TINY_QWEN3_TIED)] {
        let model = Transformer::init(tiny_config(json), &Device::Cpu, 11).expect("init");
        // Larger-than-init weights so every path contributes visibly to the loss.
        let scaled: std::collections::BTreeMap<String, Tensor> = model
            .parameters()
            .into_iter()
            .map(|(n, v)| {
                let t = v.as_tensor().to_dtype(DType::F64).expect("f64");
                let t = if n.ends_with("norm.weight") || n.ends_with(".bias") {
                    (t + stoke_ops::gradcheck::seeded_randn(0f64, 0.1, v.dims(), &Device::Cpu)
                        .expect("noise"))
                    .expect("add")
                } else {
                    (t * 10.0).expect("scale")
                };
                (n, t)
            })
            .collect();
        let model = Transformer::from_tensors(model.config().clone(), scaled).expect("rebuild");
        assert_eq!(model.dtype(), DType::F64);
        let params = model.parameters();
        let vars: Vec<Var> = params.iter().map(|(_, v)| v.clone()).collect();
        let coords: Vec<(usize, usize)> = vars
            .iter()
            .enumerate()
            .flat_map(|(i, v)| {
                let n = v.elem_count();
                [0, n / 3, n - 1].into_iter().map(move |j| (i, j))
            })
            .collect();
        let loss_fn = |_: &[Var]| next_token_loss(&model, &ids);
        let points = check_gradients(&vars, &loss_fn, &coords, 1e-5).expect("gradcheck");
        for p in points {
            assert!(
                p.relative_error(1e-6) < 1e-2,
                "{label}: {} {p:?}",
                params[p.var_index].0
            );
        }
    }
}
