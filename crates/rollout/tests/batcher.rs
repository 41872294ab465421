//! The continuous batcher on the tiny fixture checkpoints: a request alone equals
//! `Engine::generate` token for token; a seeded request's tokens do not depend on what else
//! shares its steps (bit for bit, joining and leaving at different times); chunked prefill gives
//! the same tokens and prompt log-probs as the cache-free scorer; admission respects the KV
//! budget and the sequence limit; a closed sink frees its sequences; weights swapped mid-run
//! are reported per token; a request keyed to an episode's turn (`first_sample`, `turn`) draws
//! the engine's keyed streams (`StreamKey`).

use std::path::PathBuf;
use std::sync::mpsc::{Receiver, Sender, channel};
use std::sync::{Arc, Mutex};

use candle_core::Device;
use stoke_model::Transformer;
use stoke_rollout::engine::Engine;
use stoke_rollout::score::next_token_logprobs;
use stoke_rollout::{
    BatchEvent, BatchLimits, BatchRequest, Batcher, EventSink, FinishReason, GenerationRequest,
    LogprobMode, LogprobRequest, SamplingParams, StreamKey,
};

fn fixture(name: &str) -> Transformer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name);
    Transformer::load(&dir, &Device::Cpu).expect("fixture model loads")
}

/// A sink whose channel the test can close (a departing client).
type Slot = Arc<Mutex<Option<Sender<BatchEvent>>>>;

struct TestSink {
    events: Slot,
}

impl EventSink for TestSink {
    fn send(&self, event: BatchEvent) -> bool {
        match self.events.lock().unwrap().as_ref() {
            Some(sender) => sender.send(event).is_ok(),
            None => false,
        }
    }
    fn is_closed(&self) -> bool {
        self.events.lock().unwrap().is_none()
    }
}

fn closable_sink() -> (Box<TestSink>, Receiver<BatchEvent>, Slot) {
    let (sender, receiver) = channel();
    let slot: Slot = Arc::new(Mutex::new(Some(sender)));
    (
        Box::new(TestSink {
            events: Arc::clone(&slot),
        }),
        receiver,
        slot,
    )
}

fn new_sink() -> (Box<TestSink>, Receiver<BatchEvent>) {
    let (sink, receiver, _) = closable_sink();
    (sink, receiver)
}

/// The tokens of every sample and the finish reasons, from a request's events.
#[derive(Debug, Default, PartialEq)]
struct Collected {
    tokens: Vec<Vec<u32>>,
    logprobs: Vec<Vec<f32>>,
    versions: Vec<Vec<u64>>,
    finish: Vec<Option<FinishReason>>,
    prompt_logprobs: Option<Vec<Option<f32>>>,
}

fn collect(receiver: &Receiver<BatchEvent>, n: usize) -> Collected {
    let mut out = Collected {
        tokens: vec![Vec::new(); n],
        logprobs: vec![Vec::new(); n],
        versions: vec![Vec::new(); n],
        finish: vec![None; n],
        prompt_logprobs: None,
    };
    while let Ok(event) = receiver.try_recv() {
        match event {
            BatchEvent::Prefilled { prompt_logprobs } => {
                out.prompt_logprobs = prompt_logprobs.map(|scores| {
                    scores
                        .iter()
                        .map(|s| s.as_ref().map(|t| t.logprob))
                        .collect()
                });
            }
            BatchEvent::Token {
                sample,
                token,
                version,
            } => {
                out.tokens[sample].push(token.id);
                out.logprobs[sample].push(token.logprob);
                out.versions[sample].push(version);
            }
            BatchEvent::Finished { sample, reason } => out.finish[sample] = Some(reason),
            BatchEvent::Failed(error) => panic!("request failed: {error}"),
        }
    }
    out
}

fn limits(model: &Transformer) -> BatchLimits {
    BatchLimits {
        max_running: 64,
        kv_budget_bytes: 64 << 20,
        prefill_chunk: 512,
        prefill_budget: 2048,
        max_model_len: model.config().max_position_embeddings,
    }
}

fn params(max_new_tokens: usize, temperature: f32, seed: u64, n: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens,
        temperature,
        top_k: None,
        top_p: 1.0,
        seed,
        n,
        stop_token_ids: Vec::new(),
        stop_strings: Vec::new(),
    }
}

