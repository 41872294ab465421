//! `stoke env`: play episodes of an environment with a local model and print each transcript
//! with its loss mask, for debugging an environment (its prompt, its tool messages, where its
//! episodes stop) before training on it.
//!
//! What it is: flag parsing around the pipeline's episode runner, the same code a GRPO run with
//! `[environment]` uses, with the same keys (`--max-turns` is `environment.max_turns`, ...). The
//! output shows every segment of the sequence the trainer would see: the prompt, the model's
//! turns (trained) and the environment's template-rendered turns (masked), then the stop
//! reason, the tool calls, the environment's outcome reward (code repair: the share of the
//! hidden-test gap closed), the final answer's exact-match verdict when the task has a gold
//! answer, and whether re-rendering the transcript reproduces every id. What it is not: an
//! OpenAI-endpoint client yet (episodes on a served model arrive with remote multi-turn
//! rollout), or a trainer.

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use candle_core::Device;
use clap::{Args, ValueEnum};
use serde_json::json;
use stoke_env::arithmetic::{ArithmeticSpec, arithmetic_tasks};
use stoke_env::{CodeRepairSpec, EnvTask, Segment, TurnRenderer, code_repair_tasks};
use stoke_model::{ModelConfig, Transformer};
use stoke_pipeline::config::environment::EnvironmentSection;
use stoke_pipeline::env_settings::{EnvironmentKind, ToolsIn};
use stoke_pipeline::episode::{EpisodeGroup, EpisodeRunner, EpisodeSetup, EpisodeStats};
use stoke_pipeline::remote::{Endpoint, Engine};
use stoke_reward::exact_match::{ExactMatchConfig, ExactMatchVerifier, MatchMode};
use stoke_reward::{RewardInput, Verifier};
use stoke_rollout::{FixedWeights, SamplingParams};
use stoke_tokenizer::hf::Tokenizer;

#[derive(Args)]
pub struct EnvArgs {
    /// Model directory (config.json, safetensors, tokenizer files with a chat template).
    #[arg(long)]
    model: PathBuf,
    /// The environment (`environment.kind`).
    #[arg(long, value_enum, default_value_t = EnvKindArg::Calculator)]
    environment: EnvKindArg,
    /// The task's prompt; default: tasks drawn like `[tasks] kind = "calculator"` (or
    /// `"code_repair"` for that environment).
    #[arg(long)]
    prompt: Option<String>,
    /// The gold answer of --prompt (for the exact-match verdict).
    #[arg(long, requires = "prompt")]
    answer: Option<String>,
    /// Drawn tasks: operand digits (calculator), bugs per repository and the functions to draw
    /// from (code_repair; default all), seed, and how many.
    #[arg(long, default_value_t = 5)]
    digits: u32,
    #[arg(long, default_value_t = 2)]
    max_bugs: usize,
    #[arg(long, value_delimiter = ',')]
    templates: Vec<String>,
    #[arg(long, default_value_t = 0)]
    task_seed: u64,
    #[arg(long, default_value_t = 1)]
    tasks: usize,
    /// Episodes per task (a GRPO group).
    #[arg(long, default_value_t = 1)]
    samples: usize,
    /// Sampling temperature; 0 is greedy.
    #[arg(long, default_value_t = 0.0)]
    temperature: f32,
    #[arg(long, default_value_t = 0)]
    seed: u64,
    #[arg(long, default_value_t = 4)]
    max_turns: usize,
    #[arg(long, default_value_t = 256)]
    max_turn_tokens: usize,
    /// A turn cut at --max-turn-tokens: end the episode, or close the turn and go on.
    #[arg(long, default_value = "end")]
    truncated_turns: String,
    /// Default: max_turns * max_turn_tokens.
    #[arg(long)]
    max_total_tokens: Option<usize>,
    /// Tool-call format: auto (from the chat template, else hermes) or a parser name.
    #[arg(long, default_value = "auto")]
    tool_call_parser: String,
    /// Where tools are shown: auto, template, system, or none (a model fine-tuned on them).
    #[arg(long, value_enum, default_value_t = ToolsInArg::Auto)]
    tools_in: ToolsInArg,
    /// Matmul precision.
    #[arg(long, default_value = "f32")]
    precision: stoke_types::Precision,
    #[arg(long, value_enum, default_value_t = Format::Text)]
    format: Format,
    /// Instead of playing the model: play the environment's scripted expert (calculator,
    /// code_repair) on the drawn tasks and write each conversation that scores 1 (the
    /// environment's outcome, or the final answer's exact match where the environment grades
    /// none) as an SFT line (`{"id", "messages", "score"}`) to this file. The model's weights are
    /// not loaded (its tokenizer and template decide how the tools are shown).
    #[arg(long, value_name = "FILE", conflicts_with = "endpoint")]
    demonstrations: Option<PathBuf>,
    /// Sample every turn on this OpenAI-compatible server (`stoke serve` or vLLM, e.g.
    /// http://127.0.0.1:8000) instead of loading the weights of --model, which then gives only
    /// the tokenizer, chat template and config.json. The server must tokenize as --model does.
    #[arg(long, value_name = "URL")]
    endpoint: Option<String>,
    /// The served model's name (default: the first one the endpoint lists).
    #[arg(long, requires = "endpoint")]
    served_model: Option<String>,
    /// The endpoint's software: auto (`stoke serve` if it answers /weights/checksum, else vLLM),
    /// stoke, or vllm.
    #[arg(long, value_enum, default_value_t = EngineArg::Auto, requires = "endpoint")]
    engine: EngineArg,
    /// Seconds one endpoint request may take.
    #[arg(long, default_value_t = 600, requires = "endpoint")]
    request_timeout_s: u64,
}

