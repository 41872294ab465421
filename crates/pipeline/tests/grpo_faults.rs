//! Faults of a GRPO run that must not end it (issue 6), at the level a user meets them:
//!
//! - a completion whose code never ends: the sandbox's wall-clock limit stops it, the sample is
//!   scored 0 with the verdict `timeout`, the reward pool answers long before its own timeout,
//!   and a run counts it in `metrics.jsonl` (`outcomes.timeout`) and goes on;
//! - a reward that panics or hangs past `grpo.reward_timeout_s`: scored 0, and every update with
//!   failed rewards gets an `alert` record (the console warning's text) naming the reward, the
//!   task and the panic message or the timeout;
//! - a non-finite loss: the update is skipped (`skipped_non_finite`, with an alert naming the
//!   non-finite inputs), the weights stay as they were, every checkpoint holds finite weights,
//!   the run goes on, and after `training.max_bad_steps` consecutive bad updates it stops with an
//!   error naming that setting; with the KL term in the reward a NaN penalty skips the update
//!   too, instead of training on a reward of 0 (and, a regression found here, `kl_placement =
//!   "reward"` trains at all).
//!
//! The NaN comes from the KL reference: a reference with one NaN weight gives NaN reference
//! log-probs while the policy (and so the rollout) stays finite. A NaN *policy* cannot reach the
//! trainer at all: its logits are NaN and the rollout module refuses to sample from them (the
//! last test pins that the run then stops at once with that error).
//!
//! Code runs in the real sandbox (`stoke_sandbox`, at least `basic` isolation, the level the
//! reward crate's own code-reward tests ask for) with `python3`.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Once};
use std::time::{Duration, Instant};

use candle_core::{DType, Device, Tensor};
use stoke_model::Transformer;
use stoke_pipeline::config::GrpoConfig;
use stoke_pipeline::metrics::{GrpoMetricsLog, GrpoRecord, GrpoStepRecord, StepOutcome};
use stoke_pipeline::reward::{RewardPool, RewardSpec};
use stoke_pipeline::run::{GrpoRun, RunOptions, run};
use stoke_pipeline::{
    GenerationPermit, GroupTicket, GrpoSettings, PipelineError, PipelineMode, RolloutGroup, Sample,
    Task,
};
use stoke_reward::{
    Details, Outcome, Reference, Reward, RewardConfig, RewardInput, RewardOutcome, Verifier,
};
use stoke_rollout::FinishReason;
use stoke_sandbox::{IsolationLevel, Sandbox, SandboxConfig};
use stoke_tokenizer::hf::Tokenizer;

/// The sandbox's wall-clock limit per program: far above what the honest programs here need
/// (two Python processes, well under a second even on a loaded 2-core machine), far below the
/// reward pool's timeout.
const SANDBOX_WALL: Duration = Duration::from_secs(3);
/// The reward pool's own timeout, the last line behind the sandbox.
const POOL_TIMEOUT: Duration = Duration::from_secs(60);

const PROMPT: &str = "def square(x):\n";
const SOLVES: &str = "```python\ndef square(x):\n    return x * x\n```";
const WRONG: &str = "```python\ndef square(x):\n    return x + x\n```";
/// Busy forever inside the function the tests call.
const SPINS: &str = "```python\ndef square(x):\n    while True:\n        pass\n```";
/// Blocked forever at import, using no CPU (only the wall-clock limit can stop it).
const SLEEPS: &str =
    "```python\nimport time\ntime.sleep(10_000)\ndef square(x):\n    return x * x\n```";

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

fn model() -> Transformer {
    Transformer::load(&fixture_dir(), &Device::Cpu).expect("fixture model loads")
}

fn tokenizer() -> Arc<Tokenizer> {
    Arc::new(Tokenizer::from_dir(&fixture_dir()).expect("fixture tokenizer loads"))
}

fn square_reference() -> Reference {
    Reference {
        tests: Some(
            "def check(candidate):\n    assert candidate(2) == 4\n    assert candidate(3) == 9\n"
                .into(),
        ),
        entry_point: Some("square".into()),
        ..Reference::default()
    }
}

/// `n` tasks asking for `square` (the tiny model cannot write it; the verifiers below decide
/// what code each sample stands for).
fn tasks(n: usize) -> Vec<Arc<Task>> {
    let tokenizer = tokenizer();
    (0..n)
        .map(|i| {
            let mut prompt_ids = vec![292];
            prompt_ids.extend(
                tokenizer
                    .encode(&format!("Task {i}: {PROMPT}"), false)
                    .expect("encodes"),
            );
            Arc::new(Task {
                id: format!("square-{i}"),
                prompt: PROMPT.into(),
                prompt_ids,
                reference: square_reference(),
                reward: 0,
                data: Default::default(),
            })
        })
        .collect()
}

