//! On-policy distillation's per-token advantage and the clipped loss over it, against a table
//! computed by hand (issue 17's oracle for the OPD math):
//!
//! behaviour (student) log-probs S = [[-1.0, -0.5, -2.0], [-0.2, -3.0, -1.0]],
//! teacher log-probs T = [[-0.7, -0.9, -2.5], [-0.2, -1.0, -4.0]], mask [[1, 1, 0], [1, 1, 1]].
//! kl_coef 1: A = T - S on masked tokens = [[0.3, -0.4, 0], [0, 2, -3]].
//! With a reward advantage [0.5, -1.0] at weight 0.5: + [[0.25, 0.25, 0], [-0.5, -0.5, -0.5]]
//! = [[0.55, -0.15, 0], [-0.5, 1.5, -3.5]].
//! Current log-probs S + [[0.1, 0, 0], [-0.3, 0.25, 0]]: ratios e^0.1 = 1.1051709, 1, 1,
//! e^-0.3 = 0.7408182, e^0.25 = 1.2840254, 1. The clipped surrogate (eps 0.2) with the KL-only
//! advantages, per token:
//! (0,0) -min(1.1051709 x 0.3, 1.1051709 x 0.3) = -0.33155128; (0,1) -(1 x -0.4) = 0.4;
//! (1,0) A = 0: 0; (1,1) -min(1.2840254 x 2, 1.2 x 2) = -2.4 (high-clipped);
//! (1,2) -(1 x -3) = 3. High-clip fraction 1 of 5 counted tokens = 0.2; low 0.

use candle_core::{Device, Tensor};
use stoke_train::grpo::PolicyLoss;
use stoke_train::grpo::opd::token_advantages;

fn t2(rows: &[[f64; 3]; 2]) -> Tensor {
    Tensor::new(rows, &Device::Cpu).unwrap()
}

fn close(got: &Tensor, want: &[[f64; 3]; 2]) {
    let got: Vec<Vec<f64>> = got.to_vec2().unwrap();
    for (g, w) in got.iter().flatten().zip(want.iter().flatten()) {
        assert!((g - w).abs() < 1e-7, "{got:?} vs {want:?}");
    }
}

#[test]
fn advantages_and_the_clipped_loss_match_the_hand_table() {
    let student = t2(&[[-1.0, -0.5, -2.0], [-0.2, -3.0, -1.0]]);
    let teacher = t2(&[[-0.7, -0.9, -2.5], [-0.2, -1.0, -4.0]]);
    let mask = t2(&[[1.0, 1.0, 0.0], [1.0, 1.0, 1.0]]);
    let kl_only = token_advantages(&student, &teacher, &mask, 1.0, None).unwrap();
    close(&kl_only, &[[0.3, -0.4, 0.0], [0.0, 2.0, -3.0]]);
    let reward = Tensor::new(&[0.5f64, -1.0], &Device::Cpu).unwrap();
    let mixed = token_advantages(&student, &teacher, &mask, 1.0, Some((&reward, 0.5))).unwrap();
    close(&mixed, &[[0.55, -0.15, 0.0], [-0.5, 1.5, -3.5]]);
    let halved = token_advantages(&student, &teacher, &mask, 0.5, None).unwrap();
    close(&halved, &[[0.15, -0.2, 0.0], [0.0, 1.0, -1.5]]);

    let current = (&student + t2(&[[0.1, 0.0, 0.0], [-0.3, 0.25, 0.0]])).unwrap();
    let out = PolicyLoss::default()
        .per_token(&current, &student, &kl_only, &mask)
        .unwrap();
    let loss: Vec<Vec<f64>> = out.per_token_loss.to_vec2().unwrap();
    assert!((loss[0][0] + 0.1f64.exp() * 0.3).abs() < 1e-12, "{loss:?}");
    assert!((loss[0][1] - 0.4).abs() < 1e-7, "{loss:?}");
    assert!(loss[1][0].abs() < 1e-12, "{loss:?}");
    assert!((loss[1][1] + 2.4).abs() < 1e-7, "{loss:?}");
    assert!((loss[1][2] - 3.0).abs() < 1e-7, "{loss:?}");
    assert!((loss[0][0] + 0.331_551_27).abs() < 1e-7, "{loss:?}");
    assert!((out.clip.high - 0.2).abs() < 1e-12, "{:?}", out.clip);
    assert_eq!(out.clip.low, 0.0);

    // Shapes must agree.
    let short = Tensor::new(&[[0.0f64, 0.0]], &Device::Cpu).unwrap();
    assert!(token_advantages(&student, &short, &mask, 1.0, None).is_err());
}
