//! The LM head and the target log-probabilities as one graph node:
//! `linear_target_logprobs(hidden, weight, targets)[n] = log softmax(hidden @ weight^T)[n, targets[n]]`.
//!
//! Why: as a composition (`matmul`, then `target_logprobs`) the [N, V] logits are a graph node
//! of their own, and candle's backward accumulates every node's gradient into a fresh zero
//! tensor (`zeros_like` + `add`): for the largest activation of the step (2040 x 4096 f32 =
//! 33 MB in the benchmark) that is an extra memset, an extra three-array pass and an extra
//! allocation, on top of the logits gradient itself. Here the logits never enter the graph:
//! the forward keeps them (inside the op, not as a graph tensor) for the backward, which turns
//! them into `dlogits = g * (onehot - softmax)` (one pass, the log-sum-exp taken from the
//! forward output) and multiplies out `dhidden = dlogits @ W` and `dW = dlogits^T @ hidden`
//! directly. Measured in bench/README.md ("Training (issue 5)").
//!
//! What it is not: memory-saving like Cut Cross-Entropy (the [N, V] logits are materialised
//! once and held from forward to backward, as the composition holds them too), nor a GPU
//! kernel (CPU f32/f64; other devices and dtypes take the composition, same values), nor
//! differentiable twice. If the op's backward runs a second time (or after the saved logits
//! were taken), the logits are recomputed, so results never depend on call order.
//! Invariants: hidden [N, H], weight [V, H] (the `nn.Linear` layout of `lm_head.weight`),
//! targets [N] with every value < V.

use std::sync::Mutex;

use candle_core::{CpuStorage, CustomOp2, DType, Device, Layout, Result, Shape, Tensor};

use crate::bf16::{self, PackedA, PackedB};
use crate::gemm;
use crate::kernels::{Real, TargetLogprobsBackward, contiguous_slice, target_logprobs_rows};
use crate::linear::{uses_bf16, with_f32};
use rayon::prelude::*;
use stoke_types::Precision;

/// `log softmax(hidden @ weight^T)[n, targets[n]]`: hidden [N, H], weight [V, H], targets [N]
/// (any integer dtype). Returns [N]. Gradients flow to `hidden` and `weight`.
pub fn linear_target_logprobs(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> Result<Tensor> {
    linear_target_logprobs_with(hidden, weight, targets, Precision::F32)
}

/// `linear_target_logprobs` with the LM head's products (forward and backward) in `precision`
/// (see `crate::linear`; the log-softmax is f32 either way).
pub fn linear_target_logprobs_with(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    precision: Precision,
) -> Result<Tensor> {
    head(hidden, weight, targets, precision, false)
}

/// `linear_target_logprobs_with` holding no `[N, V]` tensor larger than a chunk of
/// `chunk_rows(V)` rows (at most 48 M logits), forward or backward: the forward keeps only its
/// inputs and the backward recomputes each chunk's logits (one more `N x V x H` product). For
/// memory-bound runs (activation checkpointing). Log-probabilities equal the unchunked ones; the
/// weight gradient sums the chunks in turn (equal to rounding). In bf16 both are the same op.
pub fn linear_target_logprobs_chunked(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    precision: Precision,
) -> Result<Tensor> {
    head(hidden, weight, targets, precision, true)
}

/// `sum_n log softmax(hidden @ weight^T)[n, targets[n]]` as a scalar graph node, with the
/// per-row log-probabilities as plain values beside it (for metrics; not in the graph).
///
/// Why: a loss that is a plain sum of the log-probabilities (pretraining, SFT) hands the head's
/// backward one scalar, so its gradients can be formed in the forward pass, chunk by chunk while
/// the logits are at hand, and scaled in the backward. `linear_target_logprobs` must instead
/// recompute every chunk's logits in its backward (one more `N x V x H` product, a quarter of
/// the head's arithmetic) since per-row gradients are known only then. Liger's fused linear
/// cross-entropy does the same on GPUs. Values equal `linear_target_logprobs_with(..).sum_all()`
/// up to summation order, and the gradients up to the rounding of `dlogits` to bf16 before the
/// scale instead of after.
///
/// What it is not: a change of precision policy (only the bf16 head takes this route; f32 and
/// f64 return the per-row op's sum), or memory-free: when a gradient is wanted the head's
/// gradients (`[V, H]` and `[N, H]`, f32) are held from forward to backward, which is where the
/// backward would create them anyway. No `[N, V]` tensor larger than a chunk exists.
pub fn linear_target_logprob_sum(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    precision: Precision,
) -> Result<(Tensor, Vec<f32>)> {
    let fused = hidden.device().is_cpu()
        && weight.device().is_cpu()
        && hidden.dtype() == DType::F32
        && weight.dtype() == DType::F32
        && uses_bf16(precision, &[hidden, weight]);
    if !fused {
        let logprobs = linear_target_logprobs_with(hidden, weight, targets, precision)?;
        let values = logprobs.detach().to_dtype(DType::F32)?.to_vec1()?;
        return Ok((logprobs.sum_all()?, values));
    }
    let (_, vocab, ids) = checked_targets("linear_target_logprob_sum", hidden, weight, targets)?;
    let logprobs = std::sync::Arc::new(Mutex::new(None));
    let op = Bf16TargetLogprobSum {
        head: ChunkedBf16TargetLogprobs {
            chunk: chunk_rows(vocab),
            targets: ids,
        },
        want_grads: hidden.track_op() || weight.track_op(),
        saved: Mutex::new(None),
        logprobs: logprobs.clone(),
    };
    let sum = hidden.contiguous()?.apply_op2(&weight.contiguous()?, op)?;
    let values = logprobs
        .lock()
        .map_err(|_| candle_core::Error::Msg("linear_target_logprob_sum: poisoned lock".into()))?
        .take()
        .unwrap_or_default();
    Ok((sum, values))
}

/// `(rows, vocab, target ids)` of a head call, after checking that hidden [N, H] and weight
/// [V, H] agree on H and that there is one target below V per row; errors name `op`.
fn checked_targets(
    op: &str,
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
) -> Result<(usize, usize, Vec<u32>)> {
    let (rows, width) = hidden.dims2()?;
    let (vocab, weight_width) = weight.dims2()?;
    if width != weight_width {
        candle_core::bail!(
            "{op}: hidden {:?} and weight {:?} disagree on the hidden size",
            hidden.dims(),
            weight.dims()
        )
    }
    let ids: Vec<u32> = targets.to_dtype(DType::U32)?.flatten_all()?.to_vec1()?;
    if ids.len() != rows {
        candle_core::bail!("{op}: {} targets for {rows} rows", ids.len())
    }
    if let Some(bad) = ids.iter().find(|&&t| t as usize >= vocab) {
        candle_core::bail!("{op}: target {bad} out of range for vocabulary {vocab}")
    }
    Ok((rows, vocab, ids))
}

fn head(
    hidden: &Tensor,
    weight: &Tensor,
    targets: &Tensor,
    precision: Precision,
    chunked: bool,
) -> Result<Tensor> {
    let (rows, vocab, targets) =
        checked_targets("linear_target_logprobs", hidden, weight, targets)?;
    let fused = hidden.device().is_cpu()
        && weight.device().is_cpu()
        && hidden.dtype() == weight.dtype()
        && matches!(hidden.dtype(), DType::F32 | DType::F64);
    if !fused {
        let logits = crate::linear::linear(hidden, weight, precision)?;
        let targets = Tensor::from_vec(targets, rows, logits.device())?;
        return crate::kernels::target_logprobs(&logits, &targets);
    }
    if uses_bf16(precision, &[hidden, weight]) {
        return hidden.contiguous()?.apply_op2(
            &weight.contiguous()?,
            ChunkedBf16TargetLogprobs {
                chunk: chunk_rows(vocab),
                targets,
            },
        );
    }
    if chunked {
        return hidden.contiguous()?.apply_op2(
            &weight.contiguous()?,
            ChunkedTargetLogprobs {
                chunk: chunk_rows(vocab),
                targets,
            },
        );
    }
    hidden.contiguous()?.apply_op2(
        &weight.contiguous()?,
        LinearTargetLogprobs {
            targets,
            saved_logits: Mutex::new(None),
        },
    )
}

/// The f32/f64 head in chunks of positions, logits recomputed in the backward pass (see
/// `linear_target_logprobs_chunked`); the products are candle's, as in `LinearTargetLogprobs`.
struct ChunkedTargetLogprobs {
    targets: Vec<u32>,
    /// Rows per chunk (`chunk_rows(V)`; smaller in tests).
    chunk: usize,
}

impl ChunkedTargetLogprobs {
    const NAME: &'static str = "stoke-linear-target-logprobs-chunked";

    /// `(first_row, rows)` of every chunk.
    fn chunks(&self) -> impl Iterator<Item = (usize, usize)> + '_ {
        let rows = self.targets.len();
        let step = self.chunk.max(1);
        (0..rows)
            .step_by(step)
            .map(move |first| (first, step.min(rows - first)))
    }

    fn forward<T: Real>(
        &self,
        hidden: &[T],
        hidden_layout: &Layout,
        weight: &[T],
        weight_layout: &Layout,
    ) -> Result<CpuStorage> {
        let hidden = plain_tensor(hidden, hidden_layout, Self::NAME)?;
        let weight_t = plain_tensor(weight, weight_layout, Self::NAME)?.t()?;
        let mut out = Vec::with_capacity(self.targets.len());
        for (first, here) in self.chunks() {
            let logits = hidden.narrow(0, first, here)?.matmul(&weight_t)?;
            out.extend(logprobs_of::<T>(
                &logits,
                &self.targets[first..first + here],
                Self::NAME,
            )?);
        }
        Ok(T::to_cpu_storage_owned(out))
    }
}

