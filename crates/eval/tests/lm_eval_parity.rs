//! The harness against lm-evaluation-harness: the multiple-choice task of
//! `fixtures/eval/mc_arith.toml` on the tiny Qwen2 fixture model gives lm-eval's `hf` backend's
//! numbers (`fixtures/eval/lm_eval_mc.json`, made by `make_lm_eval_fixture.py` with lm-eval
//! 0.4.13 pinned): every choice's log-likelihood within 1e-4, and the same acc, acc_norm and acc
//! standard error. Greedy flags are checked against transformers' logits (the fixture's
//! `greedy`; lm-eval's own `is_greedy` marks every choice of this task greedy, which none is).

use std::path::PathBuf;

use candle_core::Device;
use stoke_eval::harness::{Outcomes, RunOptions, evaluate};
use stoke_eval::{LocalTarget, Task};
use stoke_model::Transformer;
use stoke_tokenizer::hf::Tokenizer;

fn root() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../..")
}

#[test]
fn multiple_choice_matches_lm_evaluation_harness() {
    let model_dir = root().join("fixtures/models/qwen2_bias_tied");
    let model = Transformer::load(&model_dir, &Device::Cpu).unwrap();
    let target = LocalTarget {
        model: &model,
        tokenizer: Tokenizer::from_dir(&model_dir).unwrap(),
        name: "qwen2_bias_tied".into(),
    };
    let task = Task::load(&root().join("fixtures/eval/mc_arith.toml")).unwrap();
    let (result, records) = evaluate(&task, &target, None, &RunOptions::default()).unwrap();
    let fixture: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(root().join("fixtures/eval/lm_eval_mc.json")).unwrap(),
    )
    .unwrap();
    let items = fixture["items"].as_array().unwrap();
    assert_eq!(records.len(), items.len());
    for (record, item) in records.iter().zip(items) {
        let Outcomes::Choices {
            loglikelihoods,
            greedy,
            ..
        } = &record.outcomes
        else {
            panic!("a multiple-choice record");
        };
        let want: Vec<f64> = item["loglikelihoods"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_f64().unwrap())
            .collect();
        for (got, want) in loglikelihoods.iter().zip(&want) {
            assert!(
                (got - want).abs() < 1e-4,
                "item {}: {got} vs {want}",
                record.index
            );
        }
        let want_greedy: Vec<bool> = item["greedy"]
            .as_array()
            .unwrap()
            .iter()
            .map(|v| v.as_bool().unwrap())
            .collect();
        assert_eq!(greedy, &want_greedy, "item {}", record.index);
    }
    let metric = |name: &str| result.metrics[name];
    assert_eq!(metric("acc").value, fixture["acc"].as_f64().unwrap());
    assert_eq!(
        metric("acc_norm").value,
        fixture["acc_norm"].as_f64().unwrap()
    );
    assert!((metric("acc").stderr - fixture["acc_stderr"].as_f64().unwrap()).abs() < 1e-12);
}