fn sandbox() -> Sandbox {
    Sandbox::new(SandboxConfig {
        min_isolation: IsolationLevel::Basic,
        wall_timeout: SANDBOX_WALL,
        workers: 4,
        ..SandboxConfig::default()
    })
    .expect("the sandbox starts (stoke-reward's code-reward tests need the same)")
}

/// The `unit_tests` reward as `stoke grpo` builds it from `[rewards.NAME] kind = "unit_tests"`.
fn unit_tests_reward() -> Reward {
    let config: RewardConfig =
        serde_json::from_str(r#"{"kind": "unit_tests"}"#).expect("reward config");
    config
        .build(Some(sandbox()))
        .expect("unit_tests reward builds")
}

/// A run's config: the fixture model, sync mode, 2 prompts per step, `grpo` lines in `[grpo]`
/// (tables such as `[grpo.loss]` may follow them) and `tail` tables after `[optimizer]`.
fn settings(grpo: &str, tail: &str) -> GrpoSettings {
    let text = format!(
        r#"
[model]
path = "{}"
[tasks]
kind = "jsonl"
path = "unused.jsonl"
[grpo]
mode = "sync"
max_off_policy_steps = 0
prompts_per_step = 2
max_new_tokens = 8
threads = 2
reward_workers = 2
{grpo}
[optimizer]
kind = "adamw"
lr = 1e-3
{tail}
"#,
        fixture_dir().display()
    );
    GrpoConfig::parse(&text, Path::new("/tmp/grpo-faults.toml"), &[])
        .expect("test config parses")
        .settings
}

fn grpo_run(
    out: &Path,
    settings: GrpoSettings,
    verifier: Arc<dyn Verifier>,
    reference: Option<Transformer>,
) -> GrpoRun {
    GrpoRun {
        policy: model(),
        tokenizer: tokenizer(),
        model_dir: fixture_dir(),
        reference,
        tasks: tasks(4),
        // No held-out set: evaluation would only add sandbox runs.
        held_out: Vec::new(),
        rewards: vec![RewardSpec {
            name: "code".into(),
            verifier,
            group_level: false,
            dense_process: false,
        }],
        settings,
        out_dir: out.to_path_buf(),
        config_toml: "# test\n".into(),
    }
}

const QUIET: RunOptions = RunOptions {
    resume: false,
    quiet: true,
};

fn records(out: &Path) -> Vec<GrpoRecord> {
    GrpoMetricsLog::read_all(&out.join("metrics.jsonl")).expect("metrics.jsonl reads")
}

fn step_records(out: &Path) -> Vec<GrpoStepRecord> {
    records(out)
        .into_iter()
        .filter_map(|r| match r {
            GrpoRecord::Step(step) => Some(step),
            _ => None,
        })
        .collect()
}

fn alerts(out: &Path) -> Vec<(u64, String)> {
    records(out)
        .into_iter()
        .filter_map(|r| match r {
            GrpoRecord::Alert { step, message } => Some((step, message)),
            _ => None,
        })
        .collect()
}

/// Sum of one verdict's count over the step records.
fn outcome_total(records: &[GrpoStepRecord], outcome: &str) -> u64 {
    records
        .iter()
        .map(|r| r.outcomes.get(outcome).copied().unwrap_or(0))
        .sum()
}

/// A group of the `square` task whose samples' texts are `completions`.
fn code_group(completions: &[&str]) -> RolloutGroup {
    let samples = completions
        .iter()
        .map(|text| Sample {
            completion_ids: vec![5; 4],
            rollout_logprobs: vec![-1.0; 4],
            token_versions: vec![Default::default(); 4],
            loss_mask: None,
            episode: None,
            text: text.to_string(),
            finish: FinishReason::Eos { token_id: 294 },
        })
        .collect();
    RolloutGroup {
        ticket: GroupTicket {
            group_id: 0,
            task: Arc::clone(&tasks(1)[0]),
            permit: GenerationPermit {
                policy_version: Default::default(),
                update_slot: 0,
                permit_index: 0,
            },
            temperature: 1.0,
        },
        samples,
        generate_seconds: 0.0,
    }
}

#[test]
fn code_that_never_ends_times_out_in_the_sandbox_and_the_pool_answers_promptly() {
    let spec = RewardSpec::from_reward("code".into(), unit_tests_reward());
    let pool = RewardPool::new(vec![spec], 4, POOL_TIMEOUT).expect("pool");
    let started = Instant::now();
    let scored = pool.score(code_group(&[SOLVES, SPINS, SLEEPS, WRONG]));
    let elapsed = started.elapsed();

    let verdicts: Vec<(f64, Outcome)> = scored
        .rewards
        .iter()
        .map(|r| (r.score, r.outcome))
        .collect();
    assert_eq!(verdicts[0], (1.0, Outcome::Correct), "{:?}", scored.rewards);
    assert_eq!(verdicts[1], (0.0, Outcome::Timeout), "busy loop");
    assert_eq!(verdicts[2], (0.0, Outcome::Timeout), "blocked at import");
    assert_eq!(verdicts[3].0, 0.0);
    assert_ne!(
        verdicts[3].1,
        Outcome::Timeout,
        "a wrong answer is not a timeout"
    );
    // The sandbox gave the verdicts: no sample failed in the pool, no worker was abandoned.
    assert!(scored.rewards.iter().all(|r| r.failure.is_none()));
    let stats = pool.stats();
    assert_eq!(
        (stats.scored, stats.timeouts, stats.abandoned_workers),
        (4, 0, 0)
    );
    // The runaway programs cost their wall-clock limit, not the pool's timeout.
    assert!(
        elapsed >= SANDBOX_WALL,
        "answered before the limit: {elapsed:?}"
    );
    assert!(
        elapsed < SANDBOX_WALL * 4 && elapsed < POOL_TIMEOUT / 4,
        "scoring took {elapsed:?} with a {SANDBOX_WALL:?} sandbox limit"
    );
}

/// The `unit_tests` reward scoring, instead of the tiny model's text, a correct solution, except
/// every `spin_every`-th call, which gets a function that never returns.
struct CodeSubstitute {
    reward: Reward,
    calls: AtomicU64,
    spin_every: u64,
}

impl Verifier for CodeSubstitute {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let call = self.calls.fetch_add(1, Ordering::SeqCst);
        let code = if call % self.spin_every == 1 {
            SPINS
        } else {
            SOLVES
        };
        self.reward
            .score(&RewardInput::new(input.prompt, code, input.reference))
    }
}

