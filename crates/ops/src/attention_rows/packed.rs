//! The attention products in bf16 (`vdpbf16ps`, f32 accumulation) for bf16-precision training:
//! the same blocks of query rows as the f32 tiles, each product run by `bf16`'s GEMM
//! microkernel on operands packed once per (batch, key/value head).
//!
//! Why: in f32 the attention products ran at 60-90 GFLOP/s on the 2-core Zen 4 (register tiles
//! of 4 query rows re-read K and V for every block; the key and value gradients were
//! load/store bound), about 11% of a bf16 training step at SmolLM2-135M's shapes. The
//! precision policy puts every matmul in bf16 with f32 accumulation; only the softmax, its
//! backward (`dS = P * (dP - rowsum(P * dP))`) and the row statistics stay in f32, as they do
//! in the f32 path.
//!
//! Layout: query rows go in tiles of [`MR`] (the microkernel's rows) of one head; a tile covers
//! the key columns from its rows' first allowed key (rounded down to a panel of `NR` keys) to
//! their last, masked entries getting probability 0 through their `-inf` bias. So a causal
//! mask or packed documents cost about their allowed pairs; masks with holes inside a row's
//! range (GRPO's shared-prefix groups) would not, and [`worthwhile`] sends those to the f32
//! span tiles. Products per tile: `S = Q K^T` and `dP = dO V^T` over panels of keys; `O = P V`
//! and `dQ = dS K` with the probabilities as pair words. The key and value gradients contract
//! over query rows: `dK^T = Q^T dS` and `dV^T = dO^T P`, with dS and P interleaved into panels
//! by row pairs as the tiles produce them, and per key panel only the query rows whose tiles
//! reach it.
//!
//! What it is not: an f32 path (f32 mode keeps the exact tiles) nor an AMX one (untested
//! here: CPUs without AVX512-BF16 keep the f32 tiles).

use super::{Dims, KeyRuns, Task, backward_tasks, forward_tasks};
use crate::bf16::{NR, convert, pair_words, rows_times_panel};

/// Query rows per tile: the microkernel's row block.
const MR: usize = 6;

/// Rows `i0..i0 + rows` of local head `h` and the key columns `c0..hi` (`c0` even) their
/// products cover; `S` and `dP` are computed over whole panels of keys from `base`.
#[derive(Clone, Copy, Debug)]
struct Tile {
    h: usize,
    i0: usize,
    rows: usize,
    c0: usize,
    hi: usize,
    /// Where the tile's `rows x width` probabilities start in the task's store.
    offset: usize,
}

impl Tile {
    fn width(&self) -> usize {
        self.hi - self.c0
    }

    fn panels(&self) -> std::ops::Range<usize> {
        self.c0 / NR..self.hi.div_ceil(NR)
    }

    /// The first key of the first panel.
    fn base(&self) -> usize {
        self.c0 / NR * NR
    }
}

/// The tiles of key/value head `g` of batch `b`, head by head.
fn tiles(dims: &Dims, runs: &KeyRuns, b: usize, g: usize) -> Vec<Tile> {
    let mut out = Vec::with_capacity(dims.group * dims.q_len.div_ceil(MR));
    let mut offset = 0;
    for h in 0..dims.group {
        let head = g * dims.group + h;
        for i0 in (0..dims.q_len).step_by(MR) {
            let rows = MR.min(dims.q_len - i0);
            let (mut lo, mut hi) = (usize::MAX, 0);
            for i in i0..i0 + rows {
                let row = runs.row(dims.bias_row(b, head, i));
                if let (Some(first), Some(last)) = (row.first(), row.last()) {
                    lo = lo.min(first.0);
                    hi = hi.max(last.1);
                }
            }
            let c0 = if hi == 0 { 0 } else { lo & !1 };
            out.push(Tile {
                h,
                i0,
                rows,
                c0,
                hi,
                offset,
            });
            offset += rows * (hi - c0);
        }
    }
    out
}

