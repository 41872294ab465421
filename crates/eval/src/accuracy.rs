//! Held-out exact-match accuracy of a chat model on arithmetic problems: the speedrun's
//! evaluation, run through the evaluation harness ([`crate::harness`]) like any task.
//!
//! What it is: the problems become a `generate_until` task held in memory: each question is
//! rendered as a one-turn user conversation with the tokenizer's chat template (generation prompt
//! added), generated greedily in batches by the local target (`stoke_rollout::Engine`) until an
//! end-of-turn token, and graded by the reward crate's exact-match verifier in `gsm8k` mode
//! against the problem's integer answer. Two scores:
//! - **strict** (the headline `accuracy`): the completion has a final `#### N` line and the
//!   verifier finds N equal to the answer, i.e. right answer in the trained format;
//! - **flexible**: the verifier alone, which falls back to the completion's last number, so a model
//!   that computes right but never learned the format still scores.
//!
//! Every sample is returned as a [`SampleRecord`] (question, completion, gold, verdicts) for the
//! report card. What it is not: a sampler with temperature (greedy only; [`pass_at_k`] is the
//! unbiased estimator for callers that draw several samples) or a trainer.
//!
//! Invariants: deterministic for a given model and problems (greedy decoding; batching changes
//! float summation order only); `records.len() == problems.len()`, in problem order.

use std::time::Instant;
pub use stoke_reward::stats::pass_at_k;

use serde::{Deserialize, Serialize};
use stoke_model::Transformer;
use stoke_reward::exact_match::{ExactMatchConfig, ExactMatchVerifier, MatchMode};
use stoke_reward::{Outcome, RewardConfig, RewardInput, Verifier};
use stoke_tokenizer::hf::Tokenizer;

use crate::arithmetic::{Level, Problem, parse_final_answer};
use crate::docs::Doc;
use crate::harness::{self, EvalError, Outcomes, RunOptions};
use crate::target::LocalTarget;
use crate::task::{GenerationFile, OutputType, Task, TaskFile};

/// How an evaluation runs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct AccuracyConfig {
    /// Prompts generated together (one prefill, one decode batch).
    pub batch_size: usize,
    /// Generation stops here if no end-of-turn token came.
    pub max_new_tokens: usize,
}

impl Default for AccuracyConfig {
    fn default() -> Self {
        AccuracyConfig {
            batch_size: 32,
            max_new_tokens: 96,
        }
    }
}

/// One evaluated problem.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct SampleRecord {
    pub level: Level,
    pub question: String,
    pub completion: String,
    pub answer: i64,
    /// The number the verifier read from the completion, if any.
    pub extracted: Option<String>,
    /// The completion has a `#### N` final line.
    pub formatted: bool,
    /// Strict: formatted and right.
    pub correct: bool,
    /// The verifier's verdict alone (last-number fallback).
    pub flexible_correct: bool,
    pub completion_tokens: usize,
}

/// The result of one evaluation.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct AccuracyReport {
    pub samples: usize,
    /// Strict exact-match accuracy in [0, 1].
    pub accuracy: f64,
    pub flexible_accuracy: f64,
    /// Share of completions with a `#### N` line.
    pub format_rate: f64,
    pub generated_tokens: usize,
    pub seconds: f64,
    /// Strict accuracy per level, for the levels present, in `Level::ALL` order.
    pub by_level: Vec<LevelAccuracy>,
    pub records: Vec<SampleRecord>,
}

/// Strict accuracy on the problems of one level.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct LevelAccuracy {
    pub level: Level,
    pub samples: usize,
    pub accuracy: f64,
}