/// `target_logprobs_rows` of a logits tensor `[rows, V]` (made contiguous first).
fn logprobs_of<T: Real>(logits: &Tensor, targets: &[u32], name: &str) -> Result<Vec<T>> {
    let logits = logits.contiguous()?;
    let vocab = logits.dim(1)?;
    let (storage, layout) = logits.storage_and_layout();
    let candle_core::Storage::Cpu(cpu) = &*storage else {
        candle_core::bail!("{name}: logits left the CPU")
    };
    let data = contiguous_slice(T::cpu_storage_as_slice(cpu)?, layout, name)?;
    Ok(target_logprobs_rows(data, vocab, targets))
}

impl CustomOp2 for ChunkedTargetLogprobs {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = match (s1, s2) {
            (CpuStorage::F32(h), CpuStorage::F32(w)) => self.forward(h, l1, w, l2)?,
            (CpuStorage::F64(h), CpuStorage::F64(w)) => self.forward(h, l1, w, l2)?,
            _ => candle_core::bail!("{}: only f32 and f64 (same dtype)", Self::NAME),
        };
        Ok((out, Shape::from(self.targets.len())))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (hidden, weight) = (hidden.detach(), weight.detach());
        let (res, grad_res) = (res.detach(), grad_res.detach());
        let weight_t = weight.t()?;
        let mut dhidden = Vec::new();
        let mut dweight: Option<Tensor> = None;
        for (first, here) in self.chunks() {
            let h = hidden.narrow(0, first, here)?;
            let logits = h.matmul(&weight_t)?.contiguous()?;
            let dlogits = logits.apply_op3_no_bwd(
                &res.narrow(0, first, here)?.contiguous()?,
                &grad_res.narrow(0, first, here)?.contiguous()?,
                &TargetLogprobsBackward {
                    targets: &self.targets[first..first + here],
                },
            )?;
            drop(logits);
            dhidden.push(dlogits.matmul(&weight)?);
            let part = dlogits.t()?.matmul(&h)?;
            dweight = Some(match dweight {
                None => part,
                Some(sum) => (sum + part)?,
            });
        }
        let (Some(dweight), false) = (dweight, dhidden.is_empty()) else {
            return Ok((Some(hidden.zeros_like()?), Some(weight.zeros_like()?)));
        };
        Ok((Some(Tensor::cat(&dhidden, 0)?), Some(dweight)))
    }
}

