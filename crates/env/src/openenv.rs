//! OpenEnv environment servers as stoke environments: an episode is one OpenEnv session.
//!
//! What it is: [`OpenEnvEnvironment`], a client of the session protocol that OpenEnv's own
//! server (`openenv-core`, `openenv.core.env_server.create_app`) serves at `/ws`, the protocol
//! its Python `EnvClient` speaks and the Hugging Face hub's OpenEnv environments serve. Each
//! episode opens one WebSocket session (the server makes one environment instance per session),
//! resets it, turns every model turn into one `step`, and closes the session when it ends.
//!
//! Why the session endpoint and not `POST /reset` / `POST /step`: in openenv-core 0.3 those HTTP
//! endpoints build a fresh environment for every request and close it after answering, so a
//! `step` never sees the state its `reset` made; only `/ws` keeps one environment across the
//! calls of an episode. The HTTP side is used only for `GET /health` and `GET /schema`, once,
//! when the environment is built ([`OpenEnvEnvironment::connect`]).
//!
//! The mapping, message by message (client → server, then the server's answer):
//! - `{"type": "reset", "data": {"seed": S, "episode_id": "ID#N", ...task.data}}` once per
//!   episode. `S` is the task's `data.seed` when it has one, else drawn from the task id (so the
//!   samples of a GRPO group, which share one prompt, start in the same state); the task's other
//!   `data` fields are further reset arguments (the server passes on those its `reset` accepts).
//! - `{"type": "step", "data": {ACTION_FIELD: turn text}}` per model turn: the action holds the
//!   model's whole turn text (`action_field`, default `message`, the field of the generic text
//!   environments such as the echo template's).
//! - The answer `{"type": "observation", "data": {"observation": {...}, "reward": r, "done": d}}`
//!   becomes the step's per-turn reward (`null` is 0, a boolean 0 or 1), its `done`, and — while
//!   not done — one user message: the observation's `observation_field` (a string as is, any
//!   other value as JSON), or the whole observation object as JSON when no field is named.
//!   `{"type": "error", ...}` is an error naming the URL, the server's message and code.
//! - The opening is the task's prompt as one user message (`opening = "task"`), or the text of
//!   the reset observation (`opening = "reset"`: a throwaway session is reset with the task's
//!   arguments to read it; this needs an environment deterministic in its reset arguments, as a
//!   group's samples share the prompt). With `opening = "task"` the reset observation is not
//!   shown.
//!
//! What it is not: a TLS client (plain `http://` / `ws://` only: run a hub environment's
//! container locally, or reach it through a local proxy), a client of OpenEnv's MCP actions
//! (`list_tools` / `call_tool`: the model's text goes into one action field, no tool calls are
//! parsed), or a scheduler: the server must admit as many concurrent sessions as the run has
//! live episodes (`max_concurrent_envs` on the server side), or the surplus episodes fail with
//! the server's `CAPACITY_REACHED`.
//!
//! Failure: any network error, non-101 handshake, closed socket, malformed or unexpected JSON is
//! an [`EnvError`] naming the URL and the field; it ends only the episode whose call it was (the
//! pipeline records `EnvFailed`), and its session is dropped. Every socket read and write is
//! bounded by the timeout the environment was built with, so a server that hangs never holds a
//! thread forever.

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpStream, ToSocketAddrs};
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use serde::{Deserialize, Serialize};
use serde_json::{Map, Value, json};
use stoke_tokenizer::chat::ChatMessage;
use tungstenite::{Message, WebSocket};

use crate::environment::{EnvStep, EnvTask, Environment, Episode, ModelTurn, Opening, StopReason};
use crate::error::EnvError;

const NAME: &str = "openenv";

/// Where an episode's opening user message comes from.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OpenEnvOpening {
    /// The task's prompt.
    #[default]
    Task,
    /// The observation the server answers a reset with.
    Reset,
}

