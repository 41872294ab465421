//! `stoke score`, `stoke generate`, `stoke inspect`, `stoke merge`: look at a Hugging Face model
//! directory (`merge` folds a LoRA adapter into it)
//! (config.json + safetensors, optionally tokenizer.json) from the command line.
//!
//! What it is: flag parsing and printing around `stoke_model` (loading), `stoke_rollout` (scoring
//! and generation) and `stoke_tokenizer` (text <-> ids, chat templates). What it is not: a place
//! for model or sampling logic.
//!
//! Output is JSON on stdout (one object for `score`/`inspect`, one line per completion for
//! `generate` unless `--format text`). Every failure is one line on stderr that names the file and
//! field (or flag) at fault, with a non-zero exit; no input makes these commands panic.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use candle_core::Device;
use clap::{Args, ValueEnum};
use serde::Serialize;
use stoke_model::{ModelConfig, RopeScaling, Transformer};
use stoke_rollout::engine::Engine;
use stoke_rollout::score::next_token_logprobs;
use stoke_rollout::{Detokenizer, GenerationRequest, SamplingParams};
use stoke_tokenizer::hf::Tokenizer;

#[derive(Args)]
pub struct ScoreArgs {
    /// Model directory (config.json and safetensors weights; tokenizer.json for --text).
    #[arg(long)]
    model: PathBuf,
    /// The sequence as comma-separated token ids, e.g. 1,2,3.
    #[arg(
        long,
        conflicts_with = "text",
        required_unless_present = "text",
        allow_hyphen_values = true
    )]
    ids: Option<String>,
    /// The sequence as text, tokenized by the model directory's tokenizer (special tokens such
    /// as BOS added as the tokenizer config says).
    #[arg(long)]
    text: Option<String>,
    /// Matmul precision: f32 (exact) or bf16 (bf16 inputs, f32 accumulation).
    #[arg(long, default_value = "f32")]
    precision: stoke_types::Precision,
    /// A LoRA adapter directory (PEFT layout: adapter_config.json + adapter_model.safetensors)
    /// applied on top of --model.
    #[arg(long)]
    adapter: Option<PathBuf>,
}

#[derive(Args)]
pub struct GenerateArgs {
    /// Model directory (config.json and safetensors weights; tokenizer.json for --prompt).
    #[arg(long)]
    model: PathBuf,
    /// The prompt as text (needs the tokenizer in the model directory).
    #[arg(
        long,
        conflicts_with = "prompt_ids",
        required_unless_present = "prompt_ids"
    )]
    prompt: Option<String>,
    /// The prompt as comma-separated token ids (works without a tokenizer).
    #[arg(long, allow_hyphen_values = true)]
    prompt_ids: Option<String>,
    /// Treat --prompt as a user message and render it with the model's chat template, adding
    /// the generation prompt.
    #[arg(long, requires = "prompt")]
    chat: bool,
    /// Maximum number of new tokens per completion.
    #[arg(long, default_value_t = 64)]
    max_tokens: usize,
    /// Sampling temperature; 0 is greedy decoding.
    #[arg(long, default_value_t = 1.0)]
    temperature: f32,
    /// Nucleus sampling mass in (0, 1]; 1 disables.
    #[arg(long, default_value_t = 1.0)]
    top_p: f32,
    /// Keep only the K most likely tokens; 0 disables.
    #[arg(long, default_value_t = 0)]
    top_k: usize,
    /// Random seed; the same seed gives the same completions.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Number of completions.
    #[arg(short = 'n', long = "num-completions", default_value_t = 1)]
    n: usize,
    /// Stop when this string appears in the output (repeatable; not included in the text).
    #[arg(long)]
    stop: Vec<String>,
    /// Output format.
    #[arg(long, value_enum, default_value_t = OutputFormat::Json)]
    format: OutputFormat,
    /// Matmul precision: f32 (exact) or bf16 (weights packed once in bf16, f32 accumulation;
    /// about half the bytes read per decoded token).
    #[arg(long, default_value = "f32")]
    precision: stoke_types::Precision,
    /// A LoRA adapter directory (PEFT layout) applied on top of --model.
    #[arg(long)]
    adapter: Option<PathBuf>,
    /// Self-speculative decoding: the model's multi-token prediction module (DeepSeek-V3's MTP)
    /// drafts the token after next and the main model verifies it; the same distribution per
    /// token, up to two tokens per main-model step. Prints the acceptance to stderr.
    #[arg(long)]
    speculative: bool,
}

