//! Reward models against transformers and TRL 1.16: `scripts/make_reward_model_fixtures.py`
//! builds a tiny random `LlamaForSequenceClassification`, records the scores transformers gives
//! it, and runs TRL's `RewardTrainer.compute_loss` (and the backward pass) on fixed pairs
//! (fixtures/reward_model/trl_reward.json, fixtures/models/llama_reward_model).
//!
//! - The model loads as a sequence classifier and scores every row as transformers does (the
//!   last token that is not padding), within 1e-5.
//! - Saved and loaded again, it is the same classifier (config class and labels, no LM head).
//! - The Bradley-Terry loss matches TRL within 1e-6 and the gradients within 1e-5 (the named
//!   tensors element by element, and the global norm over every parameter), plain and with
//!   margins plus reward centering; TRL's metrics match too.
//! - A causal LM becomes a classifier with `to_sequence_classifier`, which has no LM head.

use std::path::PathBuf;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use serde_json::Value;
use stoke_model::Transformer;
use stoke_train::preference::RewardModelLoss;

fn fixture() -> Value {
    serde_json::from_str(include_str!(
        "../../../fixtures/reward_model/trl_reward.json"
    ))
    .unwrap()
}

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama_reward_model")
}

fn ids(v: &Value) -> Vec<u32> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_u64().unwrap() as u32)
        .collect()
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn scores_of(model: &Transformer, rows: &[Vec<u32>]) -> Vec<f32> {
    let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    model
        .score_sequences(&refs)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap()
}

#[test]
fn the_classifier_scores_rows_as_transformers_does_and_survives_a_save() {
    let fixture = fixture();
    let model = Transformer::load(&model_dir(), &Device::Cpu).unwrap();
    assert!(model.is_sequence_classifier());
    assert_eq!(model.config().score_labels, Some(1));
    let rows: Vec<Vec<u32>> = fixture["scores"]["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let expected: Vec<f64> = fixture["scores"]["logits"]
        .as_array()
        .unwrap()
        .iter()
        .map(|row| row[0].as_f64().unwrap())
        .collect();
    let scores = scores_of(&model, &rows);
    for (i, (got, want)) in scores.iter().zip(&expected).enumerate() {
        assert!(
            (f64::from(*got) - want).abs() < 1e-5,
            "row {i}: {got} here, {want} in transformers"
        );
    }
    // The row ending in padding is scored at its last real token, not at the end.
    assert_eq!(model.scored_position(&rows[3]), 2);

    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        config["architectures"],
        serde_json::json!(["LlamaForSequenceClassification"])
    );
    assert_eq!(config["id2label"], serde_json::json!({"0": "LABEL_0"}));
    assert_eq!(config["pad_token_id"], serde_json::json!(0));
    let again = Transformer::load(dir.path(), &Device::Cpu).unwrap();
    assert!(again.is_sequence_classifier());
    assert!(
        again
            .parameters()
            .iter()
            .all(|(n, _)| n != "lm_head.weight"),
        "a classifier saves no LM head"
    );
    assert_eq!(scores_of(&again, &rows), scores);
}

/// Every parameter's gradient in `store`, by name.
fn grads(model: &Transformer, store: &GradStore) -> Vec<(String, Tensor)> {
    model
        .parameters()
        .into_iter()
        .filter_map(|(name, var)| store.get(var.as_tensor()).map(|g| (name, g.clone())))
        .collect()
}

#[test]
fn the_bradley_terry_loss_and_gradients_match_trl() {
    let fixture = fixture();
    let pairs = &fixture["pairs"];
    let prompts: Vec<Vec<u32>> = pairs["prompts"]
        .as_array()
        .unwrap()
        .iter()
        .map(ids)
        .collect();
    let response = |key: &str| -> Vec<Vec<u32>> {
        pairs[key]
            .as_array()
            .unwrap()
            .iter()
            .zip(&prompts)
            .map(|(r, p)| [p.clone(), ids(r)].concat())
            .collect()
    };
    let rows: Vec<Vec<u32>> = [response("chosen"), response("rejected")].concat();
    let refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let model = Transformer::load(&model_dir(), &Device::Cpu).unwrap();
        let loss = RewardModelLoss {
            center_rewards_coefficient: case["center_rewards_coefficient"].as_f64(),
        };
        let margins = case["margin"].as_array().map(|_| floats(&case["margin"]));
        let scores = model.score_sequences(&refs).unwrap();
        let out = loss.loss(&scores, margins.as_deref()).unwrap();
        let value = out.loss.to_scalar::<f64>().unwrap();
        let want = case["loss"].as_f64().unwrap();
        assert!(
            (value - want).abs() < 1e-6,
            "{name}: loss {value}, TRL {want}"
        );
        for (metric, want) in case["metrics"].as_object().unwrap() {
            let got = out
                .metric(metric)
                .unwrap_or_else(|| panic!("{name}: no {metric}"));
            let want = want.as_f64().unwrap();
            assert!(
                (got - want).abs() < 1e-6,
                "{name}: {metric} {got}, TRL {want}"
            );
        }
        let store = out.loss.backward().unwrap();
        let grads = grads(&model, &store);
        let norm: f64 = grads
            .iter()
            .map(|(_, g)| {
                let v: Vec<f32> = g.flatten_all().unwrap().to_vec1().unwrap();
                v.iter().map(|x| f64::from(*x).powi(2)).sum::<f64>()
            })
            .sum::<f64>()
            .sqrt();
        let want_norm = case["grad_norm"].as_f64().unwrap();
        assert!(
            (norm - want_norm).abs() < 1e-5 * want_norm.max(1.0),
            "{name}: grad norm {norm}, TRL {want_norm}"
        );
        for (tensor, want) in case["grads"].as_object().unwrap() {
            let (_, grad) = grads
                .iter()
                .find(|(n, _)| n == tensor)
                .unwrap_or_else(|| panic!("{name}: no gradient for {tensor}"));
            let got: Vec<f32> = grad.flatten_all().unwrap().to_vec1().unwrap();
            let want = floats(want);
            assert_eq!(got.len(), want.len(), "{name}: {tensor}");
            for (i, (g, w)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (f64::from(*g) - w).abs() < 1e-5,
                    "{name}: {tensor}[{i}] gradient {g}, TRL {w}"
                );
            }
        }
    }
}

#[test]
fn a_causal_lm_becomes_a_classifier_without_an_lm_head() {
    let causal = Transformer::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied"),
        &Device::Cpu,
    )
    .unwrap();
    assert!(!causal.is_sequence_classifier());
    let rm = causal.to_sequence_classifier(1, 7).unwrap();
    assert!(rm.is_sequence_classifier());
    assert_eq!(rm.config().score_labels, Some(1));
    let scores = rm.score_sequences(&[&[1, 2, 3], &[4, 5]]).unwrap();
    assert_eq!(scores.dims(), &[2, 1]);
    let hidden = Tensor::zeros(
        (1, 1, rm.config().hidden_size),
        candle_core::DType::F32,
        &Device::Cpu,
    )
    .unwrap();
    let refused = rm.lm_logits(&hidden).unwrap_err().to_string();
    assert!(refused.contains("no LM head"), "{refused}");
    // Deterministic in the seed, and the body is the causal model's.
    let again = causal.to_sequence_classifier(1, 7).unwrap();
    let a: Vec<f32> = scores.flatten_all().unwrap().to_vec1().unwrap();
    let b: Vec<f32> = again
        .score_sequences(&[&[1, 2, 3], &[4, 5]])
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    assert_eq!(a, b);
}
