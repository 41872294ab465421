//! The speedrun's agent stage: the SFT model learns to use a calculator tool. It is fine-tuned on
//! ideal tool-use conversations (call the tool, read the result, answer), then trained by
//! multi-turn GRPO in the calculator environment, through the same paths as
//! `stoke train <out>/agent-sft.toml` and `stoke grpo <out>/agent-grpo.toml`. The held-out
//! evaluation then plays the same 1,000 problems four ways: the SFT model answering directly,
//! the agent-SFT and the agent-GRPO model with the tool, and the agent-GRPO model without it
//! (one turn: a tool call gets no result).
//!
//! What it is not: the environment (`stoke_env::arithmetic`), the episode loop
//! (`stoke_pipeline::episode`) or the stage's sizes (`recipe.rs`, [`AgentSizes`]).
//!
//! [`AgentSizes`]: super::recipe::AgentSizes

use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use anyhow::Context;
use candle_core::Device;
use serde::Serialize;
use stoke_env::Environment;
use stoke_env::ToolLimits;
use stoke_env::arithmetic::{ArithmeticSpec, arithmetic_tasks, calculator_environment};
use stoke_model::Transformer;
use stoke_pipeline::config::GrpoConfig;
use stoke_pipeline::config::environment::EnvironmentSection;
use stoke_pipeline::env_settings::{EnvironmentKind, ToolsIn};
use stoke_pipeline::episode::{EpisodeSetup, episode_prompts};
use stoke_pipeline::episode_reward::EpisodeRewards;
use stoke_pipeline::held_out::{EvalSampling, evaluate_episodes};
use stoke_pipeline::records::Task;
use stoke_pipeline::reward::RewardPool;
use stoke_tokenizer::hf::Tokenizer;

use super::recipe::{Recipe, StagePaths, agent_held_out_seed, agent_task_seed, write_and_resolve};
use super::rl::{GrpoStageSummary, grpo_run};
use super::training::{TrainStage, TrainingStageSummary, train};
use crate::cmd::grpo::prepare;

/// Labels of the four held-out evaluations.
pub const SFT_NO_TOOLS: &str = "sft, no tools";
pub const AGENT_SFT_TOOLS: &str = "agent-sft, tools";
pub const AGENT_GRPO_TOOLS: &str = "agent-grpo, tools";
pub const AGENT_GRPO_NO_TOOLS: &str = "agent-grpo, no tools";

/// What the agent stage did.
#[derive(Clone, Debug, Serialize)]
pub struct AgentStageSummary {
    pub digits: u32,
    pub traces: usize,
    pub traces_file: PathBuf,
    pub sft: TrainingStageSummary,
    pub grpo: GrpoStageSummary,
    /// The same held-out problems for every evaluation.
    pub held_out_problems: usize,
    pub evaluations: Vec<AgentEvaluation>,
}

/// One model's greedy held-out episodes, with the tool or without it.
#[derive(Clone, Debug, Serialize)]
pub struct AgentEvaluation {
    pub label: String,
    pub model_dir: PathBuf,
    pub tools: bool,
    pub problems: usize,
    pub accuracy: f64,
    /// Standard error of `accuracy` over the problems: sqrt(p (1 - p) / n).
    pub standard_error: f64,
    pub mean_turns: f64,
    pub mean_tool_calls: f64,
    pub tool_use_rate: f64,
    pub seconds: f64,
    /// (task id, transcript, correct) of the first episodes, for the report card.
    #[serde(skip)]
    pub examples: Vec<(String, String, bool)>,
}

/// Runs the stage on the speedrun's SFT model.
pub fn agent(
    recipe: &Recipe,
    out: &Path,
    sft_model: &Path,
    tokenizer_dir: &Path,
    seed: u64,
) -> anyhow::Result<AgentStageSummary> {
    let a = &recipe.agent;
    let dir = out.join("agent");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    // Tool-use traces: training tasks for SFT, a few held-out ones for its evaluation loss.
    let traces_file = dir.join("traces.jsonl");
    write_traces(&traces_file, a.digits, agent_task_seed(seed), a.traces)?;
    let traces_eval = dir.join("traces-eval.jsonl");
    write_traces(&traces_eval, a.digits, agent_held_out_seed(seed), 100)?;
    println!(
        "{} tool-use traces ({}-digit operands) -> {}",
        a.traces,
        a.digits,
        traces_file.display()
    );

    let sft_config = write_and_resolve(
        &recipe.agent_sft_config(
            &StagePaths {
                run_dir: out.join("agent-sft"),
                model_source: sft_model.to_path_buf(),
                tokenizer: tokenizer_dir.to_path_buf(),
                train_data: traces_file.clone(),
                eval_data: Some(traces_eval),
            },
            seed,
        ),
        &out.join("agent-sft.toml"),
    )?;
    let sft = train(TrainStage::Sft, sft_config)?;
    println!(
        "agent SFT: {} steps, loss {:.3} -> {:.3}",
        sft.steps, sft.initial_loss, sft.final_loss
    );

    let grpo_config_path = out.join("agent-grpo.toml");
    let grpo = grpo_run(
        &recipe.agent_grpo_config(&sft.model_dir, &out.join("agent-grpo"), seed)?,
        &grpo_config_path,
    )?;
    println!(
        "agent GRPO: {} updates of {} prompts x {} episodes, reward {:.3} -> {:.3} ({:.2} s per update)",
        grpo.steps,
        grpo.prompts_per_step,
        grpo.group_size,
        grpo.initial_reward,
        grpo.final_reward,
        grpo.seconds_per_step
    );

    // The held-out problems, tokenizer and reward of the GRPO config, for all four evaluations.
    let config = GrpoConfig::load(&grpo_config_path, &[])
        .with_context(|| format!("resolving {}", grpo_config_path.display()))?;
    let prepared = prepare(&config, true)?;
    let evaluations = [
        (SFT_NO_TOOLS, sft_model, false),
        (AGENT_SFT_TOOLS, sft.model_dir.as_path(), true),
        (AGENT_GRPO_TOOLS, grpo.model_dir.as_path(), true),
        (AGENT_GRPO_NO_TOOLS, grpo.model_dir.as_path(), false),
    ]
    .into_iter()
    .map(|(label, model_dir, tools)| {
        let evaluation = evaluate_agent(
            label,
            model_dir,
            tools,
            recipe,
            &prepared.tokenizer,
            &prepared.held_out,
            &prepared.rewards,
            seed,
        )
        .with_context(|| format!("evaluating {label}"))?;
        println!(
            "{label:>21}: accuracy {:.1}% (+/- {:.1}) on {} problems, {:.2} turns and {:.2} tool calls per episode",
            100.0 * evaluation.accuracy,
            100.0 * evaluation.standard_error,
            evaluation.problems,
            evaluation.mean_turns,
            evaluation.mean_tool_calls
        );
        Ok(evaluation)
    })
    .collect::<anyhow::Result<Vec<_>>>()?;
    Ok(AgentStageSummary {
        digits: a.digits,
        traces: a.traces,
        traces_file,
        sft,
        grpo,
        held_out_problems: prepared.held_out.len(),
        evaluations,
    })
}