#[test]
fn a_run_scores_a_sandbox_timeout_zero_counts_it_and_continues() {
    let out = tempfile::tempdir().unwrap();
    let verifier = CodeSubstitute {
        reward: unit_tests_reward(),
        calls: AtomicU64::new(0),
        spin_every: 4,
    };
    // 2 updates x 2 prompts x 2 samples = 8 calls: calls 1 and 5 spin.
    let settings = settings("steps = 2\ngroup_size = 2\nreward_timeout_s = 60", "");
    let started = Instant::now();
    let summary = run(
        grpo_run(out.path(), settings, Arc::new(verifier), None),
        QUIET,
    )
    .expect("the run survives code that never ends");
    assert_eq!(summary.steps, 2);
    assert_eq!(
        summary.reward_failures, 0,
        "the sandbox, not the pool, stopped the code"
    );
    assert!(started.elapsed() < POOL_TIMEOUT, "{:?}", started.elapsed());

    let steps = step_records(out.path());
    assert_eq!(steps.len(), 2);
    assert_eq!(
        outcome_total(&steps, "timeout"),
        2,
        "{:?}",
        steps[0].outcomes
    );
    assert_eq!(outcome_total(&steps, "correct"), 6);
    assert!(steps.iter().all(|s| s.reward_failures.is_empty()));
    // A timed-out sample scores 0 next to correct ones scoring 1.
    let mean: f64 = steps.iter().map(|s| s.reward_mean).sum::<f64>() / 2.0;
    assert!((mean - 0.75).abs() < 1e-9, "reward mean {mean}");
    assert!(out.path().join("model/model.safetensors").is_file());
}

/// Panics on every third call, else scores like [`LetterShare`].
struct PanicsSometimes {
    calls: AtomicU64,
}

impl Verifier for PanicsSometimes {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let call = self.calls.fetch_add(1, Ordering::SeqCst) + 1;
        if call.is_multiple_of(3) {
            panic!("scripted reward failure on call {call}");
        }
        LetterShare.score(input)
    }
}

