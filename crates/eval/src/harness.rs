//! Runs a task against a target: every item scored, one record per item appended to
//! `items.jsonl` as it finishes, and the task's metrics with standard errors.
//!
//! Resume: an interrupted run leaves the records it finished; the next run over the same
//! records file reads them back (keyed by the hash of what the item asks, `Item::key`),
//! skips those items and counts each once. A torn last line (the process killed mid-write) is
//! dropped and rewritten.
//!
//! Metrics: `multiple_choice` -> `acc`, `acc_norm`; `generate_until` -> `pass@k` for each k
//! (unbiased, Chen et al. 2021), `mean@n` (mean reward), `maj@n` (n > 1: the majority
//! extracted answer is right); `loglikelihood_rolling` -> `bits_per_byte` (total over the whole
//! set). Standard errors: analytic over items (sample sd / sqrt(items)); bits per byte, a ratio
//! of sums, by a seeded bootstrap over documents (1,000 resamples).

use std::collections::{BTreeMap, HashMap};
use std::io::Write;
use std::path::{Path, PathBuf};

use rand::{Rng, SeedableRng};
use serde::{Deserialize, Serialize};
use stoke_reward::{Outcome, Reward, RewardInput, Verifier};

use crate::metrics::{bits_per_byte, majority, mean_stderr, multiple_choice, pass_at_k};
use crate::target::{GenerateRequest, Sample, Target, TargetError};
use crate::task::{GenerationFile, Item, OutputType, Task, TaskError, Work};

#[derive(Debug, thiserror::Error)]
pub enum EvalError {
    #[error(transparent)]
    Task(#[from] TaskError),
    #[error("task {task}, item {location}: {source}")]
    Target {
        task: String,
        location: String,
        source: TargetError,
    },
    #[error("task {task}, item {location}: {message}")]
    Item {
        task: String,
        location: String,
        message: String,
    },
    #[error("grader: {0}")]
    Grader(String),
    #[error("{path}: {message}")]
    Io { path: String, message: String },
}

/// One graded sample of a generative item.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub completion: String,
    /// Completion length in tokens.
    #[serde(default)]
    pub tokens: usize,
    /// Generation stopped at the token budget.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub truncated: bool,
    pub score: f64,
    pub outcome: Outcome,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub extracted: Option<String>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reason: Option<String>,
}

/// What one item gave.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "snake_case")]
pub enum Outcomes {
    Choices {
        loglikelihoods: Vec<f64>,
        greedy: Vec<bool>,
        gold: usize,
        acc: f64,
        acc_norm: f64,
    },
    Generate {
        samples: Vec<SampleRecord>,
    },
    Rolling {
        loglikelihood: f64,
        bytes: usize,
        tokens: usize,
    },
}

/// One line of `items.jsonl`.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct ItemRecord {
    pub task: String,
    pub key: String,
    pub index: usize,
    pub location: String,
    /// The context or prompt as the model saw it (text).
    pub prompt: String,
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub choices: Vec<String>,
    pub outcomes: Outcomes,
}

/// A metric with its standard error.
#[derive(Debug, Clone, Copy, PartialEq, Serialize, Deserialize)]
pub struct Metric {
    pub value: f64,
    pub stderr: f64,
}

/// A task's results.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct TaskResult {
    pub task: String,
    pub target: String,
    pub output_type: OutputType,
    pub items: usize,
    /// Items read back from an earlier run's records.
    pub resumed: usize,
    pub metrics: BTreeMap<String, Metric>,
    /// The expected score of random guessing on the main metric (multiple choice: the mean of
    /// 1 / choices over items), when there is one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub random_baseline: Option<f64>,
}

/// Where records go and what to show while running.
#[derive(Debug, Clone, Default)]
pub struct RunOptions {
    /// `items.jsonl` to append to and resume from; `None` keeps records in memory only.
    pub records: Option<PathBuf>,
    /// Print a progress line every this many items (0: quiet).
    pub progress_every: usize,
    /// Generative items per target call (0: 32).
    pub generate_batch: usize,
}

