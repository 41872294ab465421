//! Model-level consistency of incremental decoding: prefill + step-by-step decode with the
//! KV cache equals one full forward pass (with and without left padding), `select_batch`
//! replicates rows, and packed documents under `document_causal_bias` equal separate passes.

mod common;

use candle_core::{Device, Tensor};
use common::*;
use stoke_model::{KvCache, Transformer, causal_bias, document_causal_bias};

const CACHE_TOLERANCE: f32 = 1e-5;

fn models() -> Vec<(&'static str, Transformer)> {
    stoke_ops::numerics::init_compute_threads();
    [("llama", TINY_LLAMA), ("qwen3 tied yarn", TINY_QWEN3_TIED)]
        .into_iter()
        .map(|(label, json)| {
            (
                label,
                Transformer::init(tiny_config(json), &Device::Cpu, 3).expect("init"),
            )
        })
        .collect()
}

fn tensor_u32(rows: &[Vec<u32>]) -> Tensor {
    let (b, t) = (rows.len(), rows[0].len());
    Tensor::from_vec(rows.concat(), (b, t), &Device::Cpu).expect("tensor")
}

/// Row 0 is left-padded by `pad` slots; positions start at 0 at each row's first real token.
fn positions_for(key_valid: &[Vec<bool>]) -> Vec<Vec<u32>> {
    key_valid
        .iter()
        .map(|row| {
            let pad = row.iter().take_while(|v| !**v).count();
            (0..row.len())
                .map(|t| t.saturating_sub(pad) as u32)
                .collect()
        })
        .collect()
}

/// Decodes `sequences` (rows left-padded where `key_valid` is false) through a fresh cache: a
/// prefill of `prefill` slots, then one slot per step. Every valid position's logits must equal
/// one full forward pass within the cache tolerance (relative to the logits' scale: f32
/// summation order; a wrong window, eviction or latent is off by order 1). After each step
/// `after_step(cache, end)` checks what the cache holds; the final cache is returned.
fn decode_equals_full(
    model: &Transformer,
    sequences: &[Vec<u32>],
    key_valid: &[Vec<bool>],
    prefill: usize,
    mut after_step: impl FnMut(&KvCache, usize),
) -> KvCache {
    let positions = positions_for(key_valid);
    let len = sequences[0].len();
    let full_bias = causal_bias(key_valid, len, &Device::Cpu).unwrap();
    let full = model
        .forward(
            &tensor_u32(sequences),
            &tensor_u32(&positions),
            &full_bias,
            None,
        )
        .unwrap();
    let mut cache = KvCache::new(model.config().num_hidden_layers);
    let mut start = 0;
    while start < len {
        let end = if start == 0 { prefill } else { start + 1 };
        let chunk: Vec<Vec<u32>> = sequences.iter().map(|s| s[start..end].to_vec()).collect();
        let chunk_pos: Vec<Vec<u32>> = positions.iter().map(|p| p[start..end].to_vec()).collect();
        let valid: Vec<Vec<bool>> = key_valid.iter().map(|v| v[..end].to_vec()).collect();
        let bias = causal_bias(&valid, end - start, &Device::Cpu).unwrap();
        let logits = model
            .forward(
                &tensor_u32(&chunk),
                &tensor_u32(&chunk_pos),
                &bias,
                Some(&mut cache),
            )
            .unwrap();
        for (b, valid) in key_valid.iter().enumerate() {
            for t in (start..end).filter(|&t| valid[t]) {
                let got = logits.get(b).unwrap().get(t - start).unwrap();
                let want = full.get(b).unwrap().get(t).unwrap();
                let diff = max_abs_diff(&got, &want);
                let scale = want
                    .abs()
                    .unwrap()
                    .max(0)
                    .unwrap()
                    .to_scalar::<f32>()
                    .unwrap();
                assert!(
                    diff <= CACHE_TOLERANCE * (1.0 + scale),
                    "prefill {prefill}: row {b} position {t}: cached vs full {diff}"
                );
            }
        }
        assert_eq!(cache.len(), end);
        after_step(&cache, end);
        start = end;
    }
    cache
}