#[derive(Args)]
pub struct MergeArgs {
    /// The base model directory.
    #[arg(long)]
    model: PathBuf,
    /// The LoRA adapter directory (PEFT layout: adapter_config.json + adapter_model.safetensors).
    #[arg(long)]
    adapter: PathBuf,
    /// Where the merged model goes (Hugging Face layout; the base's tokenizer files are copied).
    #[arg(long)]
    out: PathBuf,
}

#[derive(Clone, Copy, ValueEnum)]
enum OutputFormat {
    /// One JSON object per completion per line.
    Json,
    /// Human-readable text.
    Text,
}

#[derive(Args)]
pub struct InspectArgs {
    /// Model directory (config.json and safetensors weights).
    #[arg(long)]
    model: PathBuf,
}

#[derive(Serialize)]
struct ScoreOutput {
    tokens: Vec<u32>,
    /// Entry i is log p(tokens[i+1] | tokens[..=i]).
    next_token_logprobs: Vec<f32>,
}

pub fn score(args: ScoreArgs) -> anyhow::Result<()> {
    let model = with_adapter(load_model(&args.model)?, args.adapter.as_deref())?
        .with_precision(args.precision);
    let tokens = match (&args.ids, &args.text) {
        (Some(ids), _) => parse_ids("--ids", ids)?,
        (None, Some(text)) => load_tokenizer(&args.model)?
            .encode(text, true)
            .with_context(|| format!("tokenizing --text with {}", args.model.display()))?,
        (None, None) => bail!("give the sequence with --ids or --text"),
    };
    check_ids_in_vocabulary(&model, &args.model, "--ids", &tokens)?;
    let next_token_logprobs = next_token_logprobs(&model, &tokens, &Device::Cpu)
        .with_context(|| format!("scoring with {}", args.model.display()))?;
    println!(
        "{}",
        serde_json::to_string(&ScoreOutput {
            tokens,
            next_token_logprobs
        })?
    );
    Ok(())
}

pub fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let mut model = with_adapter(load_model(&args.model)?, args.adapter.as_deref())?;
    if args.precision == stoke_types::Precision::Bf16 {
        model.pack_weights()?;
    }
    let tokenizer = match (&args.prompt, args.model.join("tokenizer.json").is_file()) {
        (Some(_), _) | (None, true) => Some(load_tokenizer(&args.model)?),
        (None, false) => None,
    };
    let prompt_ids = match (&args.prompt_ids, &args.prompt, &tokenizer) {
        (Some(ids), _, _) => parse_ids("--prompt-ids", ids)?,
        (None, Some(prompt), Some(tokenizer)) if args.chat => chat_prompt(tokenizer, prompt)
            .with_context(|| {
                format!(
                    "rendering --prompt with the chat template of {}",
                    args.model.display()
                )
            })?,
        (None, Some(prompt), Some(tokenizer)) => tokenizer
            .encode(prompt, true)
            .with_context(|| format!("tokenizing --prompt with {}", args.model.display()))?,
        _ => bail!("give the prompt with --prompt (needs tokenizer.json) or --prompt-ids"),
    };
    check_ids_in_vocabulary(&model, &args.model, "--prompt-ids", &prompt_ids)?;

    let mut stop_token_ids = model.config().eos_token_ids.clone();
    if let Some(tokenizer) = &tokenizer {
        stop_token_ids.extend(tokenizer.eos_token_ids());
    }
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    let params = SamplingParams {
        max_new_tokens: args.max_tokens,
        temperature: args.temperature,
        top_k: Some(args.top_k).filter(|&k| k > 0),
        top_p: args.top_p,
        seed: args.seed,
        n: args.n,
        stop_token_ids,
        stop_strings: args.stop.clone(),
    };
    let detokenizer = tokenizer
        .as_ref()
        .map(|tokenizer| tokenizer as &dyn Detokenizer);
    let engine = Engine::new(&model);
    let request = GenerationRequest::new(vec![prompt_ids], params);
    let started = std::time::Instant::now();
    let output = if args.speculative {
        let speculative = engine
            .generate_speculative(&request, detokenizer)
            .with_context(|| format!("speculative generation with {}", args.model.display()))?;
        let stats = speculative.stats;
        eprintln!(
            "speculative decoding: {} of {} drafts accepted ({:.1}%), {} tokens in {} main-model \
             steps after the prefill, {:.2}s",
            stats.accepted,
            stats.drafted,
            100.0 * stats.acceptance_rate(),
            speculative.output.generated_tokens,
            stats.main_steps,
            started.elapsed().as_secs_f64()
        );
        speculative.output
    } else {
        engine
            .generate(&request, detokenizer)
            .with_context(|| format!("generating with {}", args.model.display()))?
    };
    for completion in output.completions.iter().flatten() {
        match args.format {
            OutputFormat::Json => println!("{}", serde_json::to_string(completion)?),
            OutputFormat::Text => {
                println!(
                    "--- completion {} ({} tokens, finish: {}) ---",
                    completion.sample_index,
                    completion.token_ids.len(),
                    finish_word(&completion.finish_reason)
                );
                match &completion.text {
                    Some(text) => println!("{text}"),
                    None => println!("{:?}", completion.token_ids),
                }
            }
        }
    }
    Ok(())
}

