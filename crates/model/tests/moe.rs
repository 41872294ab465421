//! Mixtures of experts beyond logit parity (tests/parity.rs): the routing record, HF's
//! auxiliary load-balancing loss against transformers' value, its gradient against finite
//! differences, and the selection bias that the balancing rules move.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use stoke_model::causal_bias;
use stoke_model::moe::{ExpertLoad, Routing, load_balancing_loss};

const MOE_FIXTURES: [&str; 4] = ["mixtral_moe", "olmoe", "qwen2_moe_shared", "qwen3_moe"];

fn fixture(name: &str) -> std::path::PathBuf {
    fixtures_root().join(name)
}

fn routed(
    model: &stoke_model::Transformer,
    ids: &Tensor,
    mask: Option<&[Vec<i64>]>,
) -> (Tensor, Vec<Routing>) {
    let (batch, len) = ids.dims2().expect("rank 2");
    let key_valid: Vec<Vec<bool>> = match mask {
        Some(rows) => rows
            .iter()
            .map(|r| r.iter().map(|&m| m == 1).collect())
            .collect(),
        None => vec![vec![true; len]; batch],
    };
    let bias = causal_bias(&key_valid, len, &Device::Cpu).expect("bias");
    model
        .forward_hidden_routed(&ids_u32(ids), &arange_positions(batch, len), &bias, None)
        .expect("forward")
}

#[test]
fn the_aux_loss_matches_transformers_with_and_without_padding() {
    for name in MOE_FIXTURES {
        let dir = fixture(name);
        let model = load(&dir);
        let reference = reference_tensors(&dir);
        let expected = reference_json(&dir);
        let experts = model.config().moe.as_ref().expect("moe").num_experts;
        let (hidden, routings) = routed(&model, &reference["input_ids_a"], None);
        let sparse = model
            .config()
            .moe
            .as_ref()
            .map(|m| m.sparse_layers.iter().filter(|&&s| s).count())
            .unwrap_or(0);
        assert_eq!(routings.len(), sparse, "{name}: one record per MoE layer");
        // Recording changes nothing in the forward pass.
        let plain = forward_full(&model, &reference["input_ids_a"]);
        let via_hidden = model.lm_logits(&hidden).expect("logits");
        assert_eq!(max_abs_diff(&plain, &via_hidden), 0.0, "{name}");

        let loss = load_balancing_loss(&routings, experts, None)
            .expect("loss")
            .expect("a routed layer");
        let got = loss.to_scalar::<f32>().expect("scalar") as f64;
        let want = expected["aux_loss_a"].as_f64().expect("aux_loss_a");
        assert!(
            (got - want).abs() < 1e-5,
            "{name}: aux loss {got} vs {want}"
        );

        let mask: Vec<Vec<i64>> = reference["batch_attention_mask"].to_vec2().expect("mask");
        let (_, routings) = routed(&model, &reference["batch_input_ids"], Some(&mask));
        let flat: Vec<f32> = mask.iter().flatten().map(|&m| m as f32).collect();
        let got = load_balancing_loss(&routings, experts, Some(&flat))
            .expect("loss")
            .expect("a routed layer")
            .to_scalar::<f32>()
            .expect("scalar") as f64;
        let want = expected["aux_loss_batch"].as_f64().expect("aux_loss_batch");
        assert!(
            (got - want).abs() < 1e-5,
            "{name}: padded aux loss {got} vs {want}"
        );
    }
}

/// The aux loss reaches the routers, and its gradient is the derivative of the value (central
/// differences in f64, at steps too small to change any top-k choice).
#[test]
fn the_aux_loss_gradient_matches_finite_differences() {
    let dir = fixture("qwen2_moe_shared");
    let model = load(&dir).to_dtype(DType::F64).expect("f64");
    let ids = &reference_tensors(&dir)["input_ids_a"];
    let experts = model.config().moe.as_ref().expect("moe").num_experts;
    let loss_of = |m: &stoke_model::Transformer| -> (Tensor, Vec<Vec<u32>>) {
        let (_, routings) = routed(m, ids, None);
        let chosen = routings.iter().map(|r| r.chosen.clone()).collect();
        (
            load_balancing_loss(&routings, experts, None)
                .expect("loss")
                .expect("routed"),
            chosen,
        )
    };
    let (loss, chosen) = loss_of(&model);
    let grads = loss.backward().expect("backward");
    let router = "model.layers.0.mlp.gate.weight";
    let params: std::collections::BTreeMap<_, _> = model.parameters().into_iter().collect();
    let var = &params[router];
    let grad: Vec<f64> = grads
        .get(var.as_tensor())
        .expect("the router has a gradient")
        .flatten_all()
        .and_then(|g| g.to_vec1())
        .expect("grad");
    assert!(
        grad.iter().any(|g| g.abs() > 1e-6),
        "a zero router gradient"
    );
    let values: Vec<f64> = var
        .as_tensor()
        .flatten_all()
        .and_then(|t| t.to_vec1())
        .expect("values");
    let eps = 1e-6;
    for index in [0usize, 7, 33, 100] {
        let at = |delta: f64| -> f64 {
            let mut shifted = values.clone();
            shifted[index] += delta;
            var.set(&Tensor::from_vec(shifted, var.dims(), &Device::Cpu).expect("tensor"))
                .expect("set");
            let (loss, now) = loss_of(&model);
            assert_eq!(now, chosen, "the step changed a routing choice");
            loss.to_scalar::<f64>().expect("scalar")
        };
        let numeric = (at(eps) - at(-eps)) / (2.0 * eps);
        at(0.0);
        assert!(
            (numeric - grad[index]).abs() <= 1e-6 + 1e-4 * numeric.abs(),
            "router[{index}]: analytic {} vs numeric {numeric}",
            grad[index]
        );
    }
}

