//! Small-batch matrix products for decoding: `y[b, j] = sum_k W[j, k] x[b, k]` for a few input
//! rows `b` (one per sequence being decoded) against a weight matrix that is streamed from memory
//! once per call.
//!
//! Why hand-written: at decode time a linear layer is a matrix-vector product per sequence. The
//! GEMM kernels (candle's `gemm`, stoke's bf16 AMX / `vdpbf16ps` tiles in `bf16.rs`) pad the
//! batch to a full tile (16 or 64 rows) and pack the activations per call, so at batch 1-8 they
//! spend most of their time on padding and bookkeeping, while the work is bound by the bytes of
//! the weights. Here each weight row is loaded once and multiplied against every input row while
//! it sits in registers.
//!
//! Weights come in two layouts:
//! - f32, row-major `[rows, cols]` (a model's own tensors, borrowed);
//! - bf16 in `PackedA`'s pair layout (row-major, two consecutive bf16 of a row per `u32`, rows
//!   padded to a multiple of 32 values). A pair word's high half is already the f32 bit pattern
//!   of the odd element and its low half shifted up is the even one, so one 64-byte load gives
//!   32 weights as two f32 vectors with two integer instructions. The inputs are rearranged
//!   once per call to match (`Inputs`, per 32-block: 16 even then 16 odd elements), and rounded
//!   to bf16 first, so every product is exactly the product of two bf16 values (the precision
//!   policy of `bf16.rs`) and every sum is in f32.
//!
//! Kernels: AVX-512F (any AVX-512 CPU; FMA into f32 lanes, which runs at full rate where
//! `vdpbf16ps` does not), AVX2 + FMA (the same tiles in 8 lanes and 16 registers), and a
//! portable loop; `cpu::level` picks the widest. `STOKE_MATVEC_KERNEL=portable`
//! forces the latter (tests, other CPUs). The two agree up to f32 summation order; each is
//! deterministic and independent of how rows are split between threads (a row's sum never
//! crosses a split).
#![allow(unsafe_code)]

use std::ops::Range;
use std::sync::OnceLock;

/// A weight matrix `W[rows, cols]` for `matvec`.
#[derive(Debug, Clone, Copy)]
pub enum Weights<'a> {
    /// Row-major f32, row stride `cols`.
    F32 {
        data: &'a [f32],
        rows: usize,
        cols: usize,
    },
    /// bf16 pairs (see the module doc); row `r`'s pair `p` is `data[r * stride + p]`,
    /// `stride` a multiple of 16 pairs with zero padding past `cols`.
    Bf16 {
        data: &'a [u32],
        rows: usize,
        cols: usize,
        stride: usize,
    },
}

impl Weights<'_> {
    pub fn rows(&self) -> usize {
        match *self {
            Weights::F32 { rows, .. } | Weights::Bf16 { rows, .. } => rows,
        }
    }

    pub fn cols(&self) -> usize {
        match *self {
            Weights::F32 { cols, .. } | Weights::Bf16 { cols, .. } => cols,
        }
    }

    pub fn is_bf16(&self) -> bool {
        matches!(self, Weights::Bf16 { .. })
    }

    /// Bytes the kernels read per pass over the matrix.
    pub fn bytes(&self) -> usize {
        match *self {
            Weights::F32 { rows, cols, .. } => rows * cols * 4,
            Weights::Bf16 { rows, stride, .. } => rows * stride * 4,
        }
    }

    fn check(&self) {
        match *self {
            Weights::F32 { data, rows, cols } => assert!(
                data.len() >= rows * cols,
                "matvec: {} f32 weights for [{rows}, {cols}]",
                data.len()
            ),
            Weights::Bf16 {
                data,
                rows,
                cols,
                stride,
            } => assert!(
                stride.is_multiple_of(16) && stride * 2 >= cols && data.len() >= rows * stride,
                "matvec: {} bf16 pair words for [{rows}, {cols}] at stride {stride}",
                data.len()
            ),
        }
    }
}

/// Input rows prepared for one weight layout: plain f32 for f32 weights; for bf16 weights
/// rounded to bf16, zero-padded to a multiple of 32 and rearranged per 32-block into 16 even
/// then 16 odd elements. Reused between calls to avoid allocation.
#[derive(Debug, Clone, Default)]
pub struct Inputs {
    batch: usize,
    cols: usize,
    /// Values per input row in `data`.
    stride: usize,
    bf16: bool,
    /// The weights these inputs meet come from memory, not cache (`stream_weights`).
    stream: bool,
    data: Vec<f32>,
    /// For bf16 weights, the same rounded values as bf16 pairs in natural order (`stride / 2`
    /// words per row), the operand of the `vdpbf16ps` kernel.
    pairs: Vec<u32>,
}

impl Inputs {
    pub fn new() -> Inputs {
        Inputs::default()
    }

    /// Prepares `x` (`[batch, cols]` row-major) for weights of the given layout.
    pub fn prepare(&mut self, x: &[f32], batch: usize, cols: usize, bf16: bool) {
        assert_eq!(
            x.len(),
            batch * cols,
            "matvec inputs: {} values for [{batch}, {cols}]",
            x.len()
        );
        self.batch = batch;
        self.cols = cols;
        self.bf16 = bf16;
        if !bf16 {
            self.stride = cols;
            self.data.clear();
            self.data.extend_from_slice(x);
            return;
        }
        let stride = cols.div_ceil(32) * 32;
        self.stride = stride;
        self.pairs.clear();
        self.pairs.resize(batch * stride / 2, 0);
        for (dst, row) in self
            .pairs
            .chunks_exact_mut(stride / 2)
            .zip(x.chunks_exact(cols))
        {
            crate::bf16::pair_words(row, dst);
        }
        // The FMA kernels' layout from the same rounded values: per 32-block the 16 even
        // elements (a pair word's low half, shifted up) then the 16 odd ones (its high half).
        self.data.clear();
        self.data.resize(batch * stride, 0.0);
        for (dst, words) in self
            .data
            .chunks_exact_mut(32)
            .zip(self.pairs.chunks_exact(16))
        {
            for (i, &word) in words.iter().enumerate() {
                dst[i] = f32::from_bits(word << 16);
                dst[16 + i] = f32::from_bits(word & 0xffff_0000);
            }
        }
    }

