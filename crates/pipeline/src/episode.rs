//! The multi-turn episode runner: the generation engine and an [`Environment`] taking turns,
//! token-exact, for whole batches of episodes at once.
//!
//! What it is: [`EpisodeRunner::run`] plays one episode per (group, sample) of the given groups
//! and returns each as an [`EpisodeRecord`]: the [`Transcript`] (prompt, the model's sampled
//! ids with log-probs and weight versions, the environment's template-rendered ids), the loss
//! mask that follows from it, rewards, tool calls and why it stopped. What it is not: the
//! environment (`stoke_env`), the reward of the final answer (the reward module scores
//! [`Transcript::final_text`]) or the staleness gate (the caller hands in granted groups and the
//! weights to sample with).
//!
//! One call, turn by turn:
//! 1. Start an episode per sample (guarded: an environment that fails to start ends only that
//!    episode, with the failure recorded).
//! 2. Turn 0 samples every group's prompt with `n = group size` (one shared prefill; sample `j`
//!    of group `g` draws from stream `(seed, g, j)`, exactly the single-turn stream). Later
//!    turns continue every live episode's own sequence with `n = 1` from stream
//!    `(seed, g, j, turn)`, so an episode's tokens depend on (seed, group, sample, weights)
//!    only, never on which other episodes share the engine call.
//! 3. Each model turn is kept as sampled. A turn that did not end on a stop token (its
//!    `max_turn_tokens` or the context ran out) ends the episode (`TurnTruncated`), and so does
//!    one that ended on an end-of-sequence token the template does not close turns with
//!    (`ModelEnded`: nothing can follow it in the chat format). Otherwise the
//!    turn's text (decoded with special tokens, without the stop token) is parsed for tool calls
//!    with the run's parser and handed to the episode's `step` (guarded, all live episodes in
//!    parallel).
//! 4. The environment's messages are rendered as ids (`TurnRenderer::continuation_ids`) and
//!    appended, unless the episode is done, reached `max_turns` (the step still ran, so tools a
//!    last turn called have acted on the final state), or would pass `max_total_tokens` or the
//!    model's context; each of those is the recorded stop reason.
//! 5. Every episode still in hand is finished (`Episode::finish`, guarded): its outcome reward.
//!
//! Limits are checked where they bind: a model turn longer than the tokens left under
//! `max_total_tokens` is cut there (the kept ids and log-probs are exactly the sampled ones).
//!
//! Where turns are sampled is a [`TurnEngine`]: [`InProcess`] (the rollout engine on live
//! weights) or remote servers (`remote::rollout`, token-id prompts in, ids, log-probs and
//! per-token versions out, the same stream keys).
//!
//! Invariants of a record: `transcript.completion_ids()`, `loss_mask()`, `logprobs()` and
//! `versions()` have equal lengths; mask-true ids are exactly the sampled ids in order;
//! versions never decrease; `turn_rewards` has one entry per environment step taken.

use std::sync::{Arc, Mutex, PoisonError};
use std::time::Instant;

use stoke_env::environment::ToolCallRecord;
use stoke_env::guard::guarded;
use stoke_env::{
    EnvError, EnvStep, EnvTask, Environment, Episode, ModelTurn, Opening, Segment, StopReason,
    Transcript, TurnRenderer,
};
use stoke_rollout::{
    Completion, FinishReason, GenerationRequest, LiveGeneration, LiveWeights, SamplingParams,
    StreamKey, generate_live,
};
use stoke_tokenizer::chat::ChatTemplate;
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::tool_calls::ToolCallParser;

use crate::env_settings::{EnvironmentKind, EnvironmentSettings, ToolsIn};
use crate::error::PipelineError;

pub use crate::env_settings::EpisodeLimits;

/// Where an episode's turns are sampled.
pub trait TurnEngine: Sync {
    /// The longest sequence (prompt and completion) the engine continues.
    fn max_positions(&self) -> Result<usize, PipelineError>;

    /// `request`'s prompts (token ids), `params.n` samples each from the keyed streams: the
    /// completions and per-token weight versions in request order (`LiveGeneration`'s shape).
    fn generate(&self, request: &GenerationRequest) -> Result<LiveGeneration, PipelineError>;
}

/// The rollout engine in this process, on live weights.
pub struct InProcess<'a>(pub &'a dyn LiveWeights);

