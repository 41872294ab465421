//! The generation engine against a cache-free reference, on the tiny fixture checkpoints
//! (fixtures/models, written by transformers): KV-cached decoding equals recomputation, batched
//! generation equals one-by-one generation, `n` samples equal `n` separate seeded runs, stop
//! strings across tokens, the position limit, and rejected requests.

use std::path::PathBuf;

use candle_core::Device;
use stoke_model::Transformer;
use stoke_rollout::engine::Engine;
use stoke_rollout::sampling::sample;
use stoke_rollout::score::full_sequence_logits;
use stoke_rollout::{
    Completion, Detokenizer, FinishReason, GenerationRequest, SampleStream, SamplingParams,
};

const LOGPROB_TOLERANCE: f32 = 1e-5;

/// Every fixture checkpoint; each has transformers' greedy continuations in reference.safetensors.
const FIXTURES: [&str; 18] = [
    "afmoe_gated",
    "mixtral_moe",
    "qwen2_moe_shared",
    "qwen3_moe",
    "olmoe",
    "gemma2_softcap_sliding",
    "gemma3_text_local_rope",
    "llama_relu2",
    "smollm3_nope",
    "llama_bf16",
    "llama_gqa_rope_llama3",
    "llama_gqa_rope_llama3_v4config",
    "llama_mqa_tied",
    "llama_rope_linear",
    "llama_rope_yarn",
    "llama_sharded",
    "qwen2_bias_tied",
    "qwen3_qknorm",
];

fn fixture(name: &str) -> Transformer {
    let dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name);
    Transformer::load(&dir, &Device::Cpu).expect("fixture model loads")
}

/// Generates one sample by running the whole sequence through the model at every step (no KV
/// cache, no batching, no padding), drawing from the same random stream the engine uses.
fn generate_without_cache(
    model: &Transformer,
    prompt: &[u32],
    params: &SamplingParams,
    prompt_number: u64,
    sample_number: u64,
) -> (Vec<u32>, Vec<f32>, FinishReason) {
    let rule = params.validate().unwrap();
    let mut stream = SampleStream::new(params.seed, prompt_number, sample_number);
    let mut sequence = prompt.to_vec();
    let (mut ids, mut logprobs) = (Vec::new(), Vec::new());
    loop {
        let logits = full_sequence_logits(model, &sequence, &Device::Cpu).unwrap();
        let token = sample(logits.last().unwrap(), &rule, &mut stream).unwrap();
        sequence.push(token.id);
        ids.push(token.id);
        logprobs.push(token.logprob);
        if params.stop_token_ids.contains(&token.id) {
            return (ids, logprobs, FinishReason::Eos { token_id: token.id });
        }
        if ids.len() == params.max_new_tokens {
            return (ids, logprobs, FinishReason::Length);
        }
    }
}

fn assert_matches_reference(
    completion: &Completion,
    reference: &(Vec<u32>, Vec<f32>, FinishReason),
    what: &str,
) {
    assert_eq!(completion.token_ids, reference.0, "{what}: token ids");
    assert_eq!(
        completion.finish_reason, reference.2,
        "{what}: finish reason"
    );
    for (t, (got, want)) in completion.logprobs.iter().zip(&reference.1).enumerate() {
        assert!(
            (got - want).abs() <= LOGPROB_TOLERANCE,
            "{what}: logprob {t}: {got} vs {want}"
        );
    }
}

fn prompts() -> Vec<Vec<u32>> {
    vec![
        vec![1, 17, 5, 88],
        vec![1, 40, 41, 42, 43, 44, 45, 46, 47],
        vec![1, 9],
    ]
}

fn sampled_params() -> SamplingParams {
    SamplingParams {
        max_new_tokens: 10,
        temperature: 0.8,
        top_k: Some(60),
        top_p: 0.95,
        seed: 1234,
        ..SamplingParams::default()
    }
}

#[test]
fn kv_cached_greedy_and_sampled_decoding_equal_full_recomputation() {
    for name in [
        "llama_gqa_rope_llama3",
        "qwen3_qknorm",
        "gemma2_softcap_sliding",
    ] {
        let model = fixture(name);
        let engine = Engine::new(&model);
        let greedy = SamplingParams {
            temperature: 0.0,
            max_new_tokens: 10,
            ..Default::default()
        };
        for params in [greedy, sampled_params()] {
            let prompt = vec![prompts()[0].clone()];
            let output = engine
                .generate(&GenerationRequest::new(prompt, params.clone()), None)
                .unwrap();
            let reference = generate_without_cache(&model, &prompts()[0], &params, 0, 0);
            let what = format!("{name}, temperature {}", params.temperature);
            assert_matches_reference(&output.completions[0][0], &reference, &what);
        }
    }
}

