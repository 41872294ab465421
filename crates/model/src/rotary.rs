//! RoPE frequency tables: inverse frequencies per scaling type and cos/sin from absolute
//! positions, reproducing transformers 5.x `modeling_rope_utils` (`_compute_default_rope_parameters`,
//! `_compute_linear_scaling_rope_parameters`, `_compute_llama3_parameters`,
//! `_compute_yarn_parameters`) and `LlamaRotaryEmbedding.forward`.
//!
//! Precision follows torch: the frequency arithmetic that torch does on float32 tensors is
//! done here in f32, the scalar arithmetic it does on Python floats in f64. cos and sin are
//! multiplied by the attention factor (YaRN's mscale; 1 otherwise) exactly like HF scales
//! them, which scales both q and k (so the logits by attention_factor^2).
//!
//! YaRN follows 5.x: `factor` is used as given; only when it is absent is it derived as
//! `max_position_embeddings / original_max_position_embeddings`. (Some 4.x releases instead
//! overrode `factor` with that ratio whenever `original_max_position_embeddings` was present.)

use crate::config::{ModelConfig, Rope, RopeScaling};
use candle_core::{DType, Device, Result, Tensor};

/// Inverse frequencies (head_dim / 2 of them) and the cos/sin scale.
#[derive(Debug, Clone, PartialEq)]
pub struct RotaryTable {
    inv_freq: Vec<f32>,
    attention_factor: f64,
}

impl RotaryTable {
    /// The table of the model's (global) RoPE.
    pub fn new(config: &ModelConfig) -> RotaryTable {
        RotaryTable::for_rope(&config.rope, config)
    }

    /// The table of the sliding-window layers: `local_rope` where the model has one (Gemma 3),
    /// else the global table.
    pub fn local(config: &ModelConfig) -> RotaryTable {
        RotaryTable::for_rope(config.local_rope.as_ref().unwrap_or(&config.rope), config)
    }

    /// The table of `rope` at the model's head_dim and context length.
    pub fn for_rope(rope: &Rope, config: &ModelConfig) -> RotaryTable {
        let dim = config.head_dim;
        let base = rope.theta;
        let default_inv_freq = || -> Vec<f32> {
            (0..dim / 2)
                .map(|i| 1.0f32 / (base as f32).powf((2 * i) as f32 / dim as f32))
                .collect()
        };
        match &rope.scaling {
            RopeScaling::Default => RotaryTable {
                inv_freq: default_inv_freq(),
                attention_factor: 1.0,
            },
            RopeScaling::Linear { factor } => RotaryTable {
                inv_freq: default_inv_freq()
                    .into_iter()
                    .map(|f| f / *factor as f32)
                    .collect(),
                attention_factor: 1.0,
            },
            RopeScaling::Llama3 {
                factor,
                low_freq_factor,
                high_freq_factor,
                original_max_position_embeddings,
            } => {
                let factor = *factor as f32;
                let old_context_len = *original_max_position_embeddings as f64;
                let low_freq_wavelen = (old_context_len / low_freq_factor) as f32;
                let high_freq_wavelen = (old_context_len / high_freq_factor) as f32;
                let inv_freq = default_inv_freq()
                    .into_iter()
                    .map(|inv| {
                        let wavelen = (2.0 * std::f64::consts::PI) as f32 / inv;
                        let scaled = if wavelen > low_freq_wavelen {
                            inv / factor
                        } else {
                            inv
                        };
                        let smooth = (old_context_len as f32 / wavelen - *low_freq_factor as f32)
                            / (*high_freq_factor as f32 - *low_freq_factor as f32);
                        let smoothed = (1.0 - smooth) * scaled / factor + smooth * scaled;
                        // transformers: ~(wavelen < high) * ~(wavelen > low); wavelen is never NaN.
                        let is_medium = wavelen >= high_freq_wavelen && wavelen <= low_freq_wavelen;
                        if is_medium { smoothed } else { scaled }
                    })
                    .collect();
                RotaryTable {
                    inv_freq,
                    attention_factor: 1.0,
                }
            }
            RopeScaling::Yarn {
                factor,
                attention_factor,
                mscale,
                mscale_all_dim,
                beta_fast,
                beta_slow,
                original_max_position_embeddings,
                truncate,
            } => {
                let original = *original_max_position_embeddings as f64;
                let factor = factor.unwrap_or(config.max_position_embeddings as f64 / original);
                let get_mscale = |scale: f64, m: f64| {
                    if scale <= 1.0 {
                        1.0
                    } else {
                        0.1 * m * scale.ln() + 1.0
                    }
                };
                // Python truthiness: a value of 0 counts as absent.
                let truthy = |v: Option<f64>| v.filter(|x| *x != 0.0);
                let attention_factor =
                    match (attention_factor, truthy(*mscale), truthy(*mscale_all_dim)) {
                        (Some(a), _, _) => *a,
                        (None, Some(m), Some(m_all)) => {
                            get_mscale(factor, m) / get_mscale(factor, m_all)
                        }
                        (None, _, _) => get_mscale(factor, 1.0),
                    };
                let beta_fast = truthy(*beta_fast).unwrap_or(32.0);
                let beta_slow = truthy(*beta_slow).unwrap_or(1.0);
                let d = dim as f64;
                let correction_dim = |rotations: f64| {
                    (d * (original / (rotations * 2.0 * std::f64::consts::PI)).ln())
                        / (2.0 * base.ln())
                };
                let (mut low, mut high) = (correction_dim(beta_fast), correction_dim(beta_slow));
                if truncate.unwrap_or(true) {
                    low = low.floor();
                    high = high.ceil();
                }
                let low = low.max(0.0);
                let mut high = high.min(d - 1.0);
                if low == high {
                    high += 0.001;
                }
                let inv_freq = (0..dim / 2)
                    .map(|i| {
                        let pos_freq = (base as f32).powf((2 * i) as f32 / dim as f32);
                        let extrapolation = 1.0 / pos_freq;
                        let interpolation = 1.0 / (factor as f32 * pos_freq);
                        let ramp =
                            ((i as f32 - low as f32) / (high as f32 - low as f32)).clamp(0.0, 1.0);
                        let extrapolation_factor = 1.0 - ramp;
                        interpolation * (1.0 - extrapolation_factor)
                            + extrapolation * extrapolation_factor
                    })
                    .collect();
                RotaryTable {
                    inv_freq,
                    attention_factor,
                }
            }
        }
    }

