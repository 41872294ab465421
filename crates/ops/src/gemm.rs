//! Matrix products on plain slices under the precision policy, for kernels that run outside
//! candle's graph (the fused decoder block, the bf16 linear layer): `C (+)= op(A) op(B)` with
//! either operand read as stored or transposed, so no transposed copy is ever made.
//!
//! - f32 (and f64) go to the `gemm` crate, candle's own matmul backend, called with strides:
//!   `A^T B` reads A column-wise instead of copying it, and `accumulate` adds into C instead of
//!   writing a fresh buffer and adding it (what candle's backward does for every node).
//! - bf16 (`Precision::Bf16`, f32 data): both operands rounded to bf16, products and sums in
//!   f32. Where a bf16 instruction is faster than f32 FMA (AMX; `vdpbf16ps` on AMD Zen 4/5,
//!   which issues it at twice the f32 FMA rate) the operands are packed for `crate::bf16`'s
//!   kernels. Elsewhere the rounded operands are multiplied by the f32 kernel: a product of two
//!   bf16 values is exact in f32, so the values are the same bf16-policy products, summed in f32
//!   in another order. On Intel CPUs without AMX `vdpbf16ps` issues every other cycle (half
//!   the f32 FMA rate, measured), so this is the faster form there (see [`bf16_route`]).
//!
//! What it is not: a GEMM implementation (the kernels are the `gemm` crate's and `bf16`'s), or
//! a general strided product: C is row-major and contiguous, A and B are contiguous in one of
//! their two orders.
//! Invariants: results do not depend on the number of threads (no kernel splits the
//! contraction), so a run is reproducible whatever pool it runs on.
#![allow(unsafe_code)]

use stoke_types::Precision;

use crate::bf16::{self, PackedA, PackedB};

/// One operand of a product: `rows x cols` as used, stored row-major either as is or
/// transposed (then the slice holds `cols x rows`).
#[derive(Clone, Copy, Debug)]
pub struct Operand<'a, T> {
    pub data: &'a [T],
    pub transposed: bool,
}

impl<'a, T> Operand<'a, T> {
    /// Stored as used.
    pub fn plain(data: &'a [T]) -> Self {
        Operand {
            data,
            transposed: false,
        }
    }

    /// Stored transposed (e.g. a weight `[n, k]` used as the `[k, n]` right operand).
    pub fn t(data: &'a [T]) -> Self {
        Operand {
            data,
            transposed: true,
        }
    }

    /// (row stride, column stride) of the used `rows x cols` matrix.
    fn strides(&self, rows: usize, cols: usize) -> (isize, isize) {
        let _ = rows;
        if self.transposed {
            (1, rows as isize)
        } else {
            (cols as isize, 1)
        }
    }
}

/// How bf16 products run on this CPU (chosen by `crate::dispatch`, the one CPU dispatch point).
pub use crate::dispatch::Bf16Route;

/// The route for bf16 products: `STOKE_BF16_KERNEL=f32` forces the rounded-f32 form, another
/// value of it the packed kernel it names; otherwise AMX if present, AVX512-BF16 on AMD, and
/// the rounded-f32 form everywhere else (`crate::dispatch::bf16_route`).
pub fn bf16_route() -> Bf16Route {
    crate::dispatch::bf16_route()
}

/// The element types the `gemm` crate multiplies.
pub trait Scalar: Copy + Send + Sync + 'static + num_traits::Float {}
impl Scalar for f32 {}
impl Scalar for f64 {}

fn threads() -> gemm::Parallelism {
    match rayon::current_num_threads() {
        0 | 1 => gemm::Parallelism::None,
        n => gemm::Parallelism::Rayon(n),
    }
}

fn check<T>(what: &str, op: &Operand<'_, T>, rows: usize, cols: usize) {
    assert!(
        op.data.len() >= rows * cols,
        "gemm: {what} holds {} values, the product needs {rows} x {cols}",
        op.data.len()
    );
}

