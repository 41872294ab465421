//! Remote rollout: the rollout module on N OpenAI-compatible servers (`stoke serve` or vLLM), and
//! the publication of new weights to them.
//!
//! Requests: one `POST /v1/completions` per group: the prompt as token ids, `n = group_size`,
//! `return_token_ids`, `logprobs: 0` (the sampled token's log-prob only) under the sampling
//! distribution (`logprobs_mode: processed_logprobs` for `stoke serve`; start vLLM with
//! `--logprobs-mode processed_logprobs`), the group's temperature, top-p/top-k, the run's stop
//! ids and the sampling stream: `stoke serve` takes the run's seed and the group id as
//! `prompt_number`, so sample j of a group draws from stream (seed, group id, j) exactly as in
//! process; vLLM gets a seed mixed from both. The completion's token ids come back and are
//! trained on as they are: text is decoded for the reward only and never tokenized again.
//!
//! Every answer is checked before it is used: `n` choices, one log-prob (finite) and one weight
//! version per token id, ids inside the vocabulary, versions non-decreasing and not older than
//! the ticket's permit. A server that breaks one of these fails the request, which is retried
//! elsewhere (`servers.rs`).
//!
//! Weight versions across processes: the servers count versions of their own, so the run takes
//! an offset `base` at start (one above the highest version any server reports) and publishes its
//! session version `v` as server version `base + v`. `stoke serve` reports the version of every
//! token (`weight_versions`); vLLM reports none, so its tokens carry the version the client last
//! published to that server (its reload pauses with `mode=wait`, so no request straddles one).
//!
//! Multi-turn episodes ([`RemoteRollout::with_episodes`]): the episode runner
//! (`crate::episode`) plays the environment here and samples every turn on the servers through
//! [`RemoteTurns`]: one request per prompt of a turn (turn 0: a group's prompt with `n = group
//! size`; later turns: one episode's whole id sequence so far, `n = 1`), token ids in, ids,
//! log-probs and versions out, checked as above. `stoke serve` takes the turn's stream key
//! (`prompt_number` = group id, `first_sample` = episode, `turn`), so remote episodes draw the
//! in-process engine's streams; vLLM gets a seed mixed from the key.
//!
//! Weight sync: a server may load a new version while it decodes (the trainer publishes when an
//! update ends, whatever is in flight), so remote rollout behaves as `weight_sync = "in_flight"`
//! whichever is configured; every token still carries its version, and the learner's staleness
//! accounting uses the oldest. With `max_off_policy_steps = 0` nothing is in flight at a
//! publication, so every token has the version being updated.
//!
//! Publication ([`RemotePublisher`], installed in the [`WeightStore`] as its hook): the trainer's
//! new weights are written in Hugging Face layout to `weights_dir/.staging-vN`, renamed to
//! `weights_dir/vN` (readers never see half a directory), then every server in rotation is told
//! to load it: `stoke serve`: `POST /update_weights {"path", "version"}`; vLLM (with
//! `VLLM_SERVER_DEV_MODE=1`): `/pause?mode=wait`, `/collective_rpc` `reload_weights`,
//! `/reset_prefix_cache`, `/resume`. A server that fails the update leaves rotation; it is brought
//! to the newest version before it rejoins. Older directories are removed once every server has
//! moved on.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use serde_json::{Value, json};
use stoke_model::Transformer;
use stoke_rollout::FinishReason;
use stoke_serve::client::Client;
use stoke_tokenizer::hf::Tokenizer;

use crate::episode::{EpisodeGroup, EpisodeSetup, EpisodeStats, TurnEngine, env_task};
use crate::error::PipelineError;
use crate::records::{GroupTicket, RolloutGroup, Sample};
use crate::remote::servers::{ServerPool, Work, health, wait_until_answering};
use crate::rollout::episode_sample;
use crate::rollout::{RolloutSettings, RolloutStats, check_prompt};
use crate::scheduler::each_on_a_thread;
use crate::service::{RemoteStats, RolloutService};
use crate::settings::{Engine, PoolSettings, RemoteRolloutSettings};
use crate::staleness::PolicyVersion;
use crate::weights::{PublishHook, WeightStore};
use stoke_rollout::{Completion, GenerationRequest, LiveGeneration, SamplingParams, StreamKey};

/// The weight side shared by the client and the probe of a failed server.
struct Published {
    /// Server version of session version 0.
    base: u64,
    /// The newest published session version and its directory.
    latest: Option<(PolicyVersion, PathBuf)>,
    /// Per server: the server version it holds as far as we know (vLLM reports none).
    held: Vec<Option<u64>>,
}

/// Writes new weights to the shared directory and tells every server to load them.
pub struct RemotePublisher {
    pool: Arc<ServerPool>,
    engine: Engine,
    dir: PathBuf,
    /// Tokenizer and generation files copied next to the weights (the run's model folder).
    tokenizer_dir: PathBuf,
    state: Arc<Mutex<Published>>,
}

