//! `stoke rlaif CONFIG.toml [--set key=value]... [--quiet]`: RLAIF / Constitutional AI. A policy
//! answers prompts, a judge model critiques and revises each answer against a principles file,
//! the (revision, answer) pairs are written in `stoke dpo`'s format, DPO trains the policy on
//! them, and the judge rates held-out answers before and after (`stoke_pipeline::rlaif`).
//!
//! ```toml
//! principles = "principles.md"    # one principle per paragraph or list item
//! [policy]                        # who answers: a local folder (served on a loopback port) ...
//! model = "../runs/sft/model"
//! [judge]                         # ... or a server: url = "http://judge:8000", served_model
//! model = "../runs/sft/model"     # (the same folder as the policy: one server for both)
//! [prompts]
//! file = "prompts.jsonl"          # {"prompt": "..."} per line
//! held_out = 16                   # the last 16 are rated before/after, never trained on
//! [sampling]
//! temperature = 0.8               # the policy's; max_tokens = 192
//! judge_max_tokens = 256          # critiques, revisions and verdicts; judge_temperature = 0
//! judge_check = true              # keep a pair only if the judge prefers the revision both ways
//! reading = "logprobs"            # ratings/comparisons from the judge's token probabilities
//!                                 # (G-Eval); "verdict": a `Score: N` / `Verdict: A` last line
//! concurrency = 4
//! seed = 0
//! [dpo]                           # a `stoke dpo` config (or dpo = "dpo.toml"); left out: pairs only
//! training = { steps = 40 }
//! [out]
//! dir = "../runs/rlaif"           # default runs/<config stem> next to the file
//! ```
//!
//! The recipe owns `[dpo]`'s `output_dir` (`OUT/dpo`) and `data.train` (`OUT/pairs.jsonl`), and
//! its `model.path` defaults to the policy's folder. Outputs: `OUT/rlaif.jsonl` (every prompt's
//! record: principle, answer, critique, revision, verdicts, kept or why not), `OUT/pairs.jsonl`,
//! `OUT/dpo/` and `OUT/rlaif.json` (the counts and the judge's mean rating of held-out answers
//! before and after, with unreadable ratings counted). A rerun with pairs already written goes
//! straight to the DPO, which continues from its newest checkpoint; pairs made with other
//! principles, prompts, models or `[sampling]` settings (`OUT/rlaif-settings.json`) are refused.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context, bail};
use clap::Args;
use serde::{Deserialize, Serialize};
use stoke_pipeline::config::OutSection;
use stoke_pipeline::rlaif::{
    ChatParams, ChatServer, JudgeReading, Principles, RlaifRecord, RlaifReport, RlaifSettings,
    critique_and_revise, pair_line, rate, read_prompts, write_lines,
};
use stoke_serve::{RunningServer, ServeConfig};
use stoke_train::preference::run::{PreferenceFile, run_preference_with};
use stoke_train::run::RunOptions;

use super::rft::load_stage;
use super::stage_config::{StageEntry, StageTable, path_value};

#[derive(Args)]
pub struct RlaifArgs {
    /// The recipe's TOML config (relative paths inside it are relative to its folder).
    config: PathBuf,
    /// Override a key of the config, e.g. `--set sampling.concurrency=8` (repeatable).
    #[arg(long = "set", value_name = "KEY=VALUE")]
    sets: Vec<String>,
    /// No progress output.
    #[arg(long)]
    quiet: bool,
}

#[derive(Clone, Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct RlaifFile {
    principles: PathBuf,
    policy: EndpointSection,
    judge: EndpointSection,
    prompts: PromptsSection,
    #[serde(default)]
    sampling: SamplingSection,
    #[serde(default)]
    dpo: Option<StageEntry>,
    #[serde(default)]
    out: OutSection,
}

/// A model to chat with: a local folder served on a loopback port, or a server.
#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct EndpointSection {
    model: Option<PathBuf>,
    url: Option<String>,
    served_model: Option<String>,
    #[serde(default = "default_timeout_s")]
    timeout_s: f64,
}

fn default_timeout_s() -> f64 {
    600.0
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields)]
struct PromptsSection {
    file: PathBuf,
    #[serde(default)]
    held_out: usize,
}

#[derive(Clone, Debug, Deserialize, Serialize)]
#[serde(deny_unknown_fields, default)]
struct SamplingSection {
    temperature: f64,
    max_tokens: usize,
    judge_max_tokens: usize,
    judge_temperature: f64,
    judge_check: bool,
    /// `logprobs` (default) or `verdict`: how ratings and comparisons are read.
    reading: JudgeReading,
    concurrency: usize,
    seed: u64,
}

