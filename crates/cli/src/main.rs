//! `stoke`: the command-line entry point. Parses arguments with clap and hands each command to
//! its module in `cmd/`. This is the only crate that turns files, flags and the environment into
//! run configurations; the library crates receive validated values.
//!
//! Errors are printed on one line (`error: ...`, with their chain of causes) and the process exits
//! non-zero; no command panics on bad input.

mod cmd;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Parser)]
#[command(name = "stoke", version, about = "A full-stack LLM training system")]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Print the log-probability of every next token of a sequence under a model.
    Score(cmd::model::ScoreArgs),
    /// Generate completions for a prompt.
    Generate(cmd::model::GenerateArgs),
    /// Serve a model over an OpenAI-compatible HTTP API (continuous batching, streaming,
    /// log-probs, live weight updates).
    Serve(cmd::serve::ServeArgs),
    /// Chat in the terminal with a local model or an OpenAI-compatible server (streaming).
    Chat(cmd::serve::ChatArgs),
    /// Serve a GRPO config's rewards (verifiers and the code sandbox) over HTTP, for
    /// `[reward] kind = "remote"`.
    RewardServer(cmd::reward_server::RewardServerArgs),
    /// Run one process of a distributed GRPO run (trainer, rollout server or reward server),
    /// the role read from torchrun, MPI, Slurm or JobSet variables.
    Launch(cmd::launch::LaunchArgs),
    /// Print a model's parsed configuration and parameter count.
    Inspect(cmd::model::InspectArgs),
    /// Fold a LoRA adapter (PEFT layout) into its base model and save the merged model.
    Merge(cmd::model::MergeArgs),
    /// Release a model folder: Hugging Face layout with tokenizer and chat template, a model card
    /// with the training lineage and eval figures; refuses non-finite weights.
    Export(cmd::export::ExportArgs),
    /// Convert between a GGUF file and the Hugging Face folder layout (either direction).
    Convert(cmd::convert::ConvertArgs),
    /// Score completions offline with a reward function.
    Verify(cmd::verify::VerifyArgs),
    /// Evaluate a model folder or an OpenAI-compatible endpoint on tasks described in TOML.
    #[command(subcommand)]
    Eval(cmd::eval::EvalCommand),
    /// The sandbox for untrusted code.
    #[command(subcommand)]
    Sandbox(cmd::sandbox::SandboxCommand),
    /// The data funnel and token data.
    #[command(subcommand)]
    Data(cmd::data::DataCommand),
    /// Tokenizer training and evaluation.
    #[command(subcommand)]
    Tokenizer(cmd::tokenizer::TokenizerCommand),
    /// Train a model (pretraining or SFT) from a TOML run config.
    Train(cmd::train::TrainArgs),
    /// Reinforcement learning with GRPO on the four-module pipeline, from a TOML config.
    Grpo(cmd::grpo::GrpoArgs),
    /// Preference optimization on pairs (DPO family, CPO/SimPO, ORPO) from a TOML config.
    Dpo(cmd::dpo::DpoArgs),
    /// Train a reward model (Bradley-Terry, a sequence-classifier head) on preference pairs;
    /// the `stoke dpo` config with `objective.kind = "reward_model"`.
    Rm(cmd::dpo::DpoArgs),
    /// Train a process reward model (a two-label token classifier scoring each reasoning step)
    /// on stepwise rows (TRL's PRM800K format).
    Prm(cmd::prm::PrmArgs),
    /// Distillation data: a teacher's completions with their token ids, for a student's SFT.
    #[command(subcommand)]
    Distill(cmd::distill::DistillCommand),
    /// Play episodes of an agentic environment with a model and print each transcript with its
    /// loss mask (what GRPO with `[environment]` would train on).
    Env(cmd::env::EnvArgs),
    /// Rejection-sampling fine-tuning: sample k per task, keep the verified-correct, SFT on them.
    Rft(cmd::rft::RftArgs),
    /// RLAIF / Constitutional AI: a judge critiques and revises the policy's answers against
    /// written principles; DPO on the (revision, answer) pairs.
    Rlaif(cmd::rlaif::RlaifArgs),
    /// The R1 order from one config: cold-start SFT, reasoning RL, rejection-sampling SFT, final RL.
    R1(cmd::r1::R1Args),
    /// The main job: data -> tokenizer -> pretraining -> SFT -> evaluation -> report card, on CPU.
    Speedrun(cmd::speedrun::SpeedrunArgs),
}

