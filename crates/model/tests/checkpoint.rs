//! Save/load round trips: bit-identical parameters, HF layout (tied embeddings written once),
//! tokenizer files copied, atomic replacement of an existing directory.

mod common;

use candle_core::Device;
use common::*;
use std::path::Path;
use stoke_model::Transformer;

fn assert_identical(a: &Transformer, b: &Transformer, context: &str) {
    let (pa, pb) = (a.parameters(), b.parameters());
    assert_eq!(
        pa.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        pb.iter().map(|(n, _)| n).collect::<Vec<_>>(),
        "{context}: parameter names differ"
    );
    for ((name, va), (_, vb)) in pa.iter().zip(&pb) {
        let x: Vec<u32> = va
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("a")
            .iter()
            .map(|v| v.to_bits())
            .collect();
        let y: Vec<u32> = vb
            .flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("b")
            .iter()
            .map(|v| v.to_bits())
            .collect();
        assert_eq!(va.dims(), vb.dims(), "{context}: {name} shape");
        assert!(x == y, "{context}: {name} differs after round trip");
    }
}

fn without_source(config: &stoke_model::ModelConfig) -> stoke_model::ModelConfig {
    let mut c = config.clone();
    c.source_fields.clear();
    c
}

fn saved_tensor_names(dir: &Path) -> Vec<String> {
    let tensors = candle_core::safetensors::load(dir.join("model.safetensors"), &Device::Cpu)
        .expect("saved weights");
    let mut names: Vec<String> = tensors.into_keys().collect();
    names.sort();
    names
}

#[test]
fn every_fixture_round_trips_bit_identically() {
    let tmp = tempfile::tempdir().expect("tempdir");
    for dir in fixture_dirs() {
        let original = load(&dir);
        let out = tmp.path().join(name(&dir));
        original.save(&out).expect("save");
        let reloaded = load(&out);
        assert_identical(&original, &reloaded, &name(&dir));
        assert_eq!(
            without_source(original.config()),
            without_source(reloaded.config()),
            "{}: config",
            name(&dir)
        );
        let names = saved_tensor_names(&out);
        assert_eq!(
            names.contains(&"lm_head.weight".to_string()),
            !original.config().tie_word_embeddings
        );
        assert!(out.join("generation_config.json").is_file());
    }
}

#[test]
fn random_init_round_trips_and_is_deterministic_in_the_seed() {
    stoke_ops::numerics::init_compute_threads();
    let tmp = tempfile::tempdir().expect("tempdir");
    for json in [TINY_LLAMA, TINY_QWEN3_TIED] {
        let model = Transformer::init(tiny_config(json), &Device::Cpu, 42).expect("init");
        assert_identical(
            &model,
            &Transformer::init(tiny_config(json), &Device::Cpu, 42).expect("init"),
            "same seed",
        );
        let other = Transformer::init(tiny_config(json), &Device::Cpu, 43).expect("init");
        let (a, b) = (&model.parameters()[0].1, &other.parameters()[0].1);
        assert!(
            max_abs_diff(a, b) > 0.0,
            "different seeds must give different weights"
        );
        let out = tmp.path().join("init");
        model.save(&out).expect("save");
        let reloaded = load(&out);
        assert_identical(&model, &reloaded, "init");
        assert_eq!(
            without_source(model.config()),
            without_source(reloaded.config())
        );
        assert_eq!(
            model.config().num_parameters(),
            reloaded
                .parameters()
                .iter()
                .map(|(_, v)| v.elem_count())
                .sum::<usize>()
        );
    }
}

#[test]
fn save_with_tokenizer_copies_tokenizer_files_and_generation_config() {
    let source = fixtures_root().join("qwen2_bias_tied");
    let model = load(&source);
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("with_tokenizer");
    model
        .save_with_tokenizer(&out, Some(&source))
        .expect("save");
    for file in [
        "tokenizer.json",
        "tokenizer_config.json",
        "generation_config.json",
    ] {
        let copied = std::fs::read(out.join(file)).unwrap_or_else(|_| panic!("{file} not copied"));
        assert_eq!(
            copied,
            std::fs::read(source.join(file)).expect("source"),
            "{file} differs"
        );
    }
    assert!(
        !out.join("reference.json").exists(),
        "only tokenizer files are copied"
    );
}

/// Regression: model.safetensors was written 0600 (through a temporary file) while config.json
/// got 0644, so a released folder's weights were unreadable to other users.
#[cfg(unix)]
#[test]
fn the_saved_weights_get_the_same_file_mode_as_the_other_files() {
    use std::os::unix::fs::PermissionsExt;
    let source = fixtures_root().join("qwen2_bias_tied");
    let model = load(&source);
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("saved");
    model
        .save_with_tokenizer(&out, Some(&source))
        .expect("save");
    let mode = |file: &str| {
        std::fs::metadata(out.join(file))
            .unwrap_or_else(|e| panic!("{file}: {e}"))
            .permissions()
            .mode()
            & 0o777
    };
    // config.json is written by `std::fs::write`: 0666 less this process's umask. (Copied
    // tokenizer files keep their source's mode, so they are no reference.)
    assert_eq!(
        mode("model.safetensors"),
        mode("config.json"),
        "model.safetensors {:o}, config.json {:o}",
        mode("model.safetensors"),
        mode("config.json")
    );
}

