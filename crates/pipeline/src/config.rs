//! The GRPO run configuration in two layers: [`GrpoConfigFile`], the TOML file a person writes
//! (every table rejects unknown keys; every key is optional except `[model] path`), and
//! [`GrpoConfig`], the resolved run: paths absolute, rewards in index order, and the validated
//! [`GrpoSettings`] the pipeline reads.
//!
//! ```toml
//! output_dir = "../runs/grpo"     # the shared key of every training command (was `[out] dir`)
//! [model]
//! path = "../runs/sft/model"     # HF model folder with tokenizer files; relative to this file
//! reference = "../runs/sft/model" # optional; default: the policy's own starting weights
//! [tasks]
//! kind = "arithmetic"             # or: kind = "jsonl", path = "tasks.jsonl"; "calculator",
//!                                 # "code_repair" (seed, problems, max_bugs, templates) go with
//!                                 # the [environment] of that name
//! levels = ["single_digit"]       # names of stoke_eval::Level
//! problems = 1000
//! [held_out]                      # optional; arithmetic: drawn from the held-out split
//! kind = "arithmetic"
//! [rewards.default]               # each a stoke_reward::RewardConfig
//! kind = "exact_match"
//! mode = "gsm8k"
//! [training]                     # the shared table: steps, seed, precision,
//! steps = 50                      # activation_checkpointing, max_bad_steps (were `grpo.*`)
//! [grpo]
//! group_size = 8
//! [grpo.loss]                     # stoke_train::grpo::GrpoLossFile
//! beta = 0.0
//! [optimizer]                     # the same keys as `stoke train`'s [optimizer]
//! lr = 1e-5
//! [schedule]
//! kind = "constant"
//! [eval]
//! every = 10
//! [checkpoint]
//! every = 10
//! [environment]                   # optional: multi-turn episodes with tools (see
//! kind = "calculator"             # `config/environment.rs` for its keys and defaults)
//! [rollout]                       # optional; default kind = "local" (in process)
//! kind = "remote"
//! servers = ["http://gen-0:8000"] # OpenAI-compatible servers (stoke serve, vLLM)
//! [reward]                        # optional; stoke reward-server processes
//! kind = "remote"
//! servers = ["http://rewards-0:8100"]
//! ```
//!
//! Defaults (TRL's `GRPOConfig` where it has one, so a stoke run and a TRL run agree unless told
//! otherwise):
//! - `[tasks]`: arithmetic, levels `["single_digit"]`, 1000 problems, seed = `training.seed`.
//!   `[held_out]`: for arithmetic tasks, the held-out split at the same levels with
//!   `eval.problems` problems; for calculator and code_repair tasks, `eval.problems` drawn with
//!   the seed + 1 (code_repair: the same `max_bugs` and `templates`); for JSONL tasks, none (no
//!   held-out evaluation). `code_repair`: `max_bugs` 2, every template; its tasks and
//!   `[environment] kind = "code_repair"` go together (each without the other is an error).
//! - `[rewards]`: one reward `default` = exact match in `gsm8k` mode with `extract_answer`.
//!   Reward order: `default` is index 0 (what tasks without a `reward` name use), the others
//!   follow sorted by name; without a `default`, the first name in that order is index 0.
//! - `[training]`: steps 100, seed 0, precision "f32", activation_checkpointing false,
//!   max_bad_steps 3 (the old `grpo.*` names are read with a deprecation warning).
//! - `[grpo]`: prompts_per_step 8, group_size 16, max_new_tokens 256,
//!   temperature 1.0 (constant: `temperature_end` = `temperature`, `temperature_decay_steps` 0),
//!   top_p 1.0, top_k off (0 also means off), mode "async", max_off_policy_steps 1 (0 in
//!   mode "sync"), lag "bounded", weight_sync "between_batches", rollout_batch_groups = prompts_per_step,
//!   buffer_bytes 16 MiB, kl_placement "loss", reference_reset_every off, old_logprobs
//!   "rollout", drop_equal_reward_groups false,
//!   micro_batch_tokens 8192, reward_workers and threads = the machine's cores,
//!   reward_timeout_s 30.
//! - `[grpo.loss]`: GrpoLossFile's defaults (clipped surrogate eps 0.2/0.2, token-mean, beta 0).
//! - `[optimizer]`: AdamW, lr 1e-6, betas (0.9, 0.95), eps 1e-8, weight_decay 0, clip_grad_norm
//!   1.0 (0 turns it off) (TRL's; users of tiny models set a larger lr). `grpo.clip_grad_norm`,
//!   the old name, is read with a deprecation warning. `kind = "muon"` takes the Muon keys of `stoke train`.
//! - `[schedule]`: the defaults of every training command (`ScheduleDefaults::shared`): WSD,
//!   warmup over `min(1000, steps / 20)` steps, decay over the last 20% to min_lr_ratio 0,
//!   linear; cosine to min_lr_ratio 0.1. (Before the shared vocabulary GRPO defaulted to a
//!   constant rate: write `kind = "constant"` for that.)
//! - `[eval]`: every 0 (before the first update and after the last only), samples 8, problems 64.
//! - `[checkpoint]`: every 0 (only at the end), keep 2, keep_steps [] (stoke train's section).
//! - `[ptx]`: off; when present `shards` is required, coef 0.1, batch_size 4, seq_len 256.
//! - `output_dir`: `runs/<config file stem>` next to the config file (`[out] dir`, the old
//!   name, is read with a deprecation warning).
//! - `[rollout]`, `[reward]`, `[reference]`: `kind = "local"` (in process); remote pools take
//!   `servers` (required, http(s) URLs), `routing` "least_loaded", `max_in_flight` 4 (8 for
//!   rewards), `timeout_s` 600 (120 for rewards), `revive_after_s` 10, `startup_wait_s` 0;
//!   `[rollout]` and `[reference]` also `engine` "stoke" (or "vllm") and `model` (the first
//!   server's); `[rollout]` also `weights_dir` (`OUT/published-weights`). These keys say where a
//!   module runs, not what it computes: a resume may change them.
//!
//! `--set key=value` edits the parsed table before it is deserialised (stoke_train's
//! `keys::prepare_table`, the layer every command shares: renamed keys moved, then the
//! overrides applied), so an override is checked like a key in the file. Every error names the
//! key it is about (`grpo.group_size: must be at least 1`). [`GrpoConfig::to_toml`] writes the
//! resolved config with every value explicit and absolute paths; loading it gives an equal
//! config (the run saves it as `OUT/config.toml`). [`resume_differences`] lists the keys in
//! which a saved config and the current one differ, ignoring the run's length, evaluation,
//! checkpoint and resource keys, for `--resume` to refuse a changed run.
//!
//! Layout: the file layer's types are in `config/file.rs`, the per-section resolution (defaults,
//! checks, and back to the file layer) in `config/resolve.rs`; this file holds the runtime
//! [`GrpoConfig`], the order of resolution and the resume check.
//!
//! What this is not: nothing is loaded here (no model, tokenizer, task file or sandbox); the CLI
//! turns a `GrpoConfig` into the loaded objects of a run.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::time::Duration;

