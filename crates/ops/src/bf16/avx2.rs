//! The AVX2 + FMA tile kernel (`Backend::Avx2`): no bf16 dot product, so each pair word is split
//! into its even and odd element as f32 (a shift and a mask: the products stay exact bf16 x bf16)
//! and multiplied with f32 FMA, in 5 x 16 register tiles.
//!
//! What it is not: the dispatch (`dispatch::compute_tile`) nor the packs. Invariant: it gives the
//! portable kernel's values up to f32 summation order.
#![allow(unsafe_code)]
// Register tiles are fixed-size arrays indexed by row: loops over indices read best.
#![allow(clippy::needless_range_loop)]

use super::tile::{NR, Tile};
use std::arch::x86_64::*;

/// Rows of C per kernel call.
const MR: usize = 5;
/// Columns of C per kernel call (two 8-lane vectors).
const NC: usize = 16;
/// Pairs of the contraction per pass: one column group's slice of the panel (KC cache
/// lines of 64 bytes, 8 KiB) stays in L1 while every strip of the tile's rows runs
/// against it.
const KC: usize = 128;

/// The tile of C from A's rows and one B panel, in passes of `KC` pairs: per pass the
/// tile's rows of A are widened to f32 once, then each 16-column group of the panel runs
/// against every 5-row strip (`kernel`), accumulating into C after the first pass.
///
/// # Safety
/// AVX2 and FMA are available; `a` is PackedA data (`kp` pairs a row); `panel` has `kp`
/// pair rows; `c` is C with row stride `ldc` and `tile` inside it.
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn tile(
    kp: usize,
    a: &[u32],
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    tile: Tile,
) {
    let kc_max = KC.min(kp);
    let mut widened = vec![0.0f32; tile.rows * 2 * kc_max];
    for j0 in (0..kp).step_by(KC) {
        let kc = KC.min(kp - j0);
        let stride = 2 * kc;
        for r in 0..tile.rows {
            let pairs = &a[(tile.row0 + r) * kp + j0..][..kc];
            widen(pairs, &mut widened[r * stride..(r + 1) * stride]);
        }
        let accumulate = tile.accumulate || j0 > 0;
        let slice = &panel[j0 * NR * 2..(j0 + kc) * NR * 2];
        for group in (0..tile.cols).step_by(NC) {
            let cols = (tile.cols - group).min(NC);
            let mut r = 0;
            while r < tile.rows {
                let mr = (tile.rows - r).min(MR);
                let strip = &widened[r * stride..(r + mr) * stride];
                // SAFETY: rows row0 + r .. + mr and columns col0 + group .. + cols lie
                // inside the tile; the strip has mr rows of 2 * kc values.
                unsafe {
                    let at = c.add((tile.row0 + r) * ldc + tile.col0 + group);
                    let t = (kc, strip, slice, group, at, ldc, cols, accumulate);
                    match mr {
                        5 => kernel::<5>(t.0, t.1, t.2, t.3, t.4, t.5, t.6, t.7),
                        4 => kernel::<4>(t.0, t.1, t.2, t.3, t.4, t.5, t.6, t.7),
                        3 => kernel::<3>(t.0, t.1, t.2, t.3, t.4, t.5, t.6, t.7),
                        2 => kernel::<2>(t.0, t.1, t.2, t.3, t.4, t.5, t.6, t.7),
                        _ => kernel::<1>(t.0, t.1, t.2, t.3, t.4, t.5, t.6, t.7),
                    }
                }
                r += mr;
            }
        }
    }
}

/// Pair words as their f32 values, two per word in k order.
fn widen(pairs: &[u32], out: &mut [f32]) {
    debug_assert_eq!(out.len(), pairs.len() * 2);
    for (two, &p) in out.chunks_exact_mut(2).zip(pairs) {
        two[0] = f32::from_bits(p << 16);
        two[1] = f32::from_bits(p & 0xffff_0000);
    }
}

