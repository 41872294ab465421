//! The AVX2 Q8_0 kernels (`Q8Kernel::Avx2`, `Q8Kernel::AvxVnni`): a group of 16 blocks as two
//! halves of 8 blocks (the 32-byte halves of the group's 64-byte lines); per 32 bytes of a weight
//! row the offset is undone (`xor 0x80`), and per input `vpmaddubsw(|q_w|, sign(q_x, q_w))` (never
//! saturating: `|q_w| <= 128`, `|q_x| <= 127`) then `vpmaddwd` with ones gives 8 int32 lanes, lane
//! `l` summing block `l` of the half; converted, scaled by `d_w * d_x` (`vcvtph2ps` for the weight
//! scales) and added into 8 of the 16 f32 lanes.
//!
//! `Q8Kernel::AvxVnni` is the same tiles with `vpdpbusd` on 256 bits (AVX-VNNI: Intel Alder
//! Lake and later client cores, which lack AVX-512) in place of the sign trick: the offset
//! weights as unsigned bytes, then the inputs' `128 * sum q_x` subtracted, as the AVX-512
//! kernel does. `avx2_tiles!` writes the tiles once; `maddubs` and `vnni` expand them with
//! their instruction sets and their `accumulate`.
//!
//! A narrow last group of 1, 2, 4 or 8 blocks is read 8 consecutive words a load and its lanes
//! folded (`fold`), as in the AVX-512 kernel; other widths take a masked load per word.
//!
//! What it is not: the layout or the kernel choice (`super`). Invariant: the
//! canonical order of `super`'s module doc, so the results equal the portable loop's bit for
//! bit. A tile is two neighbouring rows at one input, else one (16 registers).
#![allow(unsafe_code)]
// Register tiles are fixed-size arrays indexed by row and input: loops over indices read best.
#![allow(clippy::needless_range_loop)]

use super::{BLOCK, GROUP, GROUP_BYTES, Part, PrefetchHint, dispatch_tile, prefetch};
use std::arch::x86_64::*;
use std::ops::Range;

/// `sum q_w q_x` over 32 offset weight bytes and 32 input quants, in 8 int32 lanes.
#[inline]
#[target_feature(enable = "avx2")]
fn dot32(w_offset: __m256i, x: __m256i) -> __m256i {
    let w = _mm256_xor_si256(w_offset, _mm256_set1_epi8(0x80u8 as i8));
    let pairs = _mm256_maddubs_epi16(_mm256_abs_epi8(w), _mm256_sign_epi8(x, w));
    _mm256_madd_epi16(pairs, _mm256_set1_epi16(1))
}

/// Lane `l < width` gets the sum of lanes `l`, `l + width`, ... (`width` a power of two up to
/// 8; the other lanes are left undefined): exact in int32, so in any order.
#[inline]
#[target_feature(enable = "avx2")]
fn fold(v: __m256i, width: usize) -> __m256i {
    if width == 8 {
        return v;
    }
    let mut x = _mm_add_epi32(_mm256_castsi256_si128(v), _mm256_extracti128_si256::<1>(v));
    if width <= 2 {
        x = _mm_add_epi32(x, _mm_srli_si128::<8>(x));
    }
    if width <= 1 {
        x = _mm_add_epi32(x, _mm_srli_si128::<4>(x));
    }
    _mm256_set_m128i(_mm_setzero_si128(), x)
}