/// `count` ideal conversations (`{"messages": [...]}` per line) for calculator tasks drawn with
/// `seed`: the environment's opening, then `stoke_env::arithmetic::tool_use_trace`.
fn write_traces(path: &Path, digits: u32, seed: u64, count: usize) -> anyhow::Result<()> {
    let env = calculator_environment(false, ToolLimits::default())?;
    let tasks = arithmetic_tasks(&ArithmeticSpec { digits, seed }, count)?;
    let mut file = std::io::BufWriter::new(
        std::fs::File::create(path).with_context(|| format!("creating {}", path.display()))?,
    );
    for task in &tasks {
        let mut messages = env.opening(task)?.messages;
        messages.extend(stoke_env::arithmetic::tool_use_trace(task));
        let line = serde_json::json!({ "id": task.id, "messages": messages });
        writeln!(file, "{line}").with_context(|| format!("writing {}", path.display()))?;
    }
    file.flush()
        .with_context(|| format!("writing {}", path.display()))
}

/// Greedy episodes of the model in `model_dir` on `tasks`: with the tool (the stage's turn
/// limit), or without it (one turn, so a tool call is never answered).
#[allow(clippy::too_many_arguments)]
fn evaluate_agent(
    label: &str,
    model_dir: &Path,
    tools: bool,
    recipe: &Recipe,
    tokenizer: &Tokenizer,
    tasks: &[Arc<Task>],
    rewards: &[stoke_pipeline::reward::RewardSpec],
    seed: u64,
) -> anyhow::Result<AgentEvaluation> {
    let a = &recipe.agent;
    let settings = EnvironmentSection {
        kind: EnvironmentKind::Calculator,
        tool_call_parser: Some("hermes".to_string()),
        tools_in: Some(ToolsIn::None),
        max_turns: Some(if tools { a.max_turns } else { 1 }),
        max_turn_tokens: Some(a.max_turn_tokens),
        max_total_tokens: None,
        truncated_turns: None,
        env_timeout_s: None,
        tool_timeout_s: None,
        max_tool_calls_per_turn: None,
        max_tool_output_bytes: None,
        tools: None,
        system_prompt: None,
        requires_tool: None,
        mcp: Vec::new(),
        openenv: None,
    }
    .resolve(a.max_turn_tokens)?;
    let template = tokenizer.default_chat_template()?;
    let setup = EpisodeSetup::new(&settings, template)?;
    let tasks = episode_prompts(tasks.to_vec(), &setup, tokenizer)?;
    let model = Transformer::load(model_dir, &Device::Cpu)
        .with_context(|| format!("loading {}", model_dir.display()))?;
    let rewards = EpisodeRewards::new(Box::new(RewardPool::new(
        rewards.to_vec(),
        2,
        Duration::from_secs(30),
    )?));
    let result = evaluate_episodes(
        &model,
        tokenizer,
        &setup,
        &tasks,
        &rewards,
        &EvalSampling {
            samples: 1,
            temperature: 0.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: a.max_turn_tokens,
            seed,
        },
    )?;
    let p = result.greedy_pass_at_1;
    let n = result.problems.max(1) as f64;
    let episodes = result.episodes.clone().unwrap_or_default();
    Ok(AgentEvaluation {
        label: label.to_string(),
        model_dir: model_dir.to_path_buf(),
        tools,
        problems: result.problems,
        accuracy: p,
        standard_error: (p * (1.0 - p) / n).sqrt(),
        mean_turns: episodes.mean_turns,
        mean_tool_calls: episodes.mean_tool_calls,
        tool_use_rate: episodes.tool_use_rate,
        seconds: result.seconds,
        examples: result.examples,
    })
}
