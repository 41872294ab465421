//! The attention-probability kernel: `softmax(scores * scale + bias)` over the last dimension,
//! fused into one candle `CustomOp2` with a fused closed-form backward
//! `dscores = scale * y * (dy - sum(dy * y))`.
//!
//! Why: as a composition (`affine`, `reshape`, `broadcast_add`, softmax) the [B, H, Tq, Tk]
//! scores pass through four graph nodes, and candle's backward allocates a zero gradient and
//! adds into it for every node, so each became several full-size passes over the largest
//! activation of a layer. Here it is one node, one pass forward and one pass backward.
//!
//! What it is not: differentiable with respect to the bias (the additive mask is a constant;
//! its gradient is `None`), or a GPU kernel (CPU f32/f64 only; `attention` falls back to the
//! composition elsewhere). Invariants: `scores` is [B, H, Tq, Tk], or the same memory in the
//! grouped-query layout [B, G, R * Tq, Tk] with H = G * R (query head h = g * R + r; what
//! `attention` multiplies, so it needs no reshape nodes around this one, each of which costs a
//! zero-fill and an add of the largest activation in candle's backward); the bias is
//! [Bb, Hb, Tq, Tk] with Bb in {1, B} and Hb in {1, H} (broadcast over size-1 dimensions; Tq
//! comes from the bias); a row whose bias is all `-inf` yields NaN, as the composition does.

use crate::kernels::{Real, contiguous_slice};
use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use rayon::prelude::*;

/// `softmax(scores * scale + bias, -1)` with the broadcasting described in the module doc.
pub fn scaled_masked_softmax(scores: &Tensor, bias: &Tensor, scale: f64) -> Result<Tensor> {
    let (batch, groups, group_rows, k_len) = scores.dims4()?;
    let (bias_batch, bias_heads, bias_q, bias_k) = bias.dims4()?;
    // Logical heads: H = G * R where R = group_rows / Tq (R = 1 in the plain layout).
    let heads = if bias_q > 0 && group_rows % bias_q == 0 {
        groups * (group_rows / bias_q)
    } else {
        0
    };
    let ok = heads > 0
        && (bias_batch == 1 || bias_batch == batch)
        && (bias_heads == 1 || bias_heads == heads)
        && bias_k == k_len;
    if !ok {
        candle_core::bail!(
            "scaled_masked_softmax: bias {:?} does not broadcast to scores {:?}",
            bias.dims(),
            scores.dims()
        )
    }
    let bias = bias.to_dtype(scores.dtype())?.contiguous()?;
    scores.contiguous()?.apply_op2(
        &bias,
        ScaledMaskedSoftmax {
            scale,
            logical_dims: [batch, heads, bias_q, k_len],
        },
    )
}

/// True when `scaled_masked_softmax` can run: CPU tensors of f32 or f64.
pub fn supports(scores: &Tensor) -> bool {
    scores.device().is_cpu() && matches!(scores.dtype(), DType::F32 | DType::F64)
}

struct ScaledMaskedSoftmax {
    scale: f64,
    /// [B, H, Tq, Tk] of the scores, whatever their layout's dims (see the module doc).
    logical_dims: [usize; 4],
}

/// Index of the bias row used by score row `row` (rows enumerate [B, H, Tq]).
fn bias_row(row: usize, dims: &[usize], bias_dims: &[usize]) -> usize {
    let (heads, q_len) = (dims[1], dims[2]);
    let i = row % q_len;
    let h = (row / q_len) % heads;
    let b = row / (q_len * heads);
    let b = if bias_dims[0] == 1 { 0 } else { b };
    let h = if bias_dims[1] == 1 { 0 } else { h };
    (b * bias_dims[1] + h) * q_len + i
}

fn forward_rows<T: Real>(
    x: &[T],
    bias: &[T],
    dims: &[usize],
    bias_dims: &[usize],
    scale: f64,
) -> Vec<T> {
    let width = dims[3].max(1);
    let scale = T::from(scale).unwrap_or_else(T::one);
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .enumerate()
        .for_each(|(row, (y, xs))| {
            let start = bias_row(row, dims, bias_dims) * width;
            let bs = &bias[start..start + width];
            crate::vexp::dispatch(
                #[inline(always)]
                || {
                    for ((o, &v), &b) in y.iter_mut().zip(xs).zip(bs) {
                        *o = v * scale + b;
                    }
                    let max = crate::kernels::lane_max(y);
                    let inv = T::one() / crate::kernels::exp_shifted_sum(y, max);
                    y.iter_mut().for_each(|o| *o *= inv);
                },
            )
        });
    out
}

