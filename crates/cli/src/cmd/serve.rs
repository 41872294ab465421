//! `stoke serve --model DIR` (the OpenAI-compatible server) and `stoke chat --model DIR | --url
//! URL` (an interactive, streaming terminal chat with a local model or any such server).
//!
//! What it is: flags -> `stoke_serve::ServeConfig`, and the chat loop. `stoke chat --model`
//! starts a server on a free loopback port for the session and talks to it like any client, so
//! local and remote chat are one code path.

use std::io::{BufRead, Write};
use std::path::PathBuf;

use anyhow::{Context, bail};
use clap::Args;
use serde_json::{Value, json};
use stoke_rollout::LogprobMode;
use stoke_serve::{Client, RunningServer, ServeConfig, ToolCallSetting};

/// How the server is sized; shared by `serve` and `chat --model`.
#[derive(Args, Clone)]
pub struct EngineArgs {
    /// Weight precision for serving: f32 (exact) or bf16 (weights packed once in bf16, f32
    /// accumulation; half the bytes read per decoded token).
    #[arg(long, default_value = "f32")]
    precision: stoke_types::Precision,
    /// Sequences decoded together at most.
    #[arg(long, default_value_t = 256)]
    max_num_seqs: usize,
    /// Longest prompt + completion (default: the model's context).
    #[arg(long)]
    max_model_len: Option<usize>,
    /// KV cache budget in GiB; a request is admitted when its worst case fits.
    #[arg(long, default_value_t = 4.0)]
    kv_cache_gib: f64,
    /// Prompt tokens per prefill chunk.
    #[arg(long, default_value_t = 512)]
    prefill_chunk: usize,
    /// Prompt tokens prefilled per step (between decode steps).
    #[arg(long, default_value_t = 2048)]
    max_num_batched_tokens: usize,
}

#[derive(Args)]
pub struct ServeArgs {
    /// The model: a folder (config.json, safetensors weights, tokenizer files) or a GGUF file.
    #[arg(long)]
    model: PathBuf,
    #[arg(long, default_value = "127.0.0.1")]
    host: String,
    #[arg(long, default_value_t = 8000)]
    port: u16,
    /// The name clients send as `model` (default: the folder's name, or the GGUF file's name
    /// without `.gguf`).
    #[arg(long)]
    served_model_name: Option<String>,
    /// Requests that may wait for admission; past it, 429 with Retry-After.
    #[arg(long, default_value_t = 1024)]
    max_queue: usize,
    /// Largest `logprobs` / `top_logprobs` / `prompt_logprobs` a request may ask for.
    #[arg(long, default_value_t = 20)]
    max_logprobs: usize,
    /// Reported log-probs by default: `processed_logprobs` (the distribution sampled from, after
    /// temperature/top-k/top-p) or `raw_logprobs` (the model's).
    #[arg(long, default_value = "processed_logprobs")]
    logprobs_mode: String,
    /// How tool calls are read out of chat answers to requests with `tools`: `auto` (the format
    /// the chat template writes, if it names one), `none` (answers stay text), or a parser
    /// applied whatever the template says: hermes (alias qwen), llama3_json (llama4_json),
    /// mistral, deepseek_v3 (deepseekv3), as vLLM's --tool-call-parser.
    #[arg(long, default_value = "auto")]
    tool_call_parser: String,
    /// What to serve: `generate` (the OpenAI-compatible text routes), `reward` (a sequence
    /// classifier such as a `stoke rm` reward model, over vLLM's /classify and /pooling
    /// routes), or `auto`: reward for a *ForSequenceClassification folder, generate otherwise.
    #[arg(long, default_value = "auto")]
    task: String,
    #[command(flatten)]
    engine: EngineArgs,
}

#[derive(Args)]
pub struct ChatArgs {
    /// Chat with this model, a folder or a GGUF file (a server is started on a loopback port for
    /// the session).
    #[arg(long, conflicts_with = "url", required_unless_present = "url")]
    model: Option<PathBuf>,
    /// Chat with the OpenAI-compatible server at this URL (stoke serve, vLLM, ...).
    #[arg(long)]
    url: Option<String>,
    /// The model name to send (default: the server's first model).
    #[arg(long)]
    model_name: Option<String>,
    /// A system message that opens the conversation.
    #[arg(long)]
    system: Option<String>,
    #[arg(long, default_value_t = 0.7)]
    temperature: f64,
    #[arg(long, default_value_t = 512)]
    max_tokens: usize,
    #[command(flatten)]
    engine: EngineArgs,
}

