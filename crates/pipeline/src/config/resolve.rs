//! Resolution helpers of the GRPO config: each file-layer section into its validated runtime
//! value (with the documented defaults) and back (for `to_toml`). What it is not: the order of
//! resolution or the whole-config checks ([`super::GrpoConfig::from_file`] does those).

use super::*;
use crate::env_settings::{EnvironmentKind, EnvironmentSettings};
use stoke_train::config::{
    ConfigError, ScheduleDefaults, ScheduleFile, resolve_lr_schedule, resolve_optimizer_with,
};

pub(super) fn resolve_tasks(
    section: &str,
    source: &TaskSourceFile,
    at: &dyn Fn(&Path) -> PathBuf,
    default_problems: usize,
    default_seed: u64,
) -> Result<TaskSource, PipelineError> {
    Ok(match source {
        TaskSourceFile::Jsonl { path } => TaskSource::Jsonl { path: at(path) },
        TaskSourceFile::Arithmetic {
            levels,
            problems,
            seed,
        } => {
            let levels = levels
                .clone()
                .unwrap_or_else(|| vec![ARITHMETIC_LEVELS[0].to_string()]);
            if levels.is_empty() {
                return Err(PipelineError::config(
                    format!("{section}.levels"),
                    format!("name at least one of {}", ARITHMETIC_LEVELS.join(", ")),
                ));
            }
            if let Some(unknown) = levels
                .iter()
                .find(|l| !ARITHMETIC_LEVELS.contains(&l.as_str()))
            {
                return Err(PipelineError::config(
                    format!("{section}.levels"),
                    format!(
                        "unknown level `{unknown}` (known: {})",
                        ARITHMETIC_LEVELS.join(", ")
                    ),
                ));
            }
            let problems = problems.unwrap_or(default_problems);
            at_least_one(&format!("{section}.problems"), problems)?;
            TaskSource::Arithmetic {
                levels,
                problems,
                seed: seed.unwrap_or(default_seed),
            }
        }
        TaskSourceFile::Calculator {
            digits,
            problems,
            seed,
        } => {
            let digits = digits.unwrap_or(stoke_env::arithmetic::ArithmeticSpec::default().digits);
            if !(1..=18).contains(&digits) {
                return Err(PipelineError::config(
                    format!("{section}.digits"),
                    format!("must be in 1..=18, got {digits}"),
                ));
            }
            let problems = problems.unwrap_or(default_problems);
            at_least_one(&format!("{section}.problems"), problems)?;
            TaskSource::Calculator {
                digits,
                problems,
                seed: seed.unwrap_or(default_seed),
            }
        }
        TaskSourceFile::CodeRepair {
            problems,
            seed,
            max_bugs,
            templates,
        } => {
            let spec = stoke_env::CodeRepairSpec {
                seed: seed.unwrap_or(default_seed),
                max_bugs: max_bugs.unwrap_or(stoke_env::CodeRepairSpec::default().max_bugs),
                templates: templates.clone().unwrap_or_default(),
            };
            spec.check().map_err(|e| match e {
                stoke_env::EnvError::Config { key, message } => {
                    PipelineError::config(format!("{section}.{key}"), message)
                }
                other => PipelineError::config(section, other.to_string()),
            })?;
            if templates.as_ref().is_some_and(Vec::is_empty) {
                return Err(PipelineError::config(
                    format!("{section}.templates"),
                    "name at least one template, or leave the key out for all of them",
                ));
            }
            let problems = problems.unwrap_or(default_problems);
            at_least_one(&format!("{section}.problems"), problems)?;
            TaskSource::CodeRepair {
                problems,
                seed: spec.seed,
                max_bugs: spec.max_bugs,
                templates: spec.templates,
            }
        }
    })
}