#[test]
fn prefill_then_decode_equals_full_forward_with_left_padding() {
    let pad = 2;
    let ids = vec![
        vec![0, 0, 7, 3, 12, 44, 5, 9, 30],
        vec![4, 8, 15, 16, 23, 42, 1, 11, 19],
    ];
    let key_valid: Vec<Vec<bool>> = vec![(0..9).map(|t| t >= pad).collect(), vec![true; 9]];
    let positions = positions_for(&key_valid);
    let prefill = 5;
    for (label, model) in models() {
        let full_bias = causal_bias(&key_valid, 9, &Device::Cpu).expect("bias");
        let full = model
            .forward(&tensor_u32(&ids), &tensor_u32(&positions), &full_bias, None)
            .expect("full");

        let mut cache = KvCache::new(model.config().num_hidden_layers);
        let slice = |rows: &[Vec<u32>], from: usize, to: usize| -> Vec<Vec<u32>> {
            rows.iter().map(|r| r[from..to].to_vec()).collect()
        };
        let valid_prefix: Vec<Vec<bool>> =
            key_valid.iter().map(|r| r[..prefill].to_vec()).collect();
        let bias = causal_bias(&valid_prefix, prefill, &Device::Cpu).expect("bias");
        let mut pieces = vec![
            model
                .forward(
                    &tensor_u32(&slice(&ids, 0, prefill)),
                    &tensor_u32(&slice(&positions, 0, prefill)),
                    &bias,
                    Some(&mut cache),
                )
                .expect("prefill"),
        ];
        for t in prefill..9 {
            let valid: Vec<Vec<bool>> = key_valid.iter().map(|r| r[..=t].to_vec()).collect();
            let bias = causal_bias(&valid, 1, &Device::Cpu).expect("bias");
            let step = model
                .forward(
                    &tensor_u32(&slice(&ids, t, t + 1)),
                    &tensor_u32(&slice(&positions, t, t + 1)),
                    &bias,
                    Some(&mut cache),
                )
                .expect("decode");
            pieces.push(step);
        }
        assert_eq!(cache.len(), 9);
        let incremental = Tensor::cat(&pieces, 1).expect("cat");
        // Compare the real (non-padding) positions.
        for (b, row) in key_valid.iter().enumerate() {
            let start = row.iter().take_while(|v| !**v).count();
            let got = incremental
                .get(b)
                .and_then(|r| r.narrow(0, start, 9 - start))
                .expect("row");
            let want = full
                .get(b)
                .and_then(|r| r.narrow(0, start, 9 - start))
                .expect("row");
            let diff = max_abs_diff(&got, &want);
            assert!(diff < CACHE_TOLERANCE, "{label}: row {b}: diff {diff}");
        }
    }
}

#[test]
fn select_batch_replicates_one_prefill_for_several_continuations() {
    let prompt = vec![vec![3u32, 14, 15, 9, 26]];
    let continuations = [7u32, 21, 50];
    for (label, model) in models() {
        let mut cache = KvCache::new(model.config().num_hidden_layers);
        let bias = causal_bias(&[vec![true; 5]], 5, &Device::Cpu).expect("bias");
        model
            .forward(
                &tensor_u32(&prompt),
                &tensor_u32(&[vec![0, 1, 2, 3, 4]]),
                &bias,
                Some(&mut cache),
            )
            .expect("prefill");
        let mut replicated = cache.select_batch(&[0, 0, 0]).expect("select");
        assert_eq!(replicated.batch_size(), Some(3));
        assert_eq!(replicated.len(), 5);
        let step_ids: Vec<Vec<u32>> = continuations.iter().map(|&c| vec![c]).collect();
        let bias = causal_bias(&vec![vec![true; 6]; 3], 1, &Device::Cpu).expect("bias");
        let step = model
            .forward(
                &tensor_u32(&step_ids),
                &tensor_u32(&[vec![5], vec![5], vec![5]]),
                &bias,
                Some(&mut replicated),
            )
            .expect("step");
        for (row, &c) in continuations.iter().enumerate() {
            let mut full_ids = prompt[0].clone();
            full_ids.push(c);
            let full = forward_full(&model, &tensor_u32(&[full_ids]));
            let want = full.get(0).and_then(|r| r.get(5)).expect("last");
            let got = step.get(row).and_then(|r| r.get(0)).expect("row");
            let diff = max_abs_diff(&got, &want);
            assert!(
                diff < CACHE_TOLERANCE,
                "{label}: continuation {row}: diff {diff}"
            );
        }
        assert!(
            cache.select_batch(&[1]).is_err(),
            "out-of-range row must be rejected"
        );
    }
}

