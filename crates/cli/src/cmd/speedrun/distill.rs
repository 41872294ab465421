//! The speedrun's distillation stage: a student half the teacher's depth learns from the GRPO
//! model, and is compared with the same student trained by SFT alone on the same budget.
//!
//! The regime is the one distillation exists for: the student's owner has the teacher's weights
//! and a small labelled set of their own (the first `labels` SFT conversations), not the teacher's
//! training data; questions without worked solutions are plentiful (the GRPO stage's prompts).
//! With the teacher's own data the comparison says nothing on this task: its worked solutions are
//! exact and unlimited, so SFT alone takes a student past an undertrained teacher, and the
//! teacher's soft targets hold nothing a label lacks (measured in bench/README.md).
//!
//! Both students start from the same weights: the *pretrained* model (before SFT, so no label
//! leaks in) with its first half of layers kept (`Transformer::keep_layers`). Then:
//! - **SFT only**: SFT on the student's labels for `offline_steps + on_policy_steps` steps;
//! - **distilled**: offline distillation, SFT for `offline_steps` steps on the labels plus the
//!   teacher's sampled replies to the GRPO questions (one each, unverified, at a low temperature:
//!   what the teacher says, errors included; its token ids kept), then on-policy distillation for
//!   `on_policy_steps` updates: the student samples, the teacher scores the same token ids, and
//!   each token's advantage is `log p_teacher - log p_student` (`stoke grpo` with
//!   `[grpo.loss.distill]`, the teacher as the reference).
//!
//! Files: `<out>/distill/` (`student-init/`, `labels.jsonl`, `teacher.jsonl`, `offline.jsonl`,
//! `teacher-samples.json`, and the run folders `student-sft/`, `student-offline/`,
//! `student-distilled/`), and the stage configs `<out>/distill-student-sft.toml`,
//! `distill-offline.toml` (for `stoke train`) and `distill-on-policy.toml` (for `stoke grpo`).
//!
//! What it is not: the accuracy comparison (the evaluation stage scores the three students beside
//! the other models, on the same held-out problems).

use std::io::{BufRead, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use candle_core::Device;
use serde::Serialize;
use stoke_eval::accuracy::{AccuracyConfig, evaluate};
use stoke_eval::arithmetic::Problem;
use stoke_model::Transformer;
use stoke_pipeline::config::GrpoConfig;
use stoke_pipeline::rejection::{RejectionSettings, write_chat_jsonl};
use stoke_tokenizer::hf::Tokenizer;

use super::recipe::{Recipe, StagePaths, write_and_resolve};
use super::rl::{GrpoStageSummary, grpo_run};
use super::training::{TrainStage, TrainingStageSummary, train};
use crate::cmd::rft::sample;

/// Where the stage starts from.
pub struct DistillInputs<'a> {
    pub pretrained: &'a Path,
    pub teacher: &'a Path,
    pub tokenizer_dir: &'a Path,
    pub sft_data: &'a Path,
    pub held_out_chat: &'a Path,
    /// The held-out problems (the first few are decoded for the speed figure).
    pub held_out: &'a [Problem],
}

/// Batch-1 greedy decoding speed of one model.
#[derive(Clone, Debug, Serialize)]
pub struct DecodeSpeed {
    pub label: String,
    pub layers: usize,
    pub parameters: usize,
    /// Generated tokens per second at batch 1, prefill included (the fastest of five passes over
    /// the first held-out questions).
    pub tokens_per_s: f64,
}

/// What the distillation stage did.
#[derive(Clone, Debug, Serialize)]
pub struct DistillStageSummary {
    pub teacher: PathBuf,
    /// The pretrained model's layers the students start from.
    pub student_layers: Vec<usize>,
    pub student_parameters: usize,
    pub teacher_parameters: usize,
    /// The student's own labelled conversations.
    pub labels: usize,
    pub teacher_prompts: usize,
    /// The teacher's replies kept (all of them: unverified) and how many the verifier would
    /// have called right (for information only).
    pub teacher_samples: usize,
    pub teacher_samples_correct: usize,
    pub teacher_temperature: f32,
    pub sampling_seconds: f64,
    pub sft_only: TrainingStageSummary,
    pub offline: TrainingStageSummary,
    pub on_policy: GrpoStageSummary,
    pub decode: Vec<DecodeSpeed>,
}