/// The scripted panics are expected: on the pool's worker threads they print one line instead
/// of a backtrace (when RUST_BACKTRACE is set); every other thread keeps the default hook.
fn quiet_worker_panics() {
    static INSTALL: Once = Once::new();
    INSTALL.call_once(|| {
        let default_hook = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            let on_worker = std::thread::current()
                .name()
                .is_some_and(|name| name.starts_with("stoke-reward-"));
            if on_worker {
                eprintln!("reward worker panicked (expected in this test): {info}");
            } else {
                default_hook(info);
            }
        }));
    });
}

#[test]
fn reward_failures_raise_an_alert_naming_the_reward_task_and_panic() {
    quiet_worker_panics();
    let out = tempfile::tempdir().unwrap();
    let verifier = PanicsSometimes {
        calls: AtomicU64::new(0),
    };
    // 3 updates x 2 prompts x 2 samples = 12 calls: 4 panics, in every update.
    let summary = run(
        grpo_run(
            out.path(),
            settings("steps = 3\ngroup_size = 2", ""),
            Arc::new(verifier),
            None,
        ),
        QUIET,
    )
    .expect("panicking rewards do not stop the run");
    assert_eq!(summary.reward_failures, 4);
    let steps = step_records(out.path());
    let alerts = alerts(out.path());
    let failing: Vec<u64> = steps
        .iter()
        .filter(|s| !s.reward_failures.is_empty())
        .map(|s| s.step)
        .collect();
    let alerted: Vec<u64> = alerts.iter().map(|(step, _)| *step).collect();
    assert!(!failing.is_empty());
    assert_eq!(alerted, failing, "one alert per update with failed rewards");
    for (step, message) in &alerts {
        let record = &steps[*step as usize - 1];
        let panicked = record.reward_failures["panicked"];
        assert!(
            message.contains(&format!("{panicked} of 4 rewards failed"))
                && message.contains("reward `code` on task `square-")
                && message.contains("panicked: scripted reward failure on call"),
            "{message}"
        );
    }
}

/// Hangs (far past the pool's timeout) on its second call, else scores like [`LetterShare`].
struct HangsOnce {
    calls: AtomicU64,
}

impl Verifier for HangsOnce {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 1 {
            std::thread::sleep(Duration::from_secs(60));
        }
        LetterShare.score(input)
    }
}

#[test]
fn a_hung_reward_times_out_in_the_pool_and_the_alert_says_so() {
    let out = tempfile::tempdir().unwrap();
    let verifier = HangsOnce {
        calls: AtomicU64::new(0),
    };
    let started = Instant::now();
    let summary = run(
        grpo_run(
            out.path(),
            settings("steps = 2\ngroup_size = 2\nreward_timeout_s = 1", ""),
            Arc::new(verifier),
            None,
        ),
        QUIET,
    )
    .expect("a hung reward does not stop the run");
    assert!(
        started.elapsed() < Duration::from_secs(30),
        "the run waited on the hang"
    );
    assert_eq!((summary.steps, summary.reward_failures), (2, 1));
    let alerts = alerts(out.path());
    assert_eq!(alerts.len(), 1, "{alerts:?}");
    assert!(
        alerts[0].1.contains("1 of 4 rewards failed")
            && alerts[0].1.contains("(0 panicked, 1 timed out)")
            && alerts[0]
                .1
                .contains("did not answer within grpo.reward_timeout_s"),
        "{}",
        alerts[0].1
    );
}

/// A copy of the fixture model with one NaN in its final norm: every logit it gives is NaN.
fn nan_model(dir: &Path) -> Transformer {
    std::fs::create_dir_all(dir).unwrap();
    for entry in std::fs::read_dir(fixture_dir()).unwrap() {
        let path = entry.unwrap().path();
        let name = path.file_name().unwrap().to_owned();
        if name != "model.safetensors" {
            std::fs::copy(&path, dir.join(name)).unwrap();
        }
    }
    let mut tensors =
        candle_core::safetensors::load(fixture_dir().join("model.safetensors"), &Device::Cpu)
            .unwrap();
    let norm = tensors.get("model.norm.weight").expect("final norm weight");
    let mut values = norm.to_vec1::<f32>().unwrap();
    values[0] = f32::NAN;
    let poisoned = Tensor::from_vec(values, norm.shape(), &Device::Cpu).unwrap();
    tensors.insert("model.norm.weight".into(), poisoned);
    candle_core::safetensors::save(&tensors, dir.join("model.safetensors")).unwrap();
    Transformer::load(dir, &Device::Cpu).expect("the poisoned copy loads")
}

