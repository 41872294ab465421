//! `stoke rft CONFIG.toml [--set key=value]... [--quiet]`: rejection-sampling fine-tuning. Sample
//! `k` completions per task from a model, keep the verified-correct ones
//! (`stoke_pipeline::rejection`), write them as chat JSONL and fine-tune on them with
//! `stoke train`'s SFT.
//!
//! ```toml
//! [model]
//! path = "../runs/speedrun-quick/model"  # HF folder with tokenizer files (chat template needed)
//! [tasks]                                # as in `stoke grpo` (jsonl or arithmetic)
//! kind = "arithmetic"
//! problems = 200
//! [rewards.default]                      # as in `stoke grpo`; default exact_match gsm8k
//! kind = "exact_match"
//! [sampling]
//! samples = 8            # k per task (default 8)
//! keep_per_prompt = 4    # distinct correct completions kept per task (default 4)
//! temperature = 1.0      # (default 1.0; must be > 0), top_p (1.0), top_k (0 = off)
//! max_new_tokens = 256   # (default 256)
//! seed = 0               # sampling streams; also the default arithmetic task seed
//! keep_truncated = false # keep correct completions that hit max_new_tokens (default false)
//! verify = true          # keep only verified-correct samples; false keeps every distinct one
//!                        # (offline distillation: [model] path is the teacher that samples and
//!                        # [sft.model] pretrained the student that trains on its samples)
//! reward_workers = 2     # (default: the machine's cores), reward_timeout_s (30)
//! [sft]                  # a `stoke train` config (or: sft = "sft.toml")
//! data = { seq_len = 256, micro_batch_size = 8 }
//! training = { steps = 100 }
//! [out]
//! dir = "../runs/rft"    # default runs/<config stem> next to the file
//! ```
//!
//! The `[sft]` config's `output_dir` (`OUT/sft`), `data.train` (`OUT/rft.jsonl`) are the
//! recipe's (see `stage_config`); `data.kind` defaults to "chat" (the only kind allowed) and the
//! model to `[model] path` (the policy that sampled). `[tasks]`/`[rewards]` and `[model]` are
//! `stoke grpo`'s file types, resolved and loaded by its code.
//!
//! Outputs: `OUT/rft.jsonl` (the kept completions), `OUT/pairs.jsonl` (the kept completions
//! paired with wrong samples of the same task, with their token ids: `stoke dpo` data),
//! `OUT/rejection.json` (the counts),
//! `OUT/sft/` (the SFT run; the final model in `OUT/sft/model`). A rerun samples again (the
//! samples depend only on model, tasks and settings, so the file is the same) and continues the
//! SFT from its newest checkpoint.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use stoke_pipeline::config::{
    CheckpointSection, EvalSection, GrpoConfig, GrpoConfigFile, GrpoSection, ModelSection,
    OutSection, ScheduleSection, TaskSourceFile, TrainingSection,
};
use stoke_pipeline::rejection::{
    RejectionReport, RejectionResult, RejectionSettings, sample_and_filter, write_chat_jsonl,
    write_pairs_jsonl,
};
use stoke_pipeline::reward::RewardPool;
use stoke_reward::RewardConfig;
use stoke_train::config::{ConfigFile, DataSource, TrainConfig, apply_overrides};
use stoke_train::run::{RunOptions, RunSummary};

use super::grpo::prepare;
use super::stage_config::{StageEntry, StageTable, path_value};

const DEFAULT_SAMPLES: usize = 8;
const DEFAULT_KEEP_PER_PROMPT: usize = 4;
const DEFAULT_MAX_NEW_TOKENS: usize = 256;

#[derive(Args)]
pub struct RftArgs {
    /// The recipe's TOML config (relative paths inside it are relative to its folder).
    config: PathBuf,
    /// Override a key of the config, e.g. `--set sampling.samples=4` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

/// The file layer (every table rejects unknown keys).
#[derive(Clone, Debug, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RftConfigFile {
    /// Required (in `stoke r1`: defaults to the previous stage's model).
    #[serde(default)]
    pub model: Option<ModelSection>,
    #[serde(default)]
    pub tasks: Option<TaskSourceFile>,
    #[serde(default)]
    pub rewards: BTreeMap<String, RewardConfig>,
    #[serde(default)]
    pub sampling: SamplingSection,
    pub sft: StageEntry,
    #[serde(default)]
    pub out: OutSection,
}