/// Most logits held at once by a chunked head (elements; 192 MiB of f32).
///
/// Why this size: the pretraining head forms dW^T `[H, V]` chunk by chunk, one pass over it per
/// chunk. At SmolLM2-135M (vocab 49,152, batch 8 x 256) 1,024-row chunks make 2 passes where
/// the 320-row chunks of 16 M logits made 7, and each dW product contracts over 3x more rows:
/// the head's piece of a bf16 step fell from 1,248 to 1,154 ms (medians of 3 paired runs on a
/// 2-core Zen 4) for 168 MiB more peak memory (4,172 against 4,004 MiB).
const CHUNK_LOGITS: usize = 48 << 20;

/// Rows per chunk of the bf16 head for a vocabulary of `vocab`: a multiple of 32 (whole AMX
/// blocks), at least 32.
fn chunk_rows(vocab: usize) -> usize {
    ((CHUNK_LOGITS / vocab.max(1)) / 32 * 32).max(32)
}

/// The bf16 LM head and target log-probabilities, in chunks of positions: no `[N, V]` tensor
/// larger than `chunk_rows(V)` rows exists, forward or backward. The forward keeps nothing but
/// the op's inputs; the backward recomputes each chunk's logits (one more `N x V x H` product,
/// about a third more LM-head arithmetic) and turns them in place into the logits gradient:
/// `dlogits = g * (onehot - softmax)`, `dhidden = dlogits W`, `dW^T += hidden^T dlogits`.
struct ChunkedBf16TargetLogprobs {
    targets: Vec<u32>,
    /// Rows per chunk (`chunk_rows(V)`; smaller in tests).
    chunk: usize,
}

impl ChunkedBf16TargetLogprobs {
    const NAME: &'static str = "stoke-linear-target-logprobs-bf16";

    /// The target log-probabilities of every row, chunk by chunk.
    fn logprobs(&self, hidden: &[f32], weight: &[f32], width: usize) -> Result<Vec<f32>> {
        let vocab = weight.len() / width.max(1);
        let head = Head::new(weight, vocab, width);
        let mut out = Vec::with_capacity(self.targets.len());
        self.for_each_chunk(hidden, width, &head, |first, logits| {
            let here = logits.len() / vocab;
            out.extend(target_logprobs_rows(
                logits,
                vocab,
                &self.targets[first..first + here],
            ));
            Ok(())
        })?;
        Ok(out)
    }

    /// Calls `f(first_row, logits)` for each chunk of rows, `logits` `[rows, V]` row-major.
    fn for_each_chunk(
        &self,
        hidden: &[f32],
        width: usize,
        head: &Head,
        mut f: impl FnMut(usize, &mut [f32]) -> Result<()>,
    ) -> Result<()> {
        let rows = self.targets.len();
        let vocab = head.vocab();
        let step = self.chunk.max(1);
        let mut logits = vec![0.0f32; step.min(rows) * vocab];
        for first in (0..rows).step_by(step) {
            let here = step.min(rows - first);
            let chunk = &mut logits[..here * vocab];
            head.logits(
                &hidden[first * width..(first + here) * width],
                here,
                width,
                chunk,
            );
            f(first, chunk)?;
        }
        Ok(())
    }

    /// `(dhidden [N, H], dW [V, H])` for row gradients `grad`, chunk by chunk: the chunk's
    /// logits; their target log-probabilities (`logp`, from the forward, or computed here and
    /// appended to `computed` when `logp` is None); in place `dlogits = g * (onehot - softmax)`;
    /// then `dhidden = dlogits W` and `dW += dlogits^T hidden`, on either bf16 route.
    fn gradients(
        &self,
        hidden: &[f32],
        weight: &[f32],
        width: usize,
        logp: Option<&[f32]>,
        grad: &[f32],
        computed: &mut Vec<f32>,
    ) -> Result<(Vec<f32>, Vec<f32>)> {
        let rows = self.targets.len();
        let vocab = weight.len() / width.max(1);
        let head = Head::new(weight, vocab, width);
        let mut dhidden = vec![0.0f32; rows * width];
        let mut first_chunk = true;
        // The rounded route accumulates dW [V, H] directly; the packed one dW^T [H, V], whose
        // pack of dlogits is the cheaper one, transposed once at the end.
        let mut dweight = vec![0.0f32; vocab * width];
        // The second operand each route's backward products need beyond `head`.
        let other = match &head {
            Head::Packed(_) => Other::HeadT(PackedB::from_cols(weight, vocab, width)),
            Head::Rounded { .. } => Other::Hidden(gemm::rounded(hidden)),
        };
        self.for_each_chunk(hidden, width, &head, |first, logits| {
            let here = logits.len() / vocab;
            let targets = &self.targets[first..first + here];
            let chunk_logp = match logp {
                Some(lp) => std::borrow::Cow::Borrowed(&lp[first..first + here]),
                None => {
                    let lp = target_logprobs_rows(logits, vocab, targets);
                    computed.extend_from_slice(&lp);
                    std::borrow::Cow::Owned(lp)
                }
            };
            logits_to_grad_in_place(
                logits,
                vocab,
                targets,
                &chunk_logp,
                &grad[first..first + here],
            );
            let dh = &mut dhidden[first * width..(first + here) * width];
            match (&head, &other) {
                (Head::Packed(_), Other::HeadT(head_t)) => {
                    let dlogits = PackedA::from_rows(logits, here, vocab);
                    bf16::matmul_into(&dlogits, head_t, dh);
                    let h_t = PackedA::from_cols(
                        &hidden[first * width..(first + here) * width],
                        here,
                        width,
                    );
                    let dlogits_t = PackedB::from_cols(logits, here, vocab);
                    // dW^T [H, V] += hidden^T dlogits, kept in `dweight`'s buffer.
                    if first_chunk {
                        bf16::matmul_into(&h_t, &dlogits_t, &mut dweight);
                    } else {
                        bf16::matmul_acc(&h_t, &dlogits_t, &mut dweight);
                    }
                }
                (Head::Rounded { weight: w, .. }, Other::Hidden(h)) => {
                    let dlogits = gemm::rounded(logits);
                    gemm::product_exact(
                        here,
                        width,
                        vocab,
                        gemm::Operand::plain(&dlogits),
                        gemm::Operand::plain(w),
                        dh,
                        false,
                    );
                    gemm::product_exact(
                        vocab,
                        width,
                        here,
                        gemm::Operand::t(&dlogits),
                        gemm::Operand::plain(&h[first * width..(first + here) * width]),
                        &mut dweight,
                        !first_chunk,
                    );
                }
                _ => unreachable!("`other` is built for `head`'s route"),
            }
            first_chunk = false;
            Ok(())
        })?;
        if let Other::HeadT(_) = other {
            dweight = transposed_blocks(&dweight, width, vocab);
        }
        Ok((dhidden, dweight))
    }
}

