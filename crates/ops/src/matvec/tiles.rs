//! The decode kernels' FMA tiles, written once for every instruction set: `fma_tiles!` expands,
//! inside `avx512` and `avx2`, to `bf16_rows` / `f32_rows` (the tile shape per batch size) and
//! `bf16_tile` / `f32_tile` (R weight rows against NB input rows, accumulated in f32 lanes), from
//! that set's intrinsics and lane count; `tiles!` walks a row range in such tiles.
//!
//! What it is not: the `vdpbf16ps` tiles (`avx512` only, one instruction set) nor the kernel
//! choice (`super::kernel`). Invariants: every output is its own weight row's sum, accumulated
//! per 16-pair block in the same order (even then odd element, input by input) whatever the
//! tile shape, so results do not depend on which rows share a tile; with 16 lanes the expansion
//! performs the AVX-512 kernels' operations, with 8 the AVX2 kernels' (a 16-pair block as two
//! halves), one for one.
#![allow(unsafe_code)]

/// Rows `rows` in tiles of `$r` weight rows `gap` apart (one stream per tile row over its
/// `$r`-th of the range; see `avx2`'s module doc), then the rows left over one at a time, against
/// `$nb` inputs. The arguments end with the prefetch hint (a `PrefetchHint`, made a constant of
/// the tile here) and how far ahead each stream prefetches, in 4-byte words.
macro_rules! tiles {
    ($tile:ident, $r:expr, $nb:expr, $args:expr) => {{
        let (w, ws, x, xs, rows, out, os, hint, ahead) = $args;
        match hint {
            $crate::dispatch::PrefetchHint::None => tiles!(@walk $tile, $r, $nb, 0, (w, ws, x, xs, rows, out, os, ahead)),
            $crate::dispatch::PrefetchHint::T0 => tiles!(@walk $tile, $r, $nb, 1, (w, ws, x, xs, rows, out, os, ahead)),
            $crate::dispatch::PrefetchHint::T1 => tiles!(@walk $tile, $r, $nb, 2, (w, ws, x, xs, rows, out, os, ahead)),
            $crate::dispatch::PrefetchHint::T2 => tiles!(@walk $tile, $r, $nb, 3, (w, ws, x, xs, rows, out, os, ahead)),
            $crate::dispatch::PrefetchHint::Nta => tiles!(@walk $tile, $r, $nb, 4, (w, ws, x, xs, rows, out, os, ahead)),
        }
    }};
    (@walk $tile:ident, $r:expr, $nb:expr, $hint:expr, ($w:expr, $ws:expr, $x:expr, $xs:expr, $rows:expr, $out:expr, $os:expr, $ahead:expr)) => {{
        let gap = ($rows.end - $rows.start) / $r;
        for i in 0..gap {
            $tile::<$r, $nb, $hint>($w, $ws, $rows.start + i, gap, $x, $xs, $out.add(i), $os, $ahead);
        }
        for j in $rows.start + gap * $r..$rows.end {
            $tile::<1, $nb, $hint>($w, $ws, j, 0, $x, $xs, $out.add(j - $rows.start), $os, $ahead);
        }
    }};
}

