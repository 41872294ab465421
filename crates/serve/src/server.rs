//! The server: the router, the small routes, and starting and stopping it. Its configuration
//! and the state every route shares are in `app.rs`.
//!
//! Routes: `/v1/completions`, `/v1/chat/completions` (their own modules), `/v1/models`,
//! `/health`, `/version`, `/tokenize`, `/detokenize`, `/metrics`, and for RL weight syncs
//! `/update_weights` (load a Hugging Face directory both sides can see, swap it in between decode
//! steps), `/pause`, `/resume`, `/is_paused` and `/weights/checksum`. Unknown paths get a 404 in
//! the OpenAI error shape; a wrong method a 405 in the same shape (with `Allow`). The two
//! generation routes take JSON only (`Content-Type: application/json`; anything else is a 415).
//!
//! A sequence classifier (`--task reward`, or `auto` on a `*ForSequenceClassification` folder)
//! is served by `scoring.rs`'s router instead: `/classify` and `/pooling`.
//!
//! Lifecycle: [`RunningServer::start`] loads the model, starts the worker thread and a tokio
//! runtime on their own threads and returns once the port is bound (port 0 picks a free one,
//! for tests); [`RunningServer::stop`] (or dropping it) shuts the HTTP side down gracefully and
//! stops the worker. [`serve`] runs one until Ctrl-C.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use axum::Router;
use axum::body::Bytes;
use axum::extract::{DefaultBodyLimit, State};
use axum::http::{StatusCode, header};
use axum::response::{IntoResponse, Response};
use axum::routing::{get, post};
use serde::Deserialize;
use serde_json::{Value, json};
use stoke_tokenizer::chat::ChatOptions;
use tokio::sync::oneshot;

use crate::app::{App, ServeConfig, ServeTask};
use crate::error::{ApiError, method_not_allowed};
use crate::protocol::parse_body;
use crate::scoring::{self, ScoreApp};
use crate::weights::load_for_serving;
use crate::worker::Command;
use crate::{chat, completions};

/// The router over `app`.
pub fn router(app: Arc<App>) -> Router {
    Router::new()
        .route("/v1/completions", post(completions::completions))
        .route("/v1/chat/completions", post(chat::chat_completions))
        .route("/v1/models", get(models))
        .route("/health", get(health))
        .route("/version", get(version))
        .route("/tokenize", post(tokenize))
        .route("/detokenize", post(detokenize))
        .route("/metrics", get(metrics))
        .route("/update_weights", post(update_weights))
        .route("/pause", post(pause))
        .route("/resume", post(resume))
        .route("/is_paused", get(is_paused))
        .route("/weights/checksum", get(checksum))
        .method_not_allowed_fallback(method_not_allowed)
        .fallback(not_found)
        .layer(DefaultBodyLimit::max(64 << 20))
        .with_state(app)
}

async fn not_found() -> Response {
    ApiError::status(StatusCode::NOT_FOUND, "no such route").into_response()
}

async fn health() -> StatusCode {
    StatusCode::OK
}

async fn version() -> Response {
    axum::Json(json!({"version": env!("CARGO_PKG_VERSION")})).into_response()
}

async fn models(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({
        "object": "list",
        "data": [{
            "id": app.info.name,
            "object": "model",
            "created": app.started,
            "owned_by": "stoke",
            "root": app.config.model_dir.display().to_string(),
            "parent": null,
            "max_model_len": app.info.max_model_len,
            "permission": [],
        }],
    }))
    .into_response()
}

async fn metrics(State(app): State<Arc<App>>) -> Response {
    (
        [(
            header::CONTENT_TYPE,
            "application/openmetrics-text; version=1.0.0; charset=utf-8",
        )],
        app.metrics.encode(),
    )
        .into_response()
}

/// `/tokenize`: `{"prompt": str, "add_special_tokens"?: bool}` or `{"messages": [...],
/// "add_generation_prompt"?: bool}`; answers `{count, max_model_len, tokens, token_strs}`.
#[derive(Deserialize)]
struct TokenizeRequest {
    model: Option<String>,
    prompt: Option<String>,
    messages: Option<Vec<Value>>,
    add_special_tokens: Option<bool>,
    add_generation_prompt: Option<bool>,
    #[serde(default)]
    return_token_strs: bool,
}