/// `src` `[rows, cols]` transposed to `[cols, rows]`, in tiles of 64 x 64 (a task per 64
/// output rows). Why tiles: the head's weight gradient (`[576, 49152]` at SmolLM2-135M) read
/// one column per output row took 75 ms a training step, each read a cache miss.
fn transposed_blocks(src: &[f32], rows: usize, cols: usize) -> Vec<f32> {
    const TB: usize = 64;
    let mut out = vec![0.0f32; rows * cols];
    out.par_chunks_mut(rows.max(1) * TB)
        .enumerate()
        .for_each(|(block, dst)| {
            let c0 = block * TB;
            let here = dst.len() / rows.max(1);
            for r0 in (0..rows).step_by(TB) {
                for r in r0..(r0 + TB).min(rows) {
                    let from = &src[r * cols + c0..r * cols + c0 + here];
                    for (c, &v) in from.iter().enumerate() {
                        dst[c * rows + r] = v;
                    }
                }
            }
        });
    out
}

/// The f32 hidden `[N, H]` and weight `[V, H]` of a bf16 head op's inputs, contiguous, and H.
fn head_slices<'a>(
    name: &str,
    s1: &'a CpuStorage,
    l1: &Layout,
    s2: &'a CpuStorage,
    l2: &Layout,
) -> Result<(&'a [f32], &'a [f32], usize)> {
    let (CpuStorage::F32(hidden), CpuStorage::F32(weight)) = (s1, s2) else {
        candle_core::bail!("{name}: f32 only")
    };
    let (_, width) = l1.shape().dims2()?;
    Ok((
        contiguous_slice(hidden, l1, name)?,
        contiguous_slice(weight, l2, name)?,
        width,
    ))
}

/// What a bf16 head's backward multiplies besides its `Head`: the packed route's `W` packed for
/// `dhidden = dlogits W`, or the rounded route's bf16-rounded hidden states for `dW`.
enum Other {
    HeadT(PackedB),
    Hidden(Vec<f32>),
}

/// The LM head's weight `[V, H]` in the form the bf16 route multiplies (`gemm::bf16_route`):
/// packed for `bf16`'s kernels, or rounded to bf16 values for the f32 kernel.
enum Head {
    Packed(PackedB),
    Rounded { weight: Vec<f32>, vocab: usize },
}

impl Head {
    fn new(weight: &[f32], vocab: usize, width: usize) -> Head {
        match gemm::bf16_route() {
            gemm::Bf16Route::Packed(_) => Head::Packed(PackedB::from_rows(weight, vocab, width)),
            gemm::Bf16Route::RoundedF32 => Head::Rounded {
                weight: gemm::rounded(weight),
                vocab,
            },
        }
    }

    fn vocab(&self) -> usize {
        match self {
            Head::Packed(p) => p.cols(),
            Head::Rounded { vocab, .. } => *vocab,
        }
    }

    /// `logits = hidden W^T` for `rows` rows of `hidden`.
    fn logits(&self, hidden: &[f32], rows: usize, width: usize, logits: &mut [f32]) {
        match self {
            Head::Packed(head) => {
                let a = PackedA::from_rows(hidden, rows, width);
                bf16::matmul_into(&a, head, logits);
            }
            Head::Rounded { weight, vocab } => {
                let h = gemm::rounded(hidden);
                gemm::product_exact(
                    rows,
                    *vocab,
                    width,
                    gemm::Operand::plain(&h),
                    gemm::Operand::t(weight),
                    logits,
                    false,
                );
            }
        }
    }
}

impl CustomOp2 for ChunkedBf16TargetLogprobs {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (hidden, weight, width) = head_slices(Self::NAME, s1, l1, s2, l2)?;
        let out = self.logprobs(hidden, weight, width)?;
        Ok((CpuStorage::F32(out), Shape::from(self.targets.len())))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (rows, width) = hidden.dims2()?;
        let (vocab, _) = weight.dims2()?;
        let logp: Vec<f32> = res.detach().to_vec1()?;
        let grad: Vec<f32> = grad_res.detach().to_vec1()?;
        let (dhidden, dweight) = with_f32(weight, |w| {
            with_f32(hidden, |h| {
                self.gradients(h, w, width, Some(&logp), &grad, &mut Vec::new())
            })
        })???;
        let device = hidden.device();
        Ok((
            Some(Tensor::from_vec(dhidden, (rows, width), device)?),
            Some(Tensor::from_vec(dweight, (vocab, width), device)?),
        ))
    }
}