impl TurnEngine for InProcess<'_> {
    fn max_positions(&self) -> Result<usize, PipelineError> {
        Ok(self.0.current().0.config().max_position_embeddings)
    }

    fn generate(&self, request: &GenerationRequest) -> Result<LiveGeneration, PipelineError> {
        Ok(generate_live(self.0, request, None)?)
    }
}

/// One group of episodes to play: a task, its opening (the same for every sample) and the
/// opening's prompt ids.
#[derive(Clone, Debug)]
pub struct EpisodeGroup {
    /// The group's number (its random streams).
    pub group_id: u64,
    pub task: Arc<EnvTask>,
    pub opening: Opening,
    pub prompt_ids: Vec<u32>,
}

/// One played episode.
#[derive(Clone, Debug)]
pub struct EpisodeRecord {
    pub transcript: Transcript,
    pub stop: StopReason,
    /// The environment's reward per step taken.
    pub turn_rewards: Vec<f64>,
    /// The environment's outcome reward on the final state (0 when it gives none or failed).
    pub outcome_reward: f64,
    pub tool_calls: Vec<ToolCallRecord>,
    /// How the last model turn ended.
    pub finish: FinishReason,
    /// Seconds inside environment calls.
    pub env_seconds: f64,
}

impl EpisodeRecord {
    /// The environment's total reward: per-step rewards plus the outcome.
    pub fn env_reward(&self) -> f64 {
        self.turn_rewards.iter().sum::<f64>() + self.outcome_reward
    }

    /// Whether the environment failed (error, panic, timeout).
    pub fn env_failed(&self) -> bool {
        matches!(self.stop, StopReason::EnvFailed { .. })
    }
}

/// Counters of episodes played.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct EpisodeStats {
    pub episodes: u64,
    pub model_turns: u64,
    pub engine_calls: u64,
    pub generated_tokens: u64,
    pub env_tokens: u64,
    pub tool_calls: u64,
    pub generate_seconds: f64,
    pub env_seconds: f64,
    pub tool_seconds: f64,
    /// Episodes per stop reason (`StopReason::name`).
    pub stops: std::collections::BTreeMap<&'static str, u64>,
}

impl EpisodeStats {
    /// Adds `other`'s counts to these.
    pub fn add(&mut self, other: &EpisodeStats) {
        self.episodes += other.episodes;
        self.model_turns += other.model_turns;
        self.engine_calls += other.engine_calls;
        self.generated_tokens += other.generated_tokens;
        self.env_tokens += other.env_tokens;
        self.tool_calls += other.tool_calls;
        self.generate_seconds += other.generate_seconds;
        self.env_seconds += other.env_seconds;
        self.tool_seconds += other.tool_seconds;
        for (name, count) in &other.stops {
            *self.stops.entry(name).or_default() += count;
        }
    }

    /// Episodes whose environment failed.
    pub fn env_failures(&self) -> u64 {
        self.stops.get("env_failed").copied().unwrap_or(0)
    }
}

/// Plays episodes of one environment with one tokenizer, template and tool-call parser.
pub struct EpisodeRunner<'a> {
    pub env: Arc<dyn Environment>,
    pub tokenizer: &'a Tokenizer,
    pub template: &'a ChatTemplate,
    pub parser: ToolCallParser,
    pub limits: EpisodeLimits,
    /// Give the opening's tools to the template's `tools` variable (else the environment
    /// describes them in its own messages).
    pub tools_in_template: bool,
}

impl std::fmt::Debug for EpisodeRunner<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpisodeRunner")
            .field("env", &self.env.name())
            .field("parser", &self.parser)
            .field("limits", &self.limits)
            .finish_non_exhaustive()
    }
}

/// An episode being played.
struct Live {
    group: usize,
    sample: usize,
    episode: Option<Box<dyn Episode>>,
    transcript: Transcript,
    history: Vec<stoke_tokenizer::chat::ChatMessage>,
    stop: Option<StopReason>,
    turn_rewards: Vec<f64>,
    outcome_reward: f64,
    tool_calls: Vec<ToolCallRecord>,
    finish: FinishReason,
    env_seconds: f64,
    /// Ids after the prompt so far.
    used: usize,
    /// The environment's messages of the step just taken, not yet appended.
    pending: Vec<stoke_tokenizer::chat::ChatMessage>,
    /// The last model turn was cut at its limit and is to be closed before the environment's
    /// messages.
    open_turn: bool,
}