impl RemotePublisher {
    fn lock(&self) -> std::sync::MutexGuard<'_, Published> {
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn base(&self) -> u64 {
        self.lock().base
    }

    /// Writes `model` as session version `version` and loads it on every server in rotation.
    fn publish_model(
        &self,
        model: &Transformer,
        version: PolicyVersion,
    ) -> Result<(), PipelineError> {
        let path = write_weights(model, &self.dir, &self.tokenizer_dir, version)?;
        let base = self.base();
        let server_version = base + version.0;
        let alive = self.pool.alive();
        let results: Vec<(usize, Result<(), String>)> = each_on_a_thread(alive, |index| {
            let client = self.pool.client(index);
            (
                index,
                load_weights(client, self.engine, &path, server_version),
            )
        });
        let mut loaded = 0;
        {
            let mut state = self.lock();
            for (index, result) in &results {
                match result {
                    Ok(()) => {
                        state.held[*index] = Some(server_version);
                        loaded += 1;
                    }
                    Err(error) => self
                        .pool
                        .mark_failed(*index, &format!("loading weights v{}: {error}", version.0)),
                }
            }
            let previous = state.latest.replace((version, path.clone()));
            if let Some((_, old)) = previous
                && old != path
            {
                // Every server in rotation has moved on; a returning one loads the newest.
                let _ = std::fs::remove_dir_all(old);
            }
        }
        // No server in rotation now: the version waits on disk for the first that answers its
        // probe again. Every server failing to load it is an error.
        if loaded == 0 && !results.is_empty() {
            return Err(PipelineError::Remote {
                service: "rollout",
                reason: format!(
                    "no rollout server loaded weights version {} ({})",
                    version.0,
                    results
                        .iter()
                        .filter_map(|(i, r)| r
                            .as_ref()
                            .err()
                            .map(|e| format!("{}: {e}", self.pool.client(*i).base())))
                        .collect::<Vec<_>>()
                        .join("; ")
                ),
            });
        }
        Ok(())
    }
}

impl PublishHook for RemotePublisher {
    fn publish(&self, model: &Transformer, version: PolicyVersion) -> Result<(), PipelineError> {
        self.publish_model(model, version)
    }
}

/// `model` in Hugging Face layout at `dir/vN`, written under another name and renamed.
fn write_weights(
    model: &Transformer,
    dir: &Path,
    tokenizer_dir: &Path,
    version: PolicyVersion,
) -> Result<PathBuf, PipelineError> {
    std::fs::create_dir_all(dir).map_err(|e| PipelineError::io(dir, e))?;
    let staging = dir.join(format!(".staging-v{}", version.0));
    let target = dir.join(format!("v{}", version.0));
    for stale in [&staging, &target] {
        if stale.exists() {
            std::fs::remove_dir_all(stale).map_err(|e| PipelineError::io(stale, e))?;
        }
    }
    if model.lora_config().is_some() {
        model
            .merged()?
            .save_with_tokenizer(&staging, Some(tokenizer_dir))?;
    } else {
        model.save_with_tokenizer(&staging, Some(tokenizer_dir))?;
    }
    std::fs::rename(&staging, &target).map_err(|e| PipelineError::io(&staging, e))?;
    Ok(target)
}

/// Asks one server to load `path` as `server_version`.
fn load_weights(
    client: &Client,
    engine: Engine,
    path: &Path,
    server_version: u64,
) -> Result<(), String> {
    let path_text = path.display().to_string();
    match engine {
        Engine::Stoke => {
            let (status, body) = client
                .post(
                    "/update_weights",
                    &json!({"path": path_text, "version": server_version}),
                )
                .map_err(|e| e.to_string())?;
            if status != 200 {
                return Err(format!("/update_weights answered {status}: {body}"));
            }
            if body["version"].as_u64() != Some(server_version) {
                return Err(format!(
                    "/update_weights answered version {} instead of {server_version}",
                    body["version"]
                ));
            }
            Ok(())
        }
        Engine::Vllm => {
            let steps: [(&str, Value); 4] = [
                ("/pause?mode=wait", Value::Null),
                (
                    "/collective_rpc",
                    json!({"method": "reload_weights", "kwargs": {"weights_path": path_text}}),
                ),
                ("/reset_prefix_cache", Value::Null),
                ("/resume", Value::Null),
            ];
            for (route, body) in steps {
                let text = if body.is_null() {
                    String::new()
                } else {
                    body.to_string()
                };
                let (status, answer) = client.post_raw(route, &text).map_err(|e| e.to_string())?;
                if status != 200 {
                    return Err(format!("{route} answered {status}: {answer}"));
                }
            }
            Ok(())
        }
    }
}

/// What the checks of one inference server found.
pub(crate) struct CheckedServer {
    pub client: Client,
    /// The served model's context, when the server reports it.
    pub max_model_len: Option<usize>,
}

