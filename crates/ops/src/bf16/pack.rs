//! The bf16 operands of the products, packed once per call (or once per weight version, for
//! decoding): `PackedA` row-major in pair words along the contraction, `PackedB` in panels of
//! `NR` columns, and the f32 -> bf16 rounding they use (`bf16_bits`, round to nearest even).
//!
//! What it is not: a product (`dispatch` and the kernels) nor the vectorized conversion loops
//! (`convert`). Invariants: padding (k to `KP_ALIGN` pairs, A's rows to `M_ALIGN`, B's columns
//! to `NR`) is zero, so it adds nothing to any sum; a pack holds the values `bf16_bits` gives.
#![allow(unsafe_code)]

use rayon::prelude::*;

use super::convert;
use super::tile::{NR, SyncPtr};

/// The contraction is padded to a multiple of this many pairs (one AMX tile row: 32 bf16).
const KP_ALIGN: usize = 16;
/// A's rows are padded to a multiple of this (one AMX tile).
const M_ALIGN: usize = 16;

/// f32 -> bf16 bits, round to nearest even; NaN stays NaN (quiet).
#[inline]
pub fn bf16_bits(x: f32) -> u16 {
    let bits = x.to_bits();
    if x.is_nan() {
        return ((bits >> 16) | 0x0040) as u16;
    }
    let rounding = 0x7fff + ((bits >> 16) & 1);
    (bits.wrapping_add(rounding) >> 16) as u16
}

/// bf16 bits -> f32 (exact).
#[inline]
pub fn bf16_to_f32(bits: u16) -> f32 {
    f32::from_bits((bits as u32) << 16)
}

/// `x` rounded to the nearest bf16 value, as f32.
#[inline]
pub fn round_bf16(x: f32) -> f32 {
    bf16_to_f32(bf16_bits(x))
}

/// The left operand, `[m, k]`, in bf16 pairs along k.
#[derive(Debug, Clone)]
pub struct PackedA {
    pub(super) m: usize,
    pub(super) k: usize,
    /// Pairs per row: `ceil(k / 2)` rounded up to KP_ALIGN.
    pub(super) kp: usize,
    /// `round_up(m, M_ALIGN) * kp` pairs; padding rows and pairs are zero.
    pub(super) data: Words,
}

/// A `PackedA`'s pair words: on the heap, or in a `PageRegion` (weights packed for decoding,
/// which streams them: see `crate::pages`). A clone is always on the heap.
#[derive(Debug)]
pub(super) enum Words {
    Heap(Vec<u32>),
    Pages(crate::pages::RegionWords),
}

impl std::ops::Deref for Words {
    type Target = [u32];
    fn deref(&self) -> &[u32] {
        match self {
            Words::Heap(v) => v,
            Words::Pages(p) => p,
        }
    }
}

impl std::ops::DerefMut for Words {
    fn deref_mut(&mut self) -> &mut [u32] {
        match self {
            Words::Heap(v) => v,
            Words::Pages(p) => p,
        }
    }
}

impl PartialEq for Words {
    fn eq(&self, other: &Words) -> bool {
        **self == **other
    }
}

impl Clone for Words {
    fn clone(&self) -> Words {
        Words::Heap(self.to_vec())
    }
}

/// The right operand `B[n, k]` (C = A B^T), in panels of NR columns.
#[derive(Debug, Clone)]
pub struct PackedB {
    pub(super) n: usize,
    pub(super) k: usize,
    pub(super) kp: usize,
    pub(super) data: Vec<u16>,
}

#[inline]
#[cfg_attr(target_endian = "little", allow(dead_code))]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) as u32 | ((bf16_bits(hi) as u32) << 16)
}

fn padded_pairs(k: usize) -> usize {
    k.div_ceil(2).div_ceil(KP_ALIGN) * KP_ALIGN
}

/// `row`'s values rounded to bf16 as pair words (`dst[i]` holds values 2i and 2i + 1; a last odd
/// value gets a zero partner); words of `dst` past `row.len().div_ceil(2)` are left as they are.
/// The row layout of `PackedA`, and the decode kernels' `vdpbf16ps` inputs.
pub(crate) fn pair_words(row: &[f32], dst: &mut [u32]) {
    let k = row.len();
    // A row's pair words are its bf16 values in order.
    #[cfg(target_endian = "little")]
    convert::bits(row, &mut convert::halves(dst)[..k]);
    #[cfg(not(target_endian = "little"))]
    {
        let (pairs, rest) = row.split_at(k & !1);
        for (d, two) in dst.iter_mut().zip(pairs.chunks_exact(2)) {
            *d = pair(two[0], two[1]);
        }
        if let Some(&last) = rest.first() {
            dst[k / 2] = pair(last, 0.0);
        }
    }
}