/// A selection bias moves the top-k choice and nothing else: the router logits and, where the
/// choice is unchanged, the outputs stay as they were.
#[test]
fn the_selection_bias_moves_choices_not_weights() {
    let dir = fixture("mixtral_moe");
    let mut model = load(&dir);
    let ids = &reference_tensors(&dir)["input_ids_a"];
    let experts = model.config().moe.as_ref().expect("moe").num_experts;
    let (hidden, before) = routed(&model, ids, None);
    // A bias far beyond any probability gap forces experts 2 and 3 everywhere.
    for layer in 0..model.config().num_hidden_layers {
        model
            .set_expert_bias(layer, &[0.0, 0.0, 10.0, 10.0])
            .expect("bias");
        assert_eq!(model.expert_bias(layer), Some(vec![0.0, 0.0, 10.0, 10.0]));
    }
    let (biased_hidden, after) = routed(&model, ids, None);
    for (b, a) in before.iter().zip(&after) {
        let load = ExpertLoad {
            counts: a.counts(experts),
        };
        assert_eq!(load.counts[0] + load.counts[1], 0, "layer {}", a.layer);
        assert!(load.max_violation() > 0.9);
        assert_ne!(b.chosen, a.chosen);
    }
    // Layer 0's router saw the same input: identical logits.
    assert_eq!(max_abs_diff(&before[0].logits, &after[0].logits), 0.0);
    assert!(max_abs_diff(&hidden, &biased_hidden) > 1e-3);
    // Zero bias routes as no bias.
    for layer in 0..model.config().num_hidden_layers {
        model
            .set_expert_bias(layer, &vec![0.0; experts])
            .expect("bias");
    }
    let (zero_hidden, _) = routed(&model, ids, None);
    assert_eq!(max_abs_diff(&hidden, &zero_hidden), 0.0);
    // A dense layer or a wrong length is refused.
    let mut dense = load(&fixture("qwen2_moe_shared"));
    assert!(
        dense.set_expert_bias(1, &[0.0; 4]).is_err(),
        "layer 1 is dense"
    );
    assert!(dense.set_expert_bias(0, &[0.0; 3]).is_err());
}

/// Expert capacity: an expert takes at most ceil(factor * pairs / experts) (token, slot) pairs,
/// first choices before second ones, then in token order. The dropped count is the hand count
/// of that rule over what the router chose, a generous factor changes nothing, and a tight one
/// changes the output (the dropped pairs skip their expert) while keeping it finite.
#[test]
fn an_expert_capacity_drops_the_pairs_past_it_by_slot_then_token() {
    let dir = fixture("mixtral_moe");
    let reference = reference_tensors(&dir);
    let ids = &reference["input_ids_a"];
    let mut model = load(&dir);
    let (free_hidden, free_routings) = routed(&model, ids, None);
    assert!(free_routings.iter().all(|r| r.dropped == 0));
    model.set_expert_capacity(Some(100.0)).expect("capacity");
    let (generous, _) = routed(&model, ids, None);
    assert_eq!(max_abs_diff(&generous, &free_hidden), 0.0);
    let factor = 0.5;
    model.set_expert_capacity(Some(factor)).expect("capacity");
    let (tight, routings) = routed(&model, ids, None);
    let experts = model.config().moe.as_ref().expect("moe").num_experts;
    let mut total = 0;
    for routing in &routings {
        let k = routing.top_k;
        let tokens = routing.chosen.len() / k;
        let capacity = (factor * (tokens * k) as f64 / experts as f64).ceil() as usize;
        let mut taken = vec![0usize; experts];
        let mut dropped = 0u64;
        for slot in 0..k {
            for token in 0..tokens {
                let e = routing.chosen[token * k + slot] as usize;
                if taken[e] < capacity {
                    taken[e] += 1;
                } else {
                    dropped += 1;
                }
            }
        }
        assert_eq!(routing.dropped, dropped, "layer {}", routing.layer);
        total += dropped;
    }
    assert!(total > 0, "a factor of 0.5 drops pairs");
    assert!(max_abs_diff(&tight, &free_hidden) > 1e-3);
    let values: Vec<f32> = tight.flatten_all().unwrap().to_vec1().unwrap();
    assert!(values.iter().all(|v| v.is_finite()));
    // Back off: the model computes as before.
    model.set_expert_capacity(None).expect("none");
    let (again, _) = routed(&model, ids, None);
    assert_eq!(max_abs_diff(&again, &free_hidden), 0.0);
    assert!(model.set_expert_capacity(Some(0.0)).is_err());
}
