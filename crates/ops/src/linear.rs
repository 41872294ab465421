//! Linear layers under a precision policy: `linear(x, w, precision) = x W^T`.
//!
//! `Precision::F32` is candle's f32 matmul, unchanged (the exact mode). `Precision::Bf16` runs
//! the product through `crate::gemm::product` (inputs rounded to bf16, f32 accumulation, f32
//! result; `bf16`'s kernels or the f32 kernel on rounded values, whichever is faster here) as
//! one graph node whose backward follows the same policy:
//! `dx = dy W` and `dW = dy^T x`, both bf16 x bf16 -> f32 from the f32 `dy`, `x` and `W`.
//! The weight stays the f32 master copy; it is rounded while packed, once per call.
//!
//! Frozen weights (a weight outside the graph: not a variable and not computed from one, as the
//! base weights under LoRA) get no weight gradient: the backward computes `dx` only, instead of
//! candle's matmul backward, which computes and stores the gradient of both operands.
//!
//! What it is not: an autocast of everything. Only matrix products change precision; biases,
//! norms, softmaxes and losses see f32 values. Non-CPU devices and f64 tensors (gradient
//! checks) take the f32 path whatever the precision.

use candle_core::{CpuStorage, CustomOp2, DType, Layout, Result, Shape, Tensor};
use stoke_types::Precision;

use crate::bf16::PackedA;
use crate::gemm::Operand;
use crate::kernels::contiguous_slice;

thread_local! {
    static DECODING: std::cell::Cell<bool> = const { std::cell::Cell::new(false) };
}

/// Most rows `linear` streams the weight for inside a [`Decoding`] scope.
pub const STREAM_MAX_ROWS: usize = 16;

/// A scope in which this thread's `linear` calls are inference on few rows (a decode step): up
/// to [`STREAM_MAX_ROWS`] f32 rows go through the streaming kernel
/// (`matvec::matmul_f32_weight_rows`) instead of candle's GEMM, which at small M packs the
/// whole weight per call. The result carries no gradient. Scopes nest; dropping the guard
/// restores the previous state.
#[must_use = "the scope ends when the guard is dropped"]
pub struct Decoding(bool);

impl Decoding {
    /// Enters the scope, unless `STOKE_DECODE_STREAM=0` (A/B runs against candle's GEMM).
    pub fn begin() -> Decoding {
        let enabled = crate::dispatch::decode_stream();
        Decoding(DECODING.with(|d| d.replace(enabled || d.get())))
    }
}

impl Drop for Decoding {
    fn drop(&mut self) {
        DECODING.with(|d| d.set(self.0));
    }
}

/// Whether this thread is inside a [`Decoding`] scope.
pub fn decoding() -> bool {
    DECODING.with(std::cell::Cell::get)
}

/// `x W^T` per head: x `[H, M, K]`, W `[H, N, K]`, result `[H, M, N]` (MLA's absorbed
/// projections into and out of the latent space). Inside a [`Decoding`] scope, f32 on the CPU
/// with up to [`STREAM_MAX_ROWS`] rows, each head's weight is streamed once for its rows (no
/// gradient); otherwise a batched matmul.
pub fn per_head_linear(x: &Tensor, weight: &Tensor) -> Result<Tensor> {
    let (heads, m, k) = x.dims3()?;
    let (w_heads, n, w_k) = weight.dims3()?;
    if heads != w_heads || k != w_k {
        candle_core::bail!(
            "per_head_linear: x {:?} and weight {:?} disagree",
            x.dims(),
            weight.dims()
        )
    }
    if !(decoding()
        && m <= STREAM_MAX_ROWS
        && x.device().is_cpu()
        && x.dtype() == DType::F32
        && weight.dtype() == DType::F32)
    {
        return x.matmul(&weight.t()?);
    }
    let out = with_f32(x, |xs| {
        with_f32(weight, |w| {
            let mut out = vec![0f32; heads * m * n];
            for (h, y) in out.chunks_exact_mut(m * n).enumerate() {
                let x = &xs[h * m * k..(h + 1) * m * k];
                let w = &w[h * n * k..(h + 1) * n * k];
                for (row, y) in x.chunks_exact(k).zip(y.chunks_exact_mut(n)) {
                    for (value, w) in y.iter_mut().zip(w.chunks_exact(k)) {
                        *value = crate::matvec::dot(row, w);
                    }
                }
            }
            out
        })
    })??;
    Tensor::from_vec(out, (heads, m, n), x.device())
}

