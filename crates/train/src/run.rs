//! `run`: one training run from a validated [`TrainConfig`], the entry point of `stoke train`
//! and of the speedrun's training stages.
//!
//! It reads as the recipe: set up the compute threads, create the run folder, resume from the
//! newest verified checkpoint or build the model, open the tokenizer and batch sources, build the
//! optimizer and the fixed evaluation set, run the loop, then write the final model folder
//! (`<run>/model`, Hugging Face layout with the tokenizer files) and the run report.
//!
//! Run folder layout: `config.toml` (the resolved config), `run.json` (the kernels chosen),
//! `metrics.jsonl` with its TensorBoard event file, `checkpoints/step-*`,
//! `model/`, `report.html`.
//!
//! Resume rules: `resume = true` continues from the newest checkpoint that verifies (older ones
//! are tried when the newest is corrupt); with no checkpoint the run starts fresh. The saved
//! config must agree with this one in every field that changes what is trained
//! (`config::math_fields_differ`); the first difference is named in the error. A fresh start
//! into a folder that already has checkpoints is refused, so a run is never silently mixed with
//! another.

use std::path::{Path, PathBuf};
use std::time::Instant;

use candle_core::Device;
use stoke_data::loader::LoaderConfig;
use stoke_data::packing::PackedBatch;
use stoke_model::{ModelConfig, Transformer};
use stoke_optim::Optimizer;
use stoke_tokenizer::hf::Tokenizer;

use crate::checkpoint::load_checkpoint;
use crate::config::{DataSource, ModelSource, TrainConfig, math_fields_differ};
use crate::error::TrainError;
use crate::eval::{EvalResult, Evaluator, bytes_per_token};
use crate::metrics::{MetricsLog, measure_peak_flops};
use crate::monitor::Monitor;
use crate::objective::{
    DistillObjective, NextTokenObjective, Objective, OnPolicySampling, Teacher,
};
use crate::report::{ReportSection, SectionBody, write_report};
use crate::run_folder::RunFolder;
use crate::source::teacher_topk::TeacherTopK;
use crate::source::{BatchSource, ChatSource, ChatSourceConfig, ShardSource};
use crate::trainer::{StopReason, Trainer};

/// How to run (not what to train: that is the config).
#[derive(Clone, Debug)]
pub struct RunOptions {
    /// Continue from the newest verified checkpoint of the run folder.
    pub resume: bool,
    /// No progress bar or console lines.
    pub quiet: bool,
    /// Time a matmul at start for the MFU figure (about 0.2 s).
    pub measure_mfu: bool,
    /// Write `report.html` at the end.
    pub write_report: bool,
}

impl Default for RunOptions {
    fn default() -> Self {
        RunOptions {
            resume: false,
            quiet: false,
            measure_mfu: true,
            write_report: true,
        }
    }
}

/// What a finished run produced.
#[derive(Clone, Debug)]
pub struct RunSummary {
    pub run_dir: PathBuf,
    /// The final model folder (`<run>/model`).
    pub model_dir: PathBuf,
    pub resumed_from: Option<PathBuf>,
    pub stop: StopReason,
    pub steps: u64,
    pub tokens_seen: u64,
    pub final_loss: Option<f64>,
    pub final_eval: Option<EvalResult>,
    pub last_checkpoint: Option<PathBuf>,
    pub report: Option<PathBuf>,
    pub skipped_steps: u64,
    pub spikes: u64,
    pub tokens_per_s: f64,
    pub elapsed_s: f64,
}

