//! Preference losses against TRL 1.16's own loss code: `scripts/make_preference_fixtures.py` runs
//! `DPOTrainer._compute_loss`, `CPOTrainer.get_batch_loss_metrics`,
//! `ORPOTrainer.get_batch_loss_metrics` and `KTOTrainer._compute_loss` on fixed per-token
//! log-probs and writes the loss, its gradient w.r.t. those log-probs, and TRL's logged metrics
//! (fixtures/preference/trl_loss.json). Every case must match within 1e-6 (relative to the
//! value's magnitude when it exceeds 1).

use std::collections::BTreeMap;

use candle_core::{DType, Device, Tensor, Var};
use serde::Deserialize;
use stoke_train::preference::{
    CpoLoss, DpoLoss, DpoLossType, KtoInputs, KtoLoss, OrpoLoss, PreferenceOutput, SequenceLogps,
};

#[derive(Deserialize)]
struct Fixture {
    trl_version: String,
    inputs: Inputs,
    cases: Vec<Case>,
}

#[derive(Deserialize)]
struct Inputs {
    chosen_tok: Vec<Vec<f64>>,
    chosen_mask: Vec<Vec<u8>>,
    rejected_tok: Vec<Vec<f64>>,
    rejected_mask: Vec<Vec<u8>>,
    ref_chosen: Vec<f64>,
    ref_rejected: Vec<f64>,
    kto_tok: Vec<Vec<f64>>,
    kto_mask: Vec<Vec<u8>>,
    kto_label: Vec<bool>,
    kto_ref: Vec<f64>,
    kl_tok: Vec<Vec<f64>>,
    kl_mask: Vec<Vec<u8>>,
    kl_ref: Vec<f64>,
}

#[derive(Deserialize)]
struct Case {
    name: String,
    trainer: String,
    dtype: String,
    config: serde_json::Map<String, serde_json::Value>,
    loss: f64,
    grad: BTreeMap<String, Vec<Vec<f64>>>,
    metrics: BTreeMap<String, f64>,
    kl: Option<f64>,
}

fn fixture() -> Fixture {
    serde_json::from_str(include_str!("../../../fixtures/preference/trl_loss.json")).unwrap()
}

/// Contiguous-from-the-start masks as lengths (the layout stoke scores completions in).
fn lengths(mask: &[Vec<u8>]) -> Vec<usize> {
    mask.iter()
        .map(|row| {
            let n = row.iter().take_while(|&&m| m == 1).count();
            assert!(
                row[n..].iter().all(|&m| m == 0),
                "mask not a prefix: {row:?}"
            );
            n
        })
        .collect()
}

fn var(rows: &[&[Vec<f64>]], dtype: DType) -> Var {
    let all: Vec<Vec<f64>> = rows.iter().flat_map(|r| r.iter().cloned()).collect();
    let width = all[0].len();
    let flat: Vec<f64> = all.concat();
    let t = Tensor::from_vec(flat, (all.len(), width), &Device::Cpu)
        .unwrap()
        .to_dtype(dtype)
        .unwrap();
    Var::from_tensor(&t).unwrap()
}

fn close(got: f64, want: f64) -> bool {
    (got - want).abs() <= 1e-6 * want.abs().max(1.0)
}

fn check_grad(case: &Case, key: &str, got: &Tensor) {
    let got = got.to_dtype(DType::F64).unwrap().to_vec2::<f64>().unwrap();
    let want = &case.grad[key];
    assert_eq!(got.len(), want.len(), "{}: {key} rows", case.name);
    for (r, (g, w)) in got.iter().zip(want).enumerate() {
        for (t, (a, b)) in g.iter().zip(w).enumerate() {
            assert!(
                close(*a, *b),
                "{}: d loss / d {key}[{r}][{t}] = {a}, TRL {b}",
                case.name
            );
        }
    }
}

fn check_metrics(case: &Case, out: &PreferenceOutput) {
    for (name, want) in &case.metrics {
        let got = out
            .metric(name)
            .unwrap_or_else(|| panic!("{}: metric {name} not reported", case.name));
        assert!(
            close(got, *want),
            "{}: {name} = {got}, TRL {want}",
            case.name
        );
    }
}

fn config<T: serde::de::DeserializeOwned>(case: &Case) -> T {
    let mut map = case.config.clone();
    // The fixture records the alias the user asked for next to TRL's resolved value.
    if let Some(requested) = map.remove("requested_loss_type") {
        map.insert("loss_type".into(), requested);
        map.remove("cpo_alpha");
    }
    serde_json::from_value(serde_json::Value::Object(map))
        .unwrap_or_else(|e| panic!("{}: config: {e}", case.name))
}

