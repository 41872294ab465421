//! CPU kernels of `fused_attention` that visit only the keys a query may attend to.
//!
//! Why: the dense form (`Q K^T`, a masked softmax over every key, `P V`) spends its work on
//! every (query, key) pair and then multiplies most of them by zero. The masks stoke trains
//! with are mostly zeros: causal attention masks half the pairs; packed SFT documents, GRPO's
//! shared-prefix groups (a completion sees the prompt and itself) and packed preference pairs
//! (the rejected response does not see the chosen one) mask far more. Here each query row's
//! allowed keys are read off the bias once, as runs of finite entries ([`KeyRuns`]), and every
//! product covers only the span of keys its block of rows allows.
//!
//! Layout of the work: query rows go in blocks of [`QB`] consecutive positions of one head.
//! A block's spans are the union of its rows' runs, merged into disjoint key intervals (for a
//! causal row one interval; for a completion in a shared-prefix group two: the prompt and the
//! completion's own tokens); inside them, masked entries still get their `-inf` bias and so a
//! probability of exactly 0, as in the dense form. The block's columns are its spans side by
//! side. Per block: `S = scale * Q K[spans]^T + bias`, a softmax per row, `O = P V[spans]`; the
//! backward walks the same blocks (`dP = dO V^T`, `dS = P * (dP - rowsum(P * dP))`,
//! `dQ = scale dS K`, `dK += scale dS^T Q`, `dV += P^T dO`). The probabilities of the forward
//! are kept per block (at most the dense size) when the backward will need them.
//!
//! Products run in register tiles of [`QB`] rows x 16 columns: in f32 on AVX2 + FMA (and
//! AVX-512 CPUs) through explicit 8-lane intrinsics (`avx2`), elsewhere (f64, the gradient
//! checks' precision, and CPUs below AVX2) through plain loops. In bf16 mode (`forward`'s
//! `bf16`), on CPUs with AVX512-BF16 and masks whose rows' key ranges hold few masked keys
//! (causal, long packed documents), `packed` runs them in bf16 with f32 accumulation.
//!
//! What it is not: a different function. Values equal the dense form up to summation order;
//! a row whose bias is all `-inf` gives NaN, as the dense softmax does, and so does its query
//! gradient; unlike the dense form it adds nothing to the key and value gradients (where the
//! dense backward spreads NaN over every key of the batch).
//! Invariants: q is [B, G * R, Tq, D] (query head h = g * R + r uses key/value head g), k and v
//! [B, G, Tk, D], bias [Bb, Hb, Tq, Tk] with Bb in {1, B} and Hb in {1, G * R}; all contiguous.

// `unsafe` only for the AVX2 tiles (`avx2`) and the calls into them.
#![allow(unsafe_code)]

use rayon::prelude::*;

use crate::kernels::Real;

mod packed;

/// Query rows per block (and rows of a register tile).
pub(crate) const QB: usize = 4;
/// Columns of a register tile.
const TILE: usize = 16;

/// The shapes of one attention call.
#[derive(Clone, Copy, Debug)]
pub struct Dims {
    pub batch: usize,
    pub kv_heads: usize,
    /// Query heads per key/value head (R).
    pub group: usize,
    pub q_len: usize,
    pub k_len: usize,
    pub head_dim: usize,
    pub bias_batch: usize,
    pub bias_heads: usize,
}

impl Dims {
    fn q_heads(&self) -> usize {
        self.kv_heads * self.group
    }

    /// The bias row of query row `i` of head `h` in batch `b`.
    fn bias_row(&self, b: usize, h: usize, i: usize) -> usize {
        let b = if self.bias_batch == 1 { 0 } else { b };
        let h = if self.bias_heads == 1 { 0 } else { h };
        (b * self.bias_heads + h) * self.q_len + i
    }

    /// Key positions per transposed row (a multiple of TILE, so tiles never read past it).
    fn padded_keys(&self) -> usize {
        self.k_len.div_ceil(TILE) * TILE
    }
}

/// The keys each bias row allows: its maximal runs of finite entries.
#[derive(Debug)]
pub struct KeyRuns {
    /// Row `r`'s runs are `runs[offsets[r]..offsets[r + 1]]`.
    offsets: Vec<usize>,
    runs: Vec<(usize, usize)>,
}

