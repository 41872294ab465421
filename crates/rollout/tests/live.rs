//! Generation with live weights (`generate_live`) on the tiny qwen2 fixture: with weights that
//! never change it equals `Engine::generate` bit for bit; when new weights are published in the
//! middle of a generation, every later token carries the new version and is the token the new
//! weights choose on the KV cache the earlier tokens built (checked against a one-sequence
//! reference loop written here with the model API only); bad publications are errors.

use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use candle_core::{DType, Device, IndexOp, Tensor};
use stoke_model::{KvCache, Transformer, causal_bias};
use stoke_rollout::sampling::sample;
use stoke_rollout::{
    Engine, FixedWeights, GenerationRequest, LiveWeights, SampleStream, SamplingParams,
    generate_live,
};

fn fixture_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../../fixtures/models/qwen2_bias_tied")
}

fn fixture() -> Transformer {
    Transformer::load(&fixture_dir(), &Device::Cpu).expect("fixture model loads")
}

/// Weights with the fixture's config but other values, so the two models choose other tokens.
fn other_weights(model: &Transformer) -> Transformer {
    Transformer::init(model.config().clone(), &Device::Cpu, 77).expect("init")
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![292, 17, 5, 88],
        vec![292, 40, 41, 42, 43, 44, 45],
        vec![292, 9],
    ]
}

fn sampled_params(n: usize) -> SamplingParams {
    SamplingParams {
        max_new_tokens: 9,
        temperature: 0.9,
        top_k: Some(100),
        top_p: 0.97,
        seed: 31,
        n,
        ..SamplingParams::default()
    }
}

/// Answers `before` (version 0) for the first `switch_after` calls, then `after` (version 1).
struct SwitchAfter {
    before: Arc<Transformer>,
    after: Arc<Transformer>,
    switch_after: usize,
    calls: AtomicUsize,
}

impl SwitchAfter {
    fn new(before: &Transformer, after: &Transformer, switch_after: usize) -> Self {
        SwitchAfter {
            before: Arc::new(before.clone()),
            after: Arc::new(after.clone()),
            switch_after,
            calls: AtomicUsize::new(0),
        }
    }
}

impl LiveWeights for SwitchAfter {
    fn current(&self) -> (Arc<Transformer>, u64) {
        if self.calls.fetch_add(1, Ordering::SeqCst) < self.switch_after {
            (Arc::clone(&self.before), 0)
        } else {
            (Arc::clone(&self.after), 1)
        }
    }
}

/// One sequence, no padding, no batching: token t is drawn from the logits of `models[t]`, fed
/// through one KV cache that keeps the keys and values each earlier token got from its model.
fn reference_sequence(
    models: &dyn Fn(usize) -> Transformer,
    prompt: &[u32],
    params: &SamplingParams,
    prompt_number: u64,
    sample_number: u64,
) -> (Vec<u32>, Vec<f32>) {
    let rule = params.validate().unwrap();
    let mut stream = SampleStream::new(params.seed, prompt_number, sample_number);
    let layers = models(0).config().num_hidden_layers;
    let mut cache = KvCache::new(layers);
    let mut key_valid = vec![vec![true; prompt.len()]];
    let mut input: Vec<u32> = prompt.to_vec();
    let mut first_position = 0u32;
    let (mut ids, mut logprobs) = (Vec::new(), Vec::new());
    for t in 0..params.max_new_tokens {
        let model = models(t);
        let len = input.len();
        let ids_tensor = Tensor::from_vec(input.clone(), (1, len), &Device::Cpu).unwrap();
        let positions: Vec<u32> = (first_position..first_position + len as u32).collect();
        let positions = Tensor::from_vec(positions, (1, len), &Device::Cpu).unwrap();
        let bias = causal_bias(&key_valid, len, &Device::Cpu).unwrap();
        let logits = model
            .forward(&ids_tensor, &positions, &bias, Some(&mut cache))
            .unwrap();
        let last = logits
            .i((0, len - 1))
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let token = sample(&last, &rule, &mut stream).unwrap();
        ids.push(token.id);
        logprobs.push(token.logprob);
        first_position += len as u32;
        input = vec![token.id];
        key_valid[0].push(true);
    }
    (ids, logprobs)
}

#[test]
fn fixed_weights_equal_engine_generate_bit_for_bit() {
    let model = fixture();
    let mut request = GenerationRequest::new(prompts(), sampled_params(3));
    request.first_prompt_number = 5;
    request.params.stop_token_ids = vec![294, 10, 11, 12];
    let expected = Engine::new(&model).generate(&request, None).unwrap();
    let weights = FixedWeights {
        model: Arc::new(model),
        version: 4,
    };
    let live = generate_live(&weights, &request, None).unwrap();
    assert_eq!(live.output, expected);
    for (completions, versions) in expected.completions.iter().zip(&live.token_versions) {
        assert_eq!(completions.len(), versions.len());
        for (completion, versions) in completions.iter().zip(versions) {
            assert_eq!(versions, &vec![4; completion.token_ids.len()]);
        }
    }
}

