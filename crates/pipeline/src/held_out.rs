//! Held-out evaluation during a GRPO run: greedy pass@1 and sampled pass@1 / pass@k of the
//! current policy on the first `problems` held-out tasks, run through the evaluation harness
//! (`stoke_eval::harness`: its local target generates, its metrics aggregate) and scored by the
//! run's own reward pool (each task's reward, verifier failures handled as in training).
//!
//! pass@k uses the unbiased estimator of Chen et al. (the harness's `generative_metrics`) over
//! `samples` draws per problem at the run's sampling settings; "correct" is the verifier's
//! `Correct` outcome. Sampling streams come from a seed separate from training's, so evaluation
//! never changes which samples training draws.
//!
//! Runs with an environment evaluate whole episodes ([`evaluate_episodes`]): the final
//! answer is scored (or, for an environment that grades its outcome, the final state: code
//! repair's pass@1 is the share of tasks solved), and the greedy episodes' turns, tool calls
//! and mean outcome reward are reported.
//!
//! On the arithmetic task greedy pass@1 is the speedrun's flexible accuracy (the same harness and
//! verifier; the speedrun also reports the strict, formatted-answer figure).

use std::sync::Arc;
use std::time::Instant;

use stoke_eval::harness::{self, SampleRecord, generative_metrics};
use stoke_eval::target::{GenerateRequest, LocalTarget};
use stoke_eval::task::GenerationFile;
use stoke_model::Transformer;
use stoke_reward::Outcome;
use stoke_rollout::{Completion, FinishReason};
use stoke_tokenizer::hf::Tokenizer;

use stoke_rollout::{FixedWeights, SamplingParams};

use crate::episode::{EpisodeGroup, EpisodeSetup, EpisodeStats, env_task};
use crate::error::PipelineError;
use crate::records::{EpisodeSummary, RolloutGroup, ScoredGroup, Task};
use crate::rollout::episode_sample;
use crate::service::RewardService;

/// Prompts per target call.
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
    /// Multi-turn runs: what the greedy episodes did.
    pub episodes: Option<EpisodeFigures>,
}

/// Per greedy held-out episode: model turns and tool calls (mean), the share of episodes
/// with at least one tool call, and the environment's mean outcome reward (code repair: the
/// mean share of the hidden-test gap closed).
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpisodeFigures {
    pub mean_turns: f64,
    pub mean_tool_calls: f64,
    pub tool_use_rate: f64,
    pub mean_outcome: f64,
    /// Whether the environment grades its final state (`Environment::grades_outcome`): only
    /// then is `mean_outcome` shown and logged.
    pub graded_outcome: bool,
}

/// Evaluates `model` on `tasks` (all of them; the caller picks the subset).
pub fn evaluate(
    model: &Transformer,
    tokenizer: &Tokenizer,
    tasks: &[Arc<Task>],
    rewards: &dyn RewardService,
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
    let greedy_pass_at_1 = pass_at(&greedy, 1);
    let n = tasks.len() as f64;
    let mean_length = greedy.iter().map(|g| g[0].tokens as f64).sum::<f64>() / n;
    let examples = greedy
        .iter()
        .zip(tasks)
        .take(4)
        .map(|(g, t)| {
            (
                t.id.clone(),
                g[0].completion.clone(),
                g[0].outcome == Outcome::Correct,
            )
        })
        .collect();
    Ok(HeldOutResult {
        problems: tasks.len(),
        greedy_pass_at_1,
        pass_at_1: pass_at(&sampled, 1),
        pass_at_k: pass_at(&sampled, k),
        k,
        mean_length,
        seconds: started.elapsed().as_secs_f64(),
        examples,
        episodes: None,
    })
}

