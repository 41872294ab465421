//! Logit distillation: TRL's generalized Jensen-Shannon divergence between a student's and a
//! teacher's next-token distributions, per row, with a closed-form backward to the student's
//! logits.
//!
//! What it is: for logits rows `z` (student) and `y` (teacher), at temperature `T`,
//! `s = log_softmax(z / T)`, `t = log_softmax(y / T)`, and with `beta` in [0, 1]:
//! - `beta = 0`: `KL(teacher || student) = sum p_t (t - s)` (forward KL);
//! - `beta = 1`: `KL(student || teacher) = sum p_s (s - t)` (reverse KL);
//! - otherwise, with the mixture `m = log((1 - beta) p_s + beta p_t)`:
//!   `beta KL(teacher || m) + (1 - beta) KL(student || m)` (GKD, Agarwal et al. 2023, Eq. 1).
//!
//! This is `GKDTrainer.generalized_jsd_loss` of TRL before its masking and reduction, which
//! [`generalized_jsd_loss`] adds (masked positions summed, divided by the caller's count).
//! The two end points are TRL's special cases, not limits of the mixture formula (which is 0
//! at both).
//!
//! Backward, with `u = z / T` and `g = dL/ds`: `dL/dz = (g - p_s sum(g)) / T`, where
//! `g = -p_t` (forward KL), `g = p_s (s - t + 1)` (reverse KL), and for the mixture
//! `g = (1 - beta) p_s (s - m)` (the terms through `m` cancel). The teacher gets no gradient.
//!
//! [`sparse_generalized_jsd`] is the same divergence on a teacher's top-k log-probs only (what a
//! remote teacher returns): the support is the teacher's k ids plus a "rest of mass" bucket
//! `log(1 - sum of the k probabilities)` on each side (TRL's server distillation,
//! `_add_tail_bucket` and `_jsd_divergence` with a support mask). It is built from candle's
//! differentiable ops (k + 1 entries per row; only the student's log-softmax is [N, V]).

use candle_core::{CpuStorage, CustomOp2, CustomOp3, Layout, Result, Shape, Tensor};
use num_traits::Float;
use rayon::prelude::*;

use crate::kernels::{Real, contiguous_slice};

/// Which divergence, from TRL's `beta`.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Divergence {
    Forward,
    Reverse,
    Mixture { beta: f64 },
}

impl Divergence {
    fn new(beta: f64) -> Result<Divergence> {
        if !(0.0..=1.0).contains(&beta) {
            candle_core::bail!("generalized JSD: beta must be in [0, 1], got {beta}")
        }
        Ok(if beta == 0.0 {
            Divergence::Forward
        } else if beta == 1.0 {
            Divergence::Reverse
        } else {
            Divergence::Mixture { beta }
        })
    }
}

/// Per-row generalized JSD of `student` [N, V] against `teacher` [N, V] (same dtype, f32 or
/// f64) at `temperature`; returns [N]. Differentiable in the student only.
pub fn generalized_jsd(
    student: &Tensor,
    teacher: &Tensor,
    beta: f64,
    temperature: f64,
) -> Result<Tensor> {
    let divergence = Divergence::new(beta)?;
    if !(temperature > 0.0 && temperature.is_finite()) {
        candle_core::bail!("generalized JSD: temperature must be positive, got {temperature}")
    }
    let (rows, vocab) = student.dims2()?;
    if teacher.dims2()? != (rows, vocab) {
        candle_core::bail!(
            "generalized JSD: student logits {:?} but teacher logits {:?}",
            student.dims(),
            teacher.dims()
        )
    }
    let teacher = teacher.detach().to_dtype(student.dtype())?.contiguous()?;
    student.contiguous()?.apply_op2(
        &teacher,
        Jsd {
            divergence,
            temperature,
        },
    )
}

/// TRL's `generalized_jsd_loss` with labels: the per-row divergence summed over rows where
/// `mask` is non-zero (weighted by it), divided by `denominator` (TRL: the number of unmasked
/// tokens, or `num_items_in_batch` under gradient accumulation). Returns a scalar.
pub fn generalized_jsd_loss(
    student: &Tensor,
    teacher: &Tensor,
    mask: &Tensor,
    beta: f64,
    temperature: f64,
    denominator: f64,
) -> Result<Tensor> {
    let per_row = generalized_jsd(student, teacher, beta, temperature)?;
    let mask = mask.to_dtype(per_row.dtype())?;
    (per_row * mask)?.sum_all()? / denominator.max(1.0)
}