/// `[tasks]` / `[held_out]` of kind `code_repair` and `[environment] kind = "code_repair"` go
/// together: the environment reads each task's repository, which only those tasks carry, and
/// the tasks have no answer any reward could check without the environment's hidden tests.
pub(super) fn check_code_repair(
    tasks: &TaskSource,
    held_out: Option<&TaskSource>,
    environment: Option<&EnvironmentSettings>,
) -> Result<(), PipelineError> {
    let environment_kind = environment.map(|e| e.kind);
    let code_repair_env = environment_kind == Some(EnvironmentKind::CodeRepair);
    for (section, source) in [("tasks", Some(tasks)), ("held_out", held_out)] {
        let Some(source) = source else { continue };
        let code_repair_tasks = matches!(source, TaskSource::CodeRepair { .. });
        if code_repair_env && !code_repair_tasks {
            return Err(PipelineError::config(
                format!("{section}.kind"),
                "[environment] kind = \"code_repair\" plays tasks of kind = \"code_repair\" \
                 (they carry the repositories)",
            ));
        }
        if code_repair_tasks && !code_repair_env {
            return Err(PipelineError::config(
                format!("{section}.kind"),
                format!(
                    "code_repair tasks are played in [environment] kind = \"code_repair\" \
                     (the environment is {})",
                    environment_kind.map_or("missing".to_string(), |k| format!("{:?}", k.name()))
                ),
            ));
        }
    }
    Ok(())
}

pub(super) fn task_file(source: &TaskSource) -> TaskSourceFile {
    match source {
        TaskSource::Jsonl { path } => TaskSourceFile::Jsonl { path: path.clone() },
        TaskSource::Arithmetic {
            levels,
            problems,
            seed,
        } => TaskSourceFile::Arithmetic {
            levels: Some(levels.clone()),
            problems: Some(*problems),
            seed: Some(*seed),
        },
        TaskSource::Calculator {
            digits,
            problems,
            seed,
        } => TaskSourceFile::Calculator {
            digits: Some(*digits),
            problems: Some(*problems),
            seed: Some(*seed),
        },
        TaskSource::CodeRepair {
            problems,
            seed,
            max_bugs,
            templates,
        } => TaskSourceFile::CodeRepair {
            problems: Some(*problems),
            seed: Some(*seed),
            max_bugs: Some(*max_bugs),
            templates: (!templates.is_empty()).then(|| templates.clone()),
        },
    }
}

/// The reward list in index order; each reward that needs no sandbox is built once to check it.
pub(super) fn resolve_rewards(
    rewards: &BTreeMap<String, RewardConfig>,
    base: &Path,
) -> Result<Vec<(String, RewardConfig)>, PipelineError> {
    if rewards.is_empty() {
        let exact_gsm8k = RewardConfig::ExactMatch(ExactMatchConfig {
            mode: MatchMode::Gsm8k,
            extract_answer: true,
        });
        return Ok(vec![(DEFAULT_REWARD.to_string(), exact_gsm8k)]);
    }
    let mut ordered: Vec<(String, RewardConfig)> = Vec::with_capacity(rewards.len());
    if let Some(default) = rewards.get(DEFAULT_REWARD) {
        ordered.push((DEFAULT_REWARD.to_string(), default.clone()));
    }
    // BTreeMap iterates in name order.
    for (name, reward) in rewards {
        if name != DEFAULT_REWARD {
            ordered.push((name.clone(), reward.clone()));
        }
    }
    for (name, reward) in &mut ordered {
        if name.trim().is_empty() {
            return Err(PipelineError::config("rewards", "a reward name is empty"));
        }
        absolute_model_paths(reward, base);
        // Code rewards get their sandbox and reward models their weights when the run builds
        // them; every other option is checked here.
        match reward.build(None) {
            Ok(_)
            | Err(stoke_reward::ConfigError::NeedsSandbox(_))
            | Err(stoke_reward::ConfigError::NeedsScorer(_)) => {}
            Err(e) => {
                return Err(PipelineError::config(
                    format!("rewards.{name}"),
                    e.to_string(),
                ));
            }
        }
    }
    // Dense process advantages come from one reward's step scores: with a second reward, tasks
    // scored by the other would have none, and the group normalization of step rewards would
    // mix models.
    if let Some((name, _)) = ordered.iter().find(|(_, r)| r.is_dense_process())
        && ordered.len() > 1
    {
        return Err(PipelineError::config(
            format!("rewards.{name}.dense"),
            format!(
                "dense process advantages need the process_reward to be the run's only reward; \
                 this run configures {} (set dense = false to use it as an outcome reward)",
                ordered.len()
            ),
        ));
    }
    Ok(ordered)
}