/// Every tensor of a model folder's or checkpoint's weights, as f32 values by name.
fn weights(model_dir: &Path) -> BTreeMap<String, Vec<f32>> {
    candle_core::safetensors::load(model_dir.join("model.safetensors"), &Device::Cpu)
        .unwrap_or_else(|e| panic!("{}: {e}", model_dir.display()))
        .into_iter()
        .map(|(name, tensor)| {
            let values = tensor
                .to_dtype(DType::F32)
                .and_then(|t| t.flatten_all())
                .and_then(|t| t.to_vec1::<f32>())
                .unwrap();
            (name, values)
        })
        .collect()
}

fn all_finite(weights: &BTreeMap<String, Vec<f32>>) -> bool {
    weights.values().flatten().all(|v| v.is_finite())
}

fn checkpoint_model(out: &Path, step: u64) -> PathBuf {
    out.join(format!("checkpoints/step-{step:08}/model"))
}

/// A dense, cheap reward (the share of the letter `e`), so applied updates move the weights.
struct LetterShare;

impl Verifier for LetterShare {
    fn score(&self, input: &RewardInput<'_>) -> RewardOutcome {
        let text = input.completion;
        let share = text.chars().filter(|c| *c == 'e').count() as f64 / text.len().max(1) as f64;
        RewardOutcome::shaped(share, Details::default())
    }
}

#[test]
fn nan_reference_updates_are_skipped_with_weights_unchanged_and_the_run_continues() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    // The reference is NaN until the reset after update 2 replaces it with the policy: updates
    // 1 and 2 get NaN KL terms, 3 and 4 are clean. Two bad updates stay under max_bad_steps = 3.
    let settings = settings(
        "steps = 4\ngroup_size = 4\nmax_bad_steps = 3\nreference_reset_every = 2\n\
         [grpo.loss]\nbeta = 0.04",
        "[checkpoint]\nevery = 1\nkeep = 10",
    );
    let reference = nan_model(&dir.path().join("nan-reference"));
    let summary = run(
        grpo_run(&out, settings, Arc::new(LetterShare), Some(reference)),
        QUIET,
    )
    .expect("skipped updates do not stop the run");
    assert_eq!((summary.steps, summary.skipped_steps), (4, 2));

    let steps = step_records(&out);
    let outcomes: Vec<StepOutcome> = steps.iter().map(|s| s.outcome).collect();
    assert_eq!(
        outcomes,
        [
            StepOutcome::SkippedNonFinite,
            StepOutcome::SkippedNonFinite,
            StepOutcome::Applied,
            StepOutcome::Applied
        ]
    );
    assert!(
        steps[0].loss.is_nan(),
        "the log shows the NaN: {}",
        steps[0].loss
    );
    let alerts: Vec<(u64, String)> = alerts(&out)
        .into_iter()
        .filter(|(_, message)| message.contains("skipped"))
        .collect();
    let alerted: Vec<u64> = alerts.iter().map(|(step, _)| *step).collect();
    assert_eq!(alerted, [1, 2], "one alert per skipped update");
    // The alert says where the NaN came from: the reference, not the policy.
    assert!(
        alerts[0]
            .1
            .contains("non-finite reference log-probs of 8 samples"),
        "{}",
        alerts[0].1
    );

    // Skipped updates leave the weights exactly as they were; applied ones move them.
    let initial = weights(&fixture_dir());
    for step in 1..=4 {
        let saved = weights(&checkpoint_model(&out, step));
        assert!(
            all_finite(&saved),
            "checkpoint {step} holds a non-finite weight"
        );
        if step <= 2 {
            assert!(
                saved == initial,
                "skipped update {step} changed the weights"
            );
        } else {
            assert!(
                saved != initial,
                "applied update {step} left the weights as they were"
            );
        }
    }
    assert!(all_finite(&weights(&out.join("model"))));
    assert!(all_finite(&weights(&out.join("reference-step-00000002"))));
}