/// Trains as `config` says; see the module doc.
pub fn run(config: TrainConfig, options: RunOptions) -> Result<RunSummary, TrainError> {
    stoke_ops::numerics::init_compute_threads();
    let started = Instant::now();
    config.validate()?;
    let run_dir = config.output_dir.clone();
    let folder = RunFolder::open(&run_dir, config.training.keep_last, options.resume)?;
    let config_toml = config.to_toml()?;
    let device = Device::Cpu;
    let tokenizer = match &config.model.tokenizer {
        Some(dir) => Some(Tokenizer::from_dir(dir)?),
        None => None,
    };

    let resume_path = folder.resume_point().map(Path::to_path_buf);
    let (mut model, resumed) = match &resume_path {
        Some(path) => {
            let loaded = load_checkpoint(path, &device)?;
            let saved = TrainConfig::from_toml(
                &loaded.config_toml,
                &path.join("config.toml").display().to_string(),
            )?;
            if let Some((field, saved_value, current)) =
                math_fields_differ(&saved, &config, loaded.state.step)
                    .into_iter()
                    .next()
            {
                return Err(TrainError::ResumeMismatch {
                    run_dir,
                    field,
                    saved: saved_value,
                    current,
                });
            }
            let model = match &config.lora {
                // The checkpoint's model/ is the merged model; training continues on the base
                // with the saved adapter.
                Some(_) => {
                    let mut base = build_model(&config, tokenizer.as_ref(), &device)?;
                    base.load_adapter(&path.join(crate::checkpoint::ADAPTER_DIR))?;
                    base
                }
                None => loaded.model,
            };
            (model, Some((loaded.state, loaded.optimizer_state)))
        }
        None => {
            let mut model = build_model(&config, tokenizer.as_ref(), &device)?;
            if let Some(lora) = &config.lora {
                model.add_lora(lora, config.training.seed)?;
            }
            (model, None)
        }
    };
    model.set_precision(config.training.precision);
    model.set_activation_checkpointing(config.training.activation_checkpointing);
    if model.config().moe.is_some() {
        model.set_expert_capacity(config.training.moe.capacity_factor)?;
    }
    folder.record_start("train", &config_toml)?;

    // Under LoRA only the adapters train (the base is frozen).
    let mut optimizer = Optimizer::new(config.optimizer.clone(), model.trainable_parameters())?;
    if let Some((_, optimizer_state)) = &resumed {
        optimizer.load_state(optimizer_state)?;
    }
    let vocab_size = model.config().vocab_size;
    // Distillation from the data's stored top-k reads the data first; a teacher model is loaded
    // (and checked) before any data is read.
    let (mut source, stored_topk) = match &config.distill {
        Some(distill) if distill.teacher.is_none() => {
            let (source, topk) =
                open_train_source_with_topk(&config, tokenizer.as_ref(), vocab_size)?;
            (Some(source), topk)
        }
        _ => (None, None),
    };
    let objective: Box<dyn Objective> = match &config.distill {
        Some(distill) => Box::new(distill_objective(
            distill,
            &model,
            tokenizer.as_ref(),
            &config,
            &device,
            stored_topk,
        )?),
        None => Box::new(NextTokenObjective {
            z_loss: config.training.z_loss,
            logit_softcap: config.training.logit_softcap,
            moe_aux_loss_coef: moe_aux_loss_coef(&config, &model),
            track_max_logits: config.qk_clip_threshold().is_some(),
            mtp_loss_weight: mtp_loss_weight(&config, &model)?,
        }),
    };
    let source = match source.take() {
        Some(source) => source,
        None => open_train_source(&config, tokenizer.as_ref(), vocab_size)?,
    };
    let evaluator = build_evaluator(&config, tokenizer.as_ref(), vocab_size)?;
    let metrics_path = folder.metrics_path();
    let metrics_log =
        MetricsLog::open(&metrics_path, resumed.as_ref().map(|(state, _)| state.step))?;

    let mut trainer = Trainer::new(config.clone(), model, optimizer, objective, source)
        .with_checkpoints(
            folder.into_store(),
            config_toml,
            config.model.tokenizer.clone(),
        )
        .with_metrics_log(metrics_log);
    if let Some(evaluator) = evaluator {
        trainer = trainer.with_evaluator(evaluator);
    }
    if options.measure_mfu {
        trainer = trainer.with_peak_flops(measure_peak_flops()?);
    }
    // Quiet runs keep the monitor (its alerts go to the log either way) but print nothing.
    let total_steps = config.training.steps;
    let mut monitor = if options.quiet {
        Monitor::plain(total_steps, total_steps, Box::new(std::io::sink()))
    } else {
        Monitor::new(total_steps, false)
    };
    if resumed.is_some() {
        monitor.replay(&MetricsLog::read_all(&metrics_path)?);
    }
    // The monitor's alerts reach the metrics log through the trainer; they never change training.
    trainer = trainer.with_observer(Box::new(monitor));
    if let Some((state, _)) = resumed {
        trainer.restore(state)?;
    }
    let outcome = trainer.run()?;

    let model_dir = run_dir.join("model");
    crate::checkpoint::save_model(
        trainer.model(),
        &model_dir,
        config.model.tokenizer.as_deref(),
    )?;
    let report = if options.write_report {
        let records = MetricsLog::read_all(&metrics_path)?;
        let summary = summary_section(&config, trainer.model(), &outcome, resume_path.as_deref());
        Some(write_report(&run_dir, &config.title, &records, &[summary])?)
    } else {
        None
    };
    Ok(RunSummary {
        run_dir,
        model_dir,
        resumed_from: resume_path,
        stop: outcome.stop,
        steps: outcome.steps,
        tokens_seen: outcome.tokens_seen,
        final_loss: outcome.last_loss,
        final_eval: outcome.last_eval,
        last_checkpoint: outcome.last_checkpoint,
        report,
        skipped_steps: outcome.skipped_steps,
        spikes: outcome.spikes,
        tokens_per_s: outcome.tokens_per_s,
        elapsed_s: started.elapsed().as_secs_f64(),
    })
}