#[test]
fn every_loss_matches_trl_in_value_gradient_and_metrics() {
    let fixture = fixture();
    assert_eq!(fixture.trl_version, "1.16.0");
    let inputs = &fixture.inputs;
    let mut seen: BTreeMap<&str, usize> = BTreeMap::new();
    for case in &fixture.cases {
        *seen.entry(case.trainer.as_str()).or_default() += 1;
        let dtype = match case.dtype.as_str() {
            "float64" => DType::F64,
            "float32" => DType::F32,
            other => panic!("{}: dtype {other}", case.name),
        };
        let device = Device::Cpu;
        if case.trainer == "kto" {
            let policy_var = var(&[&inputs.kto_tok], dtype);
            let policy =
                SequenceLogps::unpaired(policy_var.as_tensor(), &lengths(&inputs.kto_mask))
                    .unwrap();
            let n = inputs.kto_ref.len();
            let reference = SequenceLogps::from_values(
                inputs.kto_ref.clone(),
                vec![0.0; n],
                vec![1; n],
                &device,
            )
            .unwrap();
            let kl_policy = SequenceLogps::unpaired(
                var(&[&inputs.kl_tok], dtype).as_tensor(),
                &lengths(&inputs.kl_mask),
            )
            .unwrap();
            let kl_reference = SequenceLogps::from_values(
                inputs.kl_ref.clone(),
                vec![0.0; n],
                vec![1; n],
                &device,
            )
            .unwrap();
            let loss: KtoLoss = config(case);
            loss.validate().unwrap();
            let out = loss
                .loss(&KtoInputs {
                    policy: &policy,
                    reference: &reference,
                    labels: &inputs.kto_label,
                    mismatched: loss
                        .needs_mismatched()
                        .then_some((&kl_policy, &kl_reference)),
                })
                .unwrap();
            let value = out.loss.to_scalar::<f64>().unwrap();
            assert!(
                close(value, case.loss),
                "{}: loss {value}, TRL {}",
                case.name,
                case.loss
            );
            let grads = out.loss.backward().unwrap();
            check_grad(case, "kto_tok", grads.get(policy_var.as_tensor()).unwrap());
            assert!(
                case.grad["kl_tok"].iter().flatten().all(|&g| g == 0.0),
                "{}: TRL's KL pass has no gradient",
                case.name
            );
            if let Some(kl) = case.kl {
                assert!(close(out.metric("kl").unwrap(), kl), "{}: kl", case.name);
            }
            check_metrics(case, &out);
            continue;
        }
        let policy_var = var(&[&inputs.chosen_tok, &inputs.rejected_tok], dtype);
        let lens = [lengths(&inputs.chosen_mask), lengths(&inputs.rejected_mask)].concat();
        let policy = SequenceLogps::pairs(policy_var.as_tensor(), &lens).unwrap();
        let ref_values = [inputs.ref_chosen.clone(), inputs.ref_rejected.clone()].concat();
        let rows = ref_values.len();
        // TRL takes precomputed reference values as given (LD-DPO weighting included).
        let reference =
            SequenceLogps::from_values(ref_values, vec![0.0; rows], lens.clone(), &device).unwrap();
        let out = match case.trainer.as_str() {
            "dpo" => {
                let loss: DpoLoss = config(case);
                loss.validate().unwrap();
                loss.loss(&policy, &reference).unwrap()
            }
            "cpo" => {
                let loss: CpoLoss = config(case);
                loss.validate().unwrap();
                loss.loss(&policy).unwrap()
            }
            "orpo" => {
                let loss: OrpoLoss = config(case);
                loss.validate().unwrap();
                loss.loss(&policy).unwrap()
            }
            other => panic!("{}: trainer {other}", case.name),
        };
        let value = out.loss.to_scalar::<f64>().unwrap();
        assert!(
            close(value, case.loss),
            "{}: loss {value}, TRL {}",
            case.name,
            case.loss
        );
        let grads = out.loss.backward().unwrap();
        let grad = grads.get(policy_var.as_tensor()).unwrap();
        let half = inputs.chosen_tok.len();
        check_grad(case, "chosen_tok", &grad.narrow(0, 0, half).unwrap());
        check_grad(case, "rejected_tok", &grad.narrow(0, half, half).unwrap());
        check_metrics(case, &out);
    }
    // Every DPO loss type, CPO/SimPO/AlphaPO, ORPO and KTO are in the fixture.
    assert!(seen["dpo"] >= 15 && seen["cpo"] >= 5 && seen["orpo"] >= 2 && seen["kto"] >= 3);
}