use stoke_optim::{AdamWConfig, LrSchedule, OptimizerConfig};
use stoke_reward::RewardConfig;
use stoke_reward::exact_match::{ExactMatchConfig, MatchMode};
use stoke_train::config::{ConfigError, OptimizerFile, keys};
use stoke_train::grpo::GrpoLossFile;

use crate::error::PipelineError;
use crate::settings::{
    EvalSettings, GrpoSettings, KlPlacement, Lag, OldLogprobs, PipelineMode, PtxSettings, Services,
    TemperatureSchedule, WeightSync,
};

/// The names of `stoke_eval::Level` (`Level::name`), the arithmetic task's levels. The pipeline
/// does not depend on stoke-eval; the CLI maps these names and its tests check the lists agree.
pub const ARITHMETIC_LEVELS: [&str; 3] = ["single_digit", "one_step", "two_step"];

/// The name of the reward that tasks without a `reward` field use.
pub const DEFAULT_REWARD: &str = "default";

const DEFAULT_STEPS: u64 = 100;
const DEFAULT_PROMPTS_PER_STEP: usize = 8;
const DEFAULT_GROUP_SIZE: usize = 16;
const DEFAULT_MAX_NEW_TOKENS: usize = 256;
const DEFAULT_BUFFER_BYTES: u64 = 16 << 20;
const DEFAULT_MICRO_BATCH_TOKENS: usize = 8192;
const DEFAULT_MAX_BAD_STEPS: u64 = 3;
const DEFAULT_REWARD_TIMEOUT_S: f64 = 30.0;
const DEFAULT_LR: f64 = 1e-6;
const DEFAULT_TASK_PROBLEMS: usize = 1000;
const DEFAULT_EVAL_SAMPLES: usize = 8;
const DEFAULT_EVAL_PROBLEMS: usize = 64;
const DEFAULT_KEEP_CHECKPOINTS: usize = 2;
const DEFAULT_PTX_COEF: f64 = 0.1;
const DEFAULT_PTX_BATCH_SIZE: usize = 4;
const DEFAULT_PTX_SEQ_LEN: usize = 256;

