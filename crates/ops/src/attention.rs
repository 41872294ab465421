//! Scaled dot-product attention with an additive bias and grouped-query heads, as a
//! differentiable composition: `softmax(q k^T / sqrt(d) + bias) v`.
//!
//! Grouped-query attention (GQA/MQA, `n_rep = Hq / Hkv` query heads per key/value head) is
//! computed without materialising repeated key/value heads: query heads `h = g * n_rep + r`
//! are contiguous per group `g`, so `q` is viewed as [B, Hkv, n_rep * Tq, D] and multiplied
//! with the group's single key/value head. This is exactly transformers' `repeat_kv`
//! followed by per-head attention, without the copy.
//!
//! Invariants: the bias holds 0 where attending is allowed and `-inf` (or a large negative)
//! where not; every query row must allow at least one key (see stoke-model `causal_bias`),
//! otherwise that row's softmax is NaN.

use crate::kernels::softmax_last_dim;
use candle_core::{Result, Tensor};

/// `q`: [B, Hq, Tq, D]; `k`, `v`: [B, Hkv, Tk, D] with `Hq % Hkv == 0`;
/// `bias`: broadcastable to [B, Hq, Tq, Tk] (usually [B, 1, Tq, Tk]). Returns [B, Hq, Tq, D].
/// On the CPU (f32/f64) this is one fused graph node (fused_attention.rs, same values);
/// elsewhere the composition below.
pub fn attention(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> Result<Tensor> {
    if crate::fused_attention::supports(q, k, v, bias) {
        crate::fused_attention::fused_attention(q, k, v, bias)
    } else {
        attention_composed(q, k, v, bias)
    }
}

/// The composition (matmul, fused masked softmax, matmul): the reference for the fused op
/// and the path on other devices. Same contract as `attention`.
pub fn attention_composed(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (batch, q_heads, q_len, head_dim) = q.dims4()?;
    let (_, kv_heads, k_len, _) = k.dims4()?;
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        candle_core::bail!(
            "attention: {q_heads} query heads not a multiple of {kv_heads} key/value heads"
        )
    }
    let n_rep = q_heads / kv_heads;
    let scale = 1.0 / (head_dim as f64).sqrt();
    let grouped_q = q
        .contiguous()?
        .reshape((batch, kv_heads, n_rep * q_len, head_dim))?;
    // [B, Hkv, n_rep * Tq, Tk]: the same memory as [B, Hq, Tq, Tk].
    let scores = grouped_q.matmul(&k.t()?)?;
    let probs = if bias.rank() == 4 && crate::masked_softmax::supports(&scores) {
        // One fused graph node instead of affine + broadcast_add + softmax, applied in the
        // grouped layout so no reshape nodes surround it (see masked_softmax.rs); identical
        // values.
        crate::masked_softmax::scaled_masked_softmax(&scores, bias, scale)?
    } else {
        let scores = scores.reshape((batch, q_heads, q_len, k_len))?;
        softmax_last_dim(&scores.affine(scale, 0.0)?.broadcast_add(bias)?)?.reshape((
            batch,
            kv_heads,
            n_rep * q_len,
            k_len,
        ))?
    };
    probs
        .matmul(&v.contiguous()?)?
        .reshape((batch, q_heads, q_len, head_dim))
}

