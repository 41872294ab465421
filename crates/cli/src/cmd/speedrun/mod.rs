//! `stoke speedrun`: the main job. The whole training pipeline in miniature, on CPU, on data it
//! generates: arithmetic word problems -> tokenizer -> token shards -> pretraining from scratch ->
//! SFT on chat conversations -> preference optimization (DPO, APO-zero) on the SFT model's own
//! verified samples -> GRPO with the exact-match reward on the four-module pipeline -> an agent
//! stage (SFT on calculator tool-use traces, then multi-turn GRPO with the tool, evaluated with
//! and without it) -> distillation of the GRPO model into a student of half its depth (offline, then on-policy),
//! beside the same student trained by SFT alone -> held-out exact-match accuracy of every model ->
//! report card and a final model folder that `stoke generate --chat` can talk to.
//!
//! `run` below reads as the algorithm, one stage per block; each stage lives in its own module
//! and hands typed records (and folders) to the next. Sizes come from [`recipe::Recipe`] (`full`
//! by default, about twelve minutes on two cores; `--quick`, about five).
//!
//! Outputs under `--out` (default `runs/speedrun`, or `runs/speedrun-quick`): `data/`,
//! `tokenizer/`, `shards/`, `pretrain/` and `sft/` (trainer run folders with config.toml,
//! metrics.jsonl, report.html, model/), `preference/` (the sampled pairs and one run folder per
//! loss), `grpo/` (the GRPO run folder), `agent/` (the tool-use traces), `agent-sft/` and
//! `agent-grpo/` (the agent stage's run folders), `distill/` (the students, their data and run folders),
//! `model_config.json` (the architecture), `pretrain.toml`, `sft.toml`, `dpo-<loss>.toml`,
//! `grpo.toml`, `agent-sft.toml`, `agent-grpo.toml` and `distill-*.toml` (the stage configs, for `stoke train`, `stoke dpo` and
//! `stoke grpo`), `eval/*.jsonl` (every evaluated
//! completion), `model/` (the final model, Hugging Face layout with tokenizer files),
//! `report.html` (the report card) and `speedrun.json` (the summary the integration test
//! reads). A rerun into the same folder replaces these.
//!
//! Adding a stage: train from the previous stage's `model_dir`, append its accuracy to
//! `evaluations` and its summary to the report card; nothing else changes.

mod agent;
mod data;
mod distill;
mod preference;
mod recipe;
mod report_card;
mod rl;
mod shards;
mod summary;
mod tokenizer;
mod training;

use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::Context;
use candle_core::Device;
use clap::Args;
use stoke_eval::accuracy::{AccuracyConfig, evaluate};
use stoke_model::Transformer;

use recipe::{Recipe, StagePaths, write_and_resolve};
use summary::{ModelEvaluation, SpeedrunSummary, StageTiming};
use training::{TrainStage, train};

#[derive(Args)]
pub struct SpeedrunArgs {
    /// The small version (under two minutes; used by the integration test).
    #[arg(long)]
    quick: bool,
    /// Output folder (default runs/speedrun, or runs/speedrun-quick with --quick).
    #[arg(long)]
    out: Option<PathBuf>,
    /// Seed of the data, the model's initialization and the data order.
    #[arg(long, default_value_t = 0)]
    seed: u64,
    /// Pretraining and SFT keep a checkpoint every this many steps (0: one at the end), a
    /// series for `stoke eval run --checkpoints OUT/pretrain/checkpoints` and `stoke eval
    /// quality`.
    #[arg(long, default_value_t = 0)]
    checkpoint_every: u64,
}

/// Folders and files a previous run into the same `--out` left; removed before a new run.
const OUTPUTS: [&str; 24] = [
    "data",
    "tokenizer",
    "shards",
    "pretrain",
    "sft",
    "grpo",
    "grpo.toml",
    "agent",
    "agent-sft",
    "agent-sft.toml",
    "agent-grpo",
    "agent-grpo.toml",
    "distill",
    "distill-student-sft.toml",
    "distill-offline.toml",
    "distill-on-policy.toml",
    "preference",
    "eval",
    "model",
    "model_config.json",
    "pretrain.toml",
    "sft.toml",
    "report.html",
    "speedrun.json",
];