#[test]
fn every_dpo_loss_type_has_a_fixture_case() {
    let fixture = fixture();
    let covered: Vec<DpoLossType> = fixture
        .cases
        .iter()
        .filter(|c| c.trainer == "dpo")
        .flat_map(|c| config::<DpoLoss>(c).loss_type)
        .collect();
    let all: Vec<DpoLossType> = serde_json::from_str(
        r#"["sigmoid","hinge","ipo","exo_pair","nca_pair","robust","bco_pair","sppo_hard","aot",
            "aot_unpaired","apo_zero","apo_down","discopop","sft","sigmoid_norm"]"#,
    )
    .unwrap();
    for t in all {
        assert!(covered.contains(&t), "{t:?} has no TRL case");
    }
}

/// DPO's first step: the policy is the reference, every log-ratio is exactly 0, and the gradient
/// must still push chosen up and rejected down (a composed log-sigmoid has gradient 0 there).
#[test]
fn first_step_at_zero_log_ratio_has_the_textbook_gradient() {
    let device = Device::Cpu;
    let tok = Var::from_tensor(&Tensor::new(&[[-1.0f32, -2.0], [-0.5, -0.25]], &device).unwrap())
        .unwrap();
    let policy = SequenceLogps::pairs(tok.as_tensor(), &[2, 2]).unwrap();
    let values = policy.sum_values().unwrap();
    let reference = SequenceLogps::from_values(values, vec![0.0; 2], vec![2, 2], &device).unwrap();
    for loss_type in [DpoLossType::Sigmoid, DpoLossType::ApoZero] {
        let loss = DpoLoss {
            loss_type: vec![loss_type],
            ..DpoLoss::default()
        };
        let out = loss.loss(&policy, &reference).unwrap();
        let grad = out.loss.backward().unwrap();
        let g = grad.get(tok.as_tensor()).unwrap().to_vec2::<f32>().unwrap();
        // sigmoid: d/d r_w = -beta * s(0) = -0.05; apo_zero: -beta * s'(0) = -0.025.
        let want = if loss_type == DpoLossType::Sigmoid {
            0.05
        } else {
            0.025
        };
        for t in 0..2 {
            assert!((g[0][t] + want).abs() < 1e-7, "{loss_type:?} chosen {g:?}");
            assert!(
                (g[1][t] - want).abs() < 1e-7,
                "{loss_type:?} rejected {g:?}"
            );
        }
        assert_eq!(out.metric("rewards/accuracies"), Some(0.0));
        assert_eq!(out.metric("rewards/margins"), Some(0.0));
    }
}

#[test]
fn bad_settings_name_their_key() {
    let cases: Vec<(&str, &str)> = vec![
        (r#"{"beta": 0.0}"#, "dpo.beta"),
        (r#"{"loss_type": []}"#, "dpo.loss_type"),
        (
            r#"{"loss_type": ["sigmoid","sft"], "loss_weights": [1.0]}"#,
            "dpo.loss_weights",
        ),
        (r#"{"loss_type": "exo_pair"}"#, "dpo.label_smoothing"),
        (
            r#"{"label_smoothing": 0.5, "loss_type": "robust"}"#,
            "dpo.label_smoothing",
        ),
        (
            r#"{"loss_type": "apo_zero", "f_divergence_type": "forward_kl"}"#,
            "dpo.f_divergence_type",
        ),
        (r#"{"ld_alpha": 2.0}"#, "dpo.ld_alpha"),
    ];
    for (json, key) in cases {
        let loss: DpoLoss = serde_json::from_str(json).unwrap();
        let err = loss.validate().unwrap_err().to_string();
        assert!(err.contains(key), "{json}: {err}");
    }
    let err = serde_json::from_str::<DpoLoss>(r#"{"loss_type": ["sigmoid", "kto_pair"]}"#)
        .unwrap_err()
        .to_string();
    assert!(
        err.contains("unknown loss type `kto_pair`") && err.contains("apo_zero"),
        "{err}"
    );
    assert!(serde_json::from_str::<DpoLoss>(r#"{"betta": 0.1}"#).is_err());
    let cpo: CpoLoss =
        serde_json::from_str(r#"{"loss_type": "hinge", "label_smoothing": 0.1}"#).unwrap();
    assert!(
        cpo.validate()
            .unwrap_err()
            .to_string()
            .contains("cpo.label_smoothing")
    );
    let kto: KtoLoss = serde_json::from_str(r#"{"undesirable_weight": -1.0}"#).unwrap();
    assert!(
        kto.validate()
            .unwrap_err()
            .to_string()
            .contains("kto.undesirable_weight")
    );
}