impl Default for SamplingSection {
    fn default() -> Self {
        SamplingSection {
            temperature: 0.8,
            max_tokens: 192,
            judge_max_tokens: 256,
            judge_temperature: 0.0,
            judge_check: true,
            reading: JudgeReading::Logprobs,
            concurrency: 4,
            seed: 0,
        }
    }
}

/// `OUT/rlaif.json`.
#[derive(Debug, Serialize)]
struct RlaifSummary {
    report: RlaifReport,
    held_out: usize,
    before: Option<Rating>,
    after: Option<Rating>,
    dpo_model: Option<PathBuf>,
}

/// The judge's ratings of the held-out answers of one model.
#[derive(Debug, Clone, Serialize)]
struct Rating {
    model: String,
    mean: Option<f64>,
    rated: usize,
    unreadable: usize,
    failed: usize,
}

/// What the recipe runs, resolved.
struct Plan {
    file: RlaifFile,
    out: PathBuf,
    dpo: Option<StageTable>,
    origin: String,
}

impl Plan {
    fn load(args: &RlaifArgs) -> anyhow::Result<Plan> {
        let (stage, stem) = load_stage(&args.config, &args.sets, "rlaif")?;
        let origin = stage.origin.clone();
        let base = stage.base.clone();
        let mut file: RlaifFile = toml::Value::Table(stage.table)
            .try_into()
            .with_context(|| format!("config {origin}"))?;
        let absolute = |p: &Path| {
            if p.is_relative() {
                base.join(p)
            } else {
                p.to_path_buf()
            }
        };
        file.principles = absolute(&file.principles);
        file.prompts.file = absolute(&file.prompts.file);
        for (name, side) in [("policy", &mut file.policy), ("judge", &mut file.judge)] {
            match (&side.model, &side.url) {
                (Some(_), Some(_)) | (None, None) => bail!(
                    "config {origin}: [{name}] needs exactly one of `model` (a local folder) and \
                     `url` (a server)"
                ),
                _ => {}
            }
            if let Some(model) = side.model.as_mut() {
                *model = absolute(model);
            }
            if !(side.timeout_s.is_finite() && side.timeout_s > 0.0) {
                bail!("config {origin}: [{name}] timeout_s must be a number of seconds > 0");
            }
        }
        let s = &file.sampling;
        if s.concurrency == 0 || s.max_tokens == 0 || s.judge_max_tokens == 0 {
            bail!(
                "config {origin}: [sampling] concurrency, max_tokens and judge_max_tokens must be at least 1"
            );
        }
        if !(s.temperature >= 0.0 && s.judge_temperature >= 0.0) {
            bail!("config {origin}: [sampling] temperatures must be >= 0");
        }
        let out = match &file.out.dir {
            Some(dir) => absolute(dir),
            None => base.join("runs").join(&stem),
        };
        let dpo = match file.dpo.clone() {
            None => None,
            Some(entry) => {
                let mut stage = StageTable::load(entry, "dpo", &args.config, &base)?;
                stage.set_owned(
                    "output_dir",
                    path_value(&out.join("dpo")),
                    "the recipe writes the DPO run to OUT/dpo",
                )?;
                stage.set_owned(
                    "data.train",
                    path_value(&out.join("pairs.jsonl")),
                    "the recipe trains on the pairs it writes",
                )?;
                match &file.policy.model {
                    Some(model) => stage.set_default("model.path", path_value(model))?,
                    None if !stage.has_any(&["model.path"]) => bail!(
                        "config {origin}: the policy is a server, so [dpo.model] path must name \
                         the folder to train"
                    ),
                    None => {}
                }
                // Checked now, so a typo does not surface after the sampling.
                PreferenceFile::from_table(stage.table.clone(), &stage.origin, &stage.base, &[])
                    .with_context(|| stage.origin.clone())?;
                Some(stage)
            }
        };
        Ok(Plan {
            file,
            out,
            dpo,
            origin,
        })
    }
}

/// The servers a run talks to, with the loopback ones it started (stopped on drop).
struct Servers {
    policy: ChatServer,
    judge: ChatServer,
    _started: Vec<RunningServer>,
}

fn start_local(model: &Path, quiet: bool) -> anyhow::Result<RunningServer> {
    let mut config = ServeConfig::new(model);
    config.port = 0;
    config.served_model_name = Some("local".into());
    config.max_num_seqs = 16;
    config.kv_cache_bytes = 1 << 30;
    let server = RunningServer::start(config)
        .map_err(|e| anyhow::anyhow!("serving {}: {e}", model.display()))?;
    if !quiet {
        eprintln!("rlaif: serving {} at {}", model.display(), server.url());
    }
    Ok(server)
}

