//! The multi-turn episode runner on the tiny qwen2 fixture (random weights, the Qwen2.5 chat
//! template with tools): token exactness across turns, independence from batching, limits and
//! environment faults.

use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use candle_core::Device;
use stoke_env::{
    EnvError, EnvStep, EnvTask, Environment, Episode, ModelTurn, Opening, Segment, StopReason,
    ToolSpec, TurnRenderer,
};
use stoke_model::Transformer;
use stoke_pipeline::episode::{
    EpisodeGroup, EpisodeLimits, EpisodeRecord, EpisodeRunner, EpisodeStats,
};
use stoke_rollout::{FixedWeights, GenerationRequest, SamplingParams, StreamKey, generate_live};
use stoke_tokenizer::chat::{ChatMessage, Role, TemplateValue};
use stoke_tokenizer::hf::Tokenizer;
use stoke_tokenizer::tool_calls::ToolCallParser;

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

/// What the scripted environment does at each step.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Script {
    /// Answer every turn with a tool message; never done.
    Talk,
    /// Panic at the first step.
    Panic,
    /// Hang at the first step.
    Hang,
    /// Fail to start.
    NoStart,
}

struct Scripted(Script);

impl Environment for Scripted {
    fn name(&self) -> &str {
        "scripted"
    }
    fn opening(&self, task: &EnvTask) -> Result<Opening, EnvError> {
        Ok(Opening {
            // A one-letter system prompt: the template's default one takes half the fixture's
            // 128 positions.
            messages: vec![
                ChatMessage::system("s"),
                ChatMessage::user(task.prompt.clone()),
            ],
            tools: vec![ToolSpec {
                name: "echo".into(),
                description: "Echo.".into(),
                parameters: serde_json::json!({"type": "object", "properties": {}}),
            }],
        })
    }
    fn start(&self, _task: &EnvTask) -> Result<Box<dyn Episode>, EnvError> {
        if self.0 == Script::NoStart {
            return Err(EnvError::failed("scripted", "no room for another episode"));
        }
        Ok(Box::new(ScriptedEpisode { script: self.0 }))
    }
}

struct ScriptedEpisode {
    script: Script,
}

impl Episode for ScriptedEpisode {
    fn step(&mut self, turn: &ModelTurn<'_>) -> Result<EnvStep, EnvError> {
        match self.script {
            Script::Panic => panic!("the environment broke"),
            Script::Hang => {
                std::thread::sleep(Duration::from_secs(60));
                unreachable!()
            }
            _ => {}
        }
        let mut message = ChatMessage::new(Role::Tool, format!("ok{}", turn.index));
        message.extra.insert(
            "tool_call_id".into(),
            TemplateValue::from(format!("call-{}", turn.index)),
        );
        Ok(EnvStep {
            messages: vec![message],
            reward: 0.25,
            ..EnvStep::default()
        })
    }
    fn finish(&mut self, _stop: &StopReason) -> Result<f64, EnvError> {
        Ok(1.0)
    }
}

struct Fixture {
    model: Arc<Transformer>,
    tokenizer: Tokenizer,
}

/// The fixture with its (tied) embedding rows rescaled so that `<|im_end|>` often wins: the
/// random model would almost never end a turn on its own, and these tests need turns that end.
/// Its logits are `norm(h) . E[id]`, so shrinking every other row and growing `<|im_end|>`'s
/// makes that token's logit dominate wherever its dot product is positive.
fn fixture() -> Fixture {
    let tokenizer = Tokenizer::from_dir(&fixture_dir()).expect("tokenizer loads");
    let model = Transformer::load(&fixture_dir(), &Device::Cpu).expect("model loads");
    let end = tokenizer.token_to_id("<|im_end|>").expect("im_end") as usize;
    let (_, embedding) = model
        .parameters()
        .into_iter()
        .find(|(name, _)| name.contains("embed_tokens"))
        .expect("embedding");
    let (rows, _) = embedding.as_tensor().dims2().unwrap();
    let scale: Vec<f32> = (0..rows)
        .map(|row| if row == end { 4.0 } else { 0.05 })
        .collect();
    let scale = candle_core::Tensor::from_vec(scale, (rows, 1), &Device::Cpu).unwrap();
    let scaled = embedding.as_tensor().broadcast_mul(&scale).unwrap();
    embedding.set(&scaled).unwrap();
    Fixture {
        model: Arc::new(model),
        tokenizer,
    }
}