/// Records of an earlier run in `path` (missing file: none), keyed by item key; a torn last
/// line is dropped from the file.
pub fn read_records(path: &Path) -> Result<HashMap<String, ItemRecord>, EvalError> {
    let shown = path.display().to_string();
    let io = |message: String| EvalError::Io {
        path: shown.clone(),
        message,
    };
    let text = match std::fs::read_to_string(path) {
        Ok(text) => text,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(HashMap::new()),
        Err(e) => return Err(io(e.to_string())),
    };
    let mut records = HashMap::new();
    let mut good_bytes = 0usize;
    for (i, line) in text.split_inclusive('\n').enumerate() {
        if !line.ends_with('\n') {
            // A torn tail: the run was killed while writing it; the item runs again.
            break;
        }
        let record: ItemRecord = serde_json::from_str(line.trim_end())
            .map_err(|e| io(format!("line {}: not an item record: {e}", i + 1)))?;
        good_bytes += line.len();
        records.entry(record.key.clone()).or_insert(record);
    }
    if good_bytes < text.len() {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .open(path)
            .map_err(|e| io(e.to_string()))?;
        file.set_len(good_bytes as u64)
            .map_err(|e| io(e.to_string()))?;
    }
    Ok(records)
}

fn target_error(task: &Task, item: &Item, source: TargetError) -> EvalError {
    EvalError::Target {
        task: task.name.clone(),
        location: item.location.clone(),
        source,
    }
}

fn item_error(task: &Task, item: &Item, message: String) -> EvalError {
    EvalError::Item {
        task: task.name.clone(),
        location: item.location.clone(),
        message,
    }
}

/// lm-evaluation-harness's `_encode_pair`: trailing whitespace of the context moves to the
/// continuation; the context is encoded alone and the continuation is what encoding the
/// whole text adds. An empty context starts from the BOS token (or the first EOS).
fn encode_pair(
    target: &dyn Target,
    context: &str,
    continuation: &str,
) -> Result<(Vec<u32>, Vec<u32>), String> {
    let tokenizer = target.tokenizer();
    let trimmed = context.trim_end();
    let (context, continuation) = (
        trimmed,
        format!("{}{continuation}", &context[trimmed.len()..]),
    );
    let encode = |text: &str| tokenizer.encode(text, false).map_err(|e| e.to_string());
    let whole = encode(&format!("{context}{continuation}"))?;
    let mut context_ids = encode(context)?;
    if whole.len() <= context_ids.len() || whole[..context_ids.len()] != context_ids[..] {
        // The whole text's tokens do not start with the context's: fall back to encoding the
        // continuation alone (lm-eval takes the tail of the whole encoding either way).
        let tail = whole[context_ids.len().min(whole.len())..].to_vec();
        if tail.is_empty() {
            return Err("the continuation encodes to no tokens".into());
        }
        return Ok((context_ids, tail));
    }
    let continuation_ids = whole[context_ids.len()..].to_vec();
    if context_ids.is_empty() {
        let start = tokenizer
            .bos_token_id()
            .or_else(|| tokenizer.eos_token_ids().first().copied())
            .ok_or("an empty context needs a BOS or EOS token to start from")?;
        context_ids.push(start);
    }
    Ok((context_ids, continuation_ids))
}

/// `context + continuation` cut from the left to `max_length` tokens, and where the
/// continuation starts.
fn joined(context: &[u32], continuation: &[u32], max_length: usize) -> Option<(Vec<u32>, usize)> {
    if continuation.len() + 1 > max_length {
        return None;
    }
    let mut ids: Vec<u32> = context.iter().chain(continuation).copied().collect();
    if ids.len() > max_length {
        ids.drain(..ids.len() - max_length);
    }
    let from = ids.len() - continuation.len();
    Some((ids, from))
}

