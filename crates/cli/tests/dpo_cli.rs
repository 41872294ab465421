//! `stoke dpo CONFIG.toml` as the built binary, under the run rules every training command
//! shares: a run killed with SIGKILL at a random step and continued with `--resume` ends with
//! exactly the weights of an uninterrupted run, its metrics log holding each step once (with a
//! cached reference, and with a live reference that TR-DPO syncs, whose synced weights the
//! resume must find); a fresh start into a folder that holds checkpoints is refused and leaves
//! that run's `config.toml` as it was; every run writes `config.toml` and a TensorBoard file.
//!
//! The model is a tiny random Llama with a small BPE tokenizer (ChatML template) made in a temp
//! dir, trained on generated pairs.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;

const STEPS: usize = 16;

const CONFIG: &str = r#"
output_dir = "run-a"
[model]
pretrained = "model"
[data]
train = "pairs.jsonl"
max_len = 64
pairs_per_micro_batch = 2
micro_batches = 2
[dpo]
beta = 0.5
[optimizer]
lr = 3e-3
[schedule]
kind = "cosine"
warmup_steps = 2
[training]
steps = 16
seed = 5
batch_shards = 1
[checkpoint]
every = 2
keep = 2
"#;

fn stoke() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
}

fn pair_lines(count: usize) -> Vec<String> {
    (0..count)
        .map(|k| {
            let (a, b) = (k % 5, (k / 5) % 4);
            serde_json::json!({
                "prompt": [{"role": "user", "content": format!("add {a} {b}")}],
                "chosen": [{"role": "assistant", "content": format!("sum {}", a + b)}],
                "rejected": [{"role": "assistant", "content": format!("sum {}", a + b + 1)}],
            })
            .to_string()
        })
        .collect()
}

fn setup(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<String> = (0..40)
        .map(|i| format!("add {} {} sum {}", i % 5, i % 4, i % 5 + i % 4))
        .collect();
    common::tiny_chat_model(dir.path(), &texts);
    std::fs::write(
        dir.path().join("pairs.jsonl"),
        pair_lines(10).join("\n") + "\n",
    )
    .unwrap();
    std::fs::write(dir.path().join("dpo.toml"), config).unwrap();
    dir
}

fn dpo(dir: &Path, args: &[&str]) -> Output {
    stoke()
        .arg("dpo")
        .arg(dir.join("dpo.toml"))
        .args(args)
        .arg("--quiet")
        .current_dir("/")
        .output()
        .unwrap()
}