impl CustomOp2 for ScaledMaskedSoftmax {
    fn name(&self) -> &'static str {
        "stoke-scaled-masked-softmax"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (dims, bias_dims) = (&self.logical_dims[..], l2.shape().dims());
        if l1.shape().elem_count() != dims.iter().product::<usize>() || bias_dims.len() != 4 {
            candle_core::bail!(
                "{}: scores must hold {dims:?} and the bias be 4-D",
                self.name()
            )
        }
        let out = match (s1, s2) {
            (CpuStorage::F32(x), CpuStorage::F32(b)) => CpuStorage::F32(forward_rows(
                contiguous_slice(x, l1, self.name())?,
                contiguous_slice(b, l2, self.name())?,
                dims,
                bias_dims,
                self.scale,
            )),
            (CpuStorage::F64(x), CpuStorage::F64(b)) => CpuStorage::F64(forward_rows(
                contiguous_slice(x, l1, self.name())?,
                contiguous_slice(b, l2, self.name())?,
                dims,
                bias_dims,
                self.scale,
            )),
            _ => candle_core::bail!("{}: only f32 and f64 (same dtype)", self.name()),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        _scores: &Tensor,
        _bias: &Tensor,
        res: &Tensor,
        grad: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = grad.contiguous()?;
        let dscores = res.apply_op2_no_bwd(&grad, &SoftmaxBackward { scale: self.scale })?;
        Ok((Some(dscores), None))
    }
}

/// `scale * y * (dy - sum(dy * y))` per row, from the softmax output `y` and its gradient.
pub(crate) struct SoftmaxBackward {
    pub(crate) scale: f64,
}

fn backward_rows<T: Real>(y: &[T], dy: &[T], width: usize, scale: f64) -> Vec<T> {
    let scale = T::from(scale).unwrap_or_else(T::one);
    let mut out = vec![T::zero(); y.len()];
    out.par_chunks_mut(width)
        .zip(y.par_chunks(width).zip(dy.par_chunks(width)))
        .for_each(|(dx, (ys, dys))| {
            let dot = ys
                .iter()
                .zip(dys)
                .fold(T::zero(), |acc, (&a, &b)| acc + a * b);
            for ((d, &a), &b) in dx.iter_mut().zip(ys).zip(dys) {
                *d = scale * a * (b - dot);
            }
        });
    out
}