/// The labels the evaluation gives the teacher (the GRPO model) and the stage's models.
pub const TEACHER: &str = "grpo";
pub const SFT_ONLY: &str = "student-sft";
pub const OFFLINE: &str = "student-offline";
pub const DISTILLED: &str = "student-distilled";

/// Runs the stage (see the module doc).
pub fn distill(
    recipe: &Recipe,
    out: &Path,
    inputs: &DistillInputs<'_>,
    seed: u64,
) -> anyhow::Result<DistillStageSummary> {
    let d = recipe.distill;
    let dir = out.join("distill");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;

    // The student: the pretrained model's first half of layers.
    let pretrained = Transformer::load(inputs.pretrained, &Device::Cpu)
        .with_context(|| format!("loading {}", inputs.pretrained.display()))?;
    let layers = recipe.student_layers();
    let student = pretrained
        .keep_layers(&layers)
        .context("making the student")?;
    let student_init = dir.join("student-init");
    student
        .save_with_tokenizer(&student_init, Some(inputs.pretrained))
        .with_context(|| format!("saving {}", student_init.display()))?;
    let student_parameters = student.config().num_parameters();
    // The teacher is the pretrained model fine-tuned: the same shape.
    let teacher_parameters = pretrained.config().num_parameters();
    println!(
        "student: layers {layers:?} of the pretrained model, {student_parameters} parameters \
         (the teacher has {teacher_parameters})"
    );

    // The student's own labels: the first conversations of the SFT data.
    let labels_file = dir.join("labels.jsonl");
    let labels = copy_first_lines(inputs.sft_data, &labels_file, d.labels)?;

    // The teacher's replies to the GRPO questions.
    let clock = Instant::now();
    let origin = out.join("grpo.toml");
    let source = GrpoConfig::parse(
        &recipe.grpo_config(inputs.teacher, &dir, seed)?,
        &origin,
        &[],
    )
    .context("resolving the distillation stage's sampling config")?;
    let settings = RejectionSettings {
        samples_per_prompt: 1,
        keep_per_prompt: 1,
        temperature: d.teacher_temperature,
        top_p: 1.0,
        top_k: None,
        max_new_tokens: recipe.eval_max_new_tokens,
        seed,
        keep_truncated: false,
        verify: false,
    };
    let sampled = sample(&source, &settings, true)?;
    let sampling_seconds = clock.elapsed().as_secs_f64();
    std::fs::write(
        dir.join("teacher-samples.json"),
        serde_json::to_string_pretty(&sampled.report)?,
    )
    .context("writing teacher-samples.json")?;
    if sampled.kept.is_empty() {
        bail!(
            "the teacher's samples left nothing to train on ({})",
            sampled.report.summary()
        );
    }
    let teacher_file = dir.join("teacher.jsonl");
    write_chat_jsonl(&teacher_file, &sampled.kept)?;
    let offline_file = dir.join("offline.jsonl");
    concatenate(&[&labels_file, &teacher_file], &offline_file)?;
    println!(
        "teacher: {} replies to {} questions at temperature {} in {sampling_seconds:.1} s \
         ({} of them right, all kept)",
        sampled.kept.len(),
        sampled.report.prompts,
        d.teacher_temperature,
        sampled.report.correct
    );

    // The two students, on the same budget of optimizer steps.
    let student_config = |name: &str, data: &Path, steps: u64| {
        let mut config = recipe.sft_config(
            &StagePaths {
                run_dir: dir.join(name),
                model_source: student_init.clone(),
                tokenizer: inputs.tokenizer_dir.to_path_buf(),
                train_data: data.to_path_buf(),
                eval_data: Some(inputs.held_out_chat.to_path_buf()),
            },
            seed,
            0,
        );
        config.title = Some(format!("speedrun ({}) - distillation, {name}", recipe.name));
        config.training.steps = steps;
        config
    };
    let sft_only = train(
        TrainStage::Sft,
        write_and_resolve(
            &student_config(SFT_ONLY, &labels_file, d.offline_steps + d.on_policy_steps),
            &out.join("distill-student-sft.toml"),
        )?,
    )?;
    let offline = train(
        TrainStage::Sft,
        write_and_resolve(
            &student_config(OFFLINE, &offline_file, d.offline_steps),
            &out.join("distill-offline.toml"),
        )?,
    )?;
    let on_policy = grpo_run(
        &recipe.on_policy_distill_config(
            &offline.model_dir,
            inputs.teacher,
            &dir.join(DISTILLED),
            seed,
        )?,
        &out.join("distill-on-policy.toml"),
    )?;

    let tokenizer = Tokenizer::from_dir(inputs.tokenizer_dir)
        .with_context(|| format!("loading {}", inputs.tokenizer_dir.display()))?;
    let problems = inputs.held_out;
    let mut decode = Vec::new();
    for (label, model_dir) in [
        (TEACHER, inputs.teacher),
        (SFT_ONLY, sft_only.model_dir.as_path()),
        (DISTILLED, on_policy.model_dir.as_path()),
    ] {
        decode.push(decode_speed(
            label,
            model_dir,
            &tokenizer,
            &problems[..problems.len().min(DECODE_PROBLEMS)],
            recipe.eval_max_new_tokens,
        )?);
    }
    Ok(DistillStageSummary {
        teacher: inputs.teacher.to_path_buf(),
        student_layers: layers,
        student_parameters,
        teacher_parameters,
        labels,
        teacher_prompts: sampled.report.prompts,
        teacher_samples: sampled.kept.len(),
        teacher_samples_correct: sampled.report.correct,
        teacher_temperature: d.teacher_temperature,
        sampling_seconds,
        sft_only,
        offline,
        on_policy,
        decode,
    })
}

