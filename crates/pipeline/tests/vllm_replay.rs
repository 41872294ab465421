//! The remote modules against vLLM's real answers: fixtures/vllm/exchange.jsonl holds the HTTP
//! exchange of `stoke grpo` with a vLLM 0.32 (CPU) server, recorded by
//! scripts/record_vllm_exchange.py. A replay server answers each request with the recorded answer
//! after checking that the request is the recorded one (route, order, and for completions the
//! prompt ids, `n`, seed and sampling settings), so these tests fail when the client's requests
//! drift from what vLLM was asked, or when it misreads vLLM's answers:
//! - rollout: the checks before the first step, the weight reload sequence (`/pause?mode=wait`,
//!   `/collective_rpc reload_weights`, `/reset_prefix_cache`, `/resume`) for the starting weights
//!   and each update, and the completions' token ids and log-probs, with the version last loaded
//!   as every token's version (vLLM reports none);
//! - reference: prompt log-probs of [prompt, completion] batches, read at the completion's
//!   positions.

use std::collections::VecDeque;
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::State;
use axum::http::{Method, StatusCode, Uri};
use axum::response::{IntoResponse, Response};
use candle_core::Device;
use serde_json::Value;
use stoke_model::Transformer;
use stoke_pipeline::remote::rollout::group_seed;
use stoke_pipeline::remote::{
    Engine, PoolSettings, RemoteReference, RemoteReferenceSettings, RemoteRollout,
    RemoteRolloutSettings, Routing,
};
use stoke_pipeline::rollout::RolloutSettings;
use stoke_pipeline::service::{ReferenceScoring, RolloutService};
use stoke_pipeline::weights::WeightStore;
use stoke_pipeline::{
    GenerationPermit, GroupTicket, PolicyVersion, RolloutGroup, Sample, ScoredGroup, Task,
    WeightSync,
};
use stoke_reward::Reference;
use stoke_rollout::FinishReason;
use stoke_tokenizer::hf::Tokenizer;

fn fixture() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/vllm")
}

fn exchange(run: &str) -> Vec<Value> {
    std::fs::read_to_string(fixture().join("exchange.jsonl"))
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str::<Value>(l).unwrap())
        .filter(|e| e["run"] == run)
        .collect()
}

/// Answers requests with the recorded answers, in order; a request that is not the recorded one
/// gets a 500 and is noted in `errors`.
#[derive(Clone, Default)]
struct Replay {
    script: Arc<Mutex<VecDeque<Value>>>,
    errors: Arc<Mutex<Vec<String>>>,
}

/// The fields of a completions request that must equal the recording.
const COMPARED: [&str; 10] = [
    "prompt",
    "n",
    "max_tokens",
    "seed",
    "temperature",
    "top_p",
    "logprobs",
    "stop_token_ids",
    "return_token_ids",
    "prompt_logprobs",
];

/// Completions requests of one step run concurrently, so they may arrive in any order: one is
/// matched by its fields among the consecutive completions at the head of the recording. Every
/// other request must be the next recorded one.
async fn replay(State(replay): State<Replay>, method: Method, uri: Uri, body: Bytes) -> Response {
    let request: Value = serde_json::from_slice(&body).unwrap_or(Value::Null);
    let mut script = replay.script.lock().unwrap();
    let found = if uri.path() == "/v1/completions" {
        script
            .iter()
            .take_while(|e| e["path"] == "/v1/completions")
            .position(|e| COMPARED.iter().all(|f| request[*f] == e["request"][*f]))
    } else {
        script
            .front()
            .filter(|e| e["method"] == method.as_str() && e["path"] == uri.to_string())
            .map(|_| 0)
    };
    let Some(next) = found.and_then(|i| script.remove(i)) else {
        let head = script.front().map_or("the end".to_string(), |e| {
            format!("{} {} {}", e["method"], e["path"], e["request"])
        });
        replay.errors.lock().unwrap().push(format!(
            "{method} {uri} {request} is not what vLLM was asked next (the recording has {head})"
        ));
        return StatusCode::INTERNAL_SERVER_ERROR.into_response();
    };
    drop(script);
    let status = StatusCode::from_u16(next["status"].as_u64().unwrap() as u16).unwrap();
    match &next["response"] {
        Value::Null => (status, "").into_response(),
        other => (status, axum::Json(other.clone())).into_response(),
    }
}

