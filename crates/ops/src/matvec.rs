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
//! forces the latter (tests, other CPUs); `crate::dispatch` makes the choice. The two agree up to f32 summation order; each is
//! deterministic and independent of how rows are split between threads (a row's sum never
//! crosses a split).
//!
//! Files: this one holds the layouts, the entry points, the kernel choice and the portable loop;
//! `tiles` the FMA tiles written once for both instruction sets (`fma_tiles!`), expanded in
//! `avx512` (which adds the `vdpbf16ps` tiles) and `avx2`. `matvec` builds on `bf16`'s packs
//! (`PackedA`'s pair layout, `pair_words`); `bf16` does not use `matvec`.
#![allow(unsafe_code)]

use std::ops::Range;

use crate::bf16::{PackedA, PackedB};

#[macro_use]
mod tiles;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
#[cfg(test)]
mod tests;

#[cfg(target_arch = "x86_64")]
pub(crate) use tiles::prefetch;

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
    /// How streaming weights are prefetched, when not this CPU's choice
    /// (`dispatch::decode_prefetch`): the tests run every choice.
    prefetch: Option<crate::dispatch::DecodePrefetch>,
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

    /// Prefetches streaming weights as `tuning` says instead of this CPU's choice. Results do
    /// not change (tested); for tests and A/B runs.
    pub fn prefetch_with(&mut self, tuning: crate::dispatch::DecodePrefetch) {
        self.prefetch = Some(tuning);
    }

    /// The prefetch choice in force for these inputs.
    pub(crate) fn prefetch(&self) -> crate::dispatch::DecodePrefetch {
        self.prefetch
            .unwrap_or_else(crate::dispatch::decode_prefetch)
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

/// Which kernel runs `matvec` (chosen by `crate::dispatch`, the one CPU dispatch point).
pub use crate::dispatch::MatvecKernel as Kernel;

/// The kernel in use: the widest the CPU has (`cpu::level`, which `STOKE_SIMD` lowers; AVX-512
/// with `vdpbf16ps` where the CPU has AVX512-BF16), unless `STOKE_MATVEC_KERNEL` names one
/// (`crate::dispatch::matvec_kernel`).
pub fn kernel() -> Kernel {
    crate::dispatch::matvec_kernel()
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

impl PackedA {
    /// This matrix as `matvec` weights: its rows of bf16 pairs, read in place.
    pub fn weights(&self) -> Weights<'_> {
        Weights::Bf16 {
            data: self.pair_rows(),
            rows: self.rows(),
            cols: self.depth(),
            stride: self.stride(),
        }
    }
}

/// `x W^T` for `x` `[m, k]` row-major f32 and a weight `W` `[n, k]` held as a `PackedA` (the
/// layout inference keeps weights in: decoding reads its rows directly, see `matvec`). Returns
/// `[m, n]`. Few rows (decoding, a prefill's last positions) run the streaming `matvec` kernel
/// over row blocks in parallel; more rows run the GEMM as `(W x^T)^T`, so the weight is the
/// left operand and only the activations are packed per call.
pub fn matmul_weight_rows(x: &[f32], m: usize, w: &PackedA) -> Vec<f32> {
    let (n, k) = (w.rows(), w.depth());
    assert_eq!(
        x.len(),
        m * k,
        "matmul_weight_rows: {} values for [{m}, {k}]",
        x.len()
    );
    let mut out = vec![0.0f32; m * n];
    if m == 0 || n == 0 {
        return out;
    }
    if m <= 16 {
        let mut inputs = Inputs::new();
        inputs.prepare(x, m, k, true);
        matvec_parallel(&w.weights(), &inputs, &mut out);
        return out;
    }
    let transposed = crate::bf16::matmul(w, &PackedB::from_rows(x, m, k));
    transpose_into(&transposed, n, m, &mut out);
    out
}

/// `dst[i, j] = src[j, i]` for `src` `[rows, cols]`, in 32 x 32 blocks (both sides stay in cache),
/// bands of 32 destination rows in parallel.
fn transpose_into(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
    use rayon::prelude::*;
    const B: usize = 32;
    dst.par_chunks_mut(B * rows)
        .enumerate()
        .for_each(|(band, out)| {
            let i0 = band * B;
            let height = out.len() / rows;
            for j0 in (0..rows).step_by(B) {
                let width = (rows - j0).min(B);
                for j in j0..j0 + width {
                    let from = &src[j * cols + i0..j * cols + i0 + height];
                    for (di, &v) in from.iter().enumerate() {
                        out[di * rows + j] = v;
                    }
                }
            }
        });
}