/// The checks before the first step of one OpenAI-compatible server of `service`: it answers
/// (waiting up to the pool's `startup_wait`), serves `model_name` (the first server's first
/// model when `None`, which is then set), and tokenizes a probe text as `tokenizer` does.
pub(crate) fn check_server(
    service: &'static str,
    url: &str,
    pool: &PoolSettings,
    model_name: &mut Option<String>,
    tokenizer: &Tokenizer,
) -> Result<CheckedServer, PipelineError> {
    let refuse = |reason: String| PipelineError::Remote {
        service,
        reason: format!("{url}: {reason}"),
    };
    let probe_text = "Remote modules check the tokenizer: 12 + 30 = 42.";
    let local_ids = tokenizer.encode(probe_text, false)?;
    let client = Client::with_timeout(url, Some(pool.timeout));
    wait_until_answering(&client, pool.startup_wait)
        .map_err(|e| refuse(format!("does not answer: {e}")))?;
    let (status, models) = client
        .get("/v1/models")
        .map_err(|e| refuse(format!("does not answer: {e}")))?;
    if status != 200 {
        return Err(refuse(format!("/v1/models answered {status}")));
    }
    let served: Vec<&Value> = models["data"].as_array().into_iter().flatten().collect();
    let name = model_name.get_or_insert_with(|| {
        served
            .first()
            .and_then(|m| m["id"].as_str())
            .unwrap_or_default()
            .to_string()
    });
    let Some(entry) = served
        .iter()
        .find(|m| m["id"].as_str() == Some(name.as_str()))
    else {
        return Err(refuse(format!(
            "does not serve model `{name}` (it serves {})",
            served
                .iter()
                .filter_map(|m| m["id"].as_str())
                .collect::<Vec<_>>()
                .join(", ")
        )));
    };
    let max_model_len = entry["max_model_len"].as_u64().map(|len| len as usize);
    let (status, tokenized) = client
        .post(
            "/tokenize",
            &json!({"model": name, "prompt": probe_text, "add_special_tokens": false}),
        )
        .map_err(|e| refuse(format!("/tokenize: {e}")))?;
    let remote_ids: Option<Vec<u32>> = tokenized["tokens"].as_array().map(|ids| {
        ids.iter()
            .filter_map(|v| v.as_u64().map(|v| v as u32))
            .collect()
    });
    if status != 200 || remote_ids.as_deref() != Some(local_ids.as_slice()) {
        return Err(refuse(format!(
            "its tokenizer differs from the run's: {probe_text:?} is {:?} here and {} there \
             (status {status})",
            local_ids, tokenized["tokens"]
        )));
    }
    Ok(CheckedServer {
        client,
        max_model_len,
    })
}

/// The rollout module on remote servers (see the module doc).
pub struct RemoteRollout {
    pool: Arc<ServerPool>,
    publisher: Arc<RemotePublisher>,
    weights: Arc<WeightStore>,
    settings: RolloutSettings,
    model_name: String,
    vocab_size: usize,
    max_model_len: usize,
    stats: Mutex<RolloutStats>,
    /// Multi-turn runs: the environment, and the tokenizer its messages are rendered with.
    episodes: Option<(EpisodeSetup, Arc<Tokenizer>)>,
}

impl std::fmt::Debug for RemoteRollout {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRollout")
            .field("pool", &self.pool)
            .field("model", &self.model_name)
            .finish_non_exhaustive()
    }
}

