//! The AVX-512 decode kernels (`Kernel::Avx512`, `Kernel::Avx512Bf16`): the FMA tiles of
//! `tiles.rs` in 16 lanes, the `vdpbf16ps` tiles for bf16 weights (AVX512-BF16 only), and the
//! attention's `dot` / `axpy`.
//!
//! What it is not: the kernel choice (`crate::dispatch`) nor the layouts (`super`). Invariant:
//! every output is its own weight row's sum, in the same order whatever the tile.
//!
//! A tile's R weight rows are R long streams, as in the AVX2 kernels (see `super::avx2`'s
//! module doc): tile row r walks the r-th of R equal parts of the row range, prefetching ahead
//! in its own stream. How, when the weights stream from memory, is chosen per CPU
//! (`dispatch::decode_prefetch`: non-temporally a short way ahead on AMD, into L2 4 KiB ahead
//! on Intel); cached weights prefetch into L1 at `prefetch_ahead`. Measured on an AMD EPYC (Zen 4, AVX-512), SmolLM2-135M's bf16 weights, 2
//! threads: batch-1 decoding 76 tokens/s with neighbouring rows and T0 prefetches two tiles
//! ahead, see bench/README.md for the figure with streams. Results are those of
//! neighbouring rows bit for bit: every output is its own row's sum, in the same order.
//!
//! Except at batch 1 in the `vdpbf16ps` kernel: there a tile is one row and the rows are read
//! in order, a single stream per thread. With the weights on 2 MiB pages (`crate::pages`,
//! where `pack_weights` puts them) one stream a thread reads as fast as a plain read loop;
//! eight streams fell about 15% short. Measured on the same Zen 4, SmolLM2-135M's 269 MB of
//! bf16 weights in the decode step's phases, alternated in one process: 43 against 37 GB/s
//! (a plain read loop 41), and on 4 KiB pages the two within noise of each other (30-32).
#![allow(unsafe_code)]
// Register tiles are fixed-size arrays indexed by row and input: loops over indices read best.
#![allow(clippy::needless_range_loop)]

use super::tiles::{PrefetchHint, prefetch_plan};
use super::{Inputs, Weights, prefetch};
use std::arch::x86_64::*;
use std::ops::Range;

/// Input rows per kernel call.
const MAX_BATCH: usize = 8;
/// How far ahead each tile row prefetches in its own stream, in bytes: closer at batch 1
/// (eight streams a tile) than at larger batches (two to six). Measured on a Zen 4 at
/// SmolLM2-135M's shapes, 2 threads, medians of 5-7 runs: batch 1 decoded at 152 tokens/s
/// 256 bytes ahead, 134 at 512 and 115 at 1 KiB; batch 8 varied too much between runs
/// (400-500) to tell 640 bytes from 1 KiB.
const fn prefetch_ahead(nb: usize) -> usize {
    if nb == 1 { 256 } else { 1024 }
}

/// `dp`: bf16 weights run the `vdpbf16ps` tiles on the inputs' pairs.
///
/// # Safety
/// AVX-512F is available, and AVX512-BF16 if `dp`; bounds as in `super::matvec_raw`.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn matvec(
    w: &Weights,
    x: &Inputs,
    inputs: Range<usize>,
    rows: Range<usize>,
    out: *mut f32,
    out_stride: usize,
    dp: bool,
) {
    let mut b0 = inputs.start;
    while b0 < inputs.end {
        let nb = (inputs.end - b0).min(MAX_BATCH);
        let plan = prefetch_plan(x, prefetch_ahead(nb));
        // SAFETY: rows b0..b0 + nb of x and of the output exist (see the caller).
        unsafe {
            let xp = x.data.as_ptr().add(b0 * x.stride);
            let op = out.add(b0 * out_stride);
            match *w {
                Weights::Bf16 { data, stride, .. } if dp => bf16_dp_rows(
                    data.as_ptr(),
                    stride,
                    x.pairs.as_ptr().add(b0 * x.stride / 2),
                    x.stride / 2,
                    (nb, x.prefetch().dp_rows_at_8),
                    rows.clone(),
                    op,
                    out_stride,
                    plan,
                ),
                Weights::Bf16 { data, stride, .. } => bf16_rows(
                    data.as_ptr(),
                    stride,
                    xp,
                    x.stride,
                    nb,
                    rows.clone(),
                    op,
                    out_stride,
                    plan,
                ),
                Weights::F32 { data, cols, .. } => f32_rows(
                    data.as_ptr(),
                    cols,
                    xp,
                    x.stride,
                    nb,
                    rows.clone(),
                    op,
                    out_stride,
                    plan,
                ),
            }
        }
        b0 += nb;
    }
}