/// `C[m, n] = A[m, k] B[k, n]`, or `C += A B` with `accumulate`; C row-major. f32 and f64 in
/// their own precision (`product` applies the bf16 policy on top).
#[allow(clippy::too_many_arguments)]
pub fn product_exact<T: Scalar>(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    c: &mut [T],
    accumulate: bool,
) {
    check("A", &a, m, k);
    check("B", &b, k, n);
    assert!(
        c.len() >= m * n,
        "gemm: C holds {} values, needs {m} x {n}",
        c.len()
    );
    if m == 0 || n == 0 {
        return;
    }
    if k == 0 {
        if !accumulate {
            c[..m * n].iter_mut().for_each(|v| *v = T::zero());
        }
        return;
    }
    // SAFETY: C holds at least m x n values (asserted) and is borrowed mutably, so nothing
    // else reads or writes it during the call.
    unsafe { product_exact_raw(m, n, k, a, b, c.as_mut_ptr(), accumulate) }
}

/// [`product_exact`] into a new `[m, n]` buffer. gemm writes every element, so the buffer is
/// never zero-filled first (a serial pass over the output, with the pool idle).
pub fn product_exact_new<T: Scalar>(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
) -> Vec<T> {
    check("A", &a, m, k);
    check("B", &b, k, n);
    if m == 0 || n == 0 || k == 0 {
        return vec![T::zero(); m * n];
    }
    let mut c = Vec::with_capacity(m * n);
    // SAFETY: `c` has room for m x n values; with `accumulate` false gemm writes each of them
    // without reading any (k > 0 here), so all are initialized when the length is set.
    unsafe {
        product_exact_raw(m, n, k, a, b, c.as_mut_ptr(), false);
        c.set_len(m * n);
    }
    c
}

/// The product of [`product_exact`] into raw C; the operands' sizes checked by the caller,
/// m, n and k > 0.
///
/// # Safety
/// `c` is valid for writes (and, with `accumulate`, reads) of m x n row-major values, and
/// nothing else accesses them during the call.
unsafe fn product_exact_raw<T: Scalar>(
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_, T>,
    b: Operand<'_, T>,
    c: *mut T,
    accumulate: bool,
) {
    let (a_rs, a_cs) = a.strides(m, k);
    let (b_rs, b_cs) = b.strides(k, n);
    // SAFETY: A and B hold at least the m x k and k x n elements the strides address (checked
    // by the callers) and C the m x n (the caller's contract); C does not alias A or B. With
    // `read_dst` false gemm writes C without reading it: `dst = alpha * dst + beta * A B`
    // with alpha ignored; with `accumulate`, alpha = 1 adds to what C holds.
    unsafe {
        gemm::gemm(
            m,
            n,
            k,
            c,
            1,
            n as isize,
            accumulate,
            a.data.as_ptr(),
            a_cs,
            a_rs,
            b.data.as_ptr(),
            b_cs,
            b_rs,
            T::one(),
            T::one(),
            false,
            false,
            false,
            threads(),
        );
    }
}

/// `C[m, rows] = X[m, k] W[rows, k]^T` on the calling thread (no pool), for kernels that split
/// a product's output columns between their own threads: `x` row-major `[m, k]`, `w` the
/// weight rows row-major `[rows, k]`, C at `c` with row stride `c_stride`.
///
/// # Safety
/// `c + i * c_stride + j` is valid for writes for `i < m`, `j < rows`, and nothing else
/// accesses those elements during the call.
pub unsafe fn product_rows_t_on_this_thread(
    m: usize,
    rows: usize,
    k: usize,
    x: &[f32],
    w: &[f32],
    c: *mut f32,
    c_stride: usize,
) {
    assert!(
        x.len() >= m * k && w.len() >= rows * k,
        "gemm: operands too short"
    );
    if m == 0 || rows == 0 {
        return;
    }
    // SAFETY: X holds m x k and W rows x k values (asserted); C's elements are the caller's
    // to write. B = W^T: element (kk, j) at w[j * k + kk], so row stride 1, column stride k.
    unsafe {
        gemm::gemm(
            m,
            rows,
            k,
            c,
            1,
            c_stride as isize,
            false,
            x.as_ptr(),
            1,
            k as isize,
            w.as_ptr(),
            k as isize,
            1,
            1.0f32,
            1.0f32,
            false,
            false,
            false,
            gemm::Parallelism::None,
        );
    }
}