/// The model a fresh run starts from.
pub fn build_model(
    config: &TrainConfig,
    tokenizer: Option<&Tokenizer>,
    device: &Device,
) -> Result<Transformer, TrainError> {
    let model_config = match &config.model.source {
        ModelSource::Pretrained(dir) => return Ok(Transformer::load(dir, device)?),
        ModelSource::ConfigJson(path) => ModelConfig::from_file(path)?,
        ModelSource::Preset { preset, vocab_size } => {
            let vocab = match (vocab_size, tokenizer) {
                (Some(v), _) => *v,
                (None, Some(t)) => t.vocab_size(),
                (None, None) => {
                    return Err(TrainError::Other(
                        "model.vocab_size: a preset needs a vocab_size or a tokenizer".into(),
                    ));
                }
            };
            let mut json = preset.config_json(vocab, config.data.seq_len);
            if let Some(t) = tokenizer {
                json["bos_token_id"] = serde_json::json!(t.bos_token_id());
                json["eos_token_id"] = serde_json::json!(t.eos_token_ids());
                if let Some(pad) = t.pad_token_id() {
                    json["pad_token_id"] = serde_json::json!(pad);
                }
            }
            ModelConfig::from_json_str(&json.to_string(), Path::new("<model preset>"))?
        }
    };
    Ok(Transformer::init_with(
        model_config,
        device,
        config.model.init_seed,
        config.model.init,
    )?)
}

/// Shard files named directly, or every `*.shard` of a named folder.
fn expand_shards(paths: &[PathBuf]) -> Result<Vec<PathBuf>, TrainError> {
    let mut shards = Vec::new();
    for path in paths {
        if path.is_dir() {
            let found =
                stoke_data::shard::list_shards(path).map_err(|e| TrainError::Source(e.into()))?;
            if found.is_empty() {
                return Err(TrainError::Other(format!(
                    "{}: no *.shard files in this folder",
                    path.display()
                )));
            }
            shards.extend(found);
        } else {
            shards.push(path.clone());
        }
    }
    Ok(shards)
}

fn loader_config(config: &TrainConfig, tokenizer: Option<&Tokenizer>, eval: bool) -> LoaderConfig {
    let data = &config.data;
    let mut loader = LoaderConfig::new(data.seq_len, data.micro_batch_size, config.training.seed);
    loader.policy = data.packing;
    loader.pad_token = tokenizer.and_then(|t| t.pad_token_id()).unwrap_or(0);
    if eval {
        loader.shuffle = false;
        loader.max_epochs = Some(1);
    } else {
        loader.shuffle = data.shuffle;
        loader.max_epochs = data.max_epochs;
    }
    loader
}

