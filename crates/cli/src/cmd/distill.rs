//! `stoke distill generate CONFIG.toml [--set key=value]... [--quiet]`: offline (sequence-level)
//! distillation data. A teacher samples `n` completions per prompt; every distinct one is kept
//! (or, with `verify = true`, only the verified-correct ones, as `stoke rft` does) and written as
//! chat JSONL with the exact token ids: `prompt_ids` (the prompt as the teacher was given it,
//! chat template applied) and `completion_ids` (what it sampled, ending in its stop token).
//! `stoke train`'s SFT reader trains the student on those ids as they are, so nothing is
//! retokenized (a re-encoding of the decoded text can differ from what the teacher chose).
//!
//! ```toml
//! [model]
//! path = "runs/speedrun/model"   # the teacher (HF folder with tokenizer files and chat template)
//! student = "runs/student/model" # optional: refused unless it shares the teacher's tokenizer
//! top_k_logprobs = 20            # optional: also store the teacher's 20 most likely ids and
//!                                # log-probs at every completion token (`teacher_topk_ids`,
//!                                # `teacher_topk_logprobs`), for `[distill]` without a teacher
//! [tasks]                        # as in `stoke grpo` (jsonl or arithmetic): the prompts
//! kind = "jsonl"
//! path = "prompts.jsonl"
//! [rewards.default]              # used only with verify = true
//! kind = "exact_match"
//! [sampling]                     # `stoke rft`'s keys; here verify defaults to false and
//! samples = 4                    # keep_per_prompt to samples
//! temperature = 1.0
//! max_new_tokens = 256
//! [out]
//! dir = "runs/distill-data"      # OUT/distill.jsonl and OUT/generate.json (the counts)
//! ```
//!
//! Then SFT the student on `OUT/distill.jsonl` (`[data] kind = "chat"`), optionally with
//! `[distill] teacher` for logit distillation on the same ids, and `stoke grpo` with
//! `[grpo.loss.distill]` for the on-policy stage.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use candle_core::Device;
use clap::{Args, Subcommand};
use serde::{Deserialize, Serialize};
use stoke_model::Transformer;
use stoke_pipeline::config::{ModelSection, OutSection, TaskSourceFile};
use stoke_pipeline::rejection::{KeptCompletion, chat_line, write_chat_jsonl, write_lines};
use stoke_reward::RewardConfig;
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::objective::{prompt_completion_batch, score_loss_tokens, top_k_logprobs};

use super::rft::{SamplingSection, load_stage, sample, sampling_source};

#[derive(Subcommand)]
pub enum DistillCommand {
    /// A teacher's completions (with their token ids) as SFT data for a student.
    Generate(GenerateArgs),
}