/// `C[m, n] (+)= A[m, k] B[k, n]` on f32 data under `precision` (see the module doc).
#[allow(clippy::too_many_arguments)]
pub fn product(
    precision: Precision,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_, f32>,
    b: Operand<'_, f32>,
    c: &mut [f32],
    accumulate: bool,
) {
    if precision != Precision::Bf16 {
        return product_exact(m, n, k, a, b, c, accumulate);
    }
    check("A", &a, m, k);
    check("B", &b, k, n);
    match bf16_route() {
        Bf16Route::RoundedF32 => {
            let ra = rounded(&a.data[..m * k]);
            let rb = rounded(&b.data[..k * n]);
            product_exact(
                m,
                n,
                k,
                Operand {
                    data: &ra,
                    transposed: a.transposed,
                },
                Operand {
                    data: &rb,
                    transposed: b.transposed,
                },
                c,
                accumulate,
            );
        }
        Bf16Route::Packed(kernel) => {
            let (pa, pb) = packed(m, n, k, &a, &b);
            let c = &mut c[..m * n];
            if accumulate {
                // The kernels add C to the finished sum: the same single rounding as adding
                // a separately computed product.
                bf16::matmul_acc_with(kernel, &pa, &pb, c);
            } else {
                bf16::matmul_with(kernel, &pa, &pb, c);
            }
        }
    }
}

/// `product` with `accumulate` false into a new `[m, n]` buffer. On the packed bf16 route the
/// buffer is not zeroed first where the kernel overwrites every element
/// (`bf16::matmul_new_with`).
pub fn product_new(
    precision: Precision,
    m: usize,
    n: usize,
    k: usize,
    a: Operand<'_, f32>,
    b: Operand<'_, f32>,
) -> Vec<f32> {
    if let (Precision::Bf16, Bf16Route::Packed(kernel)) = (precision, bf16_route()) {
        check("A", &a, m, k);
        check("B", &b, k, n);
        let (pa, pb) = packed(m, n, k, &a, &b);
        return bf16::matmul_new_with(kernel, &pa, &pb);
    }
    let mut c = vec![0.0; m * n];
    product(precision, m, n, k, a, b, &mut c, false);
    c
}

/// The operands of `A [m, k] x B [k, n]` packed for the bf16 kernels.
fn packed(
    m: usize,
    n: usize,
    k: usize,
    a: &Operand<'_, f32>,
    b: &Operand<'_, f32>,
) -> (PackedA, PackedB) {
    let pa = if a.transposed {
        PackedA::from_cols(a.data, k, m)
    } else {
        PackedA::from_rows(a.data, m, k)
    };
    // PackedB holds B^T [n, k]: B stored transposed is exactly that.
    let pb = if b.transposed {
        PackedB::from_rows(b.data, n, k)
    } else {
        PackedB::from_cols(b.data, k, n)
    };
    (pa, pb)
}

