//! Attention as one graph node: `softmax(q k^T * scale + bias) v` for grouped-query heads,
//! with a hand-written backward.
//!
//! Why: as a composition (`matmul`, the fused masked softmax, `matmul`) the [B, H, Tq, Tk]
//! scores and probabilities are graph nodes of their own, and candle's backward accumulates
//! every node's gradient into a fresh zero tensor (`zeros_like` + `add`): per layer two
//! zero-fills and two adds of the largest activation of the layer. Here the probabilities
//! stay inside the op (kept from forward to backward) and the backward is the closed form:
//! `dV = P^T dO`, `dP = dO V^T`, `dS = scale * P * (dP - rowsum(dP * P))`, `dQ = dS K`,
//! `dK = dS^T Q` (all per key/value group, in the grouped layout described in attention.rs).
//!
//! What it is not: memory-saving like FlashAttention (P is materialised once, as the
//! composition holds it too), a GPU kernel (CPU f32/f64 only; `attention` takes the composition
//! elsewhere), or differentiable twice, or differentiable in the bias (a constant mask). If the
//! backward runs a second time, P is recomputed, so results never depend on call order.
//! Invariants: q [B, Hq, Tq, D], k and v [B, Hkv, Tk, D] with Hq % Hkv == 0, bias
//! [Bb, Hb, Tq, Tk] broadcastable as in masked_softmax.rs.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp3, Device, Layout, Result, Shape, Tensor};

use crate::kernels::{Real, contiguous_slice};
use crate::masked_softmax::{SoftmaxBackward, scaled_masked_softmax};

/// Fused attention; same contract and values as `attention::attention_composed`.
pub fn fused_attention(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (_, q_heads, _, head_dim) = q.dims4()?;
    let (_, kv_heads, _, _) = k.dims4()?;
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        candle_core::bail!(
            "attention: {q_heads} query heads not a multiple of {kv_heads} key/value heads"
        )
    }
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let op = FusedAttention {
        scale: 1.0 / (head_dim as f64).sqrt(),
        bias: bias.to_dtype(q.dtype())?.contiguous()?.detach(),
        saved_probs: Mutex::new(None),
        output: Mutex::new(None),
    };
    // The work runs here, on graph-free views of the inputs (`detach` shares their storage: no
    // copy of q, k or the key/value cache); the graph node below only takes the result.
    let probs = op.probs(&q.detach(), &k.detach())?;
    let output = probs.matmul(&v.detach())?;
    *op.lock(&op.saved_probs)? = Some(probs);
    *op.lock(&op.output)? = Some(output);
    q.apply_op3(&k, &v, op)
}

/// True when `fused_attention` can run: CPU tensors of one float dtype (f32/f64), 4-D bias.
pub fn supports(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> bool {
    let dtype = q.dtype();
    [q, k, v]
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == dtype)
        && bias.rank() == 4
        && crate::masked_softmax::supports(q)
}

struct FusedAttention {
    scale: f64,
    /// The additive mask, in the inputs' dtype, outside the graph.
    bias: Tensor,
    /// Softmax probabilities [B, Hkv, R * Tq, Tk] from the forward, taken by the backward.
    saved_probs: Mutex<Option<Tensor>>,
    /// The output computed by `fused_attention`, taken by `cpu_fwd`.
    output: Mutex<Option<Tensor>>,
}

/// [B, Hq, Tq, D] viewed as [B, Hkv, R * Tq, D] (same memory: head h = g * R + r).
fn grouped(q: &Tensor, kv_heads: usize) -> Result<Tensor> {
    let (batch, q_heads, q_len, head_dim) = q.dims4()?;
    q.reshape((batch, kv_heads, (q_heads / kv_heads) * q_len, head_dim))
}