fn assert_success(output: &Output) {
    assert!(
        output.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

fn logged_steps(metrics: &Path) -> Vec<u64> {
    std::fs::read_to_string(metrics)
        .unwrap_or_default()
        .lines()
        .filter(|l| l.ends_with('}') && l.contains("\"kind\":\"step\""))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect()
}

/// splitmix64.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E3779B97F4A7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

/// Runs uninterrupted into `run-a`, then kills a second run into `run-b` at a random step
/// after its first checkpoint, resumes it, and checks the weights and the log.
fn kill_resume_matches_uninterrupted(config: &str, sets: &[&str]) {
    let dir = setup(config);
    let set_args: Vec<&str> = sets.iter().flat_map(|s| ["--set", *s]).collect();
    let uninterrupted = dpo(dir.path(), &set_args);
    assert_success(&uninterrupted);
    let reference = std::fs::read(dir.path().join("run-a/model/model.safetensors")).unwrap();
    // TR-DPO keeps only the synced references a kept checkpoint (or the run) resumes with.
    let synced = std::fs::read_dir(dir.path().join("run-a"))
        .unwrap()
        .filter(|e| {
            e.as_ref()
                .unwrap()
                .file_name()
                .to_string_lossy()
                .starts_with("reference-step-")
        })
        .count();
    assert!(
        synced <= 2,
        "{synced} synced references kept for 2 checkpoints"
    );
    let initial = std::fs::read(dir.path().join("model/model.safetensors")).unwrap();
    assert!(
        reference != initial,
        "the steps changed no weight: equal weights after a resume would prove nothing"
    );

    // A different kill point on every run: after step 3 (the checkpoint of step 2 exists) and
    // at least 6 steps before the end, so a slow machine still kills a running process.
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos() as u64);
    let kill_after = 3 + (mix(&mut seed) % (STEPS as u64 - 9)) as usize;
    let metrics = dir.path().join("run-b/metrics.jsonl");
    let mut child = stoke()
        .arg("dpo")
        .arg(dir.path().join("dpo.toml"))
        .args(["--set", "output_dir=\"run-b\"", "--quiet"])
        .args(&set_args)
        .current_dir("/")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while logged_steps(&metrics).len() < kill_after {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the kill after step {kill_after}"
        );
        assert!(Instant::now() < deadline, "no progress in metrics.jsonl");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let done_before_kill = logged_steps(&metrics).len();
    assert!(
        done_before_kill < STEPS,
        "killed after the run finished ({done_before_kill} steps)"
    );
    assert!(!dir.path().join("run-b/model/model.safetensors").exists());

    let mut args = vec!["--set", "output_dir=\"run-b\"", "--resume"];
    args.extend(&set_args);
    let resumed = dpo(dir.path(), &args);
    assert_success(&resumed);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(
        stdout.contains("resumed from"),
        "killed after step {done_before_kill}: {stdout}"
    );
    let weights = std::fs::read(dir.path().join("run-b/model/model.safetensors")).unwrap();
    assert!(
        weights == reference,
        "killed after step {done_before_kill} (aimed at {kill_after}): resumed weights differ \
         from the uninterrupted run"
    );
    assert_eq!(
        logged_steps(&metrics),
        (1..=STEPS as u64).collect::<Vec<_>>(),
        "killed after step {done_before_kill}: the resumed log holds each step once, in order"
    );
}

#[test]
fn killed_and_resumed_dpo_run_ends_with_the_uninterrupted_weights() {
    kill_resume_matches_uninterrupted(CONFIG, &[]);
}

#[test]
fn killed_and_resumed_tr_dpo_run_finds_its_synced_reference() {
    // TR-DPO: a live reference mixed toward the policy every 3 steps; a resume that restarted
    // from the starting reference would train on different targets.
    kill_resume_matches_uninterrupted(
        CONFIG,
        &["reference.mode=\"live\"", "reference.sync_steps=3"],
    );
}

#[test]
fn a_fresh_start_into_a_folder_with_checkpoints_is_refused_and_keeps_its_config() {
    let dir = setup(CONFIG);
    assert_success(&dpo(dir.path(), &[]));
    let run = dir.path().join("run-a");
    let config = std::fs::read_to_string(run.join("config.toml")).unwrap();
    assert!(
        config.contains("[dpo]"),
        "config.toml is the resolved config: {config}"
    );
    assert!(
        run.join("events.out.tfevents.stoke").is_file(),
        "no TensorBoard file beside metrics.jsonl"
    );
    let info: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(run.join("run.json")).unwrap()).unwrap();
    assert_eq!(info["command"], "dpo", "{info}");
    assert!(
        info["kernels"].as_object().is_some_and(|k| !k.is_empty()),
        "{info}"
    );

    let again = dpo(dir.path(), &["--set", "dpo.beta=0.25"]);
    assert!(!again.status.success(), "a fresh start mixed two runs");
    let stderr = String::from_utf8_lossy(&again.stderr);
    assert!(
        stderr.contains("already holds checkpoints") && stderr.contains("--resume"),
        "{stderr}"
    );
    assert_eq!(
        std::fs::read_to_string(run.join("config.toml")).unwrap(),
        config,
        "the refused run rewrote the first run's config.toml"
    );

    // A resume with a different loss is refused, naming the key.
    let changed = dpo(dir.path(), &["--set", "dpo.beta=0.25", "--resume"]);
    assert!(!changed.status.success(), "a resume changed the loss");
    let stderr = String::from_utf8_lossy(&changed.stderr);
    assert!(stderr.contains("dpo.beta"), "{stderr}");
}

#[test]
fn export_lineage_over_a_pipeline_folder_lists_its_dpo_stage() {
    // A speedrun-shaped folder: an SFT stage, then a DPO run one level deeper
    // (`preference/<loss>/`), as the speedrun lays them out.
    let dir = setup(CONFIG);
    let pipeline = dir.path().join("pipeline");
    let sft = pipeline.join("sft");
    std::fs::create_dir_all(&sft).unwrap();
    std::fs::write(
        sft.join("config.toml"),
        "title = \"sft\"\noutput_dir = \"sft\"\n[model]\npretrained = \"base\"\n[data]\n\
         kind = \"chat\"\ntrain = [\"chat.jsonl\"]\nseq_len = 64\nmicro_batch_size = 2\n\
         [training]\nsteps = 40\n",
    )
    .unwrap();
    std::thread::sleep(Duration::from_millis(20));
    let out = pipeline.join("preference/sigmoid");
    let set = format!("output_dir={}", toml_string(&out));
    assert_success(&dpo(
        dir.path(),
        &["--set", &set, "--set", "training.steps=2"],
    ));
    let release = dir.path().join("release");
    let export = stoke()
        .args(["export", "--model"])
        .arg(out.join("model"))
        .arg("--out")
        .arg(&release)
        .arg("--lineage")
        .arg(&pipeline)
        .output()
        .unwrap();
    assert_success(&export);
    let card = std::fs::read_to_string(release.join("README.md")).unwrap();
    let sft_row = card.find("| sft | supervised fine-tuning (chat)");
    let dpo_row = card.find("preference optimization (DPO, sigmoid)");
    assert!(
        sft_row.is_some() && dpo_row.is_some() && sft_row < dpo_row,
        "the lineage lists SFT then DPO:\n{card}"
    );
}

