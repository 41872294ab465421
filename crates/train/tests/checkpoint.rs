//! Checkpoint store: round trip (weights, state, optimizer that then steps identically),
//! detection of missing / truncated / corrupted files and of a missing manifest, temporary
//! directories, rotation, fallback past a corrupted newest checkpoint, and a writer killed
//! mid-save never leaving a `step-*` directory that fails verification.

use candle_core::{Device, Tensor};
use std::path::{Path, PathBuf};
use stoke_model::{ModelConfig, Transformer};
use stoke_optim::{Optimizer, OptimizerConfig};
use stoke_train::checkpoint::{
    CheckpointError, CheckpointStore, FileProblem, MANIFEST_FILE, OPTIMIZER_FILE, TrainerState,
    load_checkpoint, read_manifest, read_trainer_state, verify,
};

/// A tiny untied Llama (hidden 32, 2 layers, vocab 300) that ships a tokenizer.
fn fixture_dir() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/llama_gqa_rope_llama3")
}

fn tiny_model(seed: u64) -> Transformer {
    let config = ModelConfig::from_file(&fixture_dir().join("config.json")).unwrap();
    Transformer::init(config, &Device::Cpu, seed).unwrap()
}

/// Deterministic pseudo-random gradients shaped like `params` (differ per step and parameter).
fn gradients(params: &[(String, candle_core::Var)], step: u64) -> Vec<Tensor> {
    params
        .iter()
        .enumerate()
        .map(|(index, (_, var))| {
            let shape = var.as_tensor().dims().to_vec();
            let count: usize = shape.iter().product();
            let mut state = (step + 1)
                .wrapping_mul(0x9E37_79B9_7F4A_7C15)
                .wrapping_add((index as u64).wrapping_mul(0xBF58_476D_1CE4_E5B9));
            let values: Vec<f32> = (0..count)
                .map(|_| {
                    state = state
                        .wrapping_mul(6_364_136_223_846_793_005)
                        .wrapping_add(1_442_695_040_888_963_407);
                    ((state >> 40) as f32 / (1u64 << 24) as f32) - 0.5
                })
                .collect();
            Tensor::from_vec(values, shape, &Device::Cpu).unwrap()
        })
        .collect()
}

fn optimizer_for(model: &Transformer) -> Optimizer {
    Optimizer::new(OptimizerConfig::default(), model.parameters()).unwrap()
}

fn state(step: u64) -> TrainerState {
    TrainerState {
        step,
        tokens_seen: step * 4096,
        source: serde_json::json!({"shard": 3, "offset": step * 17}),
        engine: None,
        extra: serde_json::json!({"rng": [1, 2, 3], "loss_ema": 2.5}),
    }
}

const CONFIG_TOML: &str = "[model]\npreset = \"tiny\"\n[optim]\nlr = 0.01\n";

/// Saves a checkpoint of `step` with a model and an optimizer that has taken two steps.
fn save_step(store: &CheckpointStore, step: u64, keep_steps: &[u64]) -> PathBuf {
    let model = tiny_model(step);
    let mut optimizer = optimizer_for(&model);
    for s in 0..2 {
        optimizer
            .step(&gradients(optimizer.params(), s), 1.0)
            .unwrap();
    }
    store
        .save(
            &model,
            None,
            &optimizer,
            &state(step),
            CONFIG_TOML,
            keep_steps,
        )
        .unwrap()
}

fn weight_bits(model: &Transformer) -> Vec<(String, Vec<u32>)> {
    model
        .parameters()
        .into_iter()
        .map(|(name, var)| {
            let values: Vec<f32> = var.as_tensor().flatten_all().unwrap().to_vec1().unwrap();
            (name, values.iter().map(|v| v.to_bits()).collect())
        })
        .collect()
}

fn only_problem(error: CheckpointError) -> FileProblem {
    match error {
        CheckpointError::Corrupt { mut problems, .. } if problems.len() == 1 => problems.remove(0),
        other => panic!("expected exactly one file problem, got: {other}"),
    }
}

fn saved_steps(store: &CheckpointStore) -> Vec<u64> {
    store.list().unwrap().into_iter().map(|(s, _)| s).collect()
}