/// # Safety
/// As `bf16_rows`, with AVX512-BF16, and `x` the inputs' pairs (`x_stride` words a row).
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_dp_rows(
    w: *const u32,
    stride: usize,
    x: *const u32,
    x_stride: usize,
    (nb, rows_at_8): (usize, usize),
    rows: Range<usize>,
    out: *mut f32,
    out_stride: usize,
    (hint, ahead): (PrefetchHint, usize),
) {
    let args = (w, stride, x, x_stride, rows, out, out_stride, hint, ahead);
    // R x NB accumulators, R weight vectors, 1 input vector. At batch 1 a tile is one row:
    // the rows are read in order, one stream (see the module doc).
    // SAFETY: forwarded bounds.
    unsafe {
        match nb {
            1 => tiles!(bf16_dp_tile, 1, 1, args),
            2 => tiles!(bf16_dp_tile, 8, 2, args),
            3 => tiles!(bf16_dp_tile, 6, 3, args),
            4 => tiles!(bf16_dp_tile, 5, 4, args),
            5 => tiles!(bf16_dp_tile, 4, 5, args),
            6 => tiles!(bf16_dp_tile, 4, 6, args),
            7 => tiles!(bf16_dp_tile, 3, 7, args),
            _ if rows_at_8 == 2 => {
                tiles!(bf16_dp_tile, 2, 8, args)
            }
            _ => tiles!(bf16_dp_tile, 3, 8, args),
        }
    }
}

/// Rows `j + r * gap` (r < R) of bf16 pair weights against `NB` input rows of bf16 pairs,
/// by `vdpbf16ps` (per lane: the odd product, then the even one, added to the f32
/// accumulator; bf16 x bf16 products are exact in f32); output `(b, r)` at
/// `out + b * out_stride + r * gap`.
///
/// # Safety
/// AVX512-BF16 is available; the rows exist (`stride` pair words each, a multiple of 16),
/// the inputs hold `stride` pair words per row (`x_stride`), and `out` has room for these
/// outputs.
#[allow(clippy::too_many_arguments)]
#[inline]
#[target_feature(enable = "avx512f,avx512bf16")]
unsafe fn bf16_dp_tile<const R: usize, const NB: usize, const HINT: u8>(
    w: *const u32,
    stride: usize,
    j: usize,
    gap: usize,
    x: *const u32,
    x_stride: usize,
    out: *mut f32,
    out_stride: usize,
    ahead: usize,
) {
    let mut acc = [[_mm512_setzero_ps(); NB]; R];
    let blocks = stride / 16;
    for block in 0..blocks {
        let mut wv = [_mm512_setzero_si512(); R];
        for r in 0..R {
            let at = (j + r * gap) * stride + block * 16;
            // SAFETY: pair words block * 16 .. + 16 of row j + r * gap exist.
            wv[r] = unsafe { _mm512_loadu_si512(w.add(at) as *const __m512i) };
            // `ahead` words on in this row's stream: a hint, valid for any address.
            prefetch::<HINT, _>(w.wrapping_add(at + ahead) as *const i8);
        }
        for b in 0..NB {
            // SAFETY: pair words block * 16 .. + 16 of input row b exist.
            let xv = unsafe { _mm512_loadu_si512(x.add(b * x_stride + block * 16).cast()) };
            // SAFETY: both are 64-byte vector types; the bits are 16 bf16 pairs.
            let xv = unsafe { std::mem::transmute::<__m512i, __m512bh>(xv) };
            for r in 0..R {
                // SAFETY: as above.
                let wr = unsafe { std::mem::transmute::<__m512i, __m512bh>(wv[r]) };
                acc[r][b] = _mm512_dpbf16_ps(acc[r][b], wr, xv);
            }
        }
    }
    for r in 0..R {
        for b in 0..NB {
            // SAFETY: (b, r) is inside the output tile.
            unsafe { *out.add(b * out_stride + r * gap) = _mm512_reduce_add_ps(acc[r][b]) };
        }
    }
}

/// # Safety
/// AVX-512F is available; `a.len() == b.len()`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let body = n - n % 16;
    let mut acc = _mm512_setzero_ps();
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= n for both slices.
        unsafe {
            acc = _mm512_fmadd_ps(
                _mm512_loadu_ps(a.as_ptr().add(i)),
                _mm512_loadu_ps(b.as_ptr().add(i)),
                acc,
            );
        }
        i += 16;
    }
    let mut sum = _mm512_reduce_add_ps(acc);
    for k in body..n {
        sum += a[k] * b[k];
    }
    sum
}

/// # Safety
/// AVX-512F is available; `y.len() == x.len()`.
#[target_feature(enable = "avx512f")]
pub(super) unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len();
    let body = n - n % 16;
    let a = _mm512_set1_ps(alpha);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= n for both slices.
        unsafe {
            let p = y.as_mut_ptr().add(i);
            _mm512_storeu_ps(
                p,
                _mm512_fmadd_ps(a, _mm512_loadu_ps(x.as_ptr().add(i)), _mm512_loadu_ps(p)),
            );
        }
        i += 16;
    }
    for k in body..n {
        y[k] += alpha * x[k];
    }
}

// Tile shapes per batch size 1..8 (R weight rows a tile). bf16: R x NB accumulators, 2R weight
// vectors and 2 input vectors fit 32 registers. f32: R x NB accumulators, R weight vectors, 1
// input vector.
fma_tiles! {
    features: "avx512f",
    lanes: 16,
    bf16_rows: [8, 6, 4, 4, 2, 2, 2, 2],
    f32_rows: [8, 6, 4, 4, 2, 2, 2, 2],
    zero: _mm512_setzero_ps,
    load: _mm512_loadu_ps,
    load_words: _mm512_loadu_si512,
    splat_words: _mm512_set1_epi32,
    shift_words: _mm512_slli_epi32,
    and_words: _mm512_and_si512,
    words_as_f32: _mm512_castsi512_ps,
    fmadd: _mm512_fmadd_ps,
    sum: _mm512_reduce_add_ps,
}