#[test]
fn a_nan_kl_penalty_in_the_reward_skips_the_update_instead_of_training_on_zero() {
    // With the KL term in the reward, a NaN reference makes each penalised reward NaN. Scoring
    // those samples 0 would train on a reward nobody gave; the update must be skipped as
    // non-finite, exactly as with the KL term in the loss.
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let settings = settings(
        "steps = 2\ngroup_size = 4\nmax_bad_steps = 3\nkl_placement = \"reward\"\n\
         [grpo.loss]\nbeta = 0.04",
        "[checkpoint]\nevery = 1\nkeep = 10",
    );
    let reference = nan_model(&dir.path().join("nan-reference"));
    let summary = run(
        grpo_run(&out, settings, Arc::new(LetterShare), Some(reference)),
        QUIET,
    )
    .expect("skipped updates do not stop the run");
    assert_eq!(summary.skipped_steps, 2);
    let steps = step_records(&out);
    assert!(
        steps
            .iter()
            .all(|s| s.outcome == StepOutcome::SkippedNonFinite),
        "{:?}",
        steps.iter().map(|s| s.outcome).collect::<Vec<_>>()
    );
    assert!(weights(&out.join("model")) == weights(&fixture_dir()));
}

/// Regression: with `kl_placement = "reward"` and beta > 0 the updater kept the KL term of the
/// loss and refused the first update ("ref_logprobs missing"), since the learner rightly passes
/// no reference log-probs for this placement.
#[test]
fn kl_in_the_reward_trains_with_a_finite_reference() {
    let out = tempfile::tempdir().unwrap();
    let settings = settings(
        "steps = 2\ngroup_size = 4\nkl_placement = \"reward\"\n[grpo.loss]\nbeta = 0.04",
        "",
    );
    let summary = run(
        grpo_run(out.path(), settings, Arc::new(LetterShare), Some(model())),
        QUIET,
    )
    .expect("a run with the KL term in the reward");
    assert_eq!((summary.steps, summary.skipped_steps), (2, 0));
    assert!(
        step_records(out.path())
            .iter()
            .all(|s| s.outcome == StepOutcome::Applied)
    );
    assert!(weights(&out.path().join("model")) != weights(&fixture_dir()));
}

#[test]
fn a_reference_that_stays_nan_stops_a_sync_run_at_max_bad_steps() {
    stops_at_max_bad_steps(PipelineMode::Sync);
}

#[test]
fn a_reference_that_stays_nan_stops_an_async_run_at_max_bad_steps() {
    stops_at_max_bad_steps(PipelineMode::Async);
}

fn stops_at_max_bad_steps(mode: PipelineMode) {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let mut settings = settings(
        "steps = 6\ngroup_size = 2\nmax_bad_steps = 2\n[grpo.loss]\nbeta = 0.04",
        "[checkpoint]\nevery = 1\nkeep = 10",
    );
    if mode == PipelineMode::Async {
        settings.mode = mode;
        settings.max_off_policy_steps = 1;
    }
    let reference = nan_model(&dir.path().join("nan-reference"));
    let error = run(
        grpo_run(&out, settings, Arc::new(LetterShare), Some(reference)),
        QUIET,
    )
    .expect_err("two consecutive non-finite updates stop the run");
    let message = error.to_string();
    assert!(
        matches!(
            error,
            PipelineError::ModuleStopped {
                module: "trainer",
                ..
            }
        ),
        "{message}"
    );
    assert!(
        message.contains("2 consecutive updates") && message.contains("training.max_bad_steps = 2"),
        "{message}"
    );

    // Both bad updates, the one that stopped the run included, were logged with an alert and
    // checkpointed unchanged; nothing after them ran.
    let steps = step_records(&out);
    let outcomes: Vec<StepOutcome> = steps.iter().map(|s| s.outcome).collect();
    assert_eq!(outcomes, [StepOutcome::SkippedNonFinite; 2]);
    assert_eq!(alerts(&out).len(), 2);
    for step in 1..=2 {
        let saved = weights(&checkpoint_model(&out, step));
        assert!(all_finite(&saved) && saved == weights(&fixture_dir()));
    }
    assert!(!checkpoint_model(&out, 3).exists());
    assert!(
        !out.join("model").exists(),
        "a stopped run writes no final model"
    );
}

#[test]
fn a_policy_with_nan_weights_stops_at_the_first_rollout_naming_the_logits() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().join("run");
    let settings = settings(
        "steps = 2\ngroup_size = 2",
        "[checkpoint]\nevery = 1\nkeep = 10",
    );
    let mut broken = grpo_run(&out, settings, Arc::new(LetterShare), None);
    broken.policy = nan_model(&dir.path().join("nan-policy"));
    let error = run(broken, QUIET).expect_err("a NaN policy cannot sample");
    let message = error.to_string();
    assert!(
        matches!(error, PipelineError::Rollout(_)) && message.contains("NaN"),
        "{message}"
    );
    assert!(step_records(&out).is_empty());
    assert!(!checkpoint_model(&out, 1).exists());
}
