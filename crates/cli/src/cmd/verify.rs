//! `stoke verify`: scores a JSONL file of completions offline with one reward function and
//! writes each line back with `reward`, `outcome` and `details` added.
//!
//! Input lines are JSON objects with `completion` plus the fields the reward kind reads
//! (`answer`, `tests` + `entry_point` + `prompt`, `cases`, `schema`, `constraints`,
//! `completion_tokens`, `correct`; see the README's "Rewards" section). Other fields pass
//! through unchanged. A malformed line is reported on stderr with its line number, counted and
//! skipped; the run never stops on one bad record.
//!
//! Pure rewards are scored on rayon's pool (`--threads`); rewards that run code block a thread
//! per program, so they get a pool sized for processes (twice the sandbox's workers) and the
//! sandbox admits `workers` programs at a time. Group-level rewards (`group_length`, composites
//! holding one) score the samples sharing a `--group-by` value together, so they read the whole
//! file; the other kinds stream it in chunks of `CHUNK_LINES` lines, in order.

use std::collections::HashMap;
use std::io::{BufRead, BufReader, BufWriter, Write};
use std::path::{Path, PathBuf};
use std::time::Instant;

use anyhow::{Context, bail};
use clap::{Args, ValueEnum};
use rayon::prelude::*;
use serde_json::{Map, Value};
use stoke_reward::instructions::Constraint;
use stoke_reward::math::Explanation;
use stoke_reward::{
    IoCase, Reference, Reward, RewardConfig, RewardInput, RewardKind, RewardOutcome, RewardStats,
    Verifier,
};
use stoke_sandbox::{IsolationLevel, Sandbox, SandboxConfigFile};

#[derive(Clone, Copy, ValueEnum)]
enum LevelArg {
    Basic,
    Confined,
    Full,
}

#[derive(Args)]
pub struct VerifyArgs {
    /// Reward kind: math, exact_match, unit_tests, stdio_tests, format_regex, tag_structure,
    /// json_schema, overlong, group_length, cosine_length, repetition, instructions, composite.
    #[arg(long)]
    reward: String,
    /// TOML file with the reward's options (the kind's fields; `kind` may be omitted).
    #[arg(long)]
    config: Option<PathBuf>,
    /// Input JSONL.
    #[arg(long)]
    input: PathBuf,
    /// Output JSONL (`-` for stdout).
    #[arg(long)]
    output: PathBuf,
    /// Threads for pure rewards (default: all cores).
    #[arg(long)]
    threads: Option<usize>,
    /// TOML file with sandbox limits (the `[sandbox]` fields) for code rewards.
    #[arg(long)]
    sandbox_config: Option<PathBuf>,
    /// Refuse to run code below this isolation level (overrides the sandbox config).
    #[arg(long, value_enum)]
    min_isolation: Option<LevelArg>,
    /// Field whose value groups samples for group-level rewards.
    #[arg(long, default_value = "prompt")]
    group_by: String,
    /// Math reward only: print, for each line, the extracted answer, where it was found, the
    /// normalized gold and prediction and the rule that decided (stderr), and add them to the
    /// output line as `explain`.
    #[arg(long)]
    explain: bool,
}

/// One parsed input line.
struct Sample {
    line: usize,
    object: Map<String, Value>,
    prompt: String,
    completion: String,
    reference: Reference,
    completion_tokens: Option<usize>,
    correct: Option<bool>,
}

impl Sample {
    fn input(&self) -> RewardInput<'_> {
        RewardInput {
            prompt: &self.prompt,
            completion: &self.completion,
            reference: &self.reference,
            completion_tokens: self.completion_tokens,
            correct: self.correct,
        }
    }
}

fn load_reward_config(kind: RewardKind, path: Option<&Path>) -> anyhow::Result<RewardConfig> {
    let Some(path) = path else {
        return Ok(RewardConfig::default_for(kind)?);
    };
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let mut table: toml::Table =
        toml::from_str(&text).with_context(|| format!("parsing {}", path.display()))?;
    match table.get("kind") {
        None => {
            table.insert("kind".into(), toml::Value::String(kind.name().into()));
        }
        Some(toml::Value::String(name)) if name.parse::<RewardKind>().ok() == Some(kind) => {}
        Some(other) => bail!(
            "{}: `kind = {other}` does not match --reward {kind}",
            path.display()
        ),
    }
    toml::Value::Table(table)
        .try_into()
        .with_context(|| format!("{}: invalid {kind} reward config", path.display()))
}