fn limits() -> EpisodeLimits {
    EpisodeLimits {
        max_turns: 4,
        max_total_tokens: 400,
        max_turn_tokens: 24,
        close_truncated_turns: false,
        env_timeout: Duration::from_secs(2),
    }
}

fn params(fixture: &Fixture, n: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens: 24,
        temperature: 1.0,
        top_k: None,
        top_p: 1.0,
        seed: 11,
        n,
        stop_token_ids: fixture.tokenizer.eos_token_ids(),
        stop_strings: Vec::new(),
    }
}

fn play(
    fixture: &Fixture,
    script: Script,
    group_ids: &[u64],
    n: usize,
    limits: EpisodeLimits,
) -> Vec<Vec<EpisodeRecord>> {
    let runner = runner(fixture, script, limits);
    let groups: Vec<EpisodeGroup> = group_ids
        .iter()
        .map(|&group_id| {
            let task = EnvTask {
                id: format!("t{group_id}"),
                prompt: format!("t{group_id}"),
                ..EnvTask::default()
            };
            let (opening, prompt_ids) = runner.open(&task).expect("opens");
            EpisodeGroup {
                group_id,
                task: Arc::new(task),
                opening,
                prompt_ids,
            }
        })
        .collect();
    let weights = FixedWeights {
        model: Arc::clone(&fixture.model),
        version: 3,
    };
    let mut stats = EpisodeStats::default();
    runner
        .run(&weights, &params(fixture, n), &groups, &mut stats)
        .expect("runs")
}

/// A runner of `script` on the fixture's tokenizer and template.
fn runner<'a>(fixture: &'a Fixture, script: Script, limits: EpisodeLimits) -> EpisodeRunner<'a> {
    EpisodeRunner {
        env: Arc::new(Scripted(script)),
        tokenizer: &fixture.tokenizer,
        template: fixture.tokenizer.default_chat_template().expect("template"),
        parser: ToolCallParser::Hermes,
        limits,
        // The tiny fixture has 128 positions: the Qwen tools preamble alone takes 512 ids.
        tools_in_template: false,
    }
}

#[test]
fn a_demonstration_plays_its_turns_through_the_environment() {
    let fixture = fixture();
    let task = EnvTask {
        id: "d".into(),
        prompt: "d".into(),
        ..EnvTask::default()
    };
    let turns = [
        r#"<tool_call>{"name": "echo", "arguments": {}}</tool_call>"#.to_string(),
        "done".to_string(),
    ];
    let demonstration = runner(&fixture, Script::Talk, limits())
        .demonstrate(&task, &turns)
        .expect("plays");
    // The opening, then each turn as an assistant message with its raw text, then the
    // environment's own message for it ("ok<turn>", from the scripted step).
    let roles: Vec<Role> = demonstration.messages.iter().map(|m| m.role).collect();
    assert_eq!(
        roles,
        [
            Role::System,
            Role::User,
            Role::Assistant,
            Role::Tool,
            Role::Assistant,
            Role::Tool
        ]
    );
    let text = |i: usize| {
        demonstration.messages[i]
            .content
            .as_ref()
            .unwrap()
            .joined_text()
    };
    assert_eq!(text(2), turns[0]);
    assert_eq!((text(3).as_str(), text(5).as_str()), ("ok0", "ok1"));
    assert_eq!(demonstration.outcome, 1.0);
    assert_eq!(demonstration.reward, 1.0 + 2.0 * 0.25);
    assert!(demonstration.max_turn_tokens >= 5, "{demonstration:?}");
    assert!(demonstration.total_tokens > demonstration.max_turn_tokens);

    // A script longer than max_turns, and an environment that fails, are errors, not lines.
    let short = EpisodeLimits {
        max_turns: 1,
        ..limits()
    };
    let error = runner(&fixture, Script::Talk, short)
        .demonstrate(&task, &turns)
        .unwrap_err()
        .to_string();
    assert!(error.contains("max_turns"), "{error}");
    assert!(
        runner(&fixture, Script::NoStart, limits())
            .demonstrate(&task, &turns)
            .is_err()
    );
}

