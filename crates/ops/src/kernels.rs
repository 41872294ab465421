//! Fused CPU kernels with hand-written backward (candle `CustomOp1` with `bwd`): softmax over
//! the last dimension and per-row target log-probabilities.
//!
//! Why: the compositions in softmax.rs / loss.rs build five or six full-size temporaries in
//! the forward pass and about twice that in backward; for attention probabilities and
//! [tokens, vocab] logits these dominate a training step. Each kernel here makes one pass per
//! row (rayon over rows) forward, and its backward is the closed form:
//! softmax: `dx = y * (dy - sum(dy * y))`; log p(target): `dlogits = g * (onehot - softmax)`.
//! What it is not: a GPU kernel (CPU f32/f64 only; other devices/dtypes return an error) or
//! a second-order derivative (the backward output is detached, as everywhere in candle).
//! Tests pin both kernels to the compositions and to finite differences.

use candle_core::{CpuStorage, CustomOp1, D, DType, Layout, Result, Shape, Tensor, WithDType};
use num_traits::Float;
use rayon::prelude::*;

/// Softmax over the last dimension with a fused forward and closed-form backward.
pub fn softmax_last_dim(x: &Tensor) -> Result<Tensor> {
    x.contiguous()?.apply_op1(SoftmaxLastDim)
}

/// `log softmax(logits)[n, targets[n]]` for logits [N, V]; targets [N] (any integer dtype).
pub fn target_logprobs(logits: &Tensor, targets: &Tensor) -> Result<Tensor> {
    let (rows, vocab) = logits.dims2()?;
    let targets: Vec<u32> = targets.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
    if targets.len() != rows {
        candle_core::bail!("target_logprobs: {} targets for {rows} rows", targets.len())
    }
    if let Some(bad) = targets.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("target_logprobs: target {bad} out of range for vocabulary {vocab}")
    }
    logits.contiguous()?.apply_op1(TargetLogprobs { targets })
}

struct SoftmaxLastDim;

fn contiguous_slice<'a, T: WithDType>(data: &'a [T], layout: &Layout, op: &str) -> Result<&'a [T]> {
    match layout.contiguous_offsets() {
        Some((start, end)) => Ok(&data[start..end]),
        None => candle_core::bail!("{op}: input must be contiguous"),
    }
}

fn softmax_rows<T: WithDType + Float + Send + Sync>(x: &[T], width: usize) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .for_each(|(y, row)| {
            let max = row.iter().fold(T::neg_infinity(), |m, &v| Float::max(m, v));
            let mut sum = T::zero();
            for (o, &v) in y.iter_mut().zip(row) {
                *o = (v - max).exp();
                sum = sum + *o;
            }
            let inv = T::one() / sum;
            y.iter_mut().for_each(|o| *o = *o * inv);
        });
    out
}

impl CustomOp1 for SoftmaxLastDim {
    fn name(&self) -> &'static str {
        "stoke-softmax-last-dim"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = layout.shape().dims().last().copied().unwrap_or(1).max(1);
        let out = match storage {
            CpuStorage::F32(data) => CpuStorage::F32(softmax_rows(
                contiguous_slice(data, layout, self.name())?,
                width,
            )),
            CpuStorage::F64(data) => CpuStorage::F64(softmax_rows(
                contiguous_slice(data, layout, self.name())?,
                width,
            )),
            _ => candle_core::bail!("{}: only f32 and f64 are supported", self.name()),
        };
        Ok((out, layout.shape().clone()))
    }

    fn bwd(&self, _arg: &Tensor, res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let weighted_sum = (grad_res * res)?.sum_keepdim(D::Minus1)?;
        Ok(Some(res.mul(&grad_res.broadcast_sub(&weighted_sum)?)?))
    }
}

struct TargetLogprobs {
    targets: Vec<u32>,
}

/// Per row: max, log-sum-exp and the target's log-probability.
fn row_logsumexp<T: Float>(row: &[T]) -> T {
    let max = row.iter().fold(T::neg_infinity(), |m, &v| Float::max(m, v));
    let sum = row.iter().fold(T::zero(), |s, &v| s + (v - max).exp());
    max + sum.ln()
}

fn target_logprobs_rows<T: WithDType + Float + Send + Sync>(
    x: &[T],
    width: usize,
    targets: &[u32],
) -> Vec<T> {
    x.par_chunks(width)
        .zip(targets.par_iter())
        .map(|(row, &t)| row[t as usize] - row_logsumexp(row))
        .collect()
}

/// d logp[n] / d logits[n, v] = onehot(v == t_n) - softmax(logits[n])[v], times grad[n].
fn target_logprobs_grad<T: WithDType + Float + Send + Sync>(
    x: &[T],
    width: usize,
    targets: &[u32],
    grad: &[T],
) -> Vec<T> {
    let mut out = vec![T::zero(); x.len()];
    out.par_chunks_mut(width)
        .zip(x.par_chunks(width))
        .zip(targets.par_iter().zip(grad.par_iter()))
        .for_each(|((dx, row), (&t, &g))| {
            let lse = row_logsumexp(row);
            for (d, &v) in dx.iter_mut().zip(row) {
                *d = -g * (v - lse).exp();
            }
            dx[t as usize] = dx[t as usize] + g;
        });
    out
}

