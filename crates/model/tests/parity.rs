//! Logit parity with Hugging Face transformers on the golden fixtures (fixtures/models/*):
//! every position of every fixture within 1e-4 absolute, single sequences and a right-padded
//! batch, plus greedy generation with the KV cache from left-padded prompts.

mod common;

use candle_core::{D, DType, Device, Tensor};
use common::*;
use stoke_model::{KvCache, causal_bias};

const LOGIT_TOLERANCE: f32 = 1e-4;

#[test]
fn the_expected_fixture_set_exists() {
    let names: Vec<String> = fixture_dirs().iter().map(|d| name(d)).collect();
    for required in REQUIRED_FIXTURES {
        assert!(
            names.iter().any(|n| n == required),
            "missing fixture {required}; found {names:?}"
        );
    }
}

#[test]
fn single_sequence_logits_match_transformers_on_every_fixture() {
    for dir in fixture_dirs() {
        let model = load(&dir);
        let reference = reference_tensors(&dir);
        for which in ["a", "b"] {
            let logits = forward_full(&model, &reference[&format!("input_ids_{which}")]);
            let diff = max_abs_diff(&logits, &reference[&format!("logits_{which}")]);
            eprintln!("{}: logits_{which} max abs diff {diff:.2e}", name(&dir));
            assert!(
                diff < LOGIT_TOLERANCE,
                "{}: logits_{which} max abs diff {diff}",
                name(&dir)
            );
        }
    }
}

#[test]
fn right_padded_batch_logits_match_on_valid_positions() {
    for dir in fixture_dirs() {
        let model = load(&dir);
        let reference = reference_tensors(&dir);
        let ids = &reference["batch_input_ids"];
        let mask: Vec<Vec<i64>> = reference["batch_attention_mask"].to_vec2().expect("mask");
        let (batch, len) = ids.dims2().expect("rank 2");
        let key_valid: Vec<Vec<bool>> = mask
            .iter()
            .map(|row| row.iter().map(|&m| m == 1).collect())
            .collect();
        let bias = causal_bias(&key_valid, len, &Device::Cpu).expect("bias");
        let logits = model
            .forward(&ids_u32(ids), &arange_positions(batch, len), &bias, None)
            .expect("forward");
        let expected = &reference["batch_logits"];
        for (b, valid) in key_valid.iter().enumerate() {
            for t in (0..len).filter(|&t| valid[t]) {
                let got = logits.get(b).and_then(|r| r.get(t)).expect("row");
                let want = expected.get(b).and_then(|r| r.get(t)).expect("row");
                let diff = max_abs_diff(&got, &want);
                assert!(
                    diff < LOGIT_TOLERANCE,
                    "{}: batch row {b} position {t}: diff {diff}",
                    name(&dir)
                );
            }
        }
    }
}

/// Greedy decoding with the KV cache from LEFT-padded prompts reproduces transformers'
/// `generate` (the fixture records the smallest top-2 margin, so argmax is unambiguous).
#[test]
fn greedy_generation_with_cache_from_left_padded_prompts_matches_transformers() {
    for dir in fixture_dirs() {
        let reference = reference_tensors(&dir);
        let (Some(prompt), Some(prompt_mask), Some(expected)) = (
            reference.get("greedy_prompt_ids"),
            reference.get("greedy_prompt_mask"),
            reference.get("greedy_output_ids"),
        ) else {
            continue;
        };
        let model = load(&dir);
        let (batch, prompt_len) = prompt.dims2().expect("rank 2");
        let mask: Vec<Vec<i64>> = prompt_mask.to_vec2().expect("mask");
        let mut key_valid: Vec<Vec<bool>> = mask
            .iter()
            .map(|r| r.iter().map(|&m| m == 1).collect())
            .collect();
        // Positions count real tokens only: 0 at each row's first real token.
        let positions: Vec<u32> = key_valid
            .iter()
            .flat_map(|row| {
                let pad = row.iter().take_while(|v| !**v).count();
                (0..row.len()).map(move |t| t.saturating_sub(pad) as u32)
            })
            .collect();
        let mut next_position: Vec<u32> = key_valid
            .iter()
            .map(|r| r.iter().filter(|v| **v).count() as u32)
            .collect();
        let positions =
            Tensor::from_vec(positions, (batch, prompt_len), &Device::Cpu).expect("positions");
        let mut cache = KvCache::new(model.config().num_hidden_layers);
        let bias = causal_bias(&key_valid, prompt_len, &Device::Cpu).expect("bias");
        let mut logits = model
            .forward(&ids_u32(prompt), &positions, &bias, Some(&mut cache))
            .expect("prefill");
        let total = expected.dim(1).expect("dims");
        let mut generated: Vec<Vec<u32>> = vec![Vec::new(); batch];
        for _ in prompt_len..total {
            let last = logits
                .narrow(1, logits.dim(1).expect("len") - 1, 1)
                .expect("last");
            let next: Vec<u32> = last
                .argmax(D::Minus1)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1())
                .expect("argmax");
            for (b, &token) in next.iter().enumerate() {
                generated[b].push(token);
                key_valid[b].push(true);
            }
            let ids = Tensor::from_vec(next, (batch, 1), &Device::Cpu).expect("ids");
            let pos =
                Tensor::from_vec(next_position.clone(), (batch, 1), &Device::Cpu).expect("pos");
            next_position.iter_mut().for_each(|p| *p += 1);
            let bias = causal_bias(&key_valid, 1, &Device::Cpu).expect("bias");
            logits = model
                .forward(&ids, &pos, &bias, Some(&mut cache))
                .expect("decode");
        }
        let expected: Vec<Vec<i64>> = expected
            .to_dtype(DType::I64)
            .and_then(|t| t.to_vec2())
            .expect("ids");
        for b in 0..batch {
            let want: Vec<u32> = expected[b][prompt_len..]
                .iter()
                .map(|&t| t as u32)
                .collect();
            assert_eq!(generated[b], want, "{}: row {b}", name(&dir));
        }
    }
}