/// `attention` with the score scale given (`scale` instead of `1/sqrt(d)`: Gemma's
/// `query_pre_attn_scalar^-0.5`, MLA's `qk_head_dim^-0.5`) and, optionally, Gemma 2's soft-cap
/// on the scaled scores before the bias: `softmax(cap * tanh(s * scale / cap) + bias) v`.
/// Shapes as `attention`, except that the values may have their own width `Dv` (MLA's
/// `v_head_dim`, or the latent of its absorbed decode path): `v` [B, Hkv, Tk, Dv], output
/// [B, Hq, Tq, Dv].
///
/// Without a cap and with `Dv == D` the scale is folded into `q` (one multiply, then the fused
/// op); otherwise the composition of candle ops (so the backward pass is candle's), in the
/// grouped-query layout.
pub fn attention_with(
    q: &Tensor,
    k: &Tensor,
    v: &Tensor,
    bias: &Tensor,
    scale: f64,
    softcap: Option<f64>,
) -> Result<Tensor> {
    let (batch, q_heads, q_len, head_dim) = q.dims4()?;
    let value_dim = v.dim(3)?;
    let default = 1.0 / (head_dim as f64).sqrt();
    if softcap.is_none() && value_dim == head_dim {
        return if scale == default {
            attention(q, k, v, bias)
        } else {
            attention(&q.affine(scale / default, 0.0)?, k, v, bias)
        };
    }
    let (_, kv_heads, k_len, _) = k.dims4()?;
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        candle_core::bail!(
            "attention: {q_heads} query heads not a multiple of {kv_heads} key/value heads"
        )
    }
    let n_rep = q_heads / kv_heads;
    let grouped_q = q
        .contiguous()?
        .reshape((batch, kv_heads, n_rep * q_len, head_dim))?;
    let scores = grouped_q
        .matmul(&k.contiguous()?.t()?)?
        .reshape((batch, q_heads, q_len, k_len))?;
    let scaled = match softcap {
        Some(cap) => (scores.affine(scale / cap, 0.0)?.tanh()? * cap)?,
        None => scores.affine(scale, 0.0)?,
    };
    let probs = softmax_last_dim(&scaled.broadcast_add(bias)?)?.reshape((
        batch,
        kv_heads,
        n_rep * q_len,
        k_len,
    ))?;
    probs
        .matmul(&v.contiguous()?)?
        .reshape((batch, q_heads, q_len, value_dim))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{Device, Var};

    /// Plain loops: every query head uses key/value head `h / n_rep`.
    fn reference(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> Result<Vec<f64>> {
        let d = q.dims4()?.3;
        reference_with(q, k, v, bias, 1.0 / (d as f64).sqrt(), None)
    }

    /// Scores `s = q.k * scale`, capped as `cap * tanh(s / cap)`, plus the bias.
    fn reference_with(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        bias: &Tensor,
        scale: f64,
        cap: Option<f64>,
    ) -> Result<Vec<f64>> {
        let (b_n, hq, tq, d) = q.dims4()?;
        let (_, hkv, tk, _) = k.dims4()?;
        let dv = v.dims4()?.3;
        let q = q.flatten_all()?.to_vec1::<f64>()?;
        let k = k.flatten_all()?.to_vec1::<f64>()?;
        let v = v.flatten_all()?.to_vec1::<f64>()?;
        let bias = bias.flatten_all()?.to_vec1::<f64>()?;
        let mut out = vec![0.0; b_n * hq * tq * dv];
        for b in 0..b_n {
            for h in 0..hq {
                let g = h / (hq / hkv);
                for i in 0..tq {
                    let mut scores: Vec<f64> = (0..tk)
                        .map(|j| {
                            let dot: f64 = (0..d)
                                .map(|c| {
                                    q[((b * hq + h) * tq + i) * d + c]
                                        * k[((b * hkv + g) * tk + j) * d + c]
                                })
                                .sum();
                            let s = dot * scale;
                            let s = cap.map_or(s, |c| c * (s / c).tanh());
                            s + bias[(b * tq + i) * tk + j]
                        })
                        .collect();
                    let max = scores.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
                    scores.iter_mut().for_each(|s| *s = (*s - max).exp());
                    let sum: f64 = scores.iter().sum();
                    for c in 0..dv {
                        out[((b * hq + h) * tq + i) * dv + c] = (0..tk)
                            .map(|j| scores[j] / sum * v[((b * hkv + g) * tk + j) * dv + c])
                            .sum();
                    }
                }
            }
        }
        Ok(out)
    }

    fn causal_bias(batch: usize, q_len: usize, k_len: usize) -> Result<Tensor> {
        let past = k_len - q_len;
        let data: Vec<f64> = (0..batch * q_len * k_len)
            .map(|idx| {
                let (i, j) = ((idx / k_len) % q_len, idx % k_len);
                if j <= past + i {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        Tensor::from_vec(data, (batch, 1, q_len, k_len), &Device::Cpu)
    }

    #[test]
    fn grouped_heads_match_repeated_kv_reference() -> Result<()> {
        let dev = Device::Cpu;
        for (hq, hkv) in [(4, 4), (4, 2), (6, 1)] {
            let q = crate::gradcheck::seeded_randn(0f64, 1.0, (2, hq, 3, 4), &dev)?;
            let k = crate::gradcheck::seeded_randn(0f64, 1.0, (2, hkv, 5, 4), &dev)?;
            let v = crate::gradcheck::seeded_randn(0f64, 1.0, (2, hkv, 5, 4), &dev)?;
            let bias = causal_bias(2, 3, 5)?;
            let out = attention(&q, &k, &v, &bias)?
                .flatten_all()?
                .to_vec1::<f64>()?;
            let expected = reference(&q, &k, &v, &bias)?;
            let max_diff = out
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(max_diff < 1e-12, "hq={hq} hkv={hkv}: max diff {max_diff}");
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences_with_masking_and_gqa() -> Result<()> {
        let dev = Device::Cpu;
        let q = Var::from_tensor(&crate::gradcheck::seeded_randn(
            0f64,
            1.0,
            (1, 4, 3, 4),
            &dev,
        )?)?;
        let k = Var::from_tensor(&crate::gradcheck::seeded_randn(
            0f64,
            1.0,
            (1, 2, 3, 4),
            &dev,
        )?)?;
        let v = Var::from_tensor(&crate::gradcheck::seeded_randn(
            0f64,
            1.0,
            (1, 2, 3, 4),
            &dev,
        )?)?;
        let bias = causal_bias(1, 3, 3)?;
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (1, 4, 3, 4), &dev)?;
        let loss = |vs: &[Var]| {
            attention(
                vs[0].as_tensor(),
                vs[1].as_tensor(),
                vs[2].as_tensor(),
                &bias,
            )?
            .mul(&probe)?
            .sum_all()
        };
        let coords: Vec<(usize, usize)> = (0..3)
            .flat_map(|var| (0..24).step_by(5).map(move |i| (var, i)))
            .collect();
        for p in check_gradients(&[q, k, v], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        Ok(())
    }

    #[test]
    fn scaled_and_soft_capped_attention_match_the_reference() -> Result<()> {
        let dev = Device::Cpu;
        let q = crate::gradcheck::seeded_randn(0f64, 3.0, (2, 4, 3, 4), &dev)?;
        let k = crate::gradcheck::seeded_randn(0f64, 3.0, (2, 2, 5, 4), &dev)?;
        let v = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 2, 5, 4), &dev)?;
        let bias = causal_bias(2, 3, 5)?;
        for (scale, cap) in [(0.5, None), (0.3, Some(2.0)), (0.5, Some(50.0))] {
            let out = attention_with(&q, &k, &v, &bias, scale, cap)?
                .flatten_all()?
                .to_vec1::<f64>()?;
            let expected = reference_with(&q, &k, &v, &bias, scale, cap)?;
            let max_diff = out
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(max_diff < 1e-12, "scale {scale} cap {cap:?}: {max_diff}");
        }
        // The cap changes the result where scores are large (the test would pass vacuously if
        // the cap were ignored otherwise).
        let capped = attention_with(&q, &k, &v, &bias, 0.5, Some(1.0))?;
        let plain = attention_with(&q, &k, &v, &bias, 0.5, None)?;
        let diff = (capped - plain)?.abs()?.max_all()?.to_scalar::<f64>()?;
        assert!(diff > 1e-2, "the soft-cap had no effect: {diff}");
        Ok(())
    }

    #[test]
    fn soft_capped_attention_gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let var = |shape: (usize, usize, usize, usize), seed_scale: f64| -> Result<Var> {
            Var::from_tensor(&crate::gradcheck::seeded_randn(
                0f64, seed_scale, shape, &dev,
            )?)
        };
        let (q, k, v) = (
            var((1, 4, 3, 4), 2.0)?,
            var((1, 2, 3, 4), 2.0)?,
            var((1, 2, 3, 4), 1.0)?,
        );
        let bias = causal_bias(1, 3, 3)?;
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (1, 4, 3, 4), &dev)?;
        let loss = |vs: &[Var]| {
            attention_with(
                vs[0].as_tensor(),
                vs[1].as_tensor(),
                vs[2].as_tensor(),
                &bias,
                0.4,
                Some(1.5),
            )?
            .mul(&probe)?
            .sum_all()
        };
        let coords: Vec<(usize, usize)> = (0..3)
            .flat_map(|var| (0..24).step_by(5).map(move |i| (var, i)))
            .collect();
        for p in check_gradients(&[q, k, v], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        Ok(())
    }

    /// MLA: values wider or narrower than the query/key width (v_head_dim), and the absorbed
    /// decode path's single latent key/value head shared by every query head.
    #[test]
    fn values_of_their_own_width_match_the_reference() -> Result<()> {
        let dev = Device::Cpu;
        for (hq, hkv, dv, cap) in [(4, 4, 6, None), (4, 1, 3, None), (4, 2, 5, Some(2.0))] {
            let q = crate::gradcheck::seeded_randn(0f64, 1.5, (2, hq, 3, 4), &dev)?;
            let k = crate::gradcheck::seeded_randn(0f64, 1.5, (2, hkv, 5, 4), &dev)?;
            let v = crate::gradcheck::seeded_randn(0f64, 1.0, (2, hkv, 5, dv), &dev)?;
            let bias = causal_bias(2, 3, 5)?;
            let out = attention_with(&q, &k, &v, &bias, 0.35, cap)?;
            assert_eq!(out.dims(), &[2, hq, 3, dv]);
            let expected = reference_with(&q, &k, &v, &bias, 0.35, cap)?;
            let max_diff = out
                .flatten_all()?
                .to_vec1::<f64>()?
                .iter()
                .zip(&expected)
                .map(|(a, b)| (a - b).abs())
                .fold(0.0, f64::max);
            assert!(max_diff < 1e-12, "hq={hq} hkv={hkv} dv={dv}: {max_diff}");
        }
        Ok(())
    }
}