impl KeyRuns {
    pub(crate) fn from_bias<T: Real>(bias: &[T], k_len: usize) -> KeyRuns {
        let rows = bias.len().checked_div(k_len).unwrap_or(0);
        let mut offsets = Vec::with_capacity(rows + 1);
        let mut runs = Vec::new();
        offsets.push(0);
        for row in bias.chunks_exact(k_len.max(1)).take(rows) {
            let mut start = None;
            for (j, v) in row.iter().enumerate() {
                match (v.is_finite(), start) {
                    (true, None) => start = Some(j),
                    (false, Some(s)) => {
                        runs.push((s, j));
                        start = None;
                    }
                    _ => {}
                }
            }
            if let Some(s) = start {
                runs.push((s, k_len));
            }
            offsets.push(runs.len());
        }
        KeyRuns { offsets, runs }
    }

    fn row(&self, r: usize) -> &[(usize, usize)] {
        &self.runs[self.offsets[r]..self.offsets[r + 1]]
    }

    /// The fraction of (query, key) pairs the bias allows.
    #[cfg(test)]
    fn density(&self, k_len: usize) -> f64 {
        let rows = self.offsets.len() - 1;
        let allowed: usize = self.runs.iter().map(|(a, b)| b - a).sum();
        allowed as f64 / (rows * k_len).max(1) as f64
    }
}

/// One block of query rows and the key intervals its products cover; its probabilities are
/// `rows x width` (row-major, the spans' columns side by side) at `offset` in the task's store.
#[derive(Clone, Debug)]
struct Block {
    head: usize,
    first: usize,
    rows: usize,
    spans: Vec<(usize, usize)>,
    width: usize,
    offset: usize,
}

impl Block {
    /// Each span with the column its keys start at.
    fn columns(&self) -> impl Iterator<Item = (usize, usize, usize)> + '_ {
        self.spans.iter().scan(0, |col, &(lo, hi)| {
            let start = *col;
            *col += hi - lo;
            Some((lo, hi, start))
        })
    }
}

/// The blocks of key/value head `g` of batch `b`, in order (head, then query position).
fn blocks(dims: &Dims, runs: &KeyRuns, b: usize, g: usize) -> Vec<Block> {
    let mut out = Vec::new();
    let mut offset = 0;
    let mut all = Vec::new();
    for r in 0..dims.group {
        let head = g * dims.group + r;
        for first in (0..dims.q_len).step_by(QB) {
            let rows = QB.min(dims.q_len - first);
            all.clear();
            for i in first..first + rows {
                all.extend_from_slice(runs.row(dims.bias_row(b, head, i)));
            }
            all.sort_unstable();
            let mut spans: Vec<(usize, usize)> = Vec::new();
            for &(lo, hi) in &all {
                match spans.last_mut() {
                    Some(last) if lo <= last.1 => last.1 = last.1.max(hi),
                    _ => spans.push((lo, hi)),
                }
            }
            let width = spans.iter().map(|(lo, hi)| hi - lo).sum();
            out.push(Block {
                head,
                first,
                rows,
                spans,
                width,
                offset,
            });
            offset += rows * width;
        }
    }
    out
}

/// What the forward keeps for the backward.
pub struct Saved<T> {
    /// Per (batch, key/value head) task: the probabilities of its blocks (of `packed`'s tiles
    /// when `packed`).
    probs: Vec<Vec<T>>,
    packed: bool,
}

impl<T> Saved<T> {
    /// Probabilities kept, over all tasks.
    pub fn kept_values(&self) -> usize {
        self.probs.iter().map(Vec::len).sum()
    }
}

/// `K^T` of one (batch, key/value head): `[D][padded]`, zero past `k_len`.
fn transposed<T: Real>(k: &[T], k_len: usize, head_dim: usize, padded: usize) -> Vec<T> {
    let mut t = vec![T::zero(); head_dim * padded];
    for (j, row) in k.chunks_exact(head_dim).take(k_len).enumerate() {
        for (d, &v) in row.iter().enumerate() {
            t[d * padded + j] = v;
        }
    }
    t
}

/// The three products of a block, per element type: plain loops by default, AVX2 tiles for f32
/// on CPUs that have them.
pub trait Tiles: Real {
    /// `out[r * stride + col + j - lo] = sum_d a[r][d] * bt[d][j]` for `j` in `lo..hi`; `bt` is
    /// `[D][ld]` with `ld` a multiple of TILE at least `hi`.
    fn row_products(
        a: &[&[Self]],
        bt: &[Self],
        ld: usize,
        span: (usize, usize),
        out: &mut [Self],
        stride: usize,
        col: usize,
    ) {
        plain::row_products(a, bt, ld, span, out, stride, col)
    }

