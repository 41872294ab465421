//! Bad input gives a `ModelError` whose message names the file and the field or tensor,
//! never a panic. Broken checkpoints are written to a temporary directory per test.

mod common;

use candle_core::{DType, Device, Tensor};
use common::*;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use stoke_model::{ModelError, Transformer};

/// A valid tiny checkpoint in a fresh temporary directory.
fn valid_checkpoint() -> (tempfile::TempDir, PathBuf) {
    stoke_ops::numerics::init_compute_threads();
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join("ckpt");
    Transformer::init(tiny_config(TINY_LLAMA), &Device::Cpu, 5)
        .expect("init")
        .save(&dir)
        .expect("save");
    (tmp, dir)
}

fn load_error(dir: &Path) -> (ModelError, String) {
    match Transformer::load(dir, &Device::Cpu) {
        Ok(_) => panic!("loading {} should fail", dir.display()),
        Err(e) => {
            let message = e.to_string();
            (e, message)
        }
    }
}

fn edit_config(dir: &Path, edit: impl FnOnce(&mut serde_json::Map<String, serde_json::Value>)) {
    let path = dir.join("config.json");
    let mut value: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&path).expect("read")).expect("json");
    edit(value.as_object_mut().expect("object"));
    std::fs::write(&path, serde_json::to_string(&value).expect("serialize")).expect("write");
}

fn edit_weights(dir: &Path, edit: impl FnOnce(&mut HashMap<String, Tensor>)) {
    let path = dir.join("model.safetensors");
    let mut tensors = candle_core::safetensors::load(&path, &Device::Cpu).expect("load weights");
    edit(&mut tensors);
    candle_core::safetensors::save(&tensors, &path).expect("save weights");
}

#[test]
fn missing_directory_is_named() {
    let tmp = tempfile::tempdir().expect("tempdir");
    let (err, message) = load_error(&tmp.path().join("nope"));
    assert!(matches!(err, ModelError::MissingDir(_)), "{err:?}");
    assert!(message.contains("nope"), "{message}");
}

#[test]
fn missing_config_file_is_named() {
    let (_tmp, dir) = valid_checkpoint();
    std::fs::remove_file(dir.join("config.json")).expect("remove");
    let (err, message) = load_error(&dir);
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err:?}");
    assert!(message.contains("config.json"), "{message}");
}

#[test]
fn malformed_config_json_names_the_file() {
    let (_tmp, dir) = valid_checkpoint();
    std::fs::write(dir.join("config.json"), "{\"vocab_size\": 61,").expect("write");
    let (err, message) = load_error(&dir);
    assert!(matches!(err, ModelError::MalformedJson { .. }), "{err:?}");
    assert!(message.contains("config.json"), "{message}");
}

#[test]
fn wrongly_typed_config_field_is_named() {
    let (_tmp, dir) = valid_checkpoint();
    edit_config(&dir, |c| {
        c.insert("hidden_size".into(), "sixteen".into());
    });
    let (_, message) = load_error(&dir);
    assert!(
        message.contains("config.json") && message.contains("hidden_size"),
        "{message}"
    );
}

#[test]
fn missing_required_config_field_is_named() {
    let (_tmp, dir) = valid_checkpoint();
    edit_config(&dir, |c| {
        c.remove("vocab_size");
    });
    let (err, message) = load_error(&dir);
    assert!(matches!(err, ModelError::InvalidConfig { .. }), "{err:?}");
    assert!(
        message.contains("config.json") && message.contains("vocab_size"),
        "{message}"
    );
}

#[test]
fn unsupported_architecture_is_named() {
    let (_tmp, dir) = valid_checkpoint();
    edit_config(&dir, |c| {
        c.insert(
            "architectures".into(),
            serde_json::json!(["MistralForCausalLM"]),
        );
        c.remove("model_type");
    });
    let (err, message) = load_error(&dir);
    assert!(matches!(err, ModelError::Unsupported { .. }), "{err:?}");
    assert!(
        message.contains("architectures") && message.contains("MistralForCausalLM"),
        "{message}"
    );
}

#[test]
fn unsupported_rope_type_is_named() {
    let (_tmp, dir) = valid_checkpoint();
    edit_config(&dir, |c| {
        c.insert(
            "rope_scaling".into(),
            serde_json::json!({"rope_type": "dynamic", "factor": 2.0}),
        );
    });
    let (err, message) = load_error(&dir);
    assert!(matches!(err, ModelError::Unsupported { .. }), "{err:?}");
    assert!(
        message.contains("config.json") && message.contains("rope_scaling.rope_type"),
        "{message}"
    );
    assert!(message.contains("dynamic"), "{message}");
}

#[test]
fn missing_rope_parameter_is_named() {
    let (_tmp, dir) = valid_checkpoint();
    edit_config(&dir, |c| {
        c.insert(
            "rope_parameters".into(),
            serde_json::json!({"rope_type": "llama3", "factor": 8.0, "rope_theta": 1e4}),
        );
    });
    let (_, message) = load_error(&dir);
    assert!(
        message.contains("rope_parameters.low_freq_factor"),
        "{message}"
    );
}

#[test]
fn missing_tensor_is_named() {
    let (_tmp, dir) = valid_checkpoint();
    edit_weights(&dir, |t| {
        t.remove("model.layers.1.mlp.up_proj.weight");
    });
    let (err, message) = load_error(&dir);
    assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
    assert!(
        message.contains("model.safetensors")
            && message.contains("model.layers.1.mlp.up_proj.weight"),
        "{message}"
    );
}