#[test]
fn round_trip_restores_weights_state_and_an_optimizer_that_steps_identically() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(&tmp.path().join("checkpoints"), 3);
    let model = tiny_model(7);
    let mut optimizer = optimizer_for(&model);
    for s in 0..3 {
        optimizer
            .step(&gradients(optimizer.params(), s), 0.5)
            .unwrap();
    }
    let saved_state = state(3);
    let path = store
        .save(&model, None, &optimizer, &saved_state, CONFIG_TOML, &[])
        .unwrap();
    assert_eq!(path, tmp.path().join("checkpoints/step-00000003"));

    let loaded = load_checkpoint(&path, &Device::Cpu).unwrap();
    assert_eq!(weight_bits(&loaded.model), weight_bits(&model));
    assert_eq!(loaded.state, saved_state);
    assert_eq!(loaded.config_toml, CONFIG_TOML);
    assert_eq!(loaded.optimizer_state, path.join(OPTIMIZER_FILE));

    let mut restored = optimizer_for(&loaded.model);
    restored.load_state(&loaded.optimizer_state).unwrap();
    assert_eq!(restored.steps_taken(), optimizer.steps_taken());
    for s in 3..5 {
        optimizer
            .step(&gradients(optimizer.params(), s), 1.0)
            .unwrap();
        restored
            .step(&gradients(restored.params(), s), 1.0)
            .unwrap();
    }
    assert_eq!(weight_bits(&loaded.model), weight_bits(&model));
}

#[test]
fn manifest_lists_every_file_including_copied_tokenizer_files() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let model = tiny_model(1);
    let optimizer = optimizer_for(&model);
    let path = store
        .save(&model, Some(&fixture_dir()), &optimizer, &state(1), "", &[])
        .unwrap();
    let manifest = read_manifest(&path).unwrap();
    let listed: Vec<&str> = manifest.entries.iter().map(|e| e.path.as_str()).collect();
    for required in [
        "config.toml",
        "model/config.json",
        "model/generation_config.json",
        "model/model.safetensors",
        "model/tokenizer.json",
        "model/tokenizer_config.json",
        "optimizer.safetensors",
        "trainer_state.json",
    ] {
        assert!(listed.contains(&required), "{required} not in {listed:?}");
    }
    assert!(!listed.contains(&MANIFEST_FILE));
    assert_eq!(manifest.step, 1);
    let bytes = std::fs::metadata(path.join("model/model.safetensors"))
        .unwrap()
        .len();
    let entry = manifest
        .entries
        .iter()
        .find(|e| e.path == "model/model.safetensors")
        .unwrap();
    assert_eq!(entry.bytes, bytes);
}

#[test]
fn truncated_file_is_reported_as_truncated_naming_it() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let path = save_step(&store, 5, &[]);
    let weights = path.join("model/model.safetensors");
    let length = std::fs::metadata(&weights).unwrap().len();
    let file = std::fs::OpenOptions::new()
        .write(true)
        .open(&weights)
        .unwrap();
    file.set_len(length / 2).unwrap();

    let error = load_checkpoint(&path, &Device::Cpu).err().unwrap();
    let message = error.to_string();
    assert!(message.contains("model/model.safetensors"), "{message}");
    assert!(message.contains("truncated"), "{message}");
    assert_eq!(
        only_problem(error),
        FileProblem::Truncated {
            path: weights,
            expected_bytes: length,
            found_bytes: length / 2
        }
    );
}

#[test]
fn flipped_byte_is_reported_as_hash_mismatch_naming_the_file() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let path = save_step(&store, 5, &[]);
    let optimizer_state = path.join(OPTIMIZER_FILE);
    let mut bytes = std::fs::read(&optimizer_state).unwrap();
    let middle = bytes.len() / 2;
    bytes[middle] ^= 0x01;
    std::fs::write(&optimizer_state, &bytes).unwrap();

    let error = verify(&path).err().unwrap();
    let message = error.to_string();
    assert!(message.contains(OPTIMIZER_FILE), "{message}");
    assert!(message.contains("hash mismatch"), "{message}");
    match only_problem(error) {
        FileProblem::HashMismatch { path: named, .. } => assert_eq!(named, optimizer_state),
        other => panic!("expected a hash mismatch, got {other}"),
    }
}

#[test]
fn deleted_file_is_reported_missing_and_every_broken_file_is_listed() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let path = save_step(&store, 5, &[]);
    std::fs::remove_file(path.join("trainer_state.json")).unwrap();
    std::fs::write(path.join("config.toml"), "[model]\npreset = \"huge\"\n").unwrap();

    let error = load_checkpoint(&path, &Device::Cpu).err().unwrap();
    let CheckpointError::Corrupt { problems, .. } = error else {
        panic!("expected Corrupt, got {error}");
    };
    assert_eq!(problems.len(), 2, "{problems:?}");
    assert!(problems.contains(&FileProblem::Missing {
        path: path.join("trainer_state.json")
    }));
    assert!(
        problems
            .iter()
            .any(|p| p.path() == &path.join("config.toml")),
        "{problems:?}"
    );
}