/// A `reward_model` reward's `model` folder and a `judge` reward's `rubric_file` (in a
/// composite too) made absolute against the config's folder, as every other path of the file.
fn absolute_model_paths(reward: &mut RewardConfig, base: &Path) {
    match reward {
        RewardConfig::RewardModel(c) if c.model.is_relative() => c.model = base.join(&c.model),
        RewardConfig::ProcessReward(c) if c.model.is_relative() => c.model = base.join(&c.model),
        RewardConfig::Judge(c) => {
            if let Some(rubric) = c.rubric_file.as_mut().filter(|path| path.is_relative()) {
                *rubric = base.join(&*rubric);
            }
        }
        RewardConfig::Composite(c) => {
            for component in &mut c.components {
                absolute_model_paths(&mut component.reward, base);
            }
        }
        _ => {}
    }
}

pub(super) fn resolve_optimizer(o: &OptimizerFile) -> Result<OptimizerConfig, PipelineError> {
    // stoke train's resolver with the optimizer defaults every command shares, but for the two
    // that depend on the objective: lr DEFAULT_LR (TRL's) and no weight decay.
    let defaults = AdamWConfig {
        lr: DEFAULT_LR,
        weight_decay: 0.0,
        ..AdamWConfig::default()
    };
    let config = resolve_optimizer_with(o, &defaults).map_err(|e| match e {
        ConfigError::Invalid { key, message } => PipelineError::config(key, message),
        other => PipelineError::config("optimizer", other.to_string()),
    })?;
    config.validate().map_err(|e| match e {
        stoke_optim::OptimError::InvalidConfig { field, reason } => {
            // The optimizer names its fields `adamw.lr`, `muon.adamw.eps`, ...; the file has
            // one flat table.
            let key = field.rsplit('.').next().unwrap_or(&field).to_string();
            PipelineError::config(format!("optimizer.{key}"), reason)
        }
        other => PipelineError::config("optimizer", other.to_string()),
    })?;
    Ok(config)
}

/// `[schedule]` through stoke train's resolver with the same keys, checks and defaults as every
/// training command (WSD, `ScheduleDefaults::shared`).
pub(super) fn resolve_schedule(
    s: &ScheduleSection,
    steps: u64,
) -> Result<LrSchedule, PipelineError> {
    if s.batch_warmup.is_some() {
        return Err(PipelineError::config(
            "schedule.batch_warmup",
            "stoke grpo has no batch-size warmup (its batch is prompts_per_step x group_size)",
        ));
    }
    let defaults = ScheduleDefaults::shared(steps);
    let schedule = resolve_lr_schedule(s, steps, defaults).map_err(|e| match e {
        ConfigError::Invalid { key, message } => PipelineError::config(key, message),
        other => PipelineError::config("schedule", other.to_string()),
    })?;
    schedule.validate().map_err(|e| match e {
        stoke_optim::OptimError::InvalidConfig { field, reason } => {
            PipelineError::config(field, reason)
        }
        other => PipelineError::config("schedule", other.to_string()),
    })?;
    Ok(schedule)
}

/// `[schedule]` with every value explicit: stoke train's file form (it sets neither
/// `batch_warmup` nor `decay_fraction`, which it resolves into `decay_start` / `decay_steps`).
pub(super) fn schedule_file(schedule: &LrSchedule) -> ScheduleSection {
    ScheduleFile::explicit(schedule)
}

const DEFAULT_ROLLOUT_IN_FLIGHT: usize = 4;
const DEFAULT_REWARD_IN_FLIGHT: usize = 8;
const DEFAULT_ROLLOUT_TIMEOUT_S: f64 = 600.0;
const DEFAULT_REWARD_TIMEOUT_S_REMOTE: f64 = 120.0;
const DEFAULT_REVIVE_AFTER_S: f64 = 10.0;

/// The run's output folder (`output_dir`, else `base/runs/<stem>`).
pub(super) fn out_dir_of(file: &GrpoConfigFile, base: &Path, stem: &str) -> PathBuf {
    match &file.output_dir {
        Some(dir) => base.join(dir),
        None => base.join("runs").join(stem),
    }
}

