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
//! The kernels (`attention_rows`) visit only the keys the bias allows each query, so causal,
//! packed-document and shared-prefix masks cost their allowed pairs, not the full square.
//!
//! What it is not: memory-saving like FlashAttention (the allowed probabilities are kept from
//! forward to backward when a gradient is wanted), a GPU kernel (CPU f32/f64 only; `attention`
//! takes the composition elsewhere), or differentiable twice, or differentiable in the bias (a
//! constant mask). If the backward runs a second time, P is recomputed, so results never
//! depend on call order.
//! Invariants: q [B, Hq, Tq, D], k and v [B, Hkv, Tk, D] with Hq % Hkv == 0, bias
//! [Bb, Hb, Tq, Tk] with Bb in {1, B} and Hb in {1, Hq}.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp3, DType, Layout, Result, Shape, Tensor};

use crate::attention_rows::Tiles;
use crate::attention_rows::{self, Dims, KeyRuns, Saved};
use crate::kernels::{Real, contiguous_slice};

/// Fused attention; same contract and values as `attention::attention_composed`.
pub fn fused_attention(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> Result<Tensor> {
    let (batch, q_heads, q_len, head_dim) = q.dims4()?;
    let (k_batch, kv_heads, k_len, k_dim) = k.dims4()?;
    if kv_heads == 0 || q_heads % kv_heads != 0 {
        candle_core::bail!(
            "attention: {q_heads} query heads not a multiple of {kv_heads} key/value heads"
        )
    }
    if k_batch != batch || k_dim != head_dim || v.dims() != k.dims() {
        candle_core::bail!(
            "attention: q {:?}, k {:?} and v {:?} disagree",
            q.dims(),
            k.dims(),
            v.dims()
        )
    }
    let (bias_batch, bias_heads, bias_q, bias_k) = bias.dims4()?;
    if !(bias_batch == 1 || bias_batch == batch)
        || !(bias_heads == 1 || bias_heads == q_heads)
        || bias_q != q_len
        || bias_k != k_len
    {
        candle_core::bail!(
            "attention: bias {:?} does not broadcast to [{batch}, {q_heads}, {q_len}, {k_len}]",
            bias.dims()
        )
    }
    let dims = Dims {
        batch,
        kv_heads,
        group: q_heads / kv_heads,
        q_len,
        k_len,
        head_dim,
        bias_batch,
        bias_heads,
    };
    let (q, k, v) = (q.contiguous()?, k.contiguous()?, v.contiguous()?);
    let bias = bias.to_dtype(q.dtype())?.contiguous()?.detach();
    let keep = q.track_op() || k.track_op() || v.track_op();
    let op = match q.dtype() {
        DType::F32 => FusedAttention::<f32>::new(&q, &k, &v, bias, dims, keep)?.erase(),
        DType::F64 => FusedAttention::<f64>::new(&q, &k, &v, bias, dims, keep)?.erase(),
        other => candle_core::bail!("fused_attention: f32 or f64 only, got {other:?}"),
    };
    q.apply_op3_arc(&k, &v, op)
}

/// True when `fused_attention` can run: CPU tensors of one float dtype (f32/f64), 4-D bias.
pub fn supports(q: &Tensor, k: &Tensor, v: &Tensor, bias: &Tensor) -> bool {
    let dtype = q.dtype();
    [q, k, v]
        .iter()
        .all(|t| t.device().is_cpu() && t.dtype() == dtype)
        && bias.rank() == 4
        && matches!(dtype, DType::F32 | DType::F64)
}

struct FusedAttention<T> {
    scale: f64,
    dims: Dims,
    /// The additive mask, in the inputs' dtype, outside the graph.
    bias: Tensor,
    runs: KeyRuns,
    /// The forward's probabilities (when a backward may follow), taken by the backward.
    saved: Mutex<Option<Saved<T>>>,
    /// The output computed in `new`, taken by `cpu_fwd`.
    output: Mutex<Option<Vec<T>>>,
}

/// The values of a contiguous CPU tensor of `T`.
fn values<T: Real>(t: &Tensor) -> Result<Vec<T>> {
    t.flatten_all()?.to_vec1::<T>()
}

impl<T: Tiles> FusedAttention<T> {
    /// Runs the forward pass now, on graph-free copies of the inputs' values.
    fn new(
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        bias: Tensor,
        dims: Dims,
        keep: bool,
    ) -> Result<Self> {
        let bias_values = values::<T>(&bias)?;
        let runs = KeyRuns::from_bias(&bias_values, dims.k_len);
        let scale = 1.0 / (dims.head_dim as f64).sqrt();
        let (out, saved) = attention_rows::forward(
            &values::<T>(q)?,
            &values::<T>(k)?,
            &values::<T>(v)?,
            &bias_values,
            &runs,
            dims,
            scale,
            keep,
            false,
        );
        Ok(Self {
            scale,
            dims,
            bias,
            runs,
            saved: Mutex::new(saved),
            output: Mutex::new(Some(out)),
        })
    }

    fn erase(self) -> std::sync::Arc<Box<dyn CustomOp3 + Send + Sync>>
    where
        Self: CustomOp3 + Send + Sync + 'static,
    {
        std::sync::Arc::new(Box::new(self))
    }

    fn lock<'a, V>(&self, slot: &'a Mutex<V>) -> Result<std::sync::MutexGuard<'a, V>> {
        slot.lock()
            .map_err(|_| candle_core::Error::Msg("fused_attention: poisoned lock".into()))
    }

    /// The output of `new` (computed again from the inputs if it was taken).
    fn output(&self, inputs: [(&[T], &Layout); 3]) -> Result<Vec<T>> {
        if let Some(out) = self.lock(&self.output)?.take() {
            return Ok(out);
        }
        let name = "stoke-fused-attention";
        let [q, k, v] = inputs.map(|(data, layout)| contiguous_slice(data, layout, name));
        let bias = values::<T>(&self.bias)?;
        let (out, _) = attention_rows::forward(
            q?, k?, v?, &bias, &self.runs, self.dims, self.scale, false, false,
        );
        Ok(out)
    }
}

