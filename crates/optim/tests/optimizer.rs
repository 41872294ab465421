//! `Optimizer`: parameter groups by kind, checks that leave everything untouched on bad input,
//! the config's file format, and Muon's RMS matching.

use candle_core::{DType, Device, Tensor, Var};
use stoke_optim::{AdamWConfig, MuonConfig, OptimError, Optimizer, OptimizerConfig, ParamKind};

fn var(shape: &[usize], value: f32) -> Var {
    Var::from_tensor(&Tensor::full(value, shape, &Device::Cpu).unwrap()).unwrap()
}

fn model_params() -> Vec<(String, Var)> {
    vec![
        ("model.embed_tokens.weight".into(), var(&[10, 4], 1.0)),
        (
            "model.layers.0.self_attn.q_proj.weight".into(),
            var(&[4, 4], 1.0),
        ),
        (
            "model.layers.0.self_attn.q_proj.bias".into(),
            var(&[4], 1.0),
        ),
        ("model.norm.weight".into(), var(&[4], 1.0)),
        ("lm_head.weight".into(), var(&[10, 4], 1.0)),
    ]
}

fn zero_grads(o: &Optimizer) -> Vec<Tensor> {
    o.params()
        .iter()
        .map(|(_, v)| v.zeros_like().unwrap())
        .collect()
}

fn first_value(v: &Var) -> f32 {
    v.flatten_all()
        .unwrap()
        .get(0)
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
}

#[test]
fn adamw_decays_only_matrices_and_output_head() {
    let config = AdamWConfig {
        lr: 0.1,
        weight_decay: 0.5,
        ..AdamWConfig::default()
    };
    let mut o = Optimizer::new(OptimizerConfig::AdamW(config), model_params()).unwrap();
    // Zero gradients: Adam's step is 0 / (0 + eps) = 0, only weight decay moves weights.
    o.step(&zero_grads(&o), 1.0).unwrap();
    let decayed = 1.0f32 - 0.1 * 0.5;
    for ((name, v), kind) in o.params().iter().zip(o.param_kinds()) {
        let expected = if kind.takes_weight_decay() {
            decayed
        } else {
            1.0
        };
        assert_eq!(first_value(v), expected, "{name} ({kind:?})");
    }
}

#[test]
fn muon_decays_matrices_with_its_own_lr_and_adamw_the_head() {
    let config = MuonConfig {
        lr: 0.2,
        weight_decay: 0.5,
        adamw: AdamWConfig {
            lr: 0.1,
            weight_decay: 0.5,
            ..AdamWConfig::default()
        },
        ..MuonConfig::default()
    };
    let mut o = Optimizer::new(OptimizerConfig::Muon(config), model_params()).unwrap();
    o.step(&zero_grads(&o), 0.5).unwrap();
    for ((name, v), kind) in o.params().iter().zip(o.param_kinds()) {
        let expected = match kind {
            ParamKind::Matrix => 1.0 - 0.2 * 0.5 * 0.5, // Muon lr x factor x wd
            ParamKind::OutputHead => 1.0 - 0.1 * 0.5 * 0.5, // AdamW lr x factor x wd
            ParamKind::Embedding | ParamKind::NormOrBias => 1.0,
        };
        assert_eq!(first_value(v), expected, "{name} ({kind:?})");
    }
}

#[test]
fn muon_update_rms_matches_adamw_scale() {
    // match_rms_adamw: the update of a [64, 256] matrix has RMS about 0.2 x lr.
    let g: Vec<f32> = (0..64 * 256)
        .map(|i| (i * 7919 % 1000) as f32 / 1000.0 - 0.5)
        .collect();
    let grad = Tensor::from_vec(g, (64, 256), &Device::Cpu).unwrap();
    let w = Var::from_tensor(&Tensor::zeros((64, 256), DType::F32, &Device::Cpu).unwrap()).unwrap();
    let config = MuonConfig {
        lr: 0.01,
        weight_decay: 0.0,
        ..MuonConfig::default()
    };
    let mut o = Optimizer::new(
        OptimizerConfig::Muon(config),
        vec![("model.layers.0.mlp.up_proj.weight".into(), w.clone())],
    )
    .unwrap();
    o.step(&[grad], 1.0).unwrap();
    let rms = w
        .sqr()
        .unwrap()
        .mean_all()
        .unwrap()
        .to_scalar::<f32>()
        .unwrap()
        .sqrt();
    let relative = rms / 0.01;
    assert!(
        (0.14..0.26).contains(&relative),
        "update RMS / lr = {relative}"
    );
}

