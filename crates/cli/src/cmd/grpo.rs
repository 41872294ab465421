//! `stoke grpo CONFIG.toml [--set key=value]... [--resume] [--quiet]`: reinforcement learning
//! with GRPO on the four-module pipeline; see `stoke_pipeline::config` for the file format.
//!
//! The command turns files into the loaded objects of a run and hands them to
//! `stoke_pipeline::run::run`: the policy and its tokenizer from `[model] path`, the reference
//! policy only when the KL coefficient is positive (`[model] reference`, else a copy of the
//! starting policy), the tasks (a JSONL file through `task::load_tasks`, or the built-in
//! arithmetic task drawn from `stoke_eval`, held-out split for `[held_out]`), and one
//! `RewardSpec` per configured reward (code rewards get a sandbox with default limits).
//!
//! What it is not: no training logic; [`prepare`] is reusable by other entry points (the
//! speedrun's GRPO stage builds a `GrpoConfig` in code and calls it).

use std::path::PathBuf;
use std::sync::Arc;

use anyhow::{Context, bail};
use candle_core::Device;
use clap::Args;
use stoke_eval::arithmetic::{ArithmeticTask, Level, Split};
use stoke_model::Transformer;
use stoke_pipeline::config::{GrpoConfig, TaskSource, resume_differences};
use stoke_pipeline::held_out::HeldOutResult;
use stoke_pipeline::records::Task;
use stoke_pipeline::reward::RewardSpec;
use stoke_pipeline::run::{GrpoRun, GrpoSummary, RunOptions, run};
use stoke_pipeline::task::{chat_task, load_tasks};
use stoke_sandbox::{Sandbox, SandboxConfigFile};
use stoke_tokenizer::hf::Tokenizer;

/// Share of the arithmetic question space held out, the value the speedrun's SFT stage uses:
/// the split is a function of the question and this share, so GRPO never trains on a question
/// the speedrun held out.
const ARITHMETIC_HELD_OUT_FRACTION: f64 = 0.1;