/// The FMA tiles of one instruction set (see the module doc). `lanes` is f32 lanes per vector
/// (16 or 8); `bf16_rows` / `f32_rows` are the tile heights R for batches of 1..=8 inputs; the
/// rest name the intrinsics (`sum` adds a vector's lanes). The expanding module has
/// `PrefetchHint` in scope and passes each call's `prefetch_plan`.
macro_rules! fma_tiles {
    (
        features: $features:literal,
        lanes: $lanes:literal,
        bf16_rows: [$b1:literal, $b2:literal, $b3:literal, $b4:literal, $b5:literal, $b6:literal, $b7:literal, $b8:literal],
        f32_rows: [$f1:literal, $f2:literal, $f3:literal, $f4:literal, $f5:literal, $f6:literal, $f7:literal, $f8:literal],
        zero: $zero:ident,
        load: $load:ident,
        load_words: $load_words:ident,
        splat_words: $splat_words:ident,
        shift_words: $shift_words:ident,
        and_words: $and_words:ident,
        words_as_f32: $words_as_f32:ident,
        fmadd: $fmadd:ident,
        sum: $sum:ident,
    ) => {
        /// # Safety
        /// As `matvec`, with `nb <= MAX_BATCH` input rows at `x`.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn bf16_rows(
            w: *const u32,
            stride: usize,
            x: *const f32,
            x_stride: usize,
            nb: usize,
            rows: Range<usize>,
            out: *mut f32,
            out_stride: usize,
            (hint, ahead): (PrefetchHint, usize),
        ) {
            let args = (w, stride, x, x_stride, rows, out, out_stride, hint, ahead);
            // SAFETY: forwarded bounds.
            unsafe {
                match nb {
                    1 => tiles!(bf16_tile, $b1, 1, args),
                    2 => tiles!(bf16_tile, $b2, 2, args),
                    3 => tiles!(bf16_tile, $b3, 3, args),
                    4 => tiles!(bf16_tile, $b4, 4, args),
                    5 => tiles!(bf16_tile, $b5, 5, args),
                    6 => tiles!(bf16_tile, $b6, 6, args),
                    7 => tiles!(bf16_tile, $b7, 7, args),
                    _ => tiles!(bf16_tile, $b8, 8, args),
                }
            }
        }

        /// # Safety
        /// As `matvec`, with `nb <= MAX_BATCH` input rows at `x`.
        #[allow(clippy::too_many_arguments)]
        #[target_feature(enable = $features)]
        unsafe fn f32_rows(
            w: *const f32,
            cols: usize,
            x: *const f32,
            x_stride: usize,
            nb: usize,
            rows: Range<usize>,
            out: *mut f32,
            out_stride: usize,
            (hint, ahead): (PrefetchHint, usize),
        ) {
            let args = (w, cols, x, x_stride, rows, out, out_stride, hint, ahead);
            // SAFETY: forwarded bounds.
            unsafe {
                match nb {
                    1 => tiles!(f32_tile, $f1, 1, args),
                    2 => tiles!(f32_tile, $f2, 2, args),
                    3 => tiles!(f32_tile, $f3, 3, args),
                    4 => tiles!(f32_tile, $f4, 4, args),
                    5 => tiles!(f32_tile, $f5, 5, args),
                    6 => tiles!(f32_tile, $f6, 6, args),
                    7 => tiles!(f32_tile, $f7, 7, args),
                    _ => tiles!(f32_tile, $f8, 8, args),
                }
            }
        }

        /// Rows `j + r * gap` (r < R) of bf16 pair weights against `NB` prepared input rows;
        /// output `(b, r)` at `out + b * out_stride + r * gap`. A 16-pair block is `16 / lanes`
        /// loads per row, each giving `lanes` even and `lanes` odd weights.
        ///
        /// # Safety
        /// The rows exist (`stride` pair words each, a multiple of 16), the inputs hold
        /// `2 * stride` values per row (`x_stride`), and `out` has room for these outputs.
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn bf16_tile<const R: usize, const NB: usize, const HINT: u8>(
            w: *const u32,
            stride: usize,
            j: usize,
            gap: usize,
            x: *const f32,
            x_stride: usize,
            out: *mut f32,
            out_stride: usize,
            ahead: usize,
        ) {
            let high = $splat_words(0xffff_0000_u32 as i32);
            let mut acc = [[$zero(); NB]; R];
            let blocks = stride / 16;
            for block in 0..blocks {
                for r in 0..R {
                    // One 64-byte line per row and block, `ahead` words on in this row's
                    // stream: a hint, valid for any address.
                    prefetch::<HINT, _>(
                        w.wrapping_add((j + r * gap) * stride + block * 16 + ahead) as *const i8,
                    );
                }
                for part in 0..16 / $lanes {
                    let mut even = [$zero(); R];
                    let mut odd = [$zero(); R];
                    for r in 0..R {
                        let at = (j + r * gap) * stride + block * 16 + part * $lanes;
                        // SAFETY: pair words at .. at + lanes of row j + r * gap exist (stride
                        // is a multiple of 16 pair words).
                        let v = unsafe { $load_words(w.add(at).cast()) };
                        even[r] = $words_as_f32($shift_words::<16>(v));
                        odd[r] = $words_as_f32($and_words(v, high));
                    }
                    for b in 0..NB {
                        // SAFETY: values block * 32 .. + 32 of input row b exist; this part reads
                        // the even values lanes * part .. + lanes and the odd ones 16 more on.
                        let (xe, xo) = unsafe {
                            let p = x.add(b * x_stride + block * 32 + part * $lanes);
                            ($load(p), $load(p.add(16)))
                        };
                        for r in 0..R {
                            acc[r][b] = $fmadd(even[r], xe, acc[r][b]);
                            acc[r][b] = $fmadd(odd[r], xo, acc[r][b]);
                        }
                    }
                }
            }
            for r in 0..R {
                for b in 0..NB {
                    // SAFETY: (b, r) is inside the output tile.
                    unsafe { *out.add(b * out_stride + r * gap) = $sum(acc[r][b]) };
                }
            }
        }

        /// Rows `j + r * gap` (r < R) of row-major f32 weights (`cols` per row) against `NB`
        /// input rows; output `(b, r)` at `out + b * out_stride + r * gap`.
        ///
        /// # Safety
        /// The rows exist, the inputs hold `cols` values per row (`x_stride`), and `out` has
        /// room for these outputs.
        #[allow(clippy::too_many_arguments)]
        #[inline]
        #[target_feature(enable = $features)]
        unsafe fn f32_tile<const R: usize, const NB: usize, const HINT: u8>(
            w: *const f32,
            cols: usize,
            j: usize,
            gap: usize,
            x: *const f32,
            x_stride: usize,
            out: *mut f32,
            out_stride: usize,
            ahead: usize,
        ) {
            let mut acc = [[$zero(); NB]; R];
            let body = cols - cols % $lanes;
            let mut k = 0;
            while k < body {
                let mut wv = [$zero(); R];
                for r in 0..R {
                    let at = (j + r * gap) * cols + k;
                    // SAFETY: values k .. k + lanes of row j + r * gap exist.
                    wv[r] = unsafe { $load(w.add(at)) };
                    if k % 16 == 0 {
                        // A hint, valid for any address (one per 64-byte line of the stream).
                        prefetch::<HINT, _>(w.wrapping_add(at + ahead) as *const i8);
                    }
                }
                for b in 0..NB {
                    // SAFETY: values k .. k + lanes of input row b exist.
                    let xv = unsafe { $load(x.add(b * x_stride + k)) };
                    for r in 0..R {
                        acc[r][b] = $fmadd(wv[r], xv, acc[r][b]);
                    }
                }
                k += $lanes;
            }
            for r in 0..R {
                for b in 0..NB {
                    let mut sum = $sum(acc[r][b]);
                    for kk in body..cols {
                        // SAFETY: in bounds as above.
                        sum += unsafe {
                            *w.add((j + r * gap) * cols + kk) * *x.add(b * x_stride + kk)
                        };
                    }
                    // SAFETY: (b, r) is inside the output tile.
                    unsafe { *out.add(b * out_stride + r * gap) = sum };
                }
            }
        }
    };
}