#[test]
fn shape_mismatch_names_tensor_and_both_shapes() {
    let (_tmp, dir) = valid_checkpoint();
    edit_weights(&dir, |t| {
        t.insert(
            "model.norm.weight".into(),
            Tensor::ones(17, DType::F32, &Device::Cpu).expect("ones"),
        );
    });
    let (err, message) = load_error(&dir);
    assert!(matches!(err, ModelError::ShapeMismatch { .. }), "{err:?}");
    assert!(
        message.contains("model.norm.weight")
            && message.contains("[17]")
            && message.contains("[16]"),
        "{message}"
    );
}

#[test]
fn integer_weight_is_an_unsupported_dtype() {
    let (_tmp, dir) = valid_checkpoint();
    edit_weights(&dir, |t| {
        t.insert(
            "model.norm.weight".into(),
            Tensor::ones(16, DType::I64, &Device::Cpu).expect("ones"),
        );
    });
    let (err, message) = load_error(&dir);
    assert!(
        matches!(err, ModelError::UnsupportedDtype { .. }),
        "{err:?}"
    );
    assert!(
        message.contains("model.norm.weight") && message.contains("I64"),
        "{message}"
    );
}

#[test]
fn unexpected_tensor_is_named() {
    let (_tmp, dir) = valid_checkpoint();
    edit_weights(&dir, |t| {
        t.insert(
            "model.layers.0.mlp.experts.0.weight".into(),
            Tensor::ones(4, DType::F32, &Device::Cpu).expect("ones"),
        );
    });
    let (err, message) = load_error(&dir);
    assert!(
        matches!(err, ModelError::UnexpectedTensor { .. }),
        "{err:?}"
    );
    assert!(
        message.contains("model.layers.0.mlp.experts.0.weight"),
        "{message}"
    );
}

#[test]
fn truncated_safetensors_names_the_file() {
    let (_tmp, dir) = valid_checkpoint();
    let path = dir.join("model.safetensors");
    let bytes = std::fs::read(&path).expect("read");
    std::fs::write(&path, &bytes[..bytes.len() - 100]).expect("truncate");
    let (err, message) = load_error(&dir);
    assert!(
        matches!(err, ModelError::CorruptSafetensors { .. }),
        "{err:?}"
    );
    assert!(message.contains("model.safetensors"), "{message}");
    // A header cut short is reported the same way.
    std::fs::write(&path, &bytes[..20]).expect("truncate header");
    let (err, _) = load_error(&dir);
    assert!(
        matches!(err, ModelError::CorruptSafetensors { .. }),
        "{err:?}"
    );
}

#[test]
fn missing_weights_and_missing_shards_are_named() {
    let (_tmp, dir) = valid_checkpoint();
    std::fs::remove_file(dir.join("model.safetensors")).expect("remove");
    let (err, message) = load_error(&dir);
    assert!(matches!(err, ModelError::MissingFile { .. }), "{err:?}");
    assert!(message.contains("model.safetensors"), "{message}");
    let index = serde_json::json!({"metadata": {}, "weight_map": {"model.norm.weight": "model-00001-of-00002.safetensors"}});
    std::fs::write(dir.join("model.safetensors.index.json"), index.to_string()).expect("index");
    let (_, message) = load_error(&dir);
    assert!(
        message.contains("model-00001-of-00002.safetensors"),
        "{message}"
    );
}

/// A copy of a MoE fixture in a fresh temporary directory.
fn moe_checkpoint(name: &str) -> (tempfile::TempDir, PathBuf) {
    let tmp = tempfile::tempdir().expect("tempdir");
    let dir = tmp.path().join(name);
    std::fs::create_dir_all(&dir).expect("mkdir");
    for file in ["config.json", "model.safetensors"] {
        std::fs::copy(fixtures_root().join(name).join(file), dir.join(file)).expect("copy");
    }
    (tmp, dir)
}

#[test]
fn inconsistent_moe_config_fields_are_named() {
    let cases: [(&str, &str, serde_json::Value, &str); 4] = [
        (
            "mixtral_moe",
            "num_experts_per_tok",
            5.into(),
            "num_experts_per_tok",
        ),
        (
            "mixtral_moe",
            "num_local_experts",
            0.into(),
            "num_local_experts",
        ),
        (
            "qwen2_moe_shared",
            "mlp_only_layers",
            vec![7].into(),
            "mlp_only_layers",
        ),
        ("qwen3_moe", "num_experts", 6.into(), "num_local_experts"),
    ];
    for (fixture, field, value, named) in cases {
        let (_tmp, dir) = moe_checkpoint(fixture);
        edit_config(&dir, |c| {
            c.insert(field.to_string(), value.clone());
        });
        let (err, message) = load_error(&dir);
        assert!(
            matches!(err, ModelError::InvalidConfig { .. }),
            "{fixture} {field}: {err:?}"
        );
        assert!(
            message.contains("config.json") && message.contains(named) && !message.contains('\n'),
            "{fixture} {field}: {message}"
        );
    }
}

#[test]
fn a_missing_expert_tensor_is_named() {
    for (fixture, tensor) in [
        (
            "mixtral_moe",
            "model.layers.1.block_sparse_moe.experts.2.w3.weight",
        ),
        (
            "qwen2_moe_shared",
            "model.layers.0.mlp.shared_expert_gate.weight",
        ),
        ("qwen3_moe", "model.layers.0.mlp.gate.weight"),
    ] {
        let (_tmp, dir) = moe_checkpoint(fixture);
        edit_weights(&dir, |t| {
            assert!(t.remove(tensor).is_some(), "{tensor} in {fixture}");
        });
        let (err, message) = load_error(&dir);
        assert!(matches!(err, ModelError::MissingTensor { .. }), "{err:?}");
        assert!(
            message.contains("model.safetensors") && message.contains(tensor),
            "{message}"
        );
    }
}