impl RemoteRollout {
    /// Checks every server before the first step (it answers, serves the expected model, and
    /// tokenizes as the run's tokenizer does), publishes `policy` (the trainer's weights of the
    /// store's current version) to all of them, and installs the publisher in `weights`. Errors
    /// name the server and what failed.
    pub fn connect(
        remote: &RemoteRolloutSettings,
        weights: Arc<WeightStore>,
        policy: &Transformer,
        tokenizer: &Tokenizer,
        tokenizer_dir: &Path,
        settings: RolloutSettings,
    ) -> Result<RemoteRollout, PipelineError> {
        if settings.fixed_lag {
            return Err(PipelineError::config(
                "grpo.lag",
                "a fixed lag needs older weight versions on demand; remote rollout servers hold \
                 one version (use lag = \"bounded\")",
            ));
        }
        let refuse = |url: &str, reason: String| PipelineError::Remote {
            service: "rollout",
            reason: format!("{url}: {reason}"),
        };
        // The store's copy may be an inference-only one (bf16 packed); the servers load the
        // trainer's own weights, as they will at every update.
        let version = weights.version();
        let model = policy;
        let config = model.config().clone();
        let mut model_name = remote.model.clone();
        let mut max_model_len = config.max_position_embeddings;
        let mut base = 0u64;
        for url in &remote.pool.servers {
            let checked = check_server("rollout", url, &remote.pool, &mut model_name, tokenizer)?;
            if let Some(len) = checked.max_model_len {
                max_model_len = max_model_len.min(len);
            }
            if remote.engine == Engine::Stoke {
                let (status, answer) = checked
                    .client
                    .get("/weights/checksum")
                    .map_err(|e| refuse(url, format!("/weights/checksum: {e}")))?;
                let held = answer["version"]
                    .as_u64()
                    .filter(|_| status == 200)
                    .ok_or_else(|| {
                        refuse(
                            url,
                            format!("/weights/checksum answered {status}: {answer}"),
                        )
                    })?;
                base = base.max(held + 1);
            }
        }
        let model_name = model_name.unwrap_or_default();
        let probe_state = Arc::new(Mutex::new(Published {
            base,
            latest: None,
            held: vec![None; remote.pool.servers.len()],
        }));
        let engine = remote.engine;
        let probe = {
            let state = Arc::clone(&probe_state);
            Box::new(move |index: usize, client: &Client| -> Result<(), String> {
                health(index, client)?;
                let (base, latest) = {
                    let state = state.lock().unwrap_or_else(PoisonError::into_inner);
                    (state.base, state.latest.clone())
                };
                // Back in rotation only with the newest weights.
                if let Some((version, path)) = latest {
                    load_weights(client, engine, &path, base + version.0)?;
                    let mut state = state.lock().unwrap_or_else(PoisonError::into_inner);
                    state.held[index] = Some(base + version.0);
                }
                Ok(())
            })
        };
        let pool = Arc::new(ServerPool::new("rollout", remote.pool.clone(), probe));
        let publisher = Arc::new(RemotePublisher {
            pool: Arc::clone(&pool),
            engine,
            dir: remote.weights_dir.clone(),
            tokenizer_dir: tokenizer_dir.to_path_buf(),
            state: probe_state,
        });
        publisher.publish_model(model, version)?;
        weights.set_hook(Arc::clone(&publisher) as Arc<dyn PublishHook>);
        Ok(RemoteRollout {
            pool,
            publisher,
            weights,
            settings,
            model_name,
            vocab_size: config.vocab_size,
            max_model_len,
            stats: Mutex::new(RolloutStats::default()),
            episodes: None,
        })
    }

    /// The same rollout playing multi-turn episodes of `setup`'s environment (see the module
    /// doc); `tokenizer` renders the environment's messages. Errors: the tokenizer has no chat
    /// template.
    pub fn with_episodes(
        mut self,
        setup: EpisodeSetup,
        tokenizer: Arc<Tokenizer>,
    ) -> Result<RemoteRollout, PipelineError> {
        tokenizer
            .default_chat_template()
            .map_err(|e| PipelineError::config("environment", e.to_string()))?;
        self.episodes = Some((setup, tokenizer));
        Ok(self)
    }

    /// The run's sampling parameters at `temperature` (the episode runner sets each turn's).
    fn sampling_params(&self, temperature: f32) -> SamplingParams {
        let s = &self.settings;
        SamplingParams {
            max_new_tokens: s.max_new_tokens,
            temperature,
            top_k: s.top_k,
            top_p: s.top_p,
            seed: s.seed,
            n: s.group_size,
            stop_token_ids: s.stop_token_ids.clone(),
            stop_strings: Vec::new(),
        }
    }

    /// Episodes for `tickets` (one runner call per temperature), each group's samples in
    /// ticket order.
    fn play(
        &self,
        setup: &EpisodeSetup,
        tokenizer: &Tokenizer,
        tickets: &[GroupTicket],
        base: u64,
        stats: &mut RolloutStats,
    ) -> Result<Vec<Vec<Sample>>, PipelineError> {
        let template = tokenizer
            .default_chat_template()
            .map_err(|e| PipelineError::config("environment", e.to_string()))?;
        let runner = setup.runner(tokenizer, template);
        let mut results: Vec<Vec<Sample>> = vec![Vec::new(); tickets.len()];
        let mut temperatures: Vec<f32> = Vec::new();
        for ticket in tickets {
            if !temperatures
                .iter()
                .any(|t| t.to_bits() == ticket.temperature.to_bits())
            {
                temperatures.push(ticket.temperature);
            }
        }
        for temperature in temperatures {
            let call: Vec<usize> = (0..tickets.len())
                .filter(|&i| tickets[i].temperature.to_bits() == temperature.to_bits())
                .collect();
            let groups = call
                .iter()
                .map(|&i| {
                    let ticket = &tickets[i];
                    let task = env_task(&ticket.task);
                    let opening = setup.env.opening(&task).map_err(|e| {
                        PipelineError::config("environment", format!("task {}: {e}", task.id))
                    })?;
                    Ok(EpisodeGroup {
                        group_id: ticket.group_id,
                        task: Arc::new(task),
                        opening,
                        prompt_ids: ticket.task.prompt_ids.clone(),
                    })
                })
                .collect::<Result<Vec<_>, PipelineError>>()?;
            let turns = RemoteTurns {
                rollout: self,
                base,
                permits: call
                    .iter()
                    .map(|&i| {
                        (
                            tickets[i].group_id,
                            base + tickets[i].permit.policy_version.0,
                        )
                    })
                    .collect(),
            };
            let mut episode_stats = EpisodeStats::default();
            let records = runner.run_on(
                &turns,
                &self.sampling_params(temperature),
                &groups,
                &mut episode_stats,
            )?;
            stats.engine_calls += episode_stats.engine_calls;
            stats.generated_tokens += episode_stats.generated_tokens;
            stats.episodes.add(&episode_stats);
            for (&index, episodes) in call.iter().zip(records) {
                results[index] = episodes
                    .into_iter()
                    .map(|record| episode_sample(record, &*setup.env))
                    .collect();
            }
        }
        Ok(results)
    }