/// `[sampling]`: how to sample and what to keep (defaults in the module doc).
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SamplingSection {
    pub samples: Option<usize>,
    pub keep_per_prompt: Option<usize>,
    pub temperature: Option<f64>,
    pub top_p: Option<f64>,
    pub top_k: Option<usize>,
    pub max_new_tokens: Option<usize>,
    pub seed: Option<u64>,
    pub keep_truncated: Option<bool>,
    /// Keep only verified-correct samples (default true); false: sequence-level distillation,
    /// every distinct sample kept.
    pub verify: Option<bool>,
    pub reward_workers: Option<usize>,
    pub reward_timeout_s: Option<f64>,
}

/// A resolved recipe: nothing loaded yet.
#[derive(Clone, Debug)]
pub struct RftPlan {
    /// Model, tasks and rewards (and the reward pool's size and timeout) in `stoke grpo`'s
    /// resolved form; its held-out set is unused (none is drawn).
    pub source: GrpoConfig,
    pub settings: RejectionSettings,
    /// The `stoke train` config, with the recipe's keys set.
    pub sft: StageTable,
    pub out_dir: PathBuf,
}

/// What a finished recipe produced.
#[derive(Clone, Debug)]
pub struct RftSummary {
    pub report: RejectionReport,
    pub jsonl: PathBuf,
    pub sft: RunSummary,
}

impl RftPlan {
    /// The final model of a recipe writing to `out_dir`.
    pub fn output_model(out_dir: &Path) -> PathBuf {
        out_dir.join("sft").join("model")
    }

    /// Resolves a recipe table (`stem` names the default output folder `base/runs/<stem>`).
    pub fn from_stage(stage: StageTable, stem: &str) -> anyhow::Result<RftPlan> {
        let file: RftConfigFile = toml::Value::Table(stage.table.clone())
            .try_into()
            .with_context(|| stage.origin.clone())?;
        let Some(model) = file.model else {
            bail!("{}: `model.path` is required", stage.origin);
        };
        if model.reference.is_some() {
            bail!(
                "{}: `model.reference`: rejection sampling has no reference model",
                stage.origin
            );
        }
        let (source, settings) = sampling_source(
            model,
            file.tasks,
            file.rewards,
            &file.sampling,
            file.out,
            &stage,
            stem,
            true,
        )?;
        let out_dir = source.out_dir.clone();

        let mut sft = StageTable::load(file.sft, "sft", Path::new(&stage.origin), &stage.base)?;
        // `[sft]` is `stoke train`'s config: its renamed keys move to their new names here too.
        stoke_train::config::keys::migrate_renamed_with_warnings(
            &mut sft.table,
            stoke_train::config::RENAMED,
            &sft.origin,
        )?;
        sft.set_owned(
            "output_dir",
            path_value(&out_dir.join("sft")),
            "the recipe's OUT/sft",
        )?;
        sft.set_owned(
            "data.train",
            toml::Value::Array(vec![path_value(&out_dir.join("rft.jsonl"))]),
            "the sampled OUT/rft.jsonl",
        )?;
        sft.set_default("data.kind", toml::Value::String("chat".into()))?;
        if !sft.has_any(&["model.preset", "model.config", "model.path"]) {
            sft.set_default("model.path", path_value(&source.model))?;
        }
        // The file layer now, so a typo in [sft] is named before any sampling.
        ConfigFile::from_table(sft.table.clone(), &sft.origin)?;
        Ok(RftPlan {
            source,
            settings,
            sft,
            out_dir,
        })
    }
}