fn request(prompt: Vec<u32>, params: SamplingParams, prompt_number: u64) -> BatchRequest {
    BatchRequest {
        prompt_ids: prompt,
        params,
        prompt_number,
        first_sample: 0,
        turn: 0,
        logprobs: LogprobRequest::default(),
    }
}

fn run_to_end(batcher: &mut Batcher) {
    let mut steps = 0;
    while !batcher.is_idle() {
        batcher.step();
        steps += 1;
        assert!(steps < 10_000, "the batcher does not finish");
    }
}

fn prompt(seed: u32, len: usize, vocab: u32) -> Vec<u32> {
    (0..len as u32)
        .map(|i| (seed.wrapping_mul(2_654_435_761).wrapping_add(i * 7919)) % vocab)
        .collect()
}

#[test]
fn a_request_alone_equals_the_engine_token_for_token() {
    for name in ["llama_gqa_rope_llama3", "qwen2_bias_tied", "qwen3_qknorm"] {
        let model = fixture(name);
        let vocab = model.config().vocab_size as u32;
        let prompt_ids = prompt(3, 9, vocab);
        for (temperature, n) in [(0.0, 1), (1.0, 3)] {
            let params = params(12, temperature, 17, n);
            let engine = Engine::new(&model)
                .generate(
                    &GenerationRequest::new(vec![prompt_ids.clone()], params.clone()),
                    None,
                )
                .unwrap();
            let mut batcher =
                Batcher::new(Arc::new(model.clone()), 0, None, limits(&model)).unwrap();
            let (sink, events) = new_sink();
            batcher
                .submit(request(prompt_ids.clone(), params.clone(), 0), sink)
                .unwrap();
            run_to_end(&mut batcher);
            let got = collect(&events, n);
            for (sample, completion) in engine.completions[0].iter().enumerate() {
                assert_eq!(
                    got.tokens[sample], completion.token_ids,
                    "{name} T={temperature}"
                );
                assert_eq!(
                    got.logprobs[sample], completion.logprobs,
                    "{name} T={temperature}"
                );
                assert_eq!(got.finish[sample].as_ref(), Some(&completion.finish_reason));
            }
            assert_eq!(batcher.load().kv_reserved_bytes, 0);
            assert_eq!(batcher.load().running, 0);
        }
    }
}

/// Multi-turn rollout on a server: turn `t` of episode `j` of group `g` is one request with
/// `prompt_number = g`, `first_sample = j`, `turn = t`, and must draw exactly what the in-process
/// engine draws for `StreamKey { g, j, t }`.
#[test]
fn a_keyed_request_draws_the_engines_keyed_streams() {
    let model = fixture("llama_gqa_rope_llama3");
    let vocab = model.config().vocab_size as u32;
    let prompt_ids = prompt(5, 11, vocab);
    let params = params(10, 1.0, 23, 2);
    let key = StreamKey {
        prompt_number: 4,
        first_sample: 3,
        turn: 2,
    };
    let mut keyed = GenerationRequest::new(vec![prompt_ids.clone()], params.clone());
    keyed.streams = Some(vec![key]);
    let engine = Engine::new(&model).generate(&keyed, None).unwrap();
    let plain = Engine::new(&model)
        .generate(
            &GenerationRequest::new(vec![prompt_ids.clone()], params.clone()),
            None,
        )
        .unwrap();
    let mut batcher = Batcher::new(Arc::new(model.clone()), 0, None, limits(&model)).unwrap();
    let (sink, events) = new_sink();
    let mut request = request(prompt_ids, params, key.prompt_number);
    request.first_sample = key.first_sample;
    request.turn = key.turn;
    batcher.submit(request, sink).unwrap();
    run_to_end(&mut batcher);
    let got = collect(&events, 2);
    for (sample, completion) in engine.completions[0].iter().enumerate() {
        assert_eq!(got.tokens[sample], completion.token_ids, "sample {sample}");
        assert_eq!(got.logprobs[sample], completion.logprobs, "sample {sample}");
    }
    assert_ne!(
        got.tokens,
        [
            plain.completions[0][0].token_ids.clone(),
            plain.completions[0][1].token_ids.clone()
        ],
        "the key selects other streams than the plain request's"
    );
}