pub fn run(args: SpeedrunArgs) -> anyhow::Result<()> {
    stoke_ops::numerics::init_compute_threads();
    let started = Instant::now();
    let recipe = if args.quick {
        Recipe::quick()
    } else {
        Recipe::full()
    };
    let out = args.out.clone().unwrap_or_else(|| {
        PathBuf::from(if args.quick {
            "runs/speedrun-quick"
        } else {
            "runs/speedrun"
        })
    });
    let out = prepare_out_dir(&out)?;
    let seed = args.seed;
    let mut timings = Vec::new();
    println!(
        "stoke speedrun ({} recipe, seed {seed}) -> {}",
        recipe.name,
        out.display()
    );

    // 1. Data: arithmetic word problems, a pretraining corpus and chat conversations.
    let clock = stage_header(1, "data: generating arithmetic word problems");
    let generated = data::generate(&recipe, &out, seed)?;
    let data_stats = generated.stats(&recipe);
    println!(
        "{} documents ({} problems, {:.1} MB) for pretraining, {} conversations for SFT, {} held-out problems",
        data_stats.corpus_documents,
        data_stats.corpus_problems,
        data_stats.corpus_bytes as f64 / 1e6,
        data_stats.sft_conversations,
        data_stats.held_out_problems
    );
    timings.push(StageTiming::done("data", clock));

    // 2. Tokenizer: byte-level BPE trained on that text, with a ChatML chat template.
    let clock = stage_header(2, "tokenizer: training a byte-level BPE");
    let (tokenizer, tokenizer_stats) =
        tokenizer::train_chat_tokenizer(&generated.tokenizer_texts, recipe.vocab_size, &out)?;
    println!(
        "vocabulary {} ({} merges), {:.2} bytes per token -> {}",
        tokenizer_stats.vocab_size,
        tokenizer_stats.merges,
        tokenizer_stats.bytes_per_token,
        tokenizer_stats.dir.display()
    );
    timings.push(StageTiming::done("tokenizer", clock));

    // 3. Shards: the corpus as token ids.
    let clock = stage_header(3, "shards: tokenizing the corpus");
    let corpus_eval_texts = data::read_texts(&generated.corpus_eval.path)?;
    let corpus_texts = data::read_texts(&generated.corpus.path)?;
    let shard_stats = shards::write_shards(&tokenizer, &corpus_texts, &corpus_eval_texts, &out)?;
    println!(
        "{} training tokens in {} documents, {} evaluation tokens -> {}",
        shard_stats.train.tokens,
        shard_stats.train.documents,
        shard_stats.eval.tokens,
        shard_stats.train.dir.display()
    );
    timings.push(StageTiming::done("shards", clock));

    // 4. Pretraining: a small Llama from scratch on the shards.
    let clock = stage_header(4, "pretraining a small Llama from scratch");
    let model_config_path = out.join("model_config.json");
    let model_config = recipe.model_config_json(tokenizer.vocab_size(), &tokenizer.eos_token_ids());
    std::fs::write(
        &model_config_path,
        serde_json::to_string_pretty(&model_config)?,
    )
    .with_context(|| format!("writing {}", model_config_path.display()))?;
    let pretrain_config = write_and_resolve(
        &recipe.pretrain_config(
            &StagePaths {
                run_dir: out.join("pretrain"),
                model_source: model_config_path,
                tokenizer: tokenizer_stats.dir.clone(),
                train_data: shard_stats.train.dir.clone(),
                eval_data: Some(shard_stats.eval.dir.clone()),
            },
            seed,
            args.checkpoint_every,
        ),
        &out.join("pretrain.toml"),
    )?;
    let pretrain = train(TrainStage::Pretrain, pretrain_config)?;
    println!(
        "{} parameters, {} steps, loss {:.3} -> {:.3} ({:.0} tokens/s)",
        pretrain.parameters,
        pretrain.steps,
        pretrain.initial_loss,
        pretrain.final_loss,
        pretrain.tokens_per_s
    );
    timings.push(StageTiming::done("pretrain", clock));

    // 5. SFT: the pretrained model on chat conversations, loss on the assistant's replies.
    let clock = stage_header(5, "supervised fine-tuning on chat conversations");
    let sft_config = write_and_resolve(
        &recipe.sft_config(
            &StagePaths {
                run_dir: out.join("sft"),
                model_source: pretrain.model_dir.clone(),
                tokenizer: tokenizer_stats.dir.clone(),
                train_data: generated.sft.path.clone(),
                eval_data: Some(generated.held_out_chat.path.clone()),
            },
            seed,
            args.checkpoint_every,
        ),
        &out.join("sft.toml"),
    )?;
    let sft = train(TrainStage::Sft, sft_config)?;
    println!(
        "{} steps, loss {:.3} -> {:.3}",
        sft.steps, sft.initial_loss, sft.final_loss
    );
    timings.push(StageTiming::done("sft", clock));

    // 6. Preference optimization on the SFT model's own verified samples.
    let clock = stage_header(
        6,
        "preference optimization: DPO and APO-zero on the SFT model's verified samples",
    );
    let preference = preference::preference(&recipe, &out, &sft.model_dir, seed)?;
    timings.push(StageTiming::done("preference", clock));

    // 7. GRPO: reinforcement learning with the exact-match reward on the SFT model.
    let clock = stage_header(7, "GRPO: reinforcement learning with verifiable rewards");
    let grpo = rl::grpo(&recipe, &out, &sft.model_dir, seed)?;
    println!(
        "{} updates of {} prompts x {} samples, reward {:.3} -> {:.3} ({:.2} s per update, {:.0} samples/s)",
        grpo.steps,
        grpo.prompts_per_step,
        grpo.group_size,
        grpo.initial_reward,
        grpo.final_reward,
        grpo.seconds_per_step,
        grpo.samples_per_second
    );
    timings.push(StageTiming::done("grpo", clock));

    // 8. Agent: the SFT model learns to use a calculator tool (SFT on tool-use traces, then
    // multi-turn GRPO in the calculator environment), evaluated with and without the tool.
    let clock = stage_header(
        8,
        "agent: SFT on calculator tool-use traces, then multi-turn GRPO with the tool",
    );
    let agent = agent::agent(&recipe, &out, &sft.model_dir, &tokenizer_stats.dir, seed)?;
    timings.push(StageTiming::done("agent", clock));

    // 9. Distillation: a student of half the depth, distilled from the GRPO model, beside the
    // same student trained by SFT alone on the same budget.
    let clock = stage_header(
        9,
        "distillation: the GRPO model into a student of half its depth, offline then on-policy",
    );
    let distill = distill::distill(
        &recipe,
        &out,
        &distill::DistillInputs {
            pretrained: &pretrain.model_dir,
            teacher: &grpo.model_dir,
            tokenizer_dir: &tokenizer_stats.dir,
            sft_data: &generated.sft.path,
            held_out_chat: &generated.held_out_chat.path,
            held_out: &generated.held_out,
        },
        seed,
    )?;
    timings.push(StageTiming::done("distill", clock));

    // 10. Evaluation: held-out exact-match accuracy of each model on the same prompts.
    let clock = stage_header(10, "evaluation: held-out exact-match accuracy");
    let accuracy_config = AccuracyConfig {
        batch_size: recipe.eval_batch_size,
        max_new_tokens: recipe.eval_max_new_tokens,
    };
    let mut evaluations = Vec::new();
    let mut models = vec![("pretrained", &pretrain.model_dir), ("sft", &sft.model_dir)];
    for run in &preference.runs {
        models.push((run.label.as_str(), &run.model_dir));
    }
    models.push(("grpo", &grpo.model_dir));
    models.push((distill::SFT_ONLY, &distill.sft_only.model_dir));
    models.push((distill::OFFLINE, &distill.offline.model_dir));
    models.push((distill::DISTILLED, &distill.on_policy.model_dir));
    for (label, model_dir) in models {
        let model = Transformer::load(model_dir, &Device::Cpu)
            .with_context(|| format!("loading {}", model_dir.display()))?;
        let report = evaluate(&model, &tokenizer, &generated.held_out, &accuracy_config)
            .with_context(|| format!("evaluating the {label} model"))?;
        let evaluation = ModelEvaluation::record(label, model_dir, report, &out.join("eval"))?;
        println!(
            "{label:>10}: accuracy {:.1}% (flexible {:.1}%, answer format {:.1}%) on {} problems",
            100.0 * evaluation.accuracy,
            100.0 * evaluation.flexible_accuracy,
            100.0 * evaluation.format_rate,
            evaluation.samples
        );
        evaluations.push(evaluation);
    }
    timings.push(StageTiming::done("evaluation", clock));

    // 11. Outputs: the final model folder, the report card and the summary.
    let clock = stage_header(11, "report card and final model");
    let final_model = out.join("model");
    copy_dir(&grpo.model_dir, &final_model)?;
    Transformer::load(&final_model, &Device::Cpu)
        .with_context(|| format!("checking the final model {}", final_model.display()))?;
    timings.push(StageTiming::done("outputs", clock));
    let summary = SpeedrunSummary {
        recipe: recipe.name.to_string(),
        seed,
        out_dir: out.clone(),
        data: data_stats,
        tokenizer: tokenizer_stats,
        shards: shard_stats,
        pretrain,
        sft,
        preference,
        grpo,
        agent,
        distill,
        evaluations,
        final_model: final_model.clone(),
        report: out.join("report.html"),
        stages: timings,
        total_seconds: started.elapsed().as_secs_f64(),
    };
    report_card::write(&summary, &recipe)?;
    summary.write(&out.join("speedrun.json"))?;

    println!(
        "\ndone in {:.0} s. Report card: {}\nSummary: {}\nChat with the final model:\n  stoke generate --model {} --chat --temperature 0 --max-tokens 64 --format text --prompt \"{}\"",
        summary.total_seconds,
        summary.report.display(),
        out.join("speedrun.json").display(),
        final_model.display(),
        generated.held_out.first().map_or(
            "Mia has 3 apples. She buys 4 more. How many apples does Mia have now?",
            |p| p.question.as_str()
        )
    );
    Ok(())
}

