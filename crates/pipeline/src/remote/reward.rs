//! Remote reward: `stoke reward-server` (the run's verifiers and their sandbox behind HTTP, on a
//! machine of their own) and [`RemoteRewards`], the reward module over a pool of them.
//!
//! The exchange (JSON):
//! - `GET /health`: 200 while serving.
//! - `GET /info`: `{"rewards": [names], "isolation": "<the sandbox's level on that machine>",
//!   "workers": N, "timeout_s": T}`.
//! - `POST /score`: one group, `{"reward": NAME, "task": ID, "prompt": TEXT, "reference": {...},
//!   "samples": [{"text", "completion_ids", "finish": "stop"|"length"}]}`, answered with
//!   `{"rewards": [{"score", "outcome", "components": [[name, score]], "failure": null |
//!   "timed_out" | {"panicked": MESSAGE}}], "seconds": S}`: one reward per sample, in order.
//!   A malformed body or an unknown reward name gets a 4xx naming the field; the server keeps
//!   serving.
//!
//! What the server is: the same [`RewardPool`] as a local run (worker threads that survive
//! verifiers that panic or hang), so a verdict is the same wherever it is computed. What the
//! client adds: retries on another server when one fails (`servers.rs`), and a check before the
//! first step that every server has every reward the run names.

use std::net::SocketAddr;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::Duration;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::StatusCode;
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::{Deserialize, Serialize};
use serde_json::json;
use stoke_reward::{Outcome, Reference};
use stoke_rollout::{Completion, FinishReason};
use stoke_serve::HttpServer;
use stoke_serve::client::Client;

use crate::error::PipelineError;
use crate::records::{RewardFailure, RolloutGroup, SampleReward, ScoredGroup, Task};
use crate::remote::servers::{ServerPool, Work, health, wait_until_answering};
use crate::reward::{RewardPool, RewardPoolStats, RewardSpec};
use crate::service::{RemoteStats, RewardService};
use crate::settings::PoolSettings;

/// One sample as sent to a reward server.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct WireSample {
    pub text: String,
    #[serde(default)]
    pub completion_ids: Vec<u32>,
    /// `stop` or `length`.
    #[serde(default)]
    pub finish: Option<String>,
}

/// `POST /score`'s body.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ScoreRequest {
    pub reward: String,
    #[serde(default)]
    pub task: String,
    pub prompt: String,
    #[serde(default)]
    pub reference: Reference,
    pub samples: Vec<WireSample>,
}

/// Why a sample got no verdict, on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WireFailure {
    TimedOut,
    Panicked(String),
}

/// One sample's reward on the wire.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct WireReward {
    pub score: f64,
    pub outcome: Outcome,
    #[serde(default)]
    pub components: Vec<(String, f64)>,
    #[serde(default)]
    pub failure: Option<WireFailure>,
    /// LLM-judge rewards: the judge's figures for the sample (absent from older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub judge: Option<stoke_reward::JudgeFigures>,
    /// Process rewards: the scored steps (absent from older servers).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<Vec<stoke_reward::StepScore>>,
}

/// `POST /score`'s answer.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub struct ScoreAnswer {
    pub rewards: Vec<WireReward>,
    pub seconds: f64,
}

impl From<&SampleReward> for WireReward {
    fn from(reward: &SampleReward) -> WireReward {
        WireReward {
            score: reward.score,
            outcome: reward.outcome,
            components: reward.components.clone(),
            failure: reward.failure.as_ref().map(|f| match f {
                RewardFailure::TimedOut => WireFailure::TimedOut,
                RewardFailure::Panicked(m) => WireFailure::Panicked(m.clone()),
                // Applied on the trainer's side after scoring (`episode::EpisodeRewards`); a
                // reward server never sees one, but the wire keeps the message if it did.
                RewardFailure::Environment(m) => {
                    WireFailure::Panicked(format!("environment failed: {m}"))
                }
            }),
            judge: reward.judge,
            steps: reward.steps.clone(),
        }
    }
}