async fn tokenize(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let result = (|| {
        let request: TokenizeRequest = parse_body(&body)?;
        check_model_name(&app, request.model.as_deref())?;
        let tokens = match (&request.prompt, &request.messages) {
            (Some(prompt), None) => app
                .tokenizer
                .encode(prompt, request.add_special_tokens.unwrap_or(true))
                .map_err(|e| ApiError::invalid("prompt", e.to_string()))?,
            (None, Some(messages)) => {
                let messages = messages
                    .iter()
                    .enumerate()
                    .map(|(i, m)| {
                        serde_json::from_value(m.clone()).map_err(|e| {
                            ApiError::invalid(
                                format!("messages[{i}]"),
                                format!("messages[{i}]: {e}"),
                            )
                        })
                    })
                    .collect::<Result<Vec<_>, _>>()?;
                let options = ChatOptions {
                    add_generation_prompt: request.add_generation_prompt.unwrap_or(true),
                    variables: Default::default(),
                };
                app.tokenizer
                    .apply_chat_template(&messages, &options)
                    .map_err(|e| ApiError::invalid("messages", e.to_string()))?
                    .ids
            }
            _ => {
                return Err(ApiError::invalid(
                    "prompt",
                    "give exactly one of `prompt` and `messages`",
                ));
            }
        };
        let token_strs = request.return_token_strs.then(|| {
            tokens
                .iter()
                .map(|&id| app.tokenizer.id_to_token(id).unwrap_or_default())
                .collect::<Vec<_>>()
        });
        Ok(json!({
            "count": tokens.len(),
            "max_model_len": app.info.max_model_len,
            "tokens": tokens,
            "token_strs": token_strs,
        }))
    })();
    respond(result)
}

#[derive(Deserialize)]
struct DetokenizeRequest {
    model: Option<String>,
    tokens: Vec<u32>,
}

async fn detokenize(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let result = (|| {
        let request: DetokenizeRequest = parse_body(&body)?;
        check_model_name(&app, request.model.as_deref())?;
        if let Some(&id) = request
            .tokens
            .iter()
            .find(|&&id| app.tokenizer.id_to_token(id).is_none())
        {
            return Err(ApiError::invalid(
                "tokens",
                format!("token id {id} is not in the tokenizer's vocabulary"),
            ));
        }
        let prompt = app
            .tokenizer
            .decode(&request.tokens, false)
            .map_err(|e| ApiError::invalid("tokens", e.to_string()))?;
        Ok(json!({"prompt": prompt}))
    })();
    respond(result)
}

fn check_model_name(app: &App, model: Option<&str>) -> Result<(), ApiError> {
    match model {
        Some(name) if name != app.info.name => Err(ApiError::invalid(
            "model",
            format!(
                "The model `{name}` does not exist; this server serves `{}`",
                app.info.name
            ),
        )),
        _ => Ok(()),
    }
}

fn respond(result: Result<Value, ApiError>) -> Response {
    match result {
        Ok(value) => axum::Json(value).into_response(),
        Err(error) => error.into_response(),
    }
}

/// `/update_weights`: `{"path": DIR, "version"?: N}` (also `weight_dir` or `model_path` for the
/// path, as prime-rl and SGLang name it). Loads DIR (same config as the served model), then
/// swaps it in between two decode steps; sequences in flight continue on the new weights.
#[derive(Deserialize)]
struct UpdateWeightsRequest {
    path: Option<String>,
    weight_dir: Option<String>,
    model_path: Option<String>,
    version: Option<u64>,
}

async fn update_weights(State(app): State<Arc<App>>, body: Bytes) -> Response {
    let result = async {
        let request: UpdateWeightsRequest = parse_body(&body)?;
        let path = request
            .path
            .or(request.weight_dir)
            .or(request.model_path)
            .ok_or_else(|| ApiError::invalid("path", "`path` (the model directory) is required"))?;
        let _one_at_a_time = app.weight_update.lock().await;
        let current = app.worker.state.version.load(Ordering::Acquire);
        let version = request.version.unwrap_or(current + 1);
        if version < current {
            return Err(ApiError::invalid(
                "version",
                format!("version {version} is older than the served version {current}"),
            ));
        }
        let dir = PathBuf::from(&path);
        let precision = app.config.precision;
        let loaded = tokio::task::spawn_blocking(move || load_for_serving(&dir, precision))
            .await
            .map_err(|e| ApiError::internal(format!("loading {path}: {e}")))?
            .map_err(|e| ApiError::invalid("path", e))?;
        let (model, checksum) = loaded;
        let (reply, answer) = oneshot::channel();
        let command = Command::SetWeights {
            model: Arc::new(model),
            version,
            checksum: checksum.clone(),
            reply,
        };
        if !app.worker.send(command) {
            return Err(ApiError::internal("the generation worker has stopped"));
        }
        match answer.await {
            Ok(Ok(())) => Ok(json!({"status": "ok", "version": version, "checksum": checksum})),
            Ok(Err(error)) => Err(ApiError::invalid("path", error.to_string())),
            Err(_) => Err(ApiError::internal("the generation worker has stopped")),
        }
    }
    .await;
    respond(result)
}

async fn pause(State(app): State<Arc<App>>) -> Response {
    app.worker.state.paused.store(true, Ordering::Release);
    axum::Json(json!({"status": "paused"})).into_response()
}

async fn resume(State(app): State<Arc<App>>) -> Response {
    app.worker.state.paused.store(false, Ordering::Release);
    axum::Json(json!({"status": "resumed"})).into_response()
}

async fn is_paused(State(app): State<Arc<App>>) -> Response {
    axum::Json(json!({"is_paused": app.worker.state.paused.load(Ordering::Acquire)}))
        .into_response()
}