#[derive(Clone, Copy, ValueEnum)]
enum EngineArg {
    Auto,
    Stoke,
    Vllm,
}

/// The names are the config's (`environment.kind`), so `--environment guess_number` works.
#[derive(Clone, Copy, ValueEnum)]
enum EnvKindArg {
    Calculator,
    #[value(name = "guess_number")]
    GuessNumber,
    #[value(name = "code_repair")]
    CodeRepair,
}

#[derive(Clone, Copy, ValueEnum)]
enum ToolsInArg {
    Auto,
    Template,
    System,
    None,
}

#[derive(Clone, Copy, ValueEnum)]
enum Format {
    Text,
    Json,
}

pub fn run(args: EnvArgs) -> anyhow::Result<()> {
    let tokenizer = Tokenizer::from_dir(&args.model)
        .with_context(|| format!("loading the tokenizer of {}", args.model.display()))?;
    let template = tokenizer
        .default_chat_template()
        .with_context(|| format!("{} has no chat template", args.model.display()))?;
    let section = EnvironmentSection {
        kind: match args.environment {
            EnvKindArg::Calculator => EnvironmentKind::Calculator,
            EnvKindArg::GuessNumber => EnvironmentKind::GuessNumber,
            EnvKindArg::CodeRepair => EnvironmentKind::CodeRepair,
        },
        tool_call_parser: Some(args.tool_call_parser.clone()),
        tools_in: Some(match args.tools_in {
            ToolsInArg::Auto => ToolsIn::Auto,
            ToolsInArg::Template => ToolsIn::Template,
            ToolsInArg::System => ToolsIn::System,
            ToolsInArg::None => ToolsIn::None,
        }),
        max_turns: Some(args.max_turns),
        max_turn_tokens: Some(args.max_turn_tokens),
        max_total_tokens: args.max_total_tokens,
        truncated_turns: Some(args.truncated_turns.clone()),
        env_timeout_s: None,
        tool_timeout_s: None,
        max_tool_calls_per_turn: None,
        max_tool_output_bytes: None,
        tools: None,
        system_prompt: None,
        requires_tool: None,
        mcp: Vec::new(),
        openenv: None,
    };
    let settings = section.resolve(args.max_turn_tokens)?;
    let setup = EpisodeSetup::new(&settings, template)?;
    let runner = setup.runner(&tokenizer, template);
    if matches!(args.environment, EnvKindArg::CodeRepair) && args.prompt.is_some() {
        bail!("--environment code_repair plays drawn repositories: leave --prompt out");
    }
    let tasks: Vec<EnvTask> = match &args.prompt {
        Some(prompt) => vec![EnvTask {
            id: "prompt".into(),
            prompt: prompt.clone(),
            reference: stoke_reward::Reference {
                answer: args.answer.clone(),
                ..Default::default()
            },
            data: Default::default(),
        }],
        None if matches!(args.environment, EnvKindArg::CodeRepair) => code_repair_tasks(
            &CodeRepairSpec {
                seed: args.task_seed,
                max_bugs: args.max_bugs,
                templates: args.templates.clone(),
            },
            args.tasks,
        )?,
        None => arithmetic_tasks(
            &ArithmeticSpec {
                digits: args.digits,
                seed: args.task_seed,
            },
            args.tasks,
        )?,
    };
    if tasks.is_empty() || args.samples == 0 {
        bail!("nothing to play: --tasks and --samples must be at least 1");
    }
    if let Some(path) = &args.demonstrations {
        return write_demonstrations(path, &args, &runner, &tasks);
    }
    let groups: Vec<EpisodeGroup> = tasks
        .iter()
        .enumerate()
        .map(|(index, task)| {
            let (opening, prompt_ids) = runner
                .open(task)
                .with_context(|| format!("opening task {}", task.id))?;
            Ok(EpisodeGroup {
                group_id: index as u64,
                task: Arc::new(task.clone()),
                opening,
                prompt_ids,
            })
        })
        .collect::<anyhow::Result<_>>()?;
    let config = ModelConfig::from_file(&args.model.join("config.json"))
        .with_context(|| format!("reading {}", args.model.join("config.json").display()))?;
    let mut stop_token_ids = tokenizer.eos_token_ids();
    stop_token_ids.extend(config.eos_token_ids.iter().copied());
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    let params = SamplingParams {
        max_new_tokens: args.max_turn_tokens,
        temperature: args.temperature,
        top_k: None,
        top_p: 1.0,
        seed: args.seed,
        n: args.samples,
        stop_token_ids,
        stop_strings: Vec::new(),
    };
    let mut stats = EpisodeStats::default();
    let (records, started) = match &args.endpoint {
        Some(url) => {
            let endpoint = Endpoint::connect(
                url,
                args.served_model.clone(),
                match args.engine {
                    EngineArg::Auto => None,
                    EngineArg::Stoke => Some(Engine::Stoke),
                    EngineArg::Vllm => Some(Engine::Vllm),
                },
                &tokenizer,
                config.vocab_size,
                config.max_position_embeddings,
                std::time::Duration::from_secs(args.request_timeout_s),
            )?;
            eprintln!(
                "endpoint {url}: model `{}` on {}, {} positions",
                endpoint.model_name(),
                endpoint.engine().name(),
                endpoint.max_model_len()
            );
            let started = std::time::Instant::now();
            let records = runner
                .run_on(&endpoint, &params, &groups, &mut stats)
                .with_context(|| format!("playing the episodes on {url}"))?;
            (records, started)
        }
        None => {
            let mut model = Transformer::load(&args.model, &Device::Cpu)
                .with_context(|| format!("loading {}", args.model.display()))?
                .with_precision(args.precision);
            if args.precision == stoke_types::Precision::Bf16 {
                model.pack_weights()?;
            }
            let weights = FixedWeights {
                model: Arc::new(model),
                version: 0,
            };
            let started = std::time::Instant::now();
            let records = runner
                .run(&weights, &params, &groups, &mut stats)
                .context("playing the episodes")?;
            (records, started)
        }
    };
    let seconds = started.elapsed().as_secs_f64();
    let verifier = ExactMatchVerifier::new(&ExactMatchConfig {
        mode: MatchMode::Gsm8k,
        extract_answer: true,
    })?;
    let tools = if setup.tools_in_template {
        groups[0].opening.tools.clone()
    } else {
        Vec::new()
    };
    let renderer = TurnRenderer::new(&tokenizer, template, &tools)?;
    let mut correct = 0usize;
    for (group, episodes) in groups.iter().zip(&records) {
        for (sample, record) in episodes.iter().enumerate() {
            let transcript = &record.transcript;
            let verdict = group.task.reference.answer.as_ref().map(|_| {
                let input = RewardInput::new(
                    &group.task.prompt,
                    transcript.final_text(),
                    &group.task.reference,
                );
                verifier.score(&input).score
            });
            if verdict.is_some_and(|score| score > 0.0) {
                correct += 1;
            }
            let exact = renderer.verify(transcript);
            match args.format {
                Format::Json => {
                    let segments: Vec<_> = transcript
                        .segments
                        .iter()
                        .map(|segment| match segment {
                            Segment::Model {
                                ids,
                                logprobs,
                                text,
                                ..
                            } => json!({
                                "source": "model", "trained": true, "ids": ids,
                                "logprobs": logprobs, "text": text,
                            }),
                            Segment::Close { ids } => json!({
                                "source": "close", "trained": false, "ids": ids,
                                "text": tokenizer.decode(ids, false).unwrap_or_default(),
                            }),
                            Segment::Env { ids, messages } => json!({
                                "source": "environment", "trained": false, "ids": ids,
                                "text": tokenizer.decode(ids, false).unwrap_or_default(),
                                "messages": messages,
                            }),
                        })
                        .collect();
                    println!(
                        "{}",
                        json!({
                            "task": group.task.id, "sample": sample,
                            "prompt_ids": transcript.prompt_ids,
                            "prompt": tokenizer.decode(&transcript.prompt_ids, false).unwrap_or_default(),
                            "segments": segments,
                            "stop": record.stop,
                            "turn_rewards": record.turn_rewards,
                            "outcome_reward": record.outcome_reward,
                            "tool_calls": record.tool_calls,
                            "final_text": transcript.final_text(),
                            "exact_match": verdict,
                            "rerender_exact": exact.is_ok(),
                            "rerender_error": exact.err(),
                        })
                    );
                }
                Format::Text => {
                    println!(
                        "=== task {} sample {sample}: stop {}, {} model turn(s), {} tool call(s) ===",
                        group.task.id,
                        record.stop.name(),
                        transcript.model_turns(),
                        record.tool_calls.len()
                    );
                    println!(
                        "--- prompt ({} ids, not trained) ---\n{}",
                        transcript.prompt_ids.len(),
                        tokenizer
                            .decode(&transcript.prompt_ids, false)
                            .unwrap_or_default()
                    );
                    for segment in &transcript.segments {
                        match segment {
                            Segment::Model { ids, .. } => println!(
                                "--- model ({} ids, trained) ---\n{}",
                                ids.len(),
                                tokenizer.decode(ids, false).unwrap_or_default()
                            ),
                            Segment::Close { ids } => println!(
                                "--- turn closed at its token limit ({} id, masked) ---\n{}",
                                ids.len(),
                                tokenizer.decode(ids, false).unwrap_or_default()
                            ),
                            Segment::Env { ids, .. } => println!(
                                "--- environment ({} ids, masked) ---\n{}",
                                ids.len(),
                                tokenizer.decode(ids, false).unwrap_or_default()
                            ),
                        }
                    }
                    println!(
                        "--- end: {:?}, environment outcome {}",
                        record.stop, record.outcome_reward
                    );
                    if let Some(score) = verdict {
                        println!(
                            "final answer {:?}: exact match {} (gold {})",
                            transcript.final_text(),
                            score,
                            group.task.reference.answer.as_deref().unwrap_or_default()
                        );
                    }
                    match &exact {
                        Ok(()) => println!("re-render: every id reproduced"),
                        Err(error) => println!("re-render: DIFFERS: {error}"),
                    }
                }
            }
        }
    }
    let episodes = stats.episodes.max(1) as f64;
    eprintln!(
        "{} episode(s) in {seconds:.2}s: {:.2} model turns and {:.2} tool calls per episode, {} \
         exact; tools {:.1}% of the time",
        stats.episodes,
        stats.model_turns as f64 / episodes,
        stats.tool_calls as f64 / episodes,
        correct,
        100.0 * stats.tool_seconds / seconds.max(1e-9)
    );
    Ok(())
}