/// Integers whose all-zero bytes are the value 0 (what `par_filled` zeroes with).
trait ZeroBits: Copy + Send + Sync {}
impl ZeroBits for u16 {}
impl ZeroBits for u32 {}

/// A new buffer of `len` values, made in parallel chunks of `chunk` values (the last may be
/// shorter): each task zeroes its chunk, then `fill(index, chunk)` writes what it holds.
///
/// Why: a pack's padding must be zero, and `vec![0; len]` zeroes the whole buffer on the
/// calling thread before the parallel fill overwrites nearly all of it (a training step at
/// SmolLM2-135M packs about 2 GB of operands: single-threaded `memset`s were 3.5% of its CPU
/// time, with the other core idle meanwhile). Here the zeroing runs in the tasks, on both
/// cores, on lines the fill then finds in cache.
fn par_filled<T: ZeroBits>(
    len: usize,
    chunk: usize,
    fill: impl Fn(usize, &mut [T]) + Sync,
) -> Vec<T> {
    let mut data: Vec<T> = Vec::with_capacity(len);
    if len > 0 {
        let base = SyncPtr(data.as_mut_ptr().cast::<f32>());
        let chunk = chunk.max(1);
        (0..len.div_ceil(chunk)).into_par_iter().for_each(|i| {
            let start = i * chunk;
            let n = chunk.min(len - start);
            // SAFETY: chunk i is values start..start + n of the allocation (capacity len),
            // disjoint from every other task's; zeroed bytes are a valid T (ZeroBits) before
            // the slice is made.
            let part = unsafe {
                let p = base.get().cast::<T>().add(start);
                std::ptr::write_bytes(p, 0, n);
                std::slice::from_raw_parts_mut(p, n)
            };
            fill(i, part);
        });
    }
    // SAFETY: every chunk was written (zeroed at least) above.
    unsafe { data.set_len(len) };
    data
}

impl PackedA {
    /// Pair words a packed `[m, k]` matrix holds (padding included): what `from_rows_in` takes
    /// from a region.
    pub fn words(m: usize, k: usize) -> usize {
        m.div_ceil(M_ALIGN) * M_ALIGN * padded_pairs(k)
    }

    /// From `src` = A, row-major `[m, k]`.
    pub fn from_rows(src: &[f32], m: usize, k: usize) -> Self {
        Self::from_rows_in(src, m, k, None)
    }

    /// As `from_rows`, with the words taken from `region` while it has room (a weight that
    /// decoding streams: see `crate::pages`), else from the heap. The values are the same.
    pub fn from_rows_in(
        src: &[f32],
        m: usize,
        k: usize,
        region: Option<&std::sync::Arc<crate::pages::PageRegion>>,
    ) -> Self {
        assert_eq!(
            src.len(),
            m * k,
            "PackedA::from_rows: {} values for [{m}, {k}]",
            src.len()
        );
        let kp = padded_pairs(k);
        // One task per row; the padding rows stay zero.
        let fill = |row: usize, dst: &mut [u32]| {
            if row < m && k > 0 {
                pair_words(&src[row * k..(row + 1) * k], dst);
            }
        };
        let data = match region.and_then(|r| r.take(Self::words(m, k))) {
            // A region's words are zero already.
            Some(mut words) => {
                if kp > 0 {
                    words[..m * kp]
                        .par_chunks_mut(kp)
                        .enumerate()
                        .for_each(|(row, dst)| fill(row, dst));
                }
                Words::Pages(words)
            }
            None => Words::Heap(par_filled(Self::words(m, k), kp, fill)),
        };
        Self { m, k, kp, data }
    }