/// The sampling half of a recipe (`stoke rft`, `stoke distill generate`): model, tasks and
/// rewards in `stoke grpo`'s resolved form (no held-out set), and the sampling settings;
/// `verify_default` is `[sampling] verify` when the file does not say.
#[allow(clippy::too_many_arguments)]
pub fn sampling_source(
    model: ModelSection,
    tasks: Option<TaskSourceFile>,
    rewards: BTreeMap<String, RewardConfig>,
    s: &SamplingSection,
    out: OutSection,
    stage: &StageTable,
    stem: &str,
    verify_default: bool,
) -> anyhow::Result<(GrpoConfig, RejectionSettings)> {
    let seed = s.seed.unwrap_or(0);
    let source = GrpoConfigFile {
        output_dir: out.dir,
        model,
        tasks,
        held_out: None,
        rewards,
        grpo: GrpoSection {
            reward_workers: s.reward_workers,
            reward_timeout_s: s.reward_timeout_s,
            ..GrpoSection::default()
        },
        training: TrainingSection {
            seed: Some(seed),
            ..TrainingSection::default()
        },
        optimizer: Default::default(),
        schedule: ScheduleSection::default(),
        eval: EvalSection::default(),
        checkpoint: CheckpointSection::default(),
        ptx: None,
        lora: None,
        rollout: None,
        reward: None,
        reference: None,
        environment: None,
    };
    let mut source =
        GrpoConfig::from_file(source, &stage.base, stem).with_context(|| stage.origin.clone())?;
    source.held_out = None;
    let samples = s.samples.unwrap_or(DEFAULT_SAMPLES);
    let settings = RejectionSettings {
        samples_per_prompt: samples,
        keep_per_prompt: s.keep_per_prompt.unwrap_or(if verify_default {
            DEFAULT_KEEP_PER_PROMPT
        } else {
            samples
        }),
        temperature: s.temperature.unwrap_or(1.0) as f32,
        top_p: s.top_p.unwrap_or(1.0) as f32,
        top_k: s.top_k.filter(|&k| k > 0),
        max_new_tokens: s.max_new_tokens.unwrap_or(DEFAULT_MAX_NEW_TOKENS),
        seed,
        keep_truncated: s.keep_truncated.unwrap_or(false),
        verify: s.verify.unwrap_or(verify_default),
    };
    settings.validate().with_context(|| stage.origin.clone())?;
    Ok((source, settings))
}

/// Loads the model, tasks and rewards of `source` and samples and filters every task
/// (`stoke_pipeline::rejection::sample_and_filter`), with progress on stderr unless `quiet`.
pub fn sample(
    source: &GrpoConfig,
    settings: &RejectionSettings,
    quiet: bool,
) -> anyhow::Result<RejectionResult> {
    let prepared = prepare(source, quiet)?;
    let pool = &source.settings;
    let rewards = RewardPool::new(prepared.rewards, pool.reward_workers, pool.reward_timeout)?;
    let total = prepared.tasks.len();
    let mut progress = |report: &RejectionReport| {
        if !quiet {
            eprintln!(
                "sampling: {}/{total} prompts, {} kept ({:.1}% of samples), {:.1} s",
                report.prompts,
                report.kept,
                100.0 * report.acceptance_rate(),
                report.seconds
            );
        }
    };
    let result = sample_and_filter(
        &prepared.policy,
        &prepared.tokenizer,
        &prepared.tasks,
        &rewards,
        settings,
        &mut progress,
    )?;
    rewards.shutdown();
    if result.report.prompts_with_other_context > 0 {
        // Shown in quiet runs too: the lines' messages differ from what the model was prompted
        // with (their token ids do not).
        eprintln!(
            "warning: {} of {} tasks are prompted with more than one user message (a system \
             message or earlier turns); the `messages` of their lines hold only the last user \
             message (their `prompt_ids`, which SFT trains on, hold everything)",
            result.report.prompts_with_other_context, result.report.prompts
        );
    }
    Ok(result)
}

/// The `stoke train` config of a stage table (resolved: its model folder must exist).
pub fn train_config(stage: &StageTable) -> anyhow::Result<TrainConfig> {
    let file = ConfigFile::from_table(stage.table.clone(), &stage.origin)?;
    TrainConfig::from_file(file, &stage.base).with_context(|| stage.origin.clone())
}