/// Errors of an evaluation.
#[derive(Debug, thiserror::Error)]
pub enum AccuracyError {
    #[error("no problems to evaluate")]
    NoProblems,
    #[error("batch_size and max_new_tokens must be at least 1")]
    BadConfig,
    #[error("{0}")]
    Harness(#[from] EvalError),
    #[error("the harness returned {got} records for {expected} problems")]
    Incomplete { got: usize, expected: usize },
}

/// The arithmetic problems as an evaluation task of the harness: the question as a one-turn
/// chat, greedy, graded by [`answer_verifier`]'s settings.
fn task(problems: &[Problem], config: &AccuracyConfig) -> Result<Task, AccuracyError> {
    let file = TaskFile {
        name: Some("arithmetic".into()),
        output_type: OutputType::GenerateUntil,
        data: "<held-out problems>".into(),
        limit: None,
        doc_to_text: "question".into(),
        doc_to_target: Some("answer".into()),
        doc_to_choice: None,
        target_delimiter: " ".into(),
        fewshot_delimiter: "\n\n".into(),
        description: String::new(),
        num_fewshot: 0,
        fewshot_seed: 1234,
        fewshot_data: None,
        chat_template: true,
        generation: GenerationFile {
            max_tokens: config.max_new_tokens,
            ..GenerationFile::default()
        },
        grader: Some(RewardConfig::ExactMatch(ExactMatchConfig {
            mode: MatchMode::Gsm8k,
            extract_answer: true,
        })),
        reference: Default::default(),
    };
    let docs = problems
        .iter()
        .enumerate()
        .map(|(index, p)| Doc {
            fields: serde_json::json!({"question": p.question, "answer": p.answer.to_string()})
                .as_object()
                .cloned()
                .unwrap_or_default(),
            location: format!("held-out problem {index}"),
        })
        .collect();
    Ok(Task::from_docs(
        "arithmetic".into(),
        file,
        docs,
        "held-out arithmetic problems",
    )
    .map_err(EvalError::from)?)
}

/// Greedy held-out accuracy of `model` on `problems`, through the evaluation harness (the
/// arithmetic problems as a chat task with the exact-match grader).
pub fn evaluate(
    model: &Transformer,
    tokenizer: &Tokenizer,
    problems: &[Problem],
    config: &AccuracyConfig,
) -> Result<AccuracyReport, AccuracyError> {
    if problems.is_empty() {
        return Err(AccuracyError::NoProblems);
    }
    if config.batch_size == 0 || config.max_new_tokens == 0 {
        return Err(AccuracyError::BadConfig);
    }
    let started = Instant::now();
    let task = task(problems, config)?;
    let target = LocalTarget {
        model,
        tokenizer: tokenizer.clone(),
        name: "model".into(),
    };
    let options = RunOptions {
        generate_batch: config.batch_size,
        ..RunOptions::default()
    };
    let (_, items) = harness::evaluate(&task, &target, None, &options)?;
    if items.len() != problems.len() {
        return Err(AccuracyError::Incomplete {
            got: items.len(),
            expected: problems.len(),
        });
    }
    let mut records = Vec::with_capacity(problems.len());
    let mut generated_tokens = 0;
    for (item, problem) in items.iter().zip(problems) {
        let sample = match &item.outcomes {
            Outcomes::Generate { samples } => samples.first(),
            _ => None,
        };
        let Some(sample) = sample else {
            return Err(AccuracyError::Incomplete {
                got: 0,
                expected: 1,
            });
        };
        generated_tokens += sample.tokens;
        let flexible_correct = sample.outcome == Outcome::Correct;
        let formatted = parse_final_answer(&sample.completion).is_some();
        records.push(SampleRecord {
            level: problem.level,
            question: problem.question.clone(),
            answer: problem.answer,
            extracted: sample.extracted.clone(),
            formatted,
            correct: formatted && flexible_correct,
            flexible_correct,
            completion_tokens: sample.tokens,
            completion: sample.completion.clone(),
        });
    }
    let n = records.len() as f64;
    let share = |f: fn(&SampleRecord) -> bool| records.iter().filter(|r| f(r)).count() as f64 / n;
    let by_level = Level::ALL
        .iter()
        .filter_map(|&level| {
            let of_level: Vec<&SampleRecord> =
                records.iter().filter(|r| r.level == level).collect();
            (!of_level.is_empty()).then(|| LevelAccuracy {
                level,
                samples: of_level.len(),
                accuracy: of_level.iter().filter(|r| r.correct).count() as f64
                    / of_level.len() as f64,
            })
        })
        .collect();
    Ok(AccuracyReport {
        by_level,
        samples: records.len(),
        accuracy: share(|r| r.correct),
        flexible_accuracy: share(|r| r.flexible_correct),
        format_rate: share(|r| r.formatted),
        generated_tokens,
        seconds: started.elapsed().as_secs_f64(),
        records,
    })
}

/// The verifier of the arithmetic task: exact match in `gsm8k` mode (the number after the
/// completion's last `####`, else its last number, compared as an exact decimal).
pub fn answer_verifier() -> Result<ExactMatchVerifier, stoke_reward::ConfigError> {
    ExactMatchVerifier::new(&ExactMatchConfig {
        mode: MatchMode::Gsm8k,
        extract_answer: true,
    })
}

/// Scores one completion against the problem's answer.
pub fn score(
    verifier: &ExactMatchVerifier,
    problem: &Problem,
    completion: String,
    completion_tokens: usize,
) -> SampleRecord {
    let reference = problem.reference();
    let outcome = verifier.score(&RewardInput::new(
        &problem.question,
        &completion,
        &reference,
    ));
    let flexible_correct = outcome.outcome == Outcome::Correct;
    let formatted = parse_final_answer(&completion).is_some();
    SampleRecord {
        level: problem.level,
        question: problem.question.clone(),
        answer: problem.answer,
        extracted: outcome.details.extracted,
        formatted,
        correct: formatted && flexible_correct,
        flexible_correct,
        completion_tokens,
        completion,
    }
}