    pub fn batch(&self) -> usize {
        self.batch
    }

    /// Says whether the weight matrices these inputs will meet stream from memory (a model
    /// larger than the caches, each weight read once per decode step) or sit in cache (a small
    /// model). The AVX2 kernel then prefetches non-temporally, which on an AMD EPYC streamed a
    /// 135M model's bf16 weights about 15% faster at batch 1 and read cached weights about a
    /// third slower than ordinary prefetches. Results do not depend on it.
    pub fn stream_weights(&mut self, stream: bool) {
        self.stream = stream;
    }

    /// The inputs as given, `[batch, cols]` row-major, when prepared for f32 weights.
    pub(crate) fn f32_rows(&self) -> Option<&[f32]> {
        (!self.bf16).then_some(&self.data[..self.batch * self.cols])
    }
}

/// `x W^T` for `x` `[m, k]` and an f32 weight `W` `[n, k]`, both row-major: the streaming kernel
/// over blocks of 256 weight rows in parallel, so the weight is read once for all `m` input
/// rows. For few rows (decoding), where candle's GEMM packs the whole weight per call. Each
/// output is one row's dot product, whatever `m` and the thread split.
pub fn matmul_f32_weight_rows(x: &[f32], m: usize, w: &[f32], n: usize, k: usize) -> Vec<f32> {
    assert!(
        x.len() == m * k && w.len() == n * k,
        "matmul_f32_weight_rows: x {} values for [{m}, {k}], w {} for [{n}, {k}]",
        x.len(),
        w.len()
    );
    let mut out = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    let mut inputs = Inputs::new();
    inputs.prepare(x, m, k, false);
    let weights = Weights::F32 {
        data: w,
        rows: n,
        cols: k,
    };
    // A small weight is read on this thread: handing it to the pool costs more (a wake-up and
    // a sleep of the calling thread) than the product.
    if n * k <= SMALL_WEIGHT {
        matvec(&weights, &inputs, 0..n, &mut out, n);
    } else {
        matvec_parallel(&weights, &inputs, &mut out);
    }
    out
}

/// Weights of up to this many values (256 KiB in f32) are multiplied on the calling thread by
/// `matmul_f32_weight_rows`.
pub const SMALL_WEIGHT: usize = 1 << 16;

/// `out[b, j] = sum_k W[j, k] x[b, k]` for every weight row `j` (`out` is `[x.batch(), w.rows()]`),
/// blocks of 256 weight rows in parallel.
pub(crate) fn matvec_parallel(w: &Weights, x: &Inputs, out: &mut [f32]) {
    use rayon::prelude::*;
    const ROWS: usize = 256;
    let n = w.rows();
    assert!(
        out.len() >= x.batch * n,
        "matvec_parallel: output of {} values too small for [{}, {n}]",
        out.len(),
        x.batch
    );
    let c = crate::bf16::SyncPtr(out.as_mut_ptr());
    (0..n.div_ceil(ROWS)).into_par_iter().for_each(|block| {
        let rows = block * ROWS..((block + 1) * ROWS).min(n);
        // SAFETY: block `block` writes columns `rows` of every output row, disjoint from every
        // other block's, inside `out` ([batch, n], checked above).
        unsafe { matvec_raw(w, x, rows.clone(), c.get().add(rows.start), n) };
    });
}

/// Which kernel runs `matvec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kernel {
    /// AVX-512F with `vdpbf16ps` for bf16 weights (AVX512-BF16: AMD Zen 4 and later, Intel
    /// Cooper Lake and Sapphire Rapids and later); f32 weights as `Avx512`.
    Avx512Bf16,
    Avx512,
    Avx2,
    Portable,
}

impl Kernel {
    pub fn name(self) -> &'static str {
        match self {
            Kernel::Avx512Bf16 => "avx512-bf16",
            Kernel::Avx512 => "avx512",
            Kernel::Avx2 => "avx2",
            Kernel::Portable => "portable",
        }
    }
}

/// The kernel in use: the widest the CPU has (`cpu::level`, which `STOKE_SIMD` lowers; AVX-512
/// with `vdpbf16ps` where the CPU has AVX512-BF16), unless `STOKE_MATVEC_KERNEL` names one
/// (`portable`, or `avx512` for AVX-512 without `vdpbf16ps`).
pub fn kernel() -> Kernel {
    static CHOSEN: OnceLock<Kernel> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        match std::env::var("STOKE_MATVEC_KERNEL").as_deref() {
            Ok("portable") => return Kernel::Portable,
            Ok("avx512") if Kernel::Avx512.available() => return Kernel::Avx512,
            _ => {}
        }
        match crate::cpu::level() {
            crate::cpu::Level::Avx512 if Kernel::Avx512Bf16.available() => Kernel::Avx512Bf16,
            crate::cpu::Level::Avx512 => Kernel::Avx512,
            crate::cpu::Level::Avx2 => Kernel::Avx2,
            crate::cpu::Level::Baseline => Kernel::Portable,
        }
    })
}

