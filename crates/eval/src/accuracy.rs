//! Held-out exact-match accuracy of a chat model on arithmetic problems.
//!
//! What it is: each problem's question is rendered as a one-turn user conversation with the
//! tokenizer's chat template (generation prompt added), generated greedily in batches by
//! `stoke_rollout::Engine` until an end-of-turn token, and scored with the reward crate's
//! exact-match verifier in `gsm8k` mode against the problem's integer answer. Two scores:
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
use stoke_reward::{Outcome, RewardInput, Verifier};
use stoke_rollout::{Detokenizer, Engine, GenerationRequest, SamplingParams};
use stoke_tokenizer::chat::{ChatMessage, ChatOptions};
use stoke_tokenizer::hf::Tokenizer;

use crate::arithmetic::{Level, Problem, parse_final_answer};

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
    #[error("rendering problem {index} with the chat template: {source}")]
    Template {
        index: usize,
        source: stoke_tokenizer::error::TokenizerError,
    },
    #[error("the tokenizer has no end-of-turn (eos) token to stop generation on")]
    NoStopToken,
    #[error("generating: {0}")]
    Generation(#[from] stoke_rollout::RolloutError),
    #[error("the verifier: {0}")]
    Verifier(String),
}

/// Greedy held-out accuracy of `model` on `problems`.
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
    let prompts = problems
        .iter()
        .enumerate()
        .map(|(index, problem)| {
            chat_prompt(tokenizer, &problem.question)
                .map_err(|source| AccuracyError::Template { index, source })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let mut stop_token_ids = tokenizer.eos_token_ids();
    stop_token_ids.extend(model.config().eos_token_ids.iter().copied());
    stop_token_ids.sort_unstable();
    stop_token_ids.dedup();
    if stop_token_ids.is_empty() {
        return Err(AccuracyError::NoStopToken);
    }
    let params = SamplingParams {
        max_new_tokens: config.max_new_tokens,
        temperature: 0.0,
        stop_token_ids,
        ..SamplingParams::default()
    };
    let verifier = answer_verifier().map_err(|e| AccuracyError::Verifier(e.to_string()))?;

    let engine = Engine::new(model);
    let detokenizer: &dyn Detokenizer = tokenizer;
    let mut records = Vec::with_capacity(problems.len());
    let mut generated_tokens = 0;
    for (chunk_index, chunk) in prompts.chunks(config.batch_size).enumerate() {
        let first = chunk_index * config.batch_size;
        let request = GenerationRequest {
            prompts: chunk.to_vec(),
            params: params.clone(),
            first_prompt_number: first as u64,
        };
        let output = engine.generate(&request, Some(detokenizer))?;
        generated_tokens += output.generated_tokens;
        for (offset, samples) in output.completions.iter().enumerate() {
            let problem = &problems[first + offset];
            let completion = samples
                .first()
                .map(|c| (c.text.clone().unwrap_or_default(), c.token_ids.len()));
            let (text, completion_tokens) = completion.unwrap_or_default();
            records.push(score(&verifier, problem, text, completion_tokens));
        }
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

/// The prompt ids of a one-turn user conversation, ready for the assistant's reply.
pub fn chat_prompt(
    tokenizer: &Tokenizer,
    question: &str,
) -> Result<Vec<u32>, stoke_tokenizer::error::TokenizerError> {
    let options = ChatOptions {
        add_generation_prompt: true,
        ..ChatOptions::default()
    };
    Ok(tokenizer
        .apply_chat_template(&[ChatMessage::user(question)], &options)?
        .ids)
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
