//! QK-clip, the "Clip" of MuonClip (Kimi K2, arXiv 2507.20534 §2.1): after an optimizer step,
//! every attention head whose largest logit `S_h` (`q·k` times the attention scale, tracked in
//! the step's forward passes: `Transformer::forward_hidden_recorded`) passed the threshold `T`
//! has its query and key projections scaled down so that its logits shrink by
//! `gamma_h = min(1, T / S_h)`.
//!
//! Without grouped-query attention each head gets `sqrt(gamma_h)` on its query rows and on its
//! key rows (K2's split). A key head shared by several query heads (GQA) gets `sqrt(gamma_g)`,
//! `gamma_g` the smallest of its group, and each query head `gamma_h / sqrt(gamma_g)`: every
//! head's logits shrink by exactly its own `gamma_h`, and the shared key by no more than its
//! worst head needs. Biases of the projections are scaled with their rows (the logit is
//! bilinear in the projected q and k; RoPE is linear). Heads at or below `T` are untouched.
//!
//! Not for models whose q/k norms follow the projections (Qwen3, Gemma 3, OLMoE): the norm
//! would undo the scaling, and those norms already bound the logits. Not under LoRA (the base
//! weights are frozen).

use crate::error::ModelError;
use crate::transformer::Transformer;
use candle_core::Tensor;

/// What one QK-clip did.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct QkClipReport {
    /// The largest logit seen, over every layer and head (before the clip).
    pub max_logit: f32,
    /// Heads whose projections were scaled.
    pub clipped_heads: usize,
}

/// Each head's factor `min(1, threshold / max_logit)` (1 for a non-positive or non-finite max).
pub fn clip_factors(max_logits: &[f32], threshold: f64) -> Vec<f64> {
    max_logits
        .iter()
        .map(|&s| {
            let s = f64::from(s);
            if s.is_finite() && s > threshold {
                threshold / s
            } else {
                1.0
            }
        })
        .collect()
}

impl Transformer {
    /// Applies QK-clip at `threshold` from the per-layer, per-query-head max logits of the
    /// step (`(layer, [S_h])`, several records of one layer taking their maximum).
    pub fn qk_clip(
        &mut self,
        max_logits: &[(usize, Vec<f32>)],
        threshold: f64,
    ) -> Result<QkClipReport, ModelError> {
        if !(threshold.is_finite() && threshold > 0.0) {
            return Err(ModelError::InvalidArgument(format!(
                "qk_clip: the threshold must be positive, got {threshold}"
            )));
        }
        let config = self.config().clone();
        if config.qk_norm || config.qk_norm_whole {
            return Err(ModelError::InvalidArgument(format!(
                "qk_clip: {} normalizes q and k after their projections, which would undo the \
                 clip (and bounds the logits already)",
                config.architecture.model_type()
            )));
        }
        if config.mla.is_some() {
            // Kimi K2 clips MLA per part (q/k nope by sqrt(gamma), q rope by gamma, the shared
            // rotated key untouched); that rule is not built.
            return Err(ModelError::InvalidArgument(format!(
                "qk_clip: {} uses latent attention (MLA), whose per-part clipping is not \
                 implemented",
                config.architecture.model_type()
            )));
        }
        if self.lora_config().is_some() {
            return Err(ModelError::InvalidArgument(
                "qk_clip: the base weights are frozen under LoRA".into(),
            ));
        }
        let (q_heads, kv_heads, d) = (
            config.num_attention_heads,
            config.num_key_value_heads,
            config.head_dim,
        );
        let n_rep = q_heads / kv_heads;
        let mut per_layer: std::collections::BTreeMap<usize, Vec<f32>> = Default::default();
        for (layer, heads) in max_logits {
            if *layer >= config.num_hidden_layers || heads.len() != q_heads {
                return Err(ModelError::InvalidArgument(format!(
                    "qk_clip: {} max logits for layer {layer} of a model with {} layers and {q_heads} heads",
                    heads.len(),
                    config.num_hidden_layers
                )));
            }
            let entry = per_layer
                .entry(*layer)
                .or_insert_with(|| vec![f32::NEG_INFINITY; q_heads]);
            for (e, &h) in entry.iter_mut().zip(heads) {
                *e = e.max(h);
            }
        }
        let mut report = QkClipReport {
            max_logit: f32::NEG_INFINITY,
            clipped_heads: 0,
        };
        let parameters: std::collections::BTreeMap<String, candle_core::Var> =
            self.parameters().into_iter().collect();
        for (layer, heads) in per_layer {
            report.max_logit = heads.iter().copied().fold(report.max_logit, f32::max);
            let gamma = clip_factors(&heads, threshold);
            if gamma.iter().all(|&g| g == 1.0) {
                continue;
            }
            report.clipped_heads += gamma.iter().filter(|&&g| g < 1.0).count();
            let group_gamma: Vec<f64> = (0..kv_heads)
                .map(|g| {
                    gamma[g * n_rep..(g + 1) * n_rep]
                        .iter()
                        .copied()
                        .fold(1.0, f64::min)
                })
                .collect();
            let q_scale: Vec<f64> = (0..q_heads)
                .map(|h| gamma[h] / group_gamma[h / n_rep].sqrt())
                .collect();
            let k_scale: Vec<f64> = group_gamma.iter().map(|g| g.sqrt()).collect();
            for (proj, scales) in [("q_proj", &q_scale), ("k_proj", &k_scale)] {
                for part in ["weight", "bias"] {
                    let name = format!("model.layers.{layer}.self_attn.{proj}.{part}");
                    let Some(var) = parameters.get(&name) else {
                        continue;
                    };
                    let row_scale: Vec<f32> = scales
                        .iter()
                        .flat_map(|&s| std::iter::repeat_n(s as f32, d))
                        .collect();
                    let t = var.as_tensor();
                    let column = Tensor::from_vec(row_scale, scales.len() * d, t.device())?
                        .to_dtype(t.dtype())?;
                    let scaled = if t.rank() == 2 {
                        t.broadcast_mul(&column.unsqueeze(1)?)?
                    } else {
                        t.mul(&column)?
                    };
                    var.set(&scaled)?;
                }
            }
        }
        Ok(report)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_clip_factor_is_the_threshold_over_the_max_logit_when_past_it() {
        assert_eq!(
            clip_factors(&[50.0, 100.0, 200.0, 400.0, -3.0, f32::NAN], 100.0),
            vec![1.0, 1.0, 0.5, 0.25, 1.0, 1.0]
        );
    }
}
