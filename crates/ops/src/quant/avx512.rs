//! The AVX-512 VNNI Q8_0 kernel (`Q8Kernel::Avx512Vnni`): per group of 16 blocks, eight 64-byte
//! loads of each weight row, each `vpdpbusd`-ed (offset weights as unsigned bytes times the
//! signed input quants) against every input row into one int32 vector whose lane `b` is block
//! `b`'s whole sum; minus the inputs' `128 * sum q_x`, converted, scaled by `d_w * d_x` (the 16
//! weight scales by one `vcvtph2ps`) and added into 16 f32 lanes.
//!
//! What it is not: the layout or the kernel choice (`super`). Invariant: the canonical order
//! of `super`'s module doc, so the results equal the portable loop's bit for bit. A tile is R
//! neighbouring weight rows (R = 4 at one input, 2 at two to four, else 1: at most 8 int32 and
//! 8 f32 accumulators), each row prefetched on its own stream one line per 64 bytes.
#![allow(unsafe_code)]
// Register tiles are fixed-size arrays indexed by row and input: loops over indices read best.
#![allow(clippy::needless_range_loop)]

use super::{BLOCK, GROUP, GROUP_BYTES, Part, PrefetchHint, dispatch_tile, prefetch};
use std::arch::x86_64::*;
use std::ops::Range;

/// # Safety
/// The CPU has AVX-512F/BW/VL, AVX-512 VNNI and AVX2; bounds as in `super::q8_matvec_raw`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
pub(super) unsafe fn rows(part: &Part, rows: Range<usize>) {
    // SAFETY: forwarded.
    unsafe { dispatch_tile!(walk, part, rows, [4, 2, 2, 2, 1, 1, 1, 1]) }
}

/// # Safety
/// As `rows`, with `NB == part.nb`.
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
unsafe fn walk<const R: usize, const NB: usize, const HINT: u8>(
    part: &Part,
    rows: Range<usize>,
    ahead: usize,
) {
    let mut j = rows.start;
    while j + R <= rows.end {
        // SAFETY: rows j .. j + R exist.
        unsafe { tile::<R, NB, HINT>(part, j, rows.start, ahead) };
        j += R;
    }
    while j < rows.end {
        // SAFETY: row j exists.
        unsafe { tile::<1, NB, HINT>(part, j, rows.start, ahead) };
        j += 1;
    }
}