/// How to reach an OpenEnv server and map its actions and observations (`[environment.openenv]`).
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OpenEnvSpec {
    /// The server's base URL, `http://host:port` (`ws://` accepted; the session endpoint is
    /// `/ws` below it).
    pub url: String,
    /// The action field that carries the model's turn text.
    #[serde(default = "default_action_field")]
    pub action_field: String,
    /// The observation field shown to the model; none: the whole observation as JSON.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub observation_field: Option<String>,
    /// Where the opening user message comes from.
    #[serde(default)]
    pub opening: OpenEnvOpening,
}

fn default_action_field() -> String {
    "message".to_string()
}

impl OpenEnvSpec {
    /// A spec for `url` with the defaults.
    pub fn new(url: impl Into<String>) -> OpenEnvSpec {
        OpenEnvSpec {
            url: url.into(),
            action_field: default_action_field(),
            observation_field: None,
            opening: OpenEnvOpening::Task,
        }
    }

    /// Checks the values without contacting the server; errors name the key.
    pub fn check(&self) -> Result<(), EnvError> {
        Endpoint::parse(&self.url)?;
        if self.action_field.trim().is_empty() {
            return Err(EnvError::config("action_field", "must not be empty"));
        }
        if self
            .observation_field
            .as_deref()
            .is_some_and(|field| field.trim().is_empty())
        {
            return Err(EnvError::config(
                "observation_field",
                "must not be empty (leave it out to show the whole observation)",
            ));
        }
        Ok(())
    }
}

/// The server's addresses, derived from the configured base URL.
#[derive(Clone, Debug, PartialEq)]
struct Endpoint {
    /// `http://host:port[/prefix]`, for `/health` and `/schema`.
    http: String,
    /// `ws://host:port[/prefix]/ws`, the session endpoint.
    ws: String,
    host: String,
    port: u16,
}

impl Endpoint {
    fn parse(url: &str) -> Result<Endpoint, EnvError> {
        let bad = |why: &str| EnvError::config("url", format!("{url:?}: {why}"));
        let trimmed = url.trim();
        let rest = if let Some(rest) = trimmed.strip_prefix("http://") {
            rest.trim_end_matches('/')
        } else if let Some(rest) = trimmed.strip_prefix("ws://") {
            let rest = rest.trim_end_matches('/');
            rest.strip_suffix("/ws").unwrap_or(rest)
        } else if trimmed.starts_with("https://") || trimmed.starts_with("wss://") {
            return Err(bad(
                "TLS is not built in; reach the server over plain http:// (run the environment's \
                 container locally, or through a local proxy)",
            ));
        } else {
            return Err(bad("must start with http:// (or ws://)"));
        };
        let authority = rest.split('/').next().unwrap_or_default();
        if authority.is_empty() || authority.contains('@') {
            return Err(bad("needs a host (and no user info)"));
        }
        let (host, port) = match authority.rsplit_once(':') {
            Some((host, port)) if !port.contains(']') => (
                host,
                port.parse::<u16>()
                    .map_err(|_| bad(&format!("port {port:?} is not a port number")))?,
            ),
            _ => (authority, 80),
        };
        let host = host.trim_start_matches('[').trim_end_matches(']');
        if host.is_empty() {
            return Err(bad("needs a host"));
        }
        Ok(Endpoint {
            http: format!("http://{rest}"),
            ws: format!("ws://{rest}/ws"),
            host: host.to_string(),
            port,
        })
    }
}

/// An OpenEnv server as an environment; see the module doc.
#[derive(Debug)]
pub struct OpenEnvEnvironment {
    spec: OpenEnvSpec,
    endpoint: Endpoint,
    timeout: Duration,
    /// Episodes started, for unique `episode_id`s.
    started: AtomicU64,
}

impl OpenEnvEnvironment {
    /// The environment for `spec`, without contacting the server. `timeout` bounds connecting
    /// and every socket read and write of a session.
    pub fn new(spec: OpenEnvSpec, timeout: Duration) -> Result<OpenEnvEnvironment, EnvError> {
        spec.check()?;
        let endpoint = Endpoint::parse(&spec.url)?;
        Ok(OpenEnvEnvironment {
            spec,
            endpoint,
            timeout,
            started: AtomicU64::new(0),
        })
    }