/// Generative items run in batches of this many prompts (the engine decodes them together).
const GENERATE_BATCH: usize = 32;

/// A generative item's prompt ids and token budget (the settings' `max_tokens`, less where the
/// context ends first).
fn prepare_generate(
    task: &Task,
    item: &Item,
    target: &dyn Target,
) -> Result<GenerateRequest, EvalError> {
    let Work::Generate { prompt, .. } = &item.work else {
        return Err(item_error(task, item, "not a generative item".into()));
    };
    let max_length = target.max_length();
    let ids = target
        .tokenizer()
        .encode(prompt, false)
        .map_err(|e| item_error(task, item, format!("tokenizing the prompt: {e}")))?;
    if ids.is_empty() || ids.len() + 1 > max_length {
        return Err(item_error(
            task,
            item,
            format!(
                "the prompt has {} tokens: it must have 1 to {} (the model's context)",
                ids.len(),
                max_length.saturating_sub(1)
            ),
        ));
    }
    Ok(GenerateRequest {
        max_tokens: task.file.generation.max_tokens.min(max_length - ids.len()),
        ids,
        number: item.index as u64,
    })
}

/// A generative item's record: its samples graded.
fn finish_generate(
    task: &Task,
    item: &Item,
    samples: Vec<Sample>,
    grader: Option<&Reward>,
) -> Result<ItemRecord, EvalError> {
    let Work::Generate {
        prompt,
        bare_prompt,
        reference,
    } = &item.work
    else {
        return Err(item_error(task, item, "not a generative item".into()));
    };
    let grader = grader.ok_or_else(|| EvalError::Grader("no grader".into()))?;
    let inputs: Vec<RewardInput> = samples
        .iter()
        .map(|s| RewardInput::new(bare_prompt, &s.text, reference).with_tokens(s.tokens))
        .collect();
    let verdicts = grader.score_group(&inputs);
    let samples = samples
        .iter()
        .zip(verdicts)
        .map(|(s, v)| SampleRecord {
            completion: s.text.clone(),
            tokens: s.tokens,
            truncated: s.truncated,
            score: v.score,
            outcome: v.outcome,
            extracted: v.details.extracted,
            reason: v.details.reason,
        })
        .collect();
    Ok(ItemRecord {
        task: task.name.clone(),
        key: item.key(task),
        index: item.index,
        location: item.location.clone(),
        prompt: prompt.clone(),
        choices: Vec::new(),
        outcomes: Outcomes::Generate { samples },
    })
}