fn chat_config(config: &TrainConfig, eval: bool) -> ChatSourceConfig {
    let data = &config.data;
    let mut chat = ChatSourceConfig::new(data.seq_len, data.micro_batch_size, config.training.seed);
    chat.policy = data.packing;
    if eval {
        chat.shuffle = false;
        chat.max_epochs = Some(1);
    } else {
        chat.shuffle = data.shuffle;
        chat.max_epochs = data.max_epochs;
    }
    chat
}

fn check_shard_vocab(shards: &[PathBuf], vocab_size: usize) -> Result<(), TrainError> {
    for path in shards {
        let reader =
            stoke_data::shard::ShardReader::open(path).map_err(|e| TrainError::Source(e.into()))?;
        if reader.vocab_size() > vocab_size as u64 {
            return Err(TrainError::Other(format!(
                "{}: shard vocabulary has {} ids but the model has {vocab_size}",
                path.display(),
                reader.vocab_size()
            )));
        }
    }
    Ok(())
}

/// The training batch source the config names.
pub fn open_train_source(
    config: &TrainConfig,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
) -> Result<Box<dyn BatchSource>, TrainError> {
    open_train_source_with_topk(config, tokenizer, vocab_size).map(|(source, _)| source)
}

/// [`open_train_source`], and the teacher top-k stored with chat data (token-id lines with
/// `teacher_topk_ids`), if any.
pub fn open_train_source_with_topk(
    config: &TrainConfig,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
) -> Result<(Box<dyn BatchSource>, Option<TeacherTopK>), TrainError> {
    let mut topk = None;
    let source: Box<dyn BatchSource> = match &config.data.source {
        DataSource::Shards { train, .. } => {
            let shards = expand_shards(train)?;
            check_shard_vocab(&shards, vocab_size)?;
            Box::new(ShardSource::open(
                &shards,
                loader_config(config, tokenizer, false),
            )?)
        }
        DataSource::Chat { train, .. } => {
            let tokenizer = tokenizer
                .ok_or_else(|| TrainError::Other("chat data needs model.tokenizer".into()))?;
            let source = ChatSource::open(train, tokenizer, chat_config(config, false))?;
            // Skipped and truncated lines are reported even in quiet runs: no sample is dropped
            // without a word (the first few are named with file:line).
            let report = source.report();
            if !report.skipped.is_empty() || !report.truncated_lines.is_empty() {
                eprintln!("warning: {}", report.summary());
            }
            topk = source.teacher_topk();
            Box::new(source)
        }
    };
    Ok((source, topk))
}

/// The fixed evaluation set: the first `eval_batches` micro-batches of the eval data in order.
pub fn build_evaluator(
    config: &TrainConfig,
    tokenizer: Option<&Tokenizer>,
    vocab_size: usize,
) -> Result<Option<Evaluator>, TrainError> {
    let mut source: Box<dyn BatchSource> = match &config.data.source {
        DataSource::Shards { eval, .. } if !eval.is_empty() => {
            let shards = expand_shards(eval)?;
            check_shard_vocab(&shards, vocab_size)?;
            Box::new(ShardSource::open(
                &shards,
                loader_config(config, tokenizer, true),
            )?)
        }
        DataSource::Chat {
            eval: Some(eval), ..
        } => {
            let tokenizer = tokenizer
                .ok_or_else(|| TrainError::Other("chat data needs model.tokenizer".into()))?;
            Box::new(ChatSource::open(
                eval,
                tokenizer,
                chat_config(config, true),
            )?)
        }
        _ => return Ok(None),
    };
    let mut batches: Vec<PackedBatch> = Vec::new();
    while batches.len() < config.training.eval_batches {
        match source.next_batch()? {
            Some(batch) => batches.push(batch),
            None => break,
        }
    }
    let bytes = tokenizer.map(|t| bytes_per_token(t, vocab_size));
    Ok(Some(Evaluator::new(
        batches,
        bytes,
        config.training.logit_softcap,
    )))
}

