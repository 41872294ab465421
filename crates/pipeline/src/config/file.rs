//! The TOML file layer of the GRPO config: what a person writes (optional dials) or what
//! [`super::GrpoConfig::to_toml`] writes (every value set). Every table rejects unknown keys.
//! The sections every command shares (`[optimizer]`, `[schedule]`, `[checkpoint]`) are stoke
//! train's types, and deserialising goes through stoke train's `keys` layer, so key errors are
//! found the same way (GRPO words them: the key path, then the message and the file).
//! What it is not: defaults or validation (`resolve` and [`super::GrpoConfig`] do those).

use std::collections::BTreeMap;
use std::path::PathBuf;

use serde::{Deserialize, Serialize};
use stoke_reward::RewardConfig;
use stoke_train::config::{ConfigError, OptimizerFile, keys};
use stoke_train::grpo::GrpoLossFile;
use stoke_types::Precision;

use crate::error::PipelineError;

/// The TOML file as written by a person (optional dials) or by [`GrpoConfig::to_toml`] (all set).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoConfigFile {
    /// The run folder (default `runs/<config file stem>` next to the config file): the key every
    /// command shares (`[out] dir` before; migrated with a warning).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub output_dir: Option<PathBuf>,
    pub model: ModelSection,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub tasks: Option<TaskSourceFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub held_out: Option<TaskSourceFile>,
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub rewards: BTreeMap<String, RewardConfig>,
    #[serde(default)]
    pub grpo: GrpoSection,
    /// `[training]`: the keys every training command shares (steps, seed, precision,
    /// activation_checkpointing, max_bad_steps).
    #[serde(default)]
    pub training: TrainingSection,
    #[serde(default)]
    pub optimizer: OptimizerFile,
    #[serde(default)]
    pub schedule: ScheduleSection,
    #[serde(default)]
    pub eval: EvalSection,
    #[serde(default)]
    pub checkpoint: CheckpointSection,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ptx: Option<PtxSection>,
    /// LoRA adapters on the frozen policy (the keys of `stoke train`'s `[lora]`); the reference
    /// is then the base without adapters, at no copy.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lora: Option<stoke_model::lora::LoraConfig>,
    /// Where rollout runs: in process (default) or on remote inference servers.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout: Option<ServiceSection>,
    /// Where rewards are computed: in process (default) or on `stoke reward-server`s.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward: Option<ServiceSection>,
    /// Where reference / teacher log-probs are computed: in process (default) or on inference
    /// servers of that model.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<ServiceSection>,
    /// Multi-turn episodes in an environment with tools (agentic RL); absent: single-turn.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub environment: Option<super::environment::EnvironmentSection>,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ServiceKindFile {
    Local,
    Remote,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum RoutingFile {
    RoundRobin,
    LeastLoaded,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum EngineFile {
    Stoke,
    Vllm,
}

/// `[rollout]` / `[reward]`: a module in process or on a pool of servers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ServiceSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kind: Option<ServiceKindFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub servers: Option<Vec<String>>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub routing: Option<RoutingFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_in_flight: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub revive_after_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub startup_wait_s: Option<f64>,
    /// `[rollout]` only: the server software.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub engine: Option<EngineFile>,
    /// `[rollout]` only: the served model name to expect.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub model: Option<String>,
    /// `[rollout]` only: the shared folder new weights are published to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weights_dir: Option<PathBuf>,
}

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ModelSection {
    /// Hugging Face model folder (config.json, safetensors, tokenizer files).
    pub path: PathBuf,
    /// Reference policy folder for the KL term; default: the policy's starting weights.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference: Option<PathBuf>,
}