fn run_item(
    task: &Task,
    item: &Item,
    target: &dyn Target,
    grader: Option<&Reward>,
) -> Result<ItemRecord, EvalError> {
    let max_length = target.max_length();
    let (prompt, choices, outcomes) = match &item.work {
        Work::Choices {
            context,
            continuations,
            choices,
            gold,
        } => {
            let mut sequences = Vec::with_capacity(continuations.len());
            for continuation in continuations {
                let (c, x) = encode_pair(target, context, continuation)
                    .map_err(|e| item_error(task, item, e))?;
                let sequence = joined(&c, &x, max_length).ok_or_else(|| {
                    item_error(
                        task,
                        item,
                        format!("a choice is longer than the model's {max_length} positions"),
                    )
                })?;
                sequences.push(sequence);
            }
            let scored = target
                .score(&sequences)
                .map_err(|e| target_error(task, item, e))?;
            let loglikelihoods: Vec<f64> = scored.iter().map(|s| s.0).collect();
            let (acc, acc_norm) = multiple_choice(&loglikelihoods, choices, *gold);
            (
                context.clone(),
                choices.clone(),
                Outcomes::Choices {
                    greedy: scored.iter().map(|s| s.1).collect(),
                    loglikelihoods,
                    gold: *gold,
                    acc,
                    acc_norm,
                },
            )
        }
        Work::Generate { .. } => {
            let request = prepare_generate(task, item, target)?;
            let samples = target
                .generate(std::slice::from_ref(&request), &task.file.generation)
                .map_err(|e| target_error(task, item, e))?
                .pop()
                .unwrap_or_default();
            return finish_generate(task, item, samples, grader);
        }
        Work::Rolling { text } => {
            let tokenizer = target.tokenizer();
            let ids = tokenizer
                .encode(text, false)
                .map_err(|e| item_error(task, item, format!("tokenizing: {e}")))?;
            let start = tokenizer
                .bos_token_id()
                .or_else(|| tokenizer.eos_token_ids().first().copied())
                .ok_or_else(|| {
                    item_error(task, item, "perplexity needs a BOS or EOS token".into())
                })?;
            // Disjoint windows of up to max_length - 1 tokens, each scored after the token
            // before it (the start token for the first), as lm-eval's rolling windows with
            // context length 1.
            let window = max_length.saturating_sub(1).max(1);
            let mut sequences = Vec::new();
            let mut at = 0;
            while at < ids.len() {
                let end = (at + window).min(ids.len());
                let before = if at == 0 { start } else { ids[at - 1] };
                let mut sequence = vec![before];
                sequence.extend_from_slice(&ids[at..end]);
                sequences.push((sequence, 1));
                at = end;
            }
            let scored = target
                .score(&sequences)
                .map_err(|e| target_error(task, item, e))?;
            (
                text.clone(),
                Vec::new(),
                Outcomes::Rolling {
                    loglikelihood: scored.iter().map(|s| s.0).sum(),
                    bytes: text.len(),
                    tokens: ids.len(),
                },
            )
        }
    };
    Ok(ItemRecord {
        task: task.name.clone(),
        key: item.key(task),
        index: item.index,
        location: item.location.clone(),
        prompt,
        choices,
        outcomes,
    })
}

