//! Self-speculative decoding with a multi-token prediction module (`speculative`): greedy output
//! equals the plain engine's token for token (and log-probability for log-probability) on a
//! transformers-made DeepSeek-V3 checkpoint with left-padded prompts; sampled sequences have
//! exactly the main model's distribution (a seeded chi-square test over every 3-token
//! continuation of a tiny model, with the exact law computed by full recomputation, and a check
//! that the same test rejects a slightly different law); every reported log-probability is the
//! main model's.

use std::collections::HashMap;
use std::path::Path;

use candle_core::{DType, Device, Tensor};
use stoke_model::{InitScheme, ModelConfig, Transformer, causal_bias};
use stoke_rollout::sampling::truncated_distribution;
use stoke_rollout::{Engine, GenerationRequest, SamplingParams, SamplingRule};

fn fixture(name: &str) -> Transformer {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("../../fixtures/models")
        .join(name);
    Transformer::load(&dir, &Device::Cpu).expect("fixture")
}

#[test]
fn greedy_speculative_decoding_is_the_greedy_sequence() {
    let model = fixture("deepseek_v3_mtp");
    let engine = Engine::new(&model);
    let prompts = vec![
        vec![5u32, 17, 3, 90, 22, 9, 31],
        vec![44, 2],
        vec![101, 7, 7, 64, 12],
    ];
    let params = SamplingParams {
        max_new_tokens: 24,
        temperature: 0.0,
        ..SamplingParams::default()
    };
    let request = GenerationRequest::new(prompts, params);
    let plain = engine.generate(&request, None).unwrap();
    let speculative = engine.generate_speculative(&request, None).unwrap();
    for (a, b) in plain
        .completions
        .iter()
        .flatten()
        .zip(speculative.output.completions.iter().flatten())
    {
        assert_eq!(a.token_ids, b.token_ids, "prompt {}", a.prompt_index);
        assert_eq!(a.finish_reason, b.finish_reason);
        for (x, y) in a.logprobs.iter().zip(&b.logprobs) {
            assert!((x - y).abs() < 1e-4, "logprob {x} vs {y}");
        }
    }
    let stats = speculative.stats;
    assert_eq!(speculative.output.generated_tokens, plain.generated_tokens);
    // Every main step verifies one draft per live row and emits 1 token, or 2 on acceptance.
    assert!(stats.main_steps > 0 && stats.drafted >= stats.main_steps);
    eprintln!(
        "greedy on the random-weight fixture: {} of {} drafts accepted, {} main steps for {} \
         tokens",
        stats.accepted, stats.drafted, stats.main_steps, plain.generated_tokens
    );
}

#[test]
fn a_model_without_mtp_modules_is_refused() {
    let model = fixture("deepseek_v3_mla");
    let request = GenerationRequest::new(vec![vec![1, 2, 3]], SamplingParams::default());
    let error = Engine::new(&model)
        .generate_speculative(&request, None)
        .unwrap_err()
        .to_string();
    assert!(error.contains("speculative"), "{error}");
}

/// A tiny DeepSeek-V3 with one MTP module and a 6-token vocabulary, weights drawn wide enough
/// (std 0.4) that its distributions are far from uniform and the module's differ from the
/// main model's.
fn tiny_mtp_model() -> Transformer {
    let config = ModelConfig::from_json_str(
        r#"{
  "architectures": ["DeepseekV3ForCausalLM"], "vocab_size": 6, "hidden_size": 16,
  "intermediate_size": 24, "moe_intermediate_size": 8, "num_hidden_layers": 2,
  "num_attention_heads": 2, "num_key_value_heads": 2, "q_lora_rank": null,
  "kv_lora_rank": 8, "qk_nope_head_dim": 4, "qk_rope_head_dim": 4, "v_head_dim": 4,
  "n_routed_experts": 4, "n_group": 2, "topk_group": 1, "num_experts_per_tok": 2,
  "n_shared_experts": 1, "first_k_dense_replace": 1, "num_nextn_predict_layers": 1,
  "max_position_embeddings": 64
}"#,
        Path::new("tiny.json"),
    )
    .unwrap();
    Transformer::init_with(config, &Device::Cpu, 11, InitScheme::Normal { std: 0.4 }).unwrap()
}

/// The exact probability of every `depth`-token continuation of `prompt` under `rule`, by full
/// recomputation (one batched forward per depth over all prefixes).
fn exact_law(
    model: &Transformer,
    prompt: &[u32],
    rule: &SamplingRule,
    depth: usize,
) -> HashMap<Vec<u32>, (f64, Vec<f64>)> {
    let vocab = model.config().vocab_size as u32;
    // (continuation, probability, per-token log-probabilities)
    let mut level: Vec<(Vec<u32>, f64, Vec<f64>)> = vec![(Vec::new(), 1.0, Vec::new())];
    for _ in 0..depth {
        let len = prompt.len() + level[0].0.len();
        let ids: Vec<u32> = level
            .iter()
            .flat_map(|(c, _, _)| prompt.iter().chain(c).copied())
            .collect();
        let rows = level.len();
        let ids = Tensor::from_vec(ids, (rows, len), &Device::Cpu).unwrap();
        let positions: Vec<u32> = (0..rows).flat_map(|_| 0..len as u32).collect();
        let positions = Tensor::from_vec(positions, (rows, len), &Device::Cpu).unwrap();
        let bias = causal_bias(&vec![vec![true; len]; rows], len, &Device::Cpu).unwrap();
        let logits = model.forward(&ids, &positions, &bias, None).unwrap();
        let last: Vec<Vec<f32>> = logits
            .narrow(1, len - 1, 1)
            .unwrap()
            .squeeze(1)
            .unwrap()
            .to_dtype(DType::F32)
            .unwrap()
            .to_vec2()
            .unwrap();
        let mut next = Vec::new();
        for ((c, prob, lps), row) in level.iter().zip(&last) {
            for candidate in truncated_distribution(row, rule) {
                let mut c2 = c.clone();
                c2.push(candidate.id);
                let mut l2 = lps.clone();
                l2.push(candidate.logprob);
                next.push((c2, prob * candidate.logprob.exp(), l2));
            }
        }
        level = next;
        assert!(level.iter().all(|(c, _, _)| c.iter().all(|&t| t < vocab)));
    }
    level.into_iter().map(|(c, p, l)| (c, (p, l))).collect()
}