#[test]
fn trained_ids_are_the_sampled_ids_plus_the_rendered_environment_ids() {
    let fixture = fixture();
    let records = play(&fixture, Script::Talk, &[0, 1, 2, 3], 8, limits());
    let template = fixture.tokenizer.default_chat_template().unwrap();
    let mut multi_turn = 0;
    for (g, group) in records.iter().enumerate() {
        assert_eq!(group.len(), 8);
        for (j, record) in group.iter().enumerate() {
            let transcript = &record.transcript;
            let ids = transcript.completion_ids();
            let mask = transcript.loss_mask();
            assert_eq!(ids.len(), mask.len());
            assert_eq!(ids.len(), transcript.logprobs().len());
            assert_eq!(ids.len(), transcript.versions().len());
            assert!(transcript.versions().iter().all(|&v| v == 3));
            // Mask-true ids are the model's segments, in order; mask-false ids the environment's.
            let sampled: Vec<u32> = transcript
                .segments
                .iter()
                .filter(|s| s.is_model())
                .flat_map(|s| s.ids().to_vec())
                .collect();
            let masked: Vec<u32> = ids
                .iter()
                .zip(&mask)
                .filter(|(_, m)| **m)
                .map(|(id, _)| *id)
                .collect();
            assert_eq!(sampled, masked, "group {g} sample {j}");
            // A re-render of the transcript reproduces every id.
            let renderer = TurnRenderer::new(&fixture.tokenizer, template, &[]).unwrap();
            // An id the tokenizer has no token for (the fixture pads its vocabulary to 300) has
            // no text to re-render; such an episode ends there.
            if !matches!(record.stop, StopReason::Undecodable { .. })
                && let Err(error) = renderer.verify(transcript)
            {
                panic!("group {g} sample {j}: {error}");
            }
            if transcript.model_turns() >= 2 {
                multi_turn += 1;
            }
            assert!(transcript.model_turns() <= 4);
            let env_segments = transcript.segments.iter().filter(|s| !s.is_model()).count();
            assert!(record.turn_rewards.len() >= env_segments);
            assert!(record.turn_rewards.len() <= transcript.model_turns());
        }
    }
    assert!(
        multi_turn >= 3,
        "only {multi_turn} episodes took two turns or more"
    );
}

#[test]
fn a_later_turn_is_what_the_engine_samples_alone_from_its_stream() {
    let fixture = fixture();
    let records = play(&fixture, Script::Talk, &[5, 6], 4, limits());
    let mut checked = 0;
    for (g, group) in records.iter().enumerate() {
        for (j, record) in group.iter().enumerate() {
            let transcript = &record.transcript;
            let mut context = transcript.prompt_ids.clone();
            let mut model_turn = 0u64;
            for segment in &transcript.segments {
                if let Segment::Model { ids, .. } = segment
                    && model_turn > 0
                    && ids.len() < 24
                {
                    let request = GenerationRequest {
                        prompts: vec![context.clone()],
                        params: params(&fixture, 1),
                        first_prompt_number: 0,
                        streams: Some(vec![StreamKey {
                            prompt_number: [5, 6][g],
                            first_sample: j as u64,
                            turn: model_turn,
                        }]),
                    };
                    let weights = FixedWeights {
                        model: Arc::clone(&fixture.model),
                        version: 3,
                    };
                    let alone = generate_live(&weights, &request, None).unwrap();
                    assert_eq!(&alone.output.completions[0][0].token_ids, ids);
                    checked += 1;
                }
                if segment.is_model() {
                    model_turn += 1;
                }
                context.extend_from_slice(segment.ids());
            }
        }
    }
    assert!(checked >= 1, "no later turn to check");
}

