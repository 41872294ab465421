//! `stoke dpo CONFIG.toml`: a preference run over pairs, end to end. It loads the model
//! (usually an SFT model) and its tokenizer, reads the pairs, gets the reference's log-probs
//! (from the on-disk cache, computed into it once when missing, or from a live reference model),
//! trains with [`PairTrainer`], logs every step and saves the model.
//!
//! ```toml
//! title = "dpo"
//! output_dir = "../runs/dpo"       # relative paths are relative to this file's folder
//! [model]
//! path = "../runs/sft/model"     # an HF folder; tokenizer = "..." if it is elsewhere
//! [data]
//! train = "pairs.jsonl"            # prompt/chosen/rejected: messages or strings
//! max_len = 512                    # prompt + response tokens (default: the model's limit, at most 1024)
//! pairs_per_micro_batch = 4
//! micro_batches = 1                # gradient accumulation
//! # strict = true                  # fail on the first bad line instead of skipping it
//! # layout = "rows"                # one row per response instead of one packed sequence per pair
//! [objective]
//! kind = "dpo"                     # dpo | cpo | orpo | kto (SimPO: kind = "cpo", [cpo] loss_type = "simpo")
//!                                  # kto reads prompt/completion/label lines; [kto] settings
//! [dpo]                            # TRL's DPOConfig names: beta, loss_type, loss_weights, ...
//! beta = 0.1
//! loss_type = "sigmoid"            # or ["sigmoid", "bco_pair", "sft"] with loss_weights (MPO)
//! [reference]
//! mode = "cached"                  # or "live" (two models in memory; needed by sync_steps)
//! # sync_steps = 512               # TR-DPO; mixup_alpha = 0.6
//! [optimizer]                      # the [optimizer] table of `stoke train`; lr default 1e-6 (TRL),
//!                                  # clip_grad_norm 1.0 (0 = off)
//! lr = 5e-7
//! [schedule]                       # the [schedule] table of `stoke train`, its defaults too (WSD)
//! [training]
//! steps = 200
//! # max_bad_steps = 3; seed = 0; precision = "bf16"; activation_checkpointing
//! # batch_shards = "auto"          # or N: each micro-batch as N shards at once, one per thread
//! [checkpoint]                     # the [checkpoint] table of `stoke train` and `stoke grpo`
//! every = 50                       # 0 (default): only the final checkpoint; keep = 2; keep_steps
//! ```
//!
//! Files written under `output_dir`: `config.toml` (the resolved config, always: `stoke export
//! --lineage` reads it), `metrics.jsonl` (one `kind = "step"` record per step through the shared
//! metrics log: loss, grad norm, lr, outcome, tokens/s and the loss's metrics under TRL's names)
//! with its TensorBoard event file, `checkpoints/step-*` (the shared checkpoint layout: model,
//! optimizer state, the step engine's typed state and the data cursor), `report.html` (the
//! trainer's summary and curves, plus the log-probs, rewards and margins charts), `model/` (HF
//! layout, with the tokenizer), and the reference cache `reference/ref-logps-<key>.json` (reused
//! by any later run on the same pairs and reference weights). Under TR-DPO the synced live
//! reference is kept in `reference-step-*` so a resume finds it.
//!
//! Resume: the rule of every training command (`CheckpointStore::resume_point`): `--resume`
//! continues from the newest checkpoint that verifies and ends with the weights of the
//! uninterrupted run, bit for bit; a fresh start into a folder that holds checkpoints is
//! refused. The saved config must agree in everything that changes what is trained.

use std::io::IsTerminal;
use std::path::{Path, PathBuf};

use candle_core::Device;
use indicatif::ProgressBar;
use serde::{Deserialize, Serialize};
use stoke_model::Transformer;
use stoke_optim::{LrSchedule, Optimizer};
use stoke_tokenizer::hf::Tokenizer;

use super::data::PreferencePair;
use super::data::read_labelled;
use super::data::{ReadOptions, ReadReport, read_pairs};
use super::record::{PairRecord, PairStepRecord};
use super::scoring::{PairReference, cache_key, load_cache, save_cache, score_reference};
use super::train::PairCursor;
use super::train::kto_rows;
use super::train::{
    PairLoopSettings, PairObjective, PairTrainer, Reference, ReferenceSync, pair_margins, pair_rows,
};
use super::{CpoLoss, DpoLoss, KtoLoss, OrpoLoss, RewardModelLoss};
use crate::checkpoint::{CheckpointStore, TrainerState, load_checkpoint};
use crate::config::{
    CheckpointFile, ConfigError, OptimizerFile, ScheduleDefaults, ScheduleFile, keys,
    resolve_lr_schedule, resolve_optimizer,
};
use crate::error::TrainError;
use crate::grpo::ScoringLayout;
use crate::metrics::RunLog;
use crate::monitor::Monitor;
use crate::run::RunOptions;
use crate::run_folder::RunFolder;
use crate::step::{StepEngine, StepOutcome, StepSettings};