/// An int64 tensor of the fixture's reference.safetensors as rows of u32.
fn reference_rows(name: &str, tensor: &str) -> Vec<Vec<u32>> {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name)
        .join("reference.safetensors");
    let bytes = std::fs::read(&path).unwrap();
    let tensors = safetensors::SafeTensors::deserialize(&bytes).unwrap();
    let view = tensors.tensor(tensor).unwrap();
    assert_eq!(view.dtype(), safetensors::Dtype::I64);
    let values: Vec<u32> = view
        .data()
        .chunks(8)
        .map(|b| i64::from_le_bytes(b.try_into().unwrap()) as u32)
        .collect();
    values
        .chunks(view.shape()[1])
        .map(<[u32]>::to_vec)
        .collect()
}

#[test]
fn batched_greedy_generation_equals_transformers_generate() {
    // transformers' greedy continuations of two prompts (12 and 8 tokens; the fixture stores the
    // short one left-padded with its mask), chosen so every greedy pick wins by >= 0.02 logits.
    for name in FIXTURES {
        let model = fixture(name);
        let engine = Engine::new(&model);
        let padded = reference_rows(name, "greedy_prompt_ids");
        let mask = reference_rows(name, "greedy_prompt_mask");
        let outputs = reference_rows(name, "greedy_output_ids");
        let prompts: Vec<Vec<u32>> = padded
            .iter()
            .zip(&mask)
            .map(|(ids, mask)| {
                ids.iter()
                    .zip(mask)
                    .filter(|(_, m)| **m == 1)
                    .map(|(id, _)| *id)
                    .collect()
            })
            .collect();
        let width = padded[0].len();
        let new_tokens = outputs[0].len() - width;
        let params = SamplingParams {
            temperature: 0.0,
            max_new_tokens: new_tokens,
            ..Default::default()
        };
        let output = engine
            .generate(&GenerationRequest::new(prompts, params), None)
            .unwrap();
        for (row, expected) in outputs.iter().enumerate() {
            assert_eq!(
                output.completions[row][0].token_ids,
                expected[width..],
                "{name} row {row}"
            );
        }
    }
}

#[test]
fn batched_left_padded_generation_equals_one_by_one() {
    let model = fixture("llama_gqa_rope_llama3");
    let engine = Engine::new(&model);
    // Many stop ids so rows finish at different steps and the cache gets compacted mid-batch.
    let params = SamplingParams {
        max_new_tokens: 12,
        stop_token_ids: (100..160).collect(),
        ..sampled_params()
    };
    let batched = engine
        .generate(&GenerationRequest::new(prompts(), params.clone()), None)
        .unwrap();
    let mut lengths = Vec::new();
    for (i, prompt) in prompts().into_iter().enumerate() {
        let alone = GenerationRequest {
            prompts: vec![prompt.clone()],
            params: params.clone(),
            first_prompt_number: i as u64,
            streams: None,
        };
        let single = engine.generate(&alone, None).unwrap();
        let reference = generate_without_cache(&model, &prompt, &params, i as u64, 0);
        assert_matches_reference(
            &batched.completions[i][0],
            &reference,
            &format!("batched prompt {i}"),
        );
        assert_matches_reference(
            &single.completions[0][0],
            &reference,
            &format!("single prompt {i}"),
        );
        lengths.push(reference.0.len());
    }
    lengths.sort_unstable();
    lengths.dedup();
    assert!(
        lengths.len() > 1,
        "rows should finish at different steps to exercise compaction"
    );
}

#[test]
fn n_samples_share_one_prefill_and_equal_separate_seeded_runs() {
    let model = fixture("llama_gqa_rope_llama3");
    let engine = Engine::new(&model);
    let params = SamplingParams {
        n: 4,
        temperature: 1.0,
        top_k: None,
        top_p: 1.0,
        ..sampled_params()
    };
    let request = GenerationRequest::new(prompts()[..2].to_vec(), params.clone());
    let output = engine.generate(&request, None).unwrap();
    assert_eq!(
        output.prefill_tokens,
        prompts()[0].len() + prompts()[1].len()
    );
    for (i, samples) in output.completions.iter().enumerate() {
        assert_eq!(samples.len(), 4);
        for (j, completion) in samples.iter().enumerate() {
            assert_eq!((completion.prompt_index, completion.sample_index), (i, j));
            let reference =
                generate_without_cache(&model, &prompts()[i], &params, i as u64, j as u64);
            assert_matches_reference(completion, &reference, &format!("prompt {i} sample {j}"));
        }
        let mut distinct: Vec<&Vec<u32>> = samples.iter().map(|c| &c.token_ids).collect();
        distinct.dedup();
        assert!(
            distinct.len() > 1,
            "the samples of a group must use different streams"
        );
    }
}