/// Pearson's chi-square of observed counts against a law (cells with expected count below 5
/// pooled into one).
fn chi_square(
    counts: &HashMap<Vec<u32>, usize>,
    law: &HashMap<Vec<u32>, f64>,
    total: usize,
) -> f64 {
    let (mut chi, mut pooled_expected, mut pooled_observed) = (0.0, 0.0, 0.0);
    for (cell, &p) in law {
        let expected = p * total as f64;
        let observed = *counts.get(cell).unwrap_or(&0) as f64;
        if expected < 5.0 {
            pooled_expected += expected;
            pooled_observed += observed;
        } else {
            chi += (observed - expected).powi(2) / expected;
        }
    }
    if pooled_expected > 0.0 {
        chi += (pooled_observed - pooled_expected).powi(2) / pooled_expected;
    }
    // Anything observed outside the law's support is impossible.
    assert!(
        counts.keys().all(|c| law.contains_key(c)),
        "a continuation outside the law"
    );
    chi
}

#[test]
fn sampled_sequences_have_exactly_the_main_models_distribution() {
    let model = tiny_mtp_model();
    let engine = Engine::new(&model);
    let prompt = vec![1u32, 4, 2];
    for (temperature, top_k, top_p) in [(1.0f32, None, 1.0f32), (0.7, Some(4), 0.9)] {
        let rule = SamplingRule::new(temperature, top_k, top_p).unwrap();
        let law = exact_law(&model, &prompt, &rule, 3);
        let probabilities: HashMap<Vec<u32>, f64> =
            law.iter().map(|(c, (p, _))| (c.clone(), *p)).collect();
        let total_mass: f64 = probabilities.values().sum();
        // (The sampling normalizer is within about 1e-7 relative per step: `sampling`.)
        assert!((total_mass - 1.0).abs() < 1e-6, "{total_mass}");
        let samples = 4000;
        let mut counts: HashMap<Vec<u32>, usize> = HashMap::new();
        let mut stats = stoke_rollout::SpeculativeStats::default();
        for seed in 0..5u64 {
            let params = SamplingParams {
                max_new_tokens: 3,
                temperature,
                top_k,
                top_p,
                seed,
                n: samples,
                ..SamplingParams::default()
            };
            let out = engine
                .generate_speculative(&GenerationRequest::new(vec![prompt.clone()], params), None)
                .unwrap();
            stats.main_steps += out.stats.main_steps;
            stats.drafted += out.stats.drafted;
            stats.accepted += out.stats.accepted;
            for completion in &out.output.completions[0] {
                assert_eq!(completion.token_ids.len(), 3);
                // The reported log-probabilities are the main model's processed ones.
                let (_, logprobs) = &law[&completion.token_ids];
                for (got, want) in completion.logprobs.iter().zip(logprobs) {
                    assert!((*got as f64 - want).abs() < 1e-4, "logprob {got} vs {want}");
                }
                *counts.entry(completion.token_ids.clone()).or_default() += 1;
            }
        }
        let total = 5 * samples;
        let chi = chi_square(&counts, &probabilities, total);
        let cells = probabilities
            .values()
            .filter(|&&p| p * total as f64 >= 5.0)
            .count();
        // Degrees of freedom: the kept cells plus the pooled one, minus 1. The bound is the
        // chi-square quantile at p = 1e-4 by Wilson-Hilferty.
        let dof = cells as f64;
        let z = 3.719;
        let bound = dof * (1.0 - 2.0 / (9.0 * dof) + z * (2.0 / (9.0 * dof)).sqrt()).powi(3);
        eprintln!(
            "T={temperature} top_k={top_k:?} top_p={top_p}: chi-square {chi:.1} over {dof} dof \
             (bound {bound:.1}); {} of {} drafts accepted",
            stats.accepted, stats.drafted
        );
        assert!(chi < bound, "chi-square {chi} >= {bound}");
        assert!(stats.accepted > 0 && stats.accepted < stats.drafted);
        // The same samples against a slightly different law (temperature 1.15 times this one)
        // fail the test: it has the power to see a biased sampler.
        let skewed_rule = SamplingRule::new(temperature * 1.15, top_k, top_p).unwrap();
        let skewed: HashMap<Vec<u32>, f64> = exact_law(&model, &prompt, &skewed_rule, 3)
            .into_iter()
            .map(|(c, (p, _))| (c, p))
            .collect();
        let skewed_counts: HashMap<Vec<u32>, usize> = counts
            .iter()
            .filter(|(c, _)| skewed.contains_key(*c))
            .map(|(c, &n)| (c.clone(), n))
            .collect();
        let chi_skewed = chi_square(&skewed_counts, &skewed, total);
        assert!(
            chi_skewed > 2.0 * bound,
            "skewed law not rejected: {chi_skewed}"
        );
    }
}