fn build_sandbox(args: &VerifyArgs) -> anyhow::Result<Sandbox> {
    let file = match &args.sandbox_config {
        Some(path) => {
            let text = std::fs::read_to_string(path)
                .with_context(|| format!("reading {}", path.display()))?;
            toml::from_str::<SandboxConfigFile>(&text)
                .with_context(|| format!("parsing {}", path.display()))?
        }
        None => SandboxConfigFile::default(),
    };
    let mut config = file.into_config()?;
    if let Some(level) = args.min_isolation {
        config.min_isolation = match level {
            LevelArg::Basic => IsolationLevel::Basic,
            LevelArg::Confined => IsolationLevel::Confined,
            LevelArg::Full => IsolationLevel::Full,
        };
    }
    Ok(Sandbox::new(config)?)
}

fn optional<T: serde::de::DeserializeOwned>(
    object: &Map<String, Value>,
    field: &str,
) -> Result<Option<T>, String> {
    match object.get(field) {
        None | Some(Value::Null) => Ok(None),
        Some(value) => T::deserialize(value)
            .map(Some)
            .map_err(|e| format!("field `{field}`: {e}")),
    }
}

fn parse_line(line: usize, text: &str) -> Result<Sample, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let Value::Object(object) = value else {
        return Err("not a JSON object".into());
    };
    let completion: String =
        optional(&object, "completion")?.ok_or("missing field `completion`")?;
    let answer = match object.get("answer") {
        None | Some(Value::Null) => None,
        Some(Value::String(text)) => Some(text.clone()),
        Some(Value::Number(number)) => Some(number.to_string()),
        Some(_) => return Err("field `answer`: expected a string or a number".into()),
    };
    let reference = Reference {
        answer,
        tests: optional(&object, "tests")?,
        entry_point: optional(&object, "entry_point")?,
        cases: optional::<Vec<IoCase>>(&object, "cases")?,
        schema: object.get("schema").filter(|v| !v.is_null()).cloned(),
        constraints: optional::<Vec<Constraint>>(&object, "constraints")?,
    };
    Ok(Sample {
        line,
        prompt: optional(&object, "prompt")?.unwrap_or_default(),
        completion,
        reference,
        completion_tokens: optional(&object, "completion_tokens")?,
        correct: optional(&object, "correct")?,
        object,
    })
}

fn score_samples(reward: &Reward, samples: &[Sample], group_by: &str) -> Vec<RewardOutcome> {
    if !reward.is_group_level() {
        return samples
            .par_iter()
            .map(|sample| reward.score(&sample.input()))
            .collect();
    }
    let mut groups: HashMap<String, Vec<usize>> = HashMap::new();
    for (index, sample) in samples.iter().enumerate() {
        let key = sample
            .object
            .get(group_by)
            .map(Value::to_string)
            .unwrap_or_default();
        groups.entry(key).or_default().push(index);
    }
    let groups: Vec<Vec<usize>> = groups.into_values().collect();
    let scored: Vec<(Vec<usize>, Vec<RewardOutcome>)> = groups
        .into_par_iter()
        .map(|members| {
            let inputs: Vec<RewardInput<'_>> =
                members.iter().map(|&i| samples[i].input()).collect();
            let outcomes = reward.score_group(&inputs);
            (members, outcomes)
        })
        .collect();
    let mut outcomes: Vec<Option<RewardOutcome>> = vec![None; samples.len()];
    for (members, group_outcomes) in scored {
        for (index, outcome) in members.into_iter().zip(group_outcomes) {
            outcomes[index] = Some(outcome);
        }
    }
    outcomes
        .into_iter()
        .map(|o| {
            o.unwrap_or_else(|| {
                RewardOutcome::failed(stoke_reward::Outcome::SandboxError, "no outcome")
            })
        })
        .collect()
}

/// Lines scored per chunk when streaming.
const CHUNK_LINES: usize = 4096;

/// Reads up to `max_lines` non-blank lines as `(line number, bytes)`.
fn read_chunk(
    reader: &mut impl BufRead,
    line_number: &mut usize,
    max_lines: usize,
) -> std::io::Result<Vec<(usize, Vec<u8>)>> {
    let mut chunk = Vec::new();
    while chunk.len() < max_lines {
        let mut bytes = Vec::new();
        if reader.read_until(b'\n', &mut bytes)? == 0 {
            break;
        }
        *line_number += 1;
        if bytes.iter().all(u8::is_ascii_whitespace) {
            continue;
        }
        chunk.push((*line_number, bytes));
    }
    Ok(chunk)
}

/// `--explain`: each sample's explanation, in order (math reward only).
fn explain_samples(reward: &Reward, samples: &[Sample]) -> Vec<Option<Explanation>> {
    match reward {
        Reward::Math(verifier) => samples
            .par_iter()
            .map(|sample| Some(verifier.explain(&sample.input()).1))
            .collect(),
        _ => samples.iter().map(|_| None).collect(),
    }
}

fn print_explanation(input_name: &str, line: usize, explanation: &Explanation) {
    let show = |value: &Option<String>| value.as_deref().unwrap_or("-").replace('\n', " ");
    eprintln!(
        "{input_name}:{line}: {} | extracted {} (from {}) | normalized {} vs gold {} | rule: {}",
        explanation.outcome.name(),
        show(&explanation.extracted),
        show(&explanation.source),
        show(&explanation.normalized_prediction),
        show(&explanation.normalized_gold),
        explanation.rule
    );
}

