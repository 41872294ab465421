//! Global-norm clipping against hand-computed values.

use candle_core::{Device, Tensor};
use stoke_optim::{clip_grad_norm, clip_to_norm, global_grad_norm};

fn grads() -> Vec<Tensor> {
    // Norm: sqrt(3^2 + 4^2 + 12^2) = 13.
    vec![
        Tensor::new(&[3.0f32, 4.0], &Device::Cpu).unwrap(),
        Tensor::new(&[[12.0f32]], &Device::Cpu).unwrap(),
    ]
}

fn values(grads: &[Tensor]) -> Vec<f32> {
    grads
        .iter()
        .flat_map(|g| g.flatten_all().unwrap().to_vec1::<f32>().unwrap())
        .collect()
}

#[test]
fn global_norm_is_hand_computed_value() {
    assert_eq!(global_grad_norm(&grads()).unwrap(), 13.0);
}

#[test]
fn clipping_scales_by_max_norm_over_norm_plus_eps() {
    let mut g = grads();
    let norm = clip_grad_norm(&mut g, 1.0).unwrap();
    assert_eq!(norm, 13.0, "returns the norm before clipping");
    let scale = 1.0 / (13.0 + 1e-6);
    let expected = [3.0 * scale, 4.0 * scale, 12.0 * scale];
    for (got, want) in values(&g).iter().zip(expected) {
        assert!((f64::from(*got) - want).abs() < 1e-7, "{got} vs {want}");
    }
    let after = global_grad_norm(&g).unwrap();
    assert!((after - 1.0).abs() < 1e-6, "norm after clipping {after}");
}

#[test]
fn norm_below_max_leaves_grads_untouched() {
    let mut g = grads();
    let norm = clip_grad_norm(&mut g, 13.5).unwrap();
    assert_eq!(norm, 13.0);
    assert_eq!(values(&g), vec![3.0, 4.0, 12.0]);
}

#[test]
fn non_finite_norm_is_returned_not_clipped() {
    let mut g = vec![Tensor::new(&[f32::INFINITY, 1.0], &Device::Cpu).unwrap()];
    let norm = clip_grad_norm(&mut g, 1.0).unwrap();
    assert!(norm.is_infinite());
    assert_eq!(values(&g)[1], 1.0);
    let mut g = vec![Tensor::new(&[f32::NAN, 1.0], &Device::Cpu).unwrap()];
    assert!(clip_grad_norm(&mut g, 1.0).unwrap().is_nan());
    assert_eq!(values(&g)[1], 1.0);
}

#[test]
fn strided_gradient_norm_is_the_same() {
    let g = Tensor::new(&[[1.0f32, 2.0], [3.0, 4.0]], &Device::Cpu).unwrap();
    let t = g.t().unwrap(); // non-contiguous view
    assert_eq!(global_grad_norm(&[t]).unwrap(), 30.0f64.sqrt());
}

#[test]
fn invalid_max_norm_is_an_error() {
    let mut g = grads();
    assert!(clip_grad_norm(&mut g, 0.0).is_err());
    assert!(clip_grad_norm(&mut g, f64::NAN).is_err());
}

#[test]
fn norm_is_bit_identical_across_repeats() {
    // Resumed runs must reproduce clip scales exactly, so the parallel sum may not depend on
    // how rayon happens to split the work.
    let values: Vec<f32> = (0..2_000_003)
        .map(|i| ((i % 977) as f32 - 488.0) * 1e-3)
        .collect();
    let grads = vec![Tensor::from_vec(values, 2_000_003, &Device::Cpu).unwrap()];
    let first = global_grad_norm(&grads).unwrap();
    for _ in 0..20 {
        assert_eq!(global_grad_norm(&grads).unwrap().to_bits(), first.to_bits());
    }
}

#[test]
fn clipping_to_a_known_norm_equals_clipping_that_computes_it() {
    // Large enough for several parallel chunks of the scaling pass.
    let big: Vec<f32> = (0..100_000).map(|i| ((i as f32) * 0.37).sin()).collect();
    let make = || {
        vec![
            Tensor::new(big.as_slice(), &Device::Cpu).unwrap(),
            Tensor::new(&[[12.0f32, -5.0]], &Device::Cpu).unwrap(),
        ]
    };
    let mut computed = make();
    let norm = clip_grad_norm(&mut computed, 2.0).unwrap();
    let mut known = make();
    let known_norm = global_grad_norm(&known).unwrap();
    assert_eq!(known_norm, norm);
    clip_to_norm(&mut known, 2.0, known_norm).unwrap();
    let bits = |g: &[Tensor]| values(g).iter().map(|v| v.to_bits()).collect::<Vec<_>>();
    assert_eq!(bits(&computed), bits(&known));
    assert!(
        (global_grad_norm(&known).unwrap() - 2.0).abs() < 1e-5,
        "from {norm}"
    );
    assert!(clip_to_norm(&mut known, -1.0, norm).is_err());
}
