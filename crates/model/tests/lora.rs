//! LoRA (`stoke_model::lora`): zero-initialised adapters leave the model exactly as it was, only
//! the adapters get gradients, merged weights reproduce the adapted logits, save -> load and
//! PEFT-made adapters (fixtures/peft, scripts/make_peft_fixture.py) give transformers+peft's
//! logits, and the base without adapters is the reference at no copy.

mod common;

use candle_core::{Device, Tensor};
use common::*;
use std::path::PathBuf;
use stoke_model::Transformer;
use stoke_model::lora::LoraConfig;

fn config(targets: &[&str]) -> LoraConfig {
    LoraConfig {
        r: 4,
        lora_alpha: 8.0,
        lora_dropout: 0.0,
        target_modules: targets.iter().map(|t| t.to_string()).collect(),
        use_rslora: false,
    }
}

/// Gives every adapter nonzero values (B starts at 0, which would hide a wrong forward).
fn perturb(model: &Transformer) {
    for (i, (_, var)) in model.trainable_parameters().into_iter().enumerate() {
        let n = var.elem_count();
        let v: Vec<f32> = (0..n)
            .map(|j| 0.2 * ((i * 131 + j) as f32 * 0.71).sin())
            .collect();
        var.set(&Tensor::from_vec(v, var.dims(), &Device::Cpu).unwrap())
            .unwrap();
    }
}

#[test]
fn zero_b_adapters_equal_the_base_exactly_and_only_adapters_train() {
    for dir in fixture_dirs() {
        let ids = &reference_tensors(&dir)["input_ids_a"];
        let base = load(&dir);
        let mut adapted = load(&dir);
        adapted.add_lora(&config(&["all-linear"]), 3).unwrap();
        assert_eq!(
            max_abs_diff(&forward_full(&base, ids), &forward_full(&adapted, ids)),
            0.0,
            "{}",
            name(&dir)
        );
        let trainable = adapted.trainable_parameters();
        // Every linear layer of the blocks (attention, MLP or every expert; not the router, the
        // shared-expert gate or the LM head) gets A and B.
        let linear_layers = base
            .parameters()
            .iter()
            .filter(|(n, _)| {
                // (Adapters go on the blocks transformers' model holds: not the MTP modules.)
                !is_mtp_parameter(n, base.config())
                    && n.starts_with("model.layers.")
                    && [
                        "_proj.weight",
                        "_with_mqa.weight",
                        ".w1.weight",
                        ".w2.weight",
                        ".w3.weight",
                    ]
                    .iter()
                    .any(|s| n.ends_with(s))
            })
            .count();
        let layers = adapted.config().num_hidden_layers;
        assert!(linear_layers >= layers * 7, "{}", name(&dir));
        assert_eq!(trainable.len(), linear_layers * 2, "{}", name(&dir));
        assert!(
            trainable
                .iter()
                .all(|(n, _)| n.starts_with("base_model.model.model.layers."))
        );
        let grads = loss(&adapted, ids).backward().unwrap();
        for (n, var) in adapted.parameters() {
            assert!(
                grads.get(var.as_tensor()).is_none(),
                "{}: base {n} got a gradient",
                name(&dir)
            );
        }
        // With B = 0 only B's gradient is nonzero (A's is B^T-weighted).
        let mut trained_experts = 0;
        for (n, var) in &trainable {
            let Some(g) = grads.get(var.as_tensor()) else {
                // An expert no token of this input was routed to is outside the graph.
                assert!(
                    n.contains(".experts."),
                    "{}: no gradient for {n}",
                    name(&dir)
                );
                continue;
            };
            let max = g
                .abs()
                .unwrap()
                .flatten_all()
                .unwrap()
                .max(0)
                .unwrap()
                .to_scalar::<f32>()
                .unwrap();
            // An expert chosen only at the last position (whose logits the next-token loss does
            // not use) is in the graph with a zero gradient; A's must be zero everywhere.
            if n.contains(".experts.") && n.contains("lora_B") && max == 0.0 {
                continue;
            }
            assert_eq!(
                max > 0.0,
                n.contains("lora_B"),
                "{}: {n} gradient max {max}",
                name(&dir)
            );
            if n.contains(".experts.") && n.contains("lora_B") {
                trained_experts += 1;
            }
        }
        if adapted.config().moe.is_some() {
            assert!(
                trained_experts > 0,
                "{}: no expert adapter trained",
                name(&dir)
            );
        }
    }
}