#[test]
fn v4_and_v5_config_styles_describe_the_same_model() {
    let root = fixtures_root();
    let v5 = stoke_model::ModelConfig::from_file(&root.join("llama_gqa_rope_llama3/config.json"))
        .expect("5.x");
    let v4 = stoke_model::ModelConfig::from_file(
        &root.join("llama_gqa_rope_llama3_v4config/config.json"),
    )
    .expect("4.x");
    assert_eq!(v4.rope, v5.rope);
    assert!(matches!(
        v5.rope.scaling,
        stoke_model::RopeScaling::Llama3 { .. }
    ));
    let strip = |mut c: stoke_model::ModelConfig| {
        c.source_fields.clear();
        c
    };
    assert_eq!(strip(v4), strip(v5));
}

/// DeepSeek-V3's multi-token prediction modules against transformers' `MtpModel` (loaded from
/// the same checkpoint): depth d's entry j joins the previous hidden state j (the main model's
/// final-normed one at depth 0) with the embedding of token j + 1 + d at position j + 1 + d;
/// every entry's logits within 1e-4, and the next-next-token loss as the fixture states it.
#[test]
fn mtp_module_logits_match_transformers() {
    let mut checked = 0;
    for dir in fixture_dirs() {
        let reference = reference_tensors(&dir);
        if !reference.contains_key("mtp0_logits_a") {
            continue;
        }
        let model = load(&dir);
        let expected = reference_json(&dir);
        assert_eq!(model.num_mtp_modules(), model.config().num_mtp_layers);
        assert!(
            model.num_mtp_modules() > 0,
            "{}: no MTP module loaded",
            name(&dir)
        );
        for which in ["a", "b"] {
            let ids = ids_u32(&reference[&format!("input_ids_{which}")]);
            let len = ids.dim(1).unwrap();
            let bias = causal_bias(&[vec![true; len]], len, &Device::Cpu).unwrap();
            let mut previous = model
                .forward_hidden(&ids, &arange_positions(1, len), &bias, None)
                .unwrap();
            for depth in 0..model.num_mtp_modules() {
                let n = len - 1 - depth;
                let next = ids.narrow(1, 1 + depth, n).unwrap();
                let positions: Vec<u32> = (1 + depth as u32..len as u32).collect();
                let positions = Tensor::from_vec(positions, (1, n), &Device::Cpu).unwrap();
                let bias = causal_bias(&[vec![true; n]], n, &Device::Cpu).unwrap();
                let hidden = model
                    .mtp_hidden(
                        depth,
                        &previous.narrow(1, 0, n).unwrap(),
                        &next,
                        &positions,
                        &bias,
                        None,
                    )
                    .unwrap();
                let logits = model.lm_logits(&hidden).unwrap();
                let want = &reference[&format!("mtp{depth}_logits_{which}")];
                let diff = max_abs_diff(&logits, want);
                eprintln!(
                    "{}: mtp{depth}_logits_{which} max abs diff {diff:.2e}",
                    name(&dir)
                );
                assert!(
                    diff < LOGIT_TOLERANCE,
                    "{}: depth {depth}: {diff}",
                    name(&dir)
                );
                if which == "a" {
                    // Cross-entropy of entry j against token j + 2 + depth (entries with one).
                    let logp = log_softmax_last(&logits.narrow(1, 0, n - 1).unwrap());
                    let targets: Vec<u32> = ids
                        .narrow(1, 2 + depth, n - 1)
                        .unwrap()
                        .flatten_all()
                        .unwrap()
                        .to_vec1()
                        .unwrap();
                    let rows: Vec<Vec<f32>> = logp.squeeze(0).unwrap().to_vec2().unwrap();
                    let loss = -rows
                        .iter()
                        .zip(&targets)
                        .map(|(r, &t)| r[t as usize] as f64)
                        .sum::<f64>()
                        / targets.len() as f64;
                    let want = expected[format!("mtp{depth}_loss_a")].as_f64().unwrap();
                    assert!(
                        (loss - want).abs() < 1e-4,
                        "depth {depth}: loss {loss} vs {want}"
                    );
                }
                previous = hidden;
            }
        }
        checked += 1;
    }
    assert!(checked > 0, "no fixture with MTP references");
}

fn log_softmax_last(logits: &Tensor) -> Tensor {
    let max = logits.max_keepdim(D::Minus1).unwrap();
    let shifted = logits.broadcast_sub(&max).unwrap();
    let lse = shifted
        .exp()
        .unwrap()
        .sum_keepdim(D::Minus1)
        .unwrap()
        .log()
        .unwrap();
    shifted.broadcast_sub(&lse).unwrap()
}
