//! The whole GRPO loop on the tiny qwen2 fixture (model + tokenizer), with a cheap scripted
//! reward: the staleness guarantees as the trainer sees them (k = 0: every trained token came
//! from the weights being updated; k > 0 under random module delays: never more than k versions
//! old), faults (a panicking reward, EOS-only rollouts) that leave the run going, and an exact
//! resume of a synchronous run.

use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use candle_core::Device;
use rand::{Rng, SeedableRng};
use stoke_model::Transformer;
use stoke_pipeline::config::GrpoConfig;
use stoke_pipeline::driver::{
    Drive, DriveShape, FinishedUpdate, Modules, StepSink, TaskPlan, run_async,
};
use stoke_pipeline::inference::InferenceModule;
use stoke_pipeline::learner::Learner;
use stoke_pipeline::metrics::{GrpoMetricsLog, GrpoRecord};
use stoke_pipeline::reward::{RewardPool, RewardSpec};
use stoke_pipeline::rollout::{RolloutModule, RolloutSettings};
use stoke_pipeline::run::{GrpoRun, RunOptions, run};
use stoke_pipeline::scheduler::ThreadScheduler;
use stoke_pipeline::service::ReferenceScoring;
use stoke_pipeline::weights::WeightStore;
use stoke_pipeline::{GrpoSettings, Lag, PipelineError, StalenessBound, StalenessGate, Task};
use stoke_reward::{Details, Reference, RewardInput, RewardOutcome, Verifier};
use stoke_tokenizer::hf::Tokenizer;
use stoke_train::grpo::update::{PolicyUpdater, UpdateSettings};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

fn model() -> Transformer {
    Transformer::load(&fixture_dir(), &Device::Cpu).expect("fixture model loads")
}

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer loads"))
}

fn tasks(n: usize) -> Vec<Arc<Task>> {
    let tokenizer = tokenizer();
    (0..n)
        .map(|i| {
            let prompt = format!("Question {i}: say something");
            let mut prompt_ids = vec![292];
            prompt_ids.extend(tokenizer.encode(&prompt, false).expect("encodes"));
            Arc::new(Task {
                id: format!("task-{i}"),
                prompt,
                prompt_ids,
                reference: Reference::default(),
                reward: 0,
                data: Default::default(),
            })
        })
        .collect()
}

/// Reward: the share of the letter `e` in the completion (a dense, cheap signal), with an
/// optional random delay and an optional panic on every `panic_every`-th call.
struct Scripted {
    calls: AtomicU64,
    panic_every: Option<u64>,
    max_delay_ms: u64,
    seed: u64,
}

impl Scripted {
    fn new() -> Scripted {
        Scripted {
            calls: AtomicU64::new(0),
            panic_every: None,
            max_delay_ms: 0,
            seed: 0,
        }
    }
}

impl Verifier for Scripted {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if self.max_delay_ms > 0 {
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ call);
            std::thread::sleep(Duration::from_millis(
                rng.random_range(0..=self.max_delay_ms),
            ));
        }
        if self
            .panic_every
            .is_some_and(|every| call.is_multiple_of(every))
        {
            panic!("scripted reward failure on call {call}");
        }
        let text = input.completion;
        let share = text.chars().filter(|c| *c == 'e').count() as f64 / (text.len().max(1)) as f64;
        RewardOutcome::shaped(share, Details::default())
    }
}

fn base_config(extra: &str) -> String {
    format!(
        r#"
[model]
path = "{}"
[tasks]
kind = "jsonl"
path = "unused.jsonl"
[grpo]
prompts_per_step = 2
group_size = 4
max_new_tokens = 8
threads = 2
reward_workers = 2
{extra}
[optimizer]
kind = "adamw"
lr = 1e-3
"#,
        fixture_dir().display()
    )
}

/// Settings of the test config plus `extra` `[grpo]` lines (4 steps unless `extra` says).
fn settings(extra: &str) -> GrpoSettings {
    let has_steps = extra.lines().any(|line| line.starts_with("steps ="));
    let steps = if has_steps { "" } else { "steps = 4" };
    let text = base_config(&format!("{steps}\n{extra}"));
    GrpoConfig::parse(&text, Path::new("/tmp/grpo-test.toml"), &[])
        .expect("test config parses")
        .settings
}

