//! `stoke grpo CONFIG.toml` as the built binary: a synchronous run killed with SIGKILL at a
//! random update after its first checkpoint and continued with `--resume` ends with exactly the
//! weights of an uninterrupted run, its metrics log holding each update once; an asynchronous
//! run killed the same way resumes and completes every update once; a config with an unknown key
//! fails with an error naming the key. `stoke env --demonstrations` writes the scripted
//! expert's conversations, played through the environment, as SFT lines.
//!
//! The model is a tiny random Llama with a small BPE tokenizer (ChatML template) made in a temp
//! dir, trained on the built-in arithmetic task with the default `exact_match` reward.

use std::path::Path;
use std::process::{Command, Output, Stdio};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

mod common;

fn stoke() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
}

const STEPS: usize = 16;

const CONFIG: &str = r#"
[model]
path = "model"
[tasks]
kind = "arithmetic"
problems = 8
seed = 3
[grpo]
steps = 16
prompts_per_step = 2
group_size = 4
max_new_tokens = 6
mode = "sync"
threads = 1
reward_workers = 1
seed = 7
[rewards.default]
kind = "instructions"
constraints = [
    { type = "word_count", relation = "at_most", value = 3 },
    { type = "keywords_required", keywords = ["is"] },
    { type = "ends_with", text = "?" },
]
[optimizer]
kind = "adamw"
lr = 1e-3
[eval]
problems = 2
samples = 2
[checkpoint]
every = 2
keep = 2
[out]
dir = "run-a"
"#;

/// `dir/model`: a tiny random Llama with a 300-token BPE and a ChatML template.
fn model_folder(dir: &Path) {
    let texts: Vec<String> = (0..40)
        .map(|i| {
            format!(
                "What is {i} + {}? {i} + {} = {} #### {}",
                i + 2,
                i + 2,
                2 * i + 2,
                2 * i + 2
            )
        })
        .collect();
    common::tiny_chat_model(dir, &texts);
}

fn setup(config: &str) -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    model_folder(dir.path());
    std::fs::write(dir.path().join("grpo.toml"), config).unwrap();
    dir
}

fn grpo(dir: &Path, args: &[&str]) -> Output {
    stoke()
        .arg("grpo")
        .arg(dir.join("grpo.toml"))
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

/// Update records in a metrics log (0 while it does not exist).
fn step_records(metrics: &Path) -> usize {
    std::fs::read_to_string(metrics)
        .map(|text| {
            text.lines()
                .filter(|l| l.contains("\"kind\":\"step\""))
                .count()
        })
        .unwrap_or(0)
}

/// splitmix64.
fn mix(state: &mut u64) -> u64 {
    *state = state.wrapping_add(0x9E3779B97F4A7C15);
    let mut z = *state;
    z = (z ^ (z >> 30)).wrapping_mul(0xBF58476D1CE4E5B9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94D049BB133111EB);
    z ^ (z >> 31)
}

/// Starts `stoke grpo` with its output in `out` (and `sets`), SIGKILLs it once `metrics.jsonl`
/// holds a randomly chosen number of updates, and checks that it died mid-run. Returns the
/// chosen and the actual number of updates logged before the kill.
fn start_and_kill(dir: &Path, out: &str, sets: &[&str]) -> (usize, usize) {
    // A different kill point on every run (the update is in every message): after update 3, so
    // the checkpoint of update 2 exists, and at least 6 updates (about 0.1 s) before the end, so
    // a loaded machine that is slow to notice the record still kills a running process.
    let mut seed = SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |t| t.as_nanos() as u64);
    let kill_after = 3 + (mix(&mut seed) % (STEPS as u64 - 9)) as usize;
    let metrics = dir.join(out).join("metrics.jsonl");
    let out_set = format!("out.dir=\"{out}\"");
    let mut child = stoke()
        .arg("grpo")
        .arg(dir.join("grpo.toml"))
        .args(["--set", &out_set, "--quiet"])
        .args(sets.iter().flat_map(|set| ["--set", set]))
        .current_dir("/")
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let deadline = Instant::now() + Duration::from_secs(120);
    while step_records(&metrics) < kill_after {
        assert!(
            child.try_wait().unwrap().is_none(),
            "the run ended before the kill after update {kill_after}"
        );
        assert!(Instant::now() < deadline, "no progress in metrics.jsonl");
        std::thread::sleep(Duration::from_millis(2));
    }
    child.kill().unwrap(); // SIGKILL
    child.wait().unwrap();
    let done_before_kill = step_records(&metrics);
    assert!(
        done_before_kill < STEPS,
        "killed after the run finished ({done_before_kill} updates)"
    );
    assert!(!dir.join(out).join("model/model.safetensors").exists());
    (kill_after, done_before_kill)
}