impl FusedAttention {
    fn lock<'a>(
        &self,
        slot: &'a Mutex<Option<Tensor>>,
    ) -> Result<std::sync::MutexGuard<'a, Option<Tensor>>> {
        slot.lock()
            .map_err(|_| candle_core::Error::Msg("fused_attention: poisoned lock".into()))
    }

    /// P = softmax(Q K^T * scale + bias) in the grouped layout; Q, K graph-free.
    fn probs(&self, q: &Tensor, k: &Tensor) -> Result<Tensor> {
        let scores = grouped(q, k.dim(1)?)?.matmul(&k.t()?)?;
        scaled_masked_softmax(&scores, &self.bias, self.scale)
    }

    /// The precomputed output as storage of the inputs' dtype (computed again if it was taken).
    fn output<T: Real>(&self, inputs: [(&[T], &Layout); 3]) -> Result<CpuStorage> {
        let out = match self.lock(&self.output)?.take() {
            Some(out) => out,
            None => {
                let name = "stoke-fused-attention";
                let [q, k, v] = inputs.map(|(data, layout)| {
                    contiguous_slice(data, layout, name)
                        .and_then(|d| Tensor::from_slice(d, layout.shape(), &Device::Cpu))
                });
                let (q, k, v) = (q?, k?, v?);
                self.probs(&q, &k)?.matmul(&v)?
            }
        };
        Ok(T::to_cpu_storage_owned(out.flatten_all()?.to_vec1::<T>()?))
    }
}