/// The bf16 head's `sum_n logp[n]`, gradients formed in the forward pass (see
/// `linear_target_logprob_sum`).
struct Bf16TargetLogprobSum {
    head: ChunkedBf16TargetLogprobs,
    /// A backward may follow: form the gradients of the sum in the forward pass.
    want_grads: bool,
    /// `(dhidden, dW)` of the sum (row gradient 1), taken by the backward.
    saved: Mutex<Option<(Vec<f32>, Vec<f32>)>>,
    /// The forward's per-row log-probabilities, taken by `linear_target_logprob_sum`.
    logprobs: std::sync::Arc<Mutex<Option<Vec<f32>>>>,
}

impl Bf16TargetLogprobSum {
    const NAME: &'static str = "stoke-linear-target-logprob-sum-bf16";

    fn lock<T>(m: &Mutex<T>) -> Result<std::sync::MutexGuard<'_, T>> {
        m.lock()
            .map_err(|_| candle_core::Error::Msg(format!("{}: poisoned lock", Self::NAME)))
    }
}

impl CustomOp2 for Bf16TargetLogprobSum {
    fn name(&self) -> &'static str {
        Self::NAME
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let (hidden, weight, width) = head_slices(Self::NAME, s1, l1, s2, l2)?;
        let rows = self.head.targets.len();
        let logp = if self.want_grads {
            let ones = vec![1.0f32; rows];
            let mut logp = Vec::with_capacity(rows);
            let grads = self
                .head
                .gradients(hidden, weight, width, None, &ones, &mut logp)?;
            *Self::lock(&self.saved)? = Some(grads);
            logp
        } else {
            self.head.logprobs(hidden, weight, width)?
        };
        // Row order, in f64: the same sum whatever the chunking.
        let sum = logp.iter().map(|&v| v as f64).sum::<f64>() as f32;
        *Self::lock(&self.logprobs)? = Some(logp);
        Ok((CpuStorage::F32(vec![sum]), Shape::from(())))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (rows, width) = hidden.dims2()?;
        let (vocab, _) = weight.dims2()?;
        let g = grad_res.detach().to_dtype(DType::F32)?.to_scalar::<f32>()?;
        let saved = Self::lock(&self.saved)?.take();
        let (mut dhidden, mut dweight) = match saved {
            Some(grads) => grads,
            // A second backward (or none was expected): form them again.
            None => {
                let ones = vec![1.0f32; rows];
                with_f32(weight, |w| {
                    with_f32(hidden, |h| {
                        self.head
                            .gradients(h, w, width, None, &ones, &mut Vec::new())
                    })
                })???
            }
        };
        if g != 1.0 {
            dhidden.par_iter_mut().for_each(|v| *v *= g);
            dweight.par_iter_mut().for_each(|v| *v *= g);
        }
        let device = hidden.device();
        Ok((
            Some(Tensor::from_vec(dhidden, (rows, width), device)?),
            Some(Tensor::from_vec(dweight, (vocab, width), device)?),
        ))
    }
}

/// `logits` (rows of `width`) becomes `g * (onehot(target) - softmax(logits))` per row, the
/// softmax taken from the forward's log-probability (`lse = logit[target] - logp`).
fn logits_to_grad_in_place(
    logits: &mut [f32],
    width: usize,
    targets: &[u32],
    logp: &[f32],
    grad: &[f32],
) {
    logits
        .par_chunks_mut(width)
        .zip(targets.par_iter().zip(logp.par_iter().zip(grad.par_iter())))
        .for_each(|(row, (&t, (&lp, &g)))| {
            let lse = row[t as usize] - lp;
            crate::vexp::dispatch(
                #[inline(always)]
                || {
                    for v in row.iter_mut() {
                        *v = -g * crate::vexp::exp(*v - lse);
                    }
                },
            );
            row[t as usize] += g;
        });
}

struct LinearTargetLogprobs {
    targets: Vec<u32>,
    /// The forward's [N, V] logits (a plain tensor, outside the graph), taken by the backward.
    saved_logits: Mutex<Option<Tensor>>,
}

/// A graph-free tensor holding a copy of contiguous CPU data.
fn plain_tensor<T: Real>(data: &[T], layout: &Layout, op: &str) -> Result<Tensor> {
    Tensor::from_slice(
        contiguous_slice(data, layout, op)?,
        layout.shape(),
        &Device::Cpu,
    )
}

impl LinearTargetLogprobs {
    fn forward<T: Real>(
        &self,
        hidden: &[T],
        hidden_layout: &Layout,
        weight: &[T],
        weight_layout: &Layout,
    ) -> Result<CpuStorage> {
        let name = "stoke-linear-target-logprobs";
        let hidden = plain_tensor(hidden, hidden_layout, name)?;
        let weight = plain_tensor(weight, weight_layout, name)?;
        let logits = hidden.matmul(&weight.t()?)?.contiguous()?;
        let out = logprobs_of::<T>(&logits, &self.targets, name)?;
        *self.lock_saved()? = Some(logits);
        Ok(T::to_cpu_storage_owned(out))
    }

    fn lock_saved(&self) -> Result<std::sync::MutexGuard<'_, Option<Tensor>>> {
        self.saved_logits
            .lock()
            .map_err(|_| candle_core::Error::Msg("linear_target_logprobs: poisoned lock".into()))
    }
}

impl CustomOp2 for LinearTargetLogprobs {
    fn name(&self) -> &'static str {
        "stoke-linear-target-logprobs"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let out = match (s1, s2) {
            (CpuStorage::F32(h), CpuStorage::F32(w)) => self.forward(h, l1, w, l2)?,
            (CpuStorage::F64(h), CpuStorage::F64(w)) => self.forward(h, l1, w, l2)?,
            _ => candle_core::bail!("{}: only f32 and f64 (same dtype)", self.name()),
        };
        Ok((out, Shape::from(self.targets.len())))
    }

    fn bwd(
        &self,
        hidden: &Tensor,
        weight: &Tensor,
        res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let (hidden, weight) = (hidden.detach(), weight.detach());
        let saved = self.lock_saved()?.take();
        let logits = match saved {
            Some(logits) => logits,
            None => hidden.matmul(&weight.t()?)?.contiguous()?,
        };
        let dlogits = logits.apply_op3_no_bwd(
            &res.detach().contiguous()?,
            &grad_res.detach().contiguous()?,
            &TargetLogprobsBackward {
                targets: &self.targets,
            },
        )?;
        drop(logits);
        let dhidden = dlogits.matmul(&weight)?;
        let dweight = dlogits.t()?.matmul(&hidden)?;
        Ok((Some(dhidden), Some(dweight)))
    }
}