pub mod environment;
mod file;
mod resolve;

pub use file::*;
use resolve::*;

// ---------------------------------------------------------------------------------------------
// Runtime layer
// ---------------------------------------------------------------------------------------------

/// Where a run's prompts come from, resolved.
#[derive(Clone, Debug, PartialEq)]
pub enum TaskSource {
    Jsonl {
        path: PathBuf,
    },
    /// The built-in arithmetic task (`stoke_eval::ArithmeticTask`); `levels` are
    /// [`ARITHMETIC_LEVELS`] names. As `[held_out]`, problems come from the held-out split.
    Arithmetic {
        levels: Vec<String>,
        problems: usize,
        seed: u64,
    },
    /// Arithmetic on `digits`-digit numbers for the calculator environment
    /// (`stoke_env::arithmetic`); as `[held_out]`, drawn with the seed + 1 stream.
    Calculator {
        digits: u32,
        problems: usize,
        seed: u64,
    },
    /// Python repositories with planted bugs for the code-repair environment
    /// (`stoke_env::code_repair`): 1..=`max_bugs` bugs each, drawn from `templates` (empty:
    /// all); as `[held_out]`, drawn with the seed + 1 stream.
    CodeRepair {
        problems: usize,
        seed: u64,
        max_bugs: usize,
        templates: Vec<String>,
    },
}

/// A resolved GRPO run configuration.
#[derive(Clone, Debug, PartialEq)]
pub struct GrpoConfig {
    pub model: PathBuf,
    pub out_dir: PathBuf,
    pub tasks: TaskSource,
    pub held_out: Option<TaskSource>,
    /// Index 0 is the default reward (see the module doc for the order).
    pub rewards: Vec<(String, RewardConfig)>,
    /// `None`: the policy's own starting weights.
    pub reference_model: Option<PathBuf>,
    pub settings: GrpoSettings,
}

impl GrpoConfig {
    /// Reads `path`, applies `--set` overrides and resolves it (relative paths against the
    /// file's folder).
    pub fn load(path: &Path, sets: &[String]) -> Result<GrpoConfig, PipelineError> {
        let text = std::fs::read_to_string(path).map_err(|e| PipelineError::io(path, e))?;
        GrpoConfig::parse(&text, path, sets)
    }

