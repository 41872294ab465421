//! Optimizer state files: save -> load -> step equals uninterrupted steps bit for bit; damaged
//! or mismatched files give an error naming the file (and the tensor where one is involved).

use std::path::Path;

use candle_core::{Device, Tensor, Var};
use stoke_optim::{AdamWConfig, MuonConfig, OptimError, Optimizer, OptimizerConfig};

fn values(seed: u64, n: usize) -> Vec<f32> {
    let mut state = seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1;
    (0..n)
        .map(|_| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state >> 40) as f32 / (1u64 << 24) as f32 - 0.5
        })
        .collect()
}

const SHAPES: [(&str, &[usize]); 5] = [
    ("model.embed_tokens.weight", &[12, 8]),
    ("model.layers.0.self_attn.q_proj.weight", &[8, 8]),
    ("model.layers.0.mlp.down_proj.weight", &[8, 20]),
    ("model.norm.weight", &[8]),
    ("lm_head.weight", &[12, 8]),
];

fn params() -> Vec<(String, Var)> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, (name, shape))| {
            let n = shape.iter().product();
            let t = Tensor::from_vec(values(i as u64 + 1, n), *shape, &Device::Cpu).unwrap();
            (name.to_string(), Var::from_tensor(&t).unwrap())
        })
        .collect()
}

fn grads(step: u64) -> Vec<Tensor> {
    SHAPES
        .iter()
        .enumerate()
        .map(|(i, (_, shape))| {
            let n = shape.iter().product();
            Tensor::from_vec(values(100 * step + i as u64 + 7, n), *shape, &Device::Cpu).unwrap()
        })
        .collect()
}

fn configs() -> [OptimizerConfig; 2] {
    [
        OptimizerConfig::AdamW(AdamWConfig::default()),
        OptimizerConfig::Muon(MuonConfig {
            lr: 1e-2,
            ..MuonConfig::default()
        }),
    ]
}

fn weights(o: &Optimizer) -> Vec<Vec<u32>> {
    o.params()
        .iter()
        .map(|(_, v)| {
            v.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        })
        .collect()
}

fn run(o: &mut Optimizer, steps: std::ops::Range<u64>) {
    for s in steps {
        o.step(&grads(s), 1.0 - 0.1 * s as f64).unwrap();
    }
}

#[test]
fn save_load_step_equals_uninterrupted_bit_for_bit() {
    for config in configs() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("optimizer.safetensors");

        let mut uninterrupted = Optimizer::new(config.clone(), params()).unwrap();
        run(&mut uninterrupted, 0..6);

        let mut first = Optimizer::new(config.clone(), params()).unwrap();
        run(&mut first, 0..3);
        first.save_state(&path).unwrap();
        // A fresh optimizer over the first run's current weights (as a checkpoint would restore).
        let resumed_params: Vec<(String, Var)> = first
            .params()
            .iter()
            .map(|(n, v)| {
                (
                    n.clone(),
                    Var::from_tensor(&v.as_tensor().copy().unwrap()).unwrap(),
                )
            })
            .collect();
        drop(first);
        let mut resumed = Optimizer::new(config.clone(), resumed_params).unwrap();
        resumed.load_state(&path).unwrap();
        assert_eq!(resumed.steps_taken(), 3);
        run(&mut resumed, 3..6);

        assert_eq!(
            weights(&resumed),
            weights(&uninterrupted),
            "{}",
            config.kind_name()
        );
        assert_eq!(resumed.steps_taken(), 6);
    }
}

fn saved_state(config: OptimizerConfig) -> (tempfile::TempDir, std::path::PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("optimizer.safetensors");
    let mut o = Optimizer::new(config, params()).unwrap();
    run(&mut o, 0..2);
    o.save_state(&path).unwrap();
    (dir, path)
}

fn load_into_fresh(path: &Path) -> Result<Optimizer, OptimError> {
    let mut o = Optimizer::new(OptimizerConfig::AdamW(AdamWConfig::default()), params()).unwrap();
    o.load_state(path).map(|()| o)
}

#[test]
fn truncated_file_names_the_file() {
    let (_dir, path) = saved_state(configs()[0].clone());
    let bytes = std::fs::read(&path).unwrap();
    for keep in [bytes.len() - 5, bytes.len() / 2, 20, 3, 0] {
        std::fs::write(&path, &bytes[..keep]).unwrap();
        let err = load_into_fresh(&path).expect_err("truncated file must not load");
        let text = err.to_string();
        assert!(text.contains(path.to_str().unwrap()), "kept {keep}: {text}");
        assert!(
            matches!(err, OptimError::StateFormat { .. }),
            "kept {keep}: {err:?}"
        );
    }
}