/// `out[b * out_stride + (j - rows.start)] = sum_k W[j, k] x[b, k]` for `j` in `rows`, every
/// input row `b`. The safe entry point (one writer of `out`).
pub fn matvec(w: &Weights, x: &Inputs, rows: Range<usize>, out: &mut [f32], out_stride: usize) {
    let batch = x.batch;
    let width = rows.len();
    if batch == 0 || width == 0 {
        return;
    }
    assert!(
        out_stride >= width && out.len() >= (batch - 1) * out_stride + width,
        "matvec: output of {} values too small for {batch} rows of {width} at stride {out_stride}",
        out.len()
    );
    // SAFETY: the assertion above bounds every write; `out` is borrowed mutably, so no one else
    // reads or writes it meanwhile.
    unsafe { matvec_raw(w, x, rows, out.as_mut_ptr(), out_stride) }
}

/// As `matvec`, writing through a raw pointer (threads writing disjoint columns of one buffer).
///
/// # Safety
/// `out` points at element `(0, rows.start)` of a buffer where `out + b * out_stride + c` is
/// valid for writes for every `b < x.batch()` and `c < rows.len()`, and nothing else accesses
/// those elements during the call.
pub(crate) unsafe fn matvec_raw(
    w: &Weights,
    x: &Inputs,
    rows: Range<usize>,
    out: *mut f32,
    out_stride: usize,
) {
    // SAFETY: forwarded; `kernel()` is available on this CPU.
    unsafe { matvec_with(kernel(), w, x, rows, out, out_stride) }
}

impl Kernel {
    /// Whether this CPU can run the kernel.
    pub fn available(self) -> bool {
        match self {
            Kernel::Avx512Bf16 => {
                crate::cpu::detected() >= crate::cpu::Level::Avx512 && avx512_bf16_detected()
            }
            Kernel::Avx512 => crate::cpu::detected() >= crate::cpu::Level::Avx512,
            Kernel::Avx2 => crate::cpu::detected() >= crate::cpu::Level::Avx2,
            Kernel::Portable => true,
        }
    }
}