/// Whether this path serves the call: AVX512-BF16 at hand, and the tiles' ranges cost at most
/// a quarter more pairs than the mask allows (else the f32 span tiles do less work).
pub(super) fn worthwhile(dims: &Dims, runs: &KeyRuns) -> bool {
    if !crate::bf16::Backend::Avx512Bf16.available()
        || cfg!(target_endian = "big")
        || dims.head_dim == 0
    {
        return false;
    }
    let (mut computed, mut allowed) = (0usize, 0usize);
    for b in 0..dims.batch {
        for g in 0..dims.kv_heads {
            for tile in tiles(dims, runs, b, g) {
                computed += tile.rows * tile.width();
            }
            for h in 0..dims.group {
                for i in 0..dims.q_len {
                    let row = runs.row(dims.bias_row(b, g * dims.group + h, i));
                    allowed += row.iter().map(|(lo, hi)| hi - lo).sum::<usize>();
                }
            }
        }
    }
    computed * 4 <= allowed * 5
}

/// Panels of `NR` rows of `m` (`[n, d]`) as B of a product contracting over `d`:
/// `[n.div_ceil(NR)][d.div_ceil(2)][NR]` pair words (`PackedB::from_rows`'s layout).
fn row_panels(m: &[f32], n: usize, d: usize) -> Vec<u32> {
    let dp = d.div_ceil(2);
    let mut out = vec![0u32; n.div_ceil(NR) * dp * NR];
    let mut words = vec![0u32; dp];
    for (c, row) in m.chunks_exact(d).take(n).enumerate() {
        pair_words(row, &mut words);
        let base = (c / NR) * dp * NR + c % NR;
        for (j, &w) in words.iter().enumerate() {
            out[base + j * NR] = w;
        }
    }
    out
}

/// Panels of `NR` columns of `m` (`[n, d]`) as B of a product contracting over its `n` rows:
/// `[d.div_ceil(NR)][n.div_ceil(2)][NR]` pair words of row pairs (`PackedB::from_cols`).
fn column_panels(m: &[f32], n: usize, d: usize) -> Vec<u32> {
    let np = n.div_ceil(2);
    let mut out = vec![0u32; d.div_ceil(NR) * np * NR];
    for p in 0..d.div_ceil(NR) {
        let (first, cols) = (p * NR, (d - p * NR).min(NR));
        for j in 0..np {
            let lo = &m[2 * j * d + first..2 * j * d + first + cols];
            let hi = (2 * j + 1 < n).then(|| &m[(2 * j + 1) * d + first..][..cols]);
            convert::pairs(lo, hi, &mut out[(p * np + j) * NR..][..cols]);
        }
    }
    out
}

/// `m^T` (`m` is `[n, d]`) as A contracting over `n`: `d` rows of `n.div_ceil(2)` pair words
/// at the returned stride (a multiple of 16, as `a_cols_block` takes).
fn transposed_rows(m: &[f32], n: usize, d: usize) -> (Vec<u32>, usize) {
    let stride = n.div_ceil(2).div_ceil(16) * 16;
    let mut out = vec![0u32; d * stride];
    for first in (0..d).step_by(16) {
        let rows = (d - first).min(16);
        let dst = &mut out[first * stride..(first + rows) * stride];
        convert::a_cols_block(m, n, d, first, stride, dst);
    }
    (out, stride)
}

/// `dst[j][i] = src[i][j]` for `src` `[rows, cols]` with row stride `ld`.
fn transpose_into(src: &[f32], rows: usize, cols: usize, ld: usize, dst: &mut [f32]) {
    for (i, row) in src.chunks(ld).take(rows).enumerate() {
        for (j, &v) in row[..cols].iter().enumerate() {
            dst[j * rows + i] = v;
        }
    }
}

/// `s[r][c] = sum_j rows[r][j] . panels[p][j][c]` over the tile's key panels `p` (columns from
/// the tile's `base`, row stride `ld`): `S = Q K^T` and `dP = dO V^T` for one tile, `rows` its
/// query rows as pair words (`dp` per row), `panels` from `row_panels`.
fn key_panel_products(
    rows: &[u32],
    dp: usize,
    tile: &Tile,
    panels: &[u32],
    s: &mut [f32],
    ld: usize,
) {
    let p0 = tile.c0 / NR;
    for p in tile.panels() {
        rows_times_panel(
            rows,
            dp,
            tile.rows,
            dp,
            convert::halves_ref(&panels[p * dp * NR..(p + 1) * dp * NR]),
            &mut s[(p - p0) * NR..],
            ld,
            NR,
            false,
        );
    }
}