/// The tiles of one instruction set (`$features`): `rows`, `walk` and `tile`, with the
/// expanding module's `accumulate` (int32 lanes += one 32-byte block part's products) and
/// `OFFSET` (whether those products are of the offset weights, `q_w + 128`).
macro_rules! avx2_tiles {
    ($features:literal) => {
        /// # Safety
        /// The CPU has `$features`; bounds as in `super::q8_matvec_raw`.
        #[target_feature(enable = $features)]
        pub(crate) unsafe fn rows(part: &Part, rows: Range<usize>) {
            // SAFETY: forwarded.
            unsafe { dispatch_tile!(walk, part, rows, [2, 1, 1, 1, 1, 1, 1, 1]) }
        }

        /// # Safety
        /// As `rows`, with `NB == part.nb`.
        #[target_feature(enable = $features)]
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
        #[target_feature(enable = $features)]
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
            // [half] of the 16 lanes: blocks 0-7 and 8-15 of each group.
            let mut acc = [[[_mm256_setzero_ps(); 2]; NB]; R];
            for g in 0..groups {
                for half in 0..2 {
                    let mut isum = [[_mm256_setzero_si256(); NB]; R];
                    for i in 0..GROUP_BYTES / 64 {
                        let at = g * GROUP_BYTES + i * 64 + half * 32;
                        let mut wv = [_mm256_setzero_si256(); R];
                        for r in 0..R {
                            if half == 0 {
                                prefetch::<HINT, _>(wq[r].wrapping_add(at + ahead));
                            }
                            // SAFETY: bytes at .. at + 32 of row j + r lie in its whole groups.
                            wv[r] = unsafe { _mm256_loadu_si256(wq[r].add(at).cast()) };
                        }
                        for b in 0..NB {
                            // SAFETY: the input rows have the weights' layout and length.
                            let xv = unsafe { _mm256_loadu_si256(xr[b].0.add(at).cast()) };
                            for r in 0..R {
                                isum[r][b] = accumulate(isum[r][b], wv[r], xv);
                            }
                        }
                    }
                    let s = g * GROUP + half * 8;
                    for r in 0..R {
                        if half == 0 {
                            prefetch::<HINT, _>(ws[r].wrapping_add(g * GROUP + ahead / 32));
                        }
                        // SAFETY: scales s .. s + 8 of the row exist.
                        let dw = unsafe { _mm256_cvtph_ps(_mm_loadu_si128(ws[r].add(s).cast())) };
                        for b in 0..NB {
                            // SAFETY: as the weights' scales, for the input row.
                            let (dx, offset) = unsafe {
                                (
                                    _mm256_loadu_ps(xr[b].1.add(s)),
                                    _mm256_loadu_si256(xr[b].2.add(s).cast()),
                                )
                            };
                            let isum = if OFFSET {
                                _mm256_sub_epi32(isum[r][b], offset)
                            } else {
                                isum[r][b]
                            };
                            let exact = _mm256_cvtepi32_ps(isum);
                            acc[r][b][half] = _mm256_add_ps(
                                acc[r][b][half],
                                _mm256_mul_ps(exact, _mm256_mul_ps(dw, dx)),
                            );
                        }
                    }
                }
            }
            // The last, narrower group (`tail` blocks at width `tail`, see `super`): the same steps
            // on masked loads (`vpmaskmovd`), blended into lanes 0 .. tail only.
            let tail = blocks - groups * GROUP;
            if tail > 0 {
                let base = groups * GROUP_BYTES;
                let s = groups * GROUP;
                for half in 0..tail.div_ceil(8) {
                    let lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
                    let mask =
                        _mm256_cmpgt_epi32(_mm256_set1_epi32((tail - half * 8) as i32), lane);
                    let mut isum = [[_mm256_setzero_si256(); NB]; R];
                    if tail <= 8 && tail.is_power_of_two() {
                        // Then word `w` of the group is of block `w % tail`: 8 consecutive
                        // words per load (`tail` loads instead of 8), lanes folded mod `tail`.
                        for k in 0..tail {
                            let at = base + k * 32;
                            let mut wv = [_mm256_setzero_si256(); R];
                            for r in 0..R {
                                // SAFETY: words 8k .. 8k + 8 < 8 tail of the last group exist.
                                wv[r] = unsafe { _mm256_loadu_si256(wq[r].add(at).cast()) };
                            }
                            for b in 0..NB {
                                // SAFETY: as the weights, for the input row.
                                let xv = unsafe { _mm256_loadu_si256(xr[b].0.add(at).cast()) };
                                for r in 0..R {
                                    isum[r][b] = accumulate(isum[r][b], wv[r], xv);
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
                            let at = base + (i * tail + half * 8) * 4;
                            let mut wv = [_mm256_setzero_si256(); R];
                            for r in 0..R {
                                let p = wq[r].wrapping_add(at).cast();
                                // SAFETY: the unmasked words lie in the last group; masked-off
                                // words are not read.
                                wv[r] = unsafe { _mm256_maskload_epi32(p, mask) };
                            }
                            for b in 0..NB {
                                let p = xr[b].0.wrapping_add(at).cast();
                                // SAFETY: as the weights, for the input row.
                                let xv = unsafe { _mm256_maskload_epi32(p, mask) };
                                for r in 0..R {
                                    isum[r][b] = accumulate(isum[r][b], wv[r], xv);
                                }
                            }
                        }
                    }
                    let n = (tail - half * 8).min(8);
                    for r in 0..R {
                        let mut scales = [0u16; 8];
                        // SAFETY: scales s + 8 half .. + n of the row exist.
                        unsafe {
                            std::ptr::copy_nonoverlapping(
                                ws[r].add(s + half * 8),
                                scales.as_mut_ptr(),
                                n,
                            )
                        };
                        // SAFETY: 8 u16 of `scales`.
                        let packed = unsafe { _mm_loadu_si128(scales.as_ptr().cast()) };
                        let dw = _mm256_cvtph_ps(packed);
                        for b in 0..NB {
                            // SAFETY: as the weights' scales, for the input row; masked-off
                            // lanes are not read.
                            let (dx, offset) = unsafe {
                                (
                                    _mm256_maskload_ps(xr[b].1.add(s + half * 8), mask),
                                    _mm256_maskload_epi32(xr[b].2.add(s + half * 8), mask),
                                )
                            };
                            let isum = if OFFSET {
                                _mm256_sub_epi32(isum[r][b], offset)
                            } else {
                                isum[r][b]
                            };
                            let exact = _mm256_cvtepi32_ps(isum);
                            let sum = _mm256_add_ps(
                                acc[r][b][half],
                                _mm256_mul_ps(exact, _mm256_mul_ps(dw, dx)),
                            );
                            acc[r][b][half] =
                                _mm256_blendv_ps(acc[r][b][half], sum, _mm256_castsi256_ps(mask));
                        }
                    }
                }
            }
            for r in 0..R {
                for b in 0..NB {
                    // `super::reduce16`'s order: lanes l + 8, then l + 4, l + 2, l + 1.
                    let v = _mm256_add_ps(acc[r][b][0], acc[r][b][1]);
                    let v = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps::<1>(v));
                    let v = _mm_add_ps(v, _mm_movehl_ps(v, v));
                    let v = _mm_add_ss(v, _mm_shuffle_ps::<1>(v, v));
                    // SAFETY: (b, j + r - first) is inside the caller's output.
                    unsafe {
                        *part.out.add(b * part.out_stride + j + r - first) = _mm_cvtss_f32(v)
                    };
                }
            }
        }
    };
}

/// `vpmaddubsw` with the sign trick (AVX2).
pub(super) mod maddubs {
    use super::*;

    const OFFSET: bool = false;

    #[inline]
    #[target_feature(enable = "avx2")]
    fn accumulate(isum: __m256i, w_offset: __m256i, x: __m256i) -> __m256i {
        _mm256_add_epi32(isum, dot32(w_offset, x))
    }

    avx2_tiles!("avx2,f16c");
}

/// `vpdpbusd` on 256 bits (AVX-VNNI).
pub(super) mod vnni {
    use super::*;

    const OFFSET: bool = true;

    #[inline]
    #[target_feature(enable = "avx2,avxvnni")]
    fn accumulate(isum: __m256i, w_offset: __m256i, x: __m256i) -> __m256i {
        _mm256_dpbusd_avx_epi32(isum, w_offset, x)
    }

    avx2_tiles!("avx2,f16c,avxvnni");
}