fn avx512_bf16_detected() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// As `matvec_raw` with a given kernel.
///
/// # Safety
/// As `matvec_raw`, and `kernel.available()`.
unsafe fn matvec_with(
    kernel: Kernel,
    w: &Weights,
    x: &Inputs,
    rows: Range<usize>,
    out: *mut f32,
    out_stride: usize,
) {
    assert!(
        kernel.available(),
        "matvec: the {} kernel is not available",
        kernel.name()
    );
    w.check();
    assert!(
        rows.end <= w.rows(),
        "matvec: rows {rows:?} of {}",
        w.rows()
    );
    assert_eq!(
        (x.cols, x.bf16),
        (w.cols(), w.is_bf16()),
        "matvec: inputs prepared for {} columns ({}), weights have {} ({})",
        x.cols,
        if x.bf16 { "bf16" } else { "f32" },
        w.cols(),
        if w.is_bf16() { "bf16" } else { "f32" }
    );
    // A kernel call streams its rows once per group of 8 inputs. Past 8 inputs the work is
    // tiled so that a block of weight rows and a chunk of inputs stay in L2 together while every
    // group of the chunk passes over the block: the weights are read from memory once per chunk
    // (once per call up to 64 inputs, as decoding has), the inputs once per block. Each output
    // is still one tile's sum over its own row, in the same order, and the groups of 8 start at
    // the same inputs: results do not change with the tiling.
    let block = if x.batch > 8 {
        let row_bytes = w.cols() * if w.is_bf16() { 2 } else { 4 };
        (BLOCK_BYTES / row_bytes.max(1)).clamp(8, rows.len().max(8)) / 8 * 8
    } else {
        rows.len().max(1)
    };
    let mut first = 0;
    while first < x.batch {
        let last = (first + INPUT_CHUNK).min(x.batch);
        let mut start = rows.start;
        while start < rows.end {
            let end = (start + block).min(rows.end);
            // SAFETY: `out + (start - rows.start)` is element (0, start) of the caller's buffer,
            // and the block's columns lie inside the caller's range.
            let out = unsafe { out.add(start - rows.start) };
            match kernel {
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX-512F (asserted); bounds as documented.
                Kernel::Avx512 => unsafe {
                    avx512::matvec(w, x, first..last, start..end, out, out_stride, false)
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX-512F and AVX512-BF16 (asserted); bounds as documented.
                Kernel::Avx512Bf16 => unsafe {
                    avx512::matvec(w, x, first..last, start..end, out, out_stride, true)
                },
                #[cfg(target_arch = "x86_64")]
                // SAFETY: the CPU has AVX2 and FMA (asserted); bounds as documented.
                Kernel::Avx2 => unsafe {
                    avx2::matvec(w, x, first..last, start..end, out, out_stride)
                },
                // SAFETY: bounds as documented (the caller's contract).
                _ => unsafe { portable(w, x, first..last, start..end, out, out_stride) },
            }
            start = end;
        }
        first = last;
    }
}

/// Bytes of weight rows per block when more than one group of inputs passes over them.
const BLOCK_BYTES: usize = 192 << 10;
/// Inputs per chunk (a multiple of the kernels' 8-input groups).
const INPUT_CHUNK: usize = 64;

/// `sum_i a[i] b[i]` (the attention's query-key products), in 16 lanes.
pub(crate) fn dot(a: &[f32], b: &[f32]) -> f32 {
    assert_eq!(a.len(), b.len(), "dot: lengths differ");
    #[cfg(target_arch = "x86_64")]
    match kernel() {
        // SAFETY: AVX-512F is available (the kernel choice); lengths are equal.
        Kernel::Avx512 | Kernel::Avx512Bf16 => return unsafe { avx512::dot(a, b) },
        // SAFETY: AVX2 and FMA are available (the kernel choice); lengths are equal.
        Kernel::Avx2 => return unsafe { avx2::dot(a, b) },
        Kernel::Portable => {}
    }
    let mut lanes = [0f32; 16];
    let body = a.len() - a.len() % 16;
    for (ac, bc) in a[..body].chunks_exact(16).zip(b[..body].chunks_exact(16)) {
        for l in 0..16 {
            lanes[l] += ac[l] * bc[l];
        }
    }
    let mut sum: f32 = lanes.iter().sum();
    for (x, y) in a[body..].iter().zip(&b[body..]) {
        sum += x * y;
    }
    sum
}

/// `y += alpha x` (the attention's weighted sum of values).
pub(crate) fn axpy(y: &mut [f32], alpha: f32, x: &[f32]) {
    assert_eq!(y.len(), x.len(), "axpy: lengths differ");
    #[cfg(target_arch = "x86_64")]
    match kernel() {
        // SAFETY: AVX-512F is available (the kernel choice); lengths are equal.
        Kernel::Avx512 | Kernel::Avx512Bf16 => return unsafe { avx512::axpy(y, alpha, x) },
        // SAFETY: AVX2 and FMA are available (the kernel choice); lengths are equal.
        Kernel::Avx2 => return unsafe { avx2::axpy(y, alpha, x) },
        Kernel::Portable => {}
    }
    for (o, &v) in y.iter_mut().zip(x) {
        *o += alpha * v;
    }
}

/// # Safety
/// As `matvec_raw`.
unsafe fn portable(
    w: &Weights,
    x: &Inputs,
    inputs: Range<usize>,
    rows: Range<usize>,
    out: *mut f32,
    out_stride: usize,
) {
    let start = rows.start;
    for j in rows {
        for b in inputs.clone() {
            let xr = &x.data[b * x.stride..(b + 1) * x.stride];
            let mut lanes = [0f32; 16];
            match *w {
                Weights::F32 { data, cols, .. } => {
                    let row = &data[j * cols..(j + 1) * cols];
                    let (body, tail) = row.split_at(cols - cols % 16);
                    for (wc, xc) in body.chunks_exact(16).zip(xr.chunks_exact(16)) {
                        for l in 0..16 {
                            lanes[l] += wc[l] * xc[l];
                        }
                    }
                    for (l, (&wv, &xv)) in tail.iter().zip(&xr[cols - cols % 16..]).enumerate() {
                        lanes[l] += wv * xv;
                    }
                }
                Weights::Bf16 { data, stride, .. } => {
                    let row = &data[j * stride..(j + 1) * stride];
                    for (wc, xc) in row.chunks_exact(16).zip(xr.chunks_exact(32)) {
                        for l in 0..16 {
                            let even = f32::from_bits(wc[l] << 16);
                            let odd = f32::from_bits(wc[l] & 0xffff_0000);
                            lanes[l] += even * xc[l];
                            lanes[l] += odd * xc[16 + l];
                        }
                    }
                }
            }
            // SAFETY: (b, j - start) is inside the caller's output (see `matvec_raw`).
            unsafe { *out.add(b * out_stride + j - start) = lanes.iter().sum() };
        }
    }
}

/// Rows `rows` in tiles of `$r` weight rows `gap` apart (one stream per tile row over its
/// `$r`-th of the range; see `avx2`'s module doc), then the rows left over one at a time, against
/// `$nb` inputs.
macro_rules! tiles {
    ($tile:ident, $r:expr, $nb:expr, $args:expr) => {{
        let (w, ws, x, xs, rows, out, os, stream) = $args;
        if stream {
            tiles!(@walk $tile, $r, $nb, true, (w, ws, x, xs, rows, out, os))
        } else {
            tiles!(@walk $tile, $r, $nb, false, (w, ws, x, xs, rows, out, os))
        }
    }};
    (@walk $tile:ident, $r:expr, $nb:expr, $stream:expr, ($w:expr, $ws:expr, $x:expr, $xs:expr, $rows:expr, $out:expr, $os:expr)) => {{
        let gap = ($rows.end - $rows.start) / $r;
        for i in 0..gap {
            $tile::<$r, $nb, $stream>($w, $ws, $rows.start + i, gap, $x, $xs, $out.add(i), $os);
        }
        for j in $rows.start + gap * $r..$rows.end {
            $tile::<1, $nb, $stream>($w, $ws, j, 0, $x, $xs, $out.add(j - $rows.start), $os);
        }
    }};
}

/// A prefetch of the line at `p` (a hint, valid for any address): non-temporal when the
/// weights stream from memory (`Inputs::stream_weights`), into L1 otherwise.
#[cfg(target_arch = "x86_64")]
#[inline(always)]
fn prefetch<const STREAM: bool>(p: *const i8) {
    if STREAM {
        // SAFETY: a prefetch is a hint; it never faults, whatever the address.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_NTA }>(p) }
    } else {
        // SAFETY: as above.
        unsafe { std::arch::x86_64::_mm_prefetch::<{ std::arch::x86_64::_MM_HINT_T0 }>(p) }
    }
}

#[cfg(target_arch = "x86_64")]
// Register tiles are fixed-size arrays indexed by row and input: loops over indices read best.
#[allow(clippy::needless_range_loop, clippy::int_plus_one)]
mod avx512 {
    //! A tile's R weight rows are R long streams, as in the AVX2 kernels (see `super::avx2`'s
    //! module doc): tile row r walks the r-th of R equal parts of the row range, prefetching
    //! `PREFETCH_BYTES` ahead in its own stream (non-temporally when the weights stream from
    //! memory). Measured on an AMD EPYC (Zen 4, AVX-512), SmolLM2-135M's bf16 weights, 2
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
                        nb,
                        rows.clone(),
                        op,
                        out_stride,
                        x.stream,
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
                        x.stream,
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
                        x.stream,
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
        nb: usize,
        rows: Range<usize>,
        out: *mut f32,
        out_stride: usize,
        stream: bool,
    ) {
        let args = (w, stride, x, x_stride, rows, out, out_stride, stream);
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
    unsafe fn bf16_dp_tile<const R: usize, const NB: usize, const STREAM: bool>(
        w: *const u32,
        stride: usize,
        j: usize,
        gap: usize,
        x: *const u32,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NB]; R];
        let blocks = stride / 16;
        for block in 0..blocks {
            let mut wv = [_mm512_setzero_si512(); R];
            for r in 0..R {
                let at = (j + r * gap) * stride + block * 16;
                // SAFETY: pair words block * 16 .. + 16 of row j + r * gap exist.
                wv[r] = unsafe { _mm512_loadu_si512(w.add(at) as *const __m512i) };
                // PREFETCH_BYTES on in this row's stream: a hint, valid for any address.
                prefetch::<STREAM>(w.wrapping_add(at + prefetch_ahead(NB) / 4) as *const i8);
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

    /// # Safety
    /// As `matvec`, with `nb <= MAX_BATCH` input rows at `x`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn bf16_rows(
        w: *const u32,
        stride: usize,
        x: *const f32,
        x_stride: usize,
        nb: usize,
        rows: Range<usize>,
        out: *mut f32,
        out_stride: usize,
        stream: bool,
    ) {
        let args = (w, stride, x, x_stride, rows, out, out_stride, stream);
        // Tiles fit 32 registers: R x NB accumulators, 2R weight vectors, 2 input vectors.
        // SAFETY: forwarded bounds.
        unsafe {
            match nb {
                1 => tiles!(bf16_tile, 8, 1, args),
                2 => tiles!(bf16_tile, 6, 2, args),
                3 => tiles!(bf16_tile, 4, 3, args),
                4 => tiles!(bf16_tile, 4, 4, args),
                5 => tiles!(bf16_tile, 2, 5, args),
                6 => tiles!(bf16_tile, 2, 6, args),
                7 => tiles!(bf16_tile, 2, 7, args),
                _ => tiles!(bf16_tile, 2, 8, args),
            }
        }
    }

    /// # Safety
    /// As `matvec`, with `nb <= MAX_BATCH` input rows at `x`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f")]
    unsafe fn f32_rows(
        w: *const f32,
        cols: usize,
        x: *const f32,
        x_stride: usize,
        nb: usize,
        rows: Range<usize>,
        out: *mut f32,
        out_stride: usize,
        stream: bool,
    ) {
        let args = (w, cols, x, x_stride, rows, out, out_stride, stream);
        // R x NB accumulators, R weight vectors, 1 input vector.
        // SAFETY: forwarded bounds.
        unsafe {
            match nb {
                1 => tiles!(f32_tile, 8, 1, args),
                2 => tiles!(f32_tile, 6, 2, args),
                3 => tiles!(f32_tile, 4, 3, args),
                4 => tiles!(f32_tile, 4, 4, args),
                5 => tiles!(f32_tile, 2, 5, args),
                6 => tiles!(f32_tile, 2, 6, args),
                7 => tiles!(f32_tile, 2, 7, args),
                _ => tiles!(f32_tile, 2, 8, args),
            }
        }
    }

    /// Rows `j + r * gap` (r < R) of bf16 pair weights against `NB` prepared input rows; output
    /// `(b, r)` at `out + b * out_stride + r * gap`.
    ///
    /// # Safety
    /// The rows exist (`stride` pair words each, a multiple of 16), the inputs hold
    /// `2 * stride` values per row (`x_stride`), and `out` has room for these outputs.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn bf16_tile<const R: usize, const NB: usize, const STREAM: bool>(
        w: *const u32,
        stride: usize,
        j: usize,
        gap: usize,
        x: *const f32,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let high = _mm512_set1_epi32(0xffff_0000_u32 as i32);
        let mut acc = [[_mm512_setzero_ps(); NB]; R];
        let blocks = stride / 16;
        for block in 0..blocks {
            let mut even = [_mm512_setzero_ps(); R];
            let mut odd = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let at = (j + r * gap) * stride + block * 16;
                // SAFETY: pair words block * 16 .. + 16 of row j + r * gap exist.
                let v = unsafe { _mm512_loadu_si512(w.add(at) as *const __m512i) };
                // PREFETCH_BYTES on in this row's stream: a hint, valid for any address.
                prefetch::<STREAM>(w.wrapping_add(at + prefetch_ahead(NB) / 4) as *const i8);
                even[r] = _mm512_castsi512_ps(_mm512_slli_epi32::<16>(v));
                odd[r] = _mm512_castsi512_ps(_mm512_and_si512(v, high));
            }
            for b in 0..NB {
                // SAFETY: values block * 32 .. + 32 of input row b exist.
                let (xe, xo) = unsafe {
                    let p = x.add(b * x_stride + block * 32);
                    (_mm512_loadu_ps(p), _mm512_loadu_ps(p.add(16)))
                };
                for r in 0..R {
                    acc[r][b] = _mm512_fmadd_ps(even[r], xe, acc[r][b]);
                    acc[r][b] = _mm512_fmadd_ps(odd[r], xo, acc[r][b]);
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

    /// Rows `j + r * gap` (r < R) of row-major f32 weights (`cols` per row) against `NB` input
    /// rows; output `(b, r)` at `out + b * out_stride + r * gap`.
    ///
    /// # Safety
    /// The rows exist, the inputs hold `cols` values per row (`x_stride`), and `out` has room
    /// for these outputs.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx512f")]
    unsafe fn f32_tile<const R: usize, const NB: usize, const STREAM: bool>(
        w: *const f32,
        cols: usize,
        j: usize,
        gap: usize,
        x: *const f32,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let mut acc = [[_mm512_setzero_ps(); NB]; R];
        let body = cols - cols % 16;
        let mut k = 0;
        while k < body {
            let mut wv = [_mm512_setzero_ps(); R];
            for r in 0..R {
                let at = (j + r * gap) * cols + k;
                // SAFETY: values k .. k + 16 of row j + r * gap exist.
                wv[r] = unsafe { _mm512_loadu_ps(w.add(at)) };
                // A hint, valid for any address (see bf16_tile).
                prefetch::<STREAM>(w.wrapping_add(at + prefetch_ahead(NB) / 4) as *const i8);
            }
            for b in 0..NB {
                // SAFETY: values k .. k + 16 of input row b exist.
                let xv = unsafe { _mm512_loadu_ps(x.add(b * x_stride + k)) };
                for r in 0..R {
                    acc[r][b] = _mm512_fmadd_ps(wv[r], xv, acc[r][b]);
                }
            }
            k += 16;
        }
        for r in 0..R {
            for b in 0..NB {
                let mut sum = _mm512_reduce_add_ps(acc[r][b]);
                for kk in body..cols {
                    // SAFETY: in bounds as above.
                    sum += unsafe { *w.add((j + r * gap) * cols + kk) * *x.add(b * x_stride + kk) };
                }
                // SAFETY: (b, r) is inside the output tile.
                unsafe { *out.add(b * out_stride + r * gap) = sum };
            }
        }
    }
}

#[cfg(target_arch = "x86_64")]
// Register tiles are fixed-size arrays indexed by row and input: loops over indices read best.
// `j + R <= end` reads as "a whole tile fits" for every R, 1 included.
#[allow(clippy::needless_range_loop, clippy::int_plus_one)]
mod avx2 {
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
    use super::{Inputs, Weights, prefetch};
    use std::arch::x86_64::*;
    use std::ops::Range;

    const MAX_BATCH: usize = 8;
    /// How far ahead in its stream each tile row prefetches, in bytes.
    const PREFETCH_BYTES: usize = 1024;

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
                        x.stream,
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
                        x.stream,
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
                acc1 =
                    _mm256_fmadd_ps(_mm256_loadu_ps(pa.add(8)), _mm256_loadu_ps(pb.add(8)), acc1);
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

    /// # Safety
    /// As `matvec`, with `nb <= MAX_BATCH` input rows at `x`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bf16_rows(
        w: *const u32,
        stride: usize,
        x: *const f32,
        x_stride: usize,
        nb: usize,
        rows: Range<usize>,
        out: *mut f32,
        out_stride: usize,
        stream: bool,
    ) {
        let args = (w, stride, x, x_stride, rows, out, out_stride, stream);
        // Tiles fit 16 registers: R x NB accumulators, 2R weight vectors, 2 input vectors (at
        // NB = 1 the weight vectors are used as they are loaded, so 6 rows fit).
        // SAFETY: forwarded bounds.
        unsafe {
            match nb {
                1 => tiles!(bf16_tile, 6, 1, args),
                2 => tiles!(bf16_tile, 3, 2, args),
                3 => tiles!(bf16_tile, 2, 3, args),
                4 => tiles!(bf16_tile, 2, 4, args),
                5 => tiles!(bf16_tile, 1, 5, args),
                6 => tiles!(bf16_tile, 1, 6, args),
                7 => tiles!(bf16_tile, 1, 7, args),
                _ => tiles!(bf16_tile, 1, 8, args),
            }
        }
    }

    /// # Safety
    /// As `matvec`, with `nb <= MAX_BATCH` input rows at `x`.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn f32_rows(
        w: *const f32,
        cols: usize,
        x: *const f32,
        x_stride: usize,
        nb: usize,
        rows: Range<usize>,
        out: *mut f32,
        out_stride: usize,
        stream: bool,
    ) {
        let args = (w, cols, x, x_stride, rows, out, out_stride, stream);
        // R x NB accumulators, R weight vectors, 1 input vector.
        // SAFETY: forwarded bounds.
        unsafe {
            match nb {
                1 => tiles!(f32_tile, 6, 1, args),
                2 => tiles!(f32_tile, 4, 2, args),
                3 => tiles!(f32_tile, 3, 3, args),
                4 => tiles!(f32_tile, 2, 4, args),
                5 => tiles!(f32_tile, 2, 5, args),
                6 => tiles!(f32_tile, 2, 6, args),
                7 => tiles!(f32_tile, 1, 7, args),
                _ => tiles!(f32_tile, 1, 8, args),
            }
        }
    }

    /// Rows `j + r * gap` (r < R) of bf16 pair weights against `NB` prepared input rows; output
    /// `(b, r)` at `out + b * out_stride + r * gap`.
    ///
    /// # Safety
    /// As `super::avx512::bf16_tile`, for these rows.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn bf16_tile<const R: usize, const NB: usize, const STREAM: bool>(
        w: *const u32,
        stride: usize,
        j: usize,
        gap: usize,
        x: *const f32,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let high = _mm256_set1_epi32(0xffff_0000_u32 as i32);
        let mut acc = [[_mm256_setzero_ps(); NB]; R];
        let blocks = stride / 16;
        for block in 0..blocks {
            for r in 0..R {
                // One 64-byte line per row and block, PREFETCH_BYTES on in this row's stream:
                // a hint, valid for any address.
                prefetch::<STREAM>(
                    w.wrapping_add((j + r * gap) * stride + block * 16 + PREFETCH_BYTES / 4)
                        as *const i8,
                );
            }
            for half in 0..2 {
                let mut even = [_mm256_setzero_ps(); R];
                let mut odd = [_mm256_setzero_ps(); R];
                for r in 0..R {
                    let at = (j + r * gap) * stride + block * 16 + half * 8;
                    // SAFETY: pair words at .. at + 8 of row j + r * gap exist (stride is a
                    // multiple of 16 pair words).
                    let v = unsafe { _mm256_loadu_si256(w.add(at) as *const __m256i) };
                    even[r] = _mm256_castsi256_ps(_mm256_slli_epi32::<16>(v));
                    odd[r] = _mm256_castsi256_ps(_mm256_and_si256(v, high));
                }
                for b in 0..NB {
                    // SAFETY: values block * 32 .. + 32 of input row b exist; this half reads
                    // the even values 8 * half .. + 8 and the odd ones 16 + 8 * half .. + 8.
                    let (xe, xo) = unsafe {
                        let p = x.add(b * x_stride + block * 32 + half * 8);
                        (_mm256_loadu_ps(p), _mm256_loadu_ps(p.add(16)))
                    };
                    for r in 0..R {
                        acc[r][b] = _mm256_fmadd_ps(even[r], xe, acc[r][b]);
                        acc[r][b] = _mm256_fmadd_ps(odd[r], xo, acc[r][b]);
                    }
                }
            }
        }
        for r in 0..R {
            for b in 0..NB {
                // SAFETY: (b, r) is inside the output tile.
                unsafe { *out.add(b * out_stride + r * gap) = hsum(acc[r][b]) };
            }
        }
    }

    /// Rows `j + r * gap` (r < R) of row-major f32 weights (`cols` per row) against `NB` input
    /// rows; output `(b, r)` at `out + b * out_stride + r * gap`.
    ///
    /// # Safety
    /// As `super::avx512::f32_tile`, for these rows.
    #[allow(clippy::too_many_arguments)]
    #[inline]
    #[target_feature(enable = "avx2,fma")]
    unsafe fn f32_tile<const R: usize, const NB: usize, const STREAM: bool>(
        w: *const f32,
        cols: usize,
        j: usize,
        gap: usize,
        x: *const f32,
        x_stride: usize,
        out: *mut f32,
        out_stride: usize,
    ) {
        let mut acc = [[_mm256_setzero_ps(); NB]; R];
        let body = cols - cols % 8;
        let mut k = 0;
        while k < body {
            let mut wv = [_mm256_setzero_ps(); R];
            for r in 0..R {
                let at = (j + r * gap) * cols + k;
                // SAFETY: values k .. k + 8 of row j + r * gap exist.
                wv[r] = unsafe { _mm256_loadu_ps(w.add(at)) };
                if k % 16 == 0 {
                    // A hint, valid for any address (one per 64-byte line of the stream).
                    prefetch::<STREAM>(w.wrapping_add(at + PREFETCH_BYTES / 4) as *const i8);
                }
            }
            for b in 0..NB {
                // SAFETY: values k .. k + 8 of input row b exist.
                let xv = unsafe { _mm256_loadu_ps(x.add(b * x_stride + k)) };
                for r in 0..R {
                    acc[r][b] = _mm256_fmadd_ps(wv[r], xv, acc[r][b]);
                }
            }
            k += 8;
        }
        for r in 0..R {
            for b in 0..NB {
                let mut sum = hsum(acc[r][b]);
                for kk in body..cols {
                    // SAFETY: in bounds as above.
                    sum += unsafe { *w.add((j + r * gap) * cols + kk) * *x.add(b * x_stride + kk) };
                }
                // SAFETY: (b, r) is inside the output tile.
                unsafe { *out.add(b * out_stride + r * gap) = sum };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::bf16::PackedA;

    fn values(n: usize, seed: u32) -> Vec<f32> {
        (0..n)
            .map(|i| (i as f32 * 0.37 + seed as f32).sin() * 1.7)
            .collect()
    }

    #[test]
    fn f32_weight_rows_match_an_f64_product_for_any_split() {
        // n = 300: one full block of 256 weight rows and a partial one; k = 37 is not a multiple
        // of any vector width.
        for m in [1, 2, 5, 16] {
            let (n, k) = (300, 37);
            let x = values(m * k, 1);
            let w = values(n * k, 2);
            let y = matmul_f32_weight_rows(&x, m, &w, n, k);
            for i in 0..m {
                for j in 0..n {
                    let exact: f64 = (0..k)
                        .map(|t| x[i * k + t] as f64 * w[j * k + t] as f64)
                        .sum();
                    let got = y[i * n + j] as f64;
                    assert!(
                        (got - exact).abs() < 1e-5 * (1.0 + exact.abs()),
                        "m {m} ({i}, {j})"
                    );
                }
            }
            // A row's values do not depend on how many rows share the call.
            let alone = matmul_f32_weight_rows(&x[..k], 1, &w, n, k);
            assert_eq!(alone, y[..n]);
        }
        assert!(matmul_f32_weight_rows(&[], 0, &values(6, 3), 2, 3).is_empty());
    }

    /// f64 reference of the bf16 policy: both operands rounded to bf16.
    fn reference(
        w: &[f32],
        x: &[f32],
        rows: usize,
        cols: usize,
        batch: usize,
        bf16: bool,
    ) -> Vec<f64> {
        let r = |v: f32| {
            if bf16 {
                crate::bf16::round_bf16(v) as f64
            } else {
                v as f64
            }
        };
        let mut out = vec![0.0; batch * rows];
        for b in 0..batch {
            for j in 0..rows {
                out[b * rows + j] = (0..cols)
                    .map(|k| r(w[j * cols + k]) * r(x[b * cols + k]))
                    .sum();
            }
        }
        out
    }

    #[test]
    fn both_layouts_match_the_reference_for_every_batch_size_and_odd_shapes() {
        for (rows, cols) in [(37, 64), (16, 576), (9, 40), (3, 7), (100, 33), (13, 576)] {
            let w = values(rows * cols, 1);
            let packed = PackedA::from_rows(&w, rows, cols);
            for batch in [1, 2, 3, 4, 5, 6, 7, 8, 11] {
                let x = values(batch * cols, 2);
                for bf16 in [false, true] {
                    let weights = if bf16 {
                        packed.weights()
                    } else {
                        Weights::F32 {
                            data: &w,
                            rows,
                            cols,
                        }
                    };
                    let mut inputs = Inputs::new();
                    inputs.prepare(&x, batch, cols, bf16);
                    inputs.stream_weights(rows % 2 == 1);
                    let want = reference(&w, &x, rows, cols, batch, bf16);
                    for kernel in [
                        Kernel::Portable,
                        Kernel::Avx2,
                        Kernel::Avx512,
                        Kernel::Avx512Bf16,
                    ] {
                        if !kernel.available() {
                            eprintln!(
                                "skipped: the {} kernel is not available on this CPU",
                                kernel.name()
                            );
                            continue;
                        }
                        // Two disjoint row ranges, as two threads would split them.
                        let mut out = vec![f32::NAN; batch * rows];
                        let split = rows / 2;
                        // SAFETY: each range's writes stay inside `out` (batch x rows, stride
                        // rows); the kernel is available.
                        unsafe {
                            matvec_with(
                                kernel,
                                &weights,
                                &inputs,
                                0..split,
                                out.as_mut_ptr(),
                                rows,
                            );
                            matvec_with(
                                kernel,
                                &weights,
                                &inputs,
                                split..rows,
                                out.as_mut_ptr().add(split),
                                rows,
                            );
                        }
                        for (i, (&got, &want)) in out.iter().zip(&want).enumerate() {
                            let tol = 1e-5 * (1.0 + want.abs()) * (cols as f64).sqrt();
                            assert!(
                                (got as f64 - want).abs() <= tol,
                                "{} [{rows}x{cols}] batch {batch} bf16 {bf16} element {i}: {got} vs {want}",
                                kernel.name()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn an_output_does_not_depend_on_the_other_inputs_of_the_call() {
        // Past 8 inputs the rows are blocked (a large LM-head-like matrix: several blocks) and
        // past 64 the inputs are chunked; every input row alone gives the same bits as among 70.
        for (rows, cols) in [(700, 576), (45, 1536), (13, 40)] {
            let w = values(rows * cols, 5);
            let packed = PackedA::from_rows(&w, rows, cols);
            let batch = 70;
            let x = values(batch * cols, 6);
            for bf16 in [false, true] {
                let weights = if bf16 {
                    packed.weights()
                } else {
                    Weights::F32 {
                        data: &w,
                        rows,
                        cols,
                    }
                };
                for kernel in [
                    Kernel::Portable,
                    Kernel::Avx2,
                    Kernel::Avx512,
                    Kernel::Avx512Bf16,
                ] {
                    if !kernel.available() {
                        eprintln!(
                            "skipped: the {} kernel is not available on this CPU",
                            kernel.name()
                        );
                        continue;
                    }
                    let run = |x: &[f32], n: usize, stream: bool| {
                        let mut inputs = Inputs::new();
                        inputs.prepare(x, n, cols, bf16);
                        inputs.stream_weights(stream);
                        let mut out = vec![f32::NAN; n * rows];
                        // SAFETY: writes stay inside `out` (n x rows); the kernel is available.
                        unsafe {
                            matvec_with(kernel, &weights, &inputs, 0..rows, out.as_mut_ptr(), rows)
                        };
                        out
                    };
                    let all = run(&x, batch, false);
                    // Nor on how the weights are prefetched (`stream_weights`), nor on the
                    // batch size's tile shape (batch 1 takes the widest tiles).
                    for stream in [false, true] {
                        for b in [0, 7, 8, 19, 64, 69] {
                            let alone = run(&x[b * cols..(b + 1) * cols], 1, stream);
                            let together = &all[b * rows..(b + 1) * rows];
                            assert!(
                                alone
                                    .iter()
                                    .zip(together)
                                    .all(|(a, t)| a.to_bits() == t.to_bits()),
                                "{} [{rows}x{cols}] bf16 {bf16} stream {stream} input {b}",
                                kernel.name()
                            );
                        }
                    }
                }
            }
        }
    }

    #[test]
    fn dot_and_axpy_match_plain_loops_with_every_kernel() {
        for n in [0, 1, 7, 8, 15, 16, 17, 64, 100] {
            let a = values(n, 3);
            let b = values(n, 4);
            let dot_want: f64 = a.iter().zip(&b).map(|(&x, &y)| x as f64 * y as f64).sum();
            let got = dot(&a, &b);
            assert!(
                (got as f64 - dot_want).abs() <= 1e-5 * (1.0 + n as f64),
                "dot n {n}: {got} vs {dot_want}"
            );
            let mut y = values(n, 5);
            let want: Vec<f32> = y.iter().zip(&a).map(|(&v, &x)| v + 0.5 * x).collect();
            axpy(&mut y, 0.5, &a);
            for (g, w) in y.iter().zip(&want) {
                assert!(
                    (g - w).abs() <= 1e-6 * (1.0 + w.abs()),
                    "axpy n {n}: {g} vs {w}"
                );
            }
        }
        eprintln!("dot/axpy ran on the {} kernel", kernel().name());
    }

    #[test]
    fn the_safe_entry_point_refuses_a_short_output() {
        let w = values(4 * 8, 1);
        let weights = Weights::F32 {
            data: &w,
            rows: 4,
            cols: 8,
        };
        let mut inputs = Inputs::new();
        inputs.prepare(&values(16, 2), 2, 8, false);
        let mut out = vec![0.0; 5];
        let caught = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            matvec(&weights, &inputs, 0..4, &mut out, 4)
        }));
        assert!(caught.is_err());
    }
}