#[test]
fn seeded_tokens_do_not_depend_on_the_rest_of_the_batch() {
    let model = fixture("llama_gqa_rope_llama3");
    let vocab = model.config().vocab_size as u32;
    let probe = request(prompt(1, 7, vocab), params(40, 0.9, 1234, 2), 0);
    let alone = {
        let mut batcher = Batcher::new(Arc::new(model.clone()), 0, None, limits(&model)).unwrap();
        let (sink, events) = new_sink();
        batcher.submit(probe.clone(), sink).unwrap();
        run_to_end(&mut batcher);
        collect(&events, 2)
    };
    // 31 other requests of other lengths, joining before, with and after the probe.
    let mut batcher = Batcher::new(Arc::new(model.clone()), 0, None, limits(&model)).unwrap();
    let mut others = Vec::new();
    for i in 0..31u32 {
        if i == 11 {
            // Let the first ones get going so the probe joins a running batch.
            batcher.step();
            batcher.step();
        }
        let other = request(
            prompt(100 + i, 2 + (i as usize * 5) % 30, vocab),
            params(
                5 + (i as usize * 7) % 50,
                1.0,
                i as u64,
                1 + (i as usize % 2),
            ),
            i as u64,
        );
        let (sink, events) = new_sink();
        batcher.submit(other, sink).unwrap();
        others.push(events);
        if i == 20 {
            let (sink, events) = new_sink();
            batcher.submit(probe.clone(), sink).unwrap();
            others.push(events);
        }
    }
    run_to_end(&mut batcher);
    let among = collect(&others[21], 2);
    assert_eq!(among.tokens, alone.tokens);
    assert_eq!(among.logprobs, alone.logprobs);
    assert_eq!(among.finish, alone.finish);
}

#[test]
fn chunked_prefill_scores_the_prompt_like_the_cache_free_scorer() {
    let model = fixture("qwen2_bias_tied");
    let vocab = model.config().vocab_size as u32;
    let prompt_ids = prompt(9, 40, vocab);
    let reference = next_token_logprobs(&model, &prompt_ids, &Device::Cpu).unwrap();
    let mut outputs = Vec::new();
    for chunk in [512, 7, 1] {
        let mut limits = limits(&model);
        limits.prefill_chunk = chunk;
        limits.prefill_budget = 8;
        let mut batcher = Batcher::new(Arc::new(model.clone()), 0, None, limits).unwrap();
        let (sink, events) = new_sink();
        let mut req = request(prompt_ids.clone(), params(6, 0.0, 0, 1), 0);
        req.logprobs = LogprobRequest {
            top: 3,
            mode: LogprobMode::Raw,
            prompt: Some(2),
        };
        batcher.submit(req, sink).unwrap();
        run_to_end(&mut batcher);
        let got = collect(&events, 1);
        let scores = got.prompt_logprobs.clone().expect("prompt log-probs");
        assert_eq!(scores.len(), prompt_ids.len());
        assert!(scores[0].is_none());
        for (i, (score, want)) in scores[1..].iter().zip(&reference).enumerate() {
            let score = score.expect("a score per token after the first");
            assert!(
                (score - want).abs() <= 1e-5,
                "chunk {chunk}, token {i}: {score} vs {want}"
            );
        }
        outputs.push(got.tokens);
    }
    assert_eq!(outputs[0], outputs[1]);
    assert_eq!(outputs[0], outputs[2]);
}