/// [`evaluate`] for a run with an environment: every sample is an episode, scored by `rewards`
/// (the run's service wrapped in `EpisodeRewards`) on its final answer. `model` is copied once
/// into the engine's shared weights.
pub fn evaluate_episodes(
    model: &Transformer,
    tokenizer: &Tokenizer,
    setup: &EpisodeSetup,
    tasks: &[Arc<Task>],
    rewards: &dyn RewardService,
    sampling: &EvalSampling,
) -> Result<HeldOutResult, PipelineError> {
    let started = Instant::now();
    if tasks.is_empty() {
        return Err(PipelineError::config(
            "held_out",
            "no held-out tasks to evaluate",
        ));
    }
    let weights = FixedWeights {
        model: Arc::new(model.snapshot()?),
        version: 0,
    };
    let template = tokenizer
        .default_chat_template()
        .map_err(|e| PipelineError::config("environment", e.to_string()))?;
    let runner = setup.runner(tokenizer, template);
    let play = |n: usize, temperature: f32| -> Result<Vec<ScoredGroup>, PipelineError> {
        let mut stop_token_ids = tokenizer.eos_token_ids();
        stop_token_ids.extend(model.config().eos_token_ids.iter().copied());
        stop_token_ids.sort_unstable();
        stop_token_ids.dedup();
        let params = SamplingParams {
            max_new_tokens: setup.limits.max_turn_tokens,
            temperature,
            top_k: if temperature == 0.0 {
                None
            } else {
                sampling.top_k
            },
            top_p: if temperature == 0.0 {
                1.0
            } else {
                sampling.top_p
            },
            seed: sampling.seed.wrapping_add(EVAL_SEED_OFFSET),
            n,
            stop_token_ids,
            stop_strings: Vec::new(),
        };
        let mut scored = Vec::with_capacity(tasks.len());
        for (chunk_index, chunk) in tasks.chunks(EVAL_BATCH).enumerate() {
            let groups = chunk
                .iter()
                .enumerate()
                .map(|(i, task)| {
                    let env_task = env_task(task);
                    let opening = setup.env.opening(&env_task).map_err(|e| {
                        PipelineError::config("environment", format!("task {}: {e}", task.id))
                    })?;
                    Ok(EpisodeGroup {
                        group_id: (chunk_index * EVAL_BATCH + i) as u64,
                        task: Arc::new(env_task),
                        opening,
                        prompt_ids: task.prompt_ids.clone(),
                    })
                })
                .collect::<Result<Vec<_>, PipelineError>>()?;
            let mut stats = EpisodeStats::default();
            let records = runner.run(&weights, &params, &groups, &mut stats)?;
            for ((task, group), episodes) in chunk.iter().zip(&groups).zip(records) {
                let mut rollout = RolloutGroup::offline(
                    group.group_id,
                    Arc::clone(task),
                    temperature,
                    Vec::new(),
                );
                rollout.samples = episodes
                    .into_iter()
                    .map(|record| episode_sample(record, setup.env.as_ref()))
                    .collect();
                scored.push(rewards.score(rollout)?);
            }
        }
        Ok(scored)
    };
    let records = |groups: &[ScoredGroup]| -> Vec<Vec<SampleRecord>> {
        groups
            .iter()
            .map(|group| {
                group
                    .rollout
                    .samples
                    .iter()
                    .zip(&group.rewards)
                    .map(|(sample, reward)| SampleRecord {
                        completion: sample.text.clone(),
                        tokens: sample.model_tokens(),
                        truncated: sample.truncated(),
                        score: reward.score,
                        outcome: reward.outcome,
                        extracted: None,
                        reason: None,
                    })
                    .collect()
            })
            .collect()
    };
    let greedy_groups = play(1, 0.0)?;
    let k = sampling.samples.max(1);
    let greedy = records(&greedy_groups);
    let sampled = if k > 1 {
        records(&play(k, sampling.temperature)?)
    } else {
        greedy.clone()
    };
    let n = tasks.len() as f64;
    let summaries: Vec<&EpisodeSummary> = greedy_groups
        .iter()
        .filter_map(|g| g.rollout.samples.first())
        .filter_map(|s| s.episode.as_deref())
        .collect();
    let episodes = EpisodeFigures {
        mean_turns: summaries.iter().map(|e| e.model_turns as f64).sum::<f64>() / n,
        mean_tool_calls: summaries
            .iter()
            .map(|e| e.tool_calls.len() as f64)
            .sum::<f64>()
            / n,
        tool_use_rate: summaries
            .iter()
            .filter(|e| !e.tool_calls.is_empty())
            .count() as f64
            / n,
        mean_outcome: summaries.iter().map(|e| e.outcome_reward).sum::<f64>() / n,
        graded_outcome: summaries.iter().any(|e| e.grades_outcome),
    };
    Ok(HeldOutResult {
        problems: tasks.len(),
        greedy_pass_at_1: pass_at(&greedy, 1),
        pass_at_1: pass_at(&sampled, 1),
        pass_at_k: pass_at(&sampled, k),
        k,
        mean_length: greedy.iter().map(|g| g[0].tokens as f64).sum::<f64>() / n,
        seconds: started.elapsed().as_secs_f64(),
        examples: greedy
            .iter()
            .zip(tasks)
            .take(4)
            .map(|(g, t)| {
                (
                    t.id.clone(),
                    g[0].completion.clone(),
                    g[0].outcome == Outcome::Correct,
                )
            })
            .collect(),
        episodes: Some(episodes),
    })
}