/// `x W^T` for x `[..., K]` and W `[N, K]`; result `[..., N]`.
pub fn linear(x: &Tensor, weight: &Tensor, precision: Precision) -> Result<Tensor> {
    if decoding()
        && !uses_bf16(precision, &[x, weight])
        && x.device().is_cpu()
        && x.dtype() == DType::F32
        && weight.dtype() == DType::F32
    {
        let dims = x.dims().to_vec();
        let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
        let (n, k) = weight.dims2()?;
        if rows <= STREAM_MAX_ROWS && dims.last() == Some(&k) {
            let y = with_f32(x, |xs| {
                with_f32(weight, |w| {
                    crate::matvec::matmul_f32_weight_rows(xs, rows, w, n, k)
                })
            })??;
            let mut out = dims;
            if let Some(last) = out.last_mut() {
                *last = n;
            }
            return Tensor::from_vec(y, out, x.device());
        }
    }
    let frozen = !weight.track_op() && x.track_op();
    if frozen && !uses_bf16(precision, &[x, weight]) {
        let (n, k) = weight.dims2()?;
        let dims = x.dims().to_vec();
        let rows: usize = dims[..dims.len().saturating_sub(1)].iter().product();
        let y = x
            .reshape((rows, k))?
            .contiguous()?
            .apply_op1(FrozenLinear(weight.contiguous()?))?;
        let mut out = dims;
        if let Some(last) = out.last_mut() {
            *last = n;
        }
        return y.reshape(out);
    }
    if !uses_bf16(precision, &[x, weight]) {
        return if x.rank() == 2 {
            x.matmul(&weight.t()?)
        } else {
            x.broadcast_matmul(&weight.t()?)
        };
    }
    let dims = x.dims().to_vec();
    let (n, k) = weight.dims2()?;
    let Some((&last, lead)) = dims.split_last() else {
        candle_core::bail!("linear: x must have at least one dimension")
    };
    if last != k {
        candle_core::bail!("linear: x {dims:?} and weight [{n}, {k}] disagree on the input size")
    }
    let rows: usize = lead.iter().product();
    let y = x
        .reshape((rows, k))?
        .contiguous()?
        .apply_op2(&weight.contiguous()?, Bf16Linear)?;
    let mut out = lead.to_vec();
    out.push(n);
    y.reshape(out)
}

/// Whether `precision` asks for bf16 and every tensor is f32 on the CPU.
pub fn uses_bf16(precision: Precision, tensors: &[&Tensor]) -> bool {
    precision == Precision::Bf16
        && tensors
            .iter()
            .all(|t| t.device().is_cpu() && t.dtype() == DType::F32)
}

/// Runs `f` on the values of a CPU f32 tensor, made contiguous first if it is not.
pub(crate) fn with_f32<R>(t: &Tensor, f: impl FnOnce(&[f32]) -> R) -> Result<R> {
    let t = t.contiguous()?;
    let (storage, layout) = t.storage_and_layout();
    let candle_core::Storage::Cpu(CpuStorage::F32(data)) = &*storage else {
        candle_core::bail!(
            "bf16 matmul: expected an f32 CPU tensor, got {:?}",
            t.dtype()
        )
    };
    Ok(f(contiguous_slice(data, layout, "bf16 matmul")?))
}

/// `A B`: a `[M, K]`, b `[K, N]`; no graph.
fn matmul_nn_bf16(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let ((m, k), (_, n)) = (a.dims2()?, b.dims2()?);
    let mut c = vec![0f32; m * n];
    with_f32(a, |a| {
        with_f32(b, |b| {
            crate::gemm::product(
                Precision::Bf16,
                m,
                n,
                k,
                Operand::plain(a),
                Operand::plain(b),
                &mut c,
                false,
            )
        })
    })??;
    Tensor::from_vec(c, (m, n), a.device())
}

