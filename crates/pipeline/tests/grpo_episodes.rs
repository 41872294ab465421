//! Multi-turn GRPO on the tiny qwen2 fixture with a scripted environment: every trained sample
//! is its episode's transcript (sampled ids plus template-rendered environment ids, reproduced
//! by a re-render), the loss mask covers exactly the model's ids, and with k = 0 every model
//! token came from the weights being updated; environment faults end only their episodes.

use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::Device;
use stoke_env::{CodeRepairSpec, code_repair_tasks};
use stoke_env::{
    EnvError, EnvStep, EnvTask, Environment, Episode, ModelTurn, Opening, StopReason, TurnRenderer,
};
use stoke_model::Transformer;
use stoke_pipeline::config::{GrpoConfig, TaskSource};
use stoke_pipeline::driver::{
    Drive, DriveShape, FinishedUpdate, Modules, StepSink, TaskPlan, run_async,
};
use stoke_pipeline::episode::{EpisodeLimits, EpisodeSetup, episode_prompts};
use stoke_pipeline::episode_reward::EpisodeRewards;
use stoke_pipeline::held_out::{EvalSampling, evaluate_episodes};
use stoke_pipeline::inference::InferenceModule;
use stoke_pipeline::learner::Learner;
use stoke_pipeline::records::{RewardFailure, Sample};
use stoke_pipeline::reward::{RewardPool, RewardSpec};
use stoke_pipeline::rollout::{RolloutModule, RolloutSettings};
use stoke_pipeline::scheduler::ThreadScheduler;
use stoke_pipeline::service::ReferenceScoring;
use stoke_pipeline::weights::WeightStore;
use stoke_pipeline::{GrpoSettings, PipelineError, StalenessBound, StalenessGate, Task};
use stoke_reward::{Details, Reference, RewardInput, RewardOutcome, Verifier};
use stoke_tokenizer::chat::{ChatMessage, Role, TemplateValue};
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::tool_calls::ToolCallParser;
use stoke_train::grpo::update::{PolicyUpdater, UpdateSettings};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer loads"))
}

/// The fixture with `<|im_end|>` made likely (its random weights would almost never end a turn):
/// every other row of the tied embedding shrunk, that one grown.
fn model(tokenizer: &Tokenizer) -> Transformer {
    let model = Transformer::load(&fixture_dir(), &Device::Cpu).expect("model loads");
    let end = tokenizer.token_to_id("<|im_end|>").unwrap() as usize;
    let (_, embedding) = model
        .parameters()
        .into_iter()
        .find(|(name, _)| name.contains("embed_tokens"))
        .unwrap();
    let (rows, _) = embedding.as_tensor().dims2().unwrap();
    let scale: Vec<f32> = (0..rows)
        .map(|r| if r == end { 4.0 } else { 0.05 })
        .collect();
    let scale = candle_core::Tensor::from_vec(scale, (rows, 1), &Device::Cpu).unwrap();
    embedding
        .set(&embedding.as_tensor().broadcast_mul(&scale).unwrap())
        .unwrap();
    model
}

/// Answers every turn with a short tool message and 0.25 reward; `fail_task` makes the episodes
/// of that task panic at their first step.
struct Talk {
    fail_task: Option<String>,
}

impl Environment for Talk {
    fn name(&self) -> &str {
        "talk"
    }
    fn opening(&self, task: &EnvTask) -> Result<Opening, EnvError> {
        Ok(Opening {
            messages: vec![
                ChatMessage::system("s"),
                ChatMessage::user(task.prompt.clone()),
            ],
            tools: Vec::new(),
        })
    }
    fn start(&self, task: &EnvTask) -> Result<Box<dyn Episode>, EnvError> {
        Ok(Box::new(TalkEpisode {
            fail: self.fail_task.as_deref() == Some(task.id.as_str()),
        }))
    }
}

struct TalkEpisode {
    fail: bool,
}