/// A finish reason in OpenAI's words, for text output: `stop` (an end-of-sequence token or a stop
/// string) or `length` (the token limit). The JSON output keeps the detailed record.
fn finish_word(reason: &stoke_rollout::FinishReason) -> &'static str {
    match reason {
        stoke_rollout::FinishReason::Eos { .. }
        | stoke_rollout::FinishReason::StopString { .. } => "stop",
        stoke_rollout::FinishReason::Length => "length",
    }
}

pub fn inspect(args: InspectArgs) -> anyhow::Result<()> {
    check_model_dir(&args.model)?;
    let config = if args.model.is_file() {
        stoke_model::gguf::config_of(&args.model)?
    } else {
        ModelConfig::from_file(&args.model.join("config.json"))?
    };
    let output = serde_json::json!({
        "model_dir": args.model,
        "num_parameters": config.num_parameters(),
        "config": parsed_config_json(&config),
    });
    println!("{}", serde_json::to_string_pretty(&output)?);
    Ok(())
}

/// The validated runtime config (not the raw file: defaults resolved, rope options parsed).
fn parsed_config_json(config: &ModelConfig) -> serde_json::Value {
    let rope_scaling = match &config.rope.scaling {
        RopeScaling::Default => serde_json::json!({ "type": "default" }),
        RopeScaling::Linear { factor } => serde_json::json!({ "type": "linear", "factor": factor }),
        RopeScaling::Llama3 {
            factor,
            low_freq_factor,
            high_freq_factor,
            original_max_position_embeddings,
        } => serde_json::json!({
            "type": "llama3",
            "factor": factor,
            "low_freq_factor": low_freq_factor,
            "high_freq_factor": high_freq_factor,
            "original_max_position_embeddings": original_max_position_embeddings,
        }),
        RopeScaling::Yarn {
            factor,
            attention_factor,
            mscale,
            mscale_all_dim,
            beta_fast,
            beta_slow,
            original_max_position_embeddings,
            truncate,
        } => serde_json::json!({
            "type": "yarn",
            "factor": factor,
            "attention_factor": attention_factor,
            "mscale": mscale,
            "mscale_all_dim": mscale_all_dim,
            "beta_fast": beta_fast,
            "beta_slow": beta_slow,
            "original_max_position_embeddings": original_max_position_embeddings,
            "truncate": truncate,
        }),
    };
    serde_json::json!({
        "architecture": config.architecture.hf_class_name(),
        "model_type": config.architecture.model_type(),
        "vocab_size": config.vocab_size,
        "hidden_size": config.hidden_size,
        "intermediate_size": config.intermediate_size,
        "num_hidden_layers": config.num_hidden_layers,
        "num_attention_heads": config.num_attention_heads,
        "num_key_value_heads": config.num_key_value_heads,
        "head_dim": config.head_dim,
        "rms_norm_eps": config.rms_norm_eps,
        "rope_theta": config.rope.theta,
        "rope_scaling": rope_scaling,
        "attention_bias": config.attention_bias,
        "attention_output_bias": config.attention_output_bias,
        "mlp_bias": config.mlp_bias,
        "qk_norm": config.qk_norm,
        "tie_word_embeddings": config.tie_word_embeddings,
        "max_position_embeddings": config.max_position_embeddings,
        "bos_token_id": config.bos_token_id,
        "eos_token_ids": config.eos_token_ids,
        "hidden_act": config.hidden_act.hf_name(),
        "sliding_window": config.sliding_window,
        "moe": config.moe.as_ref().map(|m| {
            let router = match m.router_score {
                stoke_model::config::RouterScore::Softmax => serde_json::json!("softmax"),
                stoke_model::config::RouterScore::Sigmoid { route_scale } => {
                    serde_json::json!({ "sigmoid": { "route_scale": route_scale } })
                }
            };
            serde_json::json!({
                "num_experts": m.num_experts,
                "num_experts_per_tok": m.num_experts_per_tok,
                "expert_intermediate_size": m.expert_intermediate_size,
                "shared_expert_intermediate_size": m.shared_expert_intermediate_size,
                "norm_topk_prob": m.norm_topk_prob,
                "router": router,
                "group_limit": m.group_limit.map(|g| serde_json::json!({
                    "groups": g.groups,
                    "topk_groups": g.topk_groups,
                })),
                "sparse_layers": m.sparse_layers.iter().filter(|&&s| s).count(),
            })
        }),
        "mla": config.mla.as_ref().map(|m| serde_json::json!({
            "q_lora_rank": m.q_lora_rank,
            "kv_lora_rank": m.kv_lora_rank,
            "qk_nope_head_dim": m.qk_nope_head_dim,
            "qk_rope_head_dim": m.qk_rope_head_dim,
            "v_head_dim": m.v_head_dim,
            "rope_interleave": m.rope_interleave,
        })),
        "num_mtp_layers": config.num_mtp_layers,
    })
}