struct Jsd {
    divergence: Divergence,
    temperature: f64,
}

/// One row's log-probabilities at temperature `inv_t = 1 / T`.
fn log_softmax_row<T: Real>(row: &[T], inv_t: T, out: &mut [T]) {
    let max = row
        .iter()
        .fold(T::neg_infinity(), |m, &v| Float::max(m, v * inv_t));
    let mut sum = T::zero();
    for (o, &v) in out.iter_mut().zip(row) {
        *o = v * inv_t - max;
        sum += o.exp();
    }
    let lse = sum.ln();
    for o in out.iter_mut() {
        *o -= lse;
    }
}

/// `log(a e^x + b e^y)` for log-weights `la = log a`, `lb = log b`.
fn log_mix<T: Real>(x: T, la: T, y: T, lb: T) -> T {
    let (p, q) = (x + la, y + lb);
    let hi = Float::max(p, q);
    if hi == T::neg_infinity() {
        return hi;
    }
    hi + ((p - hi).exp() + (q - hi).exp()).ln()
}

/// `p ln-term`, with `0 * anything = 0` (TRL's `kl_div` gives 0 where the target mass is 0).
fn weighted<T: Real>(log_p: T, diff: T) -> T {
    let p = log_p.exp();
    if p == T::zero() { T::zero() } else { p * diff }
}

fn forward_rows<T: Real>(
    student: &[T],
    teacher: &[T],
    width: usize,
    divergence: Divergence,
    temperature: f64,
) -> Vec<T> {
    let inv_t = T::from(1.0 / temperature).unwrap_or_else(T::one);
    student
        .par_chunks(width)
        .zip(teacher.par_chunks(width))
        .map_init(
            || (vec![T::zero(); width], vec![T::zero(); width]),
            |(s, t), (zs, zt)| {
                log_softmax_row(zs, inv_t, s);
                log_softmax_row(zt, inv_t, t);
                row_divergence(s, t, divergence)
            },
        )
        .collect()
}

fn row_divergence<T: Real>(s: &[T], t: &[T], divergence: Divergence) -> T {
    let mut total = T::zero();
    match divergence {
        Divergence::Forward => {
            for (&sv, &tv) in s.iter().zip(t) {
                total += weighted(tv, tv - sv);
            }
        }
        Divergence::Reverse => {
            for (&sv, &tv) in s.iter().zip(t) {
                total += weighted(sv, sv - tv);
            }
        }
        Divergence::Mixture { beta } => {
            let b = T::from(beta).unwrap_or_else(T::zero);
            let (la, lb) = (
                T::from((-beta).ln_1p()).unwrap_or_else(T::zero),
                T::from(beta.ln()).unwrap_or_else(T::zero),
            );
            for (&sv, &tv) in s.iter().zip(t) {
                let m = log_mix(sv, la, tv, lb);
                total += b * weighted(tv, tv - m) + (T::one() - b) * weighted(sv, sv - m);
            }
        }
    }
    total
}

/// `dL/ds` at one entry, from the student's and the teacher's log-probabilities there:
/// `-p_t` (forward KL), `p_s (s - t + 1)` (reverse KL), `(1 - beta) p_s (s - m)` (mixture); 0
/// where the student's probability is 0 (its terms vanish).
fn logprob_gradient<T: Real>(s: T, t: T, divergence: Divergence, mix: (T, T, T)) -> T {
    let ps = s.exp();
    match divergence {
        Divergence::Forward => -t.exp(),
        _ if ps == T::zero() => T::zero(),
        Divergence::Reverse => ps * (s - t + T::one()),
        Divergence::Mixture { .. } => {
            let (log_one_minus, log_beta, one_minus) = mix;
            one_minus * ps * (s - log_mix(s, log_one_minus, t, log_beta))
        }
    }
}