#[test]
fn missing_manifest_is_a_clear_error() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let path = save_step(&store, 5, &[]);
    std::fs::remove_file(path.join(MANIFEST_FILE)).unwrap();

    let error = load_checkpoint(&path, &Device::Cpu).err().unwrap();
    assert!(
        matches!(&error, CheckpointError::ManifestMissing { checkpoint } if checkpoint == &path),
        "{error}"
    );
    assert!(
        error.to_string().contains("manifest.json is missing"),
        "{error}"
    );
}

#[test]
fn manifest_escaping_the_checkpoint_is_rejected_naming_the_field() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let path = save_step(&store, 5, &[]);
    let manifest_path = path.join(MANIFEST_FILE);
    let text = std::fs::read_to_string(&manifest_path).unwrap();
    let edited = text.replacen("\"config.toml\"", "\"../config.toml\"", 1);
    assert_ne!(edited, text);
    std::fs::write(&manifest_path, edited).unwrap();

    match verify(&path).err().unwrap() {
        CheckpointError::ManifestMalformed { field, .. } => assert_eq!(field, "files[0].path"),
        other => panic!("expected ManifestMalformed, got {other}"),
    }
}

#[test]
fn trainer_state_rejects_unknown_fields_naming_them() {
    let tmp = tempfile::tempdir().unwrap();
    let path = tmp.path().join("trainer_state.json");
    std::fs::write(
        &path,
        r#"{"step": 1, "tokens_seen": 2, "source": null, "extra": null, "stpe": 3}"#,
    )
    .unwrap();
    let error = read_trainer_state(&path).err().unwrap();
    assert!(error.to_string().contains("stpe"), "{error}");
}

#[test]
fn orphan_temp_dir_is_ignored_by_latest_and_removed_by_the_next_save() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let saved = save_step(&store, 2, &[]);
    // A complete-looking copy under a temporary name, as a writer killed just before its rename
    // would leave (and with a higher step).
    let orphan = tmp.path().join(".tmp-step-00000009-4194999");
    copy_tree(&saved, &orphan);
    assert!(verify(&orphan).is_ok());

    assert_eq!(store.latest().unwrap(), Some(saved.clone()));
    save_step(&store, 3, &[]);
    assert!(!orphan.exists());
    assert_eq!(saved_steps(&store), vec![2, 3]);
}

#[test]
fn failed_save_leaves_neither_a_checkpoint_nor_a_temp_dir() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let model = tiny_model(1);
    let optimizer = optimizer_for(&model);
    let missing_tokenizer = tmp.path().join("no-such-tokenizer");
    let result = store.save(
        &model,
        Some(&missing_tokenizer),
        &optimizer,
        &state(4),
        "",
        &[],
    );
    assert!(result.is_err());
    let left: Vec<String> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "{left:?}");
}

#[test]
fn rotation_keeps_the_newest_and_the_pinned_steps() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 2);
    for step in [10, 20, 30, 40, 50] {
        save_step(&store, step, &[20]);
    }
    assert_eq!(saved_steps(&store), vec![20, 40, 50]);
    let leftovers = std::fs::read_dir(tmp.path())
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with('.')
        })
        .count();
    assert_eq!(leftovers, 0);
}

#[test]
fn rotation_does_not_count_checkpoints_newer_than_the_one_saved() {
    // A run resumed from step 20 because step 30 was corrupt: saving step 25 must not delete
    // step 20, the newest good checkpoint before it, in favour of the corrupt step 30.
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 2);
    for step in [10, 20, 30] {
        save_step(&store, step, &[]);
    }
    std::fs::remove_file(store.step_path(30).join(OPTIMIZER_FILE)).unwrap();
    assert_eq!(store.latest().unwrap(), Some(store.step_path(20)));
    save_step(&store, 25, &[]);
    assert_eq!(saved_steps(&store), vec![20, 25, 30]);
    save_step(&store, 30, &[]);
    assert_eq!(saved_steps(&store), vec![25, 30]);
    assert!(verify(&store.step_path(30)).is_ok());
}