    fn check_prompt(&self, prompt_ids: &[u32]) -> Result<(), String> {
        check_prompt(
            prompt_ids,
            self.vocab_size,
            self.max_model_len,
            "the servers' max_model_len",
        )
    }

    /// One group on one server: the request, and the answer checked and turned into samples
    /// (turn 0 of the group's streams, the single-turn request).
    fn request_group(
        &self,
        index: usize,
        client: &Client,
        ticket: &GroupTicket,
        base: u64,
    ) -> Result<(Vec<Sample>, Work), String> {
        self.request_turn(
            index,
            client,
            &ticket.task.prompt_ids,
            StreamKey {
                prompt_number: ticket.group_id,
                first_sample: 0,
                turn: 0,
            },
            &self.sampling_params(ticket.temperature),
            base + ticket.permit.policy_version.0,
            base,
        )
    }
}

/// The remote servers as the episode runner's engine: one request per prompt of a turn, sent in
/// parallel through the pool (a failed server's request is retried elsewhere).
struct RemoteTurns<'a> {
    rollout: &'a RemoteRollout,
    /// The publisher's version offset (see the module doc).
    base: u64,
    /// (group id, the server version its ticket was granted): no token may be older.
    permits: Vec<(u64, u64)>,
}

impl TurnEngine for RemoteTurns<'_> {
    fn max_positions(&self) -> Result<usize, PipelineError> {
        Ok(self.rollout.max_model_len)
    }

    fn generate(&self, request: &GenerationRequest) -> Result<LiveGeneration, PipelineError> {
        let keys = request_keys(request);
        let work: Vec<(&Vec<u32>, StreamKey)> = request.prompts.iter().zip(keys).collect();
        let answers = each_on_a_thread(&work, |&(prompt, key)| {
            let permit = self
                .permits
                .iter()
                .find(|(group, _)| *group == key.prompt_number)
                .map_or(self.base, |&(_, permit)| permit);
            let what = format!(
                "group {} episode {} turn {}",
                key.prompt_number, key.first_sample, key.turn
            );
            // Checked here, not in the request: a prompt the servers cannot take is this
            // episode's fault, and must not take a server out of rotation.
            if let Err(reason) = self.rollout.check_prompt(prompt) {
                return Err(PipelineError::Remote {
                    service: "rollout",
                    reason: format!("{what}: {reason}"),
                });
            }
            self.rollout.pool.call(&what, |index, client| {
                self.rollout.request_turn(
                    index,
                    client,
                    prompt,
                    key,
                    &request.params,
                    permit,
                    self.base,
                )
            })
        });
        live_generation(request, answers)
    }
}

impl RemoteRollout {
    /// One prompt (checked by the caller) on one server: `params.n` samples from the key's
    /// streams, the answer checked (no token older than `permit`).
    #[allow(clippy::too_many_arguments)]
    fn request_turn(
        &self,
        index: usize,
        client: &Client,
        prompt: &[u32],
        key: StreamKey,
        params: &SamplingParams,
        permit: u64,
        base: u64,
    ) -> Result<(Vec<Sample>, Work), String> {
        let held_version = self.publisher.lock().held[index];
        let body = completion_body(
            &self.model_name,
            self.publisher.engine,
            prompt,
            key,
            params,
            self.max_model_len,
        );
        let samples = post_completion(
            client,
            &body,
            params.n.max(1),
            permit,
            base,
            held_version,
            self.vocab_size,
        )?;
        let work = Work {
            samples: samples.len() as u64,
            tokens: samples.iter().map(|s| s.completion_ids.len() as u64).sum(),
        };
        Ok((samples, work))
    }
}

/// The `/v1/completions` body of one prompt (token ids): `params.n` samples from `key`'s
/// streams (`stoke serve`) or a seed mixed from it (vLLM), each token's id and processed
/// log-prob returned, at most the tokens left under `max_model_len`.
pub(crate) fn completion_body(
    model_name: &str,
    engine: Engine,
    prompt: &[u32],
    key: StreamKey,
    params: &SamplingParams,
    max_model_len: usize,
) -> Value {
    let max_tokens = params
        .max_new_tokens
        .min(max_model_len.saturating_sub(prompt.len()))
        .max(1);
    let mut body = json!({
        "model": model_name,
        "prompt": prompt,
        "n": params.n.max(1),
        "max_tokens": max_tokens,
        "temperature": params.temperature,
        "top_p": params.top_p,
        "seed": match engine {
            Engine::Stoke => params.seed as i64,
            Engine::Vllm => turn_seed(params.seed, key),
        },
        "stop_token_ids": params.stop_token_ids,
        "logprobs": 0,
        "return_token_ids": true,
    });
    if let Some(k) = params.top_k {
        body["top_k"] = json!(k);
    }
    if engine == Engine::Stoke {
        body["logprobs_mode"] = json!("processed_logprobs");
        body["prompt_number"] = json!(key.prompt_number);
        body["first_sample"] = json!(key.first_sample);
        body["turn"] = json!(key.turn);
    }
    body
}