fn connect(
    section: &EndpointSection,
    started: &mut Vec<(PathBuf, RunningServer)>,
    quiet: bool,
) -> anyhow::Result<ChatServer> {
    let timeout = Duration::from_secs_f64(section.timeout_s);
    match (&section.model, &section.url) {
        (Some(model), _) => {
            if !started.iter().any(|(m, _)| m == model) {
                started.push((model.clone(), start_local(model, quiet)?));
            }
            let (_, server) = started
                .iter()
                .find(|(m, _)| m == model)
                .expect("started above");
            ChatServer::connect(&server.url(), Some("local"), timeout).map_err(anyhow::Error::msg)
        }
        (None, Some(url)) => ChatServer::connect(url, section.served_model.as_deref(), timeout)
            .map_err(anyhow::Error::msg),
        (None, None) => unreachable!("checked in Plan::load"),
    }
}

impl Servers {
    fn start(
        policy: &EndpointSection,
        judge: &EndpointSection,
        quiet: bool,
    ) -> anyhow::Result<Servers> {
        let mut started = Vec::new();
        let policy = connect(policy, &mut started, quiet).context("[policy]")?;
        let judge = connect(judge, &mut started, quiet).context("[judge]")?;
        Ok(Servers {
            policy,
            judge,
            _started: started.into_iter().map(|(_, s)| s).collect(),
        })
    }
}

/// The policy's greedy answers to `prompts`, rated by the judge.
fn rate_answers(
    policy: &ChatServer,
    judge: &ChatServer,
    principles: &Principles,
    prompts: &[String],
    sampling: &SamplingSection,
    label: &str,
) -> Rating {
    let greedy = ChatParams {
        temperature: 0.0,
        max_tokens: sampling.max_tokens,
        seed: Some(sampling.seed),
    };
    let judge_params = ChatParams {
        temperature: sampling.judge_temperature,
        max_tokens: sampling.judge_max_tokens,
        seed: Some(sampling.seed),
    };
    let results: Vec<Result<Option<f64>, String>> = std::thread::scope(|scope| {
        let chunks: Vec<&[String]> = prompts
            .chunks(prompts.len().div_ceil(sampling.concurrency).max(1))
            .collect();
        let handles: Vec<_> = chunks
            .into_iter()
            .map(|chunk| {
                scope.spawn(move || {
                    chunk
                        .iter()
                        .map(|prompt| {
                            let answer = policy.chat(
                                &[serde_json::json!({"role": "user", "content": prompt})],
                                greedy,
                            )?;
                            rate(
                                judge,
                                principles,
                                prompt,
                                &answer,
                                judge_params,
                                sampling.reading,
                            )
                        })
                        .collect::<Vec<_>>()
                })
            })
            .collect();
        handles
            .into_iter()
            .flat_map(|h| h.join().unwrap_or_default())
            .collect()
    });
    let scores: Vec<f64> = results
        .iter()
        .filter_map(|r| r.clone().ok().flatten())
        .collect();
    Rating {
        model: label.to_string(),
        mean: (!scores.is_empty()).then(|| scores.iter().sum::<f64>() / scores.len() as f64),
        rated: scores.len(),
        unreadable: results.iter().filter(|r| matches!(r, Ok(None))).count(),
        failed: results.iter().filter(|r| r.is_err()).count(),
    }
}

fn show(rating: &Rating) -> String {
    format!(
        "{}: mean judge rating {} over {} answers ({} unreadable, {} failed)",
        rating.model,
        rating.mean.map_or("-".into(), |m| format!("{m:.2}")),
        rating.rated,
        rating.unreadable,
        rating.failed
    )
}