/// candle 0.11 runs large elementwise ops on a global "barrier pool" whose caller spin-waits for
/// its workers and whose single lock serializes every thread that uses it. On a busy machine the
/// spinning wastes a third of the CPU (bench/README.md: 31% of samples in `BarrierGuard::drop`),
/// and in the GRPO pipeline the rollout and trainer threads queue on that one lock. With
/// `CANDLE_NUM_THREADS=1` the pool has no workers and elementwise ops run inline on the calling
/// thread (matrix products still use rayon): measured faster for training in a quiet window
/// (bench/README.md, issue 5) and 1.4-2.5x faster for asynchronous GRPO on the loaded 2-core VM
/// (bench/GRPO.md). A value the user set is kept.
#[allow(unsafe_code)]
fn default_candle_threads() {
    if std::env::var_os("CANDLE_NUM_THREADS").is_none() {
        // SAFETY: called first thing in `main`, before any other thread exists, so nothing can
        // read the environment concurrently.
        unsafe { std::env::set_var("CANDLE_NUM_THREADS", "1") };
    }
    if std::env::var_os("RAYON_NUM_THREADS").is_none() {
        // candle asks for its matmul thread count on every matmul, and without this variable
        // counts the physical cores by reading /proc/cpuinfo each time (num_cpus): 13% of a
        // small MoE model's decode time went to that. The count it finds, once, for the whole
        // process (rayon's global pool then has as many threads: physical cores).
        let threads = candle_core::utils::get_num_threads();
        // SAFETY: as above, no other thread exists yet.
        unsafe { std::env::set_var("RAYON_NUM_THREADS", threads.to_string()) };
    }
}

fn main() -> ExitCode {
    // A misspelt STOKE_* kernel variable stops the run before any work (docs/src/kernels.md).
    if let Err(error) = stoke_ops::dispatch::check_env() {
        eprintln!("error: {error}");
        return ExitCode::FAILURE;
    }
    default_candle_threads();
    // FTZ/DAZ on every compute thread and the allocator settings for training loops
    // (stoke_ops::numerics, stoke_ops::allocator), before any tensor work.
    stoke_ops::numerics::init_compute_threads();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Score(args) => cmd::model::score(args),
        Command::Generate(args) => cmd::model::generate(args),
        Command::Serve(args) => cmd::serve::serve(args),
        Command::Chat(args) => cmd::serve::chat(args),
        Command::RewardServer(args) => cmd::reward_server::run(args),
        Command::Launch(args) => cmd::launch::run(args),
        Command::Inspect(args) => cmd::model::inspect(args),
        Command::Merge(args) => cmd::model::merge(args),
        Command::Export(args) => cmd::export::run(args),
        Command::Convert(args) => cmd::convert::run(args),
        Command::Verify(args) => cmd::verify::run(args),
        Command::Eval(command) => cmd::eval::run(command),
        Command::Sandbox(command) => cmd::sandbox::run(command),
        Command::Data(command) => cmd::data::run(command),
        Command::Tokenizer(command) => cmd::tokenizer::run(command),
        Command::Train(args) => cmd::train::run_command(args),
        Command::Grpo(args) => cmd::grpo::run_command(args),
        Command::Dpo(args) => cmd::dpo::run_command(args),
        Command::Rm(args) => cmd::dpo::run_reward_model(args),
        Command::Prm(args) => cmd::prm::run_command(args),
        Command::Rft(args) => cmd::rft::run_command(args),
        Command::Rlaif(args) => cmd::rlaif::run_command(args),
        Command::Env(args) => cmd::env::run(args),
        Command::Distill(command) => cmd::distill::run(command),
        Command::R1(args) => cmd::r1::run_command(args),
        Command::Speedrun(args) => cmd::speedrun::run(args),
    };
    match result {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            eprintln!("error: {error:#}");
            ExitCode::FAILURE
        }
    }
}