impl CustomOp2 for SoftmaxBackward {
    fn name(&self) -> &'static str {
        "stoke-scaled-masked-softmax-backward"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        if l1.shape() != l2.shape() {
            candle_core::bail!("{}: output and gradient shapes differ", self.name())
        }
        let width = l1.shape().dims().last().copied().unwrap_or(1).max(1);
        let out = match (s1, s2) {
            (CpuStorage::F32(y), CpuStorage::F32(g)) => CpuStorage::F32(backward_rows(
                contiguous_slice(y, l1, self.name())?,
                contiguous_slice(g, l2, self.name())?,
                width,
                self.scale,
            )),
            (CpuStorage::F64(y), CpuStorage::F64(g)) => CpuStorage::F64(backward_rows(
                contiguous_slice(y, l1, self.name())?,
                contiguous_slice(g, l2, self.name())?,
                width,
                self.scale,
            )),
            _ => candle_core::bail!("{}: only f32 and f64 (same dtype)", self.name()),
        };
        Ok((out, l1.shape().clone()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{D, Device, Var};

    /// The composition the kernel replaces.
    fn composed(scores: &Tensor, bias: &Tensor, scale: f64) -> Result<Tensor> {
        crate::softmax(&scores.affine(scale, 0.0)?.broadcast_add(bias)?, D::Minus1)
    }

    fn causal(batch: usize, heads: usize, q: usize, k: usize) -> Result<Tensor> {
        let data: Vec<f64> = (0..batch * heads * q * k)
            .map(|idx| {
                let (i, j) = ((idx / k) % q, idx % k);
                let (b, past) = (idx / (heads * q * k), k - q);
                // Odd batch rows also mask key 0, so batch-broadcasting mistakes show up
                // (every row keeps at least key past + i >= 1).
                if j <= past + i && !(b % 2 == 1 && j == 0) {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        Tensor::from_vec(data, (batch, heads, q, k), &Device::Cpu)
    }

    #[test]
    fn matches_the_composition_with_batch_and_head_broadcasting() -> Result<()> {
        let dev = Device::Cpu;
        let scores = crate::gradcheck::seeded_randn(0f64, 2.0, (3, 4, 5, 7), &dev)?;
        for bias in [
            causal(3, 1, 5, 7)?,
            causal(1, 1, 5, 7)?,
            causal(3, 4, 5, 7)?,
        ] {
            let fused = scaled_masked_softmax(&scores, &bias, 0.37)?;
            let reference = composed(&scores, &bias, 0.37)?;
            let diff = (fused - reference)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f64>()?;
            assert!(diff < 1e-14, "bias {:?}: diff {diff}", bias.dims());
        }
        Ok(())
    }

    #[test]
    fn gradients_match_the_composition_and_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let scores = Var::from_tensor(&crate::gradcheck::seeded_randn(
            0f64,
            2.0,
            (2, 2, 3, 5),
            &dev,
        )?)?;
        let bias = causal(2, 1, 3, 5)?;
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 2, 3, 5), &dev)?;
        let fused_grad = scaled_masked_softmax(scores.as_tensor(), &bias, 0.5)?
            .mul(&probe)?
            .sum_all()?
            .backward()?;
        let composed_grad = composed(scores.as_tensor(), &bias, 0.5)?
            .mul(&probe)?
            .sum_all()?
            .backward()?;
        let (a, b) = (
            fused_grad.get(scores.as_tensor()).expect("fused gradient"),
            composed_grad
                .get(scores.as_tensor())
                .expect("composed gradient"),
        );
        let diff = (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
        assert!(diff < 1e-14, "gradient diff {diff}");
        let loss = |v: &[Var]| {
            scaled_masked_softmax(v[0].as_tensor(), &bias, 0.5)?
                .mul(&probe)?
                .sum_all()
        };
        let coords: Vec<(usize, usize)> = (0..60).step_by(4).map(|i| (0, i)).collect();
        for p in check_gradients(&[scores], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        Ok(())
    }

    #[test]
    fn grouped_layout_matches_the_plain_layout() -> Result<()> {
        let dev = Device::Cpu;
        // [B, H, Tq, Tk] = [2, 4, 3, 5] viewed as [B, G, R * Tq, Tk] = [2, 2, 6, 5].
        let scores = Var::from_tensor(&crate::gradcheck::seeded_randn(
            0f64,
            2.0,
            (2, 4, 3, 5),
            &dev,
        )?)?;
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 4, 3, 5), &dev)?;
        for bias in [causal(2, 1, 3, 5)?, causal(1, 4, 3, 5)?] {
            let plain = scaled_masked_softmax(scores.as_tensor(), &bias, 0.7)?;
            let grouped =
                scaled_masked_softmax(&scores.as_tensor().reshape((2, 2, 6, 5))?, &bias, 0.7)?;
            assert_eq!(grouped.dims(), &[2, 2, 6, 5]);
            let grouped = grouped.reshape((2, 4, 3, 5))?;
            let diff = (&plain - &grouped)?
                .abs()?
                .flatten_all()?
                .max(0)?
                .to_scalar::<f64>()?;
            assert_eq!(diff, 0.0, "bias {:?}", bias.dims());
            let g_plain = plain.mul(&probe)?.sum_all()?.backward()?;
            let g_grouped = grouped.mul(&probe)?.sum_all()?.backward()?;
            let (a, b) = (
                g_plain.get(scores.as_tensor()).expect("plain gradient"),
                g_grouped.get(scores.as_tensor()).expect("grouped gradient"),
            );
            let diff = (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()?;
            assert_eq!(diff, 0.0, "gradient, bias {:?}", bias.dims());
        }
        // Rows that are not a multiple of the bias's query length are rejected.
        let bias = causal(2, 1, 4, 5)?;
        assert!(
            scaled_masked_softmax(&scores.as_tensor().reshape((2, 2, 6, 5))?, &bias, 1.0).is_err()
        );
        Ok(())
    }

    #[test]
    fn rejects_a_bias_that_does_not_broadcast() -> Result<()> {
        let scores = Tensor::zeros((2, 2, 3, 5), DType::F32, &Device::Cpu)?;
        let bias = Tensor::zeros((2, 1, 3, 4), DType::F32, &Device::Cpu)?;
        assert!(scaled_masked_softmax(&scores, &bias, 1.0).is_err());
        Ok(())
    }
}