/// Posts a `/v1/completions` body and returns the answer's `n` choices in index order (an
/// answer other than 200, or another count, is an error quoting the server).
pub(crate) fn completion_choices(
    client: &Client,
    body: &Value,
    n: usize,
) -> Result<Vec<Value>, String> {
    let (status, mut answer) = client
        .post("/v1/completions", body)
        .map_err(|e| e.to_string())?;
    if status != 200 {
        return Err(format!(
            "/v1/completions answered {status}: {}",
            answer.to_string().chars().take(300).collect::<String>()
        ));
    }
    let Some(Value::Array(mut choices)) = answer.get_mut("choices").map(Value::take) else {
        return Err("the answer has no `choices`".into());
    };
    if choices.len() != n {
        return Err(format!("{} choices for {n} requested", choices.len()));
    }
    choices.sort_by_key(|c| c["index"].as_u64().unwrap_or(u64::MAX));
    Ok(choices)
}

/// Posts `body` and checks the answer (see the module doc): `n` choices in index order, each
/// a sample whose tokens are no older than server version `permit` (`held_version`: the version
/// of a server that reports none).
pub(crate) fn post_completion(
    client: &Client,
    body: &Value,
    n: usize,
    permit: u64,
    base: u64,
    held_version: Option<u64>,
    vocab_size: usize,
) -> Result<Vec<Sample>, String> {
    let choices = completion_choices(client, body, n)?;
    let ordered = choices.iter();
    ordered
        .enumerate()
        .map(|(i, choice)| {
            parse_choice(choice, permit, base, held_version, vocab_size)
                .map_err(|e| format!("choice {i}: {e}"))
        })
        .collect()
}

/// Per-prompt answers of a [`TurnEngine`] request as the engine's output: completions in
/// request order, each with its per-token versions.
pub(crate) fn live_generation(
    request: &GenerationRequest,
    answers: Vec<Result<Vec<Sample>, PipelineError>>,
) -> Result<LiveGeneration, PipelineError> {
    let mut completions = Vec::with_capacity(answers.len());
    let mut token_versions = Vec::with_capacity(answers.len());
    let mut generated = 0usize;
    for (prompt_index, answer) in answers.into_iter().enumerate() {
        let samples = answer?;
        let mut prompt_completions = Vec::with_capacity(samples.len());
        let mut prompt_versions = Vec::with_capacity(samples.len());
        for (sample_index, sample) in samples.into_iter().enumerate() {
            generated += sample.completion_ids.len();
            prompt_versions.push(sample.token_versions.iter().map(|v| v.0).collect());
            prompt_completions.push(Completion {
                prompt_index,
                sample_index,
                token_ids: sample.completion_ids,
                logprobs: sample.rollout_logprobs,
                text: Some(sample.text),
                finish_reason: sample.finish,
            });
        }
        completions.push(prompt_completions);
        token_versions.push(prompt_versions);
    }
    Ok(LiveGeneration {
        output: stoke_rollout::GenerationOutput {
            completions,
            prefill_tokens: request.prompts.iter().map(Vec::len).sum(),
            generated_tokens: generated,
            kv_cache_bytes: 0,
        },
        token_versions,
    })
}

/// The stream key of each prompt of `request`: its own, or turn 0 of consecutive prompt numbers.
pub(crate) fn request_keys(request: &GenerationRequest) -> Vec<StreamKey> {
    match &request.streams {
        Some(keys) if keys.len() == request.prompts.len() => keys.clone(),
        _ => (0..request.prompts.len())
            .map(|i| StreamKey {
                prompt_number: request.first_prompt_number + i as u64,
                first_sample: 0,
                turn: 0,
            })
            .collect(),
    }
}

/// The seed of an episode turn's request to a vLLM server: turn 0 of the group's samples is
/// [`group_seed`] (the single-turn seed); later turns mix in the episode and the turn.
pub fn turn_seed(seed: u64, key: StreamKey) -> i64 {
    if key.first_sample == 0 && key.turn == 0 {
        return group_seed(seed, key.prompt_number);
    }
    let episode = (key.first_sample.wrapping_mul(0xD6E8_FEB8_6659_FD93))
        ^ key.turn.wrapping_mul(0x94D0_49BB_1331_11EB);
    group_seed(seed ^ episode, key.prompt_number)
}

