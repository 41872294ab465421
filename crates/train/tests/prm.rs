//! Process reward models against TRL 0.29.0's `PRMTrainer` and transformers 5.25:
//! `scripts/make_prm_fixtures.py` builds a tiny random `LlamaForTokenClassification` (two labels)
//! with a character tokenizer (fixtures/models/llama_prm), tokenizes four stepwise rows with
//! TRL's own `tokenize_row` under four settings, and records the logits, loss, accuracy and
//! gradients of the padded batch (fixtures/prm/trl_prm.json).
//!
//! - The model loads as a token classifier (with the head's bias) and scores every real position
//!   as transformers does, within 1e-5; saved and loaded again it is the same classifier.
//! - `prm::tokenize_row` gives TRL's ids and labels for every row and setting, exactly.
//! - The loss matches within 1e-6 and the gradients within 1e-5 (named tensors element by
//!   element, and the global norm), for all steps and for the last step only; so does accuracy.
//! - `prm::score_traces` reads P(good) at the same positions, and a repeated step is not shown
//!   to the PRM (the other steps keep their scores) and scores 0.
//! - A causal LM becomes a token classifier with `to_token_classifier`.

use std::path::PathBuf;

use candle_core::backprop::GradStore;
use candle_core::{Device, Tensor};
use serde_json::Value;
use stoke_model::Transformer;
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::prm::{
    ProcessRewardLoss, StepRule, StepwiseRow, StepwiseTokenization, TokenizedSteps,
    good_probability, parse_row, score_traces, tokenize_row,
};

fn fixture() -> Value {
    serde_json::from_str(include_str!("../../../fixtures/prm/trl_prm.json")).unwrap()
}

fn model_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama_prm")
}

fn floats(v: &Value) -> Vec<f64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_f64().unwrap())
        .collect()
}

fn ints(v: &Value) -> Vec<i64> {
    v.as_array()
        .unwrap()
        .iter()
        .map(|x| x.as_i64().unwrap())
        .collect()
}

fn rows(fixture: &Value) -> Vec<StepwiseRow> {
    fixture["rows"]
        .as_array()
        .unwrap()
        .iter()
        .enumerate()
        .map(|(i, r)| parse_row(r, i + 1).unwrap())
        .collect()
}

fn settings_of(setting: &Value) -> (StepwiseTokenization, bool) {
    let length = |key: &str| setting[key].as_u64().map(|n| n as usize);
    (
        StepwiseTokenization {
            step_separator: setting["step_separator"].as_str().unwrap().to_string(),
            max_length: length("max_length"),
            max_completion_length: length("max_completion_length"),
            train_on_last_step_only: setting["train_on_last_step_only"].as_bool().unwrap(),
        },
        setting["is_eval"].as_bool().unwrap(),
    )
}

fn setting_named<'a>(fixture: &'a Value, name: &str) -> &'a Value {
    fixture["tokenized"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["name"] == name)
        .unwrap()
}

fn tokenized(fixture: &Value, name: &str, tokenizer: &Tokenizer) -> Vec<TokenizedSteps> {
    let (settings, is_eval) = settings_of(setting_named(fixture, name));
    rows(fixture)
        .iter()
        .map(|row| tokenize_row(row, tokenizer, &settings, is_eval).unwrap())
        .collect()
}

fn logits_of(model: &Transformer, rows: &[TokenizedSteps]) -> Tensor {
    let ids: Vec<&[u32]> = rows.iter().map(|r| r.input_ids.as_slice()).collect();
    model.score_tokens(&ids).unwrap()
}

/// The logits of every real position, row by row.
fn real_logits(logits: &Tensor, rows: &[TokenizedSteps]) -> Vec<Vec<[f64; 2]>> {
    let all: Vec<Vec<Vec<f32>>> = logits.to_vec3().unwrap();
    all.iter()
        .zip(rows)
        .map(|(row, r)| {
            row[..r.input_ids.len()]
                .iter()
                .map(|l| [f64::from(l[0]), f64::from(l[1])])
                .collect()
        })
        .collect()
}