/// `C[0..R, 0..cols] (+)= A[0..R] . panel[.., group .. group + cols]`: R rows of A as f32
/// (`widen`: `2 * kp` values each, row-major) against 16 columns of one B panel starting at
/// column `group`. Per pair of the contraction the 16 columns' pair words are split into
/// their even and odd elements (f32 bit patterns: a shift and a mask), and each row's two
/// values are broadcast from memory into 2 x R accumulators by FMA. (Measured on Zen 3:
/// with A split beforehand this 5 x 16 tile runs at about 80 GFLOP/s per core from L1,
/// above the f32 6 x 16 tile's 74; splitting A's pairs in the loop costs a third of that.)
///
/// # Safety
/// AVX2 and FMA are available; `a` holds R * 2 * kp values; `panel` kp * NR * 2 bf16;
/// `group + 16 <= NR`; `c` R rows of `ldc` floats with `cols` (<= 16) writable each.
#[allow(clippy::too_many_arguments)]
#[target_feature(enable = "avx2,fma")]
pub(super) unsafe fn kernel<const R: usize>(
    kp: usize,
    a: &[f32],
    panel: &[u16],
    group: usize,
    c: *mut f32,
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    debug_assert!(a.len() >= R * 2 * kp && panel.len() >= kp * NR * 2 && group + NC <= NR);
    debug_assert!(cols <= NC);
    let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
    let mut acc = [[_mm256_setzero_ps(); 2]; R];
    let ap = a.as_ptr();
    // Pair words of the panel: `NR` per pair row, this group's 16 start at `group`.
    let bp = panel.as_ptr().cast::<u32>();
    for j in 0..kp {
        // SAFETY: pair row j of the panel has NR words; group + 16 <= NR.
        let (w0, w1) = unsafe {
            let row = bp.add(j * NR + group);
            (
                _mm256_loadu_si256(row.cast()),
                _mm256_loadu_si256(row.add(8).cast()),
            )
        };
        let (be0, be1) = (
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w0)),
            _mm256_castsi256_ps(_mm256_slli_epi32::<16>(w1)),
        );
        for r in 0..R {
            // SAFETY: r < R and 2j < 2kp index inside `a`.
            let ae = unsafe { _mm256_broadcast_ss(&*ap.add(r * 2 * kp + 2 * j)) };
            acc[r][0] = _mm256_fmadd_ps(ae, be0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ae, be1, acc[r][1]);
        }
        let (bo0, bo1) = (
            _mm256_castsi256_ps(_mm256_and_si256(w0, high)),
            _mm256_castsi256_ps(_mm256_and_si256(w1, high)),
        );
        for r in 0..R {
            // SAFETY: as above, the odd value of the pair.
            let ao = unsafe { _mm256_broadcast_ss(&*ap.add(r * 2 * kp + 2 * j + 1)) };
            acc[r][0] = _mm256_fmadd_ps(ao, bo0, acc[r][0]);
            acc[r][1] = _mm256_fmadd_ps(ao, bo1, acc[r][1]);
        }
    }
    for r in 0..R {
        // SAFETY: row r of C has `cols` writable floats.
        let row = unsafe { c.add(r * ldc) };
        if cols == NC {
            for q in 0..2 {
                // SAFETY: columns 8q .. 8q + 8 < 16 = cols of row r.
                unsafe {
                    let p = row.add(8 * q);
                    let v = if accumulate {
                        _mm256_add_ps(acc[r][q], _mm256_loadu_ps(p))
                    } else {
                        acc[r][q]
                    };
                    _mm256_storeu_ps(p, v);
                }
            }
        } else {
            let mut lanes = [0.0f32; NC];
            // SAFETY: `lanes` holds 16 floats.
            unsafe {
                _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][0]);
                _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[r][1]);
            }
            for (col, v) in lanes[..cols].iter().enumerate() {
                // SAFETY: col < cols, inside row r's writable floats.
                unsafe {
                    let p = row.add(col);
                    *p = if accumulate { *p + v } else { *v };
                }
            }
        }
    }
}