#[test]
fn merged_weights_reproduce_the_adapted_logits_and_the_base_is_shared() {
    for dir in fixture_dirs() {
        let ids = &reference_tensors(&dir)["input_ids_a"];
        let mut adapted = load(&dir);
        adapted
            .add_lora(&config(&["q_proj", "v_proj", "mlp.down_proj"]), 5)
            .unwrap();
        perturb(&adapted);
        let with = forward_full(&adapted, ids);
        let merged = adapted.merged().unwrap();
        assert!(merged.lora_config().is_none());
        let diff = max_abs_diff(&forward_full(&merged, ids), &with);
        assert!(
            diff < 1e-4,
            "{}: merged logits differ by {diff}",
            name(&dir)
        );
        let base = adapted.without_adapters();
        let plain = forward_full(&load(&dir), ids);
        assert_eq!(max_abs_diff(&forward_full(&base, ids), &plain), 0.0);
        assert!(
            max_abs_diff(&with, &plain) > 1e-2,
            "{}: the adapters changed nothing",
            name(&dir)
        );
    }
}

#[test]
fn activation_checkpointing_with_adapters_is_exact() {
    let dir = &plain_fixture_dirs()[0];
    let ids = &reference_tensors(dir)["input_ids_a"];
    let mut plain = load(dir);
    plain.add_lora(&config(&["all-linear"]), 1).unwrap();
    perturb(&plain);
    let mut ckpt = plain.clone();
    ckpt.set_activation_checkpointing(true);
    let (a, b) = (
        loss(&plain, ids).backward().unwrap(),
        loss(&ckpt, ids).backward().unwrap(),
    );
    for (n, var) in plain.trainable_parameters() {
        let (x, y) = (
            a.get(var.as_tensor()).unwrap(),
            b.get(var.as_tensor()).unwrap(),
        );
        assert_eq!(max_abs_diff(x, y), 0.0, "{n}");
    }
}

fn peft_dir(name: &str) -> PathBuf {
    fixtures_root().join("../peft").join(name)
}

/// Adapters written by `peft` 0.21.2: stoke's logits with them, and after merging, match
/// transformers+peft's.
#[test]
fn peft_adapters_load_and_match_transformers() {
    for (case, base) in [
        ("qwen2_bias_tied_qvod", "qwen2_bias_tied"),
        ("llama_gqa_all_linear_rslora", "llama_gqa_rope_llama3"),
    ] {
        let dir = peft_dir(case);
        let reference =
            candle_core::safetensors::load(dir.join("reference.safetensors"), &Device::Cpu)
                .unwrap();
        let mut model = load(&fixtures_root().join(base));
        model
            .load_adapter(&dir)
            .unwrap_or_else(|e| panic!("{case}: {e}"));
        let ids = &reference["input_ids"];
        let diff = max_abs_diff(&forward_full(&model, ids), &reference["logits"]);
        eprintln!("{case}: max |logit - peft| = {diff:.2e}");
        assert!(
            diff < 1e-4,
            "{case}: adapted logits differ from peft by {diff}"
        );
        let merged = model.merged().unwrap();
        let diff = max_abs_diff(&forward_full(&merged, ids), &reference["merged_logits"]);
        assert!(
            diff < 1e-4,
            "{case}: merged logits differ from peft's merge by {diff}"
        );
    }
}

#[test]
fn save_and_load_round_trip_bit_for_bit() {
    let dir = &plain_fixture_dirs()[0];
    let ids = &reference_tensors(dir)["input_ids_a"];
    let mut adapted = load(dir);
    adapted
        .add_lora(&config(&["k_proj", "gate_proj"]), 9)
        .unwrap();
    perturb(&adapted);
    let out = tempfile::tempdir().unwrap();
    adapted.save_adapter(out.path(), "base").unwrap();
    let mut loaded = load(dir);
    loaded.load_adapter(out.path()).unwrap();
    assert_eq!(loaded.lora_config(), adapted.lora_config());
    assert_eq!(
        max_abs_diff(&forward_full(&loaded, ids), &forward_full(&adapted, ids)),
        0.0
    );
    // A snapshot copies the adapters, not the frozen base, and keeps its own adapter values.
    let snapshot = adapted.snapshot().unwrap();
    perturb(&snapshot);
    let (_, first) = &snapshot.trainable_parameters()[0];
    first.set(&first.as_tensor().zeros_like().unwrap()).unwrap();
    assert_eq!(
        max_abs_diff(&forward_full(&loaded, ids), &forward_full(&adapted, ids)),
        0.0
    );
}