#[test]
fn the_token_classifier_scores_every_position_as_transformers_does_and_survives_a_save() {
    let fixture = fixture();
    let tokenizer = Tokenizer::from_dir(&model_dir()).unwrap();
    let model = Transformer::load(&model_dir(), &Device::Cpu).unwrap();
    assert!(model.is_token_classifier() && model.is_classifier());
    assert!(!model.is_sequence_classifier());
    assert_eq!(model.config().score_labels, Some(2));
    let rows = tokenized(&fixture, "default", &tokenizer);
    let case = &fixture["cases"][0];
    assert_eq!(case["name"], "default");
    let got = real_logits(&logits_of(&model, &rows), &rows);
    for (b, row) in got.iter().enumerate() {
        for (t, pair) in row.iter().enumerate() {
            for (k, value) in pair.iter().enumerate() {
                let want = case["logits"][b][t][k].as_f64().unwrap();
                assert!(
                    (value - want).abs() < 1e-5,
                    "row {b} position {t} label {k}: {value} here, {want} in transformers"
                );
            }
        }
    }
    // A sequence-classifier entry point refuses a token classifier, naming what it needs.
    let refused = model.score_sequences(&[&[1, 2]]).unwrap_err().to_string();
    assert!(refused.contains("sequence classifier"), "{refused}");

    let dir = tempfile::tempdir().unwrap();
    model.save(dir.path()).unwrap();
    let config: Value =
        serde_json::from_str(&std::fs::read_to_string(dir.path().join("config.json")).unwrap())
            .unwrap();
    assert_eq!(
        config["architectures"],
        serde_json::json!(["LlamaForTokenClassification"])
    );
    assert_eq!(
        config["id2label"],
        serde_json::json!({"0": "LABEL_0", "1": "LABEL_1"})
    );
    let again = Transformer::load(dir.path(), &Device::Cpu).unwrap();
    assert!(again.is_token_classifier());
    let names: Vec<String> = again.parameters().into_iter().map(|(n, _)| n).collect();
    assert!(
        names.iter().any(|n| n == "score.bias"),
        "the head's bias is saved"
    );
    assert!(!names.iter().any(|n| n == "lm_head.weight"), "no LM head");
    assert_eq!(
        real_logits(&logits_of(&again, &rows), &rows),
        got,
        "the reloaded classifier scores the same"
    );
}