impl CustomOp1 for TargetLogprobs {
    fn name(&self) -> &'static str {
        "stoke-target-logprobs"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let width = layout.shape().dims().last().copied().unwrap_or(1).max(1);
        let out = match storage {
            CpuStorage::F32(data) => CpuStorage::F32(target_logprobs_rows(
                contiguous_slice(data, layout, self.name())?,
                width,
                &self.targets,
            )),
            CpuStorage::F64(data) => CpuStorage::F64(target_logprobs_rows(
                contiguous_slice(data, layout, self.name())?,
                width,
                &self.targets,
            )),
            _ => candle_core::bail!("{}: only f32 and f64 are supported", self.name()),
        };
        Ok((out, Shape::from(self.targets.len())))
    }

    fn bwd(&self, arg: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        let (_, width) = arg.dims2()?;
        let grad = match arg.dtype() {
            DType::F32 => {
                let x: Vec<f32> = arg.flatten_all()?.to_vec1()?;
                let g: Vec<f32> = grad_res.flatten_all()?.to_vec1()?;
                Tensor::from_vec(
                    target_logprobs_grad(&x, width, &self.targets, &g),
                    arg.shape(),
                    arg.device(),
                )?
            }
            DType::F64 => {
                let x: Vec<f64> = arg.flatten_all()?.to_vec1()?;
                let g: Vec<f64> = grad_res.flatten_all()?.to_vec1()?;
                Tensor::from_vec(
                    target_logprobs_grad(&x, width, &self.targets, &g),
                    arg.shape(),
                    arg.device(),
                )?
            }
            other => candle_core::bail!("{}: unsupported dtype {other:?}", self.name()),
        };
        Ok(Some(grad))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{Device, Var};

    fn max_diff(a: &Tensor, b: &Tensor) -> Result<f64> {
        (a - b)?.abs()?.flatten_all()?.max(0)?.to_scalar::<f64>()
    }

    #[test]
    fn fused_softmax_matches_composition_including_masked_entries() -> Result<()> {
        let x = Tensor::randn(0f64, 3.0, (2, 3, 7), &Device::Cpu)?;
        let mask = Tensor::from_vec(
            (0..42)
                .map(|i| if i % 5 == 4 { f64::NEG_INFINITY } else { 0.0 })
                .collect::<Vec<_>>(),
            (2, 3, 7),
            &Device::Cpu,
        )?;
        let x = (x + mask)?;
        assert!(max_diff(&softmax_last_dim(&x)?, &crate::softmax(&x, D::Minus1)?)? < 1e-14);
        let x32 = x.to_dtype(DType::F32)?;
        let diff = max_diff(
            &softmax_last_dim(&x32)?.to_dtype(DType::F64)?,
            &crate::softmax(&x32, D::Minus1)?.to_dtype(DType::F64)?,
        )?;
        assert!(diff < 1e-6, "f32 diff {diff}");
        Ok(())
    }

    #[test]
    fn fused_softmax_gradients_match_finite_differences() -> Result<()> {
        let x = Var::from_tensor(&Tensor::randn(0f64, 2.0, (3, 6), &Device::Cpu)?)?;
        let probe = Tensor::randn(0f64, 1.0, (3, 6), &Device::Cpu)?;
        let loss = |v: &[Var]| softmax_last_dim(v[0].as_tensor())?.mul(&probe)?.sum_all();
        let coords: Vec<(usize, usize)> = (0..18).step_by(2).map(|i| (0, i)).collect();
        for p in check_gradients(&[x], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        Ok(())
    }

    #[test]
    fn target_logprobs_match_composition_and_finite_differences() -> Result<()> {
        let logits = Var::from_tensor(&Tensor::randn(0f64, 2.0, (4, 9), &Device::Cpu)?)?;
        let targets = Tensor::new(&[3u32, 0, 8, 2], &Device::Cpu)?;
        let fused = target_logprobs(logits.as_tensor(), &targets)?;
        let composed = crate::log_softmax(logits.as_tensor(), D::Minus1)?
            .gather(&targets.unsqueeze(1)?, 1)?
            .squeeze(1)?;
        assert!(max_diff(&fused, &composed)? < 1e-14);
        let probe = Tensor::new(&[0.5f64, -1.0, 2.0, 0.25], &Device::Cpu)?;
        let loss = |v: &[Var]| {
            target_logprobs(v[0].as_tensor(), &targets)?
                .mul(&probe)?
                .sum_all()
        };
        let coords: Vec<(usize, usize)> = (0..36).step_by(4).map(|i| (0, i)).collect();
        for p in check_gradients(&[logits], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        assert!(
            target_logprobs(
                &Tensor::zeros((1, 3), DType::F32, &Device::Cpu)?,
                &Tensor::new(&[3u32], &Device::Cpu)?
            )
            .is_err()
        );
        Ok(())
    }
}