impl EpisodeRunner<'_> {
    /// The opening of `task` and its prompt ids.
    pub fn open(&self, task: &EnvTask) -> Result<(Opening, Vec<u32>), EnvError> {
        let opening = self.env.opening(task)?;
        let prompt_ids = self.renderer(&opening)?.prompt_ids(&opening.messages)?;
        Ok((opening, prompt_ids))
    }

    fn renderer(&self, opening: &Opening) -> Result<TurnRenderer<'_>, EnvError> {
        let tools = if self.tools_in_template {
            &opening.tools[..]
        } else {
            &[]
        };
        TurnRenderer::new(self.tokenizer, self.template, tools)
    }

    /// Plays `params.n` episodes per group (see the module doc); `records[g][j]` is sample `j`
    /// of group `g`. Errors: the engine failed (every episode of the call is lost, as a failed
    /// single-turn generation loses its groups); environment failures are records, not errors.
    pub fn run(
        &self,
        weights: &dyn LiveWeights,
        params: &SamplingParams,
        groups: &[EpisodeGroup],
        stats: &mut EpisodeStats,
    ) -> Result<Vec<Vec<EpisodeRecord>>, PipelineError> {
        self.run_on(&InProcess(weights), params, groups, stats)
    }

    /// Plays scripted model `turns` (texts in the run's tool-call format) through a fresh
    /// episode of `task`, as a model's turns would be played: parsed with the run's parser,
    /// stepped, the environment's messages appended, then `finish`ed. The conversation is the
    /// opening, each turn as an assistant message holding its raw text (as
    /// [`Transcript::messages`] writes a sampled turn) and the environment's real messages, so
    /// SFT on it renders what a GRPO episode of the same turns renders. Errors: the environment
    /// failed, ended the episode before the last turn, or the script is longer than
    /// `max_turns`.
    pub fn demonstrate(&self, task: &EnvTask, turns: &[String]) -> Result<Demonstration, EnvError> {
        if turns.len() > self.limits.max_turns {
            return Err(EnvError::config(
                "environment.max_turns",
                format!(
                    "task {}: the demonstration takes {} turns, max_turns is {}",
                    task.id,
                    turns.len(),
                    self.limits.max_turns
                ),
            ));
        }
        let opening = self.env.opening(task)?;
        let renderer = self.renderer(&opening)?;
        let mut episode = self.env.start(task)?;
        let mut messages = opening.messages.clone();
        let mut demonstration = Demonstration::default();
        for (index, text) in turns.iter().enumerate() {
            let parsed = self.parser.parse(text, &format!("call-{index}"));
            let step = episode.step(&ModelTurn {
                index,
                text,
                content: parsed.content.as_deref(),
                tool_calls: &parsed.calls,
            })?;
            messages.push(stoke_tokenizer::chat::ChatMessage::assistant(text.clone()));
            let turn_tokens = self
                .tokenizer
                .encode(text, false)
                .map_err(|e| EnvError::failed(self.env.name(), e.to_string()))?
                .len();
            demonstration.max_turn_tokens = demonstration.max_turn_tokens.max(turn_tokens);
            demonstration.reward += step.reward;
            demonstration.tool_calls += step.tool_calls.len();
            demonstration.failed_tool_calls += step.tool_calls.iter().filter(|c| c.failed).count();
            if step.done {
                if index + 1 < turns.len() {
                    return Err(EnvError::failed(
                        self.env.name(),
                        format!(
                            "task {}: the episode ended after turn {} of the {}-turn demonstration",
                            task.id,
                            index + 1,
                            turns.len()
                        ),
                    ));
                }
                break;
            }
            messages.extend(step.messages);
        }
        demonstration.outcome = episode.finish(&StopReason::Done)?;
        demonstration.reward += demonstration.outcome;
        demonstration.total_tokens = renderer.prompt_ids(&messages)?.len();
        demonstration.messages = messages;
        Ok(demonstration)
    }

    /// [`EpisodeRunner::run`] with its turns sampled by `engine`.
    pub fn run_on(
        &self,
        engine: &dyn TurnEngine,
        params: &SamplingParams,
        groups: &[EpisodeGroup],
        stats: &mut EpisodeStats,
    ) -> Result<Vec<Vec<EpisodeRecord>>, PipelineError> {
        self.limits.validate()?;
        let samples = params.n.max(1);
        let renderers: Vec<TurnRenderer<'_>> = groups
            .iter()
            .map(|group| self.renderer(&group.opening))
            .collect::<Result<_, _>>()
            .map_err(|error| PipelineError::config("environment", error.to_string()))?;
        let closer = renderers
            .first()
            .and_then(|r| r.turn_closer().map(str::to_string));
        let closer_id = closer
            .as_deref()
            .and_then(|text| self.tokenizer.token_to_id(text));
        let max_positions = engine.max_positions()?;

        // 1. Start every episode.
        let mut live: Vec<Live> = Vec::with_capacity(groups.len() * samples);
        for (g, group) in groups.iter().enumerate() {
            for j in 0..samples {
                let started = Instant::now();
                let task = Arc::clone(&group.task);
                let env = Arc::clone(&self.env);
                let result = guarded(self.env.name(), self.limits.env_timeout, move || {
                    env.start(&task)
                });
                let room =
                    group.prompt_ids.len() + 1 < max_positions && !group.prompt_ids.is_empty();
                let (episode, stop) = match result {
                    // A prompt the model cannot continue ends its episodes before any turn.
                    Ok(_) if !room => (
                        None,
                        Some(StopReason::ContextFull {
                            tokens: group.prompt_ids.len(),
                        }),
                    ),
                    Ok(episode) => (Some(episode), None),
                    Err(error) => (
                        None,
                        Some(StopReason::EnvFailed {
                            message: error.to_string(),
                        }),
                    ),
                };
                live.push(Live {
                    group: g,
                    sample: j,
                    episode,
                    transcript: Transcript {
                        opening: group.opening.clone(),
                        prompt_ids: group.prompt_ids.clone(),
                        segments: Vec::new(),
                    },
                    history: group.opening.messages.clone(),
                    stop,
                    turn_rewards: Vec::new(),
                    outcome_reward: 0.0,
                    tool_calls: Vec::new(),
                    finish: FinishReason::Length,
                    env_seconds: started.elapsed().as_secs_f64(),
                    used: 0,
                    pending: Vec::new(),
                    open_turn: false,
                });
            }
        }

        // 2-4. Turns.
        for turn in 0..self.limits.max_turns {
            let active: Vec<usize> = (0..live.len())
                .filter(|&i| live[i].stop.is_none())
                .collect();
            if active.is_empty() {
                break;
            }
            let completions = self.generate(engine, params, groups, &live, &active, turn, stats)?;
            let mut stepping: Vec<usize> = Vec::new();
            for (&index, completion) in active.iter().zip(completions) {
                if self.take_model_turn(
                    &mut live[index],
                    completion,
                    turn,
                    max_positions,
                    closer_id,
                )? {
                    stepping.push(index);
                }
            }
            self.step_all(&mut live, &stepping, turn);
            for &index in &stepping {
                self.append_env_turn(
                    &mut live[index],
                    &renderers,
                    turn,
                    max_positions,
                    closer_id,
                    stats,
                );
            }
        }

        // 5. Finish every episode still in hand, in parallel (an outcome may run tests).
        let name = self.env.name().to_string();
        let timeout = self.limits.env_timeout;
        let max_turns = self.limits.max_turns;
        std::thread::scope(|scope| {
            for episode in live.iter_mut() {
                let name = name.clone();
                scope.spawn(move || {
                    let stop = episode
                        .stop
                        .clone()
                        .unwrap_or(StopReason::MaxTurns { turns: max_turns });
                    if let Some(mut handle) = episode.episode.take() {
                        let started = Instant::now();
                        let stop_for_call = stop.clone();
                        match guarded(&name, timeout, move || handle.finish(&stop_for_call)) {
                            Ok(reward) if reward.is_finite() => episode.outcome_reward = reward,
                            Ok(reward) => {
                                episode.stop = Some(StopReason::EnvFailed {
                                    message: format!("finish gave a non-finite reward {reward}"),
                                })
                            }
                            Err(error) => {
                                episode.stop = Some(StopReason::EnvFailed {
                                    message: error.to_string(),
                                })
                            }
                        }
                        episode.env_seconds += started.elapsed().as_secs_f64();
                    }
                    if episode.stop.is_none() {
                        episode.stop = Some(stop);
                    }
                });
            }
        });

        let mut records: Vec<Vec<EpisodeRecord>> = (0..groups.len()).map(|_| Vec::new()).collect();
        for episode in live {
            stats.episodes += 1;
            stats.model_turns += episode.transcript.model_turns() as u64;
            stats.tool_calls += episode.tool_calls.len() as u64;
            stats.tool_seconds += episode.tool_calls.iter().map(|c| c.seconds).sum::<f64>();
            stats.env_seconds += episode.env_seconds;
            let stop = episode.stop.unwrap_or(StopReason::Done);
            *stats.stops.entry(stop.name()).or_default() += 1;
            records[episode.group].push(EpisodeRecord {
                stop,
                transcript: episode.transcript,
                turn_rewards: episode.turn_rewards,
                outcome_reward: episode.outcome_reward,
                tool_calls: episode.tool_calls,
                finish: episode.finish,
                env_seconds: episode.env_seconds,
            });
        }
        Ok(records)
    }

    /// One engine call for the active episodes of this turn; one completion per active episode,
    /// in order.
    #[allow(clippy::too_many_arguments)]
    fn generate(
        &self,
        engine: &dyn TurnEngine,
        params: &SamplingParams,
        groups: &[EpisodeGroup],
        live: &[Live],
        active: &[usize],
        turn: usize,
        stats: &mut EpisodeStats,
    ) -> Result<Vec<VersionedCompletion>, PipelineError> {
        let mut turn_params = params.clone();
        turn_params.max_new_tokens = self.limits.max_turn_tokens;
        turn_params.stop_strings = Vec::new();
        let started = Instant::now();
        let completions = if turn == 0 {
            // Sample whole groups with one prefill each (streams (seed, g, j), the single-turn
            // ones), and keep the active episodes' samples.
            let wanted: Vec<usize> = (0..groups.len())
                .filter(|&g| active.iter().any(|&i| live[i].group == g))
                .collect();
            let request = GenerationRequest {
                prompts: wanted
                    .iter()
                    .map(|&g| groups[g].prompt_ids.clone())
                    .collect(),
                params: turn_params,
                first_prompt_number: 0,
                streams: Some(
                    wanted
                        .iter()
                        .map(|&g| StreamKey {
                            prompt_number: groups[g].group_id,
                            first_sample: 0,
                            turn: 0,
                        })
                        .collect(),
                ),
            };
            let generation = engine.generate(&request)?;
            stats.generated_tokens += generation.output.generated_tokens as u64;
            let mut by_sample: Vec<Vec<Option<VersionedCompletion>>> =
                (0..groups.len()).map(|_| Vec::new()).collect();
            for ((completions, versions), &g) in generation
                .output
                .completions
                .into_iter()
                .zip(generation.token_versions)
                .zip(&wanted)
            {
                by_sample[g] = completions
                    .into_iter()
                    .zip(versions)
                    .map(|(completion, versions)| {
                        Some(VersionedCompletion::new(completion, versions))
                    })
                    .collect();
            }
            active
                .iter()
                .map(|&i| {
                    by_sample[live[i].group][live[i].sample]
                        .take()
                        .expect("one completion per episode")
                })
                .collect()
        } else {
            turn_params.n = 1;
            let request = GenerationRequest {
                prompts: active
                    .iter()
                    .map(|&i| {
                        let mut ids = live[i].transcript.prompt_ids.clone();
                        ids.extend(live[i].transcript.completion_ids());
                        ids
                    })
                    .collect(),
                params: turn_params,
                first_prompt_number: 0,
                streams: Some(
                    active
                        .iter()
                        .map(|&i| StreamKey {
                            prompt_number: groups[live[i].group].group_id,
                            first_sample: live[i].sample as u64,
                            turn: turn as u64,
                        })
                        .collect(),
                ),
            };
            let generation = engine.generate(&request)?;
            stats.generated_tokens += generation.output.generated_tokens as u64;
            generation
                .output
                .completions
                .into_iter()
                .zip(generation.token_versions)
                .map(|(mut completions, mut versions)| {
                    VersionedCompletion::new(completions.remove(0), versions.remove(0))
                })
                .collect()
        };
        stats.engine_calls += 1;
        stats.generate_seconds += started.elapsed().as_secs_f64();
        Ok(completions)
    }

    /// Appends the model's turn; whether the environment should now take its step.
    fn take_model_turn(
        &self,
        episode: &mut Live,
        completion: VersionedCompletion,
        turn: usize,
        max_positions: usize,
        closer_id: Option<u32>,
    ) -> Result<bool, PipelineError> {
        let VersionedCompletion {
            mut ids,
            mut logprobs,
            mut versions,
            finish,
        } = completion;
        let room = self.limits.max_total_tokens - episode.used;
        let mut cut = false;
        if ids.len() > room {
            ids.truncate(room);
            logprobs.truncate(room);
            versions.truncate(room);
            cut = true;
        }
        let ended_turn = matches!(finish, FinishReason::Eos { .. }) && !cut;
        let content_ids = if ended_turn {
            &ids[..ids.len() - 1]
        } else {
            &ids[..]
        };
        let unknown = content_ids
            .iter()
            .copied()
            .find(|&id| self.tokenizer.id_to_token(id).is_none());
        let text = match unknown {
            Some(_) => String::new(),
            None => self
                .tokenizer
                .decode(content_ids, false)
                .map_err(|e| PipelineError::config("tokenizer", e.to_string()))?,
        };
        episode.used += ids.len();
        episode.finish = if cut { FinishReason::Length } else { finish };
        episode
            .history
            .push(stoke_tokenizer::chat::ChatMessage::assistant(text.clone()));
        episode.transcript.segments.push(Segment::Model {
            ids,
            logprobs,
            versions,
            text,
        });
        if let Some(token_id) = unknown {
            episode.stop = Some(StopReason::Undecodable { token_id });
            return Ok(false);
        }
        if cut {
            episode.stop = Some(StopReason::MaxTotalTokens {
                tokens: episode.used,
            });
            return Ok(false);
        }
        if let FinishReason::Eos { token_id } = episode.finish
            && ended_turn
            && closer_id != Some(token_id)
        {
            episode.stop = Some(StopReason::ModelEnded { token_id });
            return Ok(false);
        }
        if !ended_turn {
            let total = episode.transcript.prompt_ids.len() + episode.used;
            if total + 1 >= max_positions {
                episode.stop = Some(StopReason::ContextFull { tokens: total });
                return Ok(false);
            }
            if self.limits.close_truncated_turns && closer_id.is_some() {
                // The environment answers; the turn is closed when its messages are appended.
                episode.open_turn = true;
                return Ok(true);
            }
            episode.stop = Some(StopReason::TurnTruncated { turn });
            return Ok(false);
        }
        Ok(true)
    }

    /// Runs the environment's step for every episode in `indices`, in parallel, each guarded.
    fn step_all(&self, live: &mut [Live], indices: &[usize], turn: usize) {
        let parser = self.parser;
        let timeout = self.limits.env_timeout;
        let name = self.env.name().to_string();
        let jobs: Vec<(usize, Box<dyn Episode>, String)> = indices
            .iter()
            .filter_map(|&i| {
                let text = match live[i].transcript.segments.last() {
                    Some(Segment::Model { text, .. }) => text.clone(),
                    _ => String::new(),
                };
                live[i].episode.take().map(|episode| (i, episode, text))
            })
            .collect();
        let results: Mutex<Vec<StepOutcome>> = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            for (index, mut episode, text) in jobs {
                let results = &results;
                let name = name.clone();
                scope.spawn(move || {
                    let started = Instant::now();
                    let result = guarded(&name, timeout, move || {
                        let parsed = parser.parse(&text, &format!("call-{turn}"));
                        let model_turn = ModelTurn {
                            index: turn,
                            text: &text,
                            content: parsed.content.as_deref(),
                            tool_calls: &parsed.calls,
                        };
                        let step = episode.step(&model_turn)?;
                        Ok((episode, step))
                    });
                    results
                        .lock()
                        .unwrap_or_else(PoisonError::into_inner)
                        .push((index, result, started.elapsed().as_secs_f64()));
                });
            }
        });
        for (index, result, seconds) in results.into_inner().unwrap_or_else(PoisonError::into_inner)
        {
            let episode = &mut live[index];
            episode.env_seconds += seconds;
            match result {
                Ok((handle, step)) if step.reward.is_finite() => {
                    episode.episode = Some(handle);
                    episode.turn_rewards.push(step.reward);
                    episode.tool_calls.extend(step.tool_calls);
                    if step.done {
                        episode.stop = Some(StopReason::Done);
                    }
                    episode.pending = step.messages;
                }
                Ok((handle, step)) => {
                    episode.episode = Some(handle);
                    episode.stop = Some(StopReason::EnvFailed {
                        message: format!("step gave a non-finite reward {}", step.reward),
                    });
                }
                Err(error) => {
                    episode.stop = Some(StopReason::EnvFailed {
                        message: error.to_string(),
                    });
                }
            }
        }
    }

    /// Appends the environment's pending messages as ids, or records why the episode stops.
    fn append_env_turn(
        &self,
        episode: &mut Live,
        renderers: &[TurnRenderer<'_>],
        turn: usize,
        max_positions: usize,
        closer_id: Option<u32>,
        stats: &mut EpisodeStats,
    ) {
        let pending = std::mem::take(&mut episode.pending);
        let close: Vec<u32> = match (std::mem::take(&mut episode.open_turn), closer_id) {
            (true, Some(id)) => vec![id],
            _ => Vec::new(),
        };
        if episode.stop.is_some() {
            return;
        }
        if turn + 1 >= self.limits.max_turns {
            episode.stop = Some(StopReason::MaxTurns {
                turns: self.limits.max_turns,
            });
            return;
        }
        if pending.is_empty() {
            // Not done, but nothing to say: the model takes another turn right away, which the
            // template cannot express without a message in between.
            episode.stop = Some(StopReason::EnvFailed {
                message: "the environment returned no messages and did not end the episode".into(),
            });
            return;
        }
        let ids = match renderers[episode.group].continuation_ids(&episode.history, &pending) {
            Ok(ids) => ids,
            Err(error) => {
                episode.stop = Some(StopReason::EnvFailed {
                    message: error.to_string(),
                });
                return;
            }
        };
        let appended = close.len() + ids.len();
        if episode.used + appended >= self.limits.max_total_tokens {
            episode.stop = Some(StopReason::MaxTotalTokens {
                tokens: episode.used + appended,
            });
            return;
        }
        let total = episode.transcript.prompt_ids.len() + episode.used + appended;
        if total + 1 >= max_positions {
            episode.stop = Some(StopReason::ContextFull { tokens: total });
            return;
        }
        stats.env_tokens += appended as u64;
        episode.used += appended;
        if !close.is_empty() {
            episode
                .transcript
                .segments
                .push(Segment::Close { ids: close });
        }
        episode.history.extend(pending.iter().cloned());
        episode.transcript.segments.push(Segment::Env {
            ids,
            messages: pending,
        });
    }
}