impl WireReward {
    fn into_sample_reward(self) -> Result<SampleReward, String> {
        if !self.score.is_finite() || self.components.iter().any(|(_, s)| !s.is_finite()) {
            return Err(format!("a non-finite score ({})", self.score));
        }
        Ok(SampleReward {
            score: self.score,
            outcome: self.outcome,
            components: self.components,
            failure: self.failure.map(|f| match f {
                WireFailure::TimedOut => RewardFailure::TimedOut,
                WireFailure::Panicked(m) => RewardFailure::Panicked(m),
            }),
            judge: self.judge,
            steps: self.steps,
        })
    }
}

/// A group as a reward server receives it, ready for a [`RewardPool`]: an offline group (no
/// permit, no token versions), as rejection sampling scores.
fn group_of(request: ScoreRequest, reward: usize) -> RolloutGroup {
    let task = Arc::new(Task {
        id: request.task,
        prompt: request.prompt,
        prompt_ids: Vec::new(),
        reference: request.reference,
        reward,
        data: Default::default(),
    });
    let completions = request
        .samples
        .into_iter()
        .enumerate()
        .map(|(sample_index, s)| Completion {
            prompt_index: 0,
            sample_index,
            finish_reason: match s.finish.as_deref() {
                Some("length") => FinishReason::Length,
                _ => FinishReason::Eos {
                    token_id: s.completion_ids.last().copied().unwrap_or(0),
                },
            },
            token_ids: s.completion_ids,
            logprobs: Vec::new(),
            text: Some(s.text),
        })
        .collect();
    RolloutGroup::offline(0, task, 1.0, completions)
}

/// How to run a reward server.
#[derive(Debug)]
pub struct RewardServerConfig {
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    pub rewards: Vec<RewardSpec>,
    pub workers: usize,
    pub timeout: Duration,
    /// The sandbox's isolation level on this machine, as reported by `/info`.
    pub isolation: String,
}

struct RewardApp {
    pool: RewardPool,
    names: Vec<String>,
    isolation: String,
    workers: usize,
    timeout: Duration,
}

/// A reward server on its own threads; [`RunningRewardServer::stop`] (or drop) stops it.
#[derive(Debug)]
pub struct RunningRewardServer {
    pub addr: SocketAddr,
    http: HttpServer,
}

fn error(status: StatusCode, field: &str, message: String) -> Response {
    (
        status,
        axum::Json(json!({"error": {"message": message, "param": field, "code": status.as_u16()}})),
    )
        .into_response()
}

async fn score(State(app): State<Arc<RewardApp>>, body: Bytes) -> Response {
    let deserializer = &mut serde_json::Deserializer::from_slice(&body);
    let request: ScoreRequest = match serde_path_to_error::deserialize(deserializer) {
        Ok(request) => request,
        Err(e) => {
            let path = e.path().to_string();
            return error(
                StatusCode::BAD_REQUEST,
                &path,
                format!("{path}: {}", e.inner()),
            );
        }
    };
    let Some(index) = app.names.iter().position(|n| *n == request.reward) else {
        return error(
            StatusCode::BAD_REQUEST,
            "reward",
            format!(
                "unknown reward `{}`; this server has {}",
                request.reward,
                app.names.join(", ")
            ),
        );
    };
    let group = group_of(request, index);
    let worker = Arc::clone(&app);
    match tokio::task::spawn_blocking(move || worker.pool.score(group)).await {
        Ok(scored) => axum::Json(ScoreAnswer {
            rewards: scored.rewards.iter().map(WireReward::from).collect(),
            seconds: scored.reward_seconds,
        })
        .into_response(),
        Err(e) => error(
            StatusCode::INTERNAL_SERVER_ERROR,
            "",
            format!("scoring stopped: {e}"),
        ),
    }
}

async fn info(State(app): State<Arc<RewardApp>>) -> Response {
    axum::Json(json!({
        "rewards": app.names,
        "isolation": app.isolation,
        "workers": app.workers,
        "timeout_s": app.timeout.as_secs_f64(),
    }))
    .into_response()
}