#[test]
fn weights_published_before_the_prefill_are_used_throughout() {
    let model = fixture();
    let newer = other_weights(&model);
    let request = GenerationRequest::new(prompts(), sampled_params(2));
    let expected = Engine::new(&newer).generate(&request, None).unwrap();
    let weights = SwitchAfter::new(&model, &newer, 0);
    let live = generate_live(&weights, &request, None).unwrap();
    assert_eq!(live.output, expected);
    assert!(
        live.token_versions
            .iter()
            .flatten()
            .flatten()
            .all(|&v| v == 1)
    );
}

#[test]
fn weights_published_mid_generation_produce_the_later_tokens() {
    let model = fixture();
    let newer = other_weights(&model);
    let switch_after = 4;
    let params = sampled_params(2);
    let request = GenerationRequest::new(prompts(), params.clone());
    let weights = SwitchAfter::new(&model, &newer, switch_after);
    let live = generate_live(&weights, &request, None).unwrap();
    let old_only = Engine::new(&model).generate(&request, None).unwrap();
    assert_ne!(
        live.output.completions, old_only.completions,
        "the new weights must change some tokens, or this test shows nothing"
    );

    let models = |t: usize| {
        if t < switch_after {
            model.clone()
        } else {
            newer.clone()
        }
    };
    for (i, (completions, versions)) in live
        .output
        .completions
        .iter()
        .zip(&live.token_versions)
        .enumerate()
    {
        for (j, (completion, versions)) in completions.iter().zip(versions).enumerate() {
            // Token t comes from call t (the prefill is call 0): version 0 before the switch.
            let expected_versions: Vec<u64> = (0..completion.token_ids.len())
                .map(|t| u64::from(t >= switch_after))
                .collect();
            assert_eq!(versions, &expected_versions, "prompt {i} sample {j}");
            assert!(versions.windows(2).all(|w| w[0] <= w[1]));
            let (ids, logprobs) =
                reference_sequence(&models, &prompts()[i], &params, i as u64, j as u64);
            assert_eq!(
                completion.token_ids, ids,
                "prompt {i} sample {j}: token ids"
            );
            for (t, (got, want)) in completion.logprobs.iter().zip(&logprobs).enumerate() {
                assert!(
                    (got - want).abs() < 1e-5,
                    "prompt {i} sample {j} token {t}: log-prob {got} vs {want}"
                );
            }
        }
    }
}

#[test]
fn greedy_tokens_after_the_switch_are_the_new_weights_choice() {
    let model = fixture();
    let newer = other_weights(&model);
    let params = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 8,
        ..SamplingParams::default()
    };
    let prompt = prompts()[1].clone();
    let request = GenerationRequest::new(vec![prompt.clone()], params.clone());
    let live = generate_live(&SwitchAfter::new(&model, &newer, 3), &request, None).unwrap();
    let completion = &live.output.completions[0][0];
    let models = |t: usize| if t < 3 { model.clone() } else { newer.clone() };
    let (ids, _) = reference_sequence(&models, &prompt, &params, 0, 0);
    assert_eq!(completion.token_ids, ids);
    assert_eq!(live.token_versions[0][0], vec![0, 0, 0, 1, 1, 1, 1, 1]);
}

/// Answers with a version that goes back, or with weights of another shape.
struct Misbehaving {
    first: Arc<Transformer>,
    second: (Arc<Transformer>, u64),
    calls: AtomicUsize,
}

impl LiveWeights for Misbehaving {
    fn current(&self) -> (Arc<Transformer>, u64) {
        if self.calls.fetch_add(1, Ordering::SeqCst) == 0 {
            (Arc::clone(&self.first), 3)
        } else {
            (Arc::clone(&self.second.0), self.second.1)
        }
    }
}

#[test]
fn a_version_going_back_or_a_new_shape_is_an_error() {
    let model = Arc::new(fixture());
    let request = GenerationRequest::new(prompts(), sampled_params(1));
    let going_back = Misbehaving {
        first: Arc::clone(&model),
        second: (Arc::clone(&model), 2),
        calls: AtomicUsize::new(0),
    };
    let error = generate_live(&going_back, &request, None).unwrap_err();
    assert!(error.to_string().contains("from version 3 to 2"), "{error}");

    let mut config = model.config().clone();
    config.num_hidden_layers = 1;
    let other_shape = Misbehaving {
        first: Arc::clone(&model),
        second: (
            Arc::new(Transformer::init(config, &Device::Cpu, 1).unwrap()),
            4,
        ),
        calls: AtomicUsize::new(0),
    };
    let error = generate_live(&other_shape, &request, None).unwrap_err();
    assert!(
        error.to_string().contains("another model config"),
        "{error}"
    );
}