/// Evaluates `task` on `target`; code graders run in `sandbox`.
pub fn evaluate(
    task: &Task,
    target: &dyn Target,
    sandbox: Option<stoke_sandbox::Sandbox>,
    options: &RunOptions,
) -> Result<(TaskResult, Vec<ItemRecord>), EvalError> {
    let items = task.items(Some(target.tokenizer()))?;
    let grader = match &task.file.grader {
        Some(config) if task.file.output_type == OutputType::GenerateUntil => Some(
            config
                .build(sandbox)
                .map_err(|e| EvalError::Grader(e.to_string()))?,
        ),
        _ => None,
    };
    let mut cached = match &options.records {
        Some(path) => read_records(path)?,
        None => HashMap::new(),
    };
    let mut writer = match &options.records {
        Some(path) => {
            if let Some(parent) = path.parent() {
                std::fs::create_dir_all(parent).map_err(|e| EvalError::Io {
                    path: parent.display().to_string(),
                    message: e.to_string(),
                })?;
            }
            Some(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .map_err(|e| EvalError::Io {
                        path: path.display().to_string(),
                        message: e.to_string(),
                    })?,
            )
        }
        None => None,
    };
    let mut records = Vec::with_capacity(items.len());
    let mut resumed = 0;
    let started = std::time::Instant::now();
    let write = |file: &mut Option<std::fs::File>, record: &ItemRecord| -> Result<(), EvalError> {
        if let (Some(file), Some(path)) = (file.as_mut(), &options.records) {
            let io = |e: String| EvalError::Io {
                path: path.display().to_string(),
                message: e,
            };
            let line = serde_json::to_string(record).map_err(|e| io(e.to_string()))?;
            writeln!(file, "{line}")
                .and_then(|_| file.flush())
                .map_err(|e| io(e.to_string()))?;
        }
        Ok(())
    };
    // Items still to run: generative ones go in batches (the engine decodes a batch together).
    let mut pending: Vec<&Item> = Vec::new();
    for item in &items {
        match cached.remove(&item.key(task)) {
            Some(record) => {
                resumed += 1;
                records.push(record);
            }
            None => pending.push(item),
        }
    }
    let batch = if task.file.output_type == OutputType::GenerateUntil {
        if options.generate_batch == 0 {
            GENERATE_BATCH
        } else {
            options.generate_batch
        }
    } else {
        1
    };
    let mut done = 0;
    for chunk in pending.chunks(batch) {
        let fresh: Vec<ItemRecord> = if batch > 1 {
            let requests = chunk
                .iter()
                .map(|item| prepare_generate(task, item, target))
                .collect::<Result<Vec<_>, _>>()?;
            let outputs = target
                .generate(&requests, &task.file.generation)
                .map_err(|e| target_error(task, chunk[0], e))?;
            if outputs.len() != chunk.len() {
                return Err(item_error(
                    task,
                    chunk[0],
                    format!("{} answers for {} prompts", outputs.len(), chunk.len()),
                ));
            }
            chunk
                .iter()
                .zip(outputs)
                .map(|(item, samples)| finish_generate(task, item, samples, grader.as_ref()))
                .collect::<Result<_, _>>()?
        } else {
            vec![run_item(task, chunk[0], target, grader.as_ref())?]
        };
        for record in fresh {
            write(&mut writer, &record)?;
            records.push(record);
            done += 1;
            if options.progress_every > 0 && done % options.progress_every == 0 {
                eprintln!(
                    "eval {}: {}/{} items ({:.1} items/s)",
                    task.name,
                    resumed + done,
                    items.len(),
                    done as f64 / started.elapsed().as_secs_f64().max(1e-9)
                );
            }
        }
    }
    records.sort_by_key(|r| r.index);
    let metrics = aggregate(task, &records);
    let random_baseline =
        (task.file.output_type == OutputType::MultipleChoice && !records.is_empty()).then(|| {
            records
                .iter()
                .map(|r| 1.0 / r.choices.len().max(1) as f64)
                .sum::<f64>()
                / records.len() as f64
        });
    Ok((
        TaskResult {
            task: task.name.clone(),
            target: target.describe(),
            output_type: task.file.output_type,
            items: records.len(),
            resumed,
            metrics,
            random_baseline,
        },
        records,
    ))
}

fn metric(values: &[f64]) -> Metric {
    let (value, stderr) = mean_stderr(values);
    Metric { value, stderr }
}

/// The task's metrics from its item records.
pub fn aggregate(task: &Task, records: &[ItemRecord]) -> BTreeMap<String, Metric> {
    let mut out = BTreeMap::new();
    match task.file.output_type {
        OutputType::MultipleChoice => {
            let (mut acc, mut norm) = (Vec::new(), Vec::new());
            for r in records {
                if let Outcomes::Choices {
                    acc: a,
                    acc_norm: n,
                    ..
                } = r.outcomes
                {
                    acc.push(a);
                    norm.push(n);
                }
            }
            out.insert("acc".into(), metric(&acc));
            out.insert("acc_norm".into(), metric(&norm));
        }
        OutputType::GenerateUntil => {
            let settings = &task.file.generation;
            let groups: Vec<&[SampleRecord]> = records
                .iter()
                .filter_map(|r| match &r.outcomes {
                    Outcomes::Generate { samples } => Some(samples.as_slice()),
                    _ => None,
                })
                .collect();
            out = generative_metrics(&groups, settings.n, &settings.pass_at);
        }
        OutputType::LoglikelihoodRolling => {
            let docs: Vec<(f64, usize)> = records
                .iter()
                .filter_map(|r| match r.outcomes {
                    Outcomes::Rolling {
                        loglikelihood,
                        bytes,
                        ..
                    } => Some((loglikelihood, bytes)),
                    _ => None,
                })
                .collect();
            let bpb = |set: &mut dyn Iterator<Item = (f64, usize)>| {
                let (ll, bytes) = set.fold((0.0, 0), |(a, b), (l, n)| (a + l, b + n));
                bits_per_byte(ll, bytes)
            };
            let value = bpb(&mut docs.iter().copied());
            let mut rng = rand_chacha::ChaCha8Rng::seed_from_u64(0);
            let resamples: Vec<f64> = if docs.len() < 2 {
                Vec::new()
            } else {
                (0..1000)
                    .map(|_| {
                        bpb(&mut (0..docs.len()).map(|_| docs[rng.random_range(0..docs.len())]))
                    })
                    .collect()
            };
            let stderr = if resamples.len() < 2 {
                0.0
            } else {
                let mean = resamples.iter().sum::<f64>() / resamples.len() as f64;
                (resamples.iter().map(|v| (v - mean).powi(2)).sum::<f64>()
                    / (resamples.len() - 1) as f64)
                    .sqrt()
            };
            out.insert("bits_per_byte".into(), Metric { value, stderr });
        }
    }
    out
}