/// A prefetch of the line at `p` (a hint, valid for any address) with the hint numbered as in
/// `tiles!`: 0 none, 1 `t0`, 2 `t1`, 3 `t2`, 4 `nta`.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
pub(crate) fn prefetch<const HINT: u8, T>(p: *const T) {
    use std::arch::x86_64::{_MM_HINT_NTA, _MM_HINT_T0, _MM_HINT_T1, _MM_HINT_T2, _mm_prefetch};
    let p = p.cast::<i8>();
    // SAFETY: a prefetch is a hint; it never faults, whatever the address.
    unsafe {
        match HINT {
            1 => _mm_prefetch::<_MM_HINT_T0>(p),
            2 => _mm_prefetch::<_MM_HINT_T1>(p),
            3 => _mm_prefetch::<_MM_HINT_T2>(p),
            4 => _mm_prefetch::<_MM_HINT_NTA>(p),
            _ => {}
        }
    }
}

/// The hint and distance (in 4-byte words) a kernel call prefetches with: weights that stream
/// from memory (`Inputs::stream_weights`) take this CPU's choice (`dispatch::decode_prefetch`,
/// or the inputs' own `prefetch_with`),
/// cached weights `t0` at the kernel's own distance `own_bytes`.
#[cfg(target_arch = "x86_64")]
pub(super) fn prefetch_plan(x: &super::Inputs, own_bytes: usize) -> (PrefetchHint, usize) {
    if !x.stream {
        return (PrefetchHint::T0, own_bytes / 4);
    }
    let tuned = x.prefetch();
    (tuned.hint, tuned.ahead.unwrap_or(own_bytes) / 4)
}

pub(super) use crate::dispatch::PrefetchHint;