#[test]
fn flipped_data_byte_names_the_tensor() {
    let (_dir, path) = saved_state(configs()[0].clone());
    let mut bytes = std::fs::read(&path).unwrap();
    let last = bytes.len() - 1; // inside the last tensor's data
    bytes[last] ^= 0x40;
    std::fs::write(&path, &bytes).unwrap();
    let err = load_into_fresh(&path).expect_err("corrupted data must not load");
    match &err {
        OptimError::StateTensor { tensor, reason, .. } => {
            assert!(reason.contains("checksum"), "{err}");
            assert!(
                tensor.ends_with(".exp_avg") || tensor.ends_with(".exp_avg_sq"),
                "{err}"
            );
        }
        other => panic!("expected a tensor error, got {other:?}"),
    }
    assert!(err.to_string().contains(path.to_str().unwrap()));
}

#[test]
fn corrupted_header_names_the_file() {
    let (_dir, path) = saved_state(configs()[0].clone());
    let mut bytes = std::fs::read(&path).unwrap();
    bytes[9] = b'#'; // the JSON header starts at byte 8 with `{`
    std::fs::write(&path, &bytes).unwrap();
    let err = load_into_fresh(&path).expect_err("corrupted header must not load");
    assert!(matches!(err, OptimError::StateFormat { .. }), "{err:?}");
    assert!(err.to_string().contains(path.to_str().unwrap()));
}

#[test]
fn missing_file_is_an_io_error_naming_it() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("nope.safetensors");
    let err = load_into_fresh(&path).expect_err("missing file");
    assert!(matches!(err, OptimError::StateIo { .. }));
    assert!(err.to_string().contains("nope.safetensors"));
}

#[test]
fn shape_mismatch_names_the_tensor_and_leaves_state_untouched() {
    let (_dir, path) = saved_state(configs()[0].clone());
    let mut other: Vec<(String, Var)> = params();
    let t = Tensor::zeros((8, 21), candle_core::DType::F32, &Device::Cpu).unwrap();
    other[2].1 = Var::from_tensor(&t).unwrap();
    let mut o = Optimizer::new(configs()[0].clone(), other).unwrap();
    let err = o.load_state(&path).expect_err("shape mismatch");
    match &err {
        OptimError::StateTensor { tensor, reason, .. } => {
            assert_eq!(tensor, "model.layers.0.mlp.down_proj.weight.exp_avg");
            assert!(
                reason.contains("[8, 20]") && reason.contains("[8, 21]"),
                "{reason}"
            );
        }
        other => panic!("expected a tensor error, got {other:?}"),
    }
    assert_eq!(o.steps_taken(), 0, "a failed load changes nothing");
}

#[test]
fn missing_parameter_state_names_the_tensor() {
    let (_dir, path) = saved_state(configs()[0].clone());
    let mut more = params();
    let t = Tensor::zeros(8, candle_core::DType::F32, &Device::Cpu).unwrap();
    more.push((
        "model.layers.0.input_layernorm.weight".into(),
        Var::from_tensor(&t).unwrap(),
    ));
    let mut o = Optimizer::new(configs()[0].clone(), more).unwrap();
    let err = o.load_state(&path).expect_err("missing tensor");
    assert!(
        err.to_string()
            .contains("model.layers.0.input_layernorm.weight.exp_avg"),
        "{err}"
    );
    assert!(err.to_string().contains("missing"), "{err}");
}

#[test]
fn extra_tensor_in_file_names_it() {
    let (_dir, path) = saved_state(configs()[0].clone());
    let mut fewer = params();
    fewer.pop(); // lm_head
    let mut o = Optimizer::new(configs()[0].clone(), fewer).unwrap();
    let err = o.load_state(&path).expect_err("extra tensor");
    assert!(err.to_string().contains("lm_head.weight.exp_avg"), "{err}");
}

#[test]
fn state_of_other_optimizer_kind_is_refused() {
    let (_dir, path) = saved_state(configs()[1].clone()); // muon
    let err = load_into_fresh(&path).expect_err("muon state into adamw");
    assert!(
        err.to_string().contains("muon") && err.to_string().contains("adamw"),
        "{err}"
    );
}

#[test]
fn random_garbage_never_panics() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("garbage.safetensors");
    for seed in 0..50u64 {
        let n = (seed as usize * 37) % 400;
        let mut bytes: Vec<u8> = values(seed + 1000, n)
            .iter()
            .map(|x| x.to_bits() as u8)
            .collect();
        if seed % 2 == 0 && bytes.len() >= 8 {
            // a plausible header length so parsing goes further
            bytes[..8].copy_from_slice(&((n as u64).saturating_sub(8)).to_le_bytes());
        }
        std::fs::write(&path, &bytes).unwrap();
        assert!(load_into_fresh(&path).is_err());
    }
}