async fn checksum(State(app): State<Arc<App>>) -> Response {
    let state = &app.worker.state;
    let checksum = state.checksum.lock().map(|c| c.clone()).unwrap_or_default();
    axum::Json(json!({
        "version": state.version.load(Ordering::Acquire),
        "checksum": checksum,
    }))
    .into_response()
}

/// An axum router served on a tokio runtime of its own, on a thread of its own: the lifecycle
/// `stoke serve` and `stoke reward-server` share. [`HttpServer::stop`] (or dropping it) shuts the
/// HTTP side down gracefully.
#[derive(Debug)]
pub struct HttpServer {
    pub addr: SocketAddr,
    shutdown: Option<oneshot::Sender<()>>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl HttpServer {
    /// Binds `address` (port 0 picks a free one) and serves `router` until `stop`, or Ctrl-C
    /// too when `ctrl_c`. `name` names the threads.
    pub fn start(
        address: &str,
        router: Router,
        name: &str,
        ctrl_c: bool,
    ) -> Result<HttpServer, String> {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name(format!("{name}-http"))
            .enable_all()
            .build()
            .map_err(|e| format!("starting the HTTP runtime: {e}"))?;
        let listener = runtime
            .block_on(tokio::net::TcpListener::bind(address))
            .map_err(|e| format!("binding {address}: {e}"))?;
        let addr = listener
            .local_addr()
            .map_err(|e| format!("binding {address}: {e}"))?;
        let (shutdown, stopped) = oneshot::channel::<()>();
        let thread = std::thread::Builder::new()
            .name(name.into())
            .spawn(move || {
                runtime.block_on(async move {
                    let _ = axum::serve(listener, router)
                        .with_graceful_shutdown(async move {
                            if ctrl_c {
                                tokio::select! {
                                    _ = stopped => {}
                                    _ = tokio::signal::ctrl_c() => {}
                                }
                            } else {
                                let _ = stopped.await;
                            }
                        })
                        .await;
                });
                // Streams still open are cut here.
                runtime.shutdown_timeout(std::time::Duration::from_secs(1));
            })
            .map_err(|e| format!("starting the server thread: {e}"))?;
        Ok(HttpServer {
            addr,
            shutdown: Some(shutdown),
            thread: Some(thread),
        })
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        format!("http://{}", self.addr)
    }

    /// Stops accepting and lets open requests end.
    pub fn stop(mut self) {
        self.shut_down();
    }

    fn shut_down(&mut self) {
        if let Some(shutdown) = self.shutdown.take() {
            let _ = shutdown.send(());
        }
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }

    /// Blocks until the server stops (Ctrl-C, for one started with `ctrl_c`).
    pub fn wait(mut self) {
        if let Some(thread) = self.thread.take() {
            let _ = thread.join();
        }
    }
}

impl Drop for HttpServer {
    fn drop(&mut self) {
        self.shut_down();
    }
}

/// A server running on its own threads.
#[derive(Debug)]
pub struct RunningServer {
    pub addr: SocketAddr,
    http: HttpServer,
}

impl RunningServer {
    /// Loads the model, binds `host:port` and serves until `stop`.
    pub fn start(config: ServeConfig) -> Result<RunningServer, String> {
        RunningServer::start_with(config, false)
    }

    /// As `start`; with `ctrl_c`, the signal also stops it. The worker stops with the last
    /// `App`, when the HTTP side has shut down.
    fn start_with(config: ServeConfig, ctrl_c: bool) -> Result<RunningServer, String> {
        let address = format!("{}:{}", config.host, config.port);
        let routes = match config.task.resolve(&config.model_dir) {
            ServeTask::Reward => scoring::router(Arc::new(ScoreApp::load(&config)?)),
            ServeTask::Generate | ServeTask::Auto => router(Arc::new(App::load(config)?)),
        };
        let http = HttpServer::start(&address, routes, "stoke-serve", ctrl_c)?;
        Ok(RunningServer {
            addr: http.addr,
            http,
        })
    }

    /// `http://host:port`.
    pub fn url(&self) -> String {
        self.http.url()
    }

    /// Stops accepting, lets open requests end, stops the worker.
    pub fn stop(self) {
        self.http.stop();
    }

    /// Blocks until the server stops (Ctrl-C, for a server started by [`serve`]).
    fn wait(self) {
        self.http.wait();
    }
}

/// Serves until Ctrl-C, printing where.
pub fn serve(config: ServeConfig) -> Result<(), String> {
    let model = config.model_dir.clone();
    let routes = match config.task.resolve(&model) {
        ServeTask::Reward => "a reward model: /classify, /pooling",
        _ => "OpenAI-compatible: /v1/completions, /v1/chat/completions",
    };
    let server = RunningServer::start_with(config, true)?;
    eprintln!(
        "stoke serve: {} at {} ({routes}); Ctrl-C stops",
        model.display(),
        server.url()
    );
    server.wait();
    eprintln!("stoke serve: stopped");
    Ok(())
}