#[test]
fn packed_documents_equal_separate_forward_passes() {
    let doc_a = vec![5u32, 9, 13, 2];
    let doc_b = vec![40u32, 41, 7];
    let packed: Vec<u32> = doc_a.iter().chain(&doc_b).cloned().collect();
    let positions: Vec<u32> = (0..4).chain(0..3).collect();
    let doc_ids = vec![vec![0, 0, 0, 0, 1, 1, 1]];
    for (label, model) in models() {
        let bias = document_causal_bias(&doc_ids, &Device::Cpu).expect("bias");
        let logits = model
            .forward(
                &tensor_u32(std::slice::from_ref(&packed)),
                &tensor_u32(std::slice::from_ref(&positions)),
                &bias,
                None,
            )
            .expect("packed");
        let a = forward_full(&model, &tensor_u32(std::slice::from_ref(&doc_a)));
        let b = forward_full(&model, &tensor_u32(std::slice::from_ref(&doc_b)));
        let diff_a = max_abs_diff(&logits.narrow(1, 0, 4).expect("a"), &a);
        let diff_b = max_abs_diff(&logits.narrow(1, 4, 3).expect("b"), &b);
        assert!(
            diff_a < CACHE_TOLERANCE && diff_b < CACHE_TOLERANCE,
            "{label}: {diff_a} {diff_b}"
        );
    }
}

/// A prompt's prefill runs through the fused decoder block (an empty cache): its hidden states
/// equal the cache-free forward's bit for bit, and the keys and values it caches let the graph
/// path continue as if it had prefilled them itself (the next chunk's hidden states match a
/// prefill of the whole prompt).
#[test]
fn the_fused_prefill_fills_the_cache_the_graph_path_continues_from() {
    for (label, model) in models() {
        let ids = [vec![3u32, 14, 15, 9, 26, 5, 35, 8, 9, 7]];
        let len = ids[0].len();
        let all = tensor_u32(&ids);
        let positions = tensor_u32(&[(0..len as u32).collect()]);
        let bias = causal_bias(&[vec![true; len]], len, &Device::Cpu).unwrap();
        let free = model.forward_hidden(&all, &positions, &bias, None).unwrap();
        let mut cache = KvCache::new(model.config().num_hidden_layers);
        let cached = model
            .forward_hidden(&all, &positions, &bias, Some(&mut cache))
            .unwrap();
        let bits = |t: &Tensor| -> Vec<u32> {
            t.flatten_all()
                .unwrap()
                .to_vec1::<f32>()
                .unwrap()
                .iter()
                .map(|x| x.to_bits())
                .collect()
        };
        assert_eq!(bits(&free), bits(&cached), "{label}: prefill hidden states");
        assert_eq!(cache.len(), len);

        // Prefill 6 tokens (fused), then 4 more through the graph with the cache.
        let split = 6;
        let first = tensor_u32(&[ids[0][..split].to_vec()]);
        let first_pos = tensor_u32(&[(0..split as u32).collect()]);
        let first_bias = causal_bias(&[vec![true; split]], split, &Device::Cpu).unwrap();
        let mut chunked = KvCache::new(model.config().num_hidden_layers);
        model
            .forward_hidden(&first, &first_pos, &first_bias, Some(&mut chunked))
            .unwrap();
        let rest = tensor_u32(&[ids[0][split..].to_vec()]);
        let rest_pos = tensor_u32(&[(split as u32..len as u32).collect()]);
        let rest_bias = causal_bias(&[vec![true; len]], len - split, &Device::Cpu).unwrap();
        let tail = model
            .forward_hidden(&rest, &rest_pos, &rest_bias, Some(&mut chunked))
            .unwrap()
            .flatten_all()
            .unwrap()
            .to_vec1::<f32>()
            .unwrap();
        let whole = free.flatten_all().unwrap().to_vec1::<f32>().unwrap();
        let width = model.config().hidden_size;
        for (i, (a, b)) in tail.iter().zip(&whole[split * width..]).enumerate() {
            assert!(
                (a - b).abs() <= CACHE_TOLERANCE * (1.0 + b.abs()),
                "{label}: value {i} of the second chunk: {a} vs {b}"
            );
        }
    }
}