/// The modules and learner of one session, built the way `run` builds them.
fn session(
    settings: &GrpoSettings,
    verifier: Arc<dyn Verifier>,
    stop_token_ids: Vec<u32>,
) -> (Modules, Learner, TaskPlan) {
    session_with(settings, verifier, stop_token_ids, None)
}

/// [`session`] with a reference (or teacher) model in the inference module.
fn session_with(
    settings: &GrpoSettings,
    verifier: Arc<dyn Verifier>,
    stop_token_ids: Vec<u32>,
    reference: Option<Transformer>,
) -> (Modules, Learner, TaskPlan) {
    let policy = model();
    let kept = match settings.lag {
        Lag::Bounded => 1,
        Lag::Fixed => settings.max_off_policy_steps as usize + 1,
    };
    let weights = Arc::new(WeightStore::with_history(&policy, kept).unwrap());
    let rollout = RolloutModule::new(
        Arc::clone(&weights),
        tokenizer(),
        RolloutSettings::from_grpo(settings, stop_token_ids),
    )
    .unwrap();
    let spec = RewardSpec {
        name: "scripted".into(),
        verifier,
        group_level: false,
        dense_process: false,
    };
    let rewards = RewardPool::new(vec![spec], 2, Duration::from_secs(30)).unwrap();
    let inference: Arc<Mutex<dyn ReferenceScoring>> =
        Arc::new(Mutex::new(InferenceModule::new(reference, 4096)));
    let bound = StalenessBound::new(
        settings.max_off_policy_steps,
        settings.prompts_per_step as u64,
    )
    .unwrap()
    .with_fixed_lag(settings.lag == Lag::Fixed);
    let gate = Arc::new(StalenessGate::new(bound));
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
    let learner = Learner::new(
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
        tasks(5),
        settings.seed,
        0,
        settings.prompts_per_step,
        settings.temperature,
    )
    .unwrap();
    (modules, learner, plan)
}

/// Records, per update, the version it trained against and every sample's token versions.
#[derive(Default)]
struct Recorder {
    /// (trained version, per-token versions of every sample, sample count)
    steps: Vec<(u64, Vec<Vec<u64>>)>,
    sleep_ms: u64,
    seed: u64,
}

impl StepSink for Recorder {
    fn on_step(&mut self, update: FinishedUpdate<'_>) -> Result<(), PipelineError> {
        let step = update.step;
        let versions = step
            .groups
            .iter()
            .flat_map(|g| &g.rollout.samples)
            .map(|s| s.token_versions.iter().map(|v| v.0).collect())
            .collect();
        self.steps.push((step.trained_version.0, versions));
        if self.sleep_ms > 0 {
            let mut rng =
                rand_chacha::ChaCha8Rng::seed_from_u64(self.seed ^ self.steps.len() as u64);
            std::thread::sleep(Duration::from_millis(rng.random_range(0..=self.sleep_ms)));
        }
        Ok(())
    }
}

fn shape(settings: &GrpoSettings) -> DriveShape {
    DriveShape {
        steps: settings.steps,
        prompts_per_step: settings.prompts_per_step,
        rollout_batch_groups: settings.rollout_batch_groups,
        buffer_bytes: settings.buffer_bytes,
    }
}

#[test]
fn on_policy_async_trains_only_tokens_sampled_by_the_weights_being_updated() {
    // In-flight weight sync is the mode that could mix versions inside a sample; with k = 0 the
    // gate must make it impossible.
    let settings = settings(
        "mode = \"async\"\nmax_off_policy_steps = 0\nweight_sync = \"in_flight\"\nrollout_batch_groups = 1",
    );
    let (modules, mut learner, plan) = session(&settings, Arc::new(Scripted::new()), vec![294]);
    let mut recorder = Recorder::default();
    run_async(
        Drive {
            modules: &modules,
            learner: &mut learner,
            plan: &plan,
            sink: &mut recorder,
        },
        shape(&settings),
    )
    .unwrap();
    assert_eq!(recorder.steps.len(), 4);
    for (index, (trained, samples)) in recorder.steps.iter().enumerate() {
        assert_eq!(
            *trained, index as u64,
            "update {index} trained against the wrong version"
        );
        assert_eq!(samples.len(), settings.samples_per_step());
        for versions in samples {
            assert!(!versions.is_empty());
            assert!(
                versions.iter().all(|v| v == trained),
                "update {index}: a token from version {versions:?} trained by version {trained}"
            );
        }
    }
}