impl Episode for TalkEpisode {
    fn step(&mut self, turn: &ModelTurn<'_>) -> Result<EnvStep, EnvError> {
        if self.fail {
            panic!("the environment died mid-episode");
        }
        let mut message = ChatMessage::new(Role::Tool, format!("ok{}", turn.index));
        message
            .extra
            .insert("tool_call_id".into(), TemplateValue::from("c"));
        Ok(EnvStep {
            messages: vec![message],
            reward: 0.25,
            ..EnvStep::default()
        })
    }
}

/// Reward: the share of `e` in the final answer (dense and cheap).
struct Letters;

impl Verifier for Letters {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let n = input.completion.chars().count().max(1) as f64;
        let e = input.completion.chars().filter(|&c| c == 'e').count() as f64;
        RewardOutcome::shaped(e / n, Details::default())
    }
}

fn settings() -> GrpoSettings {
    let text = format!(
        r#"
[model]
path = "{}"
[tasks]
kind = "jsonl"
path = "unused.jsonl"
[training]
steps = 3
[grpo]
prompts_per_step = 2
group_size = 4
max_new_tokens = 12
threads = 2
reward_workers = 2
mode = "async"
max_off_policy_steps = 0
weight_sync = "in_flight"
rollout_batch_groups = 1
[optimizer]
kind = "adamw"
lr = 1e-3
"#,
        fixture_dir().display()
    );
    GrpoConfig::parse(&text, Path::new("/tmp/grpo-episodes.toml"), &[])
        .expect("test config parses")
        .settings
}

fn tasks(tokenizer: &Tokenizer, setup: &EpisodeSetup) -> Vec<Arc<Task>> {
    let tasks = (0..4)
        .map(|i| {
            Arc::new(Task {
                id: format!("task-{i}"),
                prompt: format!("q{i}"),
                prompt_ids: vec![1],
                reference: Reference::default(),
                reward: 0,
                data: Default::default(),
            })
        })
        .collect();
    episode_prompts(tasks, setup, tokenizer).expect("prompts render")
}

/// A trained sample with its reward's failure and score.
type Trained = (Sample, Option<RewardFailure>, f64);

/// Every update's trained version and samples.
#[derive(Default)]
struct Recorder {
    steps: Vec<(u64, Vec<Trained>)>,
}

impl StepSink for Recorder {
    fn on_step(&mut self, update: FinishedUpdate<'_>) -> Result<(), PipelineError> {
        let samples = update
            .step
            .groups
            .iter()
            .flat_map(|g| {
                g.rollout
                    .samples
                    .iter()
                    .zip(&g.rewards)
                    .map(|(s, r)| (s.clone(), r.failure.clone(), r.score))
            })
            .collect();
        self.steps.push((update.step.trained_version.0, samples));
        Ok(())
    }
}

fn train(fail_task: Option<&str>) -> Recorder {
    let tokenizer = tokenizer();
    let setup = EpisodeSetup {
        env: Arc::new(Talk {
            fail_task: fail_task.map(str::to_string),
        }),
        parser: ToolCallParser::Hermes,
        limits: EpisodeLimits {
            max_turns: 3,
            max_total_tokens: 60,
            max_turn_tokens: 12,
            close_truncated_turns: false,
            env_timeout: Duration::from_secs(5),
        },
        tools_in_template: false,
        tools_described: false,
    };
    let tasks = tasks(&tokenizer, &setup);
    let policy = model(&tokenizer);
    train_on(
        settings(),
        tokenizer,
        policy,
        setup,
        tasks,
        Arc::new(Letters),
    )
}

