//! Logit distillation's loss against TRL 1.16.0's own `GKDTrainer.generalized_jsd_loss`, run by
//! `scripts/make_distill_fixtures.py` (fixtures/distill/trl_gkd.json): beta 0 (forward KL),
//! 0.5 (mixture) and 1 (reverse KL), temperatures 1 and 2, with completion labels (masked,
//! divided by the unmasked positions) and over the full rows (TRL's "batchmean" divides by
//! the batch size). Loss and gradient with respect to the student's logits within 1e-6.

use candle_core::{Device, Tensor, Var};
use serde::Deserialize;
use stoke_ops::distill::generalized_jsd_loss;

#[derive(Deserialize)]
struct Case {
    beta: f64,
    temperature: f64,
    masked: bool,
    loss: f64,
    grad: Vec<Vec<Vec<f64>>>,
}

#[derive(Deserialize)]
struct Fixture {
    student: Vec<Vec<Vec<f64>>>,
    teacher: Vec<Vec<Vec<f64>>>,
    labels: Vec<Vec<i64>>,
    cases: Vec<Case>,
}

fn flat(x: &[Vec<Vec<f64>>]) -> Vec<f64> {
    x.iter().flatten().flatten().copied().collect()
}

#[test]
fn generalized_jsd_matches_trl_gkd_trainer() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/distill/trl_gkd.json"
    );
    let fixture: Fixture =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("parses");
    let (batch, positions, vocab) = (
        fixture.student.len(),
        fixture.student[0].len(),
        fixture.student[0][0].len(),
    );
    let rows = batch * positions;
    let dev = Device::Cpu;
    let teacher = Tensor::from_vec(flat(&fixture.teacher), (rows, vocab), &dev).unwrap();
    let labels: Vec<i64> = fixture.labels.iter().flatten().copied().collect();
    assert_eq!(fixture.cases.len(), 12);
    for case in &fixture.cases {
        let student = Var::from_tensor(
            &Tensor::from_vec(flat(&fixture.student), (rows, vocab), &dev).unwrap(),
        )
        .unwrap();
        let (mask, denominator): (Vec<f64>, f64) = if case.masked {
            let mask: Vec<f64> = labels
                .iter()
                .map(|&l| f64::from(u8::from(l != -100)))
                .collect();
            let count = mask.iter().sum();
            (mask, count)
        } else {
            (vec![1.0; rows], batch as f64)
        };
        let mask = Tensor::from_vec(mask, rows, &dev).unwrap();
        let loss = generalized_jsd_loss(
            student.as_tensor(),
            &teacher,
            &mask,
            case.beta,
            case.temperature,
            denominator,
        )
        .unwrap();
        let value = loss.to_scalar::<f64>().unwrap();
        let what = format!(
            "beta {} T {} masked {}",
            case.beta, case.temperature, case.masked
        );
        assert!(
            (value - case.loss).abs() < 1e-6,
            "{what}: loss {value} vs TRL {}",
            case.loss
        );
        let grads = loss.backward().unwrap();
        let grad: Vec<f64> = grads
            .get(student.as_tensor())
            .expect("student gradient")
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let want = flat(&case.grad);
        let worst = grad
            .iter()
            .zip(&want)
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f64, f64::max);
        assert!(worst < 1e-6, "{what}: gradient off by {worst}");
    }
}

#[derive(Deserialize)]
struct TopKCase {
    k: usize,
    beta: f64,
    temperature: f64,
    teacher_ids: Vec<Vec<Vec<u32>>>,
    /// `null` where the teacher returned no entry (-inf).
    teacher_logprobs: Vec<Vec<Vec<Option<f64>>>>,
    loss: f64,
    grad: Vec<Vec<Vec<f64>>>,
}

#[derive(Deserialize)]
struct TopKFixture {
    student: Vec<Vec<Vec<f64>>>,
    labels: Vec<Vec<i64>>,
    cases: Vec<TopKCase>,
}

/// The sparse divergence on a teacher's top-k log-probs plus the tail bucket against TRL's server
/// distillation code (fixtures/distill/trl_topk.json): k 1 and 3 (one entry missing, as a server
/// that returned fewer), beta 0, 0.5 and 1, temperatures 1 and 2; the mean over the completion
/// positions and its gradient within 1e-6.
#[test]
fn sparse_generalized_jsd_matches_trl_server_distillation() {
    let path = concat!(
        env!("CARGO_MANIFEST_DIR"),
        "/../../fixtures/distill/trl_topk.json"
    );
    let fixture: TopKFixture =
        serde_json::from_str(&std::fs::read_to_string(path).expect("fixture")).expect("parses");
    let (batch, positions, vocab) = (
        fixture.student.len(),
        fixture.student[0].len(),
        fixture.student[0][0].len(),
    );
    let rows = batch * positions;
    let dev = Device::Cpu;
    let mask: Vec<f64> = fixture
        .labels
        .iter()
        .flatten()
        .map(|&l| f64::from(u8::from(l != -100)))
        .collect();
    let count: f64 = mask.iter().sum();
    let mask = Tensor::from_vec(mask, rows, &dev).unwrap();
    assert_eq!(fixture.cases.len(), 12);
    let mut missing = 0;
    for case in &fixture.cases {
        let student = Var::from_tensor(
            &Tensor::from_vec(flat(&fixture.student), (rows, vocab), &dev).unwrap(),
        )
        .unwrap();
        let ids: Vec<u32> = case
            .teacher_ids
            .iter()
            .flatten()
            .flatten()
            .copied()
            .collect();
        let logprobs: Vec<f64> = case
            .teacher_logprobs
            .iter()
            .flatten()
            .flatten()
            .map(|v| v.unwrap_or(f64::NEG_INFINITY))
            .collect();
        missing += logprobs.iter().filter(|v| v.is_infinite()).count();
        let ids = Tensor::from_vec(ids, (rows, case.k), &dev).unwrap();
        let logprobs = Tensor::from_vec(logprobs, (rows, case.k), &dev).unwrap();
        let per_row = stoke_ops::distill::sparse_generalized_jsd(
            student.as_tensor(),
            &ids,
            &logprobs,
            case.beta,
            case.temperature,
        )
        .unwrap();
        let loss = ((per_row * &mask).unwrap().sum_all().unwrap() / count).unwrap();
        let value = loss.to_scalar::<f64>().unwrap();
        let what = format!("k {} beta {} T {}", case.k, case.beta, case.temperature);
        assert!(
            (value - case.loss).abs() < 1e-6,
            "{what}: loss {value} vs TRL {}",
            case.loss
        );
        let grads = loss.backward().unwrap();
        let grad: Vec<f64> = grads
            .get(student.as_tensor())
            .expect("student gradient")
            .flatten_all()
            .unwrap()
            .to_vec1()
            .unwrap();
        let worst = grad
            .iter()
            .zip(&flat(&case.grad))
            .map(|(a, b)| (a - b).abs())
            .fold(0.0f64, f64::max);
        assert!(worst < 1e-6, "{what}: gradient off by {worst}");
    }
    assert_eq!(missing, 6, "the k = 3 cases each miss one entry");
}