    /// [`GrpoConfig::load`] on text already read; `origin` is the file it came from (its folder
    /// resolves relative paths, its stem names the default output folder).
    pub fn parse(text: &str, origin: &Path, sets: &[String]) -> Result<GrpoConfig, PipelineError> {
        let name = origin.display().to_string();
        // The layer every command shares (stoke_train's `keys`), its errors in GRPO's words.
        let table = keys::parse_table(text, origin)
            .and_then(|table| keys::prepare_table(table, &name, sets, RENAMED))
            .map_err(|e| match e {
                ConfigError::Syntax { message, .. } => PipelineError::config(name.clone(), message),
                ConfigError::Key { key, message, .. } => PipelineError::config(key, message),
                ConfigError::Override { arg, message } => {
                    PipelineError::config(format!("--set {arg}"), message)
                }
                other => PipelineError::config(name.clone(), other.to_string()),
            })?;
        let file = GrpoConfigFile::from_table(table, &name)?;
        let base = keys::base_dir(origin);
        let stem = origin
            .file_stem()
            .map(|s| s.to_string_lossy().into_owned())
            .unwrap_or_else(|| "grpo".into());
        GrpoConfig::from_file(file, base, &stem)
    }

    /// Resolves a parsed file: defaults filled in, paths made absolute against `base`,
    /// everything validated. `stem` names the default output folder `base/runs/<stem>`.
    pub fn from_file(
        file: GrpoConfigFile,
        base: &Path,
        stem: &str,
    ) -> Result<GrpoConfig, PipelineError> {
        let base = std::path::absolute(base).map_err(|e| PipelineError::io(base, e))?;
        let at = |p: &Path| base.join(p);
        let g = &file.grpo;
        let t = &file.training;
        let seed = t.seed.unwrap_or(0);
        let steps = t.steps.unwrap_or(DEFAULT_STEPS);

        let eval = EvalSettings {
            every: file.eval.every.unwrap_or(0),
            samples: file.eval.samples.unwrap_or(DEFAULT_EVAL_SAMPLES),
            problems: file.eval.problems.unwrap_or(DEFAULT_EVAL_PROBLEMS),
        };
        at_least_one("eval.samples", eval.samples)?;
        at_least_one("eval.problems", eval.problems)?;

        let tasks = match &file.tasks {
            Some(source) => resolve_tasks("tasks", source, &at, DEFAULT_TASK_PROBLEMS, seed)?,
            None => TaskSource::Arithmetic {
                levels: vec![ARITHMETIC_LEVELS[0].to_string()],
                problems: DEFAULT_TASK_PROBLEMS,
                seed,
            },
        };
        let held_out = match (&file.held_out, &tasks) {
            (Some(source), _) => Some(resolve_tasks("held_out", source, &at, eval.problems, seed)?),
            (None, TaskSource::Arithmetic { levels, seed, .. }) => Some(TaskSource::Arithmetic {
                levels: levels.clone(),
                problems: eval.problems,
                seed: *seed,
            }),
            (None, TaskSource::Calculator { digits, seed, .. }) => Some(TaskSource::Calculator {
                digits: *digits,
                problems: eval.problems,
                seed: seed.wrapping_add(1),
            }),
            (
                None,
                TaskSource::CodeRepair {
                    seed,
                    max_bugs,
                    templates,
                    ..
                },
            ) => Some(TaskSource::CodeRepair {
                problems: eval.problems,
                seed: seed.wrapping_add(1),
                max_bugs: *max_bugs,
                templates: templates.clone(),
            }),
            (None, TaskSource::Jsonl { .. }) => None,
        };

        let rewards = resolve_rewards(&file.rewards, &base)?;

        let mode = match g.mode.unwrap_or(ModeFile::Async) {
            ModeFile::Sync => PipelineMode::Sync,
            ModeFile::Async => PipelineMode::Async,
        };
        let temperature = g.temperature.unwrap_or(1.0) as f32;
        let prompts_per_step = g.prompts_per_step.unwrap_or(DEFAULT_PROMPTS_PER_STEP);
        let clip_grad_norm = match keys::clip_grad_norm(file.optimizer.clip_grad_norm) {
            Some(c) if !(c.is_finite() && c > 0.0) => {
                return Err(PipelineError::config(
                    keys::CLIP_GRAD_NORM,
                    format!("must be > 0 (0 turns clipping off), got {c}"),
                ));
            }
            clip => clip,
        };
        let reward_timeout_s = g.reward_timeout_s.unwrap_or(DEFAULT_REWARD_TIMEOUT_S);
        let reward_timeout = Duration::try_from_secs_f64(reward_timeout_s).map_err(|_| {
            PipelineError::config(
                "grpo.reward_timeout_s",
                format!("must be a positive number of seconds, got {reward_timeout_s}"),
            )
        })?;
        let loss = g.loss.clone().into_config().map_err(|e| match e {
            stoke_train::grpo::GrpoError::Config { field, reason } => {
                PipelineError::config(format!("grpo.loss.{field}"), reason)
            }
            other => PipelineError::config("grpo.loss", other.to_string()),
        })?;
        if loss.distill.is_some() {
            if g.reference_reset_every.is_some() {
                return Err(PipelineError::config(
                    "grpo.reference_reset_every",
                    "would replace the teacher of [grpo.loss.distill] with the policy",
                ));
            }
            let remote_teacher = file
                .reference
                .as_ref()
                .is_some_and(|r| r.kind == Some(ServiceKindFile::Remote));
            if file.model.reference.is_none() && !remote_teacher {
                return Err(PipelineError::config(
                    "model.reference",
                    "[grpo.loss.distill] needs the teacher: the model folder to distill from \
                     (or [reference] kind = \"remote\" on servers of it)",
                ));
            }
        }
        let optimizer = resolve_optimizer(&file.optimizer)?;
        let schedule = resolve_schedule(&file.schedule, steps)?;
        let ptx = match &file.ptx {
            None => None,
            Some(p) => {
                let ptx = PtxSettings {
                    shards: at(&p.shards),
                    coef: p.coef.unwrap_or(DEFAULT_PTX_COEF),
                    batch_size: p.batch_size.unwrap_or(DEFAULT_PTX_BATCH_SIZE),
                    seq_len: p.seq_len.unwrap_or(DEFAULT_PTX_SEQ_LEN),
                };
                at_least_one("ptx.batch_size", ptx.batch_size)?;
                at_least_one("ptx.seq_len", ptx.seq_len)?;
                Some(ptx)
            }
        };
        let cores = std::thread::available_parallelism().map_or(1, |n| n.get());

        let settings = GrpoSettings {
            steps,
            prompts_per_step,
            group_size: g.group_size.unwrap_or(DEFAULT_GROUP_SIZE),
            max_new_tokens: g.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS),
            temperature: TemperatureSchedule {
                start: temperature,
                end: g.temperature_end.map_or(temperature, |t| t as f32),
                decay_steps: g.temperature_decay_steps.unwrap_or(0),
            },
            top_p: g.top_p.unwrap_or(1.0) as f32,
            top_k: g.top_k.filter(|&k| k > 0),
            seed,
            mode,
            max_off_policy_steps: g.max_off_policy_steps.unwrap_or(match mode {
                PipelineMode::Sync => 0,
                PipelineMode::Async => 1,
            }),
            lag: match g.lag.unwrap_or(LagFile::Bounded) {
                LagFile::Bounded => Lag::Bounded,
                LagFile::Fixed => Lag::Fixed,
            },
            weight_sync: match g.weight_sync.unwrap_or(WeightSyncFile::BetweenBatches) {
                WeightSyncFile::BetweenBatches => WeightSync::BetweenBatches,
                WeightSyncFile::InFlight => WeightSync::InFlight,
            },
            rollout_batch_groups: g.rollout_batch_groups.unwrap_or(prompts_per_step),
            buffer_bytes: g.buffer_bytes.unwrap_or(DEFAULT_BUFFER_BYTES),
            loss,
            kl_placement: match g.kl_placement.unwrap_or(KlPlacementFile::Loss) {
                KlPlacementFile::Loss => KlPlacement::Loss,
                KlPlacementFile::Reward => KlPlacement::Reward,
            },
            reference_reset_every: g.reference_reset_every,
            old_logprobs: match g.old_logprobs.unwrap_or(OldLogprobsFile::Rollout) {
                OldLogprobsFile::Rollout => OldLogprobs::Rollout,
                OldLogprobsFile::Recompute => OldLogprobs::Recompute,
            },
            drop_equal_reward_groups: g.drop_equal_reward_groups.unwrap_or(false),
            optimizer,
            schedule,
            clip_grad_norm,
            micro_batch_tokens: g.micro_batch_tokens.unwrap_or(DEFAULT_MICRO_BATCH_TOKENS),
            max_bad_steps: t.max_bad_steps.unwrap_or(DEFAULT_MAX_BAD_STEPS),
            ptx,
            reward_workers: g.reward_workers.unwrap_or(cores),
            reward_timeout,
            eval,
            checkpoint_every: file.checkpoint.every.unwrap_or(0),
            keep_checkpoints: file.checkpoint.keep.unwrap_or(DEFAULT_KEEP_CHECKPOINTS),
            keep_steps: file.checkpoint.keep_steps.clone(),
            threads: g.threads.unwrap_or(cores),
            precision: t.precision.unwrap_or_default(),
            activation_checkpointing: t.activation_checkpointing.unwrap_or(false),
            lora: file.lora.clone(),
            services: Services {
                rollout: resolve_rollout_service(
                    file.rollout.as_ref(),
                    &at,
                    &out_dir_of(&file, &base, stem),
                )?,
                reward: resolve_reward_service(file.reward.as_ref())?,
                reference: resolve_reference_service(file.reference.as_ref())?,
            },
            environment: file
                .environment
                .as_ref()
                .map(|section| section.resolve(g.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS)))
                .transpose()?,
        };
        check_code_repair(&tasks, held_out.as_ref(), settings.environment.as_ref())?;
        if let Some((name, _)) = rewards.iter().find(|(_, r)| r.is_dense_process()) {
            // Step bytes index the completion text, which for an episode is its last turn only.
            if settings.environment.is_some() {
                return Err(PipelineError::config(
                    format!("rewards.{name}.dense"),
                    "dense process advantages are for single-turn samples; an [environment] \
                     run's completion holds the environment's tokens too",
                ));
            }
            if settings.loss.distill.is_some() {
                return Err(PipelineError::config(
                    format!("rewards.{name}.dense"),
                    "dense process advantages and on-policy distillation both set per-token \
                     advantages; use one",
                ));
            }
        }
        if let Some(lora) = &settings.lora {
            lora.validate().map_err(|e| match e {
                stoke_model::ModelError::InvalidArgument(m) => match m.split_once(": ") {
                    Some((key, reason)) => PipelineError::config(key, reason),
                    None => PipelineError::config("lora", m),
                },
                other => PipelineError::config("lora", other.to_string()),
            })?;
        }
        settings
            .validate()
            .map_err(|(field, reason)| PipelineError::config(settings_key(field), reason))?;
        if settings.services.reference.is_some() && settings.reference_reset_every.is_some() {
            return Err(PipelineError::config(
                "grpo.reference_reset_every",
                "a remote reference ([reference] kind = \"remote\") is frozen on its servers",
            ));
        }
        if settings.max_bad_steps == 0 {
            return Err(PipelineError::config(
                "training.max_bad_steps",
                "must be at least 1",
            ));
        }
        let out_dir = out_dir_of(&file, &base, stem);
        Ok(GrpoConfig {
            model: at(&file.model.path),
            out_dir,
            tasks,
            held_out,
            rewards,
            reference_model: file.model.reference.as_deref().map(at),
            settings,
        })
    }

    /// The file form with every value explicit (what `OUT/config.toml` holds).
    pub fn to_file(&self) -> GrpoConfigFile {
        let s = &self.settings;
        let kl = s.loss.kl;
        let loss = GrpoLossFile {
            advantage: s.loss.advantage,
            policy: s.loss.policy,
            aggregation: s.loss.aggregation,
            kl_estimator: kl.map(|k| k.estimator).unwrap_or_default(),
            beta: kl.map_or(0.0, |k| k.beta),
            correction: s.loss.correction,
            distill: s.loss.distill,
        };
        let grpo = GrpoSection {
            prompts_per_step: Some(s.prompts_per_step),
            group_size: Some(s.group_size),
            max_new_tokens: Some(s.max_new_tokens),
            temperature: Some(shortest_f64(s.temperature.start)),
            temperature_end: Some(shortest_f64(s.temperature.end)),
            temperature_decay_steps: Some(s.temperature.decay_steps),
            top_p: Some(shortest_f64(s.top_p)),
            top_k: Some(s.top_k.unwrap_or(0)),
            mode: Some(match s.mode {
                PipelineMode::Sync => ModeFile::Sync,
                PipelineMode::Async => ModeFile::Async,
            }),
            max_off_policy_steps: Some(s.max_off_policy_steps),
            lag: Some(match s.lag {
                Lag::Bounded => LagFile::Bounded,
                Lag::Fixed => LagFile::Fixed,
            }),
            weight_sync: Some(match s.weight_sync {
                WeightSync::BetweenBatches => WeightSyncFile::BetweenBatches,
                WeightSync::InFlight => WeightSyncFile::InFlight,
            }),
            rollout_batch_groups: Some(s.rollout_batch_groups),
            buffer_bytes: Some(s.buffer_bytes),
            kl_placement: Some(match s.kl_placement {
                KlPlacement::Loss => KlPlacementFile::Loss,
                KlPlacement::Reward => KlPlacementFile::Reward,
            }),
            reference_reset_every: s.reference_reset_every,
            old_logprobs: Some(match s.old_logprobs {
                OldLogprobs::Rollout => OldLogprobsFile::Rollout,
                OldLogprobs::Recompute => OldLogprobsFile::Recompute,
            }),
            drop_equal_reward_groups: Some(s.drop_equal_reward_groups),
            micro_batch_tokens: Some(s.micro_batch_tokens),
            reward_workers: Some(s.reward_workers),
            reward_timeout_s: Some(s.reward_timeout.as_secs_f64()),
            threads: Some(s.threads),
            loss,
        };
        let training = TrainingSection {
            steps: Some(s.steps),
            seed: Some(s.seed),
            precision: (s.precision != stoke_types::Precision::F32).then_some(s.precision),
            activation_checkpointing: s.activation_checkpointing.then_some(true),
            max_bad_steps: Some(s.max_bad_steps),
        };
        GrpoConfigFile {
            output_dir: Some(self.out_dir.clone()),
            model: ModelSection {
                path: self.model.clone(),
                reference: self.reference_model.clone(),
            },
            tasks: Some(task_file(&self.tasks)),
            held_out: self.held_out.as_ref().map(task_file),
            rewards: self.rewards.iter().cloned().collect(),
            grpo,
            training,
            optimizer: OptimizerFile {
                clip_grad_norm: Some(s.clip_grad_norm.unwrap_or(0.0)),
                ..OptimizerFile::explicit(&s.optimizer)
            },
            schedule: schedule_file(&s.schedule),
            eval: EvalSection {
                every: Some(s.eval.every),
                samples: Some(s.eval.samples),
                problems: Some(s.eval.problems),
            },
            checkpoint: CheckpointSection {
                every: Some(s.checkpoint_every),
                keep: Some(s.keep_checkpoints),
                keep_steps: s.keep_steps.clone(),
            },
            ptx: s.ptx.as_ref().map(|p| PtxSection {
                shards: p.shards.clone(),
                coef: Some(p.coef),
                batch_size: Some(p.batch_size),
                seq_len: Some(p.seq_len),
            }),
            lora: s.lora.clone(),
            rollout: s.services.rollout.as_ref().map(rollout_service_file),
            reward: s.services.reward.as_ref().map(pool_file),
            reference: s.services.reference.as_ref().map(reference_service_file),
            environment: s.environment.as_ref().map(|e| e.to_file()),
        }
    }

    /// The resolved config as TOML text (loads back to an equal `GrpoConfig`).
    pub fn to_toml(&self) -> Result<String, PipelineError> {
        toml::to_string(&self.to_file())
            .map_err(|e| PipelineError::config("<config>", e.to_string()))
    }

    /// The names of the rewards in index order (what `task::load_tasks` resolves names against).
    pub fn reward_names(&self) -> Vec<String> {
        self.rewards.iter().map(|(name, _)| name.clone()).collect()
    }
}