impl RunningRewardServer {
    /// Starts the verifiers' pool, binds `host:port` and serves until `stop` (or Ctrl-C when
    /// `ctrl_c`).
    pub fn start(config: RewardServerConfig, ctrl_c: bool) -> Result<RunningRewardServer, String> {
        let address = format!("{}:{}", config.host, config.port);
        let names = config.rewards.iter().map(|r| r.name.clone()).collect();
        let pool = RewardPool::new(config.rewards, config.workers, config.timeout)
            .map_err(|e| e.to_string())?;
        let app = Arc::new(RewardApp {
            pool,
            names,
            isolation: config.isolation,
            workers: config.workers,
            timeout: config.timeout,
        });
        let router = Router::new()
            .route("/score", post(score))
            .route("/info", get(info))
            .route(
                "/health",
                get(|| async { axum::Json(json!({"status": "ok"})) }),
            )
            .layer(DefaultBodyLimit::max(64 << 20))
            .with_state(app);
        let http = HttpServer::start(&address, router, "stoke-reward-server", ctrl_c)?;
        Ok(RunningRewardServer {
            addr: http.addr,
            http,
        })
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        self.http.url()
    }

    pub fn stop(self) {
        self.http.stop();
    }

    /// Blocks until the server stops (Ctrl-C for one started with `ctrl_c`).
    pub fn wait(self) {
        self.http.wait();
    }
}

/// The reward module over a pool of reward servers.
pub struct RemoteRewards {
    pool: ServerPool,
    /// The run's reward names in index order (`Task::reward` indexes this).
    names: Vec<String>,
    stats: Mutex<RewardPoolStats>,
}

impl std::fmt::Debug for RemoteRewards {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RemoteRewards")
            .field("pool", &self.pool)
            .field("names", &self.names)
            .finish_non_exhaustive()
    }
}

impl RemoteRewards {
    /// Checks every server before the first step: it answers `/info` and has every reward in
    /// `names` (the run's rewards, in index order). Prints each server's isolation level.
    pub fn connect(
        settings: PoolSettings,
        names: Vec<String>,
    ) -> Result<RemoteRewards, PipelineError> {
        for url in &settings.servers {
            let refuse = |reason: String| PipelineError::Remote {
                service: "reward",
                reason: format!("{url}: {reason}"),
            };
            let client = Client::with_timeout(url, Some(settings.timeout));
            wait_until_answering(&client, settings.startup_wait)
                .map_err(|e| refuse(format!("does not answer: {e}")))?;
            let (status, info) = client
                .get("/info")
                .map_err(|e| refuse(format!("does not answer: {e}")))?;
            if status != 200 {
                return Err(refuse(format!("/info answered {status}")));
            }
            let served: Vec<&str> = info["rewards"]
                .as_array()
                .into_iter()
                .flatten()
                .filter_map(|n| n.as_str())
                .collect();
            if let Some(missing) = names.iter().find(|n| !served.contains(&n.as_str())) {
                return Err(refuse(format!(
                    "has no reward `{missing}` (it has {}); start it with the run's [rewards]",
                    served.join(", ")
                )));
            }
            eprintln!(
                "reward server {url}: rewards {}; sandbox isolation {}",
                served.join(", "),
                info["isolation"].as_str().unwrap_or("unknown")
            );
        }
        Ok(RemoteRewards {
            pool: ServerPool::new("reward", settings, Box::new(health)),
            names,
            stats: Mutex::new(RewardPoolStats::default()),
        })
    }

    fn request(client: &Client, body: &ScoreRequest) -> Result<(Vec<SampleReward>, f64), String> {
        let value = serde_json::to_value(body).map_err(|e| e.to_string())?;
        let (status, answer) = client.post("/score", &value).map_err(|e| e.to_string())?;
        if status != 200 {
            return Err(format!(
                "/score answered {status}: {}",
                answer.to_string().chars().take(300).collect::<String>()
            ));
        }
        let answer: ScoreAnswer =
            serde_json::from_value(answer).map_err(|e| format!("/score's answer: {e}"))?;
        if answer.rewards.len() != body.samples.len() {
            return Err(format!(
                "{} rewards for {} samples",
                answer.rewards.len(),
                body.samples.len()
            ));
        }
        let rewards = answer
            .rewards
            .into_iter()
            .map(WireReward::into_sample_reward)
            .collect::<Result<Vec<_>, _>>()?;
        Ok((rewards, answer.seconds))
    }
}