pub fn run_command(args: RlaifArgs) -> anyhow::Result<()> {
    let plan = Plan::load(&args)?;
    let quiet = args.quiet;
    let file = &plan.file;
    let principles = Principles::load(&file.principles).map_err(anyhow::Error::msg)?;
    let prompts = read_prompts(&file.prompts.file).map_err(anyhow::Error::msg)?;
    if file.prompts.held_out >= prompts.len() {
        bail!(
            "config {}: [prompts] held_out = {} leaves none of the {} prompts to train on",
            plan.origin,
            file.prompts.held_out,
            prompts.len()
        );
    }
    let (train, held_out) = prompts.split_at(prompts.len() - file.prompts.held_out);
    std::fs::create_dir_all(&plan.out)
        .with_context(|| format!("creating {}", plan.out.display()))?;
    let pairs_path = plan.out.join("pairs.jsonl");
    let records_path = plan.out.join("rlaif.jsonl");
    let s = &file.sampling;

    let mut summary = RlaifSummary {
        report: RlaifReport::default(),
        held_out: held_out.len(),
        before: None,
        after: None,
        dpo_model: None,
    };
    {
        let servers = Servers::start(&file.policy, &file.judge, quiet)?;
        if !held_out.is_empty() {
            let before = rate_answers(
                &servers.policy,
                &servers.judge,
                &principles,
                held_out,
                s,
                "policy",
            );
            println!("before: {}", show(&before));
            summary.before = Some(before);
        }
        // What the pairs depend on: a rerun reuses them only when this is unchanged.
        let made_with = serde_json::json!({
            "principles": std::fs::read_to_string(&file.principles).unwrap_or_default(),
            "prompts": train,
            "policy": file.policy,
            "judge": file.judge,
            "sampling": file.sampling,
        });
        let settings_path = plan.out.join("rlaif-settings.json");
        if pairs_path.exists() && records_path.exists() {
            let saved: Option<serde_json::Value> = std::fs::read_to_string(&settings_path)
                .ok()
                .and_then(|t| serde_json::from_str(&t).ok());
            if saved.as_ref() != Some(&made_with) {
                bail!(
                    "{} was written with other principles, prompts, models or [sampling] \
                     settings than this config's; remove it (and pairs.jsonl) to sample again, \
                     or use another [out] dir",
                    records_path.display()
                );
            }
            let text = std::fs::read_to_string(&records_path)?;
            let records: Vec<RlaifRecord> = text
                .lines()
                .map(serde_json::from_str)
                .collect::<Result<_, _>>()
                .with_context(|| format!("{}", records_path.display()))?;
            summary.report = RlaifReport::from_records(&records);
            println!("pairs already written: {}", pairs_path.display());
        } else {
            let settings = RlaifSettings {
                temperature: s.temperature,
                max_tokens: s.max_tokens,
                judge_max_tokens: s.judge_max_tokens,
                judge_temperature: s.judge_temperature,
                seed: s.seed,
                concurrency: s.concurrency,
                judge_check: s.judge_check,
                reading: s.reading,
            };
            let progress = |done: usize, total: usize| {
                if !quiet && (done.is_multiple_of(8) || done == total) {
                    eprintln!("rlaif: {done}/{total} prompts critiqued and revised");
                }
            };
            let (records, report) = critique_and_revise(
                &servers.policy,
                &servers.judge,
                &principles,
                train,
                &settings,
                &progress,
            );
            write_lines(
                &records_path,
                records
                    .iter()
                    .map(|r| serde_json::to_string(r).unwrap_or_default()),
            )
            .map_err(anyhow::Error::msg)?;
            write_lines(&pairs_path, records.iter().filter_map(pair_line))
                .map_err(anyhow::Error::msg)?;
            std::fs::write(&settings_path, serde_json::to_string_pretty(&made_with)?)
                .with_context(|| format!("writing {}", settings_path.display()))?;
            println!("rlaif: {}", report.summary());
            summary.report = report;
        }
    }
    if summary.report.pairs == 0 {
        let first_failure = std::fs::read_to_string(&records_path)
            .ok()
            .and_then(|text| {
                text.lines()
                    .filter_map(|l| serde_json::from_str::<RlaifRecord>(l).ok())
                    .find_map(|r| r.dropped.filter(|d| d.starts_with("failed")))
            })
            .map_or(String::new(), |f| format!("; the first failure: {f}"));
        bail!(
            "no preference pair was kept ({}){first_failure}; see {}",
            summary.report.summary(),
            records_path.display()
        );
    }

    if let Some(stage) = &plan.dpo {
        let dpo = PreferenceFile::from_table(stage.table.clone(), &stage.origin, &stage.base, &[])
            .with_context(|| stage.origin.clone())?;
        let trained = run_preference_with(
            &dpo,
            &RunOptions {
                resume: true,
                quiet,
                ..RunOptions::default()
            },
        )?;
        println!("dpo: {} steps on {} pairs", trained.steps, trained.pairs);
        let model = plan.out.join("dpo").join("model");
        if !held_out.is_empty() {
            let after_policy = EndpointSection {
                model: Some(model.clone()),
                url: None,
                served_model: None,
                timeout_s: file.policy.timeout_s,
            };
            let servers = Servers::start(&after_policy, &file.judge, quiet)?;
            let after = rate_answers(
                &servers.policy,
                &servers.judge,
                &principles,
                held_out,
                s,
                "after dpo",
            );
            println!("after: {}", show(&after));
            summary.after = Some(after);
        }
        summary.dpo_model = Some(model);
    }
    let json = serde_json::to_string_pretty(&summary)?;
    std::fs::write(plan.out.join("rlaif.json"), json)
        .with_context(|| format!("writing {}", plan.out.join("rlaif.json").display()))?;
    println!("report: {}", plan.out.join("rlaif.json").display());
    Ok(())
}