#[test]
fn wrong_gradient_count_changes_nothing() {
    let mut o = Optimizer::new(OptimizerConfig::default(), model_params()).unwrap();
    let mut grads = zero_grads(&o);
    grads.pop();
    let err = o.step(&grads, 1.0).expect_err("4 grads for 5 params");
    assert!(matches!(
        err,
        OptimError::GradCount {
            expected: 5,
            got: 4
        }
    ));
    assert_eq!(o.steps_taken(), 0);
}

#[test]
fn wrong_gradient_shape_names_the_parameter_and_changes_nothing() {
    let mut o = Optimizer::new(OptimizerConfig::default(), model_params()).unwrap();
    let mut grads = zero_grads(&o);
    grads[4] = Tensor::zeros((4, 10), DType::F32, &Device::Cpu).unwrap();
    let err = o.step(&grads, 1.0).expect_err("transposed gradient");
    assert!(err.to_string().contains("lm_head.weight"), "{err}");
    assert_eq!(o.steps_taken(), 0);
    assert_eq!(first_value(&o.params()[1].1), 1.0, "no parameter moved");
}

#[test]
fn invalid_lr_factor_is_refused() {
    let mut o = Optimizer::new(OptimizerConfig::default(), model_params()).unwrap();
    for bad in [f64::NAN, -1.0, f64::INFINITY] {
        assert!(matches!(
            o.step(&zero_grads(&o), bad),
            Err(OptimError::InvalidLrFactor(_))
        ));
    }
    assert_eq!(o.steps_taken(), 0);
}

#[test]
fn non_f32_parameter_is_refused_by_name() {
    let half = Var::from_tensor(&Tensor::zeros(4, DType::F64, &Device::Cpu).unwrap()).unwrap();
    let err = Optimizer::new(
        OptimizerConfig::default(),
        vec![("model.norm.weight".into(), half)],
    )
    .expect_err("f64 parameter");
    assert!(err.to_string().contains("model.norm.weight"), "{err}");
}

#[test]
fn duplicate_names_are_refused() {
    let params = vec![
        ("a.weight".into(), var(&[2, 2], 0.0)),
        ("a.weight".into(), var(&[2, 2], 0.0)),
    ];
    assert!(Optimizer::new(OptimizerConfig::default(), params).is_err());
}

#[test]
fn invalid_config_names_the_field() {
    let config = OptimizerConfig::Muon(MuonConfig {
        adamw: AdamWConfig {
            beta2: 1.0,
            ..AdamWConfig::default()
        },
        ..MuonConfig::default()
    });
    let err = Optimizer::new(config, model_params()).expect_err("beta2 = 1");
    assert!(err.to_string().contains("muon.adamw.beta2"), "{err}");
}

#[test]
fn config_file_format_round_trips_and_rejects_unknown_keys() {
    let text = "kind = \"muon\"\nlr = 0.001\nmomentum = 0.95\nnesterov = true\nns_steps = 5\nweight_decay = 0.1\n\
                [adamw]\nlr = 0.0006\nbeta1 = 0.9\nbeta2 = 0.95\neps = 1e-8\nweight_decay = 0.1\n";
    let config: OptimizerConfig = toml::from_str(text).expect("valid muon table");
    let OptimizerConfig::Muon(muon) = &config else {
        panic!("parsed {config:?}")
    };
    assert_eq!(muon.lr, 0.001);
    let back: OptimizerConfig = toml::from_str(&toml::to_string(&config).unwrap()).unwrap();
    assert_eq!(back, config);
    let adamw: OptimizerConfig = toml::from_str(
        "kind = \"adamw\"\nlr = 1.0\nbeta1 = 0.9\nbeta2 = 0.95\neps = 1e-8\nweight_decay = 0.0\n",
    )
    .expect("adamw table");
    assert_eq!(adamw.kind_name(), "adamw");
    let typo = "kind = \"adamw\"\nlr = 1.0\nbeta1 = 0.9\nbeta2 = 0.95\neps = 1e-8\nweight_decay = 0.0\nbetas = 1\n";
    assert!(toml::from_str::<OptimizerConfig>(typo).is_err());
}