#[cfg(test)]
mod transpose_tests {
    #[test]
    fn tiled_transpose_moves_every_element() {
        // Partial tiles on both sides, and shapes of one row or column.
        for (rows, cols) in [(1, 1), (1, 70), (70, 1), (64, 64), (65, 130), (130, 200)] {
            let src: Vec<f32> = (0..rows * cols).map(|i| i as f32).collect();
            let t = super::transposed_blocks(&src, rows, cols);
            for r in 0..rows {
                for c in 0..cols {
                    assert_eq!(
                        t[c * rows + r],
                        src[r * cols + c],
                        "[{rows}, {cols}] ({r}, {c})"
                    );
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::Var;

    /// Deterministic values spread like N(0, scale) without a random generator.
    fn values(n: usize, seed: f64, scale: f64) -> Vec<f64> {
        (0..n)
            .map(|i| scale * (i as f64 * 1.37 + seed).sin())
            .collect()
    }

    fn rounded(t: &Tensor) -> Tensor {
        let v: Vec<f32> = t.flatten_all().unwrap().to_vec1().unwrap();
        let v: Vec<f32> = v.into_iter().map(crate::bf16::round_bf16).collect();
        Tensor::from_vec(v, t.dims(), &Device::Cpu).unwrap()
    }

    fn max_abs_diff(a: &Tensor, b: &Tensor) -> f32 {
        let (a, b): (Vec<f32>, Vec<f32>) = (
            a.flatten_all().unwrap().to_vec1().unwrap(),
            b.flatten_all().unwrap().to_vec1().unwrap(),
        );
        a.iter()
            .zip(&b)
            .map(|(x, y)| (x - y).abs())
            .fold(0.0, f32::max)
    }

    fn f32s(n: usize, seed: f64, scale: f64) -> Vec<f32> {
        values(n, seed, scale)
            .into_iter()
            .map(|v| v as f32)
            .collect()
    }

    /// f32 hidden [77, 40] and weight [150, 40] and one target per row: three chunks of 32
    /// rows, the last one ragged.
    fn bf16_fixture() -> (Var, Var, Vec<u32>) {
        let (rows, width, vocab) = (77, 40, 150);
        let hidden = Var::from_vec(f32s(rows * width, 0.3, 1.0), (rows, width), &Device::Cpu);
        let weight = Var::from_vec(f32s(vocab * width, 1.7, 0.3), (vocab, width), &Device::Cpu);
        let targets = (0..rows as u32)
            .map(|i| (i * 37 + 5) % vocab as u32)
            .collect();
        (hidden.unwrap(), weight.unwrap(), targets)
    }

    /// The chunked bf16 head (several chunks, a ragged last one) against the f32 composition
    /// on bf16-rounded operands, forward and both gradients. Only the summation order of the
    /// products differs, so the tolerance is f32-sized.
    #[test]
    fn chunked_bf16_head_matches_the_rounded_f32_composition() {
        let (hidden, weight, targets) = bf16_fixture();
        let rows = targets.len();
        let coeffs = Tensor::from_vec(f32s(rows, 2.1, 1.0), rows, &Device::Cpu).unwrap();
        let op = ChunkedBf16TargetLogprobs {
            targets: targets.clone(),
            chunk: 32,
        };
        let got = hidden
            .as_tensor()
            .apply_op2(weight.as_tensor(), op)
            .unwrap();
        let grads = (&got * &coeffs)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();

        let (hr, wr) = (
            Var::from_tensor(&rounded(hidden.as_tensor())).unwrap(),
            Var::from_tensor(&rounded(weight.as_tensor())).unwrap(),
        );
        let t = Tensor::from_vec(targets, rows, &Device::Cpu).unwrap();
        let want = composed(hr.as_tensor(), wr.as_tensor(), &t).unwrap();
        let want_grads = (&want * &coeffs)
            .unwrap()
            .sum_all()
            .unwrap()
            .backward()
            .unwrap();
        assert!(
            max_abs_diff(&got, &want) < 1e-5,
            "logprobs {}",
            max_abs_diff(&got, &want)
        );
        // The gradients' products take bf16-rounded dlogits, the reference exact ones: the
        // difference is bf16-sized relative to the gradient's scale.
        for (name, var, reference) in [("hidden", &hidden, &hr), ("weight", &weight, &wr)] {
            let g = grads.get(var.as_tensor()).unwrap();
            let w = want_grads.get(reference.as_tensor()).unwrap();
            let scale = max_abs_diff(w, &w.zeros_like().unwrap());
            let diff = max_abs_diff(g, w);
            assert!(diff <= 1e-2 * scale, "d{name}: {diff} at scale {scale}");
        }
    }

    /// The summed head (gradients formed in the forward) against the per-row bf16 head's sum:
    /// several chunks and a ragged last one, a non-unit loss scale, the per-row values beside
    /// the sum, a second backward (recomputed), and no gradient work without tracking.
    #[test]
    fn the_summed_head_matches_the_per_row_head() {
        let (hidden, weight, ids) = bf16_fixture();
        let chunked = |want_grads: bool| Bf16TargetLogprobSum {
            head: ChunkedBf16TargetLogprobs {
                targets: ids.clone(),
                chunk: 32,
            },
            want_grads,
            saved: Mutex::new(None),
            logprobs: std::sync::Arc::new(Mutex::new(None)),
        };
        let op = chunked(true);
        let values_of = op.logprobs.clone();
        let sum = hidden
            .as_tensor()
            .apply_op2(weight.as_tensor(), op)
            .unwrap();
        let scale = -1.0 / 77.0;
        let loss = (&sum * scale).unwrap();
        let grads = loss.backward().unwrap();

        let per_row = hidden
            .as_tensor()
            .apply_op2(
                weight.as_tensor(),
                ChunkedBf16TargetLogprobs {
                    targets: ids.clone(),
                    chunk: 32,
                },
            )
            .unwrap();
        let want_grads = (per_row.sum_all().unwrap() * scale)
            .unwrap()
            .backward()
            .unwrap();
        let want_values: Vec<f32> = per_row.to_vec1().unwrap();
        let got_values = values_of.lock().unwrap().take().unwrap();
        assert_eq!(got_values, want_values, "per-row values");
        let want_sum: f64 = want_values.iter().map(|&v| v as f64).sum();
        let got_sum = sum.to_scalar::<f32>().unwrap() as f64;
        assert!(
            (got_sum - want_sum).abs() <= 1e-6 * want_sum.abs(),
            "{got_sum} against {want_sum}"
        );
        // dlogits are rounded to bf16 before the scale here and after it there: the difference
        // is bf16-sized relative to the gradient's scale.
        for (name, var) in [("hidden", &hidden), ("weight", &weight)] {
            let g = grads.get(var.as_tensor()).unwrap();
            let w = want_grads.get(var.as_tensor()).unwrap();
            let size = max_abs_diff(w, &w.zeros_like().unwrap());
            let diff = max_abs_diff(g, w);
            assert!(size > 0.0, "d{name} is all zeros");
            assert!(diff <= 1e-2 * size, "d{name}: {diff} at scale {size}");
        }
        // A second backward forms the gradients again: the same values.
        let again = loss.backward().unwrap();
        for var in [&hidden, &weight] {
            let first = grads.get(var.as_tensor()).unwrap();
            let second = again.get(var.as_tensor()).unwrap();
            assert_eq!(max_abs_diff(first, second), 0.0);
        }
        // Without tracking, the forward forms no gradients and gives the same sum.
        let untracked = chunked(false);
        let plain = hidden
            .as_tensor()
            .detach()
            .apply_op2(&weight.as_tensor().detach(), untracked)
            .unwrap();
        assert_eq!(plain.to_scalar::<f32>().unwrap(), got_sum as f32);
    }

    /// The public entry point refuses mismatched inputs by name, on every route.
    #[test]
    fn the_summed_head_refuses_bad_targets() {
        let dev = Device::Cpu;
        let hidden = Tensor::zeros((3, 4), DType::F32, &dev).unwrap();
        let weight = Tensor::zeros((5, 4), DType::F32, &dev).unwrap();
        for precision in [Precision::F32, Precision::Bf16] {
            let out_of_range = Tensor::new(&[0u32, 5, 1], &dev).unwrap();
            let err = linear_target_logprob_sum(&hidden, &weight, &out_of_range, precision)
                .unwrap_err()
                .to_string();
            assert!(err.contains("out of range"), "{err}");
            let short = Tensor::new(&[0u32, 1], &dev).unwrap();
            let err = linear_target_logprob_sum(&hidden, &weight, &short, precision)
                .unwrap_err()
                .to_string();
            assert!(err.contains("targets for 3 rows"), "{err}");
        }
    }

    fn composed(hidden: &Tensor, weight: &Tensor, targets: &Tensor) -> Result<Tensor> {
        crate::kernels::target_logprobs(&hidden.matmul(&weight.t()?)?, targets)
    }

    #[test]
    fn values_and_gradients_match_the_composition() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, width, vocab) = (6, 5, 11);
        let hidden = Var::from_vec(values(rows * width, 0.3, 1.5), (rows, width), &dev)?;
        let weight = Var::from_vec(values(vocab * width, 1.1, 0.8), (vocab, width), &dev)?;
        let targets = Tensor::new(&[0u32, 10, 3, 3, 7, 1], &dev)?;
        // A weighted sum so every row's gradient differs (and one row gets none).
        let row_weights = Tensor::new(&[1.0f64, -0.5, 2.0, 0.0, 0.7, 1.3], &dev)?;
        let run = |f: &dyn Fn(&Tensor, &Tensor, &Tensor) -> Result<Tensor>| -> Result<_> {
            let lp = f(hidden.as_tensor(), weight.as_tensor(), &targets)?;
            let grads = (&lp * &row_weights)?.sum_all()?.backward()?;
            let get = |v: &Var| -> Result<Vec<f64>> {
                grads
                    .get(v.as_tensor())
                    .ok_or_else(|| candle_core::Error::Msg("missing gradient".into()))?
                    .flatten_all()?
                    .to_vec1()
            };
            Ok((lp.to_vec1::<f64>()?, get(&hidden)?, get(&weight)?))
        };
        let fused = run(&|h, w, t| linear_target_logprobs(h, w, t))?;
        let reference = run(&composed)?;
        let close = |a: &[f64], b: &[f64], what: &str| {
            assert_eq!(a.len(), b.len());
            for (i, (x, y)) in a.iter().zip(b).enumerate() {
                assert!(
                    (x - y).abs() < 1e-12,
                    "{what}[{i}]: fused {x} vs composed {y}"
                );
            }
        };
        close(&fused.0, &reference.0, "logprobs");
        close(&fused.1, &reference.1, "dhidden");
        close(&fused.2, &reference.2, "dweight");
        // Row 3 has weight 0: its hidden gradient must be exactly zero.
        assert!(fused.1[3 * width..4 * width].iter().all(|&g| g == 0.0));
        Ok(())
    }

    /// The chunked f32/f64 head (ragged chunks of 4 rows) against the unchunked fused op:
    /// log-probabilities and the hidden gradient bit for bit (each row's products are the
    /// same), the weight gradient equal up to the order its chunks are summed.
    #[test]
    fn chunked_head_equals_the_unchunked_one() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, width, vocab) = (11, 6, 23);
        let hidden = Var::from_vec(values(rows * width, 0.4, 1.2), (rows, width), &dev)?;
        let weight = Var::from_vec(values(vocab * width, 1.9, 0.9), (vocab, width), &dev)?;
        let targets: Vec<u32> = (0..rows as u32)
            .map(|i| (i * 7 + 2) % vocab as u32)
            .collect();
        let coeffs = Tensor::from_vec(values(rows, 3.3, 1.0), rows, &dev)?;
        let run = |chunked: bool| -> Result<(Vec<f64>, Vec<f64>, Vec<f64>)> {
            let t = Tensor::from_vec(targets.clone(), rows, &dev)?;
            let lp = if chunked {
                hidden.as_tensor().apply_op2(
                    weight.as_tensor(),
                    ChunkedTargetLogprobs {
                        targets: targets.clone(),
                        chunk: 4,
                    },
                )?
            } else {
                linear_target_logprobs(hidden.as_tensor(), weight.as_tensor(), &t)?
            };
            let grads = (&lp * &coeffs)?.sum_all()?.backward()?;
            let get = |v: &Var| -> Result<Vec<f64>> {
                grads
                    .get(v.as_tensor())
                    .ok_or_else(|| candle_core::Error::Msg("missing gradient".into()))?
                    .flatten_all()?
                    .to_vec1()
            };
            Ok((lp.to_vec1()?, get(&hidden)?, get(&weight)?))
        };
        let (plain, chunked) = (run(false)?, run(true)?);
        assert_eq!(plain.0, chunked.0, "log-probs");
        assert_eq!(plain.1, chunked.1, "hidden gradient");
        for (i, (a, b)) in plain.2.iter().zip(&chunked.2).enumerate() {
            assert!(
                (a - b).abs() <= 1e-14 * (1.0 + a.abs()),
                "dweight[{i}]: {a} vs {b}"
            );
        }
        // The public entry point takes the same op (one chunk at this size).
        let t = Tensor::from_vec(targets.clone(), rows, &dev)?;
        let public = linear_target_logprobs_chunked(
            hidden.as_tensor(),
            weight.as_tensor(),
            &t,
            Precision::F32,
        )?;
        assert_eq!(public.to_vec1::<f64>()?, plain.0);
        Ok(())
    }