#[test]
fn staleness_never_exceeds_the_bound_under_random_module_delays() {
    for (k, seed) in [(1u64, 3u64), (2, 11), (3, 29)] {
        let settings = settings(&format!(
            "mode = \"async\"\nmax_off_policy_steps = {k}\nrollout_batch_groups = 1\nsteps = 6\nseed = {seed}"
        ));
        let verifier = Scripted {
            max_delay_ms: 15,
            seed,
            ..Scripted::new()
        };
        let (modules, mut learner, plan) = session(&settings, Arc::new(verifier), vec![294]);
        let mut recorder = Recorder {
            sleep_ms: 60,
            seed,
            ..Recorder::default()
        };
        run_async(
            Drive {
                modules: &modules,
                learner: &mut learner,
                plan: &plan,
                sink: &mut recorder,
            },
            shape(&settings),
        )
        .unwrap();
        let mut max_lag = 0;
        for (trained, samples) in &recorder.steps {
            for versions in samples {
                let oldest = versions.iter().min().copied().unwrap_or(*trained);
                assert!(oldest <= *trained, "a sample from the future (k = {k})");
                let lag = trained - oldest;
                assert!(lag <= k, "lag {lag} > bound {k}");
                max_lag = max_lag.max(lag);
            }
        }
        // The trainer sleeps, so generation runs ahead: the pipeline really was asynchronous.
        assert!(max_lag >= 1, "k = {k}: no sample was ever off-policy");
    }
}

#[test]
fn a_fixed_lag_samples_update_n_with_version_n_minus_k_and_repeats_exactly() {
    for k in [1u64, 2] {
        let mut weights = Vec::new();
        for (delay_seed, trainer_sleep_ms) in [(5u64, 0u64), (23, 40)] {
            let settings = settings(&format!(
                "mode = \"async\"\nmax_off_policy_steps = {k}\nlag = \"fixed\"\nsteps = 5"
            ));
            let verifier = Scripted {
                max_delay_ms: 15,
                seed: delay_seed,
                ..Scripted::new()
            };
            let (modules, mut learner, plan) = session(&settings, Arc::new(verifier), vec![294]);
            let mut recorder = Recorder {
                sleep_ms: trainer_sleep_ms,
                seed: delay_seed,
                ..Recorder::default()
            };
            run_async(
                Drive {
                    modules: &modules,
                    learner: &mut learner,
                    plan: &plan,
                    sink: &mut recorder,
                },
                shape(&settings),
            )
            .unwrap();
            for (trained, samples) in &recorder.steps {
                for versions in samples {
                    assert!(
                        versions.iter().all(|&v| v == trained.saturating_sub(k)),
                        "k = {k}: update {trained} trained tokens of versions {versions:?}"
                    );
                }
            }
            let values: Vec<Vec<f32>> = learner
                .updater()
                .model()
                .parameters()
                .iter()
                .map(|(_, var)| var.as_tensor().flatten_all().unwrap().to_vec1().unwrap())
                .collect();
            weights.push(values);
        }
        assert!(
            weights[0] == weights[1],
            "k = {k}: two fixed-lag runs under other module delays ended with other weights"
        );
    }
}

#[test]
fn fixed_lag_with_in_flight_weight_updates_is_refused_by_name() {
    let text =
        base_config("steps = 2\nmode = \"async\"\nlag = \"fixed\"\nweight_sync = \"in_flight\"");
    let error = GrpoConfig::parse(&text, Path::new("/tmp/grpo-test.toml"), &[])
        .expect_err("refused")
        .to_string();
    assert!(error.contains("lag"), "{error}");
}

#[test]
fn eos_only_rollouts_train_without_error() {
    // Every token id stops generation: each sample is its first token alone.
    let settings = settings("mode = \"async\"\nmax_off_policy_steps = 1");
    let vocab = model().config().vocab_size as u32;
    let (modules, mut learner, plan) =
        session(&settings, Arc::new(Scripted::new()), (0..vocab).collect());
    let mut recorder = Recorder::default();
    run_async(
        Drive {
            modules: &modules,
            learner: &mut learner,
            plan: &plan,
            sink: &mut recorder,
        },
        shape(&settings),
    )
    .unwrap();
    assert_eq!(recorder.steps.len(), 4);
    assert!(
        recorder
            .steps
            .iter()
            .flat_map(|(_, samples)| samples)
            .all(|versions| versions.len() == 1)
    );
    assert_eq!(learner.step(), 4);
}

