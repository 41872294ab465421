//! Distributed GRPO on localhost: the trainer (`stoke grpo`) with rollout on two `stoke serve`
//! processes and rewards on one `stoke reward-server`, all real processes on loopback ports.
//!
//! - Learning matches the in-process run: on-policy (sync, `max_off_policy_steps = 0`), the
//!   remote run logs the same update figures and ends with the same weights as the local one,
//!   since the servers draw each group's samples from the same random streams, on the weights the
//!   trainer published, and every trained token's reported version is the version updated.
//! - Asynchronous with k = 1 and 2, no sample is more than k versions old.
//! - One rollout server killed mid-run (SIGKILL): the run finishes every update, each once with
//!   all its samples, the dead server is out of rotation with its failure counted, and the alert
//!   is logged.
//! - A server that does not answer is refused before the first step, naming it.
//! - Multi-turn episodes (`[environment]`) on the same servers: the environment plays here,
//!   every turn is sampled remotely (token ids in, ids, log-probs and versions out, each turn's
//!   own stream), and the run matches the in-process one as above.
//! - `stoke env --endpoint` on a `stoke serve`: the same episodes, token for token, as `stoke env`
//!   on the local weights; a model the server lacks and a server that is down are refused, named.
//! - A reward model (`kind = "reward_model"`) on a `stoke reward-server` scores as it does in
//!   the trainer's process: the same update figures.
//!
//! The model is the tiny random Llama of the other CLI tests on the built-in arithmetic task, with
//! an `instructions` reward the random policy scores unevenly (so updates move the weights).