/// `A^T B`: a `[K, M]`, b `[K, N]`; no graph.
fn matmul_tn_bf16(a: &Tensor, b: &Tensor) -> Result<Tensor> {
    let ((k, m), (_, n)) = (a.dims2()?, b.dims2()?);
    let mut c = vec![0f32; m * n];
    with_f32(a, |a| {
        with_f32(b, |b| {
            crate::gemm::product(
                Precision::Bf16,
                m,
                n,
                k,
                Operand::t(a),
                Operand::plain(b),
                &mut c,
                false,
            )
        })
    })??;
    Tensor::from_vec(c, (m, n), a.device())
}

/// `x W^T` with W already in bf16 (`PackedA::from_rows(W)`, the layout inference keeps
/// weights in): for inference, where the weights do not change between calls and converting
/// them per call would cost more than the product itself. x `[..., K]` f32 on the CPU. Not
/// differentiable: a backward through it is an error naming the fix (training takes `linear`,
/// which converts per call). See `matvec::matmul_weight_rows` for the kernels.
pub fn linear_prepacked(x: &Tensor, packed: &std::sync::Arc<PackedA>) -> Result<Tensor> {
    let dims = x.dims().to_vec();
    let Some((&last, lead)) = dims.split_last() else {
        candle_core::bail!("linear_prepacked: x must have at least one dimension")
    };
    if last != packed.depth() {
        candle_core::bail!(
            "linear_prepacked: x {dims:?} and the packed weight [{}, {}] disagree on the input size",
            packed.rows(),
            packed.depth()
        )
    }
    let rows: usize = lead.iter().product();
    let y = x
        .reshape((rows, last))?
        .contiguous()?
        .apply_op1(Prepacked(packed.clone()))?;
    let mut out = lead.to_vec();
    out.push(packed.rows());
    y.reshape(out)
}

struct Prepacked(std::sync::Arc<PackedA>);

impl candle_core::CustomOp1 for Prepacked {
    fn name(&self) -> &'static str {
        "stoke-linear-bf16-prepacked"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let CpuStorage::F32(x) = storage else {
            candle_core::bail!("{}: f32 only", self.name())
        };
        let (m, _) = layout.shape().dims2()?;
        let x = contiguous_slice(x, layout, self.name())?;
        let out = crate::matvec::matmul_weight_rows(x, m, &self.0);
        Ok((CpuStorage::F32(out), Shape::from((m, self.0.rows()))))
    }

    fn bwd(&self, _arg: &Tensor, _res: &Tensor, _grad_res: &Tensor) -> Result<Option<Tensor>> {
        candle_core::bail!(
            "a backward pass reached bf16 weights packed for inference; train on a model without \
             packed weights (Transformer::unpack_weights)"
        )
    }
}

/// x `[M, K]`, W `[N, K]` -> `[M, N]` in bf16 with f32 accumulation.
struct Bf16Linear;

impl CustomOp2 for Bf16Linear {
    fn name(&self) -> &'static str {
        "stoke-linear-bf16"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (CpuStorage::F32(x), CpuStorage::F32(w)) = (s1, s2) else {
            candle_core::bail!("{}: f32 only", self.name())
        };
        let (m, k) = l1.shape().dims2()?;
        let (n, _) = l2.shape().dims2()?;
        let x = contiguous_slice(x, l1, self.name())?;
        let w = contiguous_slice(w, l2, self.name())?;
        let mut out = vec![0f32; m * n];
        crate::gemm::product(
            Precision::Bf16,
            m,
            n,
            k,
            Operand::plain(x),
            Operand::t(w),
            &mut out,
            false,
        );
        Ok((CpuStorage::F32(out), Shape::from((m, n))))
    }

    fn bwd(
        &self,
        x: &Tensor,
        w: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let dy = grad_res.detach();
        let dx = matmul_nn_bf16(&dy, &w.detach())?;
        // A frozen weight (outside the graph) needs no gradient.
        let dw = match w.track_op() {
            true => Some(matmul_tn_bf16(&dy, &x.detach())?),
            false => None,
        };
        Ok((Some(dx), dw))
    }
}

/// `x W^T` (f32/f64, candle's matmul) for a frozen W, held by the op (shared, not copied): the
/// backward computes `dx = dy W` only.
struct FrozenLinear(Tensor);