/// Held-out questions decoded one at a time for the speed figure.
const DECODE_PROBLEMS: usize = 64;
/// Timed passes over them (after one untimed warm-up pass); the fastest is reported. A pass takes
/// a fraction of a second on these models, and on a shared two-core machine whole passes can run
/// at a third of the speed (measured: the same teacher at 2.5k and 8.6k tokens/s in two runs), so
/// the best pass is the figure that repeats.
const DECODE_PASSES: usize = 5;

/// Batch-1 greedy decoding of `problems` with the model in `model_dir`: generated tokens per
/// second, the fastest of [`DECODE_PASSES`] passes.
fn decode_speed(
    label: &str,
    model_dir: &Path,
    tokenizer: &Tokenizer,
    problems: &[Problem],
    max_new_tokens: usize,
) -> anyhow::Result<DecodeSpeed> {
    let model = Transformer::load(model_dir, &Device::Cpu)
        .with_context(|| format!("loading {}", model_dir.display()))?;
    let config = AccuracyConfig {
        batch_size: 1,
        max_new_tokens,
    };
    let mut speeds = Vec::with_capacity(DECODE_PASSES);
    for pass in 0..=DECODE_PASSES {
        let report = evaluate(&model, tokenizer, problems, &config)
            .with_context(|| format!("decoding with the {label} model"))?;
        if pass > 0 {
            speeds.push(report.generated_tokens as f64 / report.seconds.max(1e-9));
        }
    }
    Ok(DecodeSpeed {
        label: label.to_string(),
        layers: model.config().num_hidden_layers,
        parameters: model.config().num_parameters(),
        tokens_per_s: speeds.iter().copied().fold(0.0, f64::max),
    })
}

/// Copies the first `count` lines of `from` to `to`; how many there were.
fn copy_first_lines(from: &Path, to: &Path, count: usize) -> anyhow::Result<usize> {
    let file = std::fs::File::open(from).with_context(|| format!("opening {}", from.display()))?;
    let mut writer = std::io::BufWriter::new(
        std::fs::File::create(to).with_context(|| format!("creating {}", to.display()))?,
    );
    let mut copied = 0;
    for line in std::io::BufReader::new(file).lines().take(count) {
        let line = line.with_context(|| format!("reading {}", from.display()))?;
        writeln!(writer, "{line}").with_context(|| format!("writing {}", to.display()))?;
        copied += 1;
    }
    writer
        .flush()
        .with_context(|| format!("writing {}", to.display()))?;
    if copied == 0 {
        bail!(
            "{}: no conversation to label the student with",
            from.display()
        );
    }
    Ok(copied)
}

/// Writes the files' lines one after another to `to`.
fn concatenate(files: &[&Path], to: &Path) -> anyhow::Result<()> {
    let mut text = String::new();
    for file in files {
        text.push_str(
            &std::fs::read_to_string(file)
                .with_context(|| format!("reading {}", file.display()))?,
        );
    }
    std::fs::write(to, text).with_context(|| format!("writing {}", to.display()))
}