/// `--demonstrations`: the scripted expert's episodes on `tasks`, played through the
/// environment; the ones scoring 1 with no failed tool call are written, the others
/// counted (a script that fails its environment is reported, not trained on).
fn write_demonstrations(
    path: &std::path::Path,
    args: &EnvArgs,
    runner: &EpisodeRunner<'_>,
    tasks: &[EnvTask],
) -> anyhow::Result<()> {
    use std::io::Write;
    if matches!(args.environment, EnvKindArg::GuessNumber) {
        bail!(
            "--demonstrations: guess_number has no scripted expert (calculator and code_repair do)"
        );
    }
    let expert = |task: &EnvTask| -> anyhow::Result<Vec<String>> {
        Ok(match args.environment {
            EnvKindArg::CodeRepair => stoke_env::code_repair::expert_turns(task)?,
            _ => stoke_env::arithmetic::expert_turns(task),
        })
    };
    let verifier = ExactMatchVerifier::new(&ExactMatchConfig {
        mode: MatchMode::Gsm8k,
        extract_answer: true,
    })?;
    let mut out = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    let (mut kept, mut dropped, mut longest_turn, mut tokens) = (0usize, 0usize, 0usize, 0usize);
    let progress = indicatif::ProgressBar::new(tasks.len() as u64).with_style(
        indicatif::ProgressStyle::with_template("demonstrations {bar:30} {pos}/{len} {eta}")
            .unwrap_or_else(|_| indicatif::ProgressStyle::default_bar()),
    );
    for task in tasks {
        let turns = expert(task)?;
        let demonstration = runner
            .demonstrate(task, &turns)
            .with_context(|| format!("playing the expert on task {}", task.id))?;
        progress.inc(1);
        // The environment's outcome where it grades one (code repair), else the final answer
        // against the task's gold answer (the calculator's tasks).
        let score = if runner.env.grades_outcome() {
            demonstration.outcome
        } else {
            let last = turns.last().map(String::as_str).unwrap_or_default();
            verifier
                .score(&RewardInput::new(&task.prompt, last, &task.reference))
                .score
        };
        if score < 1.0 || demonstration.failed_tool_calls > 0 {
            dropped += 1;
            eprintln!(
                "task {}: the expert's episode scored {score} with {} failed tool call(s); not \
                 written",
                task.id, demonstration.failed_tool_calls
            );
            continue;
        }
        kept += 1;
        longest_turn = longest_turn.max(demonstration.max_turn_tokens);
        tokens += demonstration.total_tokens;
        let line = json!({
            "id": task.id,
            "messages": demonstration.messages,
            "score": score,
        });
        writeln!(out, "{line}").with_context(|| format!("writing {}", path.display()))?;
    }
    progress.finish_and_clear();
    out.flush()
        .with_context(|| format!("writing {}", path.display()))?;
    eprintln!(
        "{kept} demonstration(s) written to {} ({dropped} dropped); longest turn {longest_turn} \
         tokens (--max-turn-tokens {}), {:.0} tokens per conversation",
        path.display(),
        args.max_turn_tokens,
        tokens as f64 / kept.max(1) as f64
    );
    if longest_turn > args.max_turn_tokens {
        eprintln!(
            "warning: a scripted turn is longer than --max-turn-tokens: raise \
             environment.max_turn_tokens to at least {longest_turn} for GRPO after this warm start"
        );
    }
    if kept == 0 {
        bail!("no demonstration earned the full outcome");
    }
    Ok(())
}