#[test]
fn same_seed_repeats_and_another_seed_differs() {
    let model = fixture("llama_gqa_rope_llama3");
    let engine = Engine::new(&model);
    let run = |seed| {
        let params = SamplingParams {
            seed,
            temperature: 1.0,
            ..sampled_params()
        };
        engine
            .generate(&GenerationRequest::new(prompts(), params), None)
            .unwrap()
    };
    assert_eq!(run(7), run(7));
    assert_ne!(run(7).completions, run(8).completions);
}

/// Token i decodes to "<i>", so a stop string like "2><7" spans two tokens.
fn angle_decode(ids: &[u32]) -> Result<String, String> {
    Ok(ids.iter().map(|id| format!("<{id}>")).collect())
}

#[test]
fn stop_string_spanning_two_tokens_ends_the_sample_and_is_cut_from_the_text() {
    let model = fixture("llama_gqa_rope_llama3");
    let engine = Engine::new(&model);
    let greedy = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 10,
        ..Default::default()
    };
    let (free_run, _, _) = generate_without_cache(&model, &prompts()[1], &greedy, 0, 0);
    // The tail of token 3's text and the head of token 4's text.
    let (third, fourth) = (format!("<{}>", free_run[3]), format!("<{}>", free_run[4]));
    let stop = format!("{}{}", &third[third.len() - 2..], &fourth[..2]);
    let expected_text = angle_decode(&free_run).unwrap();
    let cut = expected_text.find(&stop).unwrap();
    let expected_tokens = (1..=free_run.len())
        .find(|&k| angle_decode(&free_run[..k]).unwrap().contains(&stop))
        .unwrap();

    let params = SamplingParams {
        stop_strings: vec![stop.clone()],
        ..greedy
    };
    let decoder: &dyn Detokenizer = &angle_decode;
    let request = GenerationRequest::new(vec![prompts()[1].clone()], params);
    let completion = engine
        .generate(&request, Some(decoder))
        .unwrap()
        .completions[0][0]
        .clone();
    assert_eq!(completion.finish_reason, FinishReason::StopString { stop });
    assert_eq!(completion.token_ids, free_run[..expected_tokens].to_vec());
    assert_eq!(completion.text.as_deref(), Some(&expected_text[..cut]));
}

#[test]
fn generation_stops_at_the_model_position_limit() {
    let model = fixture("llama_gqa_rope_llama3");
    let limit = model.config().max_position_embeddings;
    let engine = Engine::new(&model);
    let prompt: Vec<u32> = (0..limit - 3).map(|i| (i % 250) as u32).collect();
    let params = SamplingParams {
        temperature: 0.0,
        max_new_tokens: 10,
        ..Default::default()
    };
    let output = engine
        .generate(&GenerationRequest::new(vec![prompt], params), None)
        .unwrap();
    let completion = &output.completions[0][0];
    // Tokens are fed at positions limit-3 .. limit-1; the 4th sampled token is never fed.
    assert_eq!(completion.token_ids.len(), 4);
    assert_eq!(completion.finish_reason, FinishReason::Length);
}

#[test]
fn bad_requests_are_errors_naming_the_problem() {
    let model = fixture("llama_gqa_rope_llama3");
    let engine = Engine::new(&model);
    let error = |prompts: Vec<Vec<u32>>, params: SamplingParams| {
        engine
            .generate(&GenerationRequest::new(prompts, params), None)
            .unwrap_err()
            .to_string()
    };
    let message = error(vec![vec![1], vec![]], SamplingParams::default());
    assert!(
        message.contains("prompt 1") && message.contains("empty"),
        "{message}"
    );
    let message = error(vec![vec![1, 300]], SamplingParams::default());
    assert!(
        message.contains("300") && message.contains("vocabulary"),
        "{message}"
    );
    let message = error(
        vec![vec![1]],
        SamplingParams {
            n: 0,
            ..Default::default()
        },
    );
    assert!(message.contains("`n`"), "{message}");
    let message = error(
        vec![vec![1]],
        SamplingParams {
            stop_strings: vec!["x".into()],
            ..Default::default()
        },
    );
    assert!(message.contains("detokenizer"), "{message}");
    let message = error(vec![], SamplingParams::default());
    assert!(message.contains("no prompts"), "{message}");
}