fn seconds(key: String, value: f64) -> Result<Duration, PipelineError> {
    if !(value.is_finite() && value > 0.0) {
        return Err(PipelineError::config(
            key,
            format!("must be a positive number of seconds, got {value}"),
        ));
    }
    Duration::try_from_secs_f64(value).map_err(|e| PipelineError::config(key, e.to_string()))
}

/// The pool part of `[rollout]` / `[reward]`; `None` for a local module. Keys that only one of
/// them has are checked by the callers.
fn resolve_pool(
    section: &str,
    file: &ServiceSection,
    default_in_flight: usize,
    default_timeout_s: f64,
) -> Result<Option<crate::remote::PoolSettings>, PipelineError> {
    let key = |name: &str| format!("{section}.{name}");
    let servers = file.servers.clone().unwrap_or_default();
    match file.kind.unwrap_or(ServiceKindFile::Local) {
        ServiceKindFile::Local => {
            if !servers.is_empty() {
                return Err(PipelineError::config(
                    key("servers"),
                    "servers are used with kind = \"remote\" only",
                ));
            }
            Ok(None)
        }
        ServiceKindFile::Remote => {
            if servers.is_empty() {
                return Err(PipelineError::config(
                    key("servers"),
                    "kind = \"remote\" needs at least one server URL",
                ));
            }
            for (i, url) in servers.iter().enumerate() {
                if !(url.starts_with("http://") || url.starts_with("https://")) {
                    return Err(PipelineError::config(
                        format!("{section}.servers[{i}]"),
                        format!("{url:?} is not an http:// or https:// URL"),
                    ));
                }
                if servers[..i].contains(url) {
                    return Err(PipelineError::config(
                        format!("{section}.servers[{i}]"),
                        format!("{url} is listed twice"),
                    ));
                }
            }
            let max_in_flight = file.max_in_flight.unwrap_or(default_in_flight);
            if max_in_flight == 0 {
                return Err(PipelineError::config(
                    key("max_in_flight"),
                    "must be at least 1",
                ));
            }
            Ok(Some(crate::remote::PoolSettings {
                servers,
                routing: match file.routing.unwrap_or(RoutingFile::LeastLoaded) {
                    RoutingFile::RoundRobin => crate::remote::Routing::RoundRobin,
                    RoutingFile::LeastLoaded => crate::remote::Routing::LeastLoaded,
                },
                max_in_flight,
                timeout: seconds(
                    key("timeout_s"),
                    file.timeout_s.unwrap_or(default_timeout_s),
                )?,
                revive_after: seconds(
                    key("revive_after_s"),
                    file.revive_after_s.unwrap_or(DEFAULT_REVIVE_AFTER_S),
                )?,
                startup_wait: match file.startup_wait_s {
                    None | Some(0.0) => Duration::ZERO,
                    Some(s) => seconds(key("startup_wait_s"), s)?,
                },
            }))
        }
    }
}

/// The server software a `[rollout]` / `[reference]` table names (default `stoke serve`).
fn engine_of(file: &ServiceSection) -> crate::remote::Engine {
    match file.engine.unwrap_or(EngineFile::Stoke) {
        EngineFile::Stoke => crate::remote::Engine::Stoke,
        EngineFile::Vllm => crate::remote::Engine::Vllm,
    }
}

fn engine_file(engine: crate::remote::Engine) -> EngineFile {
    match engine {
        crate::remote::Engine::Stoke => EngineFile::Stoke,
        crate::remote::Engine::Vllm => EngineFile::Vllm,
    }
}

/// Refuses the first of `keys` (of engine, model, weights_dir) that `file` sets, naming it.
fn refuse_keys(
    section: &str,
    file: &ServiceSection,
    keys: &[&str],
    reason: &str,
) -> Result<(), PipelineError> {
    let set = |key: &str| match key {
        "engine" => file.engine.is_some(),
        "model" => file.model.is_some(),
        _ => file.weights_dir.is_some(),
    };
    match keys.iter().find(|key| set(key)) {
        Some(key) => Err(PipelineError::config(format!("{section}.{key}"), reason)),
        None => Ok(()),
    }
}