fn grpo_run(out: &Path, settings: GrpoSettings, verifier: Arc<dyn Verifier>) -> GrpoRun {
    GrpoRun {
        policy: model(),
        tokenizer: tokenizer(),
        model_dir: fixture_dir(),
        reference: None,
        tasks: tasks(5),
        held_out: tasks(3),
        rewards: vec![RewardSpec {
            name: "scripted".into(),
            verifier,
            group_level: false,
            dense_process: false,
        }],
        settings,
        out_dir: out.to_path_buf(),
        config_toml: "# test\n".into(),
    }
}

fn step_records(out: &Path) -> Vec<stoke_pipeline::metrics::GrpoStepRecord> {
    GrpoMetricsLog::read_all(&out.join("metrics.jsonl"))
        .unwrap()
        .into_iter()
        .filter_map(|r| match r {
            GrpoRecord::Step(step) => Some(step),
            _ => None,
        })
        .collect()
}

#[test]
fn a_panicking_reward_is_zeroed_counted_and_the_run_continues() {
    let out = tempfile::tempdir().unwrap();
    let settings = settings("mode = \"async\"");
    let verifier = Scripted {
        panic_every: Some(3),
        ..Scripted::new()
    };
    let summary = run(
        grpo_run(out.path(), settings, Arc::new(verifier)),
        RunOptions {
            resume: false,
            quiet: true,
        },
    )
    .unwrap();
    assert_eq!(summary.steps, 4);
    assert!(summary.reward_failures > 0);
    let records = step_records(out.path());
    assert_eq!(records.len(), 4);
    let panicked: u64 = records
        .iter()
        .map(|r| r.reward_failures.get("panicked").copied().unwrap_or(0))
        .sum();
    assert!(panicked > 0, "no reward failure recorded in the metrics");
    assert!(out.path().join("model/model.safetensors").is_file());
    assert!(out.path().join("report.html").is_file());
}

#[test]
fn a_stopped_synchronous_run_resumes_to_the_uninterrupted_weights() {
    let full = tempfile::tempdir().unwrap();
    let parts = tempfile::tempdir().unwrap();
    let options = RunOptions {
        resume: false,
        quiet: true,
    };
    let sync = "mode = \"sync\"\nmax_off_policy_steps = 0\nsteps = 4";
    run(
        grpo_run(full.path(), settings(sync), Arc::new(Scripted::new())),
        options,
    )
    .unwrap();
    // The same run stopped after 2 updates (its final checkpoint), then resumed to 4.
    let first = "mode = \"sync\"\nmax_off_policy_steps = 0\nsteps = 2";
    run(
        grpo_run(parts.path(), settings(first), Arc::new(Scripted::new())),
        options,
    )
    .unwrap();
    let summary = run(
        grpo_run(parts.path(), settings(sync), Arc::new(Scripted::new())),
        RunOptions {
            resume: true,
            quiet: true,
        },
    )
    .unwrap();
    assert_eq!(summary.resumed_from, Some(2));
    assert_eq!(summary.steps, 4);
    let a = std::fs::read(full.path().join("model/model.safetensors")).unwrap();
    let b = std::fs::read(parts.path().join("model/model.safetensors")).unwrap();
    assert!(
        a == b,
        "resumed weights differ from the uninterrupted run's"
    );
    assert_eq!(step_records(parts.path()).len(), 4);
}

