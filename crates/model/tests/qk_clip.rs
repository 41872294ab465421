//! MuonClip's QK-clip (`Transformer::qk_clip`) with the max logits a recorded forward pass
//! tracks: after clipping a layer, every head of it that was past the threshold has exactly the
//! threshold as its largest logit on the same input, the others keep theirs (up to rounding),
//! and models whose q/k norms would undo the clip are refused by name.

mod common;

use candle_core::Device;
use common::*;
use stoke_model::{Record, causal_bias};

fn max_logits(
    model: &stoke_model::Transformer,
    ids: &candle_core::Tensor,
) -> Vec<(usize, Vec<f32>)> {
    let (batch, len) = ids.dims2().expect("rank 2");
    let bias = causal_bias(&vec![vec![true; len]; batch], len, &Device::Cpu).expect("bias");
    let record = Record {
        routing: false,
        max_logits: true,
    };
    model
        .forward_hidden_recorded(&ids_u32(ids), &arange_positions(batch, len), &bias, record)
        .expect("forward")
        .1
        .max_logits
}

#[test]
fn clipped_heads_end_at_the_threshold_and_the_others_are_untouched() {
    // GQA (4 query heads over 2 key heads), untied, llama3 RoPE; and MQA with tied embeddings.
    for fixture in ["llama_gqa_rope_llama3", "llama_mqa_tied", "qwen2_bias_tied"] {
        let dir = fixtures_root().join(fixture);
        let mut model = load(&dir);
        let ids = &reference_tensors(&dir)["input_ids_a"];
        let recorded = max_logits(&model, ids);
        assert_eq!(recorded.len(), model.config().num_hidden_layers);
        // The last layer only: clipping an earlier one changes the later layers' inputs.
        let last = model.config().num_hidden_layers - 1;
        let before: Vec<(usize, Vec<f32>)> =
            recorded.into_iter().filter(|(l, _)| *l == last).collect();
        let all: Vec<f32> = before.iter().flat_map(|(_, h)| h.clone()).collect();
        let largest = all.iter().copied().fold(f32::NEG_INFINITY, f32::max);
        let smallest = all.iter().copied().fold(f32::INFINITY, f32::min);
        assert!(largest > smallest, "{fixture}: heads differ");
        // A threshold between the heads' maxima: some heads are clipped, some not.
        let threshold = f64::from(smallest + largest) / 2.0;
        let report = model.qk_clip(&before, threshold).expect("clip");
        assert_eq!(report.max_logit, largest);
        let expected_clipped = all.iter().filter(|&&s| f64::from(s) > threshold).count();
        assert_eq!(report.clipped_heads, expected_clipped, "{fixture}");
        let after: Vec<(usize, Vec<f32>)> = max_logits(&model, ids)
            .into_iter()
            .filter(|(l, _)| *l == last)
            .collect();
        for ((layer, old), (_, new)) in before.iter().zip(&after) {
            for (h, (&o, &n)) in old.iter().zip(new).enumerate() {
                if f64::from(o) > threshold {
                    assert!(
                        (f64::from(n) - threshold).abs() < 1e-4 * threshold.abs().max(1.0),
                        "{fixture} layer {layer} head {h}: {o} -> {n}, threshold {threshold}"
                    );
                } else {
                    // A clipped neighbour may share the key head (GQA): its query rows carry
                    // the inverse of the key's factor, so the logits stay up to rounding.
                    assert!(
                        (n - o).abs() <= 1e-5 * o.abs().max(1.0),
                        "{fixture} layer {layer} head {h}: {o} -> {n}"
                    );
                }
            }
        }
    }
}

#[test]
fn models_with_qk_norms_and_bad_input_are_refused() {
    let mut qwen3 = load(&fixtures_root().join("qwen3_qknorm"));
    let err = qwen3.qk_clip(&[], 10.0).expect_err("q/k norms").to_string();
    assert!(err.contains("qwen3"), "{err}");
    let mut llama = load(&fixtures_root().join("llama_mqa_tied"));
    assert!(llama.qk_clip(&[], 0.0).is_err());
    assert!(
        llama.qk_clip(&[(0, vec![1.0; 3])], 10.0).is_err(),
        "3 heads of 4"
    );
    assert!(
        llama.qk_clip(&[(9, vec![1.0; 4])], 10.0).is_err(),
        "no layer 9"
    );
}