fn toml_string(path: &Path) -> String {
    toml::Value::String(path.display().to_string()).to_string()
}

#[test]
fn killed_and_resumed_reward_model_run_ends_with_the_uninterrupted_weights() {
    kill_resume_matches_uninterrupted(CONFIG, &["objective.kind=\"reward_model\""]);
}

/// Pairs whose chosen answer ends in `good` and rejected in `bad`, after prompts `add a b` with
/// `a` in `range`: the preference is lexical, so a reward model can learn it from a few pairs.
fn reward_lines(range: std::ops::Range<usize>, good: &str, bad: &str) -> Vec<String> {
    range
        .flat_map(|a| (0..4).map(move |b| (a, b)))
        .map(|(a, b)| {
            serde_json::json!({
                "prompt": [{"role": "user", "content": format!("add {a} {b}")}],
                "chosen": [{"role": "assistant", "content": format!("sum {} {good}", a + b)}],
                "rejected": [{"role": "assistant", "content": format!("sum {} {bad}", a + b)}],
            })
            .to_string()
        })
        .collect()
}

#[test]
fn stoke_rm_trains_a_reward_model_that_ranks_held_out_pairs() {
    let config = r#"
output_dir = "rm"
[model]
path = "model"
[data]
train = "train.jsonl"
eval = "eval.jsonl"
max_len = 64
pairs_per_micro_batch = 4
[reward_model]
center_rewards_coefficient = 0.01
[optimizer]
lr = 3e-3
[training]
steps = 24
seed = 3
"#;
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<String> = (0..40)
        .map(|i| format!("add {} {} sum {} ok no", i % 7, i % 4, i % 7 + i % 4))
        .collect();
    common::tiny_chat_model(dir.path(), &texts);
    std::fs::write(dir.path().join("rm.toml"), config).unwrap();
    // The same start learns either preference: held-out accuracy well above chance both ways
    // (an untrained score head ranks "ok" against "no" the same way in every pair, so it cannot
    // pass both).
    for (good, bad) in [("ok", "no"), ("no", "ok")] {
        let lines = |range| reward_lines(range, good, bad).join("\n");
        std::fs::write(dir.path().join("train.jsonl"), lines(0..5)).unwrap();
        std::fs::write(dir.path().join("eval.jsonl"), lines(5..8)).unwrap();
        let _ = std::fs::remove_dir_all(dir.path().join("rm"));
        let output = stoke()
            .arg("rm")
            .arg(dir.path().join("rm.toml"))
            .arg("--quiet")
            .output()
            .unwrap();
        assert_success(&output);
        let stdout = String::from_utf8_lossy(&output.stdout);
        assert!(stdout.contains("held-out (12 pairs)"), "{stdout}");
        let eval: serde_json::Value = serde_json::from_str(
            &std::fs::read_to_string(dir.path().join("rm/eval.json")).unwrap(),
        )
        .unwrap();
        let accuracy = eval["metrics"]["accuracy"].as_f64().unwrap();
        assert!(
            accuracy >= 0.9,
            "{good} over {bad}: held-out accuracy {accuracy}: {eval}"
        );
        assert!(eval["metrics"]["margin"].as_f64().unwrap() > 0.0, "{eval}");
    }
    // Every step logged TRL's figures; the saved model is a sequence classifier.
    let metrics = std::fs::read_to_string(dir.path().join("rm/metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = metrics
        .lines()
        .filter(|l| l.contains("\"kind\":\"step\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(steps.len(), 24);
    for key in ["accuracy", "margin", "mean_reward", "std_reward"] {
        assert!(
            steps[23].to_string().contains(key),
            "no {key} in {}",
            steps[23]
        );
    }
    let report = std::fs::read_to_string(dir.path().join("rm/report.html")).unwrap();
    assert!(
        report.contains("reward-model scores"),
        "no score chart in the report"
    );
    let config: serde_json::Value = serde_json::from_str(
        &std::fs::read_to_string(dir.path().join("rm/model/config.json")).unwrap(),
    )
    .unwrap();
    assert_eq!(
        config["architectures"],
        serde_json::json!(["LlamaForSequenceClassification"])
    );

    // stoke rm refuses a config that names another objective.
    std::fs::write(
        dir.path().join("dpo.toml"),
        "output_dir = \"rm2\"\n[objective]\nkind = \"dpo\"\n[model]\npath = \"model\"\n\
         [data]\ntrain = \"train.jsonl\"\n[training]\nsteps = 1\n",
    )
    .unwrap();
    let refused = stoke()
        .arg("rm")
        .arg(dir.path().join("dpo.toml"))
        .output()
        .unwrap();
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(stderr.contains("objective.kind = \"dpo\""), "{stderr}");
}