/// TRL's `DPOConfig.learning_rate`.
pub const DEFAULT_LR: f64 = 1e-6;

/// The TOML file.
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreferenceFile {
    #[serde(default)]
    pub title: Option<String>,
    pub output_dir: PathBuf,
    pub model: PreferenceModelFile,
    pub data: PairDataFile,
    #[serde(default)]
    pub objective: ObjectiveFile,
    #[serde(default)]
    pub dpo: DpoLoss,
    #[serde(default)]
    pub cpo: CpoLoss,
    #[serde(default)]
    pub orpo: OrpoLoss,
    #[serde(default)]
    pub kto: KtoLoss,
    /// `[reward_model] center_rewards_coefficient` (`objective.kind = "reward_model"`).
    #[serde(default)]
    pub reward_model: RewardModelLoss,
    #[serde(default)]
    pub reference: ReferenceFile,
    #[serde(default)]
    pub optimizer: OptimizerFile,
    #[serde(default)]
    pub schedule: Option<ScheduleFile>,
    pub training: PreferenceTrainingFile,
    /// `[checkpoint] every / keep / keep_steps`, as in `stoke train` and `stoke grpo`.
    #[serde(default)]
    pub checkpoint: CheckpointFile,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreferenceModelFile {
    /// The starting model (usually an SFT model): the shared `[model] path`.
    pub path: PathBuf,
    #[serde(default)]
    pub tokenizer: Option<PathBuf>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PairDataFile {
    pub train: PathBuf,
    /// Held-out pairs scored after training (reward models: pair accuracy and margin).
    #[serde(default)]
    pub eval: Option<PathBuf>,
    #[serde(default)]
    pub max_len: Option<usize>,
    #[serde(default)]
    pub strict: bool,
    #[serde(default = "default_pairs")]
    pub pairs_per_micro_batch: usize,
    #[serde(default = "one")]
    pub micro_batches: usize,
    #[serde(default)]
    pub layout: PairLayout,
}

fn default_pairs() -> usize {
    4
}
fn one() -> usize {
    1
}

/// How a pair goes through the forward pass.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum PairLayout {
    /// One sequence per pair, the prompt shared.
    #[default]
    Packed,
    /// One row per response.
    Rows,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ObjectiveFile {
    #[serde(default)]
    pub kind: ObjectiveKind,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ObjectiveKind {
    #[default]
    Dpo,
    Cpo,
    Orpo,
    /// Unpaired `prompt`/`completion`/`label` lines.
    Kto,
    /// A Bradley-Terry reward model on the pairs (`stoke rm`): the model becomes a sequence
    /// classifier with one label unless it is one already.
    RewardModel,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ReferenceMode {
    #[default]
    Cached,
    Live,
}

#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ReferenceFile {
    #[serde(default)]
    pub mode: ReferenceMode,
    /// Default: `<output_dir>/reference`.
    #[serde(default)]
    pub cache_dir: Option<PathBuf>,
    #[serde(default)]
    pub sync_steps: Option<u64>,
    #[serde(default)]
    pub mixup_alpha: Option<f64>,
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PreferenceTrainingFile {
    pub steps: u64,
    #[serde(default)]
    pub seed: u64,
    #[serde(default = "default_bad_steps")]
    pub max_bad_steps: u64,
    /// The matrix products' precision (`stoke train`'s `training.precision`): "f32" or "bf16"
    /// (bf16 products with f32 accumulation; master weights, gradients and optimizer state f32).
    #[serde(default)]
    pub precision: stoke_types::Precision,
    /// Recompute activations in the backward pass (`stoke train`'s key).
    #[serde(default)]
    pub activation_checkpointing: bool,
    /// Score and backpropagate each micro-batch as this many shards at once, one per thread
    /// (`"auto"`: one per thread for models small enough that the shards' extra gradients stay
    /// under 64 MiB, else 1; see `preference::shards`).
    #[serde(default)]
    pub batch_shards: BatchShards,
}

impl PreferenceTrainingFile {
    /// `steps` steps with every other key at its default (what a file with only
    /// `[training] steps` means).
    pub fn new(steps: u64) -> PreferenceTrainingFile {
        PreferenceTrainingFile {
            steps,
            seed: 0,
            max_bad_steps: default_bad_steps(),
            precision: stoke_types::Precision::default(),
            activation_checkpointing: false,
            batch_shards: BatchShards::default(),
        }
    }
}

/// `training.batch_shards`: `"auto"` or a count (1 = unsharded).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(try_from = "ShardsValue", into = "ShardsValue")]
pub enum BatchShards {
    #[default]
    Auto,
    Count(usize),
}

#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(untagged)]
enum ShardsValue {
    Count(usize),
    Word(String),
}

impl TryFrom<ShardsValue> for BatchShards {
    type Error = String;
    fn try_from(value: ShardsValue) -> Result<BatchShards, String> {
        match value {
            ShardsValue::Count(0) => Err("batch_shards must be at least 1 (or \"auto\")".into()),
            ShardsValue::Count(n) => Ok(BatchShards::Count(n)),
            ShardsValue::Word(w) if w == "auto" => Ok(BatchShards::Auto),
            ShardsValue::Word(w) => Err(format!(
                "batch_shards is \"auto\" or a number of shards, not \"{w}\""
            )),
        }
    }
}

impl From<BatchShards> for ShardsValue {
    fn from(value: BatchShards) -> ShardsValue {
        match value {
            BatchShards::Auto => ShardsValue::Word("auto".into()),
            BatchShards::Count(n) => ShardsValue::Count(n),
        }
    }
}

impl BatchShards {
    /// The shard count for `model` on the current thread pool.
    pub fn resolve(self, model: &Transformer) -> usize {
        match self {
            BatchShards::Count(n) => n,
            BatchShards::Auto => {
                let trainable = model
                    .trainable_parameters()
                    .iter()
                    .map(|(_, v)| v.as_tensor().elem_count())
                    .sum();
                super::shards::auto_shards(trainable, rayon::current_num_threads())
            }
        }
    }
}

fn default_bad_steps() -> u64 {
    3
}

/// Keys of `stoke dpo` renamed to the shared vocabulary (see `config::keys`).
pub const RENAMED: &[keys::Renamed] = &[
    keys::Renamed {
        old: "training.clip_norm",
        new: keys::CLIP_GRAD_NORM,
    },
    keys::Renamed {
        old: "model.pretrained",
        new: keys::MODEL_PATH,
    },
];

impl PreferenceFile {
    /// Reads `path`, applies `--set` overrides, and makes its relative paths absolute against
    /// the file's folder. Errors name the key.
    pub fn load(path: &Path, sets: &[String]) -> Result<PreferenceFile, ConfigError> {
        let origin = path.display().to_string();
        let table = keys::read_table(path)?;
        let base = path.parent().unwrap_or(Path::new("."));
        PreferenceFile::from_table(table, &origin, base, sets)
    }

    /// A config table embedded in another file (a recipe's `[dpo]`): `--set` overrides applied,
    /// relative paths made absolute against `base`; errors name `origin` and the key.
    pub fn from_table(
        table: toml::Table,
        origin: &str,
        base: &Path,
        sets: &[String],
    ) -> Result<PreferenceFile, ConfigError> {
        let table = keys::prepare_table(table, origin, sets, RENAMED)?;
        let mut file: PreferenceFile = keys::from_table(table, origin)?;
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
        if let Some(c) = file.reference.cache_dir.as_mut() {
            absolute(c);
        }
        Ok(file)
    }

    /// The resolved file as `<run>/config.toml` holds it (paths absolute).
    pub fn to_toml(&self) -> Result<String, ConfigError> {
        toml::to_string(self).map_err(|e| ConfigError::Invalid {
            key: "(config)".into(),
            message: format!("cannot write the resolved config: {e}"),
        })
    }

    /// A run's saved `config.toml` (its paths are already absolute).
    pub fn from_saved(text: &str, origin: &Path) -> Result<PreferenceFile, ConfigError> {
        let mut table = keys::parse_table(text, origin)?;
        let origin = origin.display().to_string();
        keys::migrate_renamed(&mut table, RENAMED, &origin)?;
        keys::from_table(table, &origin)
    }

    /// The optimizer the run builds for a model of `hidden_size` (`[optimizer]` with `stoke
    /// dpo`'s defaults: TRL's lr 1e-6, no weight decay).
    pub fn resolved_optimizer(
        &self,
        hidden_size: usize,
    ) -> Result<stoke_optim::OptimizerConfig, ConfigError> {
        resolve_optimizer(
            &OptimizerFile {
                lr: Some(self.optimizer.lr.unwrap_or(DEFAULT_LR)),
                weight_decay: Some(self.optimizer.weight_decay.unwrap_or(0.0)),
                ..self.optimizer.clone()
            },
            hidden_size,
        )
    }

    /// The learning-rate schedule over `training.steps`, with the defaults every command
    /// shares (an absent `[schedule]` is an empty one: WSD, `ScheduleDefaults::shared`).
    pub fn resolved_schedule(&self) -> Result<LrSchedule, ConfigError> {
        resolve_lr_schedule(
            &self.schedule.clone().unwrap_or_default(),
            self.training.steps,
            ScheduleDefaults::shared(self.training.steps),
        )
    }

    pub fn objective(&self) -> PairObjective {
        match self.objective.kind {
            ObjectiveKind::Dpo => PairObjective::Dpo(self.dpo.clone()),
            ObjectiveKind::Cpo => PairObjective::Cpo(self.cpo.clone()),
            ObjectiveKind::Orpo => PairObjective::Orpo(self.orpo.clone()),
            ObjectiveKind::Kto => PairObjective::Kto(self.kto.clone()),
            ObjectiveKind::RewardModel => PairObjective::RewardModel(self.reward_model.clone()),
        }
    }
}

/// What a run did.
#[derive(Clone, Debug)]
pub struct PreferenceSummary {
    pub steps: u64,
    pub pairs: usize,
    pub read: ReadReport,
    pub first: Option<Vec<(&'static str, f64)>>,
    pub last: Option<Vec<(&'static str, f64)>>,
    pub last_loss: Option<f64>,
    pub skipped_steps: u64,
    /// Mean over the run's steps.
    pub seconds_per_step: f64,
    pub tokens_per_s: f64,
    /// Shards each micro-batch was computed in (`training.batch_shards`, resolved).
    pub shards: usize,
    /// Where the reference came from: the cache file (and whether this run wrote it), or live.
    pub reference: String,
    /// Reward models with `data.eval`: the held-out pairs and the figures on them (TRL's
    /// names: `accuracy`, `margin`, ...), also written to `eval.json`.
    pub eval: Option<(usize, Vec<(&'static str, f64)>)>,
    /// The checkpoint this run continued from (`--resume`).
    pub resumed_from: Option<PathBuf>,
    /// The run's newest checkpoint (every run ends with one).
    pub last_checkpoint: PathBuf,
    pub model_dir: PathBuf,
    pub metrics_path: PathBuf,
    pub report_path: PathBuf,
}

/// Runs `file` to the end as a fresh run. `quiet` turns the progress display off.
pub fn run_preference(file: &PreferenceFile, quiet: bool) -> Result<PreferenceSummary, TrainError> {
    run_preference_with(
        file,
        &RunOptions {
            quiet,
            ..RunOptions::default()
        },
    )
}

/// Runs `file` to the end under the shared run rules (`RunOptions`: resume, quiet): the run
/// folder, `config.toml`, the metrics log and the checkpoints are those of every training
/// command (see the module doc).
pub fn run_preference_with(
    file: &PreferenceFile,
    options: &RunOptions,
) -> Result<PreferenceSummary, TrainError> {
    stoke_ops::numerics::init_compute_threads();
    let quiet = options.quiet;
    let device = Device::Cpu;
    let objective = file.objective();
    objective.validate()?;
    let tokenizer_dir = file
        .model
        .tokenizer
        .clone()
        .unwrap_or_else(|| file.model.path.clone());
    let tokenizer = Tokenizer::from_dir(&tokenizer_dir)
        .map_err(|e| TrainError::Other(format!("{}: {e}", tokenizer_dir.display())))?;
    let mut policy = Transformer::load(&file.model.path, &device)?;
    let reward_model = file.objective.kind == ObjectiveKind::RewardModel;
    if policy.is_token_classifier() && !reward_model {
        return Err(invalid_key(
            "model.path",
            format!(
                "{} is a token classifier (a process reward model): it trains with stoke prm, \
                 not on pairs",
                file.model.path.display()
            ),
        ));
    }
    if reward_model && !policy.is_sequence_classifier() {
        // TRL's `AutoModelForSequenceClassification.from_pretrained(path, num_labels=1)`.
        policy = policy.to_sequence_classifier(1, file.training.seed)?;
    }
    if file.data.eval.is_some() && !reward_model {
        return Err(invalid_key(
            "data.eval",
            "held-out pairs are scored by reward-model runs (objective.kind = \"reward_model\")"
                .into(),
        ));
    }
    policy.set_precision(file.training.precision);
    policy.set_activation_checkpointing(file.training.activation_checkpointing);
    let limit = policy.config().max_position_embeddings;
    let max_len = file.data.max_len.unwrap_or(limit.min(1024));
    if max_len > limit {
        return Err(invalid_key(
            "data.max_len",
            format!("{max_len} is over the model's max_position_embeddings = {limit}"),
        ));
    }
    let options_read = ReadOptions {
        max_len,
        strict: file.data.strict,
    };
    // KTO's examples become (completion, mismatched completion) rows with a label.
    let (pairs, labelled, read) = if file.objective.kind == ObjectiveKind::Kto {
        let (examples, read) = read_labelled(&file.data.train, &tokenizer, options_read)?;
        (kto_rows(&examples), Some(examples), read)
    } else {
        let (pairs, read) = read_pairs(&file.data.train, &tokenizer, options_read)?;
        (pairs, None, read)
    };
    for skipped in &read.skipped {
        eprintln!("skipped {skipped}");
    }
    let layout = match file.data.layout {
        PairLayout::Packed => ScoringLayout::SharedPrefix,
        PairLayout::Rows => ScoringLayout::Rows,
    };
    let sync = match (file.reference.sync_steps, file.reference.mixup_alpha) {
        (Some(every), alpha) => Some(ReferenceSync {
            alpha: alpha.unwrap_or(0.6),
            every,
        }),
        (None, Some(_)) => {
            return Err(invalid_key(
                "reference.mixup_alpha",
                "only applies with reference.sync_steps (TR-DPO)".into(),
            ));
        }
        (None, None) => None,
    };
    let schedule = file.resolved_schedule()?;

    // The run folder: the one resume rule, then config.toml (after the rule, so a refused
    // fresh start leaves another run's config as it was).
    let out = &file.output_dir;
    let folder = RunFolder::open(
        out,
        file.checkpoint.keep.unwrap_or(DEFAULT_KEEP),
        options.resume,
    )?;
    let resume_path = folder.resume_point().map(Path::to_path_buf);
    let config_toml = file.to_toml()?;
    // On resume: the starting weights, which the reference cache belongs to.
    let mut starting = None;
    let resumed = match &resume_path {
        Some(path) => {
            let loaded = load_checkpoint(path, &device)?;
            let saved = PreferenceFile::from_saved(
                &loaded.config_toml,
                &path.join(crate::checkpoint::CONFIG_FILE),
            )?;
            check_resumable(&saved, file, &schedule, loaded.state.step)?;
            let mut model = loaded.model;
            model.set_precision(file.training.precision);
            model.set_activation_checkpointing(file.training.activation_checkpointing);
            starting = Some(std::mem::replace(&mut policy, model));
            if !quiet {
                eprintln!(
                    "resuming from {} (step {})",
                    path.display(),
                    loaded.state.step
                );
            }
            Some((loaded.state, loaded.optimizer_state))
        }
        None => None,
    };
    folder.record_start(if reward_model { "rm" } else { "dpo" }, &config_toml)?;

    let extra: PairExtra = match &resumed {
        Some((state, _)) => serde_json::from_value(state.extra.clone())
            .map_err(|e| TrainError::Resume(format!("trainer state `extra`: {e}")))?,
        None => PairExtra::default(),
    };
    let (reference, reference_note) = if !objective.needs_reference() {
        (Reference::None, "none (reference-free loss)".to_string())
    } else {
        match file.reference.mode {
            ReferenceMode::Live => {
                // After a TR-DPO sync the reference is the mixed model, kept in the run folder.
                let dir = match extra.reference_synced_at {
                    Some(step) => reference_model_dir(out, step),
                    None => file.model.path.clone(),
                };
                (
                    Reference::Live(Box::new(
                        Transformer::load(&dir, &device)?.with_precision(file.training.precision),
                    )),
                    "live (a second model)".to_string(),
                )
            }
            ReferenceMode::Cached => {
                let dir = file
                    .reference
                    .cache_dir
                    .clone()
                    .unwrap_or_else(|| out.join("reference"));
                // The cache belongs to the starting weights, not a checkpoint's.
                let scorer = starting.as_ref().unwrap_or(&policy);
                let (entries, note) = cached_reference(scorer, &pairs, &dir, layout, quiet)?;
                (Reference::Cached(entries), note)
            }
        }
    };

    drop(starting);
    let optimizer_config = file.resolved_optimizer(policy.config().hidden_size)?;
    let step_settings = StepSettings {
        schedule,
        clip_norm: keys::clip_grad_norm(file.optimizer.clip_grad_norm),
        spike: StepSettings::spike_off(),
        max_bad_steps: file.training.max_bad_steps,
    };
    step_settings.validate()?;
    let mut optimizer = Optimizer::new(optimizer_config, policy.trainable_parameters())?;
    if let Some((_, optimizer_state)) = &resumed {
        optimizer.load_state(optimizer_state)?;
    }
    let engine = StepEngine::new(optimizer, step_settings);
    // The loop never makes more shards than a micro-batch has pairs; the summary says what ran.
    let shards = if reward_model {
        1
    } else {
        file.training
            .batch_shards
            .resolve(&policy)
            .min(file.data.pairs_per_micro_batch.max(1))
    };
    let loop_settings = PairLoopSettings {
        pairs_per_micro_batch: file.data.pairs_per_micro_batch,
        micro_batches: file.data.micro_batches,
        layout,
        seed: file.training.seed,
        sync,
        shards,
    };
    let mut trainer = match (&objective, &labelled) {
        (PairObjective::Kto(loss), Some(examples)) => PairTrainer::kto(
            policy,
            engine,
            loss.clone(),
            reference,
            examples,
            loop_settings,
        )?,
        _ => PairTrainer::new(
            policy,
            engine,
            objective.clone(),
            reference,
            pairs,
            loop_settings,
        )?,
    };
    let mut tokens_seen = 0u64;
    let mut reference_synced_at = extra.reference_synced_at;
    if let Some((state, _)) = &resumed {
        let cursor: PairCursor = serde_json::from_value(state.source.clone())
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
    let save = |trainer: &mut PairTrainer,
                log: &mut RunLog<PairRecord>,
                tokens_seen: u64,
                reference_synced_at: Option<u64>|
     -> Result<PathBuf, TrainError> {
        log.flush()?;
        let state = TrainerState {
            step: trainer.engine().steps(),
            tokens_seen,
            source: serde_json::to_value(trainer.cursor())
                .map_err(|e| TrainError::Other(format!("data cursor: {e}")))?,
            engine: Some(trainer.engine().state()),
            extra: serde_json::to_value(PairExtra {
                reference_synced_at,
            })
            .map_err(|e| TrainError::Other(format!("trainer state: {e}")))?,
        };
        let path = store.save(
            trainer.model(),
            Some(&tokenizer_dir),
            trainer.engine().optimizer(),
            &state,
            &config_toml,
            &file.checkpoint.keep_steps,
        )?;
        if sync.is_some() {
            remove_unneeded_references(out, &store, reference_synced_at)?;
        }
        Ok(path)
    };
    // The display every command shares (a bar, or plain lines off a terminal) and its alert
    // rules, replayed over a resumed run's kept steps.
    let mut monitor = if quiet {
        Monitor::plain(total, total, Box::new(std::io::sink()))
    } else {
        Monitor::new(total, false)
    };
    if resumed.is_some() {
        monitor.replay(&super::report::standard_records(&step_records(
            &metrics_path,
        )?));
    }
    let started = std::time::Instant::now();
    let (mut first, mut last, mut last_loss) = (None, None, None);
    let (mut tokens, mut seconds, mut skipped) = (0usize, 0f64, 0u64);
    let mut last_checkpoint = None;
    while trainer.engine().steps() < total {
        let report = trainer.step()?;
        tokens += report.tokens;
        tokens_seen += report.tokens as u64;
        seconds += report.seconds;
        if report.outcome != StepOutcome::Applied {
            skipped += 1;
        }
        let record = PairStepRecord::from_report(&report);
        log.append(&PairRecord::Step(record.clone()))?;
        // A TR-DPO sync changed the reference: keep it, so a resume finds it.
        if let Some(sync) = sync
            && report.outcome == StepOutcome::Applied
            && report.step.is_multiple_of(sync.every)
            && let Some(reference) = trainer.reference_model()
        {
            crate::checkpoint::save_model(reference, &reference_model_dir(out, report.step), None)?;
            reference_synced_at = Some(report.step);
        }
        let metric = |name: &str| report.metric(name).unwrap_or(f64::NAN);
        let detail = if reward_model {
            format!(
                "margin {:.3} | acc {:.2} | reward {:.2} ± {:.2}",
                metric("margin"),
                metric("accuracy"),
                metric("mean_reward"),
                metric("std_reward")
            )
        } else {
            format!(
                "margin {:.3} | acc {:.2} | chosen {:.2} | rejected {:.2}",
                metric("rewards/margins"),
                metric("rewards/accuracies"),
                metric("logps/chosen"),
                metric("logps/rejected"),
            )
        };
        let standard =
            super::report::standard_step(&record, tokens_seen, started.elapsed().as_secs_f64());
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
        // During a streak of non-finite steps the checkpoint waits, as `stoke train`'s does.
        if every > 0
            && report.step.is_multiple_of(every)
            && trainer.engine().consecutive_bad_steps() == 0
        {
            last_checkpoint = Some((
                report.step,
                save(&mut trainer, &mut log, tokens_seen, reference_synced_at)?,
            ));
        }
    }
    monitor.finish();
    let final_step = trainer.engine().steps();
    let last_checkpoint = match last_checkpoint {
        Some((step, path)) if step == final_step => path,
        _ if resume_path.is_some() && final_step == start_step => {
            resume_path.clone().unwrap_or_default()
        }
        _ => save(&mut trainer, &mut log, tokens_seen, reference_synced_at)?,
    };
    let model_dir = out.join("model");
    crate::checkpoint::save_model(trainer.model(), &model_dir, Some(&tokenizer_dir))?;
    let eval = match (&file.data.eval, &file.objective()) {
        (Some(path), PairObjective::RewardModel(loss)) => {
            let (pairs, read) = read_pairs(path, &tokenizer, options_read)?;
            for skipped in &read.skipped {
                eprintln!("eval: skipped {skipped}");
            }
            let figures = evaluate_reward_model(trainer.model(), loss, &pairs)?;
            std::fs::write(
                out.join("eval.json"),
                serde_json::to_string_pretty(&serde_json::json!({
                    "pairs": pairs.len(),
                    "step": final_step,
                    "metrics": figures.iter().map(|(k, v)| (k.to_string(), serde_json::Value::from(*v))).collect::<serde_json::Map<String, serde_json::Value>>(),
                }))
                .map_err(|e| TrainError::Other(e.to_string()))?,
            )
            .map_err(|e| TrainError::Other(format!("{}: {e}", out.join("eval.json").display())))?;
            Some((pairs.len(), figures))
        }
        _ => None,
    };
    let title = file.title.clone().unwrap_or_else(|| {
        if reward_model {
            "stoke rm: reward model".to_string()
        } else {
            format!("stoke dpo: {}", file.objective().name())
        }
    });
    // The report covers the whole run, resumed parts included: it reads the log.
    let history = step_records(&metrics_path)?;
    let report_path = super::report::write_preference_report(out, &title, &history)?;
    Ok(PreferenceSummary {
        steps: final_step,
        pairs: read.examples,
        read,
        first,
        last,
        last_loss,
        skipped_steps: skipped,
        seconds_per_step: seconds / (final_step - start_step).max(1) as f64,
        tokens_per_s: tokens as f64 / seconds.max(1e-9),
        shards,
        reference: reference_note,
        eval,
        resumed_from: resume_path,
        last_checkpoint,
        model_dir,
        metrics_path,
        report_path,
    })
}

/// A reward model's figures on held-out `pairs` (16 pairs per forward pass): the loss's metrics
/// over all of them at once (`accuracy`, `margin`, min/mean/max/std of the rewards) and the
/// `loss` itself.
pub fn evaluate_reward_model(
    model: &Transformer,
    loss: &RewardModelLoss,
    pairs: &[PreferencePair],
) -> Result<Vec<(&'static str, f64)>, TrainError> {
    if pairs.is_empty() {
        return Err(invalid_key("data.eval", "no held-out pair to score".into()));
    }
    let mut scores: Vec<f64> = Vec::with_capacity(2 * pairs.len());
    let (mut chosen, mut rejected) = (Vec::new(), Vec::new());
    for chunk in pairs.chunks(16) {
        let refs: Vec<&PreferencePair> = chunk.iter().collect();
        let rows = pair_rows(&refs);
        let row_refs: Vec<&[u32]> = rows.iter().map(Vec::as_slice).collect();
        // Each batch's graph is dropped with its scores; no copy of the model is made.
        let values: Vec<f32> = model
            .score_sequences(&row_refs)?
            .detach()
            .flatten_all()?
            .to_vec1()?;
        let (c, r) = values.split_at(chunk.len());
        chosen.extend(c.iter().map(|v| f64::from(*v)));
        rejected.extend(r.iter().map(|v| f64::from(*v)));
    }
    scores.extend(&chosen);
    scores.extend(&rejected);
    let all: Vec<&PreferencePair> = pairs.iter().collect();
    let margins = pair_margins(&all);
    let tensor = candle_core::Tensor::from_vec(scores, 2 * pairs.len(), &Device::Cpu)?;
    let out = loss.loss(&tensor, margins.as_deref())?;
    let mut figures = out.metrics;
    figures.push(("loss", out.loss.to_scalar::<f64>()?));
    Ok(figures)
}

/// Checkpoints kept by default (`[checkpoint] keep`), as in `stoke train`.
pub const DEFAULT_KEEP: usize = 2;

/// `stoke dpo`'s part of `TrainerState.extra`.
#[derive(Clone, Debug, Default, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct PairExtra {
    /// The step of the last TR-DPO reference sync, whose reference is in
    /// [`reference_model_dir`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    reference_synced_at: Option<u64>,
}

/// Removes the synced references (`reference-step-*`) that neither the run (`current`) nor any
/// checkpoint still in `store` would resume with, so a long TR-DPO run keeps a bounded number of
/// reference models on disk (rotation bounds the checkpoints).
fn remove_unneeded_references(
    out: &Path,
    store: &CheckpointStore,
    current: Option<u64>,
) -> Result<(), TrainError> {
    let mut needed: Vec<u64> = current.into_iter().collect();
    for (_, checkpoint) in store.list()? {
        let state = crate::checkpoint::read_trainer_state(
            &checkpoint.join(crate::checkpoint::TRAINER_STATE_FILE),
        )?;
        if let Ok(PairExtra {
            reference_synced_at: Some(step),
        }) = serde_json::from_value(state.extra)
        {
            needed.push(step);
        }
    }
    let entries = std::fs::read_dir(out).map_err(|e| TrainError::io(out, e))?;
    for entry in entries {
        let path = entry.map_err(|e| TrainError::io(out, e))?.path();
        let Some(step) = path
            .file_name()
            .and_then(|n| n.to_str())
            .and_then(|n| n.strip_prefix("reference-step-"))
            .and_then(|n| n.parse::<u64>().ok())
        else {
            continue;
        };
        if !needed.contains(&step) {
            std::fs::remove_dir_all(&path).map_err(|e| TrainError::io(&path, e))?;
        }
    }
    Ok(())
}

/// Where the live reference after the TR-DPO sync at `step` is kept.
pub fn reference_model_dir(out: &Path, step: u64) -> PathBuf {
    out.join(format!("reference-step-{step:08}"))
}

/// The resume check: the saved config must agree with this one in everything that changes
/// what is trained (the first difference is named); `training.steps` may grow when the
/// schedule's factors of the steps already taken are unchanged.
fn check_resumable(
    saved: &PreferenceFile,
    current: &PreferenceFile,
    schedule: &LrSchedule,
    resume_step: u64,
) -> Result<(), TrainError> {
    const FREE: &[&str] = &[
        "title",
        "output_dir",
        "training.steps",
        "training.max_bad_steps",
        "checkpoint.",
        // Exact (bit-identical gradients), so it may change between sessions of a run.
        "training.activation_checkpointing",
        "reference.cache_dir",
        "schedule.",
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

/// The reference values from the cache in `dir`, computed and written there when missing.
fn cached_reference(
    model: &Transformer,
    pairs: &[super::data::PreferencePair],
    dir: &Path,
    layout: ScoringLayout,
    quiet: bool,
) -> Result<(Vec<PairReference>, String), TrainError> {
    let key = cache_key(model, pairs)?;
    let path = super::scoring::cache_path(dir, &key);
    if let Some(entries) = load_cache(dir, &key, pairs.len())? {
        return Ok((entries, format!("cached: {} (reused)", path.display())));
    }
    let bar = progress(pairs.len() as u64, quiet);
    if let Some(bar) = &bar {
        bar.set_message("reference log-probs");
    } else if !quiet {
        eprintln!("scoring the reference on {} pairs", pairs.len());
    }
    let mut entries = Vec::with_capacity(pairs.len());
    const CHUNK: usize = 8;
    for chunk in pairs.chunks(CHUNK) {
        let batch: Vec<_> = chunk.iter().collect();
        entries.extend(score_reference(model, &batch, layout)?);
        if let Some(bar) = &bar {
            bar.set_position(entries.len() as u64);
        }
    }
    if let Some(bar) = bar {
        bar.finish_and_clear();
    }
    save_cache(dir, &key, &entries)?;
    Ok((entries, format!("cached: {} (written)", path.display())))
}

/// The bar of the reference-scoring pass (off when quiet or off a terminal).
fn progress(total: u64, quiet: bool) -> Option<ProgressBar> {
    if quiet || !std::io::stderr().is_terminal() {
        return None;
    }
    Some(crate::monitor::step_bar(total))
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

fn invalid_key(key: &str, message: String) -> TrainError {
    TrainError::Config(ConfigError::Invalid {
        key: key.to_string(),
        message,
    })
}