/// The seed of group `group_id`'s request to a vLLM server (which has no stream numbers): a
/// fixed mix of the run's seed and the group id, so a group's samples do not depend on which
/// server or batch served it.
pub fn group_seed(seed: u64, group_id: u64) -> i64 {
    let mixed =
        (seed ^ group_id.wrapping_mul(0x9E37_79B9_7F4A_7C15)).wrapping_mul(0xBF58_476D_1CE4_E5B9);
    (mixed >> 1) as i64
}

/// One choice of a completions answer as a sample, checked (see the module doc).
fn parse_choice(
    choice: &Value,
    permit: u64,
    base: u64,
    held_version: Option<u64>,
    vocab_size: usize,
) -> Result<Sample, String> {
    let ids: Vec<u32> = choice["token_ids"]
        .as_array()
        .ok_or("no `token_ids` (the server must honour return_token_ids)")?
        .iter()
        .map(|v| {
            v.as_u64()
                .filter(|&id| (id as usize) < vocab_size)
                .map(|id| id as u32)
                .ok_or_else(|| format!("token id {v} is not in the vocabulary (size {vocab_size})"))
        })
        .collect::<Result<_, _>>()?;
    let logprobs: Vec<f32> = choice["logprobs"]["token_logprobs"]
        .as_array()
        .ok_or("no `logprobs.token_logprobs`")?
        .iter()
        .map(|v| {
            v.as_f64()
                .filter(|lp| lp.is_finite())
                .map(|lp| lp as f32)
                .ok_or_else(|| format!("log-prob {v} is not a finite number"))
        })
        .collect::<Result<_, _>>()?;
    if logprobs.len() != ids.len() {
        return Err(format!(
            "{} log-probs for {} tokens",
            logprobs.len(),
            ids.len()
        ));
    }
    let versions: Vec<u64> = match choice["weight_versions"].as_array() {
        Some(list) => list
            .iter()
            .map(|v| {
                v.as_u64()
                    .ok_or_else(|| format!("weight version {v} is not a number"))
            })
            .collect::<Result<_, _>>()?,
        None => {
            let held = held_version.ok_or("no `weight_versions`, and no weights published here")?;
            vec![held; ids.len()]
        }
    };
    if versions.len() != ids.len() {
        return Err(format!(
            "{} weight versions for {} tokens",
            versions.len(),
            ids.len()
        ));
    }
    if versions.windows(2).any(|w| w[1] < w[0]) {
        return Err("weight versions go down within a completion".into());
    }
    if let Some(&first) = versions.first()
        && first < permit
    {
        return Err(format!(
            "tokens of weights version {first} for a ticket granted version {permit} (the server \
             missed a weight update)"
        ));
    }
    let text = choice["text"].as_str().unwrap_or_default().to_string();
    let finish = match (choice["finish_reason"].as_str(), &choice["stop_reason"]) {
        (Some("length"), _) => FinishReason::Length,
        (Some("stop"), Value::String(stop)) => FinishReason::StopString { stop: stop.clone() },
        (Some("stop"), _) => FinishReason::Eos {
            token_id: ids.last().copied().ok_or("stopped without a token")?,
        },
        (other, _) => return Err(format!("finish_reason {other:?} is not stop or length")),
    };
    Ok(Sample {
        completion_ids: ids,
        rollout_logprobs: logprobs,
        token_versions: versions
            .into_iter()
            .map(|v| PolicyVersion(v - base))
            .collect(),
        loss_mask: None,
        episode: None,
        text,
        finish,
    })
}