/// A recipe file with `--set` overrides applied, as a stage table (relative paths against the
/// file's folder), and its stem (`default_stem` when it has none).
pub fn load_stage(
    config: &Path,
    sets: &[String],
    default_stem: &str,
) -> anyhow::Result<(StageTable, String)> {
    let text =
        std::fs::read_to_string(config).with_context(|| format!("reading {}", config.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("config {}", config.display()))?;
    apply_overrides(&mut table, sets)?;
    let base = config
        .parent()
        .filter(|p| !p.as_os_str().is_empty())
        .unwrap_or(Path::new("."));
    let stem = config.file_stem().map_or_else(
        || default_stem.to_string(),
        |s| s.to_string_lossy().into_owned(),
    );
    let stage = StageTable {
        table,
        base: std::path::absolute(base)?,
        origin: config.display().to_string(),
        from_file: true,
    };
    Ok((stage, stem))
}

pub fn run_command(args: RftArgs) -> anyhow::Result<()> {
    let (stage, stem) = load_stage(&args.config, &args.sets, "rft")?;
    let plan = RftPlan::from_stage(stage, &stem)?;
    let summary = run(&plan, args.quiet)?;
    println!("rejection sampling: {}", summary.report.summary());
    println!("sft data: {}", summary.jsonl.display());
    if let Some(loss) = summary.sft.final_loss {
        println!(
            "sft: {} steps, final training loss {loss:.4}",
            summary.sft.steps
        );
    }
    println!("model: {}", summary.sft.model_dir.display());
    Ok(())
}

/// Samples, filters, writes `OUT/rft.jsonl` and `OUT/rejection.json`, then runs the SFT.
pub fn run(plan: &RftPlan, quiet: bool) -> anyhow::Result<RftSummary> {
    std::fs::create_dir_all(&plan.out_dir)
        .with_context(|| format!("creating {}", plan.out_dir.display()))?;
    // Resolved before sampling: a bad SFT config fails in seconds, not after the sampling.
    let train = train_config(&plan.sft)?;
    if !matches!(train.data.source, DataSource::Chat { .. }) {
        bail!(
            "{}: `data.kind` must be \"chat\" (the SFT trains on the sampled conversations)",
            plan.sft.origin
        );
    }
    let result = sample(&plan.source, &plan.settings, quiet)?;
    let report_path = plan.out_dir.join("rejection.json");
    std::fs::write(&report_path, serde_json::to_string_pretty(&result.report)?)
        .with_context(|| format!("writing {}", report_path.display()))?;
    if result.kept.is_empty() {
        bail!(
            "rejection sampling kept no completion ({}); nothing to fine-tune on (more samples, \
             a higher temperature or easier tasks may help)",
            result.report.summary()
        );
    }
    let jsonl = plan.out_dir.join("rft.jsonl");
    write_chat_jsonl(&jsonl, &result.kept)?;
    // The same samples as preference pairs (verified-correct vs wrong) for `stoke dpo`.
    write_pairs_jsonl(&plan.out_dir.join("pairs.jsonl"), &result.pairs)?;
    let options = RunOptions {
        // Continues an interrupted SFT from its newest checkpoint; starts fresh without one.
        resume: true,
        quiet,
        ..RunOptions::default()
    };
    let sft = stoke_train::run::run(train, options)?;
    Ok(RftSummary {
        report: result.report,
        jsonl,
        sft,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn load(path: &Path) -> anyhow::Result<RftPlan> {
        let table: toml::Table = toml::from_str(&std::fs::read_to_string(path)?)?;
        RftPlan::from_stage(
            StageTable {
                table,
                base: path.parent().unwrap().to_path_buf(),
                origin: path.display().to_string(),
                from_file: true,
            },
            "rft",
        )
    }

    #[test]
    fn the_shipped_config_resolves_with_the_recipe_keys_set() {
        let path = Path::new(env!("CARGO_MANIFEST_DIR")).join("../../configs/rft-tiny.toml");
        let plan = load(&path).unwrap();
        assert_eq!(plan.settings.samples_per_prompt, 8);
        assert_eq!(plan.settings.keep_per_prompt, 2);
        assert!(plan.out_dir.ends_with("runs/rft-tiny"));
        let sft = &plan.sft.table;
        assert_eq!(
            sft["output_dir"].as_str().map(PathBuf::from),
            Some(plan.out_dir.join("sft"))
        );
        assert_eq!(sft["data"]["kind"].as_str(), Some("chat"));
        assert_eq!(
            sft["model"]["path"].as_str().map(PathBuf::from),
            Some(plan.source.model.clone())
        );
        assert!(plan.source.held_out.is_none());
    }

    #[test]
    fn sampling_mistakes_are_named() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rft.toml");
        let write = |extra: &str| {
            std::fs::write(
                &path,
                format!(
                    "[model]\npath = \"m\"\n[sampling]\n{extra}\n[sft]\n\
                     data = {{ seq_len = 64, micro_batch_size = 2 }}\ntraining = {{ steps = 1 }}\n"
                ),
            )
            .unwrap();
        };
        write("keep_per_prompt = 0");
        let error = format!("{:#}", load(&path).err().unwrap());
        assert!(error.contains("sampling.keep_per_prompt"), "{error}");
        write("sample = 3");
        let error = format!("{:#}", load(&path).err().unwrap());
        assert!(error.contains("sample"), "{error}");
    }

    #[test]
    fn an_inline_sft_may_not_name_its_data() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("rft.toml");
        std::fs::write(
            &path,
            "[model]\npath = \"m\"\n[sft]\ntraining = { steps = 1 }\n\
             data = { seq_len = 64, micro_batch_size = 2, train = [\"x.jsonl\"] }\n",
        )
        .unwrap();
        let error = format!("{:#}", load(&path).err().unwrap());
        assert!(error.contains("`data.train`"), "{error}");
    }
}