    /// [`OpenEnvEnvironment::new`], then asks the server's `/health` (it must answer
    /// `healthy`) and `/schema` (the action schema must have `action_field` and require no other
    /// field), so a wrong URL or action field fails before any episode.
    pub fn connect(spec: OpenEnvSpec, timeout: Duration) -> Result<OpenEnvEnvironment, EnvError> {
        let env = OpenEnvEnvironment::new(spec, timeout)?;
        let agent: ureq::Agent = ureq::Agent::config_builder()
            .http_status_as_error(false)
            .timeout_global(Some(timeout))
            .build()
            .into();
        let health = env.get(&agent, "/health")?;
        if health.get("status").and_then(Value::as_str) != Some("healthy") {
            return Err(env.http_error("/health", format!("status is not \"healthy\": {health}")));
        }
        let schema = env.get(&agent, "/schema")?;
        env.check_action_schema(&schema)?;
        Ok(env)
    }

    /// The configured spec.
    pub fn spec(&self) -> &OpenEnvSpec {
        &self.spec
    }

    /// The session endpoint (`ws://.../ws`).
    pub fn session_url(&self) -> &str {
        &self.endpoint.ws
    }

    fn http_error(&self, path: &str, message: impl std::fmt::Display) -> EnvError {
        EnvError::failed(NAME, format!("{}{path}: {message}", self.endpoint.http))
    }

    fn get(&self, agent: &ureq::Agent, path: &str) -> Result<Value, EnvError> {
        let url = format!("{}{path}", self.endpoint.http);
        let mut response = agent
            .get(&url)
            .call()
            .map_err(|e| self.http_error(path, e))?;
        let status = response.status().as_u16();
        let text = response
            .body_mut()
            .read_to_string()
            .map_err(|e| self.http_error(path, e))?;
        if status != 200 {
            return Err(self.http_error(path, format!("status {status}: {}", clip(&text))));
        }
        serde_json::from_str(&text)
            .map_err(|e| self.http_error(path, format!("not JSON ({e}): {}", clip(&text))))
    }

    /// The `/schema` answer's `action` schema takes `action_field` and needs nothing else.
    fn check_action_schema(&self, schema: &Value) -> Result<(), EnvError> {
        let Some(action) = schema.get("action") else {
            return Err(self.http_error("/schema", "no `action` schema in the answer"));
        };
        let field = &self.spec.action_field;
        if let Some(properties) = action.get("properties").and_then(Value::as_object)
            && !properties.contains_key(field)
        {
            let names: Vec<&str> = properties.keys().map(String::as_str).collect();
            return Err(EnvError::config(
                "action_field",
                format!(
                    "{field:?} is not a field of the action of {} (its fields: {})",
                    self.endpoint.http,
                    names.join(", ")
                ),
            ));
        }
        let required: Vec<&str> = action
            .get("required")
            .and_then(Value::as_array)
            .map(|names| names.iter().filter_map(Value::as_str).collect())
            .unwrap_or_default();
        let others: Vec<&str> = required.into_iter().filter(|n| n != field).collect();
        if !others.is_empty() {
            return Err(EnvError::config(
                "action_field",
                format!(
                    "the action of {} also requires {} (stoke fills only {field:?}, with the \
                     model's text)",
                    self.endpoint.http,
                    others.join(", ")
                ),
            ));
        }
        Ok(())
    }

    /// The reset arguments of an episode on `task`; see the module doc.
    fn reset_data(&self, task: &EnvTask, episode: Option<u64>) -> Value {
        let mut data = Map::new();
        data.insert("seed".into(), json!(task_seed(&task.id)));
        let id = match episode {
            Some(n) => format!("{}#{n}", task.id),
            None => task.id.clone(),
        };
        data.insert("episode_id".into(), json!(id));
        for (key, value) in &task.data {
            data.insert(key.clone(), value.clone());
        }
        Value::Object(data)
    }

