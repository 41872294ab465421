//! What every route shares: the [`ServeConfig`] a server is started with and the [`App`] state
//! built from it (model info, tokenizer, the worker that steps the batcher, metrics, the queue
//! count), with `App::load`, which loads the model and starts the worker.
//!
//! What it is not: a route or the router (`server.rs`, `completions.rs`, `chat.rs`), nor the
//! worker itself (`worker.rs`). Every route module names `App`, so it sits below all of them.

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::AtomicUsize;

use stoke_rollout::{BatchLimits, Batcher, Detokenizer, LogprobMode};
use stoke_tokenizer::hf::Tokenizer;
use stoke_types::Precision;

use crate::metrics::Metrics;
use crate::protocol::ModelInfo;
use crate::tools::{ToolCallSetting, ToolSupport};
use crate::weights::load_for_serving;
use crate::worker::Worker;

/// The name a model is served under when none is given: a folder's name, or a GGUF file's name
/// without its extension (`smollm2-135m.gguf` is served as `smollm2-135m`, as vLLM and
/// llama.cpp's server name it).
pub fn default_served_model_name(model: &Path) -> String {
    let is_gguf = model
        .extension()
        .is_some_and(|e| e.eq_ignore_ascii_case("gguf"));
    let name = if is_gguf {
        model.file_stem()
    } else {
        model.file_name()
    };
    name.map(|n| n.to_string_lossy().into_owned())
        .unwrap_or_else(|| model.display().to_string())
}

/// How to serve a model.
#[derive(Debug, Clone)]
pub struct ServeConfig {
    /// A Hugging Face model directory with its tokenizer, or a GGUF file.
    pub model_dir: PathBuf,
    /// The name clients send as `model`; [`default_served_model_name`] when `None`.
    pub served_model_name: Option<String>,
    pub host: String,
    /// 0 picks a free port.
    pub port: u16,
    pub precision: Precision,
    /// Sequences decoded together.
    pub max_num_seqs: usize,
    /// Longest prompt + completion; the model's context when `None`.
    pub max_model_len: Option<usize>,
    /// KV cache budget.
    pub kv_cache_bytes: usize,
    pub prefill_chunk: usize,
    pub prefill_budget: usize,
    /// Requests that may wait for admission before new ones get 429.
    pub max_queue: usize,
    pub max_logprobs: usize,
    pub logprobs_mode: LogprobMode,
    /// Which parser reads tool calls out of chat answers (`tools.rs`).
    pub tool_call_parser: ToolCallSetting,
    /// Generate text, or score sequences with a reward model (`scoring.rs`).
    pub task: ServeTask,
}

/// What a server does with its model (`stoke serve --task`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ServeTask {
    /// `reward` for a sequence classifier (config.json's `architectures` names a
    /// `*ForSequenceClassification` class), `generate` for anything else.
    #[default]
    Auto,
    /// The OpenAI-compatible generation routes.
    Generate,
    /// vLLM's scoring routes over a sequence classifier: `/classify` and `/pooling`.
    Reward,
}

impl std::str::FromStr for ServeTask {
    type Err = String;

    fn from_str(name: &str) -> Result<ServeTask, String> {
        match name {
            "auto" => Ok(ServeTask::Auto),
            "generate" => Ok(ServeTask::Generate),
            "reward" | "classify" => Ok(ServeTask::Reward),
            other => Err(format!(
                "{other:?} is not a task: auto, generate or reward (alias classify)"
            )),
        }
    }
}

impl ServeTask {
    /// The task for `model`: `Auto` resolved by reading the folder's config.json (a GGUF file,
    /// or a folder without a config, is a generator; loading reports what is missing).
    pub fn resolve(self, model: &Path) -> ServeTask {
        if self != ServeTask::Auto {
            return self;
        }
        let classifier = std::fs::read(model.join("config.json"))
            .ok()
            .and_then(|bytes| serde_json::from_slice::<serde_json::Value>(&bytes).ok())
            .and_then(|config| {
                config["architectures"].as_array().map(|classes| {
                    classes.iter().any(|c| {
                        c.as_str()
                            .is_some_and(|c| c.ends_with("ForSequenceClassification"))
                    })
                })
            })
            .unwrap_or(false);
        if classifier {
            ServeTask::Reward
        } else {
            ServeTask::Generate
        }
    }
}