/// `out[r][c] = sum_j w[r][j] . m[c0 + j][c]` for the tile's rows (`out` row stride `d`):
/// `O = P V` and `dQ = dS K` for one tile, `w` its rows as pair words from key `c0` (stride
/// `lda`), `panels` `m`'s `column_panels` (`np` pairs each).
fn column_panel_products(
    w: &[u32],
    lda: usize,
    tile: &Tile,
    panels: &[u32],
    np: usize,
    out: &mut [f32],
    d: usize,
) {
    let pairs = tile.width().div_ceil(2);
    for pd in 0..d.div_ceil(NR) {
        let at = pd * np + tile.c0 / 2;
        rows_times_panel(
            w,
            lda,
            tile.rows,
            pairs,
            convert::halves_ref(&panels[at * NR..(at + pairs) * NR]),
            &mut out[pd * NR..],
            d,
            (d - pd * NR).min(NR),
            false,
        );
    }
}

/// `pair_words` into a reused buffer: an odd row's last value gets a zero partner (the
/// buffer's old value there would otherwise multiply a real key).
fn odd_pair_words(row: &[f32], dst: &mut [u32]) {
    pair_words(row, dst);
    if row.len() % 2 == 1 {
        dst[row.len() / 2] &= 0xffff;
    }
}

/// Softmax of `scale * s + bias` over each row of a tile (`rows` rows of `width` at stride
/// `ld`), in place; a row with no allowed key gets zeros and is marked dead.
#[allow(clippy::too_many_arguments)]
fn tile_softmax(
    s: &mut [f32],
    ld: usize,
    tile: &Tile,
    bias: &[f32],
    dims: &Dims,
    b: usize,
    head: usize,
    scale: f32,
) -> [bool; MR] {
    let mut dead = [false; MR];
    let width = tile.width();
    for (r, is_dead) in dead.iter_mut().enumerate().take(tile.rows) {
        let row = &mut s[r * ld..r * ld + width];
        let bias_row = &bias[dims.bias_row(b, head, tile.i0 + r) * dims.k_len + tile.c0..][..width];
        let alive = crate::vexp::dispatch(
            #[inline(always)]
            || {
                for (v, &m) in row.iter_mut().zip(bias_row) {
                    *v = *v * scale + m;
                }
                crate::kernels::softmax_or_zeros(row)
            },
        );
        *is_dead = !alive;
    }
    dead
}

/// The tiles of one task: its output rows, and its probabilities (tile by tile) when `keep`.
fn forward_task(
    task: &Task<'_, f32>,
    bias: &[f32],
    runs: &KeyRuns,
    dims: &Dims,
    scale: f32,
    out: &mut [f32],
    keep: bool,
) -> Vec<f32> {
    let (t, d) = (dims.q_len, dims.head_dim);
    let (dp, tp) = (d.div_ceil(2), dims.k_len.div_ceil(2));
    let key_panels = dims.k_len.div_ceil(NR);
    let ld = key_panels * NR;
    let tiles = tiles(dims, runs, task.b, task.g);
    let mut store = if keep {
        let total = tiles.last().map_or(0, |l| l.offset + l.rows * l.width());
        vec![0.0f32; total]
    } else {
        Vec::new()
    };
    let mut qw = vec![0u32; dims.group * t * dp];
    for (row, dst) in task.q.chunks_exact(d).zip(qw.chunks_exact_mut(dp)) {
        pair_words(row, dst);
    }
    let kp = row_panels(task.k, dims.k_len, d);
    let vp = column_panels(task.v, dims.k_len, d);
    let mut s = vec![0.0f32; MR * ld];
    let mut pw = vec![0u32; MR * (ld / 2)];
    for tile in &tiles {
        let first = tile.h * t + tile.i0;
        let o = &mut out[first * d..(first + tile.rows) * d];
        if tile.width() == 0 {
            o.fill(f32::NAN);
            continue;
        }
        let skip = tile.c0 - tile.base();
        key_panel_products(&qw[first * dp..], dp, tile, &kp, &mut s, ld);
        let head = task.g * dims.group + tile.h;
        let dead = tile_softmax(&mut s[skip..], ld, tile, bias, dims, task.b, head, scale);
        let width = tile.width();
        for r in 0..tile.rows {
            let row = &s[r * ld + skip..r * ld + skip + width];
            if keep {
                store[tile.offset + r * width..][..width].copy_from_slice(row);
            }
            odd_pair_words(row, &mut pw[r * (ld / 2)..]);
        }
        column_panel_products(&pw, ld / 2, tile, &vp, tp, o, d);
        for (r, &is_dead) in dead.iter().enumerate().take(tile.rows) {
            if is_dead {
                o[r * d..(r + 1) * d].fill(f32::NAN);
            }
        }
    }
    store
}