/// The report's table of what was trained and how it ended.
fn summary_section(
    config: &TrainConfig,
    model: &Transformer,
    outcome: &crate::trainer::TrainOutcome,
    resumed_from: Option<&Path>,
) -> ReportSection {
    let m = model.config();
    let mut rows = vec![
        (
            "model".to_string(),
            format!(
                "{} parameters: hidden {}, {} layers, {} heads ({} KV), vocab {}",
                m.num_parameters(),
                m.hidden_size,
                m.num_hidden_layers,
                m.num_attention_heads,
                m.num_key_value_heads,
                m.vocab_size
            ),
        ),
        (
            "batch".to_string(),
            format!(
                "{} x {} tokens x {} micro-batches per step",
                config.data.micro_batch_size, config.data.seq_len, config.data.grad_accum_steps
            ),
        ),
        ("optimizer".to_string(), format!("{:?}", config.optimizer)),
        ("schedule".to_string(), format!("{:?}", config.schedule)),
        (
            "steps".to_string(),
            format!(
                "{} of {} ({} skipped, {} loss spikes)",
                outcome.steps, config.training.steps, outcome.skipped_steps, outcome.spikes
            ),
        ),
        ("tokens seen".to_string(), outcome.tokens_seen.to_string()),
        (
            "throughput".to_string(),
            format!("{:.0} tokens/s (this process)", outcome.tokens_per_s),
        ),
    ];
    if let Some(loss) = outcome.last_loss {
        rows.push(("final training loss".to_string(), format!("{loss:.4}")));
    }
    if let Some(eval) = &outcome.last_eval {
        let bpb = eval
            .bits_per_byte
            .map_or("n/a (no tokenizer)".to_string(), |b| format!("{b:.4}"));
        rows.push((
            "final eval".to_string(),
            format!(
                "loss {:.4}, {bpb} bits/byte, {} tokens",
                eval.loss, eval.tokens
            ),
        ));
    }
    if let Some(path) = resumed_from {
        rows.push(("resumed from".to_string(), path.display().to_string()));
    }
    ReportSection {
        title: "Run".to_string(),
        body: SectionBody::Table(rows),
        charts: Vec::new(),
    }
}