impl RolloutService for RemoteRollout {
    fn generate(&self, tickets: Vec<GroupTicket>) -> Result<Vec<RolloutGroup>, PipelineError> {
        if tickets.is_empty() {
            return Ok(Vec::new());
        }
        let wait_started = Instant::now();
        let needed = tickets
            .iter()
            .map(|t| t.permit.policy_version)
            .max()
            .unwrap_or(PolicyVersion(0));
        if self.weights.wait_for(needed).is_none() {
            return Err(PipelineError::ModuleStopped {
                module: "rollout",
                reason: format!(
                    "the weight store closed before version {} was published",
                    needed.0
                ),
            });
        }
        let wait_seconds = wait_started.elapsed().as_secs_f64();
        let base = self.publisher.base();
        let started = Instant::now();
        if let Some((setup, tokenizer)) = &self.episodes {
            let mut call_stats = RolloutStats::default();
            let played = self.play(setup, tokenizer, &tickets, base, &mut call_stats)?;
            let seconds = started.elapsed().as_secs_f64();
            let share = seconds / tickets.len() as f64;
            let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
            stats.wait_seconds += wait_seconds;
            stats.generate_seconds += seconds;
            stats.engine_calls += call_stats.engine_calls;
            stats.generated_tokens += call_stats.generated_tokens;
            stats.episodes.add(&call_stats.episodes);
            let mut groups = Vec::with_capacity(tickets.len());
            for (ticket, samples) in tickets.into_iter().zip(played) {
                stats.prefill_tokens += ticket.task.prompt_ids.len() as u64;
                stats.count_group(&samples);
                groups.push(RolloutGroup {
                    ticket,
                    samples,
                    generate_seconds: share,
                });
            }
            return Ok(groups);
        }
        let results: Vec<Result<Result<Vec<Sample>, String>, PipelineError>> =
            each_on_a_thread(&tickets, |ticket| {
                match self.check_prompt(&ticket.task.prompt_ids) {
                    Err(reason) => Ok(Err(format!("task {}: {reason}", ticket.task.id))),
                    Ok(()) => self
                        .pool
                        .call(&format!("group {}", ticket.group_id), |index, client| {
                            self.request_group(index, client, ticket, base)
                        })
                        .map(Ok),
                }
            });
        let seconds = started.elapsed().as_secs_f64();
        let share = seconds / tickets.len() as f64;
        let mut groups = Vec::with_capacity(tickets.len());
        let mut stats = self.stats.lock().unwrap_or_else(PoisonError::into_inner);
        stats.wait_seconds += wait_seconds;
        stats.generate_seconds += seconds;
        stats.engine_calls += tickets.len() as u64;
        for (ticket, result) in tickets.into_iter().zip(results) {
            let samples = match result? {
                Ok(samples) => {
                    stats.groups += 1;
                    stats.samples += samples.len() as u64;
                    stats.prefill_tokens += ticket.task.prompt_ids.len() as u64;
                    for sample in &samples {
                        stats.generated_tokens += sample.completion_ids.len() as u64;
                        if sample.token_versions.first() != sample.token_versions.last() {
                            stats.samples_spanning_versions += 1;
                        }
                    }
                    samples
                }
                Err(rejection) => {
                    stats.rejected_tickets += 1;
                    stats.last_rejection = Some(rejection);
                    Vec::new()
                }
            };
            groups.push(RolloutGroup {
                ticket,
                samples,
                generate_seconds: share,
            });
        }
        Ok(groups)
    }

    fn stats(&self) -> RolloutStats {
        self.stats
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    fn remote_stats(&self) -> Option<RemoteStats> {
        Some(self.pool.stats())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn choice(versions: Value) -> Value {
        json!({
            "index": 0,
            "text": "42",
            "token_ids": [5, 6, 2],
            "logprobs": {"token_logprobs": [-0.5, -0.25, -0.125]},
            "finish_reason": "stop",
            "stop_reason": null,
            "weight_versions": versions,
        })
    }

    #[test]
    fn a_choice_becomes_a_sample_in_session_versions() {
        let sample = parse_choice(&choice(json!([7, 7, 8])), 7, 5, None, 10).unwrap();
        assert_eq!(sample.completion_ids, vec![5, 6, 2]);
        assert_eq!(sample.rollout_logprobs, vec![-0.5, -0.25, -0.125]);
        assert_eq!(
            sample.token_versions,
            vec![PolicyVersion(2), PolicyVersion(2), PolicyVersion(3)]
        );
        assert_eq!(sample.finish, FinishReason::Eos { token_id: 2 });
    }

    #[test]
    fn broken_answers_are_refused_with_the_reason() {
        let stale = parse_choice(&choice(json!([6, 6, 6])), 7, 5, None, 10).unwrap_err();
        assert!(stale.contains("missed a weight update"), "{stale}");
        let short = parse_choice(&choice(json!([7, 7])), 7, 5, None, 10).unwrap_err();
        assert!(short.contains("2 weight versions for 3 tokens"), "{short}");
        let down = parse_choice(&choice(json!([8, 7, 7])), 7, 5, None, 10).unwrap_err();
        assert!(down.contains("go down"), "{down}");
        let vocab = parse_choice(&choice(json!([7, 7, 7])), 7, 5, None, 6).unwrap_err();
        assert!(vocab.contains("not in the vocabulary"), "{vocab}");
        let mut nan = choice(json!([7, 7, 7]));
        nan["logprobs"]["token_logprobs"][1] = Value::Null;
        let nan = parse_choice(&nan, 7, 5, None, 10).unwrap_err();
        assert!(nan.contains("not a finite number"), "{nan}");
    }

    #[test]
    fn without_reported_versions_the_held_version_is_used() {
        let mut vllm = choice(Value::Null);
        vllm.as_object_mut().unwrap().remove("weight_versions");
        let sample = parse_choice(&vllm, 5, 5, Some(6), 10).unwrap();
        assert_eq!(sample.token_versions, vec![PolicyVersion(1); 3]);
        assert!(parse_choice(&vllm, 5, 5, None, 10).is_err());
    }

    #[test]
    fn group_seeds_differ_by_group_and_are_non_negative() {
        let seeds: Vec<i64> = (0..100).map(|g| group_seed(3, g)).collect();
        assert!(seeds.iter().all(|&s| s >= 0));
        let mut unique = seeds.clone();
        unique.sort_unstable();
        unique.dedup();
        assert_eq!(unique.len(), seeds.len());
    }
}
