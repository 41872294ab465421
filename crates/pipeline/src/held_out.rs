//! Held-out evaluation during a GRPO run: greedy pass@1 and sampled pass@1 / pass@k of the
//! current policy on the first `problems` held-out tasks, scored by the run's own reward pool
//! (so verifier failures are handled as in training).
//!
//! pass@k uses the unbiased estimator of Chen et al. (`stoke_reward::stats::pass_at_k`) over
//! `samples` draws per problem at the run's sampling settings; "correct" is the verifier's
//! `Correct` outcome. Sampling streams come from a seed separate from training's, so evaluation
//! never changes which samples training draws.
//!
//! What it is not: the speedrun's report-card accuracy (`stoke_eval::accuracy`, greedy only,
//! per level), although on the arithmetic task greedy pass@1 is the same figure.

use std::sync::Arc;
use std::time::Instant;

use stoke_model::Transformer;
use stoke_reward::stats::pass_at_k;
use stoke_rollout::{Detokenizer, Engine, GenerationRequest, SamplingParams};
use stoke_tokenizer::hf::Tokenizer;

use crate::error::PipelineError;
use crate::records::{RolloutGroup, Task};
use crate::reward::RewardPool;

/// Prompts per engine call.
const EVAL_BATCH: usize = 32;
/// Offset of evaluation's sampling seed from the run's.
const EVAL_SEED_OFFSET: u64 = 0x5EED_E7A1;

/// Sampling settings of an evaluation.
#[derive(Clone, Debug, PartialEq)]
pub struct EvalSampling {
    pub samples: usize,
    pub temperature: f32,
    pub top_p: f32,
    pub top_k: Option<usize>,
    pub max_new_tokens: usize,
    pub stop_token_ids: Vec<u32>,
    pub seed: u64,
}

/// One evaluation's figures.
#[derive(Clone, Debug, PartialEq)]
pub struct HeldOutResult {
    pub problems: usize,
    pub greedy_pass_at_1: f64,
    /// Mean over problems of the sampled pass@1 estimate.
    pub pass_at_1: f64,
    pub pass_at_k: f64,
    pub k: usize,
    /// Mean greedy completion length in tokens.
    pub mean_length: f64,
    pub seconds: f64,
    /// (task id, greedy completion, correct) of the first few problems, for the report.
    pub examples: Vec<(String, String, bool)>,
}

/// Evaluates `model` on `tasks` (all of them; the caller picks the subset).
pub fn evaluate(
    model: &Transformer,
    tokenizer: &Tokenizer,
    tasks: &[Arc<Task>],
    rewards: &RewardPool,
    sampling: &EvalSampling,
) -> Result<HeldOutResult, PipelineError> {
    let started = Instant::now();
    if tasks.is_empty() {
        return Err(PipelineError::config(
            "held_out",
            "no held-out tasks to evaluate",
        ));
    }
    let greedy = generate_and_score(model, tokenizer, tasks, rewards, sampling, 1, 0.0)?;
    let k = sampling.samples.max(1);
    let sampled = if k > 1 {
        generate_and_score(
            model,
            tokenizer,
            tasks,
            rewards,
            sampling,
            k,
            sampling.temperature,
        )?
    } else {
        greedy.clone()
    };
    let n = tasks.len() as f64;
    let greedy_pass_at_1 = greedy.iter().filter(|g| g.correct[0]).count() as f64 / n;
    let estimate = |k: usize| {
        sampled
            .iter()
            .map(|g| pass_at_k(g.correct.len(), g.correct.iter().filter(|c| **c).count(), k))
            .sum::<f64>()
            / n
    };
    let mean_length = greedy.iter().map(|g| g.lengths[0] as f64).sum::<f64>() / n;
    let examples = greedy
        .iter()
        .take(4)
        .map(|g| (g.task_id.clone(), g.first_text.clone(), g.correct[0]))
        .collect();
    Ok(HeldOutResult {
        problems: tasks.len(),
        greedy_pass_at_1,
        pass_at_1: estimate(1),
        pass_at_k: estimate(k),
        k,
        mean_length,
        seconds: started.elapsed().as_secs_f64(),
        examples,
    })
}

#[derive(Clone, Debug)]
struct ProblemOutcome {
    task_id: String,
    correct: Vec<bool>,
    lengths: Vec<usize>,
    first_text: String,
}

fn generate_and_score(
    model: &Transformer,
    tokenizer: &Tokenizer,
    tasks: &[Arc<Task>],
    rewards: &RewardPool,
    sampling: &EvalSampling,
    n: usize,
    temperature: f32,
) -> Result<Vec<ProblemOutcome>, PipelineError> {
    let engine = Engine::new(model);
    let detokenizer: &dyn Detokenizer = tokenizer;
    let params = SamplingParams {
        max_new_tokens: sampling.max_new_tokens,
        temperature,
        top_k: sampling.top_k,
        top_p: if temperature == 0.0 {
            1.0
        } else {
            sampling.top_p
        },
        seed: sampling.seed.wrapping_add(EVAL_SEED_OFFSET),
        n,
        stop_token_ids: sampling.stop_token_ids.clone(),
        stop_strings: Vec::new(),
    };
    let mut outcomes = Vec::with_capacity(tasks.len());
    for (chunk_index, chunk) in tasks.chunks(EVAL_BATCH).enumerate() {
        let first = chunk_index * EVAL_BATCH;
        let request = GenerationRequest {
            prompts: chunk.iter().map(|t| t.prompt_ids.clone()).collect(),
            params: params.clone(),
            first_prompt_number: first as u64,
        };
        let output = engine.generate(&request, Some(detokenizer))?;
        for (offset, completions) in output.completions.into_iter().enumerate() {
            let task = Arc::clone(&chunk[offset]);
            let group = RolloutGroup::offline(
                (first + offset) as u64,
                Arc::clone(&task),
                temperature,
                completions,
            );
            let lengths = group
                .samples
                .iter()
                .map(|s| s.completion_ids.len())
                .collect();
            let first_text = group
                .samples
                .first()
                .map(|s| s.text.clone())
                .unwrap_or_default();
            let scored = rewards.score(group);
            outcomes.push(ProblemOutcome {
                task_id: task.id.clone(),
                correct: scored.rewards.iter().map(|r| r.correct()).collect(),
                lengths,
                first_text,
            });
        }
    }
    Ok(outcomes)
}