#[test]
fn an_environment_that_panics_hangs_or_cannot_start_ends_only_its_episodes() {
    let fixture = fixture();
    for script in [Script::Panic, Script::Hang, Script::NoStart] {
        let started = std::time::Instant::now();
        let records = play(&fixture, script, &[0, 1], 3, limits());
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "{script:?} held the run"
        );
        assert_eq!(records.iter().map(Vec::len).sum::<usize>(), 6);
        for record in records.iter().flatten() {
            match &record.stop {
                StopReason::EnvFailed { message } => {
                    let expected = match script {
                        Script::Panic => "the environment broke",
                        Script::Hang => "did not answer",
                        _ => "no room for another episode",
                    };
                    assert!(message.contains(expected), "{script:?}: {message}");
                    assert_eq!(record.outcome_reward, 0.0);
                }
                // The model's first turn may end the episode before the environment is asked.
                StopReason::TurnTruncated { .. }
                | StopReason::ModelEnded { .. }
                | StopReason::Undecodable { .. } => {
                    assert_ne!(script, Script::NoStart)
                }
                other => panic!("{script:?}: unexpected stop {other:?}"),
            }
        }
    }
}

#[test]
fn limits_stop_episodes_with_their_reason() {
    let fixture = fixture();
    let tight = EpisodeLimits {
        max_turns: 2,
        max_total_tokens: 60,
        ..limits()
    };
    let records = play(&fixture, Script::Talk, &[0, 1, 2], 8, tight);
    for record in records.iter().flatten() {
        let used = record.transcript.completion_ids().len();
        assert!(used <= 60, "{used} ids");
        assert!(record.transcript.model_turns() <= 2);
        match record.stop {
            StopReason::MaxTurns { turns } => assert_eq!(turns, 2),
            StopReason::MaxTotalTokens { tokens } => assert!(tokens >= used),
            StopReason::TurnTruncated { .. }
            | StopReason::ModelEnded { .. }
            | StopReason::Undecodable { .. } => {}
            ref other => panic!("unexpected stop {other:?}"),
        }
        if record.stop == (StopReason::MaxTurns { turns: 2 }) {
            assert_eq!(record.outcome_reward, 1.0);
        }
    }
}

#[test]
fn closed_truncated_turns_continue_the_episode_and_still_re_render_exactly() {
    let fixture = fixture();
    let closing = EpisodeLimits {
        max_turn_tokens: 6,
        close_truncated_turns: true,
        ..limits()
    };
    let records = play(&fixture, Script::Talk, &[0, 1], 4, closing);
    let template = fixture.tokenizer.default_chat_template().unwrap();
    let renderer = TurnRenderer::new(&fixture.tokenizer, template, &[]).unwrap();
    let end = fixture.tokenizer.token_to_id("<|im_end|>").unwrap();
    let mut closed = 0;
    for record in records.iter().flatten() {
        let transcript = &record.transcript;
        assert!(!matches!(record.stop, StopReason::TurnTruncated { .. }));
        for (i, segment) in transcript.segments.iter().enumerate() {
            if let Segment::Close { ids } = segment {
                // One closer, right after a model turn that did not end on its own, masked.
                assert_eq!(ids, &vec![end]);
                assert!(transcript.segments[i - 1].is_model());
                assert_ne!(transcript.segments[i - 1].ids().last(), Some(&end));
                closed += 1;
            }
        }
        let mask = transcript.loss_mask();
        let sampled: usize = transcript
            .segments
            .iter()
            .filter(|s| s.is_model())
            .map(|s| s.ids().len())
            .sum();
        assert_eq!(mask.iter().filter(|m| **m).count(), sampled);
        if !matches!(record.stop, StopReason::Undecodable { .. }) {
            renderer.verify(transcript).unwrap();
        }
    }
    assert!(closed > 0, "no turn was closed");
}