    pub fn inv_freq(&self) -> &[f32] {
        &self.inv_freq
    }

    pub fn attention_factor(&self) -> f64 {
        self.attention_factor
    }

    /// cos and sin for `positions` [B, T] (u32), shaped [B, T, 1, head_dim] in `dtype`, ready
    /// to broadcast over heads in the [B, T, H, D] layout.
    pub fn cos_sin(&self, positions: &Tensor, dtype: DType) -> Result<(Tensor, Tensor)> {
        let (batch, len) = positions.dims2()?;
        let positions: Vec<u32> = positions.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
        let half = self.inv_freq.len();
        let scale = self.attention_factor as f32;
        // One [cos | cos] / [sin | sin] row per distinct position: a table over 0..=max when
        // that is no larger than the batch (the usual case), else a row per element.
        let max_position = positions.iter().copied().max().unwrap_or(0) as usize;
        let table_rows: Vec<u32> = if max_position < positions.len() {
            (0..=max_position as u32).collect()
        } else {
            positions.clone()
        };
        let mut cos_table = Vec::with_capacity(table_rows.len() * half * 2);
        let mut sin_table = Vec::with_capacity(table_rows.len() * half * 2);
        let mut row_cos = vec![0f32; half];
        let mut row_sin = vec![0f32; half];
        for &p in &table_rows {
            for (k, inv) in self.inv_freq.iter().enumerate() {
                let angle = p as f32 * inv;
                row_cos[k] = angle.cos() * scale;
                row_sin[k] = angle.sin() * scale;
            }
            cos_table.extend_from_slice(&row_cos);
            cos_table.extend_from_slice(&row_cos);
            sin_table.extend_from_slice(&row_sin);
            sin_table.extend_from_slice(&row_sin);
        }
        let (cos, sin) = if table_rows.len() == positions.len() && max_position >= positions.len() {
            (cos_table, sin_table)
        } else {
            let width = half * 2;
            let mut cos = Vec::with_capacity(positions.len() * width);
            let mut sin = Vec::with_capacity(positions.len() * width);
            for &p in &positions {
                let at = p as usize * width;
                cos.extend_from_slice(&cos_table[at..at + width]);
                sin.extend_from_slice(&sin_table[at..at + width]);
            }
            (cos, sin)
        };
        let shape = (batch, len, 1, half * 2);
        let cos = Tensor::from_vec(cos, shape, &Device::Cpu)?.to_dtype(dtype)?;
        let sin = Tensor::from_vec(sin, shape, &Device::Cpu)?.to_dtype(dtype)?;
        Ok((cos, sin))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::path::Path;

    fn table(rope_parameters: &str) -> RotaryTable {
        let json = format!(
            r#"{{"architectures": ["LlamaForCausalLM"], "vocab_size": 10, "hidden_size": 64,
                "intermediate_size": 8, "num_hidden_layers": 1, "num_attention_heads": 4,
                "head_dim": 16, "max_position_embeddings": 256, "rope_parameters": {rope_parameters}}}"#
        );
        RotaryTable::new(&ModelConfig::from_json_str(&json, Path::new("test")).expect("config"))
    }

    fn assert_close(got: &[f32], want: &[f64]) {
        assert_eq!(got.len(), want.len());
        for (g, w) in got.iter().zip(want) {
            assert!(
                (*g as f64 - w).abs() <= 1e-6 * w.abs(),
                "{got:?} vs {want:?}"
            );
        }
    }

    // Expected values printed by transformers 5.24.0 `ROPE_INIT_FUNCTIONS[...](config, "cpu")`
    // for the same config (the fixtures cover the common settings end to end; these pin the
    // rarer yarn options: mscale/mscale_all_dim, truncate=false, custom betas).
    #[test]
    fn yarn_with_mscale_and_no_truncation_matches_transformers() {
        let t = table(
            r#"{"rope_type": "yarn", "factor": 4.0, "mscale": 0.707, "mscale_all_dim": 1.0, "truncate": false,
                "beta_fast": 16.0, "beta_slow": 2.0, "original_max_position_embeddings": 64, "rope_theta": 500.0}"#,
        );
        assert_close(
            t.inv_freq(),
            &[
                1.0,
                0.2952757477760315,
                0.060098692774772644,
                0.02431231178343296,
                0.011180340312421322,
                0.005141428206115961,
                0.0023643539752811193,
                0.0010872796410694718,
            ],
        );
        assert!((t.attention_factor() - 0.964326914892074).abs() < 1e-12);
    }

    #[test]
    fn llama3_bands_match_transformers() {
        let t = table(
            r#"{"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                "original_max_position_embeddings": 64, "rope_theta": 500.0}"#,
        );
        assert_close(
            t.inv_freq(),
            &[
                1.0,
                0.4598632752895355,
                0.09761662781238556,
                0.01215615589171648,
                0.005590170156210661,
                0.0025707141030579805,
                0.0011821769876405597,
                0.0005436398205347359,
            ],
        );
        assert_eq!(t.attention_factor(), 1.0);
    }

    #[test]
    fn cos_sin_are_scaled_by_the_attention_factor_and_duplicated_over_halves() -> Result<()> {
        let t = table(r#"{"rope_type": "yarn", "factor": 4.0, "rope_theta": 500.0}"#);
        let positions = Tensor::new(&[[0u32, 3]], &Device::Cpu)?;
        let (cos, sin) = t.cos_sin(&positions, DType::F32)?;
        assert_eq!(cos.dims(), [1, 2, 1, 16]);
        let cos: Vec<f32> = cos.flatten_all()?.to_vec1()?;
        let sin: Vec<f32> = sin.flatten_all()?.to_vec1()?;
        let scale = (0.1 * 4f64.ln() + 1.0) as f32;
        assert!((cos[0] - scale).abs() < 1e-6 && sin[0] == 0.0);
        for k in 0..8 {
            let angle = 3.0 * t.inv_freq()[k];
            assert!((cos[16 + k] - angle.cos() * scale).abs() < 1e-6);
            assert_eq!(cos[16 + k], cos[16 + k + 8]);
            assert_eq!(sin[16 + k], sin[16 + k + 8]);
        }
        Ok(())
    }
}