#[test]
fn killed_and_resumed_grpo_run_ends_with_the_uninterrupted_weights() {
    let dir = setup(CONFIG);
    let uninterrupted = grpo(dir.path(), &[]);
    assert_success(&uninterrupted);
    let reference = std::fs::read(dir.path().join("run-a/model/model.safetensors")).unwrap();
    let initial = std::fs::read(dir.path().join("model/model.safetensors")).unwrap();
    assert!(
        reference != initial,
        "the updates changed no weight: equal weights after a resume would prove nothing"
    );

    let (kill_after, done_before_kill) = start_and_kill(dir.path(), "run-b", &[]);
    let metrics = dir.path().join("run-b/metrics.jsonl");

    let resumed = grpo(dir.path(), &["--set", "out.dir=\"run-b\"", "--resume"]);
    assert_success(&resumed);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    eprintln!(
        "killed after update {done_before_kill} (aimed at {kill_after}); resume said: {stdout}"
    );
    assert!(
        stdout.contains("resumed from step"),
        "killed after update {done_before_kill}: {stdout}"
    );
    let weights = std::fs::read(dir.path().join("run-b/model/model.safetensors")).unwrap();
    assert!(
        weights == reference,
        "killed after update {done_before_kill}: resumed weights differ from the uninterrupted run"
    );
    assert_eq!(
        step_records(&metrics),
        STEPS,
        "killed after update {done_before_kill}: the resumed log holds each update once"
    );
}

#[test]
fn a_killed_async_run_resumes_and_completes_every_update_once() {
    // Asynchronous runs do not resume bit-exactly (the first batches after the resume are
    // generated by the restored, newer weights; see `stoke_pipeline::run`), but they must resume
    // from the checkpoint and finish the remaining updates, logging each once.
    let dir = setup(CONFIG);
    let sets = ["grpo.mode=\"async\"", "grpo.max_off_policy_steps=1"];
    let (_, done_before_kill) = start_and_kill(dir.path(), "run-async", &sets);
    let mut args = vec!["--set", "out.dir=\"run-async\"", "--resume"];
    args.extend(sets.iter().flat_map(|set| ["--set", *set]));
    let resumed = grpo(dir.path(), &args);
    assert_success(&resumed);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(
        stdout.contains("resumed from step"),
        "killed after update {done_before_kill}: {stdout}"
    );
    let out = dir.path().join("run-async");
    assert_eq!(step_records(&out.join("metrics.jsonl")), STEPS);
    assert!(out.join("model/model.safetensors").is_file());
    let logged: Vec<u64> = std::fs::read_to_string(out.join("metrics.jsonl"))
        .unwrap()
        .lines()
        .filter(|l| l.contains("\"kind\":\"step\""))
        .map(|l| {
            serde_json::from_str::<serde_json::Value>(l).unwrap()["step"]
                .as_u64()
                .unwrap()
        })
        .collect();
    assert_eq!(logged, (1..=STEPS as u64).collect::<Vec<_>>());
}

#[test]
fn an_unknown_grpo_config_key_fails_naming_the_key() {
    let dir = setup(&CONFIG.replace("seed = 7", "seed = 7\nstepz = 3"));
    let output = grpo(dir.path(), &[]);
    assert!(!output.status.success(), "a config with a typo ran");
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("grpo.stepz"), "{stderr}");
    assert!(
        !dir.path().join("run-a").exists(),
        "a bad config started a run"
    );
}

#[test]
fn a_killed_multi_turn_async_run_resumes_and_trains_every_episode_once() {
    // Guess-the-number episodes are multi-turn for any model (a wrong or missing guess gets a
    // reply), so the killed run is mid-way through multi-turn updates.
    let config = CONFIG.replace(
        "[optimizer]",
        "[environment]\nkind = \"guess_number\"\nmax_turns = 3\nmax_turn_tokens = 6\nmax_total_tokens = 120\ntruncated_turns = \"close\"\n[optimizer]",
    );
    let dir = setup(&config);
    let sets = ["grpo.mode=\"async\"", "grpo.max_off_policy_steps=1"];
    let (_, done_before_kill) = start_and_kill(dir.path(), "run-episodes", &sets);
    let mut args = vec!["--set", "out.dir=\"run-episodes\"", "--resume"];
    args.extend(sets.iter().flat_map(|set| ["--set", *set]));
    let resumed = grpo(dir.path(), &args);
    assert_success(&resumed);
    let stdout = String::from_utf8_lossy(&resumed.stdout);
    assert!(
        stdout.contains("resumed from step"),
        "killed after update {done_before_kill}: {stdout}"
    );
    let steps: Vec<serde_json::Value> =
        std::fs::read_to_string(dir.path().join("run-episodes/metrics.jsonl"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"kind\":\"step\""))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect();
    let logged: Vec<u64> = steps.iter().map(|s| s["step"].as_u64().unwrap()).collect();
    assert_eq!(
        logged,
        (1..=STEPS as u64).collect::<Vec<_>>(),
        "each update once"
    );
    let mut turns = 0.0;
    for step in &steps {
        // Every update trained its whole batch of episodes: none was lost to the kill.
        assert_eq!(step["samples"].as_u64(), Some(8), "{step}");
        let episodes = &step["episodes"];
        assert!(episodes.is_object(), "no episode figures: {step}");
        let stops: u64 = episodes["stops"]
            .as_object()
            .unwrap()
            .values()
            .map(|v| v.as_u64().unwrap())
            .sum();
        assert_eq!(stops, 8, "{step}");
        turns += episodes["turns_mean"].as_f64().unwrap();
    }
    assert!(
        turns / steps.len() as f64 > 1.5,
        "the episodes were not multi-turn: {} turns on average; first update: {}",
        turns / steps.len() as f64,
        steps[0]["episodes"]
    );
}