/// The teacher of `[distill]`, loaded frozen, after checking that it predicts over the student's
/// vocabulary: the same logit width and, where both have tokenizer files, the same token for
/// every id.
fn distill_objective(
    distill: &crate::config::DistillConfig,
    student: &Transformer,
    tokenizer: Option<&Tokenizer>,
    config: &TrainConfig,
    device: &Device,
    stored_topk: Option<TeacherTopK>,
) -> Result<DistillObjective, TrainError> {
    let Some(teacher_dir) = &distill.teacher else {
        let Some(table) = stored_topk else {
            return Err(TrainError::Other(
                "distill: no `teacher` model, and the training data carry no teacher top-k \
                 (`teacher_topk_ids` lines, as `stoke distill generate` writes with \
                 `[model] top_k_logprobs`)"
                    .into(),
            ));
        };
        if distill.lmbda > 0.0 {
            return Err(TrainError::Other(
                "distill.lmbda: on-policy batches need a `teacher` model to score the student's \
                 own samples; stored top-k cover only the data's completions"
                    .into(),
            ));
        }
        if distill.top_k.is_some() {
            return Err(TrainError::Other(
                "distill.top_k: applies to a `teacher` model; the data's stored top-k are used \
                 as they are"
                    .into(),
            ));
        }
        let vocab = student.config().vocab_size;
        if let Some(id) = table
            .conversations
            .iter()
            .flatten()
            .flat_map(|c| c.ids.iter())
            .find(|&&id| id as usize >= vocab)
        {
            return Err(TrainError::Other(format!(
                "distill: the data's teacher top-k hold id {id}, outside the student's {vocab} \
                 logits"
            )));
        }
        return Ok(DistillObjective {
            teacher: Teacher::Stored(std::sync::Arc::new(table)),
            beta: distill.beta,
            temperature: distill.temperature,
            on_policy: None,
            ce_weight: distill.ce_weight,
        });
    };
    let shown = teacher_dir.display();
    let mut teacher = Transformer::load(teacher_dir, device)
        .map_err(|e| TrainError::Other(format!("distill.teacher {shown}: {e}")))?;
    let (ours, theirs) = (student.config().vocab_size, teacher.config().vocab_size);
    if ours != theirs {
        return Err(TrainError::Other(format!(
            "distill.teacher {shown}: the teacher predicts over {theirs} ids and the student over \
             {ours}; distillation needs one shared tokenizer"
        )));
    }
    if let Some(student_tokenizer) = tokenizer
        && teacher_dir.join("tokenizer.json").is_file()
    {
        let teacher_tokenizer = Tokenizer::from_dir(teacher_dir)?;
        if let Some((id, teacher_token, student_token)) =
            teacher_tokenizer.first_vocabulary_difference(student_tokenizer)
        {
            return Err(TrainError::Other(format!(
                "distill.teacher {shown}: not the student's tokenizer (id {id} is \
                 {teacher_token:?} for the teacher and {student_token:?} for the student); \
                 distillation needs one shared tokenizer"
            )));
        }
    }
    teacher.set_precision(config.training.precision);
    let on_policy = if distill.lmbda > 0.0 {
        let mut stop_token_ids: Vec<u32> = tokenizer.map(|t| t.eos_token_ids()).unwrap_or_default();
        stop_token_ids.extend(student.config().eos_token_ids.iter().copied());
        stop_token_ids.sort_unstable();
        stop_token_ids.dedup();
        if stop_token_ids.is_empty() {
            return Err(TrainError::Other(
                "distill.lmbda: the student's tokenizer and config name no end-of-sequence token \
                 to end its sampled replies on"
                    .into(),
            ));
        }
        Some(OnPolicySampling {
            lmbda: distill.lmbda,
            max_new_tokens: distill.max_new_tokens,
            temperature: distill.generation_temperature as f32,
            seed: config.training.seed,
            stop_token_ids,
        })
    } else {
        None
    };
    Ok(DistillObjective {
        teacher: Teacher::Model {
            model: teacher.into_frozen(),
            top_k: distill.top_k,
        },
        beta: distill.beta,
        temperature: distill.temperature,
        on_policy,
        ce_weight: distill.ce_weight,
    })
}

/// The auxiliary load-balancing loss weight of a MoE model under `training.moe.balance =
/// "aux_loss"`: `aux_loss_coef`, else the model's `router_aux_loss_coef`. `None` otherwise.
fn moe_aux_loss_coef(config: &TrainConfig, model: &Transformer) -> Option<f64> {
    let moe = model.config().moe.as_ref()?;
    (config.training.moe.balance == crate::config::MoeBalance::AuxLoss).then(|| {
        config
            .training
            .moe
            .aux_loss_coef
            .unwrap_or(moe.router_aux_loss_coef)
    })
}

/// The multi-token prediction loss weight: `training.mtp_loss_weight`, else 0.1 for a model
/// with MTP modules (DeepSeek-V3's weight late in pretraining) and 0 without. A positive weight
/// for a model without modules is refused.
fn mtp_loss_weight(config: &TrainConfig, model: &Transformer) -> Result<f64, TrainError> {
    let modules = model.num_mtp_modules();
    match config.training.mtp_loss_weight {
        Some(w) if w > 0.0 && modules == 0 => Err(crate::config::ConfigError::Invalid {
            key: "training.mtp_loss_weight".into(),
            message: format!(
                "{w} for a model without multi-token prediction modules ({} has \
                 num_nextn_predict_layers = 0 or its checkpoint carries none)",
                model.config().architecture.model_type()
            ),
        }
        .into()),
        Some(w) => Ok(w),
        None if modules > 0 => Ok(0.1),
        None => Ok(0.0),
    }
}