/// A GRPO run of `settings` on `tasks` in `setup`, scored by `verifier` plus the environment.
fn train_on(
    settings: GrpoSettings,
    tokenizer: Arc<Tokenizer>,
    policy: Transformer,
    setup: EpisodeSetup,
    tasks: Vec<Arc<Task>>,
    verifier: Arc<dyn Verifier>,
) -> Recorder {
    let weights = Arc::new(WeightStore::with_history(&policy, 1).unwrap());
    let rollout = RolloutModule::new(
        Arc::clone(&weights),
        Arc::clone(&tokenizer),
        RolloutSettings::from_grpo(&settings, tokenizer.eos_token_ids()),
    )
    .unwrap()
    .with_episodes(setup.clone())
    .unwrap();
    let spec = RewardSpec {
        name: "default".into(),
        verifier,
        group_level: false,
        dense_process: false,
    };
    let rewards = EpisodeRewards::new(Box::new(
        RewardPool::new(vec![spec], 2, Duration::from_secs(30)).unwrap(),
    ));
    let inference: Arc<Mutex<dyn ReferenceScoring>> =
        Arc::new(Mutex::new(InferenceModule::new(None, 4096)));
    let gate = Arc::new(StalenessGate::new(
        StalenessBound::new(0, settings.prompts_per_step as u64).unwrap(),
    ));
    let updater = PolicyUpdater::new(
        policy,
        settings.optimizer.clone(),
        UpdateSettings {
            loss: settings.loss,
            schedule: settings.schedule.clone(),
            clip_grad_norm: settings.clip_grad_norm,
            micro_batch_tokens: settings.micro_batch_tokens,
            ptx_coef: None,
            use_mismatch_correction: true,
        },
    )
    .unwrap();
    let mut learner = Learner::new(
        updater,
        settings.clone(),
        Arc::clone(&weights),
        Some(Arc::clone(&gate)),
        Arc::clone(&inference),
        None,
        0,
    );
    let modules = Modules {
        rollout: Box::new(rollout),
        rewards: Box::new(rewards),
        inference,
        weights,
        gate,
        scheduler: ThreadScheduler::shared(2),
    };
    let plan = TaskPlan::new(
        tasks,
        settings.seed,
        0,
        settings.prompts_per_step,
        settings.temperature,
    )
    .unwrap();
    let mut recorder = Recorder::default();
    run_async(
        Drive {
            modules: &modules,
            learner: &mut learner,
            plan: &plan,
            sink: &mut recorder,
        },
        DriveShape {
            steps: settings.steps,
            prompts_per_step: settings.prompts_per_step,
            rollout_batch_groups: settings.rollout_batch_groups,
            buffer_bytes: settings.buffer_bytes,
        },
    )
    .expect("the run finishes");
    recorder
}

#[test]
fn every_trained_sample_is_its_episode_sampled_and_rendered_exactly_on_policy() {
    let recorder = train(None);
    let tokenizer = tokenizer();
    let template = tokenizer.default_chat_template().unwrap();
    let renderer = TurnRenderer::new(&tokenizer, template, &[]).unwrap();
    assert_eq!(recorder.steps.len(), 3);
    let mut multi_turn = 0;
    for (index, (trained, samples)) in recorder.steps.iter().enumerate() {
        assert_eq!(*trained, index as u64);
        assert_eq!(samples.len(), 8);
        for (sample, failure, score) in samples {
            assert!(failure.is_none());
            // The environment's 0.25 per step taken is part of the reward.
            let steps = sample
                .episode
                .as_ref()
                .unwrap()
                .transcript
                .segments
                .iter()
                .filter(|s| !s.is_model())
                .count();
            assert!(
                *score >= 0.25 * steps as f64 - 1e-9,
                "score {score} after {steps} steps"
            );
            let episode = sample.episode.as_ref().expect("a multi-turn sample");
            let transcript = &episode.transcript;
            // The trained ids are the transcript's: sampled ids and rendered environment ids.
            assert_eq!(sample.completion_ids, transcript.completion_ids());
            let mask = sample.loss_mask.as_ref().expect("a loss mask");
            assert_eq!(mask, &transcript.loss_mask());
            assert_eq!(sample.rollout_logprobs, transcript.logprobs());
            // k = 0: every model token came from the weights being updated.
            for (version, sampled) in sample.token_versions.iter().zip(mask) {
                if *sampled {
                    assert_eq!(version.0, *trained, "update {index}: a stale model token");
                }
            }
            if !matches!(episode.stop, StopReason::Undecodable { .. }) {
                renderer
                    .verify(transcript)
                    .unwrap_or_else(|e| panic!("update {index}: {e}"));
            }
            if episode.model_turns >= 2 {
                multi_turn += 1;
                assert!(
                    mask.iter().any(|m| !m),
                    "a two-turn episode has environment ids"
                );
            }
        }
    }
    assert!(multi_turn >= 4, "only {multi_turn} multi-turn episodes");
}