/// `stoke env --model model ARGS --demonstrations OUT` in `dir`.
fn env_demonstrations(dir: &Path, args: &[&str], out: &Path) -> Output {
    stoke()
        .current_dir(dir)
        .args(["env", "--model", "model"])
        .args(args)
        .arg("--demonstrations")
        .arg(out)
        .output()
        .unwrap()
}

#[test]
fn stoke_env_demonstrations_are_the_experts_episodes_played_through_the_environment() {
    let dir = setup(CONFIG);
    let demos = dir.path().join("demos.jsonl");
    let output = env_demonstrations(
        dir.path(),
        &[
            "--environment",
            "calculator",
            "--digits",
            "4",
            "--tasks",
            "6",
            "--task-seed",
            "2",
            "--max-turns",
            "3",
        ],
        &demos,
    );
    assert_success(&output);
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("6 demonstration(s) written"), "{stderr}");
    let lines: Vec<serde_json::Value> = std::fs::read_to_string(&demos)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).unwrap())
        .collect();
    assert_eq!(lines.len(), 6);
    for line in &lines {
        assert_eq!(line["score"], 1.0, "{line}");
        let messages = line["messages"].as_array().unwrap();
        let roles: Vec<&str> = messages
            .iter()
            .map(|m| m["role"].as_str().unwrap())
            .collect();
        // The opening (a system prompt describing the tool where the template shows no tools),
        // the call, the tool's message, the answer.
        let turns = &roles[roles.len() - 4..];
        assert_eq!(turns, ["user", "assistant", "tool", "assistant"], "{line}");
        assert!(roles.len() == 4 || roles[0] == "system", "{line}");
        let at = roles.len() - 4;
        // The tool message is the calculator's own result, and the answer repeats it.
        let result = messages[at + 2]["content"].as_str().unwrap();
        assert!(result.parse::<i64>().is_ok(), "{line}");
        let answer = messages[at + 3]["content"].as_str().unwrap();
        assert_eq!(answer, format!("The answer is {result}."));
        assert!(
            messages[at + 1]["content"]
                .as_str()
                .unwrap()
                .starts_with("<tool_call>")
        );
    }

    // An environment without an expert is refused before anything is written.
    let none = dir.path().join("none.jsonl");
    let output = env_demonstrations(dir.path(), &["--environment", "guess_number"], &none);
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(stderr.contains("no scripted expert"), "{stderr}");
    assert!(!none.exists());
}