impl ServeConfig {
    /// Defaults for serving `model_dir` on 127.0.0.1:8000.
    pub fn new(model_dir: impl Into<PathBuf>) -> ServeConfig {
        ServeConfig {
            model_dir: model_dir.into(),
            served_model_name: None,
            host: "127.0.0.1".into(),
            port: 8000,
            precision: Precision::F32,
            max_num_seqs: 256,
            max_model_len: None,
            kv_cache_bytes: 4 << 30,
            prefill_chunk: 512,
            prefill_budget: 2048,
            max_queue: 1024,
            max_logprobs: 20,
            logprobs_mode: LogprobMode::Processed,
            tool_call_parser: ToolCallSetting::Auto,
            task: ServeTask::Auto,
        }
    }
}

/// What every route shares.
pub struct App {
    pub config: ServeConfig,
    pub info: ModelInfo,
    pub tokenizer: Arc<Tokenizer>,
    pub worker: Worker,
    pub metrics: Arc<Metrics>,
    /// Prompts submitted and not yet prefilled (the queue `max_queue` bounds).
    pub queued: AtomicUsize,
    /// The tool-call parser and whether the template renders `tools`.
    pub tools: ToolSupport,
    /// One weight update at a time.
    pub(crate) weight_update: tokio::sync::Mutex<()>,
    /// When the server started (seconds since the Unix epoch), the `created` of `/v1/models`.
    pub(crate) started: u64,
}

impl std::fmt::Debug for App {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("App")
            .field("model", &self.info.name)
            .finish_non_exhaustive()
    }
}

impl App {
    /// Loads the model and tokenizer and starts the worker.
    pub fn load(config: ServeConfig) -> Result<App, String> {
        let dir = &config.model_dir;
        let (model, checksum) = load_for_serving(dir, config.precision)?;
        let tokenizer = Tokenizer::from_dir(dir).map_err(|e| format!("{}: {e}", dir.display()))?;
        let tokenizer = Arc::new(tokenizer);
        let c = model.config().clone();
        let max_model_len = config
            .max_model_len
            .unwrap_or(c.max_position_embeddings)
            .min(c.max_position_embeddings);
        let limits = BatchLimits {
            max_running: config.max_num_seqs,
            kv_budget_bytes: config.kv_cache_bytes,
            prefill_chunk: config.prefill_chunk,
            prefill_budget: config.prefill_budget,
            max_model_len,
        };
        let detokenizer: Arc<dyn Detokenizer + Send + Sync> = tokenizer.clone();
        let batcher = Batcher::new(Arc::new(model), 0, Some(detokenizer), limits)
            .map_err(|e| e.to_string())?;
        let mut eos_token_ids = c.eos_token_ids.clone();
        eos_token_ids.extend(tokenizer.eos_token_ids());
        eos_token_ids.sort_unstable();
        eos_token_ids.dedup();
        let name = config
            .served_model_name
            .clone()
            .unwrap_or_else(|| default_served_model_name(dir));
        let tools = ToolSupport::new(config.tool_call_parser, &tokenizer);
        let metrics = Arc::new(Metrics::new());
        let worker = Worker::start(batcher, checksum, Arc::clone(&metrics));
        Ok(App {
            info: ModelInfo {
                name,
                vocab_size: c.vocab_size,
                max_model_len,
                eos_token_ids,
                max_logprobs: config.max_logprobs,
                default_logprobs_mode: config.logprobs_mode,
            },
            config,
            tokenizer,
            worker,
            metrics,
            queued: AtomicUsize::new(0),
            tools,
            weight_update: tokio::sync::Mutex::new(()),
            started: unix_now(),
        })
    }
}

/// Seconds since the Unix epoch.
pub fn unix_now() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_secs())
}

#[cfg(test)]
mod tests {
    use super::default_served_model_name;
    use std::path::Path;

    #[test]
    fn a_gguf_file_is_served_under_its_name_without_the_extension() {
        let name = |p: &str| default_served_model_name(Path::new(p));
        assert_eq!(name("models/smollm2-135m-q8_0.gguf"), "smollm2-135m-q8_0");
        assert_eq!(name("models/SmolLM2.GGUF"), "SmolLM2");
        assert_eq!(name("runs/speedrun/model"), "model");
        assert_eq!(name("runs/v1.5"), "v1.5");
    }
}