    /// From `src` = A^T, row-major `[k, m]` (A's column `i` is `src[.., i]`).
    pub fn from_cols(src: &[f32], k: usize, m: usize) -> Self {
        assert_eq!(
            src.len(),
            m * k,
            "PackedA::from_cols: {} values for [{k}, {m}]",
            src.len()
        );
        let kp = padded_pairs(k);
        // Blocks of 16 rows of A in parallel (M_ALIGN rows: the padding rows are the last
        // block's tail and stay zero); inside, walk k pairs so both source rows stream.
        let data = par_filled(Self::words(m, k), kp * M_ALIGN, |block, dst: &mut [u32]| {
            let first = block * M_ALIGN;
            if k > 0 && first < m {
                let rows = (m - first).min(M_ALIGN);
                convert::a_cols_block(src, k, m, first, kp, &mut dst[..rows * kp]);
            }
        });
        Self {
            m,
            k,
            kp,
            data: Words::Heap(data),
        }
    }

    pub fn rows(&self) -> usize {
        self.m
    }

    pub fn depth(&self) -> usize {
        self.k
    }

    /// Bytes held (for memory reports).
    pub fn bytes(&self) -> usize {
        self.data.len() * 4
    }

    /// The region holding the words, if they are in one (`from_rows_in`).
    pub fn region(&self) -> Option<&std::sync::Arc<crate::pages::PageRegion>> {
        match &self.data {
            Words::Pages(p) => Some(p.region()),
            Words::Heap(_) => None,
        }
    }

    /// The pair words, row `r` at `r * stride()` (what `matvec` reads in place).
    pub(crate) fn pair_rows(&self) -> &[u32] {
        &self.data
    }

    /// Pair words per row, padding included (a multiple of 16).
    pub(crate) fn stride(&self) -> usize {
        self.kp
    }
}

impl PackedB {
    pub(super) fn panels(n: usize) -> usize {
        n.div_ceil(NR)
    }

    fn panel_len(&self) -> usize {
        self.kp * NR * 2
    }

    /// A new `[n, k]` pack whose panels `fill(panel, words)` writes, in parallel, over zeros.
    fn filled(n: usize, k: usize, fill: impl Fn(usize, &mut [u16]) + Sync) -> Self {
        let kp = padded_pairs(k);
        let panel_len = kp * NR * 2;
        let data = par_filled(Self::panels(n) * panel_len, panel_len, fill);
        Self { n, k, kp, data }
    }

    /// From `src` = B, row-major `[n, k]` (the `nn.Linear` weight layout `[out, in]`).
    pub fn from_rows(src: &[f32], n: usize, k: usize) -> Self {
        assert_eq!(
            src.len(),
            n * k,
            "PackedB::from_rows: {} values for [{n}, {k}]",
            src.len()
        );
        Self::filled(n, k, |p, panel| {
            if k == 0 {
                return;
            }
            let cols = (n - p * NR).min(NR);
            let mut bits = vec![0u16; k];
            for c in 0..cols {
                let row = &src[(p * NR + c) * k..(p * NR + c + 1) * k];
                convert::bits(row, &mut bits);
                for (kk, &v) in bits.iter().enumerate() {
                    panel[(kk / 2) * NR * 2 + c * 2 + (kk & 1)] = v;
                }
            }
        })
    }

    /// From `src` = B^T, row-major `[k, n]` (B's row `j` is `src[.., j]`).
    pub fn from_cols(src: &[f32], k: usize, n: usize) -> Self {
        assert_eq!(
            src.len(),
            n * k,
            "PackedB::from_cols: {} values for [{k}, {n}]",
            src.len()
        );
        Self::filled(n, k, |p, panel| {
            let first = p * NR;
            let cols = (n - first).min(NR);
            for j in 0..k.div_ceil(2) {
                let lo = &src[2 * j * n + first..2 * j * n + first + cols];
                let hi = (2 * j + 1 < k)
                    .then(|| &src[(2 * j + 1) * n + first..(2 * j + 1) * n + first + cols]);
                let dst = &mut panel[j * NR * 2..j * NR * 2 + 2 * cols];
                match convert::words(dst) {
                    Some(words) => convert::pairs(lo, hi, words),
                    None => {
                        for (c, &v) in lo.iter().enumerate() {
                            dst[2 * c] = bf16_bits(v);
                            dst[2 * c + 1] = hi.map_or(0, |h| bf16_bits(h[c]));
                        }
                    }
                }
            }
        })
    }

    pub fn cols(&self) -> usize {
        self.n
    }

    pub fn depth(&self) -> usize {
        self.k
    }

    /// Bytes held (for memory reports).
    pub fn bytes(&self) -> usize {
        self.data.len() * 2
    }

    pub(super) fn panel(&self, p: usize) -> &[u16] {
        let len = self.panel_len();
        &self.data[p * len..(p + 1) * len]
    }
}
