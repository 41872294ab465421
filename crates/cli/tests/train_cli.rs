//! `stoke train CONFIG.toml`: a run killed with SIGKILL at a random step and resumed with
//! `--resume` ends with exactly the weights of an uninterrupted run; config errors name the key;
//! `--set` overrides reach the run.

use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use stoke_data::shard::{ShardWriter, ShardWriterConfig};

fn stoke() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
}

const STEPS: u64 = 40;

const CONFIG: &str = r#"
title = "resume test"
output_dir = "run"
[model]
preset = "nano"
vocab_size = 300
[data]
kind = "shards"
train = ["shards/train"]
eval = ["shards/eval"]
seq_len = 32
micro_batch_size = 4
grad_accum_steps = 2
[optimizer]
kind = "adamw"
[schedule]
kind = "wsd"
warmup_steps = 4
[training]
steps = 40
seed = 5
[checkpoint]
every = 4
keep = 2
[eval]
every = 10
batches = 2
"#;

/// splitmix64, for reproducible documents.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E3779B97F4A7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

/// Documents of a learnable pattern (counting with a random start and stride) in shards.
fn write_shards(dir: &Path, docs: usize, seed: u64) {
    let mut writer = ShardWriter::new(ShardWriterConfig {
        dir: dir.to_path_buf(),
        prefix: "part".into(),
        vocab_size: 300,
        max_tokens_per_shard: 4000,
    })
    .unwrap();
    let mut state = seed;
    for _ in 0..docs {
        let len = 5 + (mix(&mut state) % 40) as u32;
        let start = (mix(&mut state) % 300) as u32;
        let stride = 1 + (mix(&mut state) % 3) as u32;
        let doc: Vec<u32> = (0..len).map(|i| (start + i * stride) % 300).collect();
        writer.push_document(&doc).unwrap();
    }
    writer.finish().unwrap();
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    write_shards(&dir.path().join("shards/train"), 600, 1);
    write_shards(&dir.path().join("shards/eval"), 60, 2);
    std::fs::write(dir.path().join("train.toml"), CONFIG).unwrap();
    dir
}

fn train(dir: &Path, args: &[&str]) -> std::process::Output {
    stoke()
        .arg("train")
        .arg(dir.join("train.toml"))
        .args(args)
        .arg("--quiet")
        .current_dir("/")
        .output()
        .unwrap()
}

fn assert_success(output: &std::process::Output) {
    assert!(
        output.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn step_records(metrics: &Path) -> usize {
    std::fs::read_to_string(metrics)
        .map(|text| {
            text.lines()
                .filter(|l| l.contains("\"kind\":\"step\""))
                .count()
        })
        .unwrap_or(0)
}

#[test]
fn killed_and_resumed_run_ends_with_the_uninterrupted_weights() {
    let dir = setup();
    let uninterrupted = train(dir.path(), &["--set", "output_dir=\"run-a\""]);
    assert_success(&uninterrupted);
    let reference = std::fs::read(dir.path().join("run-a/model/model.safetensors")).unwrap();

    // Kill at a step chosen by a fixed seed, after the first checkpoint and before the end.
    let mut seed = 0x5EED;
    let kill_after = 6 + (mix(&mut seed) % (STEPS - 12)) as usize;
    let metrics = dir.path().join("run-b/metrics.jsonl");
    let mut child = stoke()
        .arg("train")
        .arg(dir.path().join("train.toml"))
        .args(["--set", "output_dir=\"run-b\"", "--quiet"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while step_records(&metrics) < kill_after {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the kill at step {kill_after}"
        );
        assert!(Instant::now() < deadline, "no progress in metrics.jsonl");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let done_before_kill = step_records(&metrics);
    assert!(
        done_before_kill < STEPS as usize,
        "killed after the run finished ({done_before_kill} steps)"
    );
    assert!(!dir.path().join("run-b/model/model.safetensors").exists());

    let resumed = train(dir.path(), &["--set", "output_dir=\"run-b\"", "--resume"]);
    assert_success(&resumed);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(
        stdout.contains("resumed from"),
        "killed at step {done_before_kill}: {stdout}"
    );
    let weights = std::fs::read(dir.path().join("run-b/model/model.safetensors")).unwrap();
    assert!(
        weights == reference,
        "killed after step {done_before_kill}: resumed weights differ from the uninterrupted run"
    );
    assert_eq!(
        step_records(&metrics),
        STEPS as usize,
        "the resumed log holds each step once"
    );
}

#[test]
fn an_unknown_config_key_is_named_in_the_error() {
    let dir = setup();
    let text = CONFIG.replace("seed = 5", "seed = 5\nstepz = 3");
    std::fs::write(dir.path().join("train.toml"), text).unwrap();
    let output = train(dir.path(), &[]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("stepz"), "{stderr}");
    assert!(stderr.contains("training"), "{stderr}");
}

#[test]
fn an_unknown_override_key_is_named_in_the_error() {
    let dir = setup();
    let output = train(dir.path(), &["--set", "optimizer.learning_rate=0.1"]);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("learning_rate"), "{stderr}");
}

#[test]
fn set_overrides_reach_the_run_and_its_saved_config() {
    let dir = setup();
    let output = train(
        dir.path(),
        &[
            "--set",
            "training.steps=3",
            "--set",
            "optimizer.lr=0.002",
            "--set",
            "output_dir=run-set",
        ],
    );
    assert_success(&output);
    let run = dir.path().join("run-set");
    assert_eq!(step_records(&run.join("metrics.jsonl")), 3);
    let saved: toml::Table =
        toml::from_str(&std::fs::read_to_string(run.join("config.toml")).unwrap()).unwrap();
    assert_eq!(saved["training"]["steps"].as_integer(), Some(3));
    assert_eq!(saved["optimizer"]["lr"].as_float(), Some(0.002));
    assert!(run.join("model/config.json").exists());
    assert!(run.join("checkpoints/step-00000003/manifest.json").exists());
}