#[derive(Args)]
pub struct GenerateArgs {
    /// The TOML config (relative paths inside it are relative to its folder).
    config: PathBuf,
    /// Override a key of the config, e.g. `--set sampling.samples=2` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

/// `[model]` of a generate config: the teacher, and optionally the student to check.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct TeacherSection {
    path: PathBuf,
    #[serde(default)]
    student: Option<PathBuf>,
    /// Also store the teacher's `k` most likely ids and log-probs (temperature 1) at every
    /// completion token, for logit distillation without the teacher (`[distill]` with no
    /// `teacher`).
    #[serde(default)]
    top_k_logprobs: Option<usize>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct GenerateFile {
    model: TeacherSection,
    #[serde(default)]
    tasks: Option<TaskSourceFile>,
    #[serde(default)]
    rewards: BTreeMap<String, RewardConfig>,
    #[serde(default)]
    sampling: SamplingSection,
    #[serde(default)]
    out: OutSection,
}

pub fn run(command: DistillCommand) -> anyhow::Result<()> {
    match command {
        DistillCommand::Generate(args) => generate(args),
    }
}

fn generate(args: GenerateArgs) -> anyhow::Result<()> {
    let (stage, stem) = load_stage(&args.config, &args.sets, "distill")?;
    let file: GenerateFile = toml::Value::Table(stage.table.clone())
        .try_into()
        .with_context(|| stage.origin.clone())?;
    let teacher = ModelSection {
        path: file.model.path.clone(),
        reference: None,
    };
    let (source, settings) = sampling_source(
        teacher,
        file.tasks,
        file.rewards,
        &file.sampling,
        file.out,
        &stage,
        &stem,
        false,
    )?;
    if let Some(student) = &file.model.student {
        let student = stage.base.join(student);
        check_shared_tokenizer(&source.model, &student)?;
    }
    let out_dir = source.out_dir.clone();
    std::fs::create_dir_all(&out_dir).with_context(|| format!("creating {}", out_dir.display()))?;
    let result = sample(&source, &settings, args.quiet)?;
    let report_path = out_dir.join("generate.json");
    std::fs::write(&report_path, serde_json::to_string_pretty(&result.report)?)
        .with_context(|| format!("writing {}", report_path.display()))?;
    if result.kept.is_empty() {
        bail!(
            "the teacher's samples left nothing to keep ({}){}",
            result.report.summary(),
            if settings.verify {
                "; with verify = true only verified-correct samples are kept"
            } else {
                ""
            }
        );
    }
    let jsonl = out_dir.join("distill.jsonl");
    match file.model.top_k_logprobs {
        None => write_chat_jsonl(&jsonl, &result.kept)?,
        Some(0) => bail!(
            "{}: `model.top_k_logprobs` must be at least 1",
            stage.origin
        ),
        Some(k) => {
            let teacher = Transformer::load(&source.model, &Device::Cpu)
                .with_context(|| format!("loading the teacher {}", source.model.display()))?;
            let lines = with_teacher_top_k(&teacher, &result.kept, k, args.quiet)?;
            write_lines(&jsonl, lines.into_iter())?;
        }
    }
    println!("teacher samples: {}", result.report.summary());
    println!("distillation data: {}", jsonl.display());
    Ok(())
}

/// Sequences scored per teacher forward pass.
const SCORE_BATCH: usize = 8;

/// Every kept completion's line with the teacher's top-k ids and log-probs at each completion
/// token (`teacher_topk_ids`, `teacher_topk_logprobs`: one list of `k` per token).
fn with_teacher_top_k(
    teacher: &Transformer,
    kept: &[KeptCompletion],
    k: usize,
    quiet: bool,
) -> anyhow::Result<Vec<String>> {
    let mut lines = Vec::with_capacity(kept.len());
    for (chunk_index, chunk) in kept.chunks(SCORE_BATCH).enumerate() {
        let sequences: Vec<(usize, Vec<u32>)> = chunk
            .iter()
            .map(|c| {
                let mut ids = c.prompt_ids.clone();
                ids.extend(&c.completion_ids);
                (c.prompt_ids.len(), ids)
            })
            .collect();
        let batch = prompt_completion_batch(&sequences);
        let scored = score_loss_tokens(teacher, &batch, None, true)?
            .and_then(|s| s.logits)
            .context("the teacher scored no completion token")?;
        let (ids, logprobs) = top_k_logprobs(&scored, k, 1.0)?;
        let k = ids.len() / scored.dim(0)?;
        let mut row = 0;
        for completion in chunk {
            let tokens = completion.completion_ids.len();
            let take = |v: &[u32]| -> Vec<Vec<u32>> {
                v[row * k..(row + tokens) * k]
                    .chunks(k)
                    .map(<[u32]>::to_vec)
                    .collect()
            };
            let top_ids = take(&ids);
            let top_logprobs: Vec<Vec<f32>> = logprobs[row * k..(row + tokens) * k]
                .chunks(k)
                .map(<[f32]>::to_vec)
                .collect();
            row += tokens;
            let mut line: serde_json::Value = serde_json::from_str(&chat_line(completion))?;
            line["teacher_topk_ids"] = serde_json::json!(top_ids);
            line["teacher_topk_logprobs"] = serde_json::json!(top_logprobs);
            lines.push(line.to_string());
        }
        if !quiet {
            eprintln!(
                "teacher top-{k}: {}/{} completions scored",
                (chunk_index * SCORE_BATCH + chunk.len()),
                kept.len()
            );
        }
    }
    Ok(lines)
}

/// Refuses a student whose tokenizer maps some id to another token than the teacher's: the
/// token ids written are the teacher's.
fn check_shared_tokenizer(teacher: &Path, student: &Path) -> anyhow::Result<()> {
    let load = |dir: &Path, who: &str| {
        Tokenizer::from_dir(dir)
            .with_context(|| format!("loading the {who}'s tokenizer from {}", dir.display()))
    };
    let teacher_tokenizer = load(teacher, "teacher")?;
    let student_tokenizer = load(student, "student")?;
    if let Some((id, theirs, ours)) =
        teacher_tokenizer.first_vocabulary_difference(&student_tokenizer)
    {
        bail!(
            "[model] student {}: not the teacher's tokenizer (id {id} is {theirs:?} for the \
             teacher and {ours:?} for the student); the data's token ids are the teacher's",
            student.display()
        );
    }
    Ok(())
}