    #[test]
    fn gradients_match_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = Var::from_vec(values(4 * 3, 0.9, 1.0), (4, 3), &dev)?;
        let weight = Var::from_vec(values(7 * 3, 2.3, 1.2), (7, 3), &dev)?;
        let targets = Tensor::new(&[6u32, 0, 2, 2], &dev)?;
        let loss = |v: &[Var]| {
            linear_target_logprobs(v[0].as_tensor(), v[1].as_tensor(), &targets)?.sum_all()
        };
        let coords: Vec<(usize, usize)> = (0..12)
            .map(|i| (0, i))
            .chain((0..21).step_by(2).map(|i| (1, i)))
            .collect();
        for p in check_gradients(&[hidden, weight], &loss, &coords, 1e-6)? {
            assert!(p.relative_error(1e-6) < 1e-6, "{p:?}");
        }
        Ok(())
    }

    #[test]
    fn f32_agrees_with_the_composition() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, width, vocab) = (9, 16, 300);
        let to32 = |v: Vec<f64>| v.into_iter().map(|x| x as f32).collect::<Vec<f32>>();
        let hidden = Tensor::from_vec(to32(values(rows * width, 0.1, 1.0)), (rows, width), &dev)?;
        let weight = Tensor::from_vec(to32(values(vocab * width, 0.7, 0.5)), (vocab, width), &dev)?;
        let targets = Tensor::from_vec(
            (0..rows as u32).map(|i| i * 31).collect::<Vec<_>>(),
            rows,
            &dev,
        )?;
        let fused: Vec<f32> = linear_target_logprobs(&hidden, &weight, &targets)?.to_vec1()?;
        let reference: Vec<f32> = composed(&hidden, &weight, &targets)?.to_vec1()?;
        for (a, b) in fused.iter().zip(&reference) {
            assert!((a - b).abs() < 1e-5, "{a} vs {b}");
        }
        Ok(())
    }

    #[test]
    fn a_second_backward_recomputes_the_logits() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = Var::from_vec(values(3 * 4, 0.5, 1.0), (3, 4), &dev)?;
        let weight = Var::from_vec(values(5 * 4, 1.5, 1.0), (5, 4), &dev)?;
        let targets = Tensor::new(&[4u32, 1, 0], &dev)?;
        let loss =
            linear_target_logprobs(hidden.as_tensor(), weight.as_tensor(), &targets)?.sum_all()?;
        let first = loss.backward()?;
        let second = loss.backward()?;
        for var in [&hidden, &weight] {
            let a: Vec<f64> = first
                .get(var.as_tensor())
                .map(|g| g.flatten_all())
                .transpose()?
                .map_or(Ok(vec![]), |g| g.to_vec1())?;
            let b: Vec<f64> = second
                .get(var.as_tensor())
                .map(|g| g.flatten_all())
                .transpose()?
                .map_or(Ok(vec![]), |g| g.to_vec1())?;
            assert!(!a.is_empty());
            assert_eq!(a, b);
        }
        Ok(())
    }

    #[test]
    fn bad_shapes_and_targets_are_rejected() -> Result<()> {
        let dev = Device::Cpu;
        let hidden = Tensor::zeros((2, 3), DType::F32, &dev)?;
        let weight = Tensor::zeros((5, 3), DType::F32, &dev)?;
        let narrow = Tensor::zeros((5, 4), DType::F32, &dev)?;
        assert!(linear_target_logprobs(&hidden, &narrow, &Tensor::new(&[0u32, 1], &dev)?).is_err());
        assert!(linear_target_logprobs(&hidden, &weight, &Tensor::new(&[0u32], &dev)?).is_err());
        assert!(linear_target_logprobs(&hidden, &weight, &Tensor::new(&[0u32, 5], &dev)?).is_err());
        Ok(())
    }
}