#[test]
fn saving_over_an_existing_directory_replaces_it_and_leaves_no_temporaries() {
    stoke_ops::numerics::init_compute_threads();
    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("ckpt");
    let first = Transformer::init(tiny_config(TINY_LLAMA), &Device::Cpu, 1).expect("init");
    let second = Transformer::init(tiny_config(TINY_LLAMA), &Device::Cpu, 2).expect("init");
    first.save(&out).expect("first save");
    std::fs::write(out.join("stale.txt"), "old").expect("write");
    second.save(&out).expect("second save");
    assert_identical(&second, &load(&out), "replaced");
    assert!(
        !out.join("stale.txt").exists(),
        "the old directory must be replaced, not merged"
    );
    let leftovers: Vec<String> = std::fs::read_dir(tmp.path())
        .expect("list")
        .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
        .filter(|n| n != "ckpt")
        .collect();
    assert!(
        leftovers.is_empty(),
        "temporaries left behind: {leftovers:?}"
    );
}

/// `keep_layers` (depth pruning): a layer whose attention and MLP outputs are zero is the
/// identity on the residual stream, so dropping it leaves the logits unchanged bit for bit; the
/// kept layers carry their own weights, the copy saves and loads as a smaller model, and bad
/// layer lists are refused by reason.
#[test]
fn keep_layers_drops_layers_and_keeps_the_rest_exactly() {
    stoke_ops::numerics::init_compute_threads();
    let json = TINY_LLAMA.replace("\"num_hidden_layers\": 2", "\"num_hidden_layers\": 3");
    let model = Transformer::init(tiny_config(&json), &Device::Cpu, 7).expect("init");
    // Layer 1 made an identity: its two residual branches write zeros.
    let tensors = model
        .parameters()
        .into_iter()
        .map(|(name, var)| {
            let tensor = var.as_tensor().detach();
            let silent = name == "model.layers.1.self_attn.o_proj.weight"
                || name == "model.layers.1.mlp.down_proj.weight";
            let tensor = if silent {
                tensor.zeros_like().expect("zeros")
            } else {
                tensor
            };
            (name, tensor)
        })
        .collect();
    let model = Transformer::from_tensors(model.config().clone(), tensors).expect("model");
    let pruned = model.keep_layers(&[0, 2]).expect("keep layers 0 and 2");
    assert_eq!(pruned.config().num_hidden_layers, 2);
    assert_eq!(
        pruned.config().num_parameters(),
        pruned
            .parameters()
            .iter()
            .map(|(_, v)| v.elem_count())
            .sum::<usize>()
    );
    let weight = |m: &Transformer, name: &str| {
        m.parameters()
            .into_iter()
            .find(|(n, _)| n == name)
            .map(|(_, v)| v.as_tensor().clone())
            .unwrap_or_else(|| panic!("{name}"))
    };
    let q = "self_attn.q_proj.weight";
    assert_eq!(
        max_abs_diff(
            &weight(&pruned, &format!("model.layers.1.{q}")),
            &weight(&model, &format!("model.layers.2.{q}"))
        ),
        0.0,
        "the copy's layer 1 is the source's layer 2"
    );
    let ids = candle_core::Tensor::new(&[[3i64, 17, 5, 42, 8, 1, 60]], &Device::Cpu).expect("ids");
    let (full, kept) = (forward_full(&model, &ids), forward_full(&pruned, &ids));
    let bits = |t: &candle_core::Tensor| -> Vec<u32> {
        t.flatten_all()
            .and_then(|t| t.to_vec1::<f32>())
            .expect("logits")
            .iter()
            .map(|v| v.to_bits())
            .collect()
    };
    assert!(
        bits(&full) == bits(&kept),
        "dropping an identity layer changed the logits"
    );
    // A real layer dropped does change them (the check above can fail).
    let without_first = model.keep_layers(&[1, 2]).expect("keep layers 1 and 2");
    assert!(max_abs_diff(&full, &forward_full(&without_first, &ids)) > 0.0);

    let tmp = tempfile::tempdir().expect("tempdir");
    let out = tmp.path().join("pruned");
    pruned.save(&out).expect("save");
    let reloaded = load(&out);
    assert_identical(&pruned, &reloaded, "pruned");
    assert_eq!(reloaded.config().num_hidden_layers, 2);

    for (layers, expected) in [
        (&[][..], "no layer"),
        (&[0, 3][..], "layer 3 does not exist"),
        (&[2, 0][..], "strictly increasing"),
        (&[1, 1][..], "strictly increasing"),
    ] {
        let message = match model.keep_layers(layers) {
            Ok(_) => panic!("{layers:?} was accepted"),
            Err(e) => e.to_string(),
        };
        assert!(message.contains(expected), "{layers:?}: {message}");
    }
}