/// A replay server on a loopback port for `run`'s exchanges.
fn serve(run: &str) -> (String, Replay, tokio::runtime::Runtime) {
    let state = Replay {
        script: Arc::new(Mutex::new(exchange(run).into())),
        errors: Arc::default(),
    };
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .unwrap();
    let listener = runtime
        .block_on(tokio::net::TcpListener::bind("127.0.0.1:0"))
        .unwrap();
    let url = format!("http://{}", listener.local_addr().unwrap());
    let router = Router::new().fallback(replay).with_state(state.clone());
    runtime.spawn(async move { axum::serve(listener, router).await });
    (url, state, runtime)
}

fn pool(url: &str) -> PoolSettings {
    PoolSettings {
        servers: vec![url.to_string()],
        routing: Routing::RoundRobin,
        // One request at a time: the replay's order is the recording's.
        max_in_flight: 1,
        timeout: Duration::from_secs(30),
        revive_after: Duration::from_secs(3600),
        startup_wait: Duration::ZERO,
    }
}

fn task(id: u64, prompt_ids: Vec<u32>) -> Arc<Task> {
    Arc::new(Task {
        id: format!("t{id}"),
        prompt: String::new(),
        prompt_ids,
        reference: Reference::default(),
        reward: 0,
        data: Default::default(),
    })
}

fn ticket(group_id: u64, prompt_ids: Vec<u32>, version: u64) -> GroupTicket {
    GroupTicket {
        group_id,
        task: task(group_id, prompt_ids),
        permit: GenerationPermit {
            policy_version: PolicyVersion(version),
            update_slot: version,
            permit_index: group_id,
        },
        temperature: 1.0,
    }
}

fn ids(value: &Value) -> Vec<u32> {
    value
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap() as u32)
        .collect()
}