#[test]
fn an_environment_that_dies_mid_episode_fails_only_its_samples() {
    let recorder = train(Some("task-1"));
    let mut failed = 0;
    let mut fine = 0;
    for (_, samples) in &recorder.steps {
        for (sample, failure, score) in samples {
            let episode = sample.episode.as_ref().unwrap();
            match (&episode.stop, failure) {
                (StopReason::EnvFailed { message }, Some(RewardFailure::Environment(reason))) => {
                    assert!(message.contains("died mid-episode"), "{message}");
                    assert_eq!(message, reason);
                    assert_eq!(*score, 0.0);
                    // Not trained on: the crash was the environment's, not the model's.
                    assert!(sample.loss_mask.as_ref().unwrap().iter().all(|m| !m));
                    failed += 1;
                }
                (StopReason::EnvFailed { .. }, other) => panic!("failure not recorded: {other:?}"),
                (_, None) => fine += 1,
                (stop, Some(other)) => panic!("unexpected failure {other:?} for {stop:?}"),
            }
        }
    }
    assert_eq!(recorder.steps.len(), 3, "the run went on");
    assert!(failed > 0 && fine > 0, "failed {failed}, fine {fine}");
}

/// The configured reward of the code-repair run: nothing for the final answer (the
/// environment's hidden tests are the grade).
struct Nothing;

impl Verifier for Nothing {
    fn score(&self, _input: &RewardInput<'_>) -> RewardOutcome {
        RewardOutcome::shaped(0.0, Details::default())
    }
}

/// The fixture in `dir` with room for the code-repair opening (its system prompt, tools and
/// task run to a few thousand ids of its small vocabulary).
fn long_context_fixture(dir: &Path) -> PathBuf {
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let entry = entry.unwrap();
        std::fs::copy(entry.path(), dir.join(entry.file_name())).unwrap();
    }
    let config = dir.join("config.json");
    let text = std::fs::read_to_string(&config).unwrap().replace(
        "\"max_position_embeddings\": 128",
        "\"max_position_embeddings\": 8192",
    );
    assert!(text.contains("8192"));
    std::fs::write(&config, text).unwrap();
    dir.to_path_buf()
}