#[test]
fn resaving_a_step_replaces_it() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    let model = tiny_model(1);
    let optimizer = optimizer_for(&model);
    let first = store
        .save(&model, None, &optimizer, &state(8), "first", &[])
        .unwrap();
    let second = store
        .save(&model, None, &optimizer, &state(8), "second", &[])
        .unwrap();
    assert_eq!(first, second);
    let loaded = load_checkpoint(&second, &Device::Cpu).unwrap();
    assert_eq!(loaded.config_toml, "second");
    assert_eq!(saved_steps(&store), vec![8]);
}

#[test]
fn latest_falls_back_past_a_corrupted_newest_checkpoint() {
    let tmp = tempfile::tempdir().unwrap();
    let store = CheckpointStore::new(tmp.path(), 0);
    assert_eq!(store.latest().unwrap(), None);
    save_step(&store, 1, &[]);
    let second = save_step(&store, 2, &[]);
    let third = save_step(&store, 3, &[]);
    let weights = third.join("model/model.safetensors");
    let mut bytes = std::fs::read(&weights).unwrap();
    let last = bytes.len() - 1;
    bytes[last] ^= 0x80;
    std::fs::write(&weights, &bytes).unwrap();

    let found = store.find_latest().unwrap();
    assert_eq!(found.path, Some(second.clone()));
    assert_eq!(found.skipped.len(), 1);
    assert_eq!(found.skipped[0].path, third);
    assert!(matches!(
        found.skipped[0].error,
        CheckpointError::Corrupt { .. }
    ));
    assert_eq!(store.latest().unwrap(), Some(second));
}

/// Environment variable that turns `killed_writer_child` into a save loop in this directory.
const CHILD_DIR_ENV: &str = "STOKE_CHECKPOINT_TEST_CHILD_DIR";

/// Not a test on its own: when the parent test sets CHILD_DIR_ENV, saves checkpoints in a loop
/// until killed. Without the variable it returns at once.
#[test]
fn killed_writer_child() {
    let Ok(dir) = std::env::var(CHILD_DIR_ENV) else {
        return;
    };
    let store = CheckpointStore::new(Path::new(&dir), 3);
    let start = store.list().unwrap().last().map_or(0, |(s, _)| s + 1);
    for step in start.. {
        save_step(&store, step, &[]);
    }
}

#[test]
fn a_writer_killed_mid_save_never_leaves_a_step_dir_that_fails_verification() {
    let tmp = tempfile::tempdir().unwrap();
    let exe = std::env::current_exe().unwrap();
    let store = CheckpointStore::new(tmp.path(), 3);
    // Each round waits until the child has completed a save, then kills it a few milliseconds
    // later, so the kills land in different phases of the next save (writing, hashing,
    // renaming, rotating).
    let mut rounds_interrupting_a_save = 0u32;
    for round in 0..12u64 {
        let newest_before = store.list().unwrap().last().map(|(s, _)| *s);
        let mut child = std::process::Command::new(&exe)
            .args(["--exact", "killed_writer_child", "--test-threads", "1"])
            .env(CHILD_DIR_ENV, tmp.path())
            .stdout(std::process::Stdio::null())
            .stderr(std::process::Stdio::null())
            .spawn()
            .unwrap();
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        while store.list().unwrap().last().map(|(s, _)| *s) == newest_before {
            assert!(
                std::time::Instant::now() < deadline,
                "child made no checkpoint"
            );
            std::thread::sleep(std::time::Duration::from_millis(1));
        }
        std::thread::sleep(std::time::Duration::from_millis(round % 6 * 3));
        child.kill().unwrap();
        child.wait().unwrap();
        let interrupted = std::fs::read_dir(tmp.path()).unwrap().any(|e| {
            e.unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with(".tmp-")
        });
        rounds_interrupting_a_save += u32::from(interrupted);
        for (_, path) in store.list().unwrap() {
            if let Err(error) = verify(&path) {
                panic!("after kill {round}: {error}");
            }
        }
    }
    // About half the kills land inside a save; twelve misses in a row would mean the test
    // exercised nothing.
    assert!(rounds_interrupting_a_save > 0, "no kill interrupted a save");
    let latest = store.find_latest().unwrap();
    assert!(latest.skipped.is_empty());
    let path = latest.path.unwrap();
    load_checkpoint(&path, &Device::Cpu).unwrap();
}

fn copy_tree(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for entry in std::fs::read_dir(from).unwrap() {
        let entry = entry.unwrap();
        let target = to.join(entry.file_name());
        if entry.file_type().unwrap().is_dir() {
            copy_tree(&entry.path(), &target);
        } else {
            std::fs::copy(entry.path(), target).unwrap();
        }
    }
}