pub fn run(args: VerifyArgs) -> anyhow::Result<()> {
    let kind: RewardKind = args.reward.parse()?;
    if args.explain && kind != RewardKind::Math {
        bail!("--explain is available for --reward math only, not {kind}");
    }
    let config = load_reward_config(kind, args.config.as_deref())?;
    let sandbox = if config.runs_code() {
        Some(build_sandbox(&args)?)
    } else {
        None
    };
    let code_workers = sandbox.as_ref().map(|s| s.config().workers);
    let reward = config
        .build(sandbox)
        .with_context(|| format!("building the {kind} reward"))?;

    let input = std::fs::File::open(&args.input)
        .with_context(|| format!("opening {}", args.input.display()))?;
    let mut reader = BufReader::new(input);
    let started = Instant::now();
    let threads = match code_workers {
        Some(workers) => (workers * 2).max(4),
        None => args.threads.unwrap_or(0),
    };
    let pool = rayon::ThreadPoolBuilder::new()
        .num_threads(threads)
        .build()?;
    let input_name = args.input.display().to_string();
    let output: Box<dyn Write> = if args.output.as_os_str() == "-" {
        Box::new(std::io::stdout().lock())
    } else {
        let file = std::fs::File::create(&args.output)
            .with_context(|| format!("creating {}", args.output.display()))?;
        Box::new(file)
    };
    let mut output = BufWriter::new(output);
    let mut stats = RewardStats::new();
    let mut malformed = 0usize;
    // Group-level rewards need every member of a group at once, so they read the whole file;
    // the others stream it in chunks, keeping memory bounded on large files.
    let chunk_lines = if reward.is_group_level() {
        usize::MAX
    } else {
        CHUNK_LINES
    };
    let mut line_number = 0usize;
    loop {
        let chunk = read_chunk(&mut reader, &mut line_number, chunk_lines)
            .with_context(|| format!("reading {input_name}"))?;
        if chunk.is_empty() {
            break;
        }
        let (samples, outcomes) = pool.install(|| {
            let parsed: Vec<Result<Sample, (usize, String)>> = chunk
                .into_par_iter()
                .map(|(line, bytes)| {
                    let text =
                        String::from_utf8(bytes).map_err(|_| (line, "not UTF-8".to_string()))?;
                    parse_line(line, &text).map_err(|e| (line, e))
                })
                .collect();
            let mut samples = Vec::with_capacity(parsed.len());
            for result in parsed {
                match result {
                    Ok(sample) => samples.push(sample),
                    Err((line, error)) => {
                        malformed += 1;
                        eprintln!("{input_name}:{line}: skipped: {error}");
                    }
                }
            }
            let outcomes = score_samples(&reward, &samples, &args.group_by);
            let explanations = if args.explain {
                explain_samples(&reward, &samples)
            } else {
                samples.iter().map(|_| None).collect()
            };
            (
                samples,
                outcomes.into_iter().zip(explanations).collect::<Vec<_>>(),
            )
        });
        for (sample, (outcome, explanation)) in samples.into_iter().zip(outcomes) {
            stats.record(&outcome);
            let mut object = sample.object;
            if let Some(explanation) = explanation {
                print_explanation(&input_name, sample.line, &explanation);
                object.insert("explain".into(), serde_json::to_value(&explanation)?);
            }
            object.insert("reward".into(), Value::from(outcome.score));
            object.insert("outcome".into(), Value::from(outcome.outcome.name()));
            object.insert("details".into(), serde_json::to_value(&outcome.details)?);
            serde_json::to_writer(&mut output, &object)?;
            output
                .write_all(b"\n")
                .with_context(|| format!("writing {}", args.output.display()))?;
        }
    }
    output
        .flush()
        .with_context(|| format!("writing {}", args.output.display()))?;

    let elapsed = started.elapsed().as_secs_f64();
    let throughput = if elapsed > 0.0 {
        stats.total() as f64 / elapsed
    } else {
        0.0
    };
    eprintln!(
        "verify {kind}: {} scored, {malformed} malformed lines skipped, mean reward {:.4}, {:.1} samples/s ({elapsed:.2} s)",
        stats.total(),
        stats.mean_score(),
        throughput
    );
    let counts: Vec<String> = stats
        .counts()
        .map(|(name, count)| format!("{name}={count}"))
        .collect();
    eprintln!(
        "outcomes: {}",
        if counts.is_empty() {
            "none".to_string()
        } else {
            counts.join(" ")
        }
    );
    if stats.dataset_problems() > 0 {
        eprintln!(
            "warning: {} samples have a broken or incomplete reference (excluded from training)",
            stats.dataset_problems()
        );
    }
    Ok(())
}