#[test]
fn kl_term_reference_reset_and_temperature_schedule_show_in_the_run() {
    let out = tempfile::tempdir().unwrap();
    let settings = settings(
        "mode = \"sync\"\nmax_off_policy_steps = 0\nreference_reset_every = 2\ntemperature = 1.2\ntemperature_end = 0.8\ntemperature_decay_steps = 4\n[grpo.loss]\nbeta = 0.05",
    );
    assert!(settings.loss.kl.is_some());
    let mut grpo = grpo_run(out.path(), settings, Arc::new(Scripted::new()));
    grpo.reference = Some(model());
    run(
        grpo,
        RunOptions {
            resume: false,
            quiet: true,
        },
    )
    .unwrap();
    let records = step_records(out.path());
    assert_eq!(records.len(), 4);
    // The KL term is measured every update; the first update starts at the reference itself.
    let kl: Vec<f64> = records
        .iter()
        .map(|r| r.kl_mean.expect("kl measured"))
        .collect();
    assert!(kl[0].abs() < 1e-5, "KL to itself at the start: {}", kl[0]);
    assert!(
        kl[1] > 0.0,
        "the policy moved away from the reference: {kl:?}"
    );
    // The reference became the policy after updates 2 and 4 (kept on disk for resume).
    assert!(
        out.path()
            .join("reference-step-00000002/model.safetensors")
            .is_file()
    );
    assert!(
        out.path()
            .join("reference-step-00000004/model.safetensors")
            .is_file()
    );
    // Right after a reset the policy equals the reference again (in sync mode; asynchronously,
    // groups scored before the reset keep the old reference's log-probs, see `learner`).
    assert!(kl[2].abs() < 1e-5, "KL right after the reset: {kl:?}");
    let temperatures: Vec<f64> = records.iter().map(|r| r.temperature).collect();
    let expected = [1.2, 1.1, 1.0, 0.9];
    for (t, e) in temperatures.iter().zip(expected) {
        assert!((t - e).abs() < 1e-6, "temperatures {temperatures:?}");
    }
}

/// LoRA GRPO (`[lora]`): the policy trains adapters only, the KL reference is the base without
/// adapters (shared weights, no copy), the run saves the adapter and the merged model, and a
/// stopped run resumes to the uninterrupted run's adapter bit for bit.
#[test]
fn a_lora_grpo_run_trains_adapters_against_the_base_and_resumes_bit_for_bit() {
    let lora =
        "[lora]\nr = 4\nlora_alpha = 8\ntarget_modules = [\"q_proj\", \"v_proj\", \"down_proj\"]";
    let text = |steps: u64| {
        format!(
            "mode = \"sync\"\nmax_off_policy_steps = 0\nsteps = {steps}\n[grpo.loss]\nbeta = 0.05\n{lora}"
        )
    };
    let lora_run = |out: &Path, settings: GrpoSettings| {
        let mut grpo = grpo_run(out, settings.clone(), Arc::new(Scripted::new()));
        grpo.policy
            .add_lora(
                settings.lora.as_ref().expect("lora settings"),
                settings.seed,
            )
            .unwrap();
        grpo.reference = Some(grpo.policy.without_adapters());
        grpo
    };
    let quiet = |resume| RunOptions {
        resume,
        quiet: true,
    };
    let (full, parts) = (tempfile::tempdir().unwrap(), tempfile::tempdir().unwrap());
    run(lora_run(full.path(), settings(&text(4))), quiet(false)).unwrap();
    run(lora_run(parts.path(), settings(&text(2))), quiet(false)).unwrap();
    let summary = run(lora_run(parts.path(), settings(&text(4))), quiet(true)).unwrap();
    assert_eq!(summary.resumed_from, Some(2));
    let read = |dir: &Path, file: &str| std::fs::read(dir.join(file)).unwrap();
    for file in [
        "adapter/adapter_model.safetensors",
        "model/model.safetensors",
    ] {
        assert!(
            read(full.path(), file) == read(parts.path(), file),
            "{file} differs after resume"
        );
    }
    let kl: Vec<f64> = step_records(full.path())
        .iter()
        .map(|r| r.kl_mean.expect("kl measured"))
        .collect();
    assert!(
        kl[0].abs() < 1e-5,
        "the adapted policy starts at the base: {}",
        kl[0]
    );
    assert!(kl[3] > 0.0, "the adapters moved the policy: {kl:?}");
    // The memory report: gradients and moments are the adapters' only.
    let memory = step_records(full.path())[0]
        .memory
        .clone()
        .expect("memory reported");
    assert!(memory.gradients_bytes > 0 && memory.gradients_bytes * 10 < memory.weights_bytes);
    assert_eq!(memory.optimizer_bytes, 2 * memory.gradients_bytes);
    // The rollouts' KV cache is its own stage, out of the activations' remainder.
    assert!(memory.kv_cache_bytes > 0, "{memory:?}");
    assert!(memory.peak_rss_bytes >= memory.weights_bytes + memory.kv_cache_bytes);
    let adapters = candle_core::safetensors::load(
        full.path().join("adapter/adapter_model.safetensors"),
        &candle_core::Device::Cpu,
    )
    .unwrap();
    assert_eq!(adapters.len(), model().config().num_hidden_layers * 3 * 2);
}

