//! One GRPO run from loaded objects to a trained model folder: builds the four modules, resumes
//! from the newest checkpoint when asked, evaluates on held-out tasks before, during and after,
//! drives the updates (sync or async, see `driver`), and writes metrics, checkpoints, the final
//! model and the report.
//!
//! Output folder (`out_dir`):
//! - `config.toml`: the resolved configuration;
//! - `metrics.jsonl`: one record per update and per evaluation (`metrics`);
//! - `checkpoints/step-*/`: weights, optimizer state, trainer state (see below);
//! - `reference-step-*/`: the reference model after each reference reset (needed to resume);
//! - `model/`: the final policy, Hugging Face layout with the tokenizer files;
//! - `report.html`: charts of every metric (`report`).
//!
//! Resume (`RunOptions::resume`): the newest checkpoint that verifies gives the weights, the
//! optimizer moments, the step and the PTX data cursor; the metrics log is cut back to that step.
//! In-flight buffer policy: groups generated but not yet trained when the run stopped are not
//! saved; they are regenerated. Which task and which sampling stream a group gets depends only on
//! its global group number (`driver::TaskPlan`), so a synchronous (or `max_off_policy_steps = 0`)
//! run resumes exactly; an asynchronous run with `k > 0` regenerates its first `k` batches with
//! the restored (newer) weights instead of the older ones an uninterrupted run would have used.
//!
//! What it is not: config parsing or model loading (the CLI does those and hands over a
//! [`GrpoRun`]).

use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Instant;

use stoke_data::loader::LoaderConfig;
use stoke_model::Transformer;
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::checkpoint::load_checkpoint;
use stoke_train::grpo::GrpoLoss;
use stoke_train::grpo::update::{PolicyUpdater, UpdateSettings};
use stoke_train::run_folder::RunFolder;
use stoke_train::source::{BatchSource, ShardSource};

use crate::driver::{Drive, DriveShape, Modules, TaskPlan, run_async, run_sync};
use crate::episode::{EpisodeSetup, episode_prompts};
use crate::episode_reward::EpisodeRewards;
use crate::error::PipelineError;
use crate::held_out::{EvalSampling, HeldOutResult, evaluate, evaluate_episodes};
use crate::inference::InferenceModule;
use crate::learner::Learner;
use crate::monitor::{RunMonitor, reference_dir};
use crate::records::Task;
use crate::remote::{RemoteReference, RemoteRewards, RemoteRollout};
use crate::reward::{RewardPool, RewardSpec};
use crate::rollout::{RolloutModule, RolloutSettings};
use crate::scheduler::ThreadScheduler;
use crate::service::{ReferenceScoring, RewardService, RolloutService};
use crate::settings::{GrpoSettings, KlPlacement, Lag, PipelineMode};
use crate::staleness::{StalenessBound, StalenessGate};
use crate::weights::WeightStore;

/// Everything a run needs, loaded.
pub struct GrpoRun {
    /// The starting policy (ignored on resume when a checkpoint exists).
    pub policy: Transformer,
    pub tokenizer: Arc<Tokenizer>,
    /// The folder the policy came from: its tokenizer files go into checkpoints and `model/`.
    pub model_dir: PathBuf,
    /// The reference policy; only loaded when the KL term is on (beta > 0).
    pub reference: Option<Transformer>,
    pub tasks: Vec<Arc<Task>>,
    pub held_out: Vec<Arc<Task>>,
    /// Index 0 is the default reward; `Task::reward` indexes this list.
    pub rewards: Vec<RewardSpec>,
    pub settings: GrpoSettings,
    pub out_dir: PathBuf,
    /// The resolved configuration text, saved with the run and in every checkpoint.
    pub config_toml: String,
}

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RunOptions {
    pub resume: bool,
    pub quiet: bool,
}

/// What a finished run reports.
#[derive(Clone, Debug)]
pub struct GrpoSummary {
    /// Trainer steps completed (including those before a resume).
    pub steps: u64,
    /// Steps of this process.
    pub session_steps: u64,
    pub resumed_from: Option<u64>,
    pub skipped_steps: u64,
    pub initial_eval: Option<HeldOutResult>,
    pub final_eval: Option<HeldOutResult>,
    /// Wall time of the whole call, and of the updates alone (no evaluation, no saving).
    pub seconds: f64,
    pub train_seconds: f64,
    pub seconds_per_step: f64,
    pub samples_per_second: f64,
    pub reward_failures: u64,
    pub out_dir: PathBuf,
    pub model_dir: PathBuf,
    pub metrics: PathBuf,
    pub report: PathBuf,
}

