//! `stoke prm CONFIG.toml`: a process reward model trained end to end on stepwise rows, in the
//! run shell every training command shares: the run folder and its one resume rule
//! (`RunFolder`), `config.toml`, the metrics log (`RunLog`, `stoke rm`'s step records), the
//! shared checkpoints, the monitor and `report.html`. It loads the model (a causal LM gets a
//! fresh two-label token head, as `AutoModelForTokenClassification.from_pretrained(path,
//! num_labels=2)` does; a PRM continues as it is), tokenizes the rows with TRL's rule
//! (`data`), trains with [`PrmTrainer`], saves `model/` and scores the held-out rows.
//!
//! ```toml
//! output_dir = "runs/prm"          # relative paths are relative to this file's folder
//! [model]
//! path = "runs/sft/model"          # tokenizer = "..." if it is elsewhere
//! [data]
//! train = "steps.jsonl"            # prompt / completions / labels (TRL's stepwise format)
//! eval = "steps-heldout.jsonl"     # optional: loss and accuracy after training (eval.json)
//! rows_per_micro_batch = 4
//! micro_batches = 1
//! [prm]                            # PRMConfig's names and defaults
//! step_separator = "\n"
//! max_length = 1024
//! # max_completion_length = 512; train_on_last_step_only = false
//! [optimizer]                      # `stoke train`'s table; lr default 1e-5 (PRMConfig)
//! [schedule]                       # `stoke train`'s table and defaults
//! [training]
//! steps = 200                      # seed = 0; max_bad_steps = 3; precision; activation_checkpointing
//! [checkpoint]                     # every / keep / keep_steps
//! ```
//!
//! What this is not: the rule, the loss or the step (`data`, `loss`, `train`).

use std::path::{Path, PathBuf};

use candle_core::Device;
use serde::{Deserialize, Serialize};
use stoke_model::Transformer;
use stoke_optim::{LrSchedule, Optimizer};
use stoke_tokenizer::hf::Tokenizer;

use super::data::{StepwiseTokenization, TokenizedSteps, read_rows, tokenize_row};
use super::train::{PrmTrainer, evaluate_prm};
use crate::checkpoint::{TrainerState, load_checkpoint};
use crate::config::{
    CheckpointFile, ConfigError, OptimizerFile, ScheduleDefaults, ScheduleFile, keys,
    resolve_lr_schedule, resolve_optimizer,
};
use crate::error::TrainError;
use crate::metrics::RunLog;
use crate::monitor::Monitor;
use crate::preference::record::{PairRecord, PairStepRecord};
use crate::preference::run::{DEFAULT_KEEP, PreferenceModelFile};
use crate::run::RunOptions;
use crate::run_folder::RunFolder;
use crate::step::{StepOutcome, StepSettings};

/// TRL's `PRMConfig.learning_rate`.
pub const DEFAULT_LR: f64 = 1e-5;

/// The TOML file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrmFile {
    #[serde(default)]
    pub title: Option<String>,
    pub output_dir: PathBuf,
    pub model: PreferenceModelFile,
    pub data: PrmDataFile,
    #[serde(default)]
    pub prm: StepwiseTokenization,
    #[serde(default)]
    pub optimizer: OptimizerFile,
    #[serde(default)]
    pub schedule: Option<ScheduleFile>,
    pub training: PrmTrainingFile,
    #[serde(default)]
    pub checkpoint: CheckpointFile,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrmDataFile {
    pub train: PathBuf,
    #[serde(default)]
    pub eval: Option<PathBuf>,
    #[serde(default = "four")]
    pub rows_per_micro_batch: usize,
    #[serde(default = "one")]
    pub micro_batches: usize,
}

fn four() -> usize {
    4
}
fn one() -> usize {
    1
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PrmTrainingFile {
    pub steps: u64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "three")]
    pub max_bad_steps: u64,
    #[serde(default)]
    pub precision: stoke_types::Precision,
    #[serde(default)]
    pub activation_checkpointing: bool,
}

fn three() -> u64 {
    3
}