fn backward_rows<T: Real>(
    student: &[T],
    teacher: &[T],
    grad: &[T],
    width: usize,
    divergence: Divergence,
    temperature: f64,
) -> Vec<T> {
    let inv_t = T::from(1.0 / temperature).unwrap_or_else(T::one);
    // The mixture's log(1 - beta), log(beta) and 1 - beta, once per call.
    let beta = match divergence {
        Divergence::Mixture { beta } => beta,
        _ => 0.5,
    };
    let cast = |v: f64| T::from(v).unwrap_or_else(T::zero);
    let mix = (cast((-beta).ln_1p()), cast(beta.ln()), cast(1.0 - beta));
    let mut out = vec![T::zero(); student.len()];
    out.par_chunks_mut(width)
        .zip(student.par_chunks(width).zip(teacher.par_chunks(width)))
        .zip(grad.par_iter())
        .for_each_init(
            || vec![T::zero(); width],
            |t, ((dz, (zs, zt)), &gr)| {
                // dz holds s, then the gradient.
                log_softmax_row(zs, inv_t, dz);
                log_softmax_row(zt, inv_t, t);
                // t becomes g = dL/ds (read before it is overwritten), then the gradient.
                let mut g_sum = T::zero();
                for (&sv, tg) in dz.iter().zip(t.iter_mut()) {
                    *tg = logprob_gradient(sv, *tg, divergence, mix);
                    g_sum += *tg;
                }
                for (d, &g) in dz.iter_mut().zip(t.iter()) {
                    *d = (g - d.exp() * g_sum) * inv_t * gr;
                }
            },
        );
    out
}

impl CustomOp2 for Jsd {
    fn name(&self) -> &'static str {
        "stoke-generalized-jsd"
    }

    fn cpu_fwd(
        &self,
        s1: &CpuStorage,
        l1: &Layout,
        s2: &CpuStorage,
        l2: &Layout,
    ) -> Result<(CpuStorage, Shape)> {
        let width = l1.shape().dims().last().copied().unwrap_or(1).max(1);
        let rows = l1.shape().elem_count() / width;
        let name = self.name();
        let out = match (s1, s2) {
            (CpuStorage::F32(a), CpuStorage::F32(b)) => CpuStorage::F32(forward_rows(
                contiguous_slice(a, l1, name)?,
                contiguous_slice(b, l2, name)?,
                width,
                self.divergence,
                self.temperature,
            )),
            (CpuStorage::F64(a), CpuStorage::F64(b)) => CpuStorage::F64(forward_rows(
                contiguous_slice(a, l1, name)?,
                contiguous_slice(b, l2, name)?,
                width,
                self.divergence,
                self.temperature,
            )),
            _ => candle_core::bail!("{name}: only f32 and f64 (same dtype)"),
        };
        Ok((out, Shape::from(rows)))
    }

    fn bwd(
        &self,
        student: &Tensor,
        teacher: &Tensor,
        _res: &Tensor,
        grad_res: &Tensor,
    ) -> Result<(Option<Tensor>, Option<Tensor>)> {
        let grad = student.contiguous()?.apply_op3_no_bwd(
            &teacher.contiguous()?,
            &grad_res.contiguous()?,
            &JsdBackward {
                divergence: self.divergence,
                temperature: self.temperature,
            },
        )?;
        Ok((Some(grad), None))
    }
}

struct JsdBackward {
    divergence: Divergence,
    temperature: f64,
}

impl CustomOp3 for JsdBackward {
    fn name(&self) -> &'static str {
        "stoke-generalized-jsd-backward"
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
        let width = l1.shape().dims().last().copied().unwrap_or(1).max(1);
        let name = self.name();
        if l3.shape().elem_count() * width != l1.shape().elem_count() {
            candle_core::bail!("{name}: one gradient per row expected")
        }
        let out = match (s1, s2, s3) {
            (CpuStorage::F32(a), CpuStorage::F32(b), CpuStorage::F32(g)) => {
                CpuStorage::F32(backward_rows(
                    contiguous_slice(a, l1, name)?,
                    contiguous_slice(b, l2, name)?,
                    contiguous_slice(g, l3, name)?,
                    width,
                    self.divergence,
                    self.temperature,
                ))
            }
            (CpuStorage::F64(a), CpuStorage::F64(b), CpuStorage::F64(g)) => {
                CpuStorage::F64(backward_rows(
                    contiguous_slice(a, l1, name)?,
                    contiguous_slice(b, l2, name)?,
                    contiguous_slice(g, l3, name)?,
                    width,
                    self.divergence,
                    self.temperature,
                ))
            }
            _ => candle_core::bail!("{name}: only f32 and f64 (same dtype)"),
        };
        Ok((out, l1.shape().clone()))
    }
}

