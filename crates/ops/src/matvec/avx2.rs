//! The AVX2 + FMA decode kernels (`Kernel::Avx2`): the FMA tiles of `tiles.rs` in 8 lanes, and
//! the attention's `dot` / `axpy`.
//!
//! What it is not: the kernel choice (`crate::dispatch`) nor the layouts (`super`).
//!
//! The AVX-512 kernels' tiles in 8 lanes: a 32-value bf16 block is two 8-pair loads, each
//! giving 8 even and 8 odd weights; tiles are smaller (16 registers, not 32).
//!
//! A tile's R weight rows are not neighbours: the row range is cut into R equal parts and
//! tile row r walks part r, so the weights are read as R long sequential streams instead of
//! R short ones side by side (a row of SmolLM2's 576 bf16 columns is 18 cache lines, too
//! short for the hardware prefetcher to follow), with a software prefetch a fixed distance
//! ahead in each stream. Measured on an AMD EPYC (Zen, AVX2), one core, batch 1, SmolLM2's
//! bf16 LM head from memory: 10.7 GB/s of weights with neighbouring rows, about 20 with six
//! streams. Which rows share a tile changes nothing in the results: every output is its
//! own row's sum, in the same order, whatever the tile.
#![allow(unsafe_code)]
// Register tiles are fixed-size arrays indexed by row and input: loops over indices read best.
#![allow(clippy::needless_range_loop)]

use super::tiles::{PrefetchHint, prefetch_plan};
use super::{Inputs, Weights, prefetch};
use std::arch::x86_64::*;
use std::ops::Range;

const MAX_BATCH: usize = 8;
/// How far ahead in its stream each tile row prefetches, in bytes (`fma_tiles!` asks; the same at
/// every batch size here).
const fn prefetch_ahead(_nb: usize) -> usize {
    1024
}

#[inline]
#[target_feature(enable = "avx2,fma")]
fn hsum(v: __m256) -> f32 {
    let quad = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
    let pair = _mm_add_ps(quad, _mm_movehl_ps(quad, quad));
    let one = _mm_add_ss(pair, _mm_shuffle_ps::<0b01>(pair, pair));
    _mm_cvtss_f32(one)
}

/// # Safety
/// AVX2 and FMA are available; bounds as in `super::matvec_raw`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn matvec(
    w: &Weights,
    x: &Inputs,
    inputs: Range<usize>,
    rows: Range<usize>,
    out: *mut f32,
    out_stride: usize,
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
/// AVX2 and FMA are available; `a.len() == b.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn dot(a: &[f32], b: &[f32]) -> f32 {
    let n = a.len();
    let body = n - n % 16;
    let (mut acc0, mut acc1) = (_mm256_setzero_ps(), _mm256_setzero_ps());
    let mut i = 0;
    while i < body {
        // SAFETY: i + 16 <= n for both slices.
        unsafe {
            let (pa, pb) = (a.as_ptr().add(i), b.as_ptr().add(i));
            acc0 = _mm256_fmadd_ps(_mm256_loadu_ps(pa), _mm256_loadu_ps(pb), acc0);
            acc1 = _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(8)), _mm256_loadu_ps(pb.add(8)), acc1);
        }
        i += 16;
    }
    let mut sum = hsum(_mm256_add_ps(acc0, acc1));
    for k in body..n {
        sum += a[k] * b[k];
    }
    sum
}

/// # Safety
/// AVX2 and FMA are available; `y.len() == x.len()`.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    let n = y.len();
    let body = n - n % 8;
    let a = _mm256_set1_ps(alpha);
    let mut i = 0;
    while i < body {
        // SAFETY: i + 8 <= n for both slices.
        unsafe {
            let p = y.as_mut_ptr().add(i);
            _mm256_storeu_ps(
                p,
                _mm256_fmadd_ps(a, _mm256_loadu_ps(x.as_ptr().add(i)), _mm256_loadu_ps(p)),
            );
        }
        i += 8;
    }
    for k in body..n {
        y[k] += alpha * x[k];
    }
}

// Tile shapes per batch size 1..8 (R weight rows a tile). bf16: R x NB accumulators, 2R weight
// vectors and 2 input vectors fit 16 registers (at NB = 1 the weight vectors are used as they are
// loaded, so 6 rows fit). f32: R x NB accumulators, R weight vectors, 1 input vector.
fma_tiles! {
    features: "avx2,fma",
    lanes: 8,
    bf16_rows: [6, 3, 2, 2, 1, 1, 1, 1],
    f32_rows: [6, 4, 3, 2, 2, 2, 1, 1],
    zero: _mm256_setzero_ps,
    load: _mm256_loadu_ps,
    load_words: _mm256_loadu_si256,
    splat_words: _mm256_set1_epi32,
    shift_words: _mm256_slli_epi32,
    and_words: _mm256_and_si256,
    words_as_f32: _mm256_castsi256_ps,
    fmadd: _mm256_fmadd_ps,
    sum: hsum,
}