#[test]
fn a_process_reward_model_trained_by_stoke_prm_rewards_grpo_outcome_and_dense() {
    let dir = setup(CONFIG);
    // A PRM from the same tiny model: 4 steps of `stoke prm` on rows whose right steps name
    // the sum.
    let rows: Vec<(String, Vec<String>, Vec<bool>)> = (0..6)
        .map(|i| {
            (
                format!("What is {i} + 2?"),
                vec![
                    format!("{i} + 2"),
                    format!("is {}", i + 2),
                    format!("is {}", i + 5),
                ],
                vec![true, true, false],
            )
        })
        .collect();
    common::train_process_reward_model(dir.path(), &rows, 4);

    let start = CONFIG.find("[rewards.default]").unwrap();
    let end = CONFIG.find("[optimizer]").unwrap();
    let config_with = |reward: &str, out: &str| {
        format!("{}{reward}\n{}", &CONFIG[..start], &CONFIG[end..])
            .replace("steps = 16", "steps = 3")
            .replace("dir = \"run-a\"", &format!("dir = \"{out}\""))
    };
    let steps_of = |out: &str| -> Vec<serde_json::Value> {
        std::fs::read_to_string(dir.path().join(out).join("metrics.jsonl"))
            .unwrap()
            .lines()
            .filter(|l| l.contains("\"kind\":\"step\""))
            .map(|l| serde_json::from_str(l).unwrap())
            .collect()
    };
    let outcome = "[rewards.default]\nkind = \"process_reward\"\nmodel = \"prm/model\"\n\
                   aggregation = \"min\"";
    for (reward, out, dense) in [
        (outcome.to_string(), "run-prm", false),
        (format!("{outcome}\ndense = true"), "run-prm-dense", true),
    ] {
        std::fs::write(dir.path().join("grpo.toml"), config_with(&reward, out)).unwrap();
        let output = grpo(dir.path(), &[]);
        assert_success(&output);
        let steps = steps_of(out);
        assert_eq!(steps.len(), 3, "{out}");
        for step in &steps {
            // P(good) aggregated by min, not normalized: every reward is in [0, 1].
            let mean = step["reward_mean"].as_f64().unwrap();
            assert!((0.0..=1.0).contains(&mean), "reward_mean {mean}: {step}");
            assert!(step["outcomes"].get("scorer_error").is_none(), "{step}");
            match step.get("process_steps_mean") {
                Some(value) if dense => {
                    let value = value.as_f64().unwrap();
                    assert!(value > 0.0, "process_steps_mean {value}: {step}");
                }
                None if !dense => {}
                other => panic!("{out}: process_steps_mean {other:?} (dense {dense}): {step}"),
            }
        }
    }

    // Dense needs the process reward to be the run's only reward: refused before training.
    let two = format!("{outcome}\ndense = true\n[rewards.other]\nkind = \"repetition\"");
    std::fs::write(dir.path().join("grpo.toml"), config_with(&two, "run-two")).unwrap();
    let refused = grpo(dir.path(), &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("rewards.default.dense") && stderr.contains("only reward"),
        "{stderr}"
    );
    // A reward model (a sequence classifier) is not a PRM: refused, named.
    let causal = outcome.replace("prm/model", "model");
    std::fs::write(dir.path().join("grpo.toml"), config_with(&causal, "run-lm")).unwrap();
    let refused = grpo(dir.path(), &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("rewards.default") && stderr.contains("not a process reward model"),
        "{stderr}"
    );
}

#[test]
fn a_reward_model_trained_by_stoke_rm_scores_grpo_samples() {
    let dir = setup(CONFIG);
    // A reward model from the same tiny model: 4 steps of `stoke rm` on pairs that prefer
    // answers ending in "is".
    let pairs: Vec<(String, String, String)> = (0..8)
        .map(|i| {
            (
                format!("What is {i} + 2?"),
                format!("{} is", i + 2),
                format!("{}", i + 3),
            )
        })
        .collect();
    common::train_reward_model(dir.path(), &pairs, 4);

    let reward = "[rewards.default]\nkind = \"reward_model\"\nmodel = \"rm/model\"\n\
                  normalize = \"group\"\nclip = 3.0\n[optimizer]";
    let start = CONFIG.find("[rewards.default]").unwrap();
    let end = CONFIG.find("[optimizer]").unwrap();
    let config = format!(
        "{}{reward}{}",
        &CONFIG[..start],
        &CONFIG[end + "[optimizer]".len()..]
    )
    .replace("steps = 16", "steps = 4")
    .replace("dir = \"run-a\"", "dir = \"run-rm\"");
    std::fs::write(dir.path().join("grpo.toml"), &config).unwrap();
    // Run from another folder: the reward model's path is relative to the config's.
    let output = grpo(dir.path(), &[]);
    assert_success(&output);
    let metrics = std::fs::read_to_string(dir.path().join("run-rm/metrics.jsonl")).unwrap();
    let steps: Vec<serde_json::Value> = metrics
        .lines()
        .filter(|l| l.contains("\"kind\":\"step\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert_eq!(steps.len(), 4);
    for step in &steps {
        // Normalized per group: every group's scores have mean 0 and (population) std 1, so the
        // batch's too, unless a group's samples all scored the same (then 0).
        let mean = step["reward_mean"].as_f64().unwrap();
        let std = step["reward_std"].as_f64().unwrap();
        assert!(mean.abs() < 1e-4, "reward_mean {mean}: {step}");
        assert!(std > 0.5 && std < 1.0001, "reward_std {std}: {step}");
    }

    // A causal LM named as the reward model is refused before the first step, named.
    std::fs::write(
        dir.path().join("grpo.toml"),
        config.replace("model = \"rm/model\"", "model = \"model\""),
    )
    .unwrap();
    let refused = grpo(dir.path(), &[]);
    assert!(!refused.status.success());
    let stderr = String::from_utf8_lossy(&refused.stderr);
    assert!(
        stderr.contains("rewards.default") && stderr.contains("not a reward model"),
        "{stderr}"
    );
}