/// Runs GRPO; see the module docs.
pub fn run(run: GrpoRun, options: RunOptions) -> Result<GrpoSummary, PipelineError> {
    let started = Instant::now();
    let GrpoRun {
        policy,
        tokenizer,
        model_dir,
        reference,
        tasks,
        held_out,
        rewards,
        settings,
        out_dir,
        config_toml,
    } = run;
    settings
        .validate()
        .map_err(|(field, reason)| PipelineError::config(format!("grpo.{field}"), reason))?;
    // The run folder and the resume rule every training command shares (config.toml is
    // written after it: a refused fresh start into another run's folder leaves that run's config
    // as it was).
    let folder = RunFolder::open(&out_dir, settings.keep_checkpoints, options.resume)?;
    let mut policy = policy;
    let mut start_step = 0;
    let mut engine_state = None;
    let mut optimizer_state = None;
    let mut ptx_cursor = None;
    let mut resumed_from = None;
    let latest = folder.resume_point().map(std::path::Path::to_path_buf);
    if options.resume {
        if let Some(path) = latest {
            let loaded = load_checkpoint(&path, policy.device())
                .map_err(stoke_train::error::TrainError::from)?;
            policy = match policy.lora_config() {
                // model/ is the merged model; training continues on the base with the adapter.
                Some(_) => {
                    let mut base = policy.without_adapters();
                    base.load_adapter(&path.join(stoke_train::checkpoint::ADAPTER_DIR))?;
                    base
                }
                None => loaded.model,
            };
            start_step = loaded.state.step;
            engine_state = Some(match loaded.state.engine {
                Some(engine) => engine,
                // Checkpoints from before the typed engine state keep the streak in `extra`
                // (and those from before the shared step engine have none: 0).
                None => stoke_train::step::EngineState {
                    steps: start_step,
                    consecutive_bad_steps: loaded.state.extra["consecutive_bad_steps"]
                        .as_u64()
                        .unwrap_or(0),
                    ..Default::default()
                },
            });
            optimizer_state = Some(loaded.optimizer_state);
            ptx_cursor = (!loaded.state.source.is_null()).then_some(loaded.state.source);
            resumed_from = Some(start_step);
            eprintln!("resuming GRPO from {} (step {start_step})", path.display());
        } else {
            eprintln!(
                "--resume: no checkpoint in {}; starting from step 0",
                folder.store().dir().display()
            );
        }
    }
    folder.record_start("grpo", &config_toml)?;
    let store = folder.into_store();
    let reference = match (reference, settings.reference_reset_every) {
        // After a reference reset the reference is the policy of the reset step, kept on disk.
        (Some(_), Some(every)) if start_step >= every => {
            let dir = reference_dir(&out_dir, start_step / every * every);
            Some(Transformer::load(&dir, policy.device())?)
        }
        (reference, _) => reference,
    };
    // The policy's precision carries into its rollout snapshots and reference resets.
    policy.set_precision(settings.precision);
    policy.set_activation_checkpointing(settings.activation_checkpointing);
    let reference = reference.map(|r| r.with_precision(settings.precision));
    let remaining = settings.steps.saturating_sub(start_step);

    // Modules.
    let mut stop_token_ids = tokenizer.eos_token_ids();
    stop_token_ids.extend(policy.config().eos_token_ids.iter().copied());
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    if stop_token_ids.is_empty() {
        return Err(PipelineError::config(
            "model",
            "the tokenizer and model config name no end-of-sequence token to stop generation on",
        ));
    }
    // A fixed lag samples slot s with version s - k, which must still be kept after s - k + 1
    // is out (see `staleness`).
    let kept_versions = match settings.lag {
        Lag::Bounded => 1,
        Lag::Fixed => settings.max_off_policy_steps as usize + 1,
    };
    let weights = Arc::new(WeightStore::with_history(&policy, kept_versions)?);
    let rollout_settings = RolloutSettings::from_grpo(&settings, stop_token_ids.clone());
    // Multi-turn runs: the environment, and every task's prompt rendered from its opening.
    let episodes = match &settings.environment {
        Some(environment) => {
            let template = tokenizer
                .default_chat_template()
                .map_err(|e| PipelineError::config("environment", e.to_string()))?;
            let setup = EpisodeSetup::new(environment, template)?;
            eprintln!(
                "environment `{}`: tool calls parsed as {}, tools shown {}, at most {} turns",
                setup.env.name(),
                setup.parser.name(),
                if setup.tools_in_template {
                    "in the chat template"
                } else if setup.tools_described {
                    "in the system prompt"
                } else {
                    "nowhere (tools_in = \"none\": the model was fine-tuned on them)"
                },
                setup.limits.max_turns
            );
            Some(setup)
        }
        None => None,
    };
    let (tasks, held_out) = match &episodes {
        Some(setup) => (
            episode_prompts(tasks, setup, &tokenizer)?,
            episode_prompts(held_out, setup, &tokenizer)?,
        ),
        None => (tasks, held_out),
    };
    let rollout: Box<dyn RolloutService> = match &settings.services.rollout {
        None => {
            let module = RolloutModule::new(
                Arc::clone(&weights),
                Arc::clone(&tokenizer),
                rollout_settings,
            )?;
            Box::new(match &episodes {
                Some(setup) => module.with_episodes(setup.clone())?,
                None => module,
            })
        }
        Some(remote) => {
            let rollout = RemoteRollout::connect(
                remote,
                Arc::clone(&weights),
                &policy,
                &tokenizer,
                &model_dir,
                rollout_settings,
            )?;
            eprintln!(
                "rollout on {} {} server(s): {}",
                remote.pool.servers.len(),
                remote.engine.name(),
                remote.pool.servers.join(", ")
            );
            Box::new(match &episodes {
                Some(setup) => rollout.with_episodes(setup.clone(), Arc::clone(&tokenizer))?,
                None => rollout,
            })
        }
    };
    // A dense process_reward (the run's only reward, checked with the config) also shapes the
    // token advantages with its step scores (`dense_process`).
    let dense_process = rewards.iter().any(|spec| spec.dense_process);
    let rewards: Box<dyn RewardService> = match &settings.services.reward {
        None => Box::new(RewardPool::new(
            rewards,
            settings.reward_workers,
            settings.reward_timeout,
        )?),
        Some(pool) => Box::new(RemoteRewards::connect(
            pool.clone(),
            rewards.iter().map(|spec| spec.name.clone()).collect(),
        )?),
    };
    // An episode's reward adds its environment's, and a failed environment is a failed reward.
    let rewards: Box<dyn RewardService> = match &episodes {
        Some(_) => Box::new(EpisodeRewards::new(rewards)),
        None => rewards,
    };
    let inference: Arc<Mutex<dyn ReferenceScoring>> = match &settings.services.reference {
        // Beta 0 and no distillation: no reference at all, wherever it would run.
        Some(remote) if settings.loss.kl.is_some() || settings.loss.distill.is_some() => {
            let scoring = RemoteReference::connect(remote, &tokenizer, policy.config().vocab_size)?;
            eprintln!(
                "reference log-probs on {} {} server(s): {}",
                remote.pool.servers.len(),
                remote.engine.name(),
                remote.pool.servers.join(", ")
            );
            Arc::new(Mutex::new(scoring))
        }
        _ => Arc::new(Mutex::new(InferenceModule::new(
            reference,
            settings.micro_batch_tokens,
        ))),
    };
    let bound = StalenessBound::new(
        settings.max_off_policy_steps,
        settings.prompts_per_step as u64,
    )
    .map_err(|reason| PipelineError::config("grpo.prompts_per_step", reason))?
    .with_fixed_lag(settings.lag == Lag::Fixed);
    let gate = Arc::new(StalenessGate::new(bound));
    let scheduler = match settings.mode {
        PipelineMode::Sync => ThreadScheduler::exclusive(settings.threads),
        PipelineMode::Async => ThreadScheduler::shared(settings.threads),
    };
    let mut updater = PolicyUpdater::new(
        policy,
        settings.optimizer.clone(),
        UpdateSettings {
            // With the KL term in the reward (the learner subtracts it before the advantages)
            // the loss has none: the updater would otherwise demand reference log-probs that
            // the learner, rightly, does not pass for this placement.
            loss: match settings.kl_placement {
                KlPlacement::Loss => settings.loss,
                KlPlacement::Reward => GrpoLoss {
                    kl: None,
                    ..settings.loss
                },
            },
            schedule: settings.schedule.clone(),
            clip_grad_norm: settings.clip_grad_norm,
            micro_batch_tokens: settings.micro_batch_tokens,
            ptx_coef: settings.ptx.as_ref().map(|p| p.coef),
            // Always measured (the trainer/rollout ratio is a run metric); it changes the loss
            // only when a correction (TIS, IcePop) is configured.
            use_mismatch_correction: true,
        },
    )?;
    updater.set_steps(start_step);
    if let Some(state) = engine_state {
        updater.restore_engine(stoke_train::step::EngineState {
            steps: start_step,
            ..state
        })?;
    }
    if let Some(path) = &optimizer_state {
        updater
            .optimizer_mut()
            .load_state(path)
            .map_err(stoke_train::error::TrainError::from)?;
    }
    let ptx = match &settings.ptx {
        Some(ptx) => {
            let shards = stoke_data::shard::list_shards(&ptx.shards)
                .map_err(|e| PipelineError::config("ptx.shards", e.to_string()))?;
            let mut loader = LoaderConfig::new(ptx.seq_len, ptx.batch_size, settings.seed);
            loader.pad_token = tokenizer.pad_token_id().unwrap_or(0);
            let mut source =
                ShardSource::open(&shards, loader).map_err(stoke_train::error::TrainError::from)?;
            if let Some(cursor) = ptx_cursor.clone() {
                source
                    .restore(cursor)
                    .map_err(stoke_train::error::TrainError::from)?;
            }
            Some(Box::new(source) as Box<dyn BatchSource>)
        }
        None => None,
    };
    let mut learner = Learner::new(
        updater,
        settings.clone(),
        Arc::clone(&weights),
        Some(Arc::clone(&gate)),
        Arc::clone(&inference),
        ptx,
        start_step,
    );
    if dense_process {
        learner = learner.with_dense_process(Arc::clone(&tokenizer));
    }
    let modules = Modules {
        rollout,
        rewards,
        inference,
        weights,
        gate,
        scheduler,
    };
    let plan = TaskPlan::new(
        tasks,
        settings.seed,
        start_step,
        settings.prompts_per_step,
        settings.temperature,
    )?;

    // Held-out set and the monitor (metrics log, progress, evaluation and checkpoint cadence).
    let held_out: Vec<Arc<Task>> = held_out
        .into_iter()
        .take(settings.eval.problems.max(1))
        .collect();
    let eval_sampling = EvalSampling {
        samples: settings.eval.samples,
        temperature: settings.temperature.at(start_step),
        top_p: settings.top_p,
        top_k: settings.top_k,
        max_new_tokens: settings.max_new_tokens,
        seed: settings.seed,
    };
    let mut monitor = RunMonitor::open(
        &out_dir,
        &settings,
        resumed_from,
        options.quiet,
        store,
        model_dir.clone(),
        config_toml,
    )?;
    let evaluate_now =
        |model: &Transformer, modules: &Modules| -> Result<Option<HeldOutResult>, PipelineError> {
            if held_out.is_empty() {
                return Ok(None);
            }
            match &episodes {
                Some(setup) => evaluate_episodes(
                    model,
                    &tokenizer,
                    setup,
                    &held_out,
                    &*modules.rewards,
                    &eval_sampling,
                ),
                None => evaluate(
                    model,
                    &tokenizer,
                    &held_out,
                    &*modules.rewards,
                    &eval_sampling,
                ),
            }
            .map(Some)
        };
    let initial_eval = if start_step == 0 {
        let result = evaluate_now(learner.updater().model(), &modules)?;
        if let Some(result) = &result {
            monitor.record_eval(0, result)?;
        }
        result
    } else {
        None
    };

    let train_started = Instant::now();
    let mut sink = monitor.sink(&evaluate_now);
    let shape = DriveShape {
        steps: remaining,
        prompts_per_step: settings.prompts_per_step,
        rollout_batch_groups: settings.rollout_batch_groups,
        buffer_bytes: settings.buffer_bytes,
    };
    let drive = Drive {
        modules: &modules,
        learner: &mut learner,
        plan: &plan,
        sink: &mut sink,
    };
    match settings.mode {
        PipelineMode::Sync => run_sync(drive, shape)?,
        PipelineMode::Async => run_async(drive, shape)?,
    }
    let train_seconds = train_started.elapsed().as_secs_f64() - sink.excluded_seconds();

    let final_eval = match evaluate_now(learner.updater().model(), &modules)? {
        Some(result) => {
            monitor.record_eval(learner.step(), &result)?;
            Some(result)
        }
        None => None,
    };
    monitor.checkpoint(&learner, true)?;
    let final_model = out_dir.join("model");
    stoke_train::checkpoint::save_model(learner.updater().model(), &final_model, Some(&model_dir))
        .map_err(stoke_train::error::TrainError::from)?;
    let report = monitor.finish()?;
    let stats = modules.rewards.stats();
    let session_steps = remaining;
    Ok(GrpoSummary {
        steps: learner.step(),
        session_steps,
        resumed_from,
        skipped_steps: monitor.skipped_steps(),
        initial_eval,
        final_eval,
        seconds: started.elapsed().as_secs_f64(),
        train_seconds,
        seconds_per_step: train_seconds / session_steps.max(1) as f64,
        samples_per_second: (session_steps * settings.samples_per_step() as u64) as f64
            / train_seconds.max(1e-9),
        reward_failures: stats.panics + stats.timeouts,
        out_dir: out_dir.clone(),
        model_dir: final_model,
        metrics: monitor.metrics_path(),
        report,
    })
}