/// The generalized JSD on a teacher's top-k support plus a tail bucket, per row: `student`
/// logits [N, V] at `temperature`; `teacher_ids` [N, K] (u32) and `teacher_logprobs` [N, K]
/// (the teacher's log-probs of those ids; `-inf` marks an entry the teacher did not return).
/// On each side the k gathered log-probs get a (K+1)-th entry `log(1 - sum exp)` (the sum
/// clamped to `exp(-1e-7)`, as TRL), and the divergence of the module doc is summed over the
/// valid entries and the tail. Returns [N], differentiable in the student only.
pub fn sparse_generalized_jsd(
    student: &Tensor,
    teacher_ids: &Tensor,
    teacher_logprobs: &Tensor,
    beta: f64,
    temperature: f64,
) -> Result<Tensor> {
    let divergence = Divergence::new(beta)?;
    if !(temperature > 0.0 && temperature.is_finite()) {
        candle_core::bail!(
            "sparse generalized JSD: temperature must be positive, got {temperature}"
        )
    }
    let (rows, _) = student.dims2()?;
    let (id_rows, k) = teacher_ids.dims2()?;
    if id_rows != rows || teacher_logprobs.dims2()? != (rows, k) || k == 0 {
        candle_core::bail!(
            "sparse generalized JSD: student logits {:?}, teacher ids {:?}, teacher log-probs {:?}",
            student.dims(),
            teacher_ids.dims(),
            teacher_logprobs.dims()
        )
    }
    let dtype = student.dtype();
    let teacher_logprobs = teacher_logprobs.detach().to_dtype(dtype)?;
    // Valid entries: finite teacher log-probs. Invalid ones get log-prob 0 and weight 0.
    let valid = teacher_logprobs
        .ge(&Tensor::full(-1e30f64, (rows, k), student.device())?.to_dtype(dtype)?)?
        .to_dtype(dtype)?;
    let zeros = valid.zeros_like()?;
    let student_lp = candle_nn_log_softmax(&(student / temperature)?)?;
    let student_top = student_lp.gather(&teacher_ids.contiguous()?, 1)?;
    let mask = valid.ne(0.0)?;
    let student_top = mask.where_cond(&student_top, &zeros)?;
    let teacher_top = mask.where_cond(&teacher_logprobs, &zeros)?;
    let with_tail = |lp: &Tensor| -> Result<Tensor> {
        let mass = (lp.exp()? * &valid)?.sum_keepdim(1)?;
        let mass = mass.clamp(0.0, (-1e-7f64).exp())?;
        let tail = (mass.affine(-1.0, 1.0)?).log()?;
        Tensor::cat(&[lp, &tail], 1)
    };
    let s = with_tail(&student_top)?;
    let t = with_tail(&teacher_top)?;
    let weight = Tensor::cat(
        &[&valid, &Tensor::ones((rows, 1), dtype, student.device())?],
        1,
    )?;
    let ps = (s.exp()? * &weight)?;
    let pt = (t.exp()? * &weight)?;
    let per_entry = match divergence {
        Divergence::Forward => (&pt * (&t - &s)?)?,
        Divergence::Reverse => (&ps * (&s - &t)?)?,
        Divergence::Mixture { beta } => {
            let tiny = match dtype {
                candle_core::DType::F64 => f64::MIN_POSITIVE,
                _ => f64::from(f32::MIN_POSITIVE),
            };
            let m = ((&ps * (1.0 - beta))? + (&pt * beta)?)?
                .clamp(tiny, f64::MAX)?
                .log()?;
            let teacher_side = (&pt * (&t - &m)?)?;
            let student_side = (&ps * (&s - &m)?)?;
            ((teacher_side * beta)? + (student_side * (1.0 - beta))?)?
        }
    };
    per_entry.sum(1)
}