/// Prints a stage header and starts its clock.
fn stage_header(number: usize, title: &str) -> Instant {
    println!("\n== stage {number}: {title} ==");
    Instant::now()
}

/// Creates `out` (absolute), removing what an earlier speedrun wrote there (only the names in
/// [`OUTPUTS`]; anything else in the folder is left alone).
fn prepare_out_dir(out: &Path) -> anyhow::Result<PathBuf> {
    std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
    let out = std::path::absolute(out).with_context(|| format!("resolving {}", out.display()))?;
    for name in OUTPUTS {
        let path = out.join(name);
        let removed = if path.is_dir() {
            std::fs::remove_dir_all(&path)
        } else if path.exists() {
            std::fs::remove_file(&path)
        } else {
            Ok(())
        };
        removed.with_context(|| format!("removing the earlier run's {}", path.display()))?;
    }
    Ok(out)
}

/// Copies the files of a flat folder (a model folder) into `to`.
fn copy_dir(from: &Path, to: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(to).with_context(|| format!("creating {}", to.display()))?;
    for entry in std::fs::read_dir(from).with_context(|| format!("reading {}", from.display()))? {
        let entry = entry.with_context(|| format!("reading {}", from.display()))?;
        if entry.path().is_file() {
            std::fs::copy(entry.path(), to.join(entry.file_name()))
                .with_context(|| format!("copying {}", entry.path().display()))?;
        }
    }
    Ok(())
}