/// Moves a kernel's output into candle storage of its dtype.
trait IntoStorage: Sized {
    fn into_storage(v: Vec<Self>) -> CpuStorage;
    fn slice(s: &CpuStorage) -> Option<&[Self]>;
}

impl IntoStorage for f32 {
    fn into_storage(v: Vec<f32>) -> CpuStorage {
        CpuStorage::F32(v)
    }
    fn slice(s: &CpuStorage) -> Option<&[f32]> {
        match s {
            CpuStorage::F32(v) => Some(v),
            _ => None,
        }
    }
}

impl IntoStorage for f64 {
    fn into_storage(v: Vec<f64>) -> CpuStorage {
        CpuStorage::F64(v)
    }
    fn slice(s: &CpuStorage) -> Option<&[f64]> {
        match s {
            CpuStorage::F64(v) => Some(v),
            _ => None,
        }
    }
}

impl<T: Tiles + IntoStorage> CustomOp3 for FusedAttention<T> {
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
        let (Some(q), Some(k), Some(v)) = (T::slice(s1), T::slice(s2), T::slice(s3)) else {
            candle_core::bail!("{}: q, k and v must share the op's dtype", self.name())
        };
        let out = self.output([(q, l1), (k, l2), (v, l3)])?;
        Ok((T::into_storage(out), l1.shape().clone()))
    }

    fn bwd(
        &self,
        q: &Tensor,
        k: &Tensor,
        v: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>, Option<Tensor>)> {
        let saved = self.lock(&self.saved)?.take();
        let bias = values::<T>(&self.bias)?;
        let (dq, dk, dv) = attention_rows::backward(
            &values::<T>(&q.contiguous()?)?,
            &values::<T>(&k.contiguous()?)?,
            &values::<T>(&v.contiguous()?)?,
            &bias,
            &self.runs,
            self.dims,
            self.scale,
            saved,
            &values::<T>(&grad_res.contiguous()?)?,
        );
        let device = q.device();
        Ok((
            Some(Tensor::from_vec(dq, q.shape(), device)?),
            Some(Tensor::from_vec(dk, k.shape(), device)?),
            Some(Tensor::from_vec(dv, v.shape(), device)?),
        ))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::attention::attention_composed;
    use crate::gradcheck::check_gradients;
    use candle_core::{Device, Var};

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

    /// A mask with gaps: row i of batch b sees a shared prefix of `prefix` keys, then only the
    /// keys of its own segment up to itself (segments of `seg` positions, as GRPO's shared-prefix
    /// packing and packed documents), with finite non-zero values on some allowed keys; batch 1
    /// masks a whole row (NaN there, as the composition).
    fn segment_bias(batch: usize, heads: usize, q_len: usize, k_len: usize) -> Result<Tensor> {
        let (prefix, seg, past) = (5, 9, k_len - q_len);
        let data: Vec<f64> = (0..batch * heads * q_len * k_len)
            .map(|idx| {
                let j = idx % k_len;
                let i = (idx / k_len) % q_len + past;
                let h = (idx / (k_len * q_len)) % heads;
                let b = idx / (k_len * q_len * heads);
                let same_segment =
                    j >= prefix && i >= prefix && (j - prefix) / seg == (i - prefix) / seg;
                let allowed = j <= i && (j < prefix || same_segment);
                if b == 1 && i == past + 3 {
                    f64::NEG_INFINITY
                } else if allowed {
                    if (j + h).is_multiple_of(7) {
                        -0.75
                    } else {
                        0.0
                    }
                } else {
                    f64::NEG_INFINITY
                }
            })
            .collect();
        Tensor::from_vec(data, (batch, heads, q_len, k_len), &Device::Cpu)
    }

    #[test]
    fn sparse_masks_wide_heads_and_f32_match_the_composition() -> Result<()> {
        let dev = Device::Cpu;
        // (heads, kv heads, q_len, k_len, head_dim, bias heads): tiles and tails of the
        // 16-wide kernels, a key/value cache (k_len > q_len), per-head biases.
        for (hq, hkv, tq, tk, d, bh) in [
            (4, 2, 37, 37, 64, 1),
            (3, 1, 21, 40, 24, 3),
            (2, 2, 33, 33, 16, 1),
            (2, 1, 19, 19, 12, 1),
        ] {
            let randn = |shape: (usize, usize, usize, usize), seed: usize| -> Result<Var> {
                let base = crate::gradcheck::seeded_randn(0f64, 1.0, shape, &dev)?;
                Var::from_tensor(&base.affine(1.0, seed as f64 * 1e-3)?)
            };
            let vars = [
                randn((2, hq, tq, d), 0)?,
                randn((2, hkv, tk, d), 1)?,
                randn((2, hkv, tk, d), 2)?,
            ];
            let bias = segment_bias(2, bh, tq, tk)?;
            let probe = crate::gradcheck::seeded_randn(0f64, 1.0, (2, hq, tq, d), &dev)?;
            // The masked row's output is NaN in both; keep it out of the loss (its probe is
            // zero there, but NaN * 0 is NaN).
            let probe = probe.broadcast_mul(&row_mask(2, hq, tq, d)?)?;
            let keep_finite = |out: Tensor| -> Result<Tensor> {
                out.eq(&out)?.where_cond(&out, &out.zeros_like()?)
            };
            let fused_fn = |q: &Tensor, k: &Tensor, v: &Tensor, b: &Tensor| {
                keep_finite(fused_attention(q, k, v, b)?)
            };
            let composed_fn = |q: &Tensor, k: &Tensor, v: &Tensor, b: &Tensor| {
                keep_finite(attention_composed(q, k, v, b)?)
            };
            let fused = run(&fused_fn, &vars, &bias, &probe)?;
            let reference = run(&composed_fn, &vars, &bias, &probe)?;
            // NaN must match NaN exactly, except where the composition spreads the masked row's
            // NaN over the key and value gradients (the fused op keeps them finite).
            let max_diff = |a: &[f64], b: &[f64], composed_nan_ok: bool| {
                a.iter()
                    .zip(b)
                    .map(|(x, y)| match (x.is_nan(), y.is_nan()) {
                        (true, true) => 0.0,
                        (false, true) if composed_nan_ok => 0.0,
                        (false, false) => (x - y).abs(),
                        _ => f64::INFINITY,
                    })
                    .fold(0.0, f64::max)
            };
            assert!(
                max_diff(&fused.0, &reference.0, false) < 1e-12,
                "values {hq} {hkv} {tq} {tk} {d}"
            );
            for (i, (a, b)) in fused.1.iter().zip(&reference.1).enumerate() {
                let diff = max_diff(a, b, i > 0);
                assert!(
                    diff < 1e-11,
                    "gradient {i} at {hq} {hkv} {tq} {tk} {d}: {diff}"
                );
                let nan = a.iter().filter(|v| v.is_nan()).count();
                let expected = if i == 0 { hq * d } else { 0 };
                assert_eq!(
                    nan, expected,
                    "gradient {i}: NaN only in the masked query row"
                );
            }
            // f32: the same inputs, against the f64 composition.
            let vars32: Vec<Tensor> = vars
                .iter()
                .map(|v| v.as_tensor().to_dtype(candle_core::DType::F32))
                .collect::<Result<_>>()?;
            let out32 = fused_attention(&vars32[0], &vars32[1], &vars32[2], &bias)?;
            let out32: Vec<f32> = out32.flatten_all()?.to_vec1()?;
            let out64 = attention_composed(
                vars[0].as_tensor(),
                vars[1].as_tensor(),
                vars[2].as_tensor(),
                &bias,
            )?
            .flatten_all()?
            .to_vec1::<f64>()?;
            let nan_rows = out32.iter().filter(|x| x.is_nan()).count();
            assert_eq!(nan_rows, hq * d, "exactly the masked row is NaN (f32)");
            for (a, b) in out32.iter().zip(&out64) {
                if b.is_finite() {
                    assert!((*a as f64 - b).abs() < 1e-5, "f32 {a} vs {b}");
                }
            }
        }
        Ok(())
    }

    /// 1 everywhere but the fully masked row of `segment_bias` (batch 1, query 3), 0 there.
    fn row_mask(batch: usize, heads: usize, q_len: usize, d: usize) -> Result<Tensor> {
        let data: Vec<f64> = (0..batch * heads * q_len * d)
            .map(|idx| {
                let i = (idx / d) % q_len;
                let b = idx / (d * q_len * heads);
                if b == 1 && i == 3 { 0.0 } else { 1.0 }
            })
            .collect();
        Tensor::from_vec(data, (batch, heads, q_len, d), &Device::Cpu)
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