#[test]
fn a_code_repair_run_from_config_trains_graded_episodes_and_evaluates_held_out_tasks() {
    // The environment and the tasks as `stoke grpo` resolves them from the config.
    let text = format!(
        r#"
[model]
path = "{}"
[tasks]
kind = "code_repair"
problems = 4
seed = 5
max_bugs = 1
templates = ["sum_to", "clamp"]
[eval]
problems = 2
[training]
steps = 2
[grpo]
prompts_per_step = 2
group_size = 4
max_new_tokens = 8
threads = 2
reward_workers = 2
mode = "async"
max_off_policy_steps = 0
weight_sync = "in_flight"
rollout_batch_groups = 1
[environment]
kind = "code_repair"
max_turns = 2
tool_call_parser = "hermes"
truncated_turns = "close"
[optimizer]
kind = "adamw"
lr = 1e-3
"#,
        fixture_dir().display()
    );
    let config = GrpoConfig::parse(&text, Path::new("/tmp/grpo-code-repair.toml"), &[])
        .expect("the code-repair config parses");
    let dir = tempfile::tempdir().unwrap();
    let model_dir = long_context_fixture(dir.path());
    let tokenizer = Arc::new(Tokenizer::from_dir(&model_dir).unwrap());
    let template = tokenizer.default_chat_template().unwrap();
    let environment = config.settings.environment.as_ref().unwrap();
    let setup = match EpisodeSetup::new(environment, template) {
        Ok(setup) => setup,
        Err(error) => {
            eprintln!("skipped: the code-repair environment has no sandbox here: {error}");
            return;
        }
    };
    assert_eq!(setup.env.name(), "code_repair");
    assert!(setup.env.grades_outcome() && setup.env.requires_tool());
    // The tasks carry their repositories into the episodes (as the CLI draws them).
    let draw = |source: &TaskSource| -> Vec<Arc<Task>> {
        let TaskSource::CodeRepair {
            problems,
            seed,
            max_bugs,
            templates,
        } = source
        else {
            panic!("code_repair tasks expected, got {source:?}");
        };
        let spec = CodeRepairSpec {
            seed: *seed,
            max_bugs: *max_bugs,
            templates: templates.clone(),
        };
        let tasks = code_repair_tasks(&spec, *problems)
            .unwrap()
            .into_iter()
            .map(|task| {
                Arc::new(Task {
                    id: task.id,
                    prompt: task.prompt,
                    prompt_ids: vec![1],
                    reference: task.reference,
                    reward: 0,
                    data: task.data,
                })
            })
            .collect();
        episode_prompts(tasks, &setup, &tokenizer).expect("code-repair openings render")
    };
    let tasks = draw(&config.tasks);
    let held_out = draw(config.held_out.as_ref().expect("a default held-out set"));
    assert_eq!((tasks.len(), held_out.len()), (4, 2));
    assert!(held_out.iter().all(|t| tasks.iter().all(|u| u.id != t.id)));
    assert!(tasks.iter().all(|t| t.data.contains_key("files")));

    let policy = Transformer::load(&model_dir, &Device::Cpu).unwrap();
    let settings = config.settings.clone();
    let recorder = train_on(
        settings.clone(),
        Arc::clone(&tokenizer),
        policy,
        setup.clone(),
        tasks,
        Arc::new(Nothing),
    );
    assert_eq!(recorder.steps.len(), 2, "every update ran");
    for (index, (trained, samples)) in recorder.steps.iter().enumerate() {
        assert_eq!(*trained, index as u64);
        // No sample lost: prompts_per_step groups of group_size episodes.
        assert_eq!(samples.len(), 8, "update {index}");
        for (sample, failure, score) in samples {
            let episode = sample.episode.as_ref().expect("a multi-turn sample");
            assert!(failure.is_none(), "{failure:?}");
            assert!(
                !matches!(episode.stop, StopReason::EnvFailed { .. }),
                "{:?}",
                episode.stop
            );
            assert!(episode.grades_outcome && episode.requires_tool);
            assert!((1..=2).contains(&episode.model_turns), "{episode:?}");
            // The score is the share of the hidden-test gap closed.
            assert!((0.0..=1.0).contains(score), "score {score}");
            assert!((0.0..=1.0).contains(&episode.outcome_reward));
            assert_eq!(*score, episode.env_reward);
            for call in &episode.tool_calls {
                assert!(
                    ["list_files", "read_file", "write_file", "run_tests"]
                        .contains(&call.name.as_str())
                        || call.failed,
                    "{call:?}"
                );
            }
            assert_eq!(sample.completion_ids, episode.transcript.completion_ids());
        }
    }

    // Held-out evaluation of whole episodes: the verdict is the environment's.
    let pool = RewardPool::new(
        vec![RewardSpec {
            name: "default".into(),
            verifier: Arc::new(Nothing),
            group_level: false,
            dense_process: false,
        }],
        2,
        Duration::from_secs(30),
    )
    .unwrap();
    let rewards = EpisodeRewards::new(Box::new(pool));
    let policy = Transformer::load(&model_dir, &Device::Cpu).unwrap();
    let result = evaluate_episodes(
        &policy,
        &tokenizer,
        &setup,
        &held_out,
        &rewards,
        &EvalSampling {
            samples: 2,
            temperature: 1.0,
            top_p: 1.0,
            top_k: None,
            max_new_tokens: 8,
            seed: 0,
        },
    )
    .expect("held-out episodes evaluate");
    assert_eq!(result.problems, 2);
    let figures = result.episodes.expect("episode figures");
    assert!((0.0..=1.0).contains(&figures.mean_outcome));
    assert!((1.0..=2.0).contains(&figures.mean_turns), "{figures:?}");
    // A random model repairs nothing: pass@1 is the share solved, 0 here.
    assert_eq!(result.greedy_pass_at_1, 0.0);
    assert_eq!(figures.mean_outcome, 0.0);
    assert!(figures.graded_outcome, "code repair grades its final state");
}