#[test]
fn rows_tokenize_as_trl_tokenize_row_does_under_every_setting() {
    let fixture = fixture();
    let tokenizer = Tokenizer::from_dir(&model_dir()).unwrap();
    for setting in fixture["tokenized"].as_array().unwrap() {
        let name = setting["name"].as_str().unwrap();
        let ours = tokenized(&fixture, name, &tokenizer);
        for (i, (got, want)) in ours
            .iter()
            .zip(setting["rows"].as_array().unwrap())
            .enumerate()
        {
            let want_ids: Vec<u32> = ints(&want["input_ids"]).iter().map(|&x| x as u32).collect();
            assert_eq!(got.input_ids, want_ids, "{name}: row {i} ids");
            assert_eq!(
                got.trl_labels(),
                ints(&want["labels"]),
                "{name}: row {i} labels"
            );
        }
    }
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
fn the_loss_accuracy_and_gradients_match_trl() {
    let fixture = fixture();
    let tokenizer = Tokenizer::from_dir(&model_dir()).unwrap();
    for case in fixture["cases"].as_array().unwrap() {
        let name = case["name"].as_str().unwrap();
        let model = Transformer::load(&model_dir(), &Device::Cpu).unwrap();
        let rows = tokenized(&fixture, name, &tokenizer);
        let out = ProcessRewardLoss
            .loss(&logits_of(&model, &rows), &rows)
            .unwrap();
        let value = out.loss.to_scalar::<f64>().unwrap();
        let want = case["loss"].as_f64().unwrap();
        assert!(
            (value - want).abs() < 1e-6,
            "{name}: loss {value}, TRL {want}"
        );
        let accuracy = out.metric("accuracy").unwrap();
        let want_accuracy = case["accuracy"].as_f64().unwrap();
        assert!(
            (accuracy - want_accuracy).abs() < 1e-12,
            "{name}: accuracy {accuracy}, TRL {want_accuracy}"
        );
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
fn traces_are_scored_at_the_label_positions_and_a_repeat_is_not_shown_to_the_prm() {
    let fixture = fixture();
    let tokenizer = Tokenizer::from_dir(&model_dir()).unwrap();
    let model = Transformer::load(&model_dir(), &Device::Cpu)
        .unwrap()
        .into_frozen();
    // Row 0 as a generated trace: its steps joined by the separator.
    let row = &fixture["rows"][0];
    let prompt = row["prompt"].as_str().unwrap();
    let steps: Vec<&str> = row["completions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap())
        .collect();
    let plain = format!("{}\n{}\n", steps[0], steps[1]);
    let padded = format!("{}\n\n  \n{}\n{}\n", steps[0], steps[0], steps[1]);
    let scored = score_traces(
        &model,
        &tokenizer,
        &StepRule::default(),
        &[(prompt, &plain), (prompt, &padded), (prompt, "  \n\n")],
    )
    .unwrap();
    // P(good) from transformers' logits at row 0's label positions.
    let case = &fixture["cases"][0];
    let labels = ints(&setting_named(&fixture, "default")["rows"][0]["labels"]);
    let want: Vec<f64> = labels
        .iter()
        .enumerate()
        .filter(|(_, l)| **l != -100)
        .map(|(t, _)| {
            let l = floats(&case["logits"][0][t]);
            good_probability(l[0], l[1])
        })
        .collect();
    assert_eq!(scored[0].scores.len(), 2);
    for (got, want) in scored[0].scores.iter().zip(&want) {
        assert!(
            (got - want).abs() < 1e-5,
            "{got} here, {want} from TRL's logits"
        );
    }
    assert_eq!(scored[1].steps.len(), 3, "the blank pieces are not steps");
    assert_eq!(scored[1].scores[1], 0.0, "the repeat scores 0");
    assert_eq!(scored[1].scores[0], scored[0].scores[0]);
    assert_eq!(scored[1].scores[2], scored[0].scores[1]);
    assert!(scored[2].steps.is_empty() && scored[2].scores.is_empty());
    // A sequence classifier is not a PRM.
    let rm = Transformer::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama_reward_model"),
        &Device::Cpu,
    )
    .unwrap();
    let refused = score_traces(&rm, &tokenizer, &StepRule::default(), &[(prompt, &plain)])
        .unwrap_err()
        .to_string();
    assert!(refused.contains("token classifier"), "{refused}");
}

#[test]
fn a_causal_lm_becomes_a_token_classifier_with_a_zero_bias() {
    let causal = Transformer::load(
        &PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied"),
        &Device::Cpu,
    )
    .unwrap();
    let prm = causal.to_token_classifier(2, 7).unwrap();
    assert!(prm.is_token_classifier());
    let logits = prm.score_tokens(&[&[1, 2, 3], &[4, 5]]).unwrap();
    assert_eq!(logits.dims(), &[2, 3, 2]);
    let bias = prm
        .parameters()
        .into_iter()
        .find(|(n, _)| n == "score.bias")
        .unwrap()
        .1;
    let bias: Vec<f32> = bias.as_tensor().to_vec1().unwrap();
    assert_eq!(bias, [0.0, 0.0]);
    // Row 1's scores do not depend on row 0 (right padding under a causal mask).
    let alone = prm.score_tokens(&[&[4, 5]]).unwrap();
    let a: Vec<f32> = logits
        .get(1)
        .unwrap()
        .narrow(0, 0, 2)
        .unwrap()
        .flatten_all()
        .unwrap()
        .to_vec1()
        .unwrap();
    let b: Vec<f32> = alone.flatten_all().unwrap().to_vec1().unwrap();
    for (x, y) in a.iter().zip(&b) {
        assert!((x - y).abs() < 1e-5, "{x} vs {y}");
    }
    let refused = prm
        .lm_logits(
            &Tensor::zeros(
                (1, prm.config().hidden_size),
                candle_core::DType::F32,
                &Device::Cpu,
            )
            .unwrap(),
        )
        .unwrap_err()
        .to_string();
    assert!(refused.contains("no LM head"), "{refused}");
}