/// The forward pass (layouts as `attention_rows::forward`); the probabilities per task when
/// `keep` is set.
#[allow(clippy::too_many_arguments)]
pub(super) fn forward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    bias: &[f32],
    runs: &KeyRuns,
    dims: Dims,
    scale: f32,
    keep: bool,
) -> (Vec<f32>, Vec<Vec<f32>>) {
    forward_tasks(q, k, v, &dims, |task, out| {
        forward_task(&task, bias, runs, &dims, scale, out, keep)
    })
}

/// Per key panel, the pair rows `[from, to)` of head `h`'s query rows whose tiles reach it.
fn reaching_pairs(tiles: &[Tile], h: usize, panels: usize, q_len: usize) -> Vec<(usize, usize)> {
    let mut range = vec![(usize::MAX, 0usize); panels];
    for tile in tiles.iter().filter(|t| t.h == h && t.width() > 0) {
        for p in tile.panels() {
            range[p].0 = range[p].0.min(tile.i0 / 2);
            range[p].1 = range[p].1.max((tile.i0 + tile.rows).min(q_len).div_ceil(2));
        }
    }
    range
}

/// The tiles of one task backward: its query gradient rows, key and value gradients.
#[allow(clippy::too_many_arguments)]
fn backward_task(
    task: &Task<'_, f32>,
    grad: &[f32],
    probs: &[f32],
    runs: &KeyRuns,
    dims: &Dims,
    scale: f32,
    dq: &mut [f32],
    dk: &mut [f32],
    dv: &mut [f32],
) {
    let (t, d, kl) = (dims.q_len, dims.head_dim, dims.k_len);
    let (dp, kp2, tq) = (d.div_ceil(2), kl.div_ceil(2), t.div_ceil(2));
    let key_panels = kl.div_ceil(NR);
    let ld = key_panels * NR;
    let tiles = tiles(dims, runs, task.b, task.g);
    let mut gw = vec![0u32; dims.group * t * dp];
    for (row, dst) in grad.chunks_exact(d).zip(gw.chunks_exact_mut(dp)) {
        pair_words(row, dst);
    }
    let vp = row_panels(task.v, kl, d);
    let kc = column_panels(task.k, kl, d);
    let mut s = vec![0.0f32; MR * ld];
    let mut pw = vec![0u32; MR * (ld / 2)];
    // dK^T and dV^T, `[d][ld]`; per head, dS and P as panels over keys by query row pairs.
    let mut dkt = vec![0.0f32; d * ld];
    let mut dvt = vec![0.0f32; d * ld];
    let mut ds_panels = vec![0u32; key_panels * tq * NR];
    let mut p_panels = vec![0u32; key_panels * tq * NR];
    for h in 0..dims.group {
        ds_panels.fill(0);
        p_panels.fill(0);
        for tile in tiles.iter().filter(|tile| tile.h == h) {
            let first = h * t + tile.i0;
            let dq_rows = &mut dq[first * d..(first + tile.rows) * d];
            if tile.width() == 0 {
                dq_rows.fill(f32::NAN);
                continue;
            }
            let (skip, width) = (tile.c0 - tile.base(), tile.width());
            key_panel_products(&gw[first * dp..], dp, tile, &vp, &mut s, ld);
            let p_tile = &probs[tile.offset..tile.offset + tile.rows * width];
            // dS = scale * P * (dP - rowsum(P * dP)), in f32.
            crate::vexp::dispatch(
                #[inline(always)]
                || {
                    for (r, pr) in p_tile.chunks_exact(width).enumerate() {
                        let dsr = &mut s[r * ld + skip..r * ld + skip + width];
                        let dot = crate::kernels::lane_dot(dsr, pr);
                        for (x, &y) in dsr.iter_mut().zip(pr) {
                            *x = scale * y * (*x - dot);
                        }
                    }
                },
            );
            for r in 0..tile.rows {
                odd_pair_words(&s[r * ld + skip..][..width], &mut pw[r * (ld / 2)..]);
            }
            column_panel_products(&pw, ld / 2, tile, &kc, kp2, dq_rows, d);
            let head = task.g * dims.group + h;
            for r in 0..tile.rows {
                if runs
                    .row(dims.bias_row(task.b, head, tile.i0 + r))
                    .is_empty()
                {
                    dq_rows[r * d..(r + 1) * d].fill(f32::NAN);
                }
            }
            // Interleave the tile's row pairs of dS and P into the panels over keys.
            for rr in (0..tile.rows).step_by(2) {
                let pair = (tile.i0 + rr) / 2;
                let second = rr + 1 < tile.rows;
                for p in tile.panels() {
                    // Keys from..to of panel p, columns from - p NR.. of its pair row.
                    let (from, to) = (tile.c0.max(p * NR), tile.hi.min(p * NR + NR));
                    let cols = to - from;
                    let at = (p * tq + pair) * NR + from - p * NR;
                    let (in_s, in_p) = (from - tile.base(), from - tile.c0);
                    let lo = &s[rr * ld + in_s..][..cols];
                    let hi = second.then(|| &s[(rr + 1) * ld + in_s..][..cols]);
                    convert::pairs(lo, hi, &mut ds_panels[at..at + cols]);
                    let lo = &p_tile[rr * width + in_p..][..cols];
                    let hi = second.then(|| &p_tile[(rr + 1) * width + in_p..][..cols]);
                    convert::pairs(lo, hi, &mut p_panels[at..at + cols]);
                }
            }
        }
        let (q_t, lda) = transposed_rows(&task.q[h * t * d..(h + 1) * t * d], t, d);
        let (g_t, _) = transposed_rows(&grad[h * t * d..(h + 1) * t * d], t, d);
        for (p, &(from, to)) in reaching_pairs(&tiles, h, key_panels, t).iter().enumerate() {
            if from >= to {
                continue;
            }
            let cols = (kl - p * NR).min(NR);
            let panel = (p * tq + from) * NR..(p * tq + to) * NR;
            rows_times_panel(
                &q_t[from..],
                lda,
                d,
                to - from,
                convert::halves_ref(&ds_panels[panel.clone()]),
                &mut dkt[p * NR..],
                ld,
                cols,
                true,
            );
            rows_times_panel(
                &g_t[from..],
                lda,
                d,
                to - from,
                convert::halves_ref(&p_panels[panel]),
                &mut dvt[p * NR..],
                ld,
                cols,
                true,
            );
        }
    }
    transpose_into(&dkt, d, kl, ld, dk);
    transpose_into(&dvt, d, kl, ld, dv);
}