/// A server config for `model` sized by `engine`.
pub fn engine_config(model: PathBuf, engine: &EngineArgs) -> anyhow::Result<ServeConfig> {
    if !(engine.kv_cache_gib > 0.0 && engine.kv_cache_gib.is_finite()) {
        bail!("--kv-cache-gib must be a positive number of GiB");
    }
    let mut config = ServeConfig::new(model);
    config.precision = engine.precision;
    config.max_num_seqs = engine.max_num_seqs;
    config.max_model_len = engine.max_model_len;
    config.kv_cache_bytes = (engine.kv_cache_gib * (1u64 << 30) as f64) as usize;
    config.prefill_chunk = engine.prefill_chunk;
    config.prefill_budget = engine.max_num_batched_tokens;
    Ok(config)
}

pub fn serve(args: ServeArgs) -> anyhow::Result<()> {
    let mut config = engine_config(args.model, &args.engine)?;
    config.host = args.host;
    config.port = args.port;
    config.served_model_name = args.served_model_name;
    config.max_queue = args.max_queue;
    config.max_logprobs = args.max_logprobs;
    config.task = args
        .task
        .parse()
        .map_err(|e| anyhow::anyhow!("--task: {e}"))?;
    config.logprobs_mode = match args.logprobs_mode.as_str() {
        "processed_logprobs" | "processed" => LogprobMode::Processed,
        "raw_logprobs" | "raw" => LogprobMode::Raw,
        other => bail!("--logprobs-mode: {other:?} is neither processed_logprobs nor raw_logprobs"),
    };
    config.tool_call_parser = args
        .tool_call_parser
        .parse::<ToolCallSetting>()
        .map_err(|e| anyhow::anyhow!("--tool-call-parser: {e}"))?;
    stoke_serve::serve(config).map_err(anyhow::Error::msg)
}

pub fn chat(args: ChatArgs) -> anyhow::Result<()> {
    // A local model gets a server of its own for the session.
    let (server, url) = match (&args.model, &args.url) {
        (Some(model), _) => {
            let mut config = engine_config(model.clone(), &args.engine)?;
            config.port = 0;
            let server = RunningServer::start(config).map_err(anyhow::Error::msg)?;
            let url = server.url();
            (Some(server), url)
        }
        (None, Some(url)) => (None, url.clone()),
        (None, None) => bail!("give --model DIR or --url URL"),
    };
    let client = Client::new(&url);
    let model_name = match args.model_name.clone() {
        Some(name) => name,
        None => {
            let (status, models) = client.get("/v1/models")?;
            if status != 200 {
                bail!("{url}/v1/models answered {status}: {models}");
            }
            models["data"][0]["id"]
                .as_str()
                .context("the server lists no model")?
                .to_string()
        }
    };
    let mut history: Vec<Value> = Vec::new();
    if let Some(system) = &args.system {
        history.push(json!({"role": "system", "content": system}));
    }
    eprintln!(
        "chatting with {model_name} at {url}; /reset clears the conversation, /exit (or end of input) quits"
    );
    let stdin = std::io::stdin();
    let mut stdout = std::io::stdout();
    loop {
        eprint!("> ");
        let mut line = String::new();
        if stdin.lock().read_line(&mut line)? == 0 {
            break;
        }
        let line = line.trim_end_matches(['\n', '\r']);
        match line.trim() {
            "" => continue,
            "/exit" | "/quit" => break,
            "/reset" => {
                history.retain(|m| m["role"] == "system");
                eprintln!("(conversation cleared)");
                continue;
            }
            _ => {}
        }
        history.push(json!({"role": "user", "content": line}));
        let request = json!({
            "model": model_name,
            "messages": history,
            "temperature": args.temperature,
            "max_tokens": args.max_tokens,
            "stream": true,
        });
        let mut reply = String::new();
        let mut error = None;
        let status = client.post_stream("/v1/chat/completions", &request, |event| {
            if let Some(message) = event["error"]["message"].as_str() {
                error = Some(message.to_string());
                return false;
            }
            if let Some(text) = event["choices"][0]["delta"]["content"].as_str() {
                reply.push_str(text);
                print!("{text}");
                let _ = stdout.flush();
            }
            true
        })?;
        println!();
        if let Some(message) = error.or_else(|| (status != 200).then(|| format!("status {status}")))
        {
            eprintln!("error: {message}");
            history.pop();
            continue;
        }
        history.push(json!({"role": "assistant", "content": reply}));
    }
    drop(server);
    Ok(())
}