/// `[tasks]` / `[held_out]`: where prompts come from.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case", deny_unknown_fields)]
pub enum TaskSourceFile {
    Jsonl {
        path: PathBuf,
    },
    Arithmetic {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        levels: Option<Vec<String>>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        problems: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seed: Option<u64>,
    },
    /// Arithmetic on large numbers for the calculator environment (`stoke_env::arithmetic`).
    Calculator {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        digits: Option<u32>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        problems: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seed: Option<u64>,
    },
    /// Python repositories with planted bugs for the code-repair environment
    /// (`stoke_env::code_repair`).
    CodeRepair {
        #[serde(default, skip_serializing_if = "Option::is_none")]
        problems: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        seed: Option<u64>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        max_bugs: Option<usize>,
        #[serde(default, skip_serializing_if = "Option::is_none")]
        templates: Option<Vec<String>>,
    },
}

/// `PipelineMode` as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum ModeFile {
    Sync,
    Async,
}

/// `WeightSync` as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum WeightSyncFile {
    BetweenBatches,
    InFlight,
}

/// `Lag` as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum LagFile {
    Bounded,
    Fixed,
}

/// `KlPlacement` as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KlPlacementFile {
    Loss,
    Reward,
}

/// `OldLogprobs` as written in the file.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum OldLogprobsFile {
    Rollout,
    Recompute,
}

/// `[grpo]`: the scalar settings of [`GrpoSettings`] (see the module doc for defaults).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct GrpoSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prompts_per_step: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub group_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_new_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_end: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub temperature_decay_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_p: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub top_k: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mode: Option<ModeFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_off_policy_steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub lag: Option<LagFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub weight_sync: Option<WeightSyncFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub rollout_batch_groups: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub buffer_bytes: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub kl_placement: Option<KlPlacementFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reference_reset_every: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub old_logprobs: Option<OldLogprobsFile>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub drop_equal_reward_groups: Option<bool>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub micro_batch_tokens: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_workers: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reward_timeout_s: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub threads: Option<usize>,
    #[serde(default)]
    pub loss: GrpoLossFile,
}

/// `[training]`: the keys `stoke train`, `stoke dpo` and `stoke grpo` share, with one meaning.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct TrainingSection {
    /// Trainer updates (optimizer steps).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub steps: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<u64>,
    /// Matmul precision of the policy, its rollout copies and the reference: "f32" or "bf16".
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub precision: Option<Precision>,
    /// Recompute each block's activations in the trainer's backward pass (exact).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub activation_checkpointing: Option<bool>,
    /// Non-finite updates in a row that stop the run.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub max_bad_steps: Option<u64>,
}

/// `[schedule]`: the learning-rate schedule, stoke train's section (the same keys and defaults;
/// GRPO refuses `batch_warmup`, it has no token budget per step to ramp).
pub type ScheduleSection = stoke_train::config::ScheduleFile;

#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct EvalSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub every: Option<u64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub samples: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub problems: Option<usize>,
}

/// `[checkpoint]`: stoke train's section (`every`, `keep`, `keep_steps`).
pub type CheckpointSection = stoke_train::config::CheckpointFile;

#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct PtxSection {
    /// Token shards (a file or a folder of shards) for the pretraining loss.
    pub shards: PathBuf,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub coef: Option<f64>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub batch_size: Option<usize>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seq_len: Option<usize>,
}

/// `[out] dir`: the output folder of `stoke distill generate` (GRPO's is the shared
/// `output_dir`).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct OutSection {
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub dir: Option<PathBuf>,
}

impl GrpoConfigFile {
    /// Deserialises a parsed table; an unknown, missing or mistyped key is named by its dotted
    /// path (`origin` names the file in the message).
    pub fn from_table(table: toml::Table, origin: &str) -> Result<GrpoConfigFile, PipelineError> {
        keys::from_table(table, origin).map_err(|e| match e {
            ConfigError::Key { key, message, .. } => {
                let key = if key == "." {
                    "<top level>".into()
                } else {
                    key
                };
                let message = keys::without_context_lines(&message);
                PipelineError::config(key, format!("{message} (in {origin})"))
            }
            other => PipelineError::config(origin, other.to_string()),
        })
    }
}