/// An episode's step, by live index: the episode back with the step, or the failure, and the
/// seconds it took.
type StepOutcome = (usize, Result<(Box<dyn Episode>, EnvStep), EnvError>, f64);

/// One model turn as the engine sampled it, with the version of each token.
struct VersionedCompletion {
    ids: Vec<u32>,
    logprobs: Vec<f32>,
    versions: Vec<u64>,
    finish: FinishReason,
}

impl VersionedCompletion {
    fn new(completion: Completion, versions: Vec<u64>) -> VersionedCompletion {
        VersionedCompletion {
            ids: completion.token_ids,
            logprobs: completion.logprobs,
            versions,
            finish: completion.finish_reason,
        }
    }
}

/// A scripted episode ([`EpisodeRunner::demonstrate`]): its conversation and what the
/// environment made of it.
#[derive(Clone, Debug, Default)]
pub struct Demonstration {
    pub messages: Vec<stoke_tokenizer::chat::ChatMessage>,
    /// The environment's outcome reward (`finish`).
    pub outcome: f64,
    /// The per-turn rewards plus the outcome.
    pub reward: f64,
    pub tool_calls: usize,
    pub failed_tool_calls: usize,
    /// The longest scripted turn in tokens (without the turn's end token).
    pub max_turn_tokens: usize,
    /// The whole conversation rendered by the template, in tokens.
    pub total_tokens: usize,
}