/// Every value rounded to the nearest bf16 (as f32).
pub fn rounded(values: &[f32]) -> Vec<f32> {
    use rayon::prelude::*;
    values
        .par_iter()
        .with_min_len(1 << 14)
        .map(|&v| bf16::round_bf16(v))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: f64) -> Vec<f64> {
        (0..n).map(|i| ((i as f64) * 0.731 + seed).sin()).collect()
    }

    /// Reference `A B` with A and B given as used.
    fn naive(m: usize, n: usize, k: usize, a: &[f64], b: &[f64]) -> Vec<f64> {
        let mut c = vec![0.0; m * n];
        for i in 0..m {
            for j in 0..n {
                c[i * n + j] = (0..k).map(|p| a[i * k + p] * b[p * n + j]).sum();
            }
        }
        c
    }

    fn transpose(rows: usize, cols: usize, x: &[f64]) -> Vec<f64> {
        let mut t = vec![0.0; x.len()];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = x[r * cols + c];
            }
        }
        t
    }

    #[test]
    fn every_operand_order_and_accumulation_matches_the_reference() {
        let (m, n, k) = (37, 29, 53);
        let (a, b) = (values(m * k, 0.1), values(k * n, 0.7));
        let expected = naive(m, n, k, &a, &b);
        let (at, bt) = (transpose(m, k, &a), transpose(k, n, &b));
        for (a_op, b_op) in [
            (Operand::plain(&a[..]), Operand::plain(&b[..])),
            (Operand::t(&at[..]), Operand::plain(&b[..])),
            (Operand::plain(&a[..]), Operand::t(&bt[..])),
            (Operand::t(&at[..]), Operand::t(&bt[..])),
        ] {
            let mut c = vec![f64::NAN; m * n];
            product_exact(m, n, k, a_op, b_op, &mut c, false);
            for (x, y) in c.iter().zip(&expected) {
                assert!((x - y).abs() < 1e-12, "{x} vs {y}");
            }
            product_exact(m, n, k, a_op, b_op, &mut c, true);
            for (x, y) in c.iter().zip(&expected) {
                assert!((x - 2.0 * y).abs() < 1e-12, "{x} vs 2 x {y}");
            }
        }
    }

    #[test]
    fn bf16_products_are_products_of_the_rounded_operands() {
        let (m, n, k) = (19, 70, 45);
        let a: Vec<f32> = values(m * k, 0.3).iter().map(|&v| v as f32).collect();
        let b: Vec<f32> = values(n * k, 0.9).iter().map(|&v| v as f32).collect();
        let round =
            |x: &[f32]| -> Vec<f64> { x.iter().map(|&v| bf16::round_bf16(v) as f64).collect() };
        // b is a weight [n, k], used transposed.
        let expected = naive(m, n, k, &round(&a), &transpose(n, k, &round(&b)));
        let mut c = vec![0f32; m * n];
        product(
            Precision::Bf16,
            m,
            n,
            k,
            Operand::plain(&a),
            Operand::t(&b),
            &mut c,
            false,
        );
        for (x, y) in c.iter().zip(&expected) {
            assert!((*x as f64 - y).abs() < 1e-4, "{x} vs {y}");
        }
        // The exact mode does not round.
        let exact = naive(
            m,
            n,
            k,
            &a.iter().map(|&v| v as f64).collect::<Vec<_>>(),
            &transpose(n, k, &b.iter().map(|&v| v as f64).collect::<Vec<_>>()),
        );
        product(
            Precision::F32,
            m,
            n,
            k,
            Operand::plain(&a),
            Operand::t(&b),
            &mut c,
            false,
        );
        for (x, y) in c.iter().zip(&exact) {
            assert!((*x as f64 - y).abs() < 1e-5, "{x} vs {y}");
        }
    }

    #[test]
    fn a_new_output_holds_the_product_written_into_a_zeroed_one() {
        // Exact and bf16 products; partial tiles (rows past MR and MC multiples, columns past a
        // 64-wide panel), an empty output and an empty contraction. The freed NaN buffer of the
        // same size is likely where the new output lands: an element the kernels left
        // unwritten would show.
        for (m, n, k, a_t, b_t) in [
            (37, 29, 13, false, true),
            (64, 70, 1, true, false),
            (200, 70, 33, true, false),
            (7, 130, 64, false, false),
            (3, 0, 4, false, false),
            (5, 6, 0, true, true),
        ] {
            let a: Vec<f32> = values(m * k, 0.1).iter().map(|&v| v as f32).collect();
            let b: Vec<f32> = values(k * n, 0.5).iter().map(|&v| v as f32).collect();
            let op = |data, t| Operand {
                data,
                transposed: t,
            };
            let bits = |c: &[f32]| c.iter().map(|v| v.to_bits()).collect::<Vec<_>>();
            for precision in [Precision::F32, Precision::Bf16] {
                let mut zeroed = vec![0f32; m * n];
                let (a, b) = (op(&a, a_t), op(&b, b_t));
                product(precision, m, n, k, a, b, &mut zeroed, false);
                drop(std::hint::black_box(vec![f32::NAN; m * n]));
                let fresh = if precision == Precision::F32 {
                    product_exact_new(m, n, k, a, b)
                } else {
                    product_new(precision, m, n, k, a, b)
                };
                assert_eq!(bits(&fresh), bits(&zeroed), "{precision:?} [{m}, {n}, {k}]");
            }
        }
    }

    #[test]
    fn results_do_not_depend_on_the_thread_count() {
        let (m, n, k) = (300, 200, 150);
        let a: Vec<f32> = values(m * k, 0.2).iter().map(|&v| v as f32).collect();
        let b: Vec<f32> = values(k * n, 0.4).iter().map(|&v| v as f32).collect();
        let run = |threads: usize| {
            let pool = rayon::ThreadPoolBuilder::new()
                .num_threads(threads)
                .build()
                .expect("pool");
            pool.install(|| {
                let mut c = vec![0f32; m * n];
                product_exact(m, n, k, Operand::t(&a), Operand::plain(&b), &mut c, false);
                c
            })
        };
        // A is read transposed here: m x k from a [k, m] slice.
        assert_eq!(run(1), run(3));
    }
}