    /// `out[r][..] += sum_j w[r * stride + col + j - lo] * m[j][..]` for `j` in `lo..hi`
    /// (`m` rows `head_dim` long; `out` R rows of `head_dim`).
    fn weighted_rows(
        w: &[Self],
        stride: usize,
        col: usize,
        m: &[Self],
        span: (usize, usize),
        out: &mut [Self],
    ) {
        plain::weighted_rows(w, stride, col, m, span, out)
    }

    /// `m[j][..] += scale * sum_r w[r * stride + col + j - lo] * x[r][..]` for `j` in `lo..hi`.
    fn add_outer(
        w: &[Self],
        stride: usize,
        col: usize,
        x: &[Self],
        scale: Self,
        span: (usize, usize),
        m: &mut [Self],
    ) {
        plain::add_outer(w, stride, col, x, scale, span, m)
    }

    /// The forward with its products in bf16 (`packed`), where this type, CPU and mask have
    /// it: the output and the probabilities per task.
    #[allow(clippy::too_many_arguments)]
    fn packed_forward(
        _q: &[Self],
        _k: &[Self],
        _v: &[Self],
        _bias: &[Self],
        _runs: &KeyRuns,
        _dims: Dims,
        _scale: f64,
        _keep: bool,
    ) -> Option<(Vec<Self>, Vec<Vec<Self>>)> {
        None
    }

    /// The backward of `packed_forward` (None where it never runs).
    #[allow(clippy::too_many_arguments)]
    fn packed_backward(
        _q: &[Self],
        _k: &[Self],
        _v: &[Self],
        _runs: &KeyRuns,
        _dims: Dims,
        _scale: f64,
        _probs: &[Vec<Self>],
        _grad_out: &[Self],
    ) -> Option<(Vec<Self>, Vec<Self>, Vec<Self>)> {
        None
    }
}

impl Tiles for f64 {}

impl Tiles for f32 {
    fn row_products(
        a: &[&[f32]],
        bt: &[f32],
        ld: usize,
        span: (usize, usize),
        out: &mut [f32],
        stride: usize,
        col: usize,
    ) {
        #[cfg(target_arch = "x86_64")]
        if avx2::usable(a.len(), a[0].len()) {
            // SAFETY: the CPU has AVX2 and FMA (`usable`); bounds are checked inside.
            return unsafe { avx2::row_products(a, bt, ld, span, out, stride, col) };
        }
        plain::row_products(a, bt, ld, span, out, stride, col)
    }

    fn weighted_rows(
        w: &[f32],
        stride: usize,
        col: usize,
        m: &[f32],
        span: (usize, usize),
        out: &mut [f32],
    ) {
        let rows = w.len() / stride;
        #[cfg(target_arch = "x86_64")]
        if avx2::usable(rows, out.len() / rows) {
            // SAFETY: as above.
            return unsafe { avx2::weighted_rows(w, stride, col, m, span, out) };
        }
        plain::weighted_rows(w, stride, col, m, span, out)
    }

    fn add_outer(
        w: &[f32],
        stride: usize,
        col: usize,
        x: &[f32],
        scale: f32,
        span: (usize, usize),
        m: &mut [f32],
    ) {
        let rows = w.len() / stride;
        #[cfg(target_arch = "x86_64")]
        if avx2::usable(rows, x.len() / rows) {
            // SAFETY: as above.
            return unsafe { avx2::add_outer(w, stride, col, x, scale, span, m) };
        }
        plain::add_outer(w, stride, col, x, scale, span, m)
    }

    fn packed_forward(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        bias: &[f32],
        runs: &KeyRuns,
        dims: Dims,
        scale: f64,
        keep: bool,
    ) -> Option<(Vec<f32>, Vec<Vec<f32>>)> {
        packed::worthwhile(&dims, runs)
            .then(|| packed::forward(q, k, v, bias, runs, dims, scale as f32, keep))
    }

    fn packed_backward(
        q: &[f32],
        k: &[f32],
        v: &[f32],
        runs: &KeyRuns,
        dims: Dims,
        scale: f64,
        probs: &[Vec<f32>],
        grad_out: &[f32],
    ) -> Option<(Vec<f32>, Vec<f32>, Vec<f32>)> {
        Some(packed::backward(
            q,
            k,
            v,
            runs,
            dims,
            scale as f32,
            probs,
            grad_out,
        ))
    }
}