#[test]
fn bad_adapter_configs_and_files_are_refused_by_name() {
    let dir = &plain_fixture_dirs()[0];
    let mut model = load(dir);
    let mut bad = config(&["q_proj"]);
    bad.r = 0;
    assert!(
        model
            .add_lora(&bad, 0)
            .unwrap_err()
            .to_string()
            .contains("lora.r")
    );
    let error = model.add_lora(&config(&["wq"]), 0).unwrap_err().to_string();
    assert!(
        error.contains("target_modules") && error.contains("wq"),
        "{error}"
    );
    let mut dropout = config(&["q_proj"]);
    dropout.lora_dropout = 0.1;
    assert!(
        model
            .add_lora(&dropout, 0)
            .unwrap_err()
            .to_string()
            .contains("lora_dropout")
    );
    assert!(
        model.lora_config().is_none(),
        "a refused config left adapters behind"
    );

    let out = tempfile::tempdir().unwrap();
    let src = peft_dir("qwen2_bias_tied_qvod");
    for file in ["adapter_model.safetensors", "adapter_config.json"] {
        std::fs::copy(src.join(file), out.path().join(file)).unwrap();
    }
    let config_path = out.path().join("adapter_config.json");
    let text = std::fs::read_to_string(&config_path).unwrap();
    std::fs::write(
        &config_path,
        text.replace("\"use_dora\": false", "\"use_dora\": true"),
    )
    .unwrap();
    let mut qwen = load(&fixtures_root().join("qwen2_bias_tied"));
    let error = qwen.load_adapter(out.path()).unwrap_err().to_string();
    assert!(
        error.contains("adapter_config.json") && error.contains("use_dora"),
        "{error}"
    );
    // The wrong base: shapes do not fit, named, and the model is left as it was.
    std::fs::write(&config_path, text).unwrap();
    let mut llama = load(&fixtures_root().join("llama_mqa_tied"));
    let error = llama.load_adapter(out.path()).unwrap_err().to_string();
    assert!(error.contains("adapter_model.safetensors"), "{error}");
    assert!(llama.lora_config().is_none());
}

/// Latent attention under LoRA: the absorbed decode path multiplies by `kv_b_proj`'s weight
/// itself, so it must merge that layer's adapter (`W + scale B A`). With nonzero adapters on every
/// linear layer, decoding token by token over the latent cache equals the full forward pass.
#[test]
fn adapted_latent_attention_decodes_as_it_recomputes() {
    let dir = fixtures_root().join("deepseek_v3_mla");
    let mut model = load(&dir);
    model.add_lora(&config(&["all-linear"]), 5).unwrap();
    perturb(&model);
    let ids: Vec<u32> = vec![3, 14, 15, 9, 26, 5, 35, 8, 9, 7];
    let len = ids.len();
    let all = Tensor::from_vec(ids.clone(), (1, len), &Device::Cpu).unwrap();
    let positions = arange_positions(1, len);
    let bias = stoke_model::causal_bias(&[vec![true; len]], len, &Device::Cpu).unwrap();
    let full = model.forward(&all, &positions, &bias, None).unwrap();
    let mut cache = stoke_model::KvCache::new(model.config().num_hidden_layers);
    for (t, &id) in ids.iter().enumerate() {
        let token = Tensor::from_vec(vec![id], (1, 1), &Device::Cpu).unwrap();
        let position = Tensor::from_vec(vec![t as u32], (1, 1), &Device::Cpu).unwrap();
        let step_bias = stoke_model::causal_bias(&[vec![true; t + 1]], 1, &Device::Cpu).unwrap();
        let logits = model
            .forward(&token, &position, &step_bias, Some(&mut cache))
            .unwrap();
        let want = full.narrow(1, t, 1).unwrap();
        let diff = max_abs_diff(&logits, &want);
        assert!(
            diff < 1e-4,
            "position {t}: cached {diff} from the full pass"
        );
    }
    // The adapters matter: the same tokens through the base differ.
    let base = load(&dir);
    let plain = base.forward(&all, &positions, &bias, None).unwrap();
    assert!(max_abs_diff(&plain, &full) > 1e-2);
}