impl PrmFile {
    /// Reads `path`, applies `--set` overrides, and makes its relative paths absolute against
    /// the file's folder. Errors name the key.
    pub fn load(path: &Path, sets: &[String]) -> Result<PrmFile, ConfigError> {
        let origin = path.display().to_string();
        let table = keys::prepare_table(keys::read_table(path)?, &origin, sets, &[])?;
        let mut file: PrmFile = keys::from_table(table, &origin)?;
        let base = path.parent().unwrap_or(Path::new("."));
        let absolute = |p: &mut PathBuf| {
            if p.is_relative() {
                *p = base.join(&*p);
            }
        };
        absolute(&mut file.output_dir);
        absolute(&mut file.model.path);
        if let Some(t) = file.model.tokenizer.as_mut() {
            absolute(t);
        }
        absolute(&mut file.data.train);
        if let Some(e) = file.data.eval.as_mut() {
            absolute(e);
        }
        Ok(file)
    }

    fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Invalid {
            key: "(config)".into(),
            message: format!("cannot write the resolved config: {e}"),
        })
    }

    fn from_saved(text: &str, origin: &Path) -> Result<PrmFile, ConfigError> {
        let table = keys::parse_table(text, origin)?;
        keys::from_table(table, &origin.display().to_string())
    }

    fn resolved_schedule(&self) -> Result<LrSchedule, ConfigError> {
        resolve_lr_schedule(
            &self.schedule.clone().unwrap_or_default(),
            self.training.steps,
            ScheduleDefaults::shared(self.training.steps),
        )
    }
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct PrmSummary {
    pub steps: u64,
    pub rows: usize,
    pub first: Option<Vec<(&'static str, f64)>>,
    pub last: Option<Vec<(&'static str, f64)>>,
    pub last_loss: Option<f64>,
    pub skipped_steps: u64,
    pub seconds_per_step: f64,
    /// With `data.eval`: the held-out rows and the figures on them (also in `eval.json`).
    pub eval: Option<(usize, Vec<(&'static str, f64)>)>,
    pub resumed_from: Option<PathBuf>,
    pub last_checkpoint: PathBuf,
    pub model_dir: PathBuf,
    pub metrics_path: PathBuf,
    pub report_path: PathBuf,
}

/// Runs `file` to the end under the shared run rules (`RunOptions`: resume, quiet).
pub fn run_prm_with(file: &PrmFile, options: &RunOptions) -> Result<PrmSummary, TrainError> {
    stoke_ops::numerics::init_compute_threads();
    let device = Device::Cpu;
    let tokenizer_dir = file
        .model
        .tokenizer
        .clone()
        .unwrap_or_else(|| file.model.path.clone());
    let tokenizer = Tokenizer::from_dir(&tokenizer_dir)
        .map_err(|e| TrainError::Other(format!("{}: {e}", tokenizer_dir.display())))?;
    let mut model = Transformer::load(&file.model.path, &device)?;
    if !model.is_token_classifier() {
        model = model.to_token_classifier(2, file.training.seed)?;
    }
    let limit = model.config().max_position_embeddings;
    let read = |path: &Path, is_eval: bool| -> Result<Vec<TokenizedSteps>, TrainError> {
        let mut out = Vec::new();
        for (i, row) in read_rows(path)?.iter().enumerate() {
            let row = tokenize_row(row, &tokenizer, &file.prm, is_eval)?;
            if row.input_ids.len() > limit {
                return Err(TrainError::Other(format!(
                    "{}: row {}: {} tokens, over the model's max_position_embeddings = {limit} \
                     (set prm.max_length)",
                    path.display(),
                    i + 1,
                    row.input_ids.len()
                )));
            }
            out.push(row);
        }
        Ok(out)
    };
    let rows = read(&file.data.train, false)?;
    let schedule = file.resolved_schedule()?;

    let out = &file.output_dir;
    let folder = RunFolder::open(
        out,
        file.checkpoint.keep.unwrap_or(DEFAULT_KEEP),
        options.resume,
    )?;
    let resume_path = folder.resume_point().map(Path::to_path_buf);
    let config_toml = file.to_toml()?;
    let resumed = match &resume_path {
        Some(path) => {
            let loaded = load_checkpoint(path, &device)?;
            let saved = PrmFile::from_saved(
                &loaded.config_toml,
                &path.join(crate::checkpoint::CONFIG_FILE),
            )?;
            check_resumable(&saved, file, &schedule, loaded.state.step)?;
            model = loaded.model;
            Some((loaded.state, loaded.optimizer_state))
        }
        None => None,
    };
    model.set_precision(file.training.precision);
    model.set_activation_checkpointing(file.training.activation_checkpointing);
    folder.record_start("prm", &config_toml)?;

    let optimizer_config = resolve_optimizer(
        &OptimizerFile {
            lr: Some(file.optimizer.lr.unwrap_or(DEFAULT_LR)),
            ..file.optimizer.clone()
        },
        model.config().hidden_size,
    )?;
    let step_settings = StepSettings {
        schedule,
        clip_norm: keys::clip_grad_norm(file.optimizer.clip_grad_norm),
        spike: StepSettings::spike_off(),
        max_bad_steps: file.training.max_bad_steps,
    };
    step_settings.validate()?;
    let mut optimizer = Optimizer::new(optimizer_config, model.trainable_parameters())?;
    if let Some((_, optimizer_state)) = &resumed {
        optimizer.load_state(optimizer_state)?;
    }
    let engine = crate::step::StepEngine::new(optimizer, step_settings);
    let row_count = rows.len();
    let mut trainer = PrmTrainer::new(
        model,
        engine,
        rows,
        file.data.rows_per_micro_batch,
        file.data.micro_batches,
        file.training.seed,
    )?;
    let mut tokens_seen = 0u64;
    if let Some((state, _)) = &resumed {
        let cursor = serde_json::from_value(state.source.clone())
            .map_err(|e| TrainError::Resume(format!("trainer state `source`: {e}")))?;
        let engine = state
            .engine
            .clone()
            .ok_or_else(|| TrainError::Resume("trainer state: no step engine state".into()))?;
        trainer.restore(engine, cursor)?;
        tokens_seen = state.tokens_seen;
    }
    let start_step = trainer.engine().steps();

    let metrics_path = folder.metrics_path();
    let store = folder.into_store();
    let mut log = RunLog::<PairRecord>::open(&metrics_path, resumed.as_ref().map(|_| start_step))?;
    let total = file.training.steps;
    let every = file.checkpoint.every.unwrap_or(0);
    let save = |trainer: &PrmTrainer,
                log: &mut RunLog<PairRecord>,
                tokens_seen: u64|
     -> Result<PathBuf, TrainError> {
        log.flush()?;
        let state = TrainerState {
            step: trainer.engine().steps(),
            tokens_seen,
            source: serde_json::to_value(trainer.cursor())
                .map_err(|e| TrainError::Other(format!("data cursor: {e}")))?,
            engine: Some(trainer.engine().state()),
            extra: serde_json::Value::Null,
        };
        Ok(store.save(
            trainer.model(),
            Some(&tokenizer_dir),
            trainer.engine().optimizer(),
            &state,
            &config_toml,
            &file.checkpoint.keep_steps,
        )?)
    };
    let mut monitor = if options.quiet {
        Monitor::plain(total, total, Box::new(std::io::sink()))
    } else {
        Monitor::new(total, false)
    };
    if resumed.is_some() {
        monitor.replay(&crate::preference::report::standard_records(&step_records(
            &metrics_path,
        )?));
    }
    let started = std::time::Instant::now();
    let (mut first, mut last, mut last_loss) = (None, None, None);
    let (mut seconds, mut skipped, mut last_checkpoint) = (0f64, 0u64, None);
    while trainer.engine().steps() < total {
        let report = trainer.step()?;
        tokens_seen += report.tokens as u64;
        seconds += report.seconds;
        if report.outcome != StepOutcome::Applied {
            skipped += 1;
        }
        let record = PairStepRecord::from_report(&report);
        log.append(&PairRecord::Step(record.clone()))?;
        let metric = |name: &str| report.metric(name).unwrap_or(f64::NAN);
        let detail = format!(
            "acc {:.2} | P(good) {:.2}",
            metric("accuracy"),
            metric("mean_good_probability")
        );
        let standard = crate::preference::report::standard_step(
            &record,
            tokens_seen,
            started.elapsed().as_secs_f64(),
        );
        for alert in monitor.on_step_with(&standard, &detail) {
            log.append(&PairRecord::Alert {
                step: alert.step,
                message: alert.message,
            })?;
        }
        if first.is_none() {
            first = Some(report.metrics.clone());
        }
        if report.loss.is_finite() {
            last_loss = Some(report.loss);
        }
        last = Some(report.metrics.clone());
        if every > 0
            && report.step.is_multiple_of(every)
            && trainer.engine().consecutive_bad_steps() == 0
        {
            last_checkpoint = Some((report.step, save(&trainer, &mut log, tokens_seen)?));
        }
    }
    monitor.finish();
    let final_step = trainer.engine().steps();
    let last_checkpoint = match last_checkpoint {
        Some((step, path)) if step == final_step => path,
        _ if resume_path.is_some() && final_step == start_step => {
            resume_path.clone().unwrap_or_default()
        }
        _ => save(&trainer, &mut log, tokens_seen)?,
    };
    let model_dir = out.join("model");
    crate::checkpoint::save_model(trainer.model(), &model_dir, Some(&tokenizer_dir))?;
    let eval = match &file.data.eval {
        Some(path) => {
            let rows = read(path, true)?;
            let figures = evaluate_prm(trainer.model(), &rows)?;
            let eval_path = out.join("eval.json");
            let json = serde_json::json!({
                "rows": rows.len(),
                "step": final_step,
                "metrics": figures
                    .iter()
                    .map(|(k, v)| (k.to_string(), serde_json::Value::from(*v)))
                    .collect::<serde_json::Map<String, serde_json::Value>>(),
            });
            std::fs::write(&eval_path, format!("{json:#}\n"))
                .map_err(|e| TrainError::io(&eval_path, e))?;
            Some((rows.len(), figures))
        }
        None => None,
    };
    let title = file
        .title
        .clone()
        .unwrap_or_else(|| "stoke prm: process reward model".into());
    let history = step_records(&metrics_path)?;
    let report_path = crate::preference::report::write_preference_report(out, &title, &history)?;
    Ok(PrmSummary {
        steps: final_step,
        rows: row_count,
        first,
        last,
        last_loss,
        skipped_steps: skipped,
        seconds_per_step: seconds / (final_step - start_step).max(1) as f64,
        eval,
        resumed_from: resume_path,
        last_checkpoint,
        model_dir,
        metrics_path,
        report_path,
    })
}

/// The saved config must agree in everything that changes what is trained, the learning rate
/// of every step already taken included (the schedule follows `training.steps`).
fn check_resumable(
    saved: &PrmFile,
    current: &PrmFile,
    schedule: &LrSchedule,
    resume_step: u64,
) -> Result<(), TrainError> {
    const FREE: &[&str] = &[
        "title",
        "output_dir",
        "training.steps",
        "training.max_bad_steps",
        "training.activation_checkpointing",
        "checkpoint.",
        "schedule.",
        "data.eval",
    ];
    let mut diffs = keys::differences(saved, current, FREE);
    let saved_schedule = saved.resolved_schedule()?;
    if let Some(step) = (0..resume_step)
        .find(|&s| saved_schedule.lr_factor(s).to_bits() != schedule.lr_factor(s).to_bits())
    {
        diffs.push((
            "schedule".into(),
            format!(
                "lr factor {} at step {step}",
                saved_schedule.lr_factor(step)
            ),
            format!("{}", schedule.lr_factor(step)),
        ));
    }
    let run_dir = current.output_dir.clone();
    match diffs.into_iter().next() {
        None => Ok(()),
        Some((field, saved, current)) => Err(TrainError::ResumeMismatch {
            run_dir,
            field,
            saved,
            current,
        }),
    }
}

/// The step records of a run's log (alerts left out).
fn step_records(metrics_path: &Path) -> Result<Vec<PairStepRecord>, TrainError> {
    Ok(RunLog::<PairRecord>::read_all(metrics_path)?
        .into_iter()
        .filter_map(|record| match record {
            PairRecord::Step(step) => Some(step),
            PairRecord::Alert { .. } => None,
        })
        .collect())
}