/// The backward pass: `(dq, dk, dv)` from `grad_out` and the forward's probabilities.
#[allow(clippy::too_many_arguments)]
pub(super) fn backward(
    q: &[f32],
    k: &[f32],
    v: &[f32],
    runs: &KeyRuns,
    dims: Dims,
    scale: f32,
    probs: &[Vec<f32>],
    grad_out: &[f32],
) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    backward_tasks(
        q,
        k,
        v,
        grad_out,
        &dims,
        probs,
        |task, grad, probs, dq, dk, dv| {
            backward_task(&task, grad, probs, runs, &dims, scale, dq, dk, dv)
        },
    )
}

#[cfg(test)]
mod tests {
    use super::super::{Dims, KeyRuns};

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n).map(|i| ((i as f32) * 0.61 + seed).sin()).collect()
    }

    /// The bf16 products against the f32 tiles on one mask: every output and gradient within
    /// bf16 rounding of the operands (relative 2^-7 of each result's scale), NaN exactly where
    /// the f32 path has NaN.
    fn check(dims: Dims, allowed: impl Fn(usize, usize, usize) -> bool) {
        if !crate::bf16::Backend::Avx512Bf16.available() {
            eprintln!("skipped: this CPU has no AVX512-BF16, the packed attention never runs");
            return;
        }
        let (q_len, k_len, d) = (dims.q_len, dims.k_len, dims.head_dim);
        let bias: Vec<f32> = (0..dims.bias_batch * q_len * k_len)
            .map(|idx| {
                let (b, i, j) = (idx / (q_len * k_len), (idx / k_len) % q_len, idx % k_len);
                if allowed(b, i, j) {
                    0.0
                } else {
                    f32::NEG_INFINITY
                }
            })
            .collect();
        let runs = KeyRuns::from_bias(&bias, k_len);
        assert!(
            super::worthwhile(&dims, &runs),
            "the mask should take the packed path"
        );
        let q = values(dims.batch * dims.q_heads() * q_len * d, 0.3);
        let k = values(dims.batch * dims.kv_heads * k_len * d, 1.1);
        let v = values(dims.batch * dims.kv_heads * k_len * d, 2.7);
        let grad = values(q.len(), 0.9);
        let scale = 1.0 / (d as f64).sqrt();
        let run = |bf16: bool| {
            let (out, saved) =
                super::super::forward(&q, &k, &v, &bias, &runs, dims, scale, true, bf16);
            let saved = saved.expect("kept");
            assert_eq!(saved.packed, bf16);
            let (dq, dk, dv) =
                super::super::backward(&q, &k, &v, &bias, &runs, dims, scale, Some(saved), &grad);
            [out, dq, dk, dv]
        };
        let (want, got) = (run(false), run(true));
        for (name, (w, g)) in ["out", "dq", "dk", "dv"].iter().zip(want.iter().zip(&got)) {
            assert_eq!(w.len(), g.len());
            let scale = w
                .iter()
                .filter(|x| x.is_finite())
                .fold(0f32, |m, x| m.max(x.abs()));
            for (i, (a, b)) in w.iter().zip(g).enumerate() {
                assert_eq!(a.is_nan(), b.is_nan(), "{name}[{i}]: {a} vs {b}");
                if a.is_finite() {
                    assert!(
                        (a - b).abs() <= 2f32.powi(-7) * scale,
                        "{name}[{i}]: f32 {a}, bf16 {b} (scale {scale})"
                    );
                }
            }
        }
    }

    fn dims(batch: usize, kv_heads: usize, group: usize, len: usize, head_dim: usize) -> Dims {
        Dims {
            batch,
            kv_heads,
            group,
            q_len: len,
            k_len: len,
            head_dim,
            bias_batch: 1,
            bias_heads: 1,
        }
    }

    #[test]
    fn causal_products_in_bf16_match_the_f32_tiles() {
        check(dims(2, 2, 3, 150, 64), |_, i, j| j <= i);
        // Odd length, a head size of two panels (the second partial) and an odd one.
        check(dims(1, 1, 2, 77, 96), |_, i, j| j <= i);
        check(dims(1, 2, 1, 33, 10), |_, i, j| j <= i);
        // Rows that see the keys from themselves to 50: tiles narrow as they go, with odd
        // widths ending before the last key (rows past 50 see nothing).
        check(dims(1, 1, 2, 77, 64), |_, i, j| j >= i && j <= 50);
    }

    #[test]
    fn packed_documents_and_dead_rows_match_the_f32_tiles() {
        // Documents of 90 tokens from 3 on: each row attends its document's earlier tokens,
        // so tiles start past key 0; rows 0-2 attend nothing (NaN outputs and gradients).
        let doc = |i: usize| if i < 3 { None } else { Some((i - 3) / 90) };
        check(dims(2, 1, 2, 170, 64), |_, i, j| match (doc(i), doc(j)) {
            (Some(a), Some(b)) => a == b && j <= i,
            _ => false,
        });
    }
}