/// Keys of `stoke grpo` renamed to the vocabulary every command shares (see
/// `stoke_train::config::keys`).
pub const RENAMED: &[keys::Renamed] = &[
    keys::Renamed {
        old: "grpo.clip_grad_norm",
        new: keys::CLIP_GRAD_NORM,
    },
    keys::Renamed {
        old: "out.dir",
        new: "output_dir",
    },
    keys::Renamed {
        old: "grpo.steps",
        new: "training.steps",
    },
    keys::Renamed {
        old: "grpo.seed",
        new: "training.seed",
    },
    keys::Renamed {
        old: "grpo.precision",
        new: "training.precision",
    },
    keys::Renamed {
        old: "grpo.activation_checkpointing",
        new: "training.activation_checkpointing",
    },
    keys::Renamed {
        old: "grpo.max_bad_steps",
        new: "training.max_bad_steps",
    },
];

/// Keys (or key prefixes ending in `.`) that may change when a run is resumed: they set how long
/// it runs, how it is evaluated, checkpointed and resourced, not what an update computes.
const RESUME_FREE_KEYS: &[&str] = &[
    "training.steps",
    "training.max_bad_steps",
    "grpo.reward_workers",
    "grpo.reward_timeout_s",
    "grpo.threads",
    "grpo.buffer_bytes",
    // Exact (bit-identical gradients).
    "training.activation_checkpointing",
    "held_out.",
    "eval.",
    // Where a module runs, not what it computes.
    "rollout.",
    "reward.",
    "reference.",
    "checkpoint.",
    "output_dir",
    // Timeouts bound waiting, not what an episode computes when it finishes in time.
    "environment.env_timeout_s",
    "environment.tool_timeout_s",
];