/// What a run needs to play episodes: the environment, and how its tools meet the model.
#[derive(Clone)]
pub struct EpisodeSetup {
    pub env: Arc<dyn Environment>,
    pub parser: ToolCallParser,
    pub limits: EpisodeLimits,
    pub tools_in_template: bool,
    /// Whether the model is shown its tools at all (in the template or the system prompt);
    /// false with `tools_in = "none"`.
    pub tools_described: bool,
}

impl std::fmt::Debug for EpisodeSetup {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EpisodeSetup")
            .field("env", &self.env.name())
            .field("parser", &self.parser)
            .field("limits", &self.limits)
            .field("tools_in_template", &self.tools_in_template)
            .finish()
    }
}

impl EpisodeSetup {
    /// Builds the configured environment for `template`: the parser (`auto`: the template's
    /// format, else Hermes) and where tools are shown (`auto`: the template's `tools` variable
    /// when it renders one, else the environment's system prompt). A template asked to show
    /// tools it cannot render is an error naming `environment.tools_in`.
    pub fn new(
        settings: &EnvironmentSettings,
        template: &ChatTemplate,
    ) -> Result<EpisodeSetup, PipelineError> {
        let renders = stoke_env::transcript::template_renders_tools(template);
        let tools_in_template = match settings.tools_in {
            ToolsIn::Auto => renders,
            ToolsIn::System | ToolsIn::None => false,
            ToolsIn::Template if renders => true,
            ToolsIn::Template => {
                return Err(PipelineError::config(
                    "environment.tools_in",
                    format!(
                        "the chat template `{}` never reads a `tools` variable; use \"system\" or \"auto\"",
                        template.name()
                    ),
                ));
            }
        };
        // Tools the template does not show are described in the system prompt, unless the
        // config says the model knows them (`tools_in = "none"`).
        let describe_tools = !tools_in_template && settings.tools_in != ToolsIn::None;
        let env: Arc<dyn Environment> = match settings.kind {
            EnvironmentKind::Calculator => Arc::new(
                stoke_env::arithmetic::calculator_environment(
                    describe_tools,
                    settings.tools.clone(),
                )
                .map_err(|e| PipelineError::config("environment", e.to_string()))?,
            ),
            EnvironmentKind::GuessNumber => Arc::new(stoke_env::guess::GuessNumber::default()),
            EnvironmentKind::Tools => Arc::new(
                stoke_env::toolbox::build_toolbox(
                    &stoke_env::toolbox::ToolboxSpec {
                        system_prompt: settings.system_prompt.clone(),
                        builtins: settings.builtins.clone(),
                        mcp: settings.mcp.clone(),
                        limits: settings.tools.clone(),
                        requires_tool: settings.requires_tool,
                    },
                    describe_tools,
                )
                .map_err(|e| PipelineError::config("environment", e.to_string()))?,
            ),
            EnvironmentKind::OpenEnv => {
                let spec = settings.openenv.clone().ok_or_else(|| {
                    PipelineError::config("environment.openenv", "missing for kind = \"openenv\"")
                })?;
                Arc::new(
                    stoke_env::OpenEnvEnvironment::connect(spec, settings.limits.env_timeout)
                        .map_err(|e| PipelineError::config("environment.openenv", e.to_string()))?,
                )
            }
            EnvironmentKind::CodeRepair => Arc::new(
                stoke_env::CodeRepair::with_default_sandbox(describe_tools, settings.tools.clone())
                    .map_err(|e| PipelineError::config("environment", e.to_string()))?,
            ),
        };
        Ok(EpisodeSetup {
            env,
            parser: settings.parser.resolve(template.source()),
            limits: settings.limits.clone(),
            tools_in_template,
            tools_described: tools_in_template || describe_tools,
        })
    }