/// The metrics of generative items, each a group of `n` graded samples: `pass@k` for each k of
/// `pass_at` (default: 1, and n when n > 1; unbiased, Chen et al. 2021; "passed" is the
/// grader's `Correct`), `mean@n` (mean score), and with n > 1 `maj@n` (the most common extracted
/// answer is a right one). Standard errors are over items.
pub fn generative_metrics(
    groups: &[&[SampleRecord]],
    n: usize,
    pass_at: &[usize],
) -> BTreeMap<String, Metric> {
    let mut out = BTreeMap::new();
    let mut ks = pass_at.to_vec();
    if ks.is_empty() {
        ks.push(1);
        if n > 1 {
            ks.push(n);
        }
    }
    ks.sort_unstable();
    ks.dedup();
    let correct = |s: &SampleRecord| s.outcome == Outcome::Correct;
    for k in ks {
        let values: Vec<f64> = groups
            .iter()
            .filter_map(|g| pass_at_k(g.len(), g.iter().filter(|s| correct(s)).count(), k))
            .collect();
        out.insert(format!("pass@{k}"), metric(&values));
    }
    let means: Vec<f64> = groups
        .iter()
        .map(|g| g.iter().map(|s| s.score).sum::<f64>() / g.len().max(1) as f64)
        .collect();
    out.insert(format!("mean@{n}"), metric(&means));
    if n > 1 {
        let majorities: Vec<f64> = groups
            .iter()
            .map(|g| {
                let answers: Vec<Option<&str>> = g.iter().map(|s| s.extracted.as_deref()).collect();
                let winner = majority(&answers);
                let right = winner.is_some_and(|w| {
                    g.iter()
                        .find(|s| s.extracted.as_deref() == Some(w))
                        .is_some_and(correct)
                });
                f64::from(u8::from(right))
            })
            .collect();
        out.insert(format!("maj@{n}"), metric(&majorities));
    }
    out
}

/// `settings.n` completions of each prompt, `batch` prompts per target call (0: 32); the
/// harness's generation path for callers that grade samples themselves (a training run's
/// held-out evaluation with its own reward pool).
pub fn generate(
    target: &dyn Target,
    prompts: &[GenerateRequest],
    settings: &GenerationFile,
    batch: usize,
) -> Result<Vec<Vec<Sample>>, TargetError> {
    let batch = if batch == 0 { GENERATE_BATCH } else { batch };
    let mut out = Vec::with_capacity(prompts.len());
    for chunk in prompts.chunks(batch) {
        let outputs = target.generate(chunk, settings)?;
        if outputs.len() != chunk.len() {
            return Err(TargetError::Model(format!(
                "{} answers for {} prompts",
                outputs.len(),
                chunk.len()
            )));
        }
        out.extend(outputs);
    }
    Ok(out)
}