/// `(key, saved value, current value)` for every key of the resolved configs that differs,
/// except the [`RESUME_FREE_KEYS`]; a resumed run refuses to continue when this is not empty
/// (the training so far would not be the training the current config describes).
pub fn resume_differences(
    saved: &GrpoConfig,
    current: &GrpoConfig,
) -> Vec<(String, String, String)> {
    keys::differences(&saved.to_file(), &current.to_file(), RESUME_FREE_KEYS)
}

/// The file key of a field `GrpoSettings::validate` names.
fn settings_key(field: &str) -> String {
    match field {
        "keep_checkpoints" => "checkpoint.keep".into(),
        "reward_timeout" => "grpo.reward_timeout_s".into(),
        "steps" | "seed" | "precision" | "activation_checkpointing" | "max_bad_steps" => {
            format!("training.{field}")
        }
        f if f.starts_with("ptx.") => f.into(),
        other => format!("grpo.{other}"),
    }
}

fn at_least_one(key: &str, value: usize) -> Result<(), PipelineError> {
    if value == 0 {
        Err(PipelineError::config(key, "must be at least 1"))
    } else {
        Ok(())
    }
}

/// An f32 as the f64 with the same shortest decimal form (0.7f32 -> 0.7, not 0.699999988).
pub fn shortest_f64(value: f32) -> f64 {
    value.to_string().parse().unwrap_or(value as f64)
}