/// The harness's unbiased pass@k over each task's samples.
fn pass_at(groups: &[Vec<SampleRecord>], k: usize) -> f64 {
    let refs: Vec<&[SampleRecord]> = groups.iter().map(Vec::as_slice).collect();
    let n = groups.first().map_or(1, Vec::len);
    generative_metrics(&refs, n, &[k])
        .get(&format!("pass@{k}"))
        .map_or(0.0, |m| m.value)
}

/// Each task's samples, graded by the run's reward pool (harness records).
fn generate_and_score(
    model: &Transformer,
    tokenizer: &Tokenizer,
    tasks: &[Arc<Task>],
    rewards: &dyn RewardService,
    sampling: &EvalSampling,
    n: usize,
    temperature: f32,
) -> Result<Vec<Vec<SampleRecord>>, PipelineError> {
    let target = LocalTarget {
        model,
        tokenizer: tokenizer.clone(),
        name: "policy".into(),
    };
    let settings = GenerationFile {
        max_tokens: sampling.max_new_tokens,
        temperature,
        top_p: if temperature == 0.0 {
            1.0
        } else {
            sampling.top_p
        },
        top_k: sampling.top_k.unwrap_or(0),
        stop: Vec::new(),
        n,
        seed: sampling.seed.wrapping_add(EVAL_SEED_OFFSET),
        pass_at: Vec::new(),
    };
    let requests: Vec<GenerateRequest> = tasks
        .iter()
        .enumerate()
        .map(|(i, t)| GenerateRequest {
            ids: t.prompt_ids.clone(),
            number: i as u64,
            max_tokens: sampling.max_new_tokens,
        })
        .collect();
    let outputs = harness::generate(&target, &requests, &settings, EVAL_BATCH)?;
    let mut groups = Vec::with_capacity(tasks.len());
    for (index, (task, samples)) in tasks.iter().zip(outputs).enumerate() {
        let completions = samples
            .iter()
            .enumerate()
            .map(|(sample_index, s)| Completion {
                prompt_index: index,
                sample_index,
                token_ids: s.ids.clone(),
                logprobs: Vec::new(),
                text: Some(s.text.clone()),
                finish_reason: if s.truncated {
                    FinishReason::Length
                } else {
                    FinishReason::Eos {
                        token_id: s.ids.last().copied().unwrap_or(0),
                    }
                },
            })
            .collect();
        let group = RolloutGroup::offline(index as u64, Arc::clone(task), temperature, completions);
        let scored = rewards.score(group)?;
        groups.push(
            samples
                .into_iter()
                .zip(scored.rewards)
                .map(|(s, r)| SampleRecord {
                    completion: s.text,
                    tokens: s.tokens,
                    truncated: s.truncated,
                    score: r.score,
                    outcome: r.outcome,
                    extracted: None,
                    reason: None,
                })
                .collect(),
        );
    }
    Ok(groups)
}
