//! The AVX512-BF16 microkernel (`Backend::Avx512Bf16`): `vdpbf16ps` into 6 x 64 f32
//! accumulators in zmm registers, one block of C kept in registers over the whole contraction.
//! `rows` runs it over any number of rows in blocks of `MR`: the GEMM tiles
//! (`dispatch::compute_tile`) and `dispatch::rows_times_panel` (the attention kernels) both call it.
//!
//! What it is not: the dispatch or an availability check (callers assert
//! `Backend::Avx512Bf16.available()`), nor the packs. Invariant: when not accumulating it only
//! stores to C, once per element (what `dispatch::matmul_new_with` relies on).
#![allow(unsafe_code)]

use super::tile::{MR, NR};
use std::arch::x86_64::*;

/// `rows` rows of C from A's rows (`pairs` words each at stride `lda`) and one panel, in
/// microkernel blocks of MR rows.
///
/// # Safety
/// AVX512F and AVX512-BF16 are available; `a` holds (rows - 1) * lda + pairs words; `panel`
/// pairs * NR * 2 bf16; `c` `rows` rows of `ldc` floats with `cols` (<= NR) writable each.
#[allow(clippy::too_many_arguments)]
pub(super) unsafe fn rows(
    pairs: usize,
    lda: usize,
    a: &[u32],
    rows: usize,
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    cols: usize,
    acc: bool,
) {
    let mut r = 0;
    while r < rows {
        let mr = (rows - r).min(MR);
        let a_rows = &a[r * lda..];
        // SAFETY: rows r..r + mr of A and C lie inside the extents the caller guarantees.
        unsafe {
            let at = c.add(r * ldc);
            match mr {
                6 => kernel::<6>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                5 => kernel::<5>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                4 => kernel::<4>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                3 => kernel::<3>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                2 => kernel::<2>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                _ => kernel::<1>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
            }
        }
        r += mr;
    }
}

/// `C[0..R, 0..cols] = A[0..R] . panel`, R rows of A pairs (`kp` each, row `r` at
/// `r * lda`).
///
/// # Safety
/// AVX512F and AVX512-BF16 are available; `a` holds (R - 1) * lda + kp pairs; `panel`
/// kp * NR * 2 bf16; `c` R rows of `ldc` floats with `cols` (<= NR) writable each.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn kernel<const R: usize>(
    kp: usize,
    lda: usize,
    a: &[u32],
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    debug_assert!(a.len() >= (R - 1) * lda + kp && panel.len() >= kp * NR * 2 && cols <= NR);
    let mut acc = [[_mm512_setzero_ps(); 4]; R];
    let ap = a.as_ptr();
    let bp = panel.as_ptr();
    for j in 0..kp {
        // SAFETY: j < kp, so the four 64-byte loads stay inside panel row j.
        let b: [__m512bh; 4] = unsafe {
            let row = bp.add(j * NR * 2);
            [
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row.cast())),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row.add(32).cast())),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row.add(64).cast())),
                std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row.add(96).cast())),
            ]
        };
        for (r, acc_row) in acc.iter_mut().enumerate() {
            // SAFETY: r < R and j < kp index inside `a`.
            let pair = unsafe { *ap.add(r * lda + j) } as i32;
            // SAFETY: both are 64-byte vector types; the bits are 16 bf16 pairs.
            let av = unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair)) };
            for q in 0..4 {
                acc_row[q] = _mm512_dpbf16_ps(acc_row[q], av, b[q]);
            }
        }
    }
    for (r, acc_row) in acc.iter().enumerate() {
        // SAFETY: row r of C has `cols` writable floats.
        let row = unsafe { c.add(r * ldc) };
        for (q, v) in acc_row.iter().enumerate() {
            let first = q * 16;
            if first >= cols {
                break;
            }
            let valid = (cols - first).min(16);
            let mask: __mmask16 = if valid == 16 {
                0xffff
            } else {
                (1u16 << valid) - 1
            };
            // SAFETY: the masked lanes are inside row r's `cols` floats.
            unsafe {
                let v = if accumulate {
                    _mm512_add_ps(*v, _mm512_maskz_loadu_ps(mask, row.add(first)))
                } else {
                    *v
                };
                _mm512_mask_storeu_ps(row.add(first), mask, v)
            };
        }
    }
}