/// The products as plain loops (f64, head sizes the tiles do not cover, CPUs below AVX2).
mod plain {
    use crate::kernels::Real;

    pub(super) fn row_products<T: Real>(
        a: &[&[T]],
        bt: &[T],
        ld: usize,
        (lo, hi): (usize, usize),
        out: &mut [T],
        stride: usize,
        col: usize,
    ) {
        for (r, row) in a.iter().enumerate() {
            for j in lo..hi {
                let mut s = T::zero();
                for (d, &x) in row.iter().enumerate() {
                    s += x * bt[d * ld + j];
                }
                out[r * stride + col + j - lo] = s;
            }
        }
    }

    pub(super) fn weighted_rows<T: Real>(
        w: &[T],
        stride: usize,
        col: usize,
        m: &[T],
        (lo, hi): (usize, usize),
        out: &mut [T],
    ) {
        let head_dim = out.len() / (w.len() / stride);
        for (r, o) in out.chunks_exact_mut(head_dim).enumerate() {
            for j in lo..hi {
                let p = w[r * stride + col + j - lo];
                for (x, &v) in o.iter_mut().zip(&m[j * head_dim..(j + 1) * head_dim]) {
                    *x += p * v;
                }
            }
        }
    }

    pub(super) fn add_outer<T: Real>(
        w: &[T],
        stride: usize,
        col: usize,
        x: &[T],
        scale: T,
        (lo, hi): (usize, usize),
        m: &mut [T],
    ) {
        let rows = w.len() / stride;
        let head_dim = x.len() / rows;
        for j in lo..hi {
            let row = &mut m[j * head_dim..(j + 1) * head_dim];
            for r in 0..rows {
                let c = w[r * stride + col + j - lo] * scale;
                for (o, &v) in row.iter_mut().zip(&x[r * head_dim..(r + 1) * head_dim]) {
                    *o += c * v;
                }
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Tiles are fixed-size arrays indexed by row: loops over indices read best.
#[allow(clippy::needless_range_loop)]
mod avx2 {
    use super::TILE;
    use std::arch::x86_64::*;

    /// The tiles cover 1..=4 rows and head sizes that are a multiple of 8, on AVX2 + FMA.
    pub(super) fn usable(rows: usize, head_dim: usize) -> bool {
        (1..=super::QB).contains(&rows)
            && head_dim.is_multiple_of(8)
            && head_dim > 0
            && crate::cpu::level() >= crate::cpu::Level::Avx2
    }

    macro_rules! rows {
        ($n:expr, $f:ident, $($arg:expr),*) => {
            match $n {
                4 => $f::<4>($($arg),*),
                3 => $f::<3>($($arg),*),
                2 => $f::<2>($($arg),*),
                _ => $f::<1>($($arg),*),
            }
        };
    }

    /// See `Tiles::row_products`.
    ///
    /// # Safety
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn row_products(
        a: &[&[f32]],
        bt: &[f32],
        ld: usize,
        span: (usize, usize),
        out: &mut [f32],
        stride: usize,
        col: usize,
    ) {
        // SAFETY: forwarded.
        unsafe { rows!(a.len(), row_products_r, a, bt, ld, span, out, stride, col) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn row_products_r<const R: usize>(
        a: &[&[f32]],
        bt: &[f32],
        ld: usize,
        (lo, hi): (usize, usize),
        out: &mut [f32],
        stride: usize,
        col: usize,
    ) {
        let head_dim = a[0].len();
        assert!(a.len() == R && a.iter().all(|r| r.len() == head_dim));
        assert!(bt.len() >= head_dim * ld && hi.div_ceil(TILE) * TILE <= ld);
        assert!(out.len() >= (R - 1) * stride + col + (hi - lo));
        // Tiles start at multiples of TILE, so they never read past `ld`.
        let mut j0 = lo / TILE * TILE;
        while j0 < hi {
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for d in 0..head_dim {
                // SAFETY: d < head_dim and j0 + 16 <= ld (asserted): inside bt.
                let (b0, b1) = unsafe {
                    let p = bt.as_ptr().add(d * ld + j0);
                    (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(8)))
                };
                for r in 0..R {
                    // SAFETY: d < head_dim = a[r].len().
                    let x = _mm256_set1_ps(unsafe { *a[r].get_unchecked(d) });
                    acc[r][0] = _mm256_fmadd_ps(x, b0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(x, b1, acc[r][1]);
                }
            }
            let (from, to) = (j0.max(lo), (j0 + TILE).min(hi));
            for r in 0..R {
                let mut lanes = [0f32; TILE];
                // SAFETY: `lanes` holds 16 floats.
                unsafe {
                    _mm256_storeu_ps(lanes.as_mut_ptr(), acc[r][0]);
                    _mm256_storeu_ps(lanes.as_mut_ptr().add(8), acc[r][1]);
                }
                let at = r * stride + col + from - lo;
                out[at..at + to - from].copy_from_slice(&lanes[from - j0..to - j0]);
            }
            j0 += TILE;
        }
    }

    /// See `Tiles::weighted_rows`.
    ///
    /// # Safety
    /// AVX2 and FMA are available.
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn weighted_rows(
        w: &[f32],
        stride: usize,
        col: usize,
        m: &[f32],
        span: (usize, usize),
        out: &mut [f32],
    ) {
        let rows = w.len() / stride;
        // SAFETY: forwarded.
        unsafe { rows!(rows, weighted_rows_r, w, stride, col, m, span, out) }
    }

    #[target_feature(enable = "avx2,fma")]
    unsafe fn weighted_rows_r<const R: usize>(
        w: &[f32],
        stride: usize,
        col: usize,
        m: &[f32],
        (lo, hi): (usize, usize),
        out: &mut [f32],
    ) {
        let head_dim = out.len() / R;
        assert!(out.len() == R * head_dim && head_dim.is_multiple_of(8));
        assert!(w.len() >= (R - 1) * stride + col + (hi - lo) && m.len() >= hi * head_dim);
        // Two 8-lane columns per pass: R x 2 accumulators.
        for d0 in (0..head_dim).step_by(16) {
            let two = d0 + 16 <= head_dim;
            let mut acc = [[_mm256_setzero_ps(); 2]; R];
            for r in 0..R {
                // SAFETY: columns d0 .. d0 + 8 (+ 8 when `two`) of out row r exist.
                unsafe {
                    let p = out.as_ptr().add(r * head_dim + d0);
                    acc[r][0] = _mm256_loadu_ps(p);
                    if two {
                        acc[r][1] = _mm256_loadu_ps(p.add(8));
                    }
                }
            }
            for j in lo..hi {
                // SAFETY: j < hi, so row j of m exists.
                let (v0, v1) = unsafe {
                    let p = m.as_ptr().add(j * head_dim + d0);
                    (
                        _mm256_loadu_ps(p),
                        if two {
                            _mm256_loadu_ps(p.add(8))
                        } else {
                            _mm256_setzero_ps()
                        },
                    )
                };
                for r in 0..R {
                    // SAFETY: inside w (asserted).
                    let p = _mm256_set1_ps(unsafe { *w.get_unchecked(r * stride + col + j - lo) });
                    acc[r][0] = _mm256_fmadd_ps(p, v0, acc[r][0]);
                    acc[r][1] = _mm256_fmadd_ps(p, v1, acc[r][1]);
                }
            }
            for r in 0..R {
                // SAFETY: as for the loads.
                unsafe {
                    let p = out.as_mut_ptr().add(r * head_dim + d0);
                    _mm256_storeu_ps(p, acc[r][0]);
                    if two {
                        _mm256_storeu_ps(p.add(8), acc[r][1]);
                    }
                }
            }
        }
    }

    /// See `Tiles::add_outer`.
    ///
    /// # Safety
    /// AVX2 and FMA are available.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    pub(super) unsafe fn add_outer(
        w: &[f32],
        stride: usize,
        col: usize,
        x: &[f32],
        scale: f32,
        span: (usize, usize),
        m: &mut [f32],
    ) {
        let rows = w.len() / stride;
        // SAFETY: forwarded.
        unsafe { rows!(rows, add_outer_r, w, stride, col, x, scale, span, m) }
    }

    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn add_outer_r<const R: usize>(
        w: &[f32],
        stride: usize,
        col: usize,
        x: &[f32],
        scale: f32,
        (lo, hi): (usize, usize),
        m: &mut [f32],
    ) {
        let head_dim = x.len() / R;
        assert!(x.len() == R * head_dim && head_dim.is_multiple_of(8));
        assert!(w.len() >= (R - 1) * stride + col + (hi - lo) && m.len() >= hi * head_dim);
        for j in lo..hi {
            let mut c = [_mm256_setzero_ps(); R];
            for r in 0..R {
                c[r] = _mm256_set1_ps(w[r * stride + col + j - lo] * scale);
            }
            for d0 in (0..head_dim).step_by(8) {
                // SAFETY: row j of m and rows r of x have head_dim values; d0 + 8 <= head_dim.
                unsafe {
                    let p = m.as_mut_ptr().add(j * head_dim + d0);
                    let mut acc = _mm256_loadu_ps(p);
                    for r in 0..R {
                        let xv = _mm256_loadu_ps(x.as_ptr().add(r * head_dim + d0));
                        acc = _mm256_fmadd_ps(c[r], xv, acc);
                    }
                    _mm256_storeu_ps(p, acc);
                }
            }
        }
    }
}

/// Softmax of `scale * s + bias` over each row of a block, in place (`s` holds `rows` rows of
/// the block's width). A row whose bias allows no key gets probabilities 0 (so it adds nothing
/// to the key and value gradients); the result marks those rows, whose outputs the caller sets
/// to NaN.
fn block_softmax<T: Real>(
    s: &mut [T],
    bias: &[T],
    dims: &Dims,
    b: usize,
    block: &Block,
    scale: T,
) -> [bool; QB] {
    let mut dead = [false; QB];
    for r in 0..block.rows {
        let row = &mut s[r * block.width..(r + 1) * block.width];
        let bias_row = &bias[dims.bias_row(b, block.head, block.first + r) * dims.k_len..];
        // Compiled for the widest vectors at hand, the maximum and the sum taken in lanes: as
        // serial chains they kept the exponentials from vectorizing, and this softmax was most
        // of the attention forward (about 10 ms of 15 a layer at SmolLM2-135M's shapes, batch
        // 8 x 256, on a Zen 4).
        let alive = crate::vexp::dispatch(
            #[inline(always)]
            || {
                for (lo, hi, col) in block.columns() {
                    for (v, &m) in row[col..col + hi - lo].iter_mut().zip(&bias_row[lo..hi]) {
                        *v = *v * scale + m;
                    }
                }
                crate::kernels::softmax_or_zeros(row)
            },
        );
        dead[r] = !alive;
    }
    dead
}

/// One (batch, key/value head) task's inputs: its query rows (all R heads), keys, values.
#[derive(Clone, Copy)]
struct Task<'a, T> {
    b: usize,
    g: usize,
    q: &'a [T],
    k: &'a [T],
    v: &'a [T],
}

impl<'a, T> Task<'a, T> {
    /// Task `index` (batch `index / kv_heads`, key/value head `index % kv_heads`) of a call.
    fn of(index: usize, dims: &Dims, q: &'a [T], k: &'a [T], v: &'a [T]) -> Self {
        let group_q = dims.group * dims.q_len * dims.head_dim;
        let kv_size = dims.k_len * dims.head_dim;
        Task {
            b: index / dims.kv_heads,
            g: index % dims.kv_heads,
            q: &q[index * group_q..(index + 1) * group_q],
            k: &k[index * kv_size..(index + 1) * kv_size],
            v: &v[index * kv_size..(index + 1) * kv_size],
        }
    }
}

/// `R` row slices of a `[rows, head_dim]` matrix from row `first`.
fn rows_of<T>(m: &[T], first: usize, rows: usize, head_dim: usize) -> Vec<&[T]> {
    (first..first + rows)
        .map(|r| &m[r * head_dim..(r + 1) * head_dim])
        .collect()
}

/// The forward blocks of one task: writes its output rows and, when `store` is not empty,
/// keeps every block's probabilities there.
fn forward_task<T: Tiles>(
    task: Task<'_, T>,
    bias: &[T],
    runs: &KeyRuns,
    dims: &Dims,
    scale: T,
    out: &mut [T],
    store: &mut [T],
) {
    let (d, ld) = (dims.head_dim, dims.padded_keys());
    let kt = transposed(task.k, dims.k_len, d, ld);
    let mut scratch = Vec::new();
    for block in &blocks(dims, runs, task.b, task.g) {
        let first = (block.head - task.g * dims.group) * dims.q_len + block.first;
        let o = &mut out[first * d..(first + block.rows) * d];
        if block.width == 0 {
            o.fill(T::nan());
            continue;
        }
        let s: &mut [T] = if store.is_empty() {
            scratch.resize(block.rows * block.width, T::zero());
            &mut scratch[..]
        } else {
            &mut store[block.offset..block.offset + block.rows * block.width]
        };
        let q_rows = rows_of(task.q, first, block.rows, d);
        for (lo, hi, col) in block.columns() {
            T::row_products(&q_rows, &kt, ld, (lo, hi), s, block.width, col);
        }
        let dead = block_softmax(s, bias, dims, task.b, block, scale);
        o.fill(T::zero());
        for (lo, hi, col) in block.columns() {
            T::weighted_rows(s, block.width, col, task.v, (lo, hi), o);
        }
        for (r, &is_dead) in dead.iter().enumerate() {
            if is_dead {
                o[r * d..(r + 1) * d].fill(T::nan());
            }
        }
    }
}

/// The backward blocks of one task: its query gradient rows, key and value gradients.
#[allow(clippy::too_many_arguments)]
fn backward_task<T: Tiles>(
    task: Task<'_, T>,
    grad_out: &[T],
    probs: &[T],
    runs: &KeyRuns,
    dims: &Dims,
    scale: T,
    dq: &mut [T],
    dk: &mut [T],
    dv: &mut [T],
) {
    let (d, ld) = (dims.head_dim, dims.padded_keys());
    let vt = transposed(task.v, dims.k_len, d, ld);
    let mut ds = Vec::new();
    for block in &blocks(dims, runs, task.b, task.g) {
        let width = block.width;
        let first = (block.head - task.g * dims.group) * dims.q_len + block.first;
        let dq_rows = &mut dq[first * d..(first + block.rows) * d];
        if width == 0 {
            dq_rows.fill(T::nan());
            continue;
        }
        let p = &probs[block.offset..block.offset + block.rows * width];
        // dP = dO V^T, then dS = P * (dP - rowsum(P * dP)) in place.
        ds.resize(block.rows * width, T::zero());
        let g_rows = rows_of(grad_out, first, block.rows, d);
        for (lo, hi, col) in block.columns() {
            T::row_products(&g_rows, &vt, ld, (lo, hi), &mut ds, width, col);
        }
        crate::vexp::dispatch(
            #[inline(always)]
            || {
                for (dsr, pr) in ds.chunks_exact_mut(width).zip(p.chunks_exact(width)) {
                    let dot = crate::kernels::lane_dot(dsr, pr);
                    for (x, &y) in dsr.iter_mut().zip(pr) {
                        *x = y * (*x - dot);
                    }
                }
            },
        );
        // dQ = scale dS K; dK += scale dS^T Q; dV += P^T dO.
        dq_rows.fill(T::zero());
        let q_rows = &task.q[first * d..(first + block.rows) * d];
        let g_rows = &grad_out[first * d..(first + block.rows) * d];
        for (lo, hi, col) in block.columns() {
            T::weighted_rows(&ds, width, col, task.k, (lo, hi), dq_rows);
            T::add_outer(&ds, width, col, q_rows, scale, (lo, hi), dk);
            T::add_outer(p, width, col, g_rows, T::one(), (lo, hi), dv);
        }
        dq_rows.iter_mut().for_each(|x| *x *= scale);
        for r in 0..block.rows {
            if runs
                .row(dims.bias_row(task.b, block.head, block.first + r))
                .is_empty()
            {
                dq_rows[r * d..(r + 1) * d].fill(T::nan());
            }
        }
    }
}

/// The forward pass: `out` = attention of `q`, `k`, `v` (layouts in the module doc); returns
/// the probabilities when `keep` is set. With `bf16`, the products run in bf16 (`packed`)
/// where the CPU and the mask suit it.
#[allow(clippy::too_many_arguments)]
pub(crate) fn forward<T: Tiles>(
    q: &[T],
    k: &[T],
    v: &[T],
    bias: &[T],
    runs: &KeyRuns,
    dims: Dims,
    scale: f64,
    keep: bool,
    bf16: bool,
) -> (Vec<T>, Option<Saved<T>>) {
    if bf16 && let Some((out, probs)) = T::packed_forward(q, k, v, bias, runs, dims, scale, keep) {
        return (
            out,
            keep.then_some(Saved {
                probs,
                packed: true,
            }),
        );
    }
    let scale = T::from(scale).unwrap_or_else(T::one);
    let (out, probs) = forward_tasks(q, k, v, &dims, |task, out| {
        let mut store = Vec::new();
        if keep {
            let blocks = blocks(&dims, runs, task.b, task.g);
            let total = blocks.last().map_or(0, |l| l.offset + l.rows * l.width);
            store.resize(total, T::zero());
        }
        forward_task(task, bias, runs, &dims, scale, out, &mut store);
        store
    });
    (
        out,
        keep.then_some(Saved {
            probs,
            packed: false,
        }),
    )
}

/// The backward pass: `(dq, dk, dv)` from `grad_out` (the layout of q), with the forward's
/// probabilities (`saved`, or recomputed).
#[allow(clippy::too_many_arguments)]
pub(crate) fn backward<T: Tiles>(
    q: &[T],
    k: &[T],
    v: &[T],
    bias: &[T],
    runs: &KeyRuns,
    dims: Dims,
    scale: f64,
    saved: Option<Saved<T>>,
    grad_out: &[T],
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let saved = match saved {
        Some(saved) => saved,
        None => forward(q, k, v, bias, runs, dims, scale, true, false)
            .1
            .expect("kept probabilities"),
    };
    if saved.packed {
        return T::packed_backward(q, k, v, runs, dims, scale, &saved.probs, grad_out)
            .expect("packed probabilities come from a type with the packed products");
    }
    let scale = T::from(scale).unwrap_or_else(T::one);
    backward_tasks(
        q,
        k,
        v,
        grad_out,
        &dims,
        &saved.probs,
        |task, grad, probs, dq, dk, dv| {
            backward_task(task, grad, probs, runs, &dims, scale, dq, dk, dv)
        },
    )
}

/// Runs `f(task, its output rows)` for every (batch, key/value head) task in parallel, over a
/// new output in q's layout; returns it with each task's result, in task order.
fn forward_tasks<T: Real, R: Send>(
    q: &[T],
    k: &[T],
    v: &[T],
    dims: &Dims,
    f: impl Fn(Task<'_, T>, &mut [T]) -> R + Sync,
) -> (Vec<T>, Vec<R>) {
    let d = dims.head_dim;
    let group_q = dims.group * dims.q_len * d;
    let mut out = vec![T::zero(); dims.batch * dims.q_heads() * dims.q_len * d];
    let results = out
        .par_chunks_mut(group_q.max(1))
        .enumerate()
        .map(|(index, out)| f(Task::of(index, dims, q, k, v), out))
        .collect();
    (out, results)
}

/// Runs `f(task, its rows of grad_out, its saved values, its dq, dk, dv)` for every task in
/// parallel, over new gradients (zeroed) in the layouts of q, k and v; returns them.
#[allow(clippy::type_complexity)]
fn backward_tasks<T: Real, S: Sync>(
    q: &[T],
    k: &[T],
    v: &[T],
    grad_out: &[T],
    dims: &Dims,
    saved: &[S],
    f: impl Fn(Task<'_, T>, &[T], &S, &mut [T], &mut [T], &mut [T]) + Sync,
) -> (Vec<T>, Vec<T>, Vec<T>) {
    let d = dims.head_dim;
    let group_q = dims.group * dims.q_len * d;
    let kv_size = dims.k_len * d;
    let tasks = dims.batch * dims.kv_heads;
    let mut dq = vec![T::zero(); tasks * group_q];
    let mut dk = vec![T::zero(); tasks * kv_size];
    let mut dv = vec![T::zero(); tasks * kv_size];
    dq.par_chunks_mut(group_q.max(1))
        .zip(dk.par_chunks_mut(kv_size.max(1)))
        .zip(dv.par_chunks_mut(kv_size.max(1)))
        .zip(saved.par_iter())
        .enumerate()
        .for_each(|(index, (((dq, dk), dv), saved))| {
            let grad = &grad_out[index * group_q..(index + 1) * group_q];
            f(Task::of(index, dims, q, k, v), grad, saved, dq, dk, dv);
        });
    (dq, dk, dv)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn runs_are_the_finite_stretches_of_each_row() {
        let inf = f32::NEG_INFINITY;
        let bias = [
            0.0, 0.0, inf, inf, 0.0, //
            inf, inf, inf, inf, inf, //
            -1.0, 0.5, 0.0, 0.0, 2.0,
        ];
        let runs = KeyRuns::from_bias(&bias, 5);
        assert_eq!(runs.row(0), &[(0, 2), (4, 5)]);
        assert!(runs.row(1).is_empty());
        assert_eq!(runs.row(2), &[(0, 5)]);
        assert!((runs.density(5) - 8.0 / 15.0).abs() < 1e-12);
    }
}