    /// The runner of this setup with `tokenizer` and `template`.
    pub fn runner<'a>(
        &self,
        tokenizer: &'a Tokenizer,
        template: &'a ChatTemplate,
    ) -> EpisodeRunner<'a> {
        EpisodeRunner {
            env: Arc::clone(&self.env),
            tokenizer,
            template,
            parser: self.parser,
            limits: self.limits.clone(),
            tools_in_template: self.tools_in_template,
        }
    }
}

/// The environment's view of a pipeline task.
pub fn env_task(task: &crate::records::Task) -> EnvTask {
    EnvTask {
        id: task.id.clone(),
        prompt: task.prompt.clone(),
        reference: task.reference.clone(),
        data: task.data.clone(),
    }
}

/// `tasks` with their prompt ids rendered from the environment's opening of each (its system
/// prompt, the tools when the template shows them), what the episodes and the trainer use.
/// Errors name the task.
pub fn episode_prompts(
    tasks: Vec<Arc<crate::records::Task>>,
    setup: &EpisodeSetup,
    tokenizer: &Tokenizer,
) -> Result<Vec<Arc<crate::records::Task>>, PipelineError> {
    let template = tokenizer
        .default_chat_template()
        .map_err(|e| PipelineError::config("environment", e.to_string()))?;
    let runner = setup.runner(tokenizer, template);
    tasks
        .into_iter()
        .map(|task| {
            let (_, prompt_ids) = runner.open(&env_task(&task)).map_err(|e| {
                PipelineError::config("environment", format!("task {}: {e}", task.id))
            })?;
            Ok(Arc::new(crate::records::Task {
                prompt_ids,
                ..(*task).clone()
            }))
        })
        .collect()
}