    /// A fresh session, reset for `task`: the session and the reset observation.
    fn open_session(
        &self,
        task: &EnvTask,
        episode: Option<u64>,
    ) -> Result<(Session, Value), EnvError> {
        let mut session = Session::connect(&self.endpoint, self.timeout)?;
        let answer = session.call(
            "reset",
            &json!({"type": "reset", "data": self.reset_data(task, episode)}),
        )?;
        let result = StepResult::parse(&session.url, "reset", &answer)?;
        Ok((session, result.observation))
    }
}

/// The text shown for `observation`: its `field` (a string as is, any other value as JSON), or
/// the whole observation as JSON; a missing field is an error naming it.
fn observation_text(
    field: Option<&str>,
    observation: &Value,
    url: &str,
    call: &str,
) -> Result<String, EnvError> {
    let value = match field {
        None => observation,
        Some(field) => observation.get(field).ok_or_else(|| {
            let keys: Vec<&str> = observation
                .as_object()
                .map(|o| o.keys().map(String::as_str).collect())
                .unwrap_or_default();
            EnvError::failed(
                NAME,
                format!(
                    "{url} {call}: the observation has no field {field:?} (observation_field; \
                     its fields: {})",
                    keys.join(", ")
                ),
            )
        })?,
    };
    Ok(match value {
        Value::String(text) => text.clone(),
        other => other.to_string(),
    })
}

/// The seed of a task without `data.seed`: FNV-1a of its id, below 2^31 (any seeding API takes
/// it), stable across runs and platforms.
fn task_seed(id: &str) -> u64 {
    let hash = id.bytes().fold(0xcbf2_9ce4_8422_2325u64, |h, b| {
        (h ^ u64::from(b)).wrapping_mul(0x100_0000_01b3)
    });
    hash % (1 << 31)
}