impl RewardService for RemoteRewards {
    fn score(&self, group: RolloutGroup) -> Result<ScoredGroup, PipelineError> {
        let started = std::time::Instant::now();
        let task = &group.ticket.task;
        let count = group.samples.len();
        let Some(name) = self.names.get(task.reward) else {
            let reason = format!(
                "task `{}` asks for reward index {}, but only {} rewards are configured",
                task.id,
                task.reward,
                self.names.len()
            );
            self.lock().unknown_reward += count as u64;
            let rewards = vec![SampleReward::failed(RewardFailure::Panicked(reason)); count];
            return Ok(ScoredGroup::new(group, rewards, 0.0));
        };
        if count == 0 {
            return Ok(ScoredGroup::new(group, Vec::new(), 0.0));
        }
        let body = ScoreRequest {
            reward: name.clone(),
            task: task.id.clone(),
            prompt: task.prompt.clone(),
            reference: task.reference.clone(),
            samples: group
                .samples
                .iter()
                .map(|s| WireSample {
                    text: s.text.clone(),
                    completion_ids: s.completion_ids.clone(),
                    finish: Some(if s.truncated() { "length" } else { "stop" }.into()),
                })
                .collect(),
        };
        let (rewards, busy) = self.pool.call(
            &format!("rewards of group {}", group.ticket.group_id),
            |_, client| {
                let answer = Self::request(client, &body)?;
                Ok((
                    answer,
                    Work {
                        samples: count as u64,
                        tokens: 0,
                    },
                ))
            },
        )?;
        {
            let mut stats = self.lock();
            for reward in &rewards {
                match reward.failure {
                    None => stats.scored += 1,
                    Some(RewardFailure::TimedOut) => stats.timeouts += 1,
                    Some(RewardFailure::Panicked(_) | RewardFailure::Environment(_)) => {
                        stats.panics += 1
                    }
                }
            }
            stats.busy_seconds += busy;
        }
        Ok(ScoredGroup::new(
            group,
            rewards,
            started.elapsed().as_secs_f64(),
        ))
    }

    fn stats(&self) -> RewardPoolStats {
        *self.lock()
    }

    fn reward_name(&self, index: usize) -> Option<String> {
        self.names.get(index).cloned()
    }

    fn remote_stats(&self) -> Option<RemoteStats> {
        Some(self.pool.stats())
    }
}

impl RemoteRewards {
    fn lock(&self) -> std::sync::MutexGuard<'_, RewardPoolStats> {
        self.stats.lock().unwrap_or_else(PoisonError::into_inner)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn judge_figures_cross_the_wire_and_older_answers_still_read() {
        let reward = SampleReward {
            score: 0.75,
            outcome: Outcome::Shaped,
            components: Vec::new(),
            failure: None,
            judge: Some(stoke_reward::JudgeFigures {
                calls: 3,
                cache_hits: 1,
                retries: 1,
                servers_skipped: 2,
                latency_s: 0.5,
                compared_pairs: 2,
                consistent_pairs: 1,
            }),
            steps: Some(vec![stoke_reward::StepScore {
                start: 0,
                end: 3,
                score: 0.5,
            }]),
        };
        let text = serde_json::to_string(&WireReward::from(&reward)).unwrap();
        let back: WireReward = serde_json::from_str(&text).unwrap();
        assert_eq!(back.into_sample_reward().unwrap(), reward);
        // An answer from a server that predates the field.
        let old: WireReward =
            serde_json::from_str(r#"{"score": 1.0, "outcome": "unparseable_verdict"}"#).unwrap();
        assert_eq!(old.judge, None);
        assert_eq!(old.outcome, Outcome::UnparseableVerdict);
    }
}