/// On-policy distillation (`[grpo.loss.distill]`) with k = 0: every trained token was sampled
/// by the weights being updated, and the teacher's log-probs the learner trains on are the
/// teacher's scores of exactly those token ids (recomputed here independently).
#[test]
fn on_policy_distillation_trains_on_the_teachers_scores_of_the_sampled_tokens() {
    let text = base_config(
        "steps = 3\nmode = \"async\"\nmax_off_policy_steps = 0\n[grpo.loss.distill]\nkl_coef = 1.0",
    )
    .replacen(
        "[model]\n",
        &format!("[model]\nreference = \"{}\"\n", fixture_dir().display()),
        1,
    );
    let settings = GrpoConfig::parse(&text, Path::new("/tmp/grpo-test.toml"), &[])
        .expect("distill config parses")
        .settings;
    assert!(settings.loss.distill.is_some());
    let teacher_config = model().config().clone();
    let teacher = Transformer::init(teacher_config.clone(), &Device::Cpu, 9).unwrap();
    let (modules, mut learner, plan) = session_with(
        &settings,
        Arc::new(Scripted::new()),
        vec![294],
        Some(Transformer::init(teacher_config, &Device::Cpu, 9).unwrap()),
    );
    struct Check {
        teacher: Transformer,
        steps: Vec<(u64, usize)>,
    }
    impl StepSink for Check {
        fn on_step(&mut self, update: FinishedUpdate<'_>) -> Result<(), PipelineError> {
            let step = update.step;
            let mut tokens = 0;
            for group in &step.groups {
                let rows = group.ref_logprobs.as_ref().expect("teacher log-probs");
                let temperature = group.rollout.ticket.temperature;
                for (sample, teacher_row) in group.rollout.samples.iter().zip(rows) {
                    assert!(
                        sample
                            .token_versions
                            .iter()
                            .all(|v| v.0 == step.trained_version.0),
                        "a token sampled by another version than the one trained"
                    );
                    let row = stoke_train::grpo::sequences::SequenceRow {
                        prompt_ids: &group.rollout.ticket.task.prompt_ids,
                        completion_ids: &sample.completion_ids,
                    };
                    let scores = stoke_train::grpo::sequences::completion_logprobs(
                        &self.teacher,
                        &[row],
                        temperature,
                        false,
                    )
                    .unwrap();
                    let own: Vec<Vec<f32>> = scores.logprobs.to_vec2().unwrap();
                    assert_eq!(teacher_row.len(), sample.completion_ids.len());
                    for (a, b) in teacher_row.iter().zip(&own[0]) {
                        assert!((a - b).abs() < 1e-4, "{teacher_row:?} vs {:?}", own[0]);
                    }
                    tokens += teacher_row.len();
                }
            }
            self.steps.push((step.trained_version.0, tokens));
            Ok(())
        }
    }
    let mut check = Check {
        teacher,
        steps: Vec::new(),
    };
    run_async(
        Drive {
            modules: &modules,
            learner: &mut learner,
            plan: &plan,
            sink: &mut check,
        },
        shape(&settings),
    )
    .unwrap();
    assert_eq!(check.steps.len(), 3);
    assert!(check.steps.iter().all(|&(_, tokens)| tokens > 0));
    assert_eq!(learner.step(), 3);
}

#[test]
fn on_policy_distillation_without_a_teacher_or_with_a_kl_term_is_refused_by_name() {
    let error = GrpoConfig::parse(
        &base_config("steps = 2\n[grpo.loss.distill]\nkl_coef = 1.0"),
        Path::new("/tmp/grpo-test.toml"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("model.reference"), "{error}");
    let error = GrpoConfig::parse(
        &base_config("steps = 2\n[grpo.loss]\nbeta = 0.1\n[grpo.loss.distill]\nkl_coef = 1.0"),
        Path::new("/tmp/grpo-test.toml"),
        &[],
    )
    .unwrap_err()
    .to_string();
    assert!(error.contains("beta"), "{error}");
}