impl CustomOp3 for FusedAttention {
    fn name(&self) -> &'static str {
        "stoke-fused-attention"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
        s3: &CpuStorage,
        l3: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(q), CpuStorage::F32(k), CpuStorage::F32(v)) => {
                self.output([(q, l1), (k, l2), (v, l3)])?
            }
            (CpuStorage::F64(q), CpuStorage::F64(k), CpuStorage::F64(v)) => {
                self.output([(q, l1), (k, l2), (v, l3)])?
            }
            _ => candle_core::bail!("{}: only f32 and f64 (same dtype)", self.name()),
        };
        Ok((out, l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let (q, k, v) = (q.detach(), k.detach(), v.detach());
        let kv_heads = k.dim(1)?;
        let saved = self.lock(&self.saved_probs)?.take();
        let probs = match saved {
            Some(probs) => probs,
            None => self.probs(&q, &k)?,
        };
        let grad_out = grouped(&grad_res.detach().contiguous()?, kv_heads)?;
        let grad_v = probs.t()?.matmul(&grad_out)?;
        let grad_probs = grad_out.matmul(&v.t()?)?;
        let grad_scores = probs.apply_op2_no_bwd(
            &grad_probs.contiguous()?,
            &SoftmaxBackward { scale: self.scale },
        )?;
        drop(probs);
        let grad_q = grad_scores.matmul(&k)?.reshape(q.shape())?;
        let grad_k = grad_scores.t()?.matmul(&grouped(&q, kv_heads)?)?;
        Ok((Some(grad_q), Some(grad_k), Some(grad_v)))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::attention_composed;
    use crate::gradcheck::check_gradients;
    use candle_core::Var;

    fn causal_bias(batch: usize, q_len: usize, k_len: usize) -> Result<Tensor> {
        let past = k_len - q_len;
        let data: Vec<f64> = (0..batch * q_len * k_len)
            .map(|idx| {
                let (b, i, j) = (idx / (q_len * k_len), (idx / k_len) % q_len, idx % k_len);
                // Row 1 also masks key 0, so batch-broadcasting mistakes show up.
                if j <= past + i && !(b == 1 && j == 0 && past + i > 0) {
                    0.0
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        Tensor::from_vec(data, (batch, 1, q_len, k_len), &Device::Cpu)
    }

    type Grads = Vec<Vec<f64>>;

    fn run(
        f: &dyn Fn(&Tensor, &Tensor, &Tensor, &Tensor) -> Result<Tensor>,
        vars: &[Var; 3],
        bias: &Tensor,
        probe: &Tensor,
    ) -> Result<(Vec<f64>, Grads)> {
        let out = f(
            vars[0].as_tensor(),
            vars[1].as_tensor(),
            vars[2].as_tensor(),
            bias,
        )?;
        let grads = out.mul(probe)?.sum_all()?.backward()?;
        let mut all = Vec::new();
        for var in vars {
            let g = grads
                .get(var.as_tensor())
                .ok_or_else(|| candle_core::Error::Msg("missing gradient".into()))?;
            all.push(g.flatten_all()?.to_vec1::<f64>()?);
        }
        Ok((out.flatten_all()?.to_vec1()?, all))
    }

    #[test]
    fn values_and_gradients_match_the_composition() -> Result<()> {
        let dev = Device::Cpu;
        for (hq, hkv, tq, tk) in [(4, 2, 5, 5), (4, 4, 3, 6), (6, 1, 1, 4)] {
            let vars = [
                Var::from_tensor(&crate::gradcheck::seeded_randn(
                    0f64,
                    1.0,
                    (2, hq, tq, 8),
                    &dev,
                )?)?,
                Var::from_tensor(&crate::gradcheck::seeded_randn(
                    0f64,
                    1.0,
                    (2, hkv, tk, 8),
                    &dev,
                )?)?,
                Var::from_tensor(&crate::gradcheck::seeded_randn(
                    0f64,
                    1.0,
                    (2, hkv, tk, 8),
                    &dev,
                )?)?,
            ];
            let bias = causal_bias(2, tq, tk)?;
            let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (2, hq, tq, 8), &dev)?;
            let fused = run(&fused_attention, &vars, &bias, &probe)?;
            let reference = run(&attention_composed, &vars, &bias, &probe)?;
            let max_diff = |a: &[f64], b: &[f64]| {
                assert_eq!(a.len(), b.len());
                a.iter()
                    .zip(b)
                    .map(|(x, y)| (x - y).abs())
                    .fold(0.0, f64::max)
            };
            assert!(
                max_diff(&fused.0, &reference.0) < 1e-12,
                "values hq={hq} hkv={hkv}"
            );
            for (i, (a, b)) in fused.1.iter().zip(&reference.1).enumerate() {
                let d = max_diff(a, b);
                assert!(d < 1e-12, "gradient {i} hq={hq} hkv={hkv}: {d}");
            }
        }
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let vars = [
            Var::from_tensor(&crate::gradcheck::seeded_randn(
                0f64,
                1.0,
                (2, 4, 3, 4),
                &dev,
            )?)?,
            Var::from_tensor(&crate::gradcheck::seeded_randn(
                0f64,
                1.0,
                (2, 2, 3, 4),
                &dev,
            )?)?,
            Var::from_tensor(&crate::gradcheck::seeded_randn(
                0f64,
                1.0,
                (2, 2, 3, 4),
                &dev,
            )?)?,
        ];
        let bias = causal_bias(2, 3, 3)?;
        let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (2, 4, 3, 4), &dev)?;
        let loss = |vs: &[Var]| {
            fused_attention(
                vs[0].as_tensor(),
                vs[1].as_tensor(),
                vs[2].as_tensor(),
                &bias,
            )?
            .mul(&probe)?
            .sum_all()
        };
        let coords: Vec<(usize, usize)> = (0..3)
            .flat_map(|var| (0..48).step_by(5).map(move |i| (var, i)))
            .collect();
        for p in check_gradients(&vars, &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-5, "{p:?}");
        }
        Ok(())
    }

    #[test]
    fn a_second_backward_recomputes_the_probabilities() -> Result<()> {
        let dev = Device::Cpu;
        let vars = [
            Var::from_tensor(&crate::gradcheck::seeded_randn(
                0f64,
                1.0,
                (1, 2, 3, 4),
                &dev,
            )?)?,
            Var::from_tensor(&crate::gradcheck::seeded_randn(
                0f64,
                1.0,
                (1, 1, 3, 4),
                &dev,
            )?)?,
            Var::from_tensor(&crate::gradcheck::seeded_randn(
                0f64,
                1.0,
                (1, 1, 3, 4),
                &dev,
            )?)?,
        ];
        let bias = causal_bias(1, 3, 3)?;
        let out = fused_attention(
            vars[0].as_tensor(),
            vars[1].as_tensor(),
            vars[2].as_tensor(),
            &bias,
        )?;
        let loss = out.sqr()?.sum_all()?;
        let (first, second) = (loss.backward()?, loss.backward()?);
        for var in &vars {
            let a = first
                .get(var.as_tensor())
                .map(|g| g.flatten_all()?.to_vec1::<f64>())
                .transpose()?;
            let b = second
                .get(var.as_tensor())
                .map(|g| g.flatten_all()?.to_vec1::<f64>())
                .transpose()?;
            assert!(a.is_some());
            assert_eq!(a, b);
        }
        Ok(())
    }
}