/// A `[rollout]` / `[reference]` table: the pool, the engine and the model name of a remote
/// module of inference servers; `None` in process (where `remote_keys` may not be set).
fn resolve_inference_service(
    section: &str,
    file: &ServiceSection,
    remote_keys: &[&str],
) -> Result<Option<(crate::remote::PoolSettings, crate::remote::Engine)>, PipelineError> {
    let pool = resolve_pool(
        section,
        file,
        DEFAULT_ROLLOUT_IN_FLIGHT,
        DEFAULT_ROLLOUT_TIMEOUT_S,
    )?;
    if pool.is_none() {
        refuse_keys(
            section,
            file,
            remote_keys,
            "is used with kind = \"remote\" only",
        )?;
    }
    Ok(pool.map(|pool| (pool, engine_of(file))))
}

pub(super) fn resolve_rollout_service(
    file: Option<&ServiceSection>,
    at: &dyn Fn(&Path) -> PathBuf,
    out_dir: &Path,
) -> Result<Option<crate::remote::RemoteRolloutSettings>, PipelineError> {
    let Some(file) = file else {
        return Ok(None);
    };
    let remote = resolve_inference_service("rollout", file, &["engine", "model", "weights_dir"])?;
    Ok(
        remote.map(|(pool, engine)| crate::remote::RemoteRolloutSettings {
            pool,
            engine,
            model: file.model.clone(),
            weights_dir: file
                .weights_dir
                .as_deref()
                .map_or_else(|| out_dir.join("published-weights"), at),
        }),
    )
}

pub(super) fn resolve_reference_service(
    file: Option<&ServiceSection>,
) -> Result<Option<crate::remote::RemoteReferenceSettings>, PipelineError> {
    let Some(file) = file else {
        return Ok(None);
    };
    refuse_keys(
        "reference",
        file,
        &["weights_dir"],
        "belongs to [rollout]: the reference is frozen, nothing is published to it",
    )?;
    let remote = resolve_inference_service("reference", file, &["engine", "model"])?;
    Ok(
        remote.map(|(pool, engine)| crate::remote::RemoteReferenceSettings {
            pool,
            engine,
            model: file.model.clone(),
        }),
    )
}

pub(super) fn reference_service_file(
    remote: &crate::remote::RemoteReferenceSettings,
) -> ServiceSection {
    ServiceSection {
        engine: Some(engine_file(remote.engine)),
        model: remote.model.clone(),
        ..pool_file(&remote.pool)
    }
}

pub(super) fn resolve_reward_service(
    file: Option<&ServiceSection>,
) -> Result<Option<crate::remote::PoolSettings>, PipelineError> {
    let Some(file) = file else {
        return Ok(None);
    };
    refuse_keys(
        "reward",
        file,
        &["engine", "model", "weights_dir"],
        "belongs to [rollout]; [reward] takes kind, servers, routing, max_in_flight, \
         timeout_s, revive_after_s and startup_wait_s",
    )?;
    resolve_pool(
        "reward",
        file,
        DEFAULT_REWARD_IN_FLIGHT,
        DEFAULT_REWARD_TIMEOUT_S_REMOTE,
    )
}

/// A remote pool back in file form, every value explicit.
pub(super) fn pool_file(pool: &crate::remote::PoolSettings) -> ServiceSection {
    ServiceSection {
        kind: Some(ServiceKindFile::Remote),
        servers: Some(pool.servers.clone()),
        routing: Some(match pool.routing {
            crate::remote::Routing::RoundRobin => RoutingFile::RoundRobin,
            crate::remote::Routing::LeastLoaded => RoutingFile::LeastLoaded,
        }),
        max_in_flight: Some(pool.max_in_flight),
        timeout_s: Some(pool.timeout.as_secs_f64()),
        revive_after_s: Some(pool.revive_after.as_secs_f64()),
        startup_wait_s: Some(pool.startup_wait.as_secs_f64()),
        ..ServiceSection::default()
    }
}

pub(super) fn rollout_service_file(
    remote: &crate::remote::RemoteRolloutSettings,
) -> ServiceSection {
    ServiceSection {
        engine: Some(engine_file(remote.engine)),
        model: remote.model.clone(),
        weights_dir: Some(remote.weights_dir.clone()),
        ..pool_file(&remote.pool)
    }
}