#[test]
fn rollout_on_vllm_reloads_weights_and_reads_its_completions() {
    let recorded = exchange("rollout");
    let completions: Vec<&Value> = recorded
        .iter()
        .filter(|e| e["path"] == "/v1/completions")
        .collect();
    assert_eq!(completions.len(), 4, "2 updates x 2 groups were recorded");
    let (url, replay, _runtime) = serve("rollout");
    let model_dir = fixture().join("model");
    let model = Transformer::load(&model_dir, &Device::Cpu).unwrap();
    let tokenizer = Tokenizer::from_dir(&model_dir).unwrap();
    let weights = Arc::new(WeightStore::new(&model).unwrap());
    let first = &completions[0]["request"];
    let settings = RolloutSettings {
        group_size: first["n"].as_u64().unwrap() as usize,
        max_new_tokens: first["max_tokens"].as_u64().unwrap() as usize,
        top_p: 1.0,
        top_k: None,
        seed: 5,
        stop_token_ids: ids(&first["stop_token_ids"]),
        weight_sync: WeightSync::BetweenBatches,
        fixed_lag: false,
    };
    let published = tempfile::tempdir().unwrap();
    let remote = RemoteRolloutSettings {
        pool: pool(&url),
        engine: Engine::Vllm,
        model: None,
        weights_dir: published.path().to_path_buf(),
    };
    let rollout = RemoteRollout::connect(
        &remote,
        Arc::clone(&weights),
        &model,
        &tokenizer,
        &model_dir,
        settings,
    )
    .unwrap_or_else(|e| panic!("{e}: {:?}", replay.errors.lock().unwrap()));
    assert!(published.path().join("v0/model.safetensors").is_file());

    // The group a recorded request was for: the one whose seed it carries.
    let group_of = |request: &Value| -> u64 {
        (0..16)
            .find(|&g| Some(group_seed(5, g)) == request["seed"].as_i64())
            .expect("a recorded seed of run seed 5")
    };
    for update in 0..2u64 {
        let mut recorded: Vec<&Value> = completions[update as usize * 2..][..2].to_vec();
        recorded.sort_by_key(|e| group_of(&e["request"]));
        let tickets: Vec<GroupTicket> = recorded
            .iter()
            .map(|e| {
                ticket(
                    group_of(&e["request"]),
                    ids(&e["request"]["prompt"]),
                    update,
                )
            })
            .collect();
        let groups = rollout
            .generate(tickets)
            .unwrap_or_else(|e| panic!("{e}: {:?}", replay.errors.lock().unwrap()));
        for (group, entry) in groups.iter().zip(&recorded) {
            let answer = &entry["response"];
            for (sample, choice) in group
                .samples
                .iter()
                .zip(answer["choices"].as_array().unwrap())
            {
                assert_eq!(sample.completion_ids, ids(&choice["token_ids"]));
                let logprobs: Vec<f32> = choice["logprobs"]["token_logprobs"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .map(|v| v.as_f64().unwrap() as f32)
                    .collect();
                assert_eq!(sample.rollout_logprobs, logprobs);
                assert!(
                    sample
                        .token_versions
                        .iter()
                        .all(|v| *v == PolicyVersion(update))
                );
                assert_eq!(sample.text, choice["text"].as_str().unwrap());
                let finish = match choice["finish_reason"].as_str().unwrap() {
                    "length" => FinishReason::Length,
                    _ => FinishReason::Eos {
                        token_id: *sample.completion_ids.last().unwrap(),
                    },
                };
                assert_eq!(sample.finish, finish);
            }
        }
        // The update's weights: written, then the reload sequence.
        weights.publish(&model, PolicyVersion(update + 1)).unwrap();
    }
    assert!(
        replay.errors.lock().unwrap().is_empty(),
        "{:?}",
        replay.errors.lock().unwrap()
    );
    assert!(
        replay.script.lock().unwrap().is_empty(),
        "requests left unasked"
    );
    let stats = rollout.remote_stats().unwrap();
    assert_eq!(stats.servers[0].requests, 4);
    assert_eq!(stats.retries, 0);
}

#[test]
fn a_reference_on_vllm_reads_prompt_logprobs_at_the_completion() {
    let recorded = exchange("reference");
    // The task prompts, as the rollout run sent them.
    let prompts: Vec<Vec<u32>> = exchange("rollout")
        .iter()
        .filter(|e| e["path"] == "/v1/completions")
        .map(|e| ids(&e["request"]["prompt"]))
        .collect();
    let (url, replay, _runtime) = serve("reference");
    let model_dir = fixture().join("model");
    let tokenizer = Tokenizer::from_dir(&model_dir).unwrap();
    let settings = RemoteReferenceSettings {
        pool: pool(&url),
        engine: Engine::Vllm,
        model: None,
    };
    let reference = RemoteReference::connect(&settings, &tokenizer, 300)
        .unwrap_or_else(|e| panic!("{e}: {:?}", replay.errors.lock().unwrap()));
    let mut checked = 0;
    for (number, entry) in recorded
        .iter()
        .filter(|e| e["path"] == "/v1/completions")
        .enumerate()
    {
        let sequences: Vec<Vec<u32>> = entry["request"]["prompt"]
            .as_array()
            .unwrap()
            .iter()
            .map(ids)
            .collect();
        let prompt = prompts
            .iter()
            .filter(|p| sequences.iter().all(|s| s.starts_with(p)))
            .max_by_key(|p| p.len())
            .expect("the reference run's prompt is one of the task prompts")
            .clone();
        let samples = sequences
            .iter()
            .map(|s| {
                let completion = s[prompt.len()..].to_vec();
                Sample {
                    rollout_logprobs: vec![-1.0; completion.len()],
                    token_versions: vec![PolicyVersion(0); completion.len()],
                    completion_ids: completion,
                    loss_mask: None,
                    episode: None,
                    text: String::new(),
                    finish: FinishReason::Length,
                }
            })
            .collect();
        let mut groups = vec![ScoredGroup::new(
            RolloutGroup {
                ticket: ticket(number as u64, prompt.clone(), 0),
                samples,
                generate_seconds: 0.0,
            },
            Vec::new(),
            0.0,
        )];
        reference
            .add_reference_logprobs(&mut groups)
            .unwrap_or_else(|e| panic!("{e}: {:?}", replay.errors.lock().unwrap()));
        let rows = groups[0].ref_logprobs.as_ref().unwrap();
        for (row, (choice, sequence)) in rows.iter().zip(
            entry["response"]["choices"]
                .as_array()
                .unwrap()
                .iter()
                .zip(&sequences),
        ) {
            assert_eq!(row.len(), sequence.len() - prompt.len());
            for (j, lp) in row.iter().enumerate() {
                let position = prompt.len() + j;
                let id = sequence[position].to_string();
                let want = choice["prompt_logprobs"][position][&id]["logprob"]
                    .as_f64()
                    .unwrap() as f32;
                assert_eq!(*lp, want, "sequence position {position}");
                checked += 1;
            }
        }
    }
    assert!(checked > 0);
    assert!(
        replay.errors.lock().unwrap().is_empty(),
        "{:?}",
        replay.errors.lock().unwrap()
    );
    assert!(
        replay.script.lock().unwrap().is_empty(),
        "requests left unasked"
    );
}