fn check_model_dir(dir: &Path) -> anyhow::Result<()> {
    if !dir.is_dir() && !stoke_gguf::is_gguf(dir) {
        bail!(
            "model {} is neither a model directory nor a GGUF file",
            dir.display()
        );
    }
    Ok(())
}

/// `model` with the LoRA adapter in `adapter` applied, if one is given.
fn with_adapter(mut model: Transformer, adapter: Option<&Path>) -> anyhow::Result<Transformer> {
    if let Some(dir) = adapter {
        model
            .load_adapter(dir)
            .with_context(|| format!("loading the LoRA adapter {}", dir.display()))?;
    }
    Ok(model)
}

/// `stoke merge`: folds a LoRA adapter into its base model and saves a plain model.
pub fn merge(args: MergeArgs) -> anyhow::Result<()> {
    let model = with_adapter(load_model(&args.model)?, Some(&args.adapter))?;
    let merged = model.merged()?;
    merged
        .save_with_tokenizer(&args.out, Some(&args.model))
        .with_context(|| format!("saving the merged model to {}", args.out.display()))?;
    let config = model
        .lora_config()
        .context("the adapter attached no LoRA layers")?;
    println!(
        "{}",
        serde_json::json!({
            "merged": args.out.display().to_string(),
            "adapters": model.trainable_parameters().len(),
            "r": config.r,
            "lora_alpha": config.lora_alpha,
        })
    );
    Ok(())
}

fn load_model(dir: &Path) -> anyhow::Result<Transformer> {
    check_model_dir(dir)?;
    Ok(Transformer::load(dir, &Device::Cpu)?)
}

fn load_tokenizer(dir: &Path) -> anyhow::Result<Tokenizer> {
    Ok(Tokenizer::from_dir(dir)?)
}

fn chat_prompt(tokenizer: &Tokenizer, prompt: &str) -> anyhow::Result<Vec<u32>> {
    let messages = [stoke_tokenizer::chat::ChatMessage::user(prompt)];
    let options = stoke_tokenizer::chat::ChatOptions {
        add_generation_prompt: true,
        ..Default::default()
    };
    Ok(tokenizer.apply_chat_template(&messages, &options)?.ids)
}

/// Parses "1,2,3" (spaces allowed); names the flag and the entry that is not a token id.
fn parse_ids(flag: &str, text: &str) -> anyhow::Result<Vec<u32>> {
    text.split(',')
        .enumerate()
        .map(|(index, entry)| {
            let entry = entry.trim();
            entry.parse::<u32>().map_err(|_| {
                anyhow::anyhow!(
                    "{flag}: entry {index} ({entry:?}) is not a token id (an integer from 0 to {})",
                    u32::MAX
                )
            })
        })
        .collect()
}

fn check_ids_in_vocabulary(
    model: &Transformer,
    dir: &Path,
    flag: &str,
    ids: &[u32],
) -> anyhow::Result<()> {
    let vocab_size = model.config().vocab_size;
    if let Some((index, id)) = ids
        .iter()
        .enumerate()
        .find(|(_, id)| **id as usize >= vocab_size)
    {
        bail!(
            "{flag}: token id {id} (entry {index}) is outside the vocabulary: the model {} has `vocab_size` {vocab_size}",
            dir.display()
        );
    }
    if ids.is_empty() {
        bail!("{flag}: the sequence is empty");
    }
    Ok(())
}