#[test]
fn admission_waits_for_the_kv_budget_and_the_sequence_limit() {
    let model = fixture("qwen2_bias_tied");
    let vocab = model.config().vocab_size as u32;
    let mut limits = limits(&model);
    let probe = Batcher::new(Arc::new(model.clone()), 0, None, limits.clone()).unwrap();
    let slot = probe.slot_bytes();
    // Room for one request of 10 + 20 slots, not two.
    limits.kv_budget_bytes = 45 * slot;
    limits.max_running = 4;
    let mut batcher = Batcher::new(Arc::new(model.clone()), 0, None, limits).unwrap();
    let mut receivers = Vec::new();
    for i in 0..3u32 {
        let (sink, events) = new_sink();
        batcher
            .submit(
                request(prompt(i, 10, vocab), params(20, 1.0, 5, 1), 0),
                sink,
            )
            .unwrap();
        receivers.push(events);
    }
    batcher.step();
    let load = batcher.load();
    assert_eq!((load.running, load.waiting), (1, 2), "{load:?}");
    assert_eq!(load.kv_reserved_bytes, 30 * slot);
    // Too big for the whole budget: refused, naming the field.
    let (sink, _events) = new_sink();
    let error = batcher
        .submit(
            request(prompt(7, 10, vocab), params(50, 1.0, 5, 1), 0),
            sink,
        )
        .unwrap_err();
    assert!(error.to_string().contains("max_new_tokens"), "{error}");
    // n beyond the sequence limit: refused.
    let (sink, _events) = new_sink();
    let error = batcher
        .submit(request(prompt(7, 3, vocab), params(2, 1.0, 5, 5), 0), sink)
        .unwrap_err();
    assert!(error.to_string().contains("`n`"), "{error}");
    run_to_end(&mut batcher);
    for events in &receivers {
        let got = collect(events, 1);
        assert_eq!(got.tokens[0].len(), 20);
    }
    assert_eq!(batcher.load().kv_reserved_bytes, 0);
}

#[test]
fn a_closed_sink_cancels_its_sequences_and_frees_their_memory() {
    let model = fixture("qwen2_bias_tied");
    let vocab = model.config().vocab_size as u32;
    let mut batcher = Batcher::new(Arc::new(model.clone()), 0, None, limits(&model)).unwrap();
    let (leaving, leaving_events, slot) = closable_sink();
    batcher
        .submit(
            request(prompt(1, 5, vocab), params(100, 1.0, 1, 3), 0),
            leaving,
        )
        .unwrap();
    let (staying, staying_events) = new_sink();
    batcher
        .submit(
            request(prompt(2, 5, vocab), params(30, 1.0, 2, 1), 1),
            staying,
        )
        .unwrap();
    batcher.step();
    batcher.step();
    assert_eq!(batcher.load().running, 4);
    // The client goes away: its channel closes.
    slot.lock().unwrap().take();
    drop(leaving_events);
    let report = batcher.step();
    assert_eq!(report.cancelled_requests, 1);
    assert_eq!(batcher.load().running, 1);
    run_to_end(&mut batcher);
    assert_eq!(collect(&staying_events, 1).tokens[0].len(), 30);
    assert_eq!(batcher.load().kv_reserved_bytes, 0);
    assert_eq!(batcher.load().kv_held_bytes, 0);
}

#[test]
fn swapped_weights_are_reported_per_token_and_take_effect_between_steps() {
    let model = fixture("qwen2_bias_tied");
    let vocab = model.config().vocab_size as u32;
    let other = model.snapshot().unwrap();
    for (_, var) in other.parameters() {
        let scaled = (var.as_tensor() * 0.5).unwrap();
        var.set(&scaled).unwrap();
    }
    let mut batcher = Batcher::new(Arc::new(model.clone()), 0, None, limits(&model)).unwrap();
    let (sink, events) = new_sink();
    batcher
        .submit(request(prompt(4, 6, vocab), params(10, 0.0, 0, 1), 0), sink)
        .unwrap();
    for _ in 0..4 {
        batcher.step();
    }
    batcher.set_weights(Arc::new(other), 7).unwrap();
    run_to_end(&mut batcher);
    let got = collect(&events, 1);
    let versions = &got.versions[0];
    assert_eq!(versions.len(), 10);
    assert!(versions.windows(2).all(|w| w[0] <= w[1]), "{versions:?}");
    // Step 1 samples the first token from the prefill and the second from a decode step.
    assert_eq!(versions.iter().filter(|&&v| v == 0).count(), 5);
    assert_eq!(*versions.last().unwrap(), 7);
    // Another config is refused.
    let wrong = fixture("llama_gqa_rope_llama3");
    assert!(batcher.set_weights(Arc::new(wrong), 8).is_err());
}