use std::io::{BufRead, BufReader};
use std::path::Path;
use std::process::{Child, Command, Output, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

mod common;
mod server;

use server::Server;

fn stoke() -> Command {
    Command::new(env!("CARGO_BIN_EXE_stoke"))
}

const STEPS: usize = 8;

const CONFIG: &str = r#"
[model]
path = "model"
[tasks]
kind = "arithmetic"
problems = 8
seed = 3
[grpo]
steps = 8
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
[out]
dir = "run-local"
"#;

/// A server process (`stoke serve`, `stoke reward-server`) in `dir`; killed on drop.
fn server(args: &[&str], dir: &Path) -> Server {
    let mut command = stoke();
    command.args(args).current_dir(dir).stdout(Stdio::null());
    Server::spawn(command)
}

/// `stoke serve` over `dir/model`, served as `tiny`.
fn rollout_server(dir: &Path) -> Server {
    Server::serve(Path::new("model"), "tiny", Some(dir))
}

/// Two rollout servers over `dir/model` and one reward server with `dir/grpo.toml`'s rewards.
struct Cluster {
    rollout: Vec<Server>,
    reward: Server,
}

impl Cluster {
    fn start(dir: &Path) -> Cluster {
        let rollout = (0..2).map(|_| rollout_server(dir)).collect();
        let reward = server(&["reward-server", "grpo.toml", "--port", "0"], dir);
        Cluster { rollout, reward }
    }

    /// `--set` arguments that put rollout and rewards on this cluster.
    fn sets(&self) -> Vec<String> {
        let urls: Vec<String> = self
            .rollout
            .iter()
            .map(|p| format!("\"{}\"", p.url))
            .collect();
        vec![
            "rollout.kind=\"remote\"".into(),
            format!("rollout.servers=[{}]", urls.join(", ")),
            "rollout.revive_after_s=3600".into(),
            "reward.kind=\"remote\"".into(),
            format!("reward.servers=[\"{}\"]", self.reward.url),
        ]
    }
}

fn setup() -> tempfile::TempDir {
    let dir = tempfile::tempdir().unwrap();
    let texts: Vec<String> = (0..40)
        .map(|i| format!("What is {i} + {}? It is {} . Is it?", i + 2, 2 * i + 2))
        .collect();
    common::tiny_chat_model(dir.path(), &texts);
    std::fs::write(dir.path().join("grpo.toml"), CONFIG).unwrap();
    dir
}

fn grpo_command(dir: &Path, out: &str, sets: &[String]) -> Command {
    let mut command = stoke();
    command
        .arg("grpo")
        .arg(dir.join("grpo.toml"))
        .args(["--set", &format!("out.dir=\"{out}\""), "--quiet"])
        .args(sets.iter().flat_map(|set| ["--set", set.as_str()]))
        .current_dir("/");
    command
}

fn assert_success(output: &Output) {
    assert!(
        output.status.success(),
        "stdout: {}\nstderr: {}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
}

/// The update records of a run's metrics log.
fn steps(dir: &Path, out: &str) -> Vec<Value> {
    std::fs::read_to_string(dir.join(out).join("metrics.jsonl"))
        .unwrap_or_default()
        .lines()
        .filter(|l| l.contains("\"kind\":\"step\""))
        .map(|l| serde_json::from_str(l).unwrap())
        .collect()
}

fn weights(dir: &Path, out: &str) -> Vec<u8> {
    std::fs::read(dir.join(out).join("model/model.safetensors")).unwrap()
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * (1.0 + a.abs().max(b.abs()))
}

#[test]
fn remote_rollout_and_rewards_train_as_the_local_pipeline_does() {
    let dir = setup();
    let cluster = Cluster::start(dir.path());
    let sets = cluster.sets();

    let local = grpo_command(dir.path(), "run-local", &[]).output().unwrap();
    assert_success(&local);
    let remote = grpo_command(dir.path(), "run-remote", &sets)
        .output()
        .unwrap();
    assert_success(&remote);
    let stderr = String::from_utf8_lossy(&remote.stderr);
    assert!(stderr.contains("rollout on 2 stoke server(s)"), "{stderr}");
    assert!(stderr.contains("sandbox isolation"), "{stderr}");

    let (local_steps, remote_steps) = (
        steps(dir.path(), "run-local"),
        steps(dir.path(), "run-remote"),
    );
    assert_eq!(local_steps.len(), STEPS);
    assert_eq!(remote_steps.len(), STEPS);
    let mut moved = false;
    for (l, r) in local_steps.iter().zip(&remote_steps) {
        for key in [
            "reward_mean",
            "reward_std",
            "loss",
            "grad_norm",
            "length_mean",
        ] {
            let (a, b) = (l[key].as_f64().unwrap(), r[key].as_f64().unwrap());
            assert!(
                close(a, b),
                "update {}: {key} local {a}, remote {b}",
                l["step"]
            );
        }
        moved |= l["grad_norm"].as_f64().unwrap() > 0.0;
        // Every trained token was generated by the weights being updated.
        assert_eq!(r["staleness_histogram"], serde_json::json!([8]), "{r}");
        let servers = r["rollout_servers"]["servers"].as_array().unwrap();
        assert_eq!(servers.len(), 2);
        assert!(
            servers
                .iter()
                .all(|s| s["alive"] == true && s["failures"] == 0),
            "{r}"
        );
        assert_eq!(r["reward_servers"]["servers"][0]["failures"], 0);
    }
    assert!(
        moved,
        "no update had a gradient: equal runs would prove nothing"
    );
    let last = remote_steps.last().unwrap();
    let requests: Vec<u64> = last["rollout_servers"]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["requests"].as_u64().unwrap())
        .collect();
    assert_eq!(requests.iter().sum::<u64>(), (STEPS * 2) as u64);
    assert!(
        requests.iter().all(|&r| r > 0),
        "one server did all the work: {requests:?}"
    );
    // The updates' samples, and the held-out evaluation before the first update (2 problems:
    // 1 greedy and 2 sampled completions each), which scores on the reward server too.
    assert_eq!(
        last["reward_servers"]["servers"][0]["samples"],
        (STEPS * 8 + 2 * (1 + 2)) as u64
    );
    // The servers sampled with the published weights: the runs end with the same weights.
    let (lw, rw) = (
        weights(dir.path(), "run-local"),
        weights(dir.path(), "run-remote"),
    );
    let initial = std::fs::read(dir.path().join("model/model.safetensors")).unwrap();
    assert!(lw != initial, "training changed no weight");
    let local_model = safetensors::SafeTensors::deserialize(&lw).unwrap();
    let remote_model = safetensors::SafeTensors::deserialize(&rw).unwrap();
    for (name, tensor) in local_model.tensors() {
        let other = remote_model.tensor(&name).unwrap();
        let values = |bytes: &[u8]| -> Vec<f32> {
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        for (a, b) in values(tensor.data()).iter().zip(values(other.data())) {
            assert!((a - b).abs() <= 1e-5, "{name}: local {a}, remote {b}");
        }
    }

    // Asynchronous, k = 1 and 2: the bound holds across processes.
    for k in [1usize, 2] {
        let mut async_sets = sets.clone();
        async_sets.push("grpo.mode=\"async\"".into());
        async_sets.push(format!("grpo.max_off_policy_steps={k}"));
        let out = format!("run-async-{k}");
        let run = grpo_command(dir.path(), &out, &async_sets)
            .output()
            .unwrap();
        assert_success(&run);
        let logged = steps(dir.path(), &out);
        assert_eq!(logged.len(), STEPS);
        for step in &logged {
            let histogram = step["staleness_histogram"].as_array().unwrap();
            assert!(histogram.len() <= k + 1, "k = {k}: {step}");
            let samples: u64 = histogram.iter().map(|c| c.as_u64().unwrap()).sum();
            assert_eq!(samples, 8, "k = {k}: {step}");
        }
    }
}

/// Guess-the-number episodes are multi-turn for any model (a wrong or missing guess gets a
/// reply), so every update trains on episodes of several turns.
const ENVIRONMENT: &str = "[environment]\nkind = \"guess_number\"\nmax_turns = 3\nmax_turn_tokens = 6\nmax_total_tokens = 120\ntruncated_turns = \"close\"\n[optimizer]";

#[test]
fn remote_multi_turn_episodes_train_as_the_local_pipeline_does() {
    let dir = setup();
    std::fs::write(
        dir.path().join("grpo.toml"),
        CONFIG.replace("[optimizer]", ENVIRONMENT),
    )
    .unwrap();
    let cluster = Cluster::start(dir.path());
    let sets = cluster.sets();
    let local = grpo_command(dir.path(), "run-local", &[]).output().unwrap();
    assert_success(&local);
    let remote = grpo_command(dir.path(), "run-remote", &sets)
        .output()
        .unwrap();
    assert_success(&remote);
    let (local_steps, remote_steps) = (
        steps(dir.path(), "run-local"),
        steps(dir.path(), "run-remote"),
    );
    assert_eq!(local_steps.len(), STEPS);
    assert_eq!(remote_steps.len(), STEPS);
    let mut turns = 0.0;
    for (l, r) in local_steps.iter().zip(&remote_steps) {
        for key in [
            "reward_mean",
            "reward_std",
            "loss",
            "grad_norm",
            "length_mean",
        ] {
            let (a, b) = (l[key].as_f64().unwrap(), r[key].as_f64().unwrap());
            assert!(
                close(a, b),
                "update {}: {key} local {a}, remote {b}",
                l["step"]
            );
        }
        // The same episodes (turns, tokens, stops, tool figures); only the clock differs.
        let untimed = |v: &Value| {
            let mut v = v.clone();
            for key in ["env_seconds", "tool_seconds"] {
                v.as_object_mut().expect("episode figures").remove(key);
            }
            v
        };
        assert_eq!(
            untimed(&l["episodes"]),
            untimed(&r["episodes"]),
            "update {}",
            l["step"]
        );
        turns += r["episodes"]["turns_mean"].as_f64().unwrap();
        // Sync: every trained token was generated by the weights being updated.
        assert_eq!(r["staleness_histogram"], serde_json::json!([8]), "{r}");
        assert_eq!(r["samples"].as_u64(), Some(8), "{r}");
    }
    assert!(
        turns / STEPS as f64 > 1.5,
        "the episodes were not multi-turn: {} turns on average",
        turns / STEPS as f64
    );
    // More requests than groups: each later turn is a request of its own.
    let requests: u64 = remote_steps.last().unwrap()["rollout_servers"]["servers"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s["requests"].as_u64().unwrap())
        .sum();
    assert!(requests > (STEPS * 2) as u64, "{requests} requests");
    let (lw, rw) = (
        weights(dir.path(), "run-local"),
        weights(dir.path(), "run-remote"),
    );
    let local_model = safetensors::SafeTensors::deserialize(&lw).unwrap();
    let remote_model = safetensors::SafeTensors::deserialize(&rw).unwrap();
    for (name, tensor) in local_model.tensors() {
        let other = remote_model.tensor(&name).unwrap();
        let values = |bytes: &[u8]| -> Vec<f32> {
            bytes
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect()
        };
        for (a, b) in values(tensor.data()).iter().zip(values(other.data())) {
            assert!((a - b).abs() <= 1e-5, "{name}: local {a}, remote {b}");
        }
    }
}

#[test]
fn a_killed_rollout_server_does_not_stop_the_run() {
    let dir = setup();
    let mut cluster = Cluster::start(dir.path());
    let mut sets = cluster.sets();
    sets.push("grpo.steps=24".into());
    sets.push("grpo.mode=\"async\"".into());
    sets.push("grpo.max_off_policy_steps=1".into());
    let mut child = grpo_command(dir.path(), "run-kill", &sets)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let log = std::thread::spawn(move || {
        let mut text = String::new();
        for line in BufReader::new(stderr).lines() {
            text.push_str(&line.unwrap());
            text.push('\n');
        }
        text
    });
    let deadline = Instant::now() + Duration::from_secs(300);
    while steps(dir.path(), "run-kill").len() < 3 {
        assert!(child.try_wait().unwrap().is_none(), "the run ended early");
        assert!(Instant::now() < deadline, "no progress in metrics.jsonl");
        std::thread::sleep(Duration::from_millis(5));
    }
    let victim = cluster.rollout.remove(0);
    let victim_url = victim.url.clone();
    drop(victim); // SIGKILL
    let killed_after = steps(dir.path(), "run-kill").len();
    let status = child.wait().unwrap();
    let stderr = log.join().unwrap();
    assert!(status.success(), "{stderr}");
    assert!(
        killed_after < 24,
        "the server died after the run had finished"
    );

    let logged = steps(dir.path(), "run-kill");
    let numbers: Vec<u64> = logged.iter().map(|s| s["step"].as_u64().unwrap()).collect();
    assert_eq!(numbers, (1..=24).collect::<Vec<_>>(), "each update once");
    for step in &logged {
        assert_eq!(step["samples"], 8, "no sample lost: {step}");
    }
    let last = logged.last().unwrap();
    let servers = last["rollout_servers"]["servers"].as_array().unwrap();
    let dead = servers
        .iter()
        .find(|s| s["url"] == victim_url.as_str())
        .unwrap();
    let alive = servers
        .iter()
        .find(|s| s["url"] != victim_url.as_str())
        .unwrap();
    assert_eq!(dead["alive"], false, "{last}");
    assert!(dead["failures"].as_u64().unwrap() >= 1, "{last}");
    assert_eq!(alive["alive"], true);
    assert_eq!(alive["failures"], 0);
    let answered: u64 = servers
        .iter()
        .map(|s| s["requests"].as_u64().unwrap())
        .sum();
    assert_eq!(answered, 24 * 2, "every group answered once: {last}");
    assert!(
        stderr.contains(&format!("alert: rollout server {victim_url} failed")),
        "{stderr}"
    );
    eprintln!("killed after update {killed_after}: {}", dead);
}

#[test]
fn a_rollout_server_that_does_not_answer_is_refused_before_the_first_step() {
    let dir = setup();
    let output = grpo_command(
        dir.path(),
        "run-refused",
        &[
            "rollout.kind=\"remote\"".into(),
            "rollout.servers=[\"http://127.0.0.1:9\"]".into(),
        ],
    )
    .output()
    .unwrap();
    assert!(!output.status.success());
    let stderr = String::from_utf8_lossy(&output.stderr);
    assert!(
        stderr.contains("remote rollout: http://127.0.0.1:9: does not answer"),
        "{stderr}"
    );
    assert!(steps(dir.path(), "run-refused").is_empty());
}

#[test]
fn stoke_launch_runs_every_role_from_torchrun_variables() {
    let dir = setup();
    let rendezvous = dir.path().join("rendezvous");
    let world = 4;
    let children: Vec<Child> = (0..world)
        .map(|rank| {
            stoke()
                .args([
                    "launch",
                    "grpo.toml",
                    "--rollout-servers",
                    "2",
                    "--reward-servers",
                    "1",
                    "--rendezvous",
                    "rendezvous",
                    "--port",
                    "0",
                    "--host",
                    "127.0.0.1",
                    "--advertise",
                    "127.0.0.1",
                    "--kv-cache-gib",
                    "0.25",
                    "--quiet",
                    "--set",
                    "out.dir=\"run-launch\"",
                ])
                .env("RANK", rank.to_string())
                .env("WORLD_SIZE", world.to_string())
                .env("MASTER_ADDR", "127.0.0.1")
                .env("MASTER_PORT", "29500")
                .current_dir(dir.path())
                .stdout(Stdio::null())
                .stderr(Stdio::piped())
                .spawn()
                .unwrap()
        })
        .collect();
    let outputs: Vec<Output> = children
        .into_iter()
        .map(|c| c.wait_with_output().unwrap())
        .collect();
    for (rank, output) in outputs.iter().enumerate() {
        assert!(
            output.status.success(),
            "rank {rank}: {}",
            String::from_utf8_lossy(&output.stderr)
        );
    }
    let trainer = String::from_utf8_lossy(&outputs[0].stderr);
    assert!(
        trainer.contains("Torchrun rank 0 of 4 (local 0) is the Trainer"),
        "{trainer}"
    );
    let logged = steps(dir.path(), "run-launch");
    assert_eq!(logged.len(), STEPS);
    let last = logged.last().unwrap();
    assert_eq!(
        last["rollout_servers"]["servers"].as_array().unwrap().len(),
        2
    );
    assert_eq!(
        last["reward_servers"]["servers"].as_array().unwrap().len(),
        1
    );
    assert_eq!(
        std::fs::read_to_string(rendezvous.join("done")).unwrap(),
        "ok"
    );
    let server = String::from_utf8_lossy(&outputs[3].stderr);
    assert!(server.contains("is the Reward(0)"), "{server}");
}

#[test]
fn a_remote_reference_scores_the_sampled_tokens() {
    let dir = setup();
    let cluster = Cluster::start(dir.path());
    // The reference: the starting weights on a server of their own, never updated.
    let reference = Server::serve(Path::new("model"), "reference", Some(dir.path()));
    let kl = ["grpo.loss.beta=0.2".to_string()];
    let local = grpo_command(dir.path(), "run-kl-local", &kl)
        .output()
        .unwrap();
    assert_success(&local);
    let mut sets = cluster.sets();
    sets.extend(kl.iter().cloned());
    sets.push("reference.kind=\"remote\"".into());
    sets.push(format!("reference.servers=[\"{}\"]", reference.url));
    let remote = grpo_command(dir.path(), "run-kl-remote", &sets)
        .output()
        .unwrap();
    assert_success(&remote);
    let stderr = String::from_utf8_lossy(&remote.stderr);
    assert!(
        stderr.contains("reference log-probs on 1 stoke server(s)"),
        "{stderr}"
    );
    // The runs part after the first updates: server and trainer compute the same log-probs
    // through different kernels (prefill vs training forward, ~1e-6 apart; the pipeline test
    // `remote_reference` bounds that), and sampling amplifies any difference, so later KLs are
    // not compared. What must hold: before any update the reference is the policy (KL 0: the
    // server scored exactly the sampled tokens, at their positions), and later the policy moves
    // away from it.
    let (l, r) = (
        steps(dir.path(), "run-kl-local"),
        steps(dir.path(), "run-kl-remote"),
    );
    assert_eq!((l.len(), r.len()), (STEPS, STEPS));
    let first = r[0]["kl_mean"].as_f64().unwrap();
    assert!(first.abs() < 1e-5, "KL {first} before any update");
    assert_eq!(l[0]["kl_mean"].as_f64().unwrap(), 0.0);
    let kl_seen = r.iter().any(|s| s["kl_mean"].as_f64().unwrap() > 1e-5);
    assert!(
        r.iter().all(|s| s["kl_mean"].as_f64().unwrap().is_finite()),
        "a KL that is not a number"
    );
    assert!(
        kl_seen,
        "the policy never left the reference: equal KLs would prove nothing"
    );
}

/// `stoke env` on `dir/model` with `args`, JSON transcripts, one per line.
fn env_transcripts(dir: &Path, args: &[&str]) -> Vec<Value> {
    let output = stoke()
        .current_dir(dir)
        .args([
            "env",
            "--model",
            "model",
            "--environment",
            "guess_number",
            "--tasks",
            "3",
            "--samples",
            "2",
            "--temperature",
            "1",
            "--seed",
            "7",
            "--max-turns",
            "3",
            "--max-turn-tokens",
            "6",
            "--max-total-tokens",
            "200",
            "--truncated-turns",
            "close",
            "--format",
            "json",
        ])
        .args(args)
        .output()
        .unwrap();
    assert_success(&output);
    String::from_utf8(output.stdout)
        .unwrap()
        .lines()
        .map(|line| serde_json::from_str(line).expect("one JSON transcript per line"))
        .collect()
}

#[test]
fn stoke_env_on_an_endpoint_plays_the_episodes_the_local_model_plays() {
    let dir = setup();
    let serve = rollout_server(dir.path());
    let local = env_transcripts(dir.path(), &[]);
    let remote = env_transcripts(dir.path(), &["--endpoint", &serve.url]);
    assert_eq!(local.len(), 6, "3 tasks x 2 samples");
    assert_eq!(remote.len(), local.len());
    let mut model_turns = 0;
    for (l, r) in local.iter().zip(&remote) {
        // Token-exact: every segment's ids (the sampled ones, the closes and the environment's
        // rendered turns), the stop, the tool calls and the rewards are the local episode's, and
        // the transcript re-renders to the same ids.
        assert_eq!(r["rerender_exact"], Value::Bool(true), "{r}");
        for key in [
            "task",
            "sample",
            "prompt_ids",
            "stop",
            "turn_rewards",
            "final_text",
        ] {
            assert_eq!(l[key], r[key], "{key}");
        }
        let (ls, rs) = (
            l["segments"].as_array().unwrap(),
            r["segments"].as_array().unwrap(),
        );
        assert_eq!(ls.len(), rs.len(), "{l}\n{r}");
        for (a, b) in ls.iter().zip(rs) {
            assert_eq!(a["source"], b["source"]);
            assert_eq!(a["ids"], b["ids"], "{l}\n{r}");
            assert_eq!(a["trained"], b["trained"]);
            if a["source"] == "model" {
                model_turns += 1;
                let (la, lb) = (
                    a["logprobs"].as_array().unwrap(),
                    b["logprobs"].as_array().unwrap(),
                );
                assert_eq!(la.len(), lb.len());
                for (x, y) in la.iter().zip(lb) {
                    let (x, y) = (x.as_f64().unwrap(), y.as_f64().unwrap());
                    assert!((x - y).abs() < 1e-3, "log-prob {x} here, {y} served");
                }
            }
        }
    }
    assert!(
        model_turns > remote.len(),
        "the episodes were not multi-turn: {model_turns} model turns in {} episodes, stops {:?}",
        remote.len(),
        remote
            .iter()
            .map(|r| r["stop"].to_string())
            .collect::<Vec<_>>()
    );

    // A model the server does not serve, and a server that does not answer: refused, named.
    let wrong = stoke()
        .current_dir(dir.path())
        .args(["env", "--model", "model", "--endpoint", &serve.url])
        .args(["--served-model", "other"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&wrong.stderr);
    assert!(!wrong.status.success());
    assert!(
        stderr.contains("does not serve model `other`") && stderr.contains("tiny"),
        "{stderr}"
    );
    serve.stop();
    let gone = stoke()
        .current_dir(dir.path())
        .args([
            "env",
            "--model",
            "model",
            "--endpoint",
            "http://127.0.0.1:9",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&gone.stderr);
    assert!(!gone.status.success());
    assert!(
        stderr.contains("http://127.0.0.1:9") && stderr.contains("does not answer"),
        "{stderr}"
    );
}

#[test]
fn a_reward_model_on_a_reward_server_scores_as_it_does_in_process() {
    let dir = setup();
    // A reward model from the same tiny model: 3 steps of `stoke rm` on pairs that prefer a
    // question mark.
    let pairs: Vec<(String, String, String)> = (0..8)
        .map(|i| {
            (
                format!("What is {i} + 2?"),
                format!("It is {}?", i + 2),
                format!("It is {}", i + 2),
            )
        })
        .collect();
    common::train_reward_model(dir.path(), &pairs, 3);
    let start = CONFIG.find("[rewards.default]").unwrap();
    let end = CONFIG.find("[optimizer]").unwrap();
    let config = format!(
        "{}[rewards.default]\nkind = \"reward_model\"\nmodel = \"rm/model\"\nnormalize = \
         \"group\"\n{}",
        &CONFIG[..start],
        &CONFIG[end..]
    );
    std::fs::write(dir.path().join("grpo.toml"), config).unwrap();
    // The reward server loads the reward model in its own process.
    let reward = server(&["reward-server", "grpo.toml", "--port", "0"], dir.path());
    let short = ["grpo.steps=3".to_string()];
    let local = grpo_command(dir.path(), "run-local", &short)
        .output()
        .unwrap();
    assert_success(&local);
    let remote_sets = [
        short[0].clone(),
        "reward.kind=\"remote\"".into(),
        format!("reward.servers=[\"{}\"]", reward.url),
    ];
    let remote = grpo_command(dir.path(), "run-remote", &remote_sets)
        .output()
        .unwrap();
    assert_success(&remote);
    let (l, r) = (
        steps(dir.path(), "run-local"),
        steps(dir.path(), "run-remote"),
    );
    assert_eq!((l.len(), r.len()), (3, 3));
    for (l, r) in l.iter().zip(&r) {
        for key in ["reward_mean", "reward_std", "loss", "grad_norm"] {
            let (a, b) = (l[key].as_f64().unwrap(), r[key].as_f64().unwrap());
            assert!(
                close(a, b),
                "update {}: {key} local {a}, remote {b}",
                l["step"]
            );
        }
        // Group-normalized scores: mean 0, and not all equal.
        assert!(r["reward_mean"].as_f64().unwrap().abs() < 1e-4, "{r}");
        assert!(r["reward_std"].as_f64().unwrap() > 0.5, "{r}");
    }
    let served: u64 = r.last().unwrap()["reward_servers"]["servers"][0]["requests"]
        .as_u64()
        .unwrap_or(0);
    assert!(
        served > 0,
        "the reward server scored nothing: {}",
        r.last().unwrap()
    );

    // The reward model served by `stoke serve` (`--task auto` sees a sequence classifier and
    // serves /classify): the reward process sends ids, the server scores them.
    let rm = server(
        &[
            "serve",
            "--model",
            "rm/model",
            "--served-model-name",
            "rm",
            "--port",
            "0",
        ],
        dir.path(),
    );
    // Raw scores (no group normalization, which would hide a constant offset).
    let raw = [
        short[0].clone(),
        "rewards.default.normalize=\"none\"".into(),
    ];
    let in_process = grpo_command(dir.path(), "run-raw", &raw).output().unwrap();
    assert_success(&in_process);
    let served_sets = [
        raw[0].clone(),
        raw[1].clone(),
        format!("rewards.default.url=\"{}\"", rm.url),
        "rewards.default.served_model=\"rm\"".into(),
    ];
    let served = grpo_command(dir.path(), "run-served", &served_sets)
        .output()
        .unwrap();
    assert_success(&served);
    let (l, s) = (
        steps(dir.path(), "run-raw"),
        steps(dir.path(), "run-served"),
    );
    assert_eq!((l.len(), s.len()), (3, 3));
    for (l, s) in l.iter().zip(&s) {
        for key in ["reward_mean", "reward_std", "loss", "grad_norm"] {
            let (a, b) = (l[key].as_f64().unwrap(), s[key].as_f64().unwrap());
            assert!(
                close(a, b),
                "update {}: {key} in process {a}, served {b}",
                l["step"]
            );
        }
    }
    // A wrong served name and a dead server are refused before the first update, named.
    for (url, name, expect) in [
        (rm.url.clone(), "nope", "does not serve `nope`".to_string()),
        (
            "http://127.0.0.1:9".to_string(),
            "rm",
            "http://127.0.0.1:9".to_string(),
        ),
    ] {
        let sets = [
            short[0].clone(),
            format!("rewards.default.url=\"{url}\""),
            format!("rewards.default.served_model=\"{name}\""),
        ];
        let out = grpo_command(dir.path(), "run-refused", &sets)
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert!(
            !out.status.success() && stderr.contains(&expect),
            "{stderr}"
        );
    }
}

#[test]
fn a_judge_served_by_stoke_serve_scores_grpo_and_a_dead_judge_server_is_skipped() {
    let dir = setup();
    // A judge that has learned one answer, "Score: 7", to any request: 60 SFT steps of the tiny
    // model on long varied requests (the judge's prompts are long in its 300-token vocabulary,
    // so its context is raised first).
    let config_path = dir.path().join("model/config.json");
    let mut config: Value =
        serde_json::from_str(&std::fs::read_to_string(&config_path).unwrap()).unwrap();
    config["max_position_embeddings"] = 4096.into();
    std::fs::write(&config_path, config.to_string()).unwrap();
    let lines: Vec<String> = (0..48)
        .map(|i| {
            let request = format!(
                "Grade this answer. Rubric: rate it. The question: what is {i} + 2? The \
                 answer: It is {} . Is it? {}",
                i + 2,
                "Reply with a score. ".repeat(10 + (i % 40))
            );
            serde_json::json!({"messages": [
                {"role": "system", "content": "You are a strict grader."},
                {"role": "user", "content": request},
                {"role": "assistant", "content": "Score: 7"},
            ]})
            .to_string()
        })
        .collect();
    std::fs::write(dir.path().join("judge.jsonl"), lines.join("\n") + "\n").unwrap();
    std::fs::write(
        dir.path().join("judge.toml"),
        "output_dir = \"judge\"\n[model]\npath = \"model\"\n[data]\nkind = \"chat\"\n\
         train = [\"judge.jsonl\"]\nseq_len = 1536\nmicro_batch_size = 4\n\
         [optimizer]\nlr = 1e-2\n[schedule]\nkind = \"constant\"\n[training]\nsteps = 60\n",
    )
    .unwrap();
    let sft = stoke()
        .args(["train", "judge.toml", "--quiet"])
        .current_dir(dir.path())
        .output()
        .unwrap();
    assert_success(&sft);
    let judge = server(
        &[
            "serve",
            "--model",
            "judge/model",
            "--served-model-name",
            "judge",
            "--port",
            "0",
        ],
        dir.path(),
    );
    let start = CONFIG.find("[rewards.default]").unwrap();
    let end = CONFIG.find("[optimizer]").unwrap();
    // The first server is dead: every request meets it once, is retried on the live one,
    // and the dead one is then skipped while it cools down.
    let grpo = format!(
        "{}[rewards.default]\nkind = \"judge\"\nurls = [\"http://127.0.0.1:9\", \"{}\"]\n\
         model = \"judge\"\nmode = \"pointwise\"\nrubric = \"Rate the answer.\"\n\
         scale = [1, 10]\nmax_tokens = 8\nretries = 2\ntimeout_s = 30\n{}",
        &CONFIG[..start],
        judge.url,
        &CONFIG[end..]
    );
    std::fs::write(dir.path().join("grpo.toml"), grpo).unwrap();
    let run = grpo_command(dir.path(), "run-judge", &["grpo.steps=3".to_string()])
        .output()
        .unwrap();
    assert_success(&run);
    let records = steps(dir.path(), "run-judge");
    assert_eq!(records.len(), 3, "every update ran");
    let mut skipped = 0;
    for record in &records {
        let judge = &record["judge"];
        assert!(judge["calls"].as_u64().unwrap() > 0, "{record}");
        assert_eq!(judge["failures"], 0, "{record}");
        assert_eq!(judge["parse_failures"], 0, "{record}");
        skipped += judge["servers_skipped"].as_u64().unwrap() + judge["retries"].as_u64().unwrap();
        // "Score: 7" on 1..10 is (7 - 1) / 9 for every sample.
        let mean = record["reward_mean"].as_f64().unwrap();
        assert!((mean - 6.0 / 9.0).abs() < 1e-6, "{record}");
    }
    assert!(
        skipped > 0,
        "the dead judge server was never met: {records:?}"
    );
}