#[test]
fn steps_update_a_shared_var_in_place() {
    // The optimizer must move the model's own Var, not a copy.
    let w = var(&[3, 3], 1.0);
    let mut o = Optimizer::new(
        OptimizerConfig::default(),
        vec![("model.layers.0.mlp.up_proj.weight".into(), w.clone())],
    )
    .unwrap();
    let g = Tensor::ones((3, 3), DType::F32, &Device::Cpu).unwrap();
    o.step(&[g], 1.0).unwrap();
    assert!(first_value(&w) < 1.0);
}

fn tensor(values: &[f32], shape: (usize, usize)) -> Tensor {
    Tensor::from_vec(values.to_vec(), shape, &Device::Cpu).unwrap()
}

fn to_vec(t: &Tensor) -> Vec<f32> {
    t.flatten_all().unwrap().to_vec1::<f32>().unwrap()
}

#[test]
fn muon_without_nesterov_applies_orthogonalised_momentum() {
    // Two steps by hand: B1 = (1 - mu) g1, B2 = B1 + (1 - mu)(g2 - B1); the update of step t is
    // NS(B_t) scaled by lr * 0.2 * sqrt(max(rows, cols)), after decay by (1 - lr * wd).
    let (mu, lr, wd) = (0.9, 0.05, 0.1);
    let g1 = tensor(&[0.3, -0.1, 0.7, 0.2, 0.5, -0.4], (2, 3));
    let g2 = tensor(&[-0.2, 0.6, 0.1, 0.9, -0.3, 0.4], (2, 3));
    let p0 = tensor(&[1.0, 2.0, 3.0, 4.0, 5.0, 6.0], (2, 3));
    let w = Var::from_tensor(&p0).unwrap();
    let config = MuonConfig {
        lr,
        momentum: mu,
        nesterov: false,
        weight_decay: wd,
        ..MuonConfig::default()
    };
    let mut o = Optimizer::new(
        OptimizerConfig::Muon(config),
        vec![("model.layers.0.self_attn.o_proj.weight".into(), w.clone())],
    )
    .unwrap();
    o.step(std::slice::from_ref(&g1), 1.0).unwrap();
    o.step(std::slice::from_ref(&g2), 1.0).unwrap();

    let b1: Vec<f32> = to_vec(&g1).iter().map(|g| (1.0 - mu as f32) * g).collect();
    let b2: Vec<f32> = b1
        .iter()
        .zip(to_vec(&g2))
        .map(|(b, g)| b + (1.0 - mu as f32) * (g - b))
        .collect();
    let ns1 = to_vec(&stoke_optim::newton_schulz5(&tensor(&b1, (2, 3)), 5).unwrap());
    let ns2 = to_vec(&stoke_optim::newton_schulz5(&tensor(&b2, (2, 3)), 5).unwrap());
    let scale = (lr * 0.2 * 3f64.sqrt()) as f32;
    let decay = (1.0 - lr * wd) as f32;
    let expected: Vec<f32> = to_vec(&p0)
        .iter()
        .zip(ns1.iter().zip(&ns2))
        .map(|(p, (u1, u2))| (p * decay - scale * u1) * decay - scale * u2)
        .collect();
    for (got, want) in to_vec(w.as_tensor()).iter().zip(&expected) {
        assert!((got - want).abs() < 1e-6, "{got} vs {want}");
    }
}

#[test]
fn muon_treats_higher_rank_matrix_as_dim0_by_rest() {
    let w = var(&[4, 2, 3], 0.0);
    let mut o = Optimizer::new(
        OptimizerConfig::Muon(MuonConfig {
            weight_decay: 0.0,
            ..MuonConfig::default()
        }),
        vec![("model.layers.0.conv.weight".into(), w.clone())],
    )
    .unwrap();
    assert_eq!(o.param_kinds(), &[ParamKind::Matrix]);
    let g: Vec<f32> = (0..24).map(|i| (i as f32 * 0.37).sin()).collect();
    o.step(
        &[Tensor::from_vec(g, (4, 2, 3), &Device::Cpu).unwrap()],
        1.0,
    )
    .unwrap();
    // The update is NS of the [4, 6] gradient: rows nearly orthonormal, so nearly equal norms.
    let update = w.reshape((4, 6)).unwrap();
    let row_norms = to_vec(&update.sqr().unwrap().sum(1).unwrap().sqrt().unwrap());
    let (lo, hi) = row_norms
        .iter()
        .fold((f32::MAX, 0f32), |(lo, hi), &r| (lo.min(r), hi.max(r)));
    assert!(lo > 0.0 && hi / lo < 2.0, "row norms {row_norms:?}");
}