/// Rows `j .. j + R` against the part's `NB` inputs; output `(b, r)` at `part.out + b *
/// out_stride + j + r - first`.
///
/// # Safety
/// As `walk`, rows `j .. j + R` exist and `first <= j`.
#[inline]
#[target_feature(enable = "avx512f,avx512bw,avx512vl,avx512vnni,avx2")]
unsafe fn tile<const R: usize, const NB: usize, const HINT: u8>(
    part: &Part,
    j: usize,
    first: usize,
    ahead: usize,
) {
    let blocks = part.w.blocks;
    let groups = blocks / GROUP;
    let wq: [*const u8; R] = std::array::from_fn(|r| part.w_quants(j + r));
    let ws: [*const u16; R] = std::array::from_fn(|r| part.w_scales(j + r));
    let xr: [_; NB] = std::array::from_fn(|b| part.x_row(b));
    let mut acc = [[_mm512_setzero_ps(); NB]; R];
    for g in 0..groups {
        let mut isum = [[_mm512_setzero_si512(); NB]; R];
        for i in 0..GROUP_BYTES / 64 {
            let at = g * GROUP_BYTES + i * 64;
            let mut wv = [_mm512_setzero_si512(); R];
            for r in 0..R {
                prefetch::<HINT, _>(wq[r].wrapping_add(at + ahead));
                // SAFETY: bytes at .. at + 64 of row j + r lie in its whole groups.
                wv[r] = unsafe { _mm512_loadu_si512(wq[r].add(at).cast()) };
            }
            for b in 0..NB {
                // SAFETY: the input rows have the weights' layout and length.
                let xv = unsafe { _mm512_loadu_si512(xr[b].0.add(at).cast()) };
                for r in 0..R {
                    isum[r][b] = _mm512_dpbusd_epi32(isum[r][b], wv[r], xv);
                }
            }
        }
        for r in 0..R {
            // The scales' stream, 32 bytes a group: `ahead` quant bytes are `ahead / 16` of it.
            prefetch::<HINT, _>(ws[r].wrapping_add(g * GROUP + ahead / 32));
            // SAFETY: scales g * 16 .. + 16 of the row exist.
            let dw = unsafe { _mm512_cvtph_ps(_mm256_loadu_si256(ws[r].add(g * GROUP).cast())) };
            for b in 0..NB {
                // SAFETY: as the weights' scales, for the input row.
                let (dx, offset) = unsafe {
                    (
                        _mm512_loadu_ps(xr[b].1.add(g * GROUP)),
                        _mm512_loadu_si512(xr[b].2.add(g * GROUP).cast()),
                    )
                };
                let exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r][b], offset));
                acc[r][b] = _mm512_add_ps(acc[r][b], _mm512_mul_ps(exact, _mm512_mul_ps(dw, dx)));
            }
        }
    }
    // The last, narrower group (`tail` blocks at width `tail`, see `super`): the same steps
    // on masked loads, added into lanes 0 .. tail only.
    let tail = blocks - groups * GROUP;
    if tail > 0 {
        let mask = ((1u32 << tail) - 1) as u16;
        let base = groups * GROUP_BYTES;
        let mut isum = [[_mm512_setzero_si512(); NB]; R];
        if tail <= 8 && tail.is_power_of_two() {
            // Then word `w` of the group is of block `w % tail`: 16 consecutive words per load
            // (2 to 16 times fewer `vpdpbusd` than a load per word), lanes folded mod `tail`.
            let words = BLOCK / 4 * tail;
            for k in 0..words.div_ceil(16) {
                let load = ((1u32 << (words - 16 * k).min(16)) - 1) as u16;
                let at = base + k * 64;
                let mut wv = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    // SAFETY: the unmasked words lie in the last group; masked-off words are
                    // not read.
                    wv[r] = unsafe { _mm512_maskz_loadu_epi32(load, wq[r].add(at).cast()) };
                }
                for b in 0..NB {
                    // SAFETY: as the weights, for the input row.
                    let xv = unsafe { _mm512_maskz_loadu_epi32(load, xr[b].0.add(at).cast()) };
                    for r in 0..R {
                        isum[r][b] = _mm512_dpbusd_epi32(isum[r][b], wv[r], xv);
                    }
                }
            }
            for r in 0..R {
                for b in 0..NB {
                    isum[r][b] = fold(isum[r][b], tail);
                }
            }
        } else {
            for i in 0..BLOCK / 4 {
                let at = base + i * tail * 4;
                let mut wv = [_mm512_setzero_si512(); R];
                for r in 0..R {
                    // SAFETY: words i * tail .. + tail of the last group exist; masked-off
                    // words are not read.
                    wv[r] = unsafe { _mm512_maskz_loadu_epi32(mask, wq[r].add(at).cast()) };
                }
                for b in 0..NB {
                    // SAFETY: as the weights, for the input row.
                    let xv = unsafe { _mm512_maskz_loadu_epi32(mask, xr[b].0.add(at).cast()) };
                    for r in 0..R {
                        isum[r][b] = _mm512_dpbusd_epi32(isum[r][b], wv[r], xv);
                    }
                }
            }
        }
        let s = groups * GROUP;
        for r in 0..R {
            // SAFETY: scales s .. s + tail of the row exist; masked-off ones are not read.
            let dw =
                unsafe { _mm512_cvtph_ps(_mm256_maskz_loadu_epi16(mask, ws[r].add(s).cast())) };
            for b in 0..NB {
                // SAFETY: as the weights' scales, for the input row.
                let (dx, offset) = unsafe {
                    (
                        _mm512_maskz_loadu_ps(mask, xr[b].1.add(s)),
                        _mm512_maskz_loadu_epi32(mask, xr[b].2.add(s).cast()),
                    )
                };
                let exact = _mm512_cvtepi32_ps(_mm512_sub_epi32(isum[r][b], offset));
                let term = _mm512_mul_ps(exact, _mm512_mul_ps(dw, dx));
                acc[r][b] = _mm512_mask_add_ps(acc[r][b], mask, acc[r][b], term);
            }
        }
    }
    for r in 0..R {
        for b in 0..NB {
            // `super::reduce16`'s order: lanes l + 8, then l + 4, l + 2, l + 1.
            let v = acc[r][b];
            let v = _mm256_add_ps(
                _mm512_castps512_ps256(v),
                _mm256_castpd_ps(_mm512_extractf64x4_pd::<1>(_mm512_castps_pd(v))),
            );
            let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
            let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
            let v = _mm_add_ss(v, _mm_shuffle_ps::<1>(v, v));
            // SAFETY: (b, j + r - first) is inside the caller's output.
            unsafe { *part.out.add(b * part.out_stride + j + r - first) = _mm_cvtss_f32(v) };
        }
    }
}

/// Lane `l < width` gets the sum of lanes `l`, `l + width`, `l + 2 width`, ... (`width` a power
/// of two up to 8): exact in int32, so in any order.
#[inline]
#[target_feature(enable = "avx512f")]
fn fold(mut v: __m512i, width: usize) -> __m512i {
    let zero = _mm512_setzero_si512();
    if width <= 8 {
        v = _mm512_add_epi32(v, _mm512_alignr_epi32::<8>(zero, v));
    }
    if width <= 4 {
        v = _mm512_add_epi32(v, _mm512_alignr_epi32::<4>(zero, v));
    }
    if width <= 2 {
        v = _mm512_add_epi32(v, _mm512_alignr_epi32::<2>(zero, v));
    }
    if width <= 1 {
        v = _mm512_add_epi32(v, _mm512_alignr_epi32::<1>(zero, v));
    }
    v
}