/// At most 300 characters of `text`, for error messages.
fn clip(text: &str) -> String {
    const MAX: usize = 300;
    match text.char_indices().nth(MAX) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

impl Environment for OpenEnvEnvironment {
    fn name(&self) -> &str {
        NAME
    }

    fn opening(&self, task: &EnvTask) -> Result<Opening, EnvError> {
        let text = match self.spec.opening {
            OpenEnvOpening::Task => task.prompt.clone(),
            OpenEnvOpening::Reset => {
                let (session, observation) = self.open_session(task, None)?;
                session.close();
                observation_text(
                    self.spec.observation_field.as_deref(),
                    &observation,
                    &self.endpoint.ws,
                    "reset",
                )?
            }
        };
        Ok(Opening {
            messages: vec![ChatMessage::user(text)],
            tools: Vec::new(),
        })
    }

    fn start(&self, task: &EnvTask) -> Result<Box<dyn Episode>, EnvError> {
        let n = self.started.fetch_add(1, Ordering::Relaxed);
        let (session, _observation) = self.open_session(task, Some(n))?;
        Ok(Box::new(OpenEnvEpisode {
            session: Some(session),
            url: self.endpoint.ws.clone(),
            action_field: self.spec.action_field.clone(),
            observation_field: self.spec.observation_field.clone(),
        }))
    }
}

/// One episode: a live session.
struct OpenEnvEpisode {
    /// `None` once closed or failed.
    session: Option<Session>,
    /// The session endpoint, for errors.
    url: String,
    action_field: String,
    observation_field: Option<String>,
}

impl Episode for OpenEnvEpisode {
    fn step(&mut self, turn: &ModelTurn<'_>) -> Result<EnvStep, EnvError> {
        let Some(session) = self.session.as_mut() else {
            return Err(EnvError::failed(
                NAME,
                format!("{}: the session is closed", self.url),
            ));
        };
        let mut action = Map::new();
        action.insert(self.action_field.clone(), json!(turn.text));
        let message = json!({"type": "step", "data": Value::Object(action)});
        let answered = session
            .call("step", &message)
            .and_then(|answer| StepResult::parse(&session.url, "step", &answer));
        let result = match answered {
            Ok(result) => result,
            Err(error) => {
                // The session is in an unknown state: drop it; the episode is over.
                self.session = None;
                return Err(error);
            }
        };
        let messages = if result.done {
            Vec::new()
        } else {
            vec![ChatMessage::user(observation_text(
                self.observation_field.as_deref(),
                &result.observation,
                &self.url,
                "step",
            )?)]
        };
        let mut metadata = BTreeMap::new();
        metadata.insert("openenv_reward".to_string(), result.raw_reward);
        Ok(EnvStep {
            messages,
            reward: result.reward,
            done: result.done,
            tool_calls: Vec::new(),
            metadata,
        })
    }

    fn finish(&mut self, _stop: &StopReason) -> Result<f64, EnvError> {
        if let Some(session) = self.session.take() {
            session.close();
        }
        Ok(0.0)
    }
}

/// The `data` of an observation answer.
struct StepResult {
    observation: Value,
    reward: f64,
    raw_reward: Value,
    done: bool,
}

impl StepResult {
    fn parse(url: &str, call: &str, answer: &Value) -> Result<StepResult, EnvError> {
        let bad = |what: String| EnvError::failed(NAME, format!("{url} {call}: {what}"));
        let data = answer
            .get("data")
            .filter(|d| d.is_object())
            .ok_or_else(|| {
                bad(format!(
                    "the answer has no `data` object: {}",
                    clip(&answer.to_string())
                ))
            })?;
        let observation = data
            .get("observation")
            .filter(|o| o.is_object())
            .cloned()
            .ok_or_else(|| bad("`data.observation` is missing or not an object".into()))?;
        let raw_reward = data.get("reward").cloned().unwrap_or(Value::Null);
        let reward = match &raw_reward {
            Value::Null => 0.0,
            Value::Bool(b) => f64::from(u8::from(*b)),
            Value::Number(n) => n
                .as_f64()
                .filter(|r| r.is_finite())
                .ok_or_else(|| bad(format!("`data.reward` {n} is not a finite number")))?,
            other => return Err(bad(format!("`data.reward` is not a number: {other}"))),
        };
        let done = match data.get("done") {
            None | Some(Value::Null) => false,
            Some(Value::Bool(done)) => *done,
            Some(other) => return Err(bad(format!("`data.done` is not a boolean: {other}"))),
        };
        Ok(StepResult {
            observation,
            reward,
            raw_reward,
            done,
        })
    }
}

/// One WebSocket session with the server.
struct Session {
    socket: WebSocket<TcpStream>,
    url: String,
}

impl Session {
    fn connect(endpoint: &Endpoint, timeout: Duration) -> Result<Session, EnvError> {
        let url = endpoint.ws.clone();
        let fail = |what: String| EnvError::failed(NAME, format!("{url}: {what}"));
        let addresses: Vec<SocketAddr> = (endpoint.host.as_str(), endpoint.port)
            .to_socket_addrs()
            .map_err(|e| fail(format!("cannot resolve {}: {e}", endpoint.host)))?
            .collect();
        let mut last = None;
        let mut stream = None;
        for address in &addresses {
            match TcpStream::connect_timeout(address, timeout) {
                Ok(connected) => {
                    stream = Some(connected);
                    break;
                }
                Err(error) => last = Some(error),
            }
        }
        let stream = stream.ok_or_else(|| match last {
            Some(error) => fail(format!("cannot connect: {error}")),
            None => fail(format!("{} resolves to no address", endpoint.host)),
        })?;
        stream
            .set_read_timeout(Some(timeout))
            .and_then(|()| stream.set_write_timeout(Some(timeout)))
            .and_then(|()| stream.set_nodelay(true))
            .map_err(|e| fail(format!("socket options: {e}")))?;
        let (socket, _response) =
            tungstenite::client(url.as_str(), stream).map_err(|error| match error {
                tungstenite::HandshakeError::Failure(tungstenite::Error::Http(response)) => {
                    let body = response
                        .body()
                        .as_deref()
                        .map(String::from_utf8_lossy)
                        .unwrap_or_default();
                    fail(format!(
                        "the session handshake was answered with status {} {}",
                        response.status(),
                        clip(&body)
                    ))
                }
                tungstenite::HandshakeError::Failure(other) => {
                    fail(format!("session handshake: {other}"))
                }
                tungstenite::HandshakeError::Interrupted(_) => {
                    fail("session handshake: timed out".to_string())
                }
            })?;
        Ok(Session { socket, url })
    }

    /// Sends `message` and reads the answer; a `type: "error"` answer is an error.
    fn call(&mut self, call: &str, message: &Value) -> Result<Value, EnvError> {
        let url = self.url.clone();
        let fail = |what: String| EnvError::failed(NAME, format!("{url} {call}: {what}"));
        self.socket
            .send(Message::text(message.to_string()))
            .map_err(|e| fail(format!("cannot send: {}", socket_error(&e))))?;
        let text = loop {
            match self.socket.read() {
                Ok(Message::Text(text)) => break text.as_str().to_string(),
                Ok(Message::Binary(bytes)) => {
                    break String::from_utf8(bytes.to_vec())
                        .map_err(|_| fail("a binary answer that is not UTF-8".into()))?;
                }
                Ok(Message::Close(frame)) => {
                    let why = frame
                        .map(|f| format!(" ({} {})", f.code, f.reason))
                        .unwrap_or_default();
                    return Err(fail(format!("the server closed the session{why}")));
                }
                Ok(_) => continue, // ping, pong, raw frame: answered by tungstenite
                Err(e) => return Err(fail(format!("no answer: {}", socket_error(&e)))),
            }
        };
        let answer: Value = serde_json::from_str(&text)
            .map_err(|e| fail(format!("the answer is not JSON ({e}): {}", clip(&text))))?;
        match answer.get("type").and_then(Value::as_str) {
            Some("observation") => Ok(answer),
            Some("error") => {
                let data = answer.get("data").cloned().unwrap_or(Value::Null);
                let message = data
                    .get("message")
                    .and_then(Value::as_str)
                    .unwrap_or("(no message)");
                let code = data.get("code").and_then(Value::as_str).unwrap_or("?");
                Err(fail(format!(
                    "the server answered error {code}: {}",
                    clip(message)
                )))
            }
            other => Err(fail(format!(
                "the answer's `type` is {}, not \"observation\": {}",
                other.map_or("missing".to_string(), |t| format!("{t:?}")),
                clip(&text)
            ))),
        }
    }

    /// Ends the session politely (a `close` message, then the WebSocket close); best effort,
    /// bounded by the socket timeouts.
    fn close(mut self) {
        let _ = self
            .socket
            .send(Message::text(json!({"type": "close"}).to_string()));
        let _ = self.socket.close(None);
        // Read until the server's close answer (or an error) so the close handshake completes.
        for _ in 0..8 {
            if self.socket.read().is_err() {
                break;
            }
        }
    }
}

/// A socket error in words; a read timeout says so.
fn socket_error(error: &tungstenite::Error) -> String {
    match error {
        tungstenite::Error::Io(io)
            if matches!(
                io.kind(),
                std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut
            ) =>
        {
            "timed out".to_string()
        }
        tungstenite::Error::ConnectionClosed | tungstenite::Error::AlreadyClosed => {
            "the connection is closed".to_string()
        }
        other => other.to_string(),
    }
}

#[cfg(test)]
mod tests {
    use std::io::{Read, Write};
    use std::net::TcpListener;

    use super::*;

    fn turn(text: &str) -> ModelTurn<'_> {
        ModelTurn {
            index: 0,
            text,
            content: Some(text),
            tool_calls: &[],
        }
    }

    #[test]
    fn urls_map_to_the_session_endpoint_and_bad_ones_name_the_key() {
        let endpoint = Endpoint::parse("http://127.0.0.1:8000/").unwrap();
        assert_eq!(endpoint.ws, "ws://127.0.0.1:8000/ws");
        assert_eq!(endpoint.http, "http://127.0.0.1:8000");
        assert_eq!((endpoint.host.as_str(), endpoint.port), ("127.0.0.1", 8000));
        let endpoint = Endpoint::parse("ws://localhost:9/ws").unwrap();
        assert_eq!(endpoint.ws, "ws://localhost:9/ws");
        let endpoint = Endpoint::parse("http://[::1]:7000/env").unwrap();
        assert_eq!(endpoint.ws, "ws://[::1]:7000/env/ws");
        assert_eq!((endpoint.host.as_str(), endpoint.port), ("::1", 7000));
        assert_eq!(Endpoint::parse("http://example.org").unwrap().port, 80);
        for (url, why) in [
            ("https://x.hf.space", "TLS"),
            ("ftp://x", "http://"),
            ("http://", "host"),
            ("http://host:http", "port"),
        ] {
            let error = Endpoint::parse(url).unwrap_err();
            assert!(
                matches!(&error, EnvError::Config { key, message }
                    if key == "url" && message.contains(why)),
                "{url}: {error}"
            );
        }
        let error = OpenEnvSpec {
            action_field: " ".into(),
            ..OpenEnvSpec::new("http://h:1")
        }
        .check()
        .unwrap_err();
        assert!(matches!(error, EnvError::Config { key, .. } if key == "action_field"));
    }

    #[test]
    fn the_spec_reads_from_toml_with_defaults_and_refuses_unknown_keys() {
        let spec: OpenEnvSpec = serde_json::from_value(json!({"url": "http://h:1"})).unwrap();
        assert_eq!(spec, OpenEnvSpec::new("http://h:1"));
        assert_eq!(spec.action_field, "message");
        let error = serde_json::from_value::<OpenEnvSpec>(json!({"url": "u", "actionfield": "x"}))
            .unwrap_err()
            .to_string();
        assert!(error.contains("actionfield"), "{error}");
    }

    /// A one-session WebSocket server that answers each message with the next of `answers`
    /// (raw text), then closes.
    fn fake_server(answers: Vec<String>) -> String {
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (stream, _) = listener.accept().unwrap();
            let mut socket = tungstenite::accept(stream).unwrap();
            for answer in answers {
                if socket.read().is_err() {
                    return;
                }
                let _ = socket.send(Message::text(answer));
            }
            let _ = socket.close(None);
            let _ = socket.read();
        });
        format!("http://127.0.0.1:{port}")
    }

    fn plain_env(url: &str) -> OpenEnvEnvironment {
        OpenEnvEnvironment::new(OpenEnvSpec::new(url), Duration::from_secs(10)).unwrap()
    }

    const RESET: &str = r#"{"type":"observation",
        "data":{"observation":{"message":"ready"},"reward":null,"done":false}}"#;

    fn step_error(answer: &str) -> String {
        let url = fake_server(vec![RESET.into(), answer.into()]);
        let env = plain_env(&url);
        let mut episode = env.start(&EnvTask::default()).unwrap();
        let error = episode.step(&turn("hi")).unwrap_err().to_string();
        assert!(error.contains(env.session_url()), "{error}");
        // The failed session is dropped: the episode answers no more.
        assert!(
            episode
                .step(&turn("hi"))
                .unwrap_err()
                .to_string()
                .contains("closed")
        );
        error
    }

    #[test]
    fn malformed_or_refused_answers_are_errors_naming_the_url_and_field() {
        assert!(step_error("not json").contains("not JSON"));
        let error =
            step_error(r#"{"type":"error","data":{"message":"boom","code":"EXECUTION_ERROR"}}"#);
        assert!(
            error.contains("EXECUTION_ERROR") && error.contains("boom"),
            "{error}"
        );
        assert!(step_error(r#"{"type":"state","data":{}}"#).contains("`type`"));
        assert!(step_error(r#"{"type":"observation"}"#).contains("`data`"));
        assert!(
            step_error(r#"{"type":"observation","data":{"reward":1}}"#)
                .contains("data.observation")
        );
        assert!(
            step_error(r#"{"type":"observation","data":{"observation":{},"reward":"high"}}"#)
                .contains("data.reward")
        );
        assert!(
            step_error(r#"{"type":"observation","data":{"observation":{},"done":"yes"}}"#)
                .contains("data.done")
        );
        // The server closing the session mid-episode.
        let url = fake_server(vec![RESET.into()]);
        let env = plain_env(&url);
        let mut episode = env.start(&EnvTask::default()).unwrap();
        let error = episode.step(&turn("hi")).unwrap_err().to_string();
        assert!(error.contains(env.session_url()), "{error}");
    }

    #[test]
    fn boolean_and_missing_rewards_and_done_map_to_the_step() {
        let url = fake_server(vec![
            RESET.into(),
            r#"{"type":"observation",
                "data":{"observation":{"message":"a"},"reward":true,"done":false}}"#
                .into(),
            r#"{"type":"observation","data":{"observation":{"message":"b"},"done":true}}"#.into(),
        ]);
        let env = OpenEnvEnvironment::new(
            OpenEnvSpec {
                observation_field: Some("message".into()),
                ..OpenEnvSpec::new(&url)
            },
            Duration::from_secs(10),
        )
        .unwrap();
        let mut episode = env.start(&EnvTask::default()).unwrap();
        let step = episode.step(&turn("x")).unwrap();
        assert_eq!((step.reward, step.done), (1.0, false));
        assert_eq!(
            step.messages[0].content.as_ref().unwrap().joined_text(),
            "a"
        );
        let step = episode.step(&turn("y")).unwrap();
        assert_eq!((step.reward, step.done), (0.0, true));
        assert!(step.messages.is_empty());
        assert_eq!(step.metadata["openenv_reward"], Value::Null);
        assert_eq!(episode.finish(&StopReason::Done).unwrap(), 0.0);
    }

    #[test]
    fn a_refused_handshake_or_no_server_names_the_url() {
        // An HTTP server that is not an OpenEnv server: 404 to the upgrade.
        let listener = TcpListener::bind("127.0.0.1:0").unwrap();
        let port = listener.local_addr().unwrap().port();
        std::thread::spawn(move || {
            let (mut stream, _) = listener.accept().unwrap();
            let mut buffer = [0u8; 2048];
            let _ = stream.read(&mut buffer);
            let _ = stream.write_all(
                b"HTTP/1.1 404 Not Found\r\ncontent-length: 9\r\nconnection: close\r\n\r\nnot found",
            );
        });
        let env = plain_env(&format!("http://127.0.0.1:{port}"));
        let error = env.start(&EnvTask::default()).err().unwrap().to_string();
        assert!(
            error.contains("404") && error.contains(env.session_url()),
            "{error}"
        );
        // Nothing listening.
        let port = TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .port();
        let env = plain_env(&format!("http://127.0.0.1:{port}"));
        let error = env.start(&EnvTask::default()).err().unwrap().to_string();
        assert!(error.contains("cannot connect"), "{error}");
        let error = OpenEnvEnvironment::connect(
            OpenEnvSpec::new(format!("http://127.0.0.1:{port}")),
            Duration::from_secs(5),
        )
        .unwrap_err()
        .to_string();
        assert!(error.contains("/health"), "{error}");
    }

    #[test]
    fn reset_arguments_carry_the_seed_episode_and_task_data() {
        let env = plain_env("http://h:1");
        let task = EnvTask {
            id: "t1".into(),
            data: BTreeMap::from([("level".to_string(), json!(3))]),
            ..EnvTask::default()
        };
        let data = env.reset_data(&task, Some(4));
        assert_eq!(data["episode_id"], "t1#4");
        assert_eq!(data["level"], 3);
        assert_eq!(data["seed"], json!(task_seed("t1")));
        assert!(task_seed("t1") < 1 << 31 && task_seed("t1") != task_seed("t2"));
        let task = EnvTask {
            data: BTreeMap::from([("seed".to_string(), json!(9))]),
            ..task
        };
        assert_eq!(env.reset_data(&task, None)["seed"], 9);
    }
}