impl candle_core::CustomOp1 for FrozenLinear {
    fn name(&self) -> &'static str {
        "stoke-linear-frozen-weight"
    }

    fn cpu_fwd(&self, storage: &CpuStorage, layout: &Layout) -> Result<(CpuStorage, Shape)> {
        let device = candle_core::Device::Cpu;
        let x = match storage {
            CpuStorage::F32(x) => Tensor::from_slice(
                contiguous_slice(x, layout, self.name())?,
                layout.shape(),
                &device,
            )?,
            CpuStorage::F64(x) => Tensor::from_slice(
                contiguous_slice(x, layout, self.name())?,
                layout.shape(),
                &device,
            )?,
            _ => candle_core::bail!("{}: f32 or f64", self.name()),
        };
        let y = x.matmul(&self.0.t()?)?;
        let shape = y.shape().clone();
        let flat = y.flatten_all()?;
        let storage = match y.dtype() {
            DType::F64 => CpuStorage::F64(flat.to_vec1()?),
            _ => CpuStorage::F32(flat.to_vec1()?),
        };
        Ok((storage, shape))
    }

    fn bwd(&self, _x: &Tensor, _res: &Tensor, grad_res: &Tensor) -> Result<Option<Tensor>> {
        Ok(Some(grad_res.detach().matmul(&self.0)?))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16::round_bf16;
    use candle_core::{Device, Var};

    fn tensor(n: usize, dims: &[usize], seed: f32) -> Tensor {
        let v: Vec<f32> = (0..n).map(|i| (i as f32 * 0.613 + seed).sin()).collect();
        Tensor::from_vec(v, dims, &Device::Cpu).unwrap()
    }

    fn rounded(t: &Tensor) -> Tensor {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let v: Vec<f32> = v.into_iter().map(round_bf16).collect();
        Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap()
    }

    fn max_diff(a: &Tensor, b: &Tensor) -> f32 {
        (a - b)
            .unwrap()
            .abs()
            .unwrap()
            .flatten_all()
            .unwrap()
            .max(0)
            .unwrap()
            .to_scalar()
            .unwrap()
    }

    #[test]
    fn a_decoding_scope_streams_few_rows_with_the_same_values() {
        let w = tensor(40 * 24, &[40, 24], 0.3);
        for rows in [1, 2, 8, STREAM_MAX_ROWS, STREAM_MAX_ROWS + 1] {
            let x = tensor(rows * 24, &[1, rows, 24], 1.1);
            let plain = linear(&x, &w, Precision::F32).unwrap();
            let streamed = {
                let _scope = Decoding::begin();
                linear(&x, &w, Precision::F32).unwrap()
            };
            assert_eq!(streamed.dims(), [1, rows, 40]);
            let diff = max_diff(&plain, &streamed);
            assert!(diff < 1e-5, "{rows} rows: {diff}");
        }
        // Per head: x [H, M, K] against W [H, N, K].
        let x = tensor(3 * 2 * 24, &[3, 2, 24], 0.7);
        let w = tensor(3 * 5 * 24, &[3, 5, 24], 1.9);
        let plain = per_head_linear(&x, &w).unwrap();
        let streamed = {
            let _scope = Decoding::begin();
            per_head_linear(&x, &w).unwrap()
        };
        assert_eq!(streamed.dims(), [3, 2, 5]);
        assert!(max_diff(&plain, &x.matmul(&w.t().unwrap()).unwrap()) == 0.0);
        assert!(max_diff(&plain, &streamed) < 1e-5);
        assert!(per_head_linear(&x, &tensor(3 * 5 * 23, &[3, 5, 23], 0.0)).is_err());
        // Scopes nest, and the state returns when each ends.
        let outer = Decoding::begin();
        {
            let _inner = Decoding::begin();
        }
        assert!(DECODING.with(std::cell::Cell::get));
        drop(outer);
        assert!(!DECODING.with(std::cell::Cell::get));
    }

    #[test]
    fn f32_precision_is_the_plain_matmul() {
        let x = tensor(3 * 5 * 7, &[3, 5, 7], 0.1);
        let w = tensor(4 * 7, &[4, 7], 0.7);
        let got = linear(&x, &w, Precision::F32).unwrap();
        let want = x.broadcast_matmul(&w.t().unwrap()).unwrap();
        assert_eq!(max_diff(&got, &want), 0.0);
    }

    /// Forward and both gradients equal the f32 computation on bf16-rounded operands (the
    /// policy's definition), up to f32 summation order.
    #[test]
    fn bf16_forward_and_backward_follow_the_policy() {
        let (m, k, n) = (37, 70, 45);
        let x = Var::from_tensor(&tensor(m * k, &[m, k], 0.3)).unwrap();
        let w = Var::from_tensor(&tensor(n * k, &[n, k], 1.1)).unwrap();
        let g = tensor(m * n, &[m, n], 2.0);
        let y = linear(x.as_tensor(), w.as_tensor(), Precision::Bf16).unwrap();
        let grads = (&y * &g).unwrap().sum_all().unwrap().backward().unwrap();
        let (xr, wr, gr) = (rounded(x.as_tensor()), rounded(w.as_tensor()), rounded(&g));
        let want_y = xr.matmul(&wr.t().unwrap()).unwrap();
        let want_dx = gr.matmul(&wr).unwrap();
        let want_dw = gr.t().unwrap().matmul(&xr).unwrap();
        assert!(max_diff(&y, &want_y) < 1e-4, "{}", max_diff(&y, &want_y));
        let dx = grads.get(&x).unwrap();
        let dw = grads.get(&w).unwrap();
        assert!(
            max_diff(dx, &want_dx) < 1e-4,
            "dx {}",
            max_diff(dx, &want_dx)
        );
        assert!(
            max_diff(dw, &want_dw) < 1e-4,
            "dw {}",
            max_diff(dw, &want_dw)
        );
        // And bf16 is not f32: the unrounded product differs by about bf16's epsilon.
        let exact = x.as_tensor().matmul(&w.t().unwrap()).unwrap();
        let drift = max_diff(&y, &exact);
        assert!(drift > 0.0 && drift < 0.2, "bf16 vs f32 drift {drift}");
    }

    #[test]
    fn leading_dimensions_are_kept() {
        let x = tensor(2 * 3 * 8, &[2, 3, 8], 0.5);
        let w = tensor(5 * 8, &[5, 8], 0.9);
        let y = linear(&x, &w, Precision::Bf16).unwrap();
        assert_eq!(y.dims(), &[2, 3, 5]);
        assert!(linear(&x, &tensor(5 * 7, &[5, 7], 0.9), Precision::Bf16).is_err());
    }

    /// A frozen weight (a plain tensor) under a tracked input: the input gradient equals the
    /// plain matmul's in both precisions, and the weight gets no gradient at all.
    #[test]
    fn frozen_weights_get_no_gradient_and_the_input_the_same_one() {
        for precision in [Precision::F32, Precision::Bf16] {
            let x = Var::from_tensor(&tensor(6 * 5, &[2, 3, 5], 0.2)).unwrap();
            let w_var = Var::from_tensor(&tensor(4 * 5, &[4, 5], 1.1)).unwrap();
            let frozen = w_var.as_tensor().detach();
            let coeffs = tensor(6 * 4, &[2, 3, 4], 2.0);
            let run = |w: &Tensor| {
                let y = linear(x.as_tensor(), w, precision).unwrap();
                let grads = (&y * &coeffs)
                    .unwrap()
                    .sum_all()
                    .unwrap()
                    .backward()
                    .unwrap();
                (y, grads)
            };
            let (y_plain, g_plain) = run(w_var.as_tensor());
            let (y_frozen, g_frozen) = run(&frozen);
            assert_eq!(max_diff(&y_plain, &y_frozen), 0.0, "{precision}");
            let dx = |g: &candle_core::backprop::GradStore| g.get(x.as_tensor()).unwrap().clone();
            assert_eq!(max_diff(&dx(&g_plain), &dx(&g_frozen)), 0.0, "{precision}");
            assert!(g_plain.get(w_var.as_tensor()).is_some());
            assert!(
                g_frozen.get(&frozen).is_none(),
                "{precision}: a frozen weight got a gradient"
            );
        }
    }
}