#[derive(Args)]
pub struct GrpoArgs {
    /// The run's TOML config (relative paths inside it are relative to its folder).
    config: PathBuf,
    /// Override a key of the config, e.g. `--set training.steps=20` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// Continue from the newest checkpoint in the output folder.
    #[arg(long)]
    resume: bool,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

pub fn run_command(args: GrpoArgs) -> anyhow::Result<()> {
    run_with(&args.config, args.sets, args.resume, args.quiet)
}

/// `stoke grpo CONFIG --set ... [--resume] [--quiet]` (also the trainer of `stoke launch`).
pub fn run_with(
    path: &std::path::Path,
    sets: Vec<String>,
    resume: bool,
    quiet: bool,
) -> anyhow::Result<()> {
    let config =
        GrpoConfig::load(path, &sets).with_context(|| format!("config {}", path.display()))?;
    if resume {
        check_resume(&config)?;
    }
    let summary = run_config(&config, RunOptions { resume, quiet })?;
    if let Some(step) = summary.resumed_from {
        println!("resumed from step {step}");
    }
    println!(
        "completed: {} updates ({} this session, {} skipped), {:.2} s per update, {:.1} samples/s, {:.1} s",
        summary.steps,
        summary.session_steps,
        summary.skipped_steps,
        summary.seconds_per_step,
        summary.samples_per_second,
        summary.seconds
    );
    let show = |eval: &HeldOutResult| {
        format!(
            "greedy pass@1 {:.1}%, pass@1 {:.1}%, pass@{} {:.1}%",
            100.0 * eval.greedy_pass_at_1,
            100.0 * eval.pass_at_1,
            eval.k,
            100.0 * eval.pass_at_k
        )
    };
    match (&summary.initial_eval, &summary.final_eval) {
        (Some(first), Some(last)) => println!(
            "held-out ({} problems): {} -> {}",
            last.problems,
            show(first),
            show(last)
        ),
        (None, Some(last)) => println!("held-out ({} problems): {}", last.problems, show(last)),
        _ => {}
    }
    if summary.reward_failures > 0 {
        println!(
            "reward failures (panics and timeouts, scored 0): {}",
            summary.reward_failures
        );
    }
    println!("model: {}", summary.model_dir.display());
    println!("metrics: {}", summary.metrics.display());
    println!("report: {}", summary.report.display());
    Ok(())
}

/// Loads what `config` names and runs it (the speedrun's GRPO stage calls this too).
pub fn run_config(config: &GrpoConfig, options: RunOptions) -> anyhow::Result<GrpoSummary> {
    let config_toml = config.to_toml()?;
    let prepared = prepare(config, options.quiet)?;
    Ok(run(
        GrpoRun {
            policy: prepared.policy,
            tokenizer: prepared.tokenizer,
            model_dir: config.model.clone(),
            reference: prepared.reference,
            tasks: prepared.tasks,
            held_out: prepared.held_out,
            rewards: prepared.rewards,
            settings: config.settings.clone(),
            out_dir: config.out_dir.clone(),
            config_toml,
        },
        options,
    )?)
}

/// A resumed run must be the run that was started: the saved config and the current one may
/// differ only in length, evaluation, checkpoint and resource keys.
fn check_resume(config: &GrpoConfig) -> anyhow::Result<()> {
    let saved_path = config.out_dir.join("config.toml");
    if !saved_path.exists() {
        return Ok(());
    }
    let saved = GrpoConfig::load(&saved_path, &[])
        .with_context(|| format!("reading the saved config {}", saved_path.display()))?;
    let differences = resume_differences(&saved, config);
    if differences.is_empty() {
        return Ok(());
    }
    let listed: Vec<String> = differences
        .iter()
        .map(|(key, was, now)| format!("{key}: {was} -> {now}"))
        .collect();
    bail!(
        "--resume: the config differs from the run's saved {} in keys that change training ({}); \
         start a new run (another output_dir) or restore those values",
        saved_path.display(),
        listed.join("; ")
    )
}

/// Everything a run needs besides its settings, loaded.
pub struct PreparedGrpo {
    pub policy: Transformer,
    pub tokenizer: Arc<Tokenizer>,
    /// Present only when the KL coefficient is positive.
    pub reference: Option<Transformer>,
    pub tasks: Vec<Arc<Task>>,
    /// Empty when the config has no held-out set.
    pub held_out: Vec<Arc<Task>>,
    pub rewards: Vec<RewardSpec>,
}

/// Loads the model, tokenizer, reference, tasks and rewards a config names.
pub fn prepare(config: &GrpoConfig, quiet: bool) -> anyhow::Result<PreparedGrpo> {
    let model_dir = &config.model;
    if !model_dir.is_dir() && !stoke_gguf::is_gguf(model_dir) {
        bail!(
            "[model] path {} is neither a model folder nor a GGUF file",
            model_dir.display()
        );
    }
    let mut policy = Transformer::load(model_dir, &Device::Cpu)
        .with_context(|| format!("loading the policy from {}", model_dir.display()))?;
    if let Some(lora) = &config.settings.lora {
        policy.add_lora(lora, config.settings.seed)?;
    }
    let tokenizer = Arc::new(
        Tokenizer::from_dir(model_dir)
            .with_context(|| format!("loading the tokenizer from {}", model_dir.display()))?,
    );
    let distill = config.settings.loss.distill.is_some();
    // A remote reference ([reference] kind = "remote") is scored on its servers: nothing to load.
    let needs_reference = (config.settings.loss.kl.is_some() || distill)
        && config.settings.services.reference.is_none();
    let reference = match (&config.reference_model, needs_reference) {
        (_, false) => None,
        (Some(dir), true) if distill => {
            let teacher = Transformer::load(dir, &Device::Cpu)
                .with_context(|| format!("loading the teacher from {}", dir.display()))?;
            check_teacher(dir, &teacher, &policy, &tokenizer)?;
            Some(teacher)
        }
        (None, true) if distill => bail!(
            "[grpo.loss.distill] needs the teacher: set [model] reference to its model folder"
        ),
        (Some(dir), true) => Some(
            Transformer::load(dir, &Device::Cpu)
                .with_context(|| format!("loading the reference from {}", dir.display()))?,
        ),
        // LoRA: the base without adapters is the starting policy, sharing its weights.
        (None, true) if policy.lora_config().is_some() => Some(policy.without_adapters()),
        (None, true) => Some(policy.snapshot().context("copying the reference policy")?),
    };

    let reward_names = config.reward_names();
    let tasks = resolve_tasks(
        "tasks",
        &config.tasks,
        Split::Train,
        &tokenizer,
        &reward_names,
        quiet,
    )?;
    let held_out = match &config.held_out {
        None => Vec::new(),
        Some(source) => resolve_tasks(
            "held_out",
            source,
            Split::HeldOut,
            &tokenizer,
            &reward_names,
            quiet,
        )?,
    };
    let rewards = build_rewards(config)?;
    Ok(PreparedGrpo {
        policy,
        tokenizer,
        reference,
        tasks,
        held_out,
        rewards,
    })
}

/// The tasks of one `[tasks]` / `[held_out]` section.
fn resolve_tasks(
    section: &str,
    source: &TaskSource,
    split: Split,
    tokenizer: &Tokenizer,
    reward_names: &[String],
    quiet: bool,
) -> anyhow::Result<Vec<Arc<Task>>> {
    match source {
        TaskSource::Jsonl { path } => {
            let load = load_tasks(path, tokenizer, reward_names)
                .with_context(|| format!("[{section}] {}", path.display()))?;
            // Skipped lines are reported even in quiet runs: silently training on part of a
            // file is the surprise a person must not get.
            if !load.skipped.is_empty() {
                eprintln!("warning: {}", load.summary(path));
            } else if !quiet {
                eprintln!("{}", load.summary(path));
            }
            Ok(load.tasks)
        }
        TaskSource::Calculator {
            digits,
            problems,
            seed,
        } => {
            let spec = stoke_env::arithmetic::ArithmeticSpec {
                digits: *digits,
                seed: *seed,
            };
            let drawn = stoke_env::arithmetic::arithmetic_tasks(&spec, *problems)
                .with_context(|| format!("[{section}] calculator tasks"))?;
            // The prompt ids here are the plain chat rendering; a run with an [environment]
            // renders each task's opening (system prompt, tools) instead.
            drawn
                .into_iter()
                .map(|task| {
                    chat_task(task.id.clone(), &task.prompt, task.reference, tokenizer)
                        .map(Arc::new)
                        .with_context(|| format!("[{section}] rendering task {}", task.id))
                })
                .collect()
        }
        TaskSource::CodeRepair {
            problems,
            seed,
            max_bugs,
            templates,
        } => {
            let spec = stoke_env::CodeRepairSpec {
                seed: *seed,
                max_bugs: *max_bugs,
                templates: templates.clone(),
            };
            let drawn = stoke_env::code_repair_tasks(&spec, *problems)
                .with_context(|| format!("[{section}] code_repair tasks"))?;
            // The repository and the hidden tests travel in the task's data; the prompt ids are
            // re-rendered from the environment's opening.
            drawn
                .into_iter()
                .map(|task| {
                    let mut rendered =
                        chat_task(task.id.clone(), &task.prompt, task.reference, tokenizer)
                            .with_context(|| format!("[{section}] rendering task {}", task.id))?;
                    rendered.data = task.data;
                    Ok(Arc::new(rendered))
                })
                .collect()
        }
        TaskSource::Arithmetic {
            levels,
            problems,
            seed,
        } => {
            let levels = parse_levels(levels, section)?;
            let generator = ArithmeticTask::new(levels, ARITHMETIC_HELD_OUT_FRACTION)
                .with_context(|| format!("[{section}] arithmetic task"))?;
            let drawn = generator
                .problems(split, *problems, *seed)
                .with_context(|| format!("[{section}] drawing {problems} arithmetic problems"))?;
            let prefix = match split {
                Split::Train => "arithmetic-train",
                Split::HeldOut => "arithmetic-held-out",
            };
            drawn
                .iter()
                .enumerate()
                .map(|(i, problem)| {
                    chat_task(
                        format!("{prefix}-{i}"),
                        &problem.question,
                        problem.reference(),
                        tokenizer,
                    )
                    .map(Arc::new)
                    .with_context(|| format!("[{section}] rendering arithmetic problem {i}"))
                })
                .collect()
        }
    }
}

/// `stoke_eval` levels from their names (the config checked them against the same list).
fn parse_levels(names: &[String], section: &str) -> anyhow::Result<Vec<Level>> {
    names
        .iter()
        .map(|name| {
            Level::ALL
                .into_iter()
                .find(|level| level.name() == name)
                .with_context(|| format!("{section}.levels: unknown level `{name}`"))
        })
        .collect()
}

/// One `RewardSpec` per configured reward, in index order; one sandbox (default limits) shared
/// by the rewards that run code, and each reward model folder loaded once (in this process:
/// the trainer's, or a reward server's).
pub fn build_rewards(config: &GrpoConfig) -> anyhow::Result<Vec<RewardSpec>> {
    let scorers = stoke_pipeline::learned_reward::LocalScorers::default();
    let sandbox = if config.rewards.iter().any(|(_, r)| r.runs_code()) {
        let sandbox_config = SandboxConfigFile::default().into_config()?;
        Some(Sandbox::new(sandbox_config).context("starting the sandbox for code rewards")?)
    } else {
        None
    };
    config
        .rewards
        .iter()
        .map(|(name, reward)| {
            let built = reward
                .build_with(sandbox.clone(), Some(&scorers))
                .with_context(|| format!("rewards.{name}"))?;
            Ok(RewardSpec::from_reward(name.clone(), built))
        })
        .collect()
}

/// On-policy distillation scores the policy's token ids under the teacher: both must predict
/// over the same vocabulary, with the same token for every id where the teacher has tokenizer
/// files.
fn check_teacher(
    dir: &std::path::Path,
    teacher: &Transformer,
    policy: &Transformer,
    tokenizer: &Tokenizer,
) -> anyhow::Result<()> {
    let (theirs, ours) = (teacher.config().vocab_size, policy.config().vocab_size);
    if theirs != ours {
        bail!(
            "[model] reference {}: the teacher predicts over {theirs} ids and the policy over \
             {ours}; on-policy distillation needs one shared tokenizer",
            dir.display()
        );
    }
    if dir.join("tokenizer.json").is_file() {
        let other = Tokenizer::from_dir(dir)
            .with_context(|| format!("loading the teacher's tokenizer from {}", dir.display()))?;
        if let Some((id, teacher_token, policy_token)) =
            other.first_vocabulary_difference(tokenizer)
        {
            bail!(
                "[model] reference {}: not the policy's tokenizer (id {id} is {teacher_token:?} \
                 for the teacher and {policy_token:?} for the policy); on-policy distillation \
                 needs one shared tokenizer",
                dir.display()
            );
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn config_level_names_are_the_eval_crate_names() {
        let eval_names: Vec<&str> = Level::ALL.iter().map(|l| l.name()).collect();
        assert_eq!(
            eval_names,
            stoke_pipeline::config::ARITHMETIC_LEVELS.to_vec()
        );
    }

    #[test]
    fn unknown_level_is_named() {
        let error = parse_levels(&["hard".to_string()], "tasks").unwrap_err();
        assert!(error.to_string().contains("tasks.levels"), "{error}");
    }

    const TEMPLATE: &str = r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}";

    /// A model folder: a tiny random Llama and a small BPE with a ChatML template.
    fn model_folder(dir: &Path) {
        use stoke_tokenizer::train::{TrainerConfig, WordCounts, train_bpe};
        let tokenizer_dir = dir.join("tokenizer");
        let texts: Vec<String> = (0..40)
            .map(|i| {
                format!(
                    "Mia has {i} shells. She finds {} more. #### {}",
                    i + 2,
                    2 * i + 2
                )
            })
            .collect();
        let specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"].map(String::from);
        let trainer = TrainerConfig::new(300, specials.to_vec());
        let mut words = WordCounts::new(&trainer.pattern).unwrap();
        words.add_texts(&texts);
        train_bpe(&words, &trainer, |_| {})
            .unwrap()
            .save(&tokenizer_dir)
            .unwrap();
        let tokenizer_config = serde_json::json!({
            "eos_token": "<|im_end|>", "pad_token": "<|endoftext|>", "chat_template": TEMPLATE,
        });
        std::fs::write(
            tokenizer_dir.join("tokenizer_config.json"),
            tokenizer_config.to_string(),
        )
        .unwrap();
        let vocab = Tokenizer::from_dir(&tokenizer_dir).unwrap().vocab_size();
        let json = serde_json::json!({
            "architectures": ["LlamaForCausalLM"], "model_type": "llama", "vocab_size": vocab,
            "hidden_size": 32, "intermediate_size": 64, "num_hidden_layers": 1,
            "num_attention_heads": 2, "num_key_value_heads": 2, "head_dim": 16,
            "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "tie_word_embeddings": true,
            "max_position_embeddings": 256,
        });
        let config =
            stoke_model::ModelConfig::from_json_str(&json.to_string(), Path::new("<test>"))
                .unwrap();
        Transformer::init(config, &Device::Cpu, 1)
            .unwrap()
            .save_with_tokenizer(&dir.join("model"), Some(&tokenizer_dir))
            .unwrap();
    }

    #[test]
    fn prepare_loads_model_tasks_held_out_and_reference() {
        let dir = tempfile::tempdir().unwrap();
        model_folder(dir.path());
        let path = dir.path().join("run.toml");
        std::fs::write(
            &path,
            "[model]\npath = \"model\"\n[tasks]\nkind = \"arithmetic\"\nproblems = 5\n\
             [eval]\nproblems = 3\n[grpo.loss]\nbeta = 0.04\n",
        )
        .unwrap();
        let config = GrpoConfig::load(&path, &[]).unwrap();
        let prepared = prepare(&config, true).unwrap();
        assert_eq!(prepared.tasks.len(), 5);
        assert_eq!(prepared.held_out.len(), 3);
        assert_eq!(prepared.rewards.len(), 1);
        assert!(prepared.reference.is_some(), "beta > 0 loads a reference");
        let task = &prepared.tasks[0];
        assert_eq!(task.id, "arithmetic-train-0");
        assert!(task.reference.answer.is_some());
        // The prompt is the question as one user turn, ready for the assistant's reply.
        let text = prepared.tokenizer.decode(&task.prompt_ids, false).unwrap();
        assert!(text.starts_with("<|im_start|>user\n"), "{text}");
        assert!(text.ends_with("<|im_start|>assistant\n"), "{text}");
        // No held-out question is a training question.
        for held in &prepared.held_out {
            assert!(prepared.tasks.iter().all(|t| t.prompt != held.prompt));
        }

        let without_kl = GrpoConfig::load(&path, &["grpo.loss.beta=0".to_string()]).unwrap();
        assert!(prepare(&without_kl, true).unwrap().reference.is_none());
    }

    #[test]
    fn command_runs_a_tiny_grpo_and_refuses_a_changed_resume() {
        let dir = tempfile::tempdir().unwrap();
        model_folder(dir.path());
        let path = dir.path().join("run.toml");
        std::fs::write(
            &path,
            "[model]\npath = \"model\"\n[tasks]\nkind = \"arithmetic\"\nproblems = 4\n\
             [grpo]\nsteps = 2\nprompts_per_step = 2\ngroup_size = 2\nmax_new_tokens = 6\n\
             mode = \"sync\"\nthreads = 1\nreward_workers = 1\n\
             [eval]\nproblems = 2\nsamples = 2\n[out]\ndir = \"out\"\n",
        )
        .unwrap();
        let args = |sets: &[&str], resume: bool| GrpoArgs {
            config: path.clone(),
            sets: sets.iter().map(|s| s.to_string()).collect(),
            resume,
            quiet: true,
        };
        run_command(args(&[], false)).unwrap();
        let out = dir.path().join("out");
        let records =
            stoke_pipeline::metrics::GrpoMetricsLog::read_all(&out.join("metrics.jsonl")).unwrap();
        let steps = records
            .iter()
            .filter(|r| matches!(r, stoke_pipeline::metrics::GrpoRecord::Step(_)))
            .count();
        assert_eq!(steps, 2);
        assert!(out.join("report.html").is_file());
        // The saved config is the resolved one and loads back equal.
        let saved = GrpoConfig::load(&out.join("config.toml"), &[]).unwrap();
        assert_eq!(saved, GrpoConfig::load(&path, &[]).unwrap());

        let error = run_command(args(&["grpo.group_size=3"], true)).unwrap_err();
        assert!(
            format!("{error:#}").contains("grpo.group_size: 2 -> 3"),
            "{error:#}"
        );
    }

    #[test]
    fn rewards_are_built_in_index_order() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("run.toml");
        std::fs::write(
            &path,
            "[model]\npath = \"m\"\n[rewards.default]\nkind = \"math\"\n[rewards.len]\nkind = \"group_length\"\n",
        )
        .unwrap();
        let config = GrpoConfig::load(&path, &[]).unwrap();
        let specs = build_rewards(&config).unwrap();
        let names: Vec<&str> = specs.iter().map(|s| s.name.as_str()).collect();
        assert_eq!(names, ["default", "len"]);
        assert!(!specs[0].group_level);
        assert!(specs[1].group_level);
    }
}