/// `log_softmax` over the last dimension from differentiable ops (max-subtracted).
fn candle_nn_log_softmax(x: &Tensor) -> Result<Tensor> {
    let max = x.detach().max_keepdim(1)?;
    let shifted = x.broadcast_sub(&max)?;
    let lse = shifted.exp()?.sum_keepdim(1)?.log()?;
    shifted.broadcast_sub(&lse)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gradcheck::check_gradients;
    use candle_core::{DType, Device, Var};

    fn logits(rows: usize, vocab: usize, seed: u64) -> Vec<f64> {
        let mut state = seed.wrapping_mul(6364136223846793005).wrapping_add(1);
        (0..rows * vocab)
            .map(|_| {
                state = state
                    .wrapping_mul(6364136223846793005)
                    .wrapping_add(1442695040888963407);
                ((state >> 11) as f64 / (1u64 << 53) as f64) * 6.0 - 3.0
            })
            .collect()
    }

    /// The definition with plain loops in f64.
    fn reference(z: &[f64], y: &[f64], beta: f64, temp: f64) -> f64 {
        let ls = |row: &[f64]| {
            let u: Vec<f64> = row.iter().map(|v| v / temp).collect();
            let max = u.iter().cloned().fold(f64::NEG_INFINITY, f64::max);
            let lse = max + u.iter().map(|v| (v - max).exp()).sum::<f64>().ln();
            u.iter().map(|v| v - lse).collect::<Vec<_>>()
        };
        let (s, t) = (ls(z), ls(y));
        let kl =
            |p: &[f64], q: &[f64]| -> f64 { p.iter().zip(q).map(|(a, b)| a.exp() * (a - b)).sum() };
        if beta == 0.0 {
            kl(&t, &s)
        } else if beta == 1.0 {
            kl(&s, &t)
        } else {
            let m: Vec<f64> = s
                .iter()
                .zip(&t)
                .map(|(a, b)| ((1.0 - beta) * a.exp() + beta * b.exp()).ln())
                .collect();
            beta * kl(&t, &m) + (1.0 - beta) * kl(&s, &m)
        }
    }

    #[test]
    fn rows_match_the_definition_and_the_gradient_matches_finite_differences() -> Result<()> {
        let dev = Device::Cpu;
        let (rows, vocab) = (3, 7);
        let z = logits(rows, vocab, 1);
        let y = logits(rows, vocab, 2);
        for &beta in &[0.0, 0.3, 0.5, 1.0] {
            for &temp in &[1.0, 2.0] {
                let student = Tensor::from_vec(z.clone(), (rows, vocab), &dev)?;
                let teacher = Tensor::from_vec(y.clone(), (rows, vocab), &dev)?;
                let got: Vec<f64> = generalized_jsd(&student, &teacher, beta, temp)?.to_vec1()?;
                for r in 0..rows {
                    let want = reference(
                        &z[r * vocab..(r + 1) * vocab],
                        &y[r * vocab..(r + 1) * vocab],
                        beta,
                        temp,
                    );
                    assert!(
                        (got[r] - want).abs() < 1e-12,
                        "beta {beta} T {temp}: {} vs {want}",
                        got[r]
                    );
                    assert!(got[r] >= -1e-12);
                }
                let var = Var::from_tensor(&student)?;
                let mask = Tensor::new(&[1.0f64, 0.0, 2.0], &dev)?;
                let points = check_gradients(
                    &[var],
                    &|vars| {
                        generalized_jsd_loss(vars[0].as_tensor(), &teacher, &mask, beta, temp, 3.0)
                    },
                    &(0..rows * vocab).map(|i| (0, i)).collect::<Vec<_>>(),
                    1e-5,
                )?;
                for p in points {
                    assert!(
                        (p.analytic - p.numeric).abs() < 1e-8,
                        "beta {beta} T {temp}: {p:?}"
                    );
                }
            }
        }
        Ok(())
    }

    #[test]
    fn the_teacher_gets_no_gradient_and_bad_settings_are_errors() -> Result<()> {
        let dev = Device::Cpu;
        let student = Var::from_tensor(&Tensor::from_vec(logits(2, 5, 3), (2, 5), &dev)?)?;
        let teacher = Var::from_tensor(&Tensor::from_vec(logits(2, 5, 4), (2, 5), &dev)?)?;
        let loss =
            generalized_jsd(student.as_tensor(), teacher.as_tensor(), 0.5, 1.0)?.sum_all()?;
        let grads = loss.backward()?;
        assert!(grads.get(student.as_tensor()).is_some());
        assert!(grads.get(teacher.as_tensor()).is_none());
        assert!(generalized_jsd(student.as_tensor(), teacher.as_tensor(), 1.5, 1.0).is_err());
        assert!(generalized_jsd(student.as_tensor(), teacher.as_tensor(), 0.5, 0.0).is_err());
        let narrow = Tensor::zeros((2, 4), DType::F64, &dev)?;
        assert!(generalized_jsd(student.as_tensor(), &narrow, 0.5, 1.0).is_err());
        Ok(())
    }
}