/// Sliding-window layers (Gemma 2's fixture: window 4 on layers 0 and 2): generation with the
/// cache, one token at a time from a left-padded batch and from a chunked prefill, equals full
/// recomputation at every step, and those layers' caches hold only `window - 1` slots while the
/// global layer holds all. Bytes per token are stated.
#[test]
fn a_sliding_window_cache_keeps_the_window_and_equals_full_recomputation() {
    let dir = fixture_dirs()
        .into_iter()
        .find(|d| name(d) == "gemma2_softcap_sliding")
        .expect("the gemma2 fixture");
    let model = load(&dir);
    let config = model.config().clone();
    let window = config.sliding_window.expect("a window");
    assert_eq!(window, 4);
    let sequences = [
        vec![3u32, 14, 15, 9, 26, 5, 35, 8, 9, 7, 93, 23, 84, 62, 64, 33],
        vec![0, 0, 0, 0, 0, 0, 27, 95, 2, 88, 41, 97, 16, 93, 99, 37],
    ];
    let key_valid: Vec<Vec<bool>> = vec![vec![true; 16], (0..16).map(|t| t >= 6).collect()];
    let len = sequences[0].len();
    for prefill in [8usize, 1] {
        let cache = decode_equals_full(&model, &sequences, &key_valid, prefill, |cache, end| {
            for layer in 0..config.num_hidden_layers {
                let expected = match config.window_of(layer) {
                    Some(w) => end.min(w - 1),
                    None => end,
                };
                assert_eq!(
                    cache.stored_len(layer),
                    expected,
                    "layer {layer} after {end}"
                );
            }
        });
        let per_layer_full = 2 * 2 * config.num_key_value_heads * config.head_dim * 4;
        eprintln!(
            "sliding-window cache after {len} slots: {} bytes ({} bytes/slot-row for the global \
             layer; the 2 sliding layers hold {} slots each)",
            cache.bytes(),
            per_layer_full / 2,
            window - 1
        );
        assert!(cache.bytes() < len * per_layer_full * config.num_hidden_layers / 2);
    }
}

/// DeepSeek-V3's latent attention: the cache holds one latent (`kv_lora_rank`) and one shared
/// rotated key (`qk_rope_head_dim`) per slot, and decoding runs the absorbed-weights path
/// (queries multiplied into the latent space). Prefill then token-by-token decoding equals full
/// recomputation (the expanded path) at every position, with left padding; the bytes per slot
/// are stated against a cache of every head's keys and values.
#[test]
fn a_latent_attention_cache_holds_the_latent_and_equals_full_recomputation() {
    let dir = fixture_dirs()
        .into_iter()
        .find(|d| name(d) == "deepseek_v3_mla")
        .expect("the deepseek_v3 fixture");
    let model = load(&dir);
    let config = model.config().clone();
    let mla = config.mla.clone().expect("latent attention");
    let sequences = [
        vec![3u32, 14, 15, 9, 26, 5, 35, 8, 9, 7, 93, 23, 84, 62],
        vec![0, 0, 0, 0, 27, 95, 2, 88, 41, 97, 16, 93, 99, 37],
    ];
    let key_valid: Vec<Vec<bool>> = vec![vec![true; 14], (0..14).map(|t| t >= 4).collect()];
    let len = sequences[0].len();
    for prefill in [6usize, 1] {
        let cache = decode_equals_full(&model, &sequences, &key_valid, prefill, |_, _| {});
        let slots = 2 * len * config.num_hidden_layers;
        let latent_per_slot = (mla.kv_lora_rank + mla.qk_rope_head_dim) * 4;
        assert_eq!(cache.bytes(), slots * latent_per_slot);
        // What a cache of the expanded keys [nope + rope] and values [v] of every head holds.
        let expanded_per_slot =
            config.num_attention_heads * (mla.qk_head_dim() + mla.v_head_dim) * 4;
        eprintln!(
            "MLA cache: {latent_per_slot} bytes per slot and layer (latent {} + rotated key {}, \
             f32) against {expanded_per_slot} for every head's keys and values: {:.1}x smaller \
             here; at DeepSeek-V3's shapes (512 + 64 against 128 heads x (192 + 128)) {:.1}x",
            mla.kv_lora_rank,
            mla.qk_rope_head_dim,
            expanded_per_slot as f64 / latent_per_slot as f64,
            (128.0 * (192.0 + 128.0)) / (512.0 + 64.0)
        );
        assert!(latent_per_slot < expanded_per_slot);
    }
}
