//! Weight-only Q8_0 (GGUF's 8-bit block format) and its decode kernel: `y[b, j] = sum_k W[j, k]
//! x[b, k]` for a few input rows `b` against Q8_0 weights, computed on the 8-bit values directly
//! (issue 53, "quantized weights computed directly").
//!
//! The format: blocks of 32 values along a row, each an f16 scale `d` and 32 int8 `q`, value
//! `d * q` (llama.cpp's `block_q8_0`). Rows are padded with zeros to whole blocks. The product
//! follows llama.cpp's `ggml_vec_dot_q8_0_q8_0`: the inputs are quantized to Q8 blocks the same
//! way once per call (`Q8Inputs`, with an f32 scale per block instead of f16), each block's
//! int8 x int8 dot product is an exact int32, and that times `d_w * d_x` is summed in f32.
//!
//! Why hand-written: at decode time the product is bound by the bytes of the weights, and Q8_0
//! is 34 bytes per 32 weights against bf16's 64. Dequantizing to f32 or bf16 first would read
//! (and write) the wide form again; here each 64-byte line of quants feeds `vpdpbusd` (AVX-512
//! VNNI) or `vpmaddubsw` (AVX2) straight from memory, against every input row of the call.
//!
//! What it is not: no other GGUF type (Q4_K and friends), no GEMM path for long prompts, no
//! gradient; nothing in the model uses it yet. `crate::dispatch` does not know it: the kernel
//! is chosen here (`kernel()`), within `dispatch::level()` (so `STOKE_SIMD` lowers it).
//!
//! Storage (`Q8Matrix`): the quants and the scales of a row are kept apart (scales as f16 bits,
//! `blocks` per row; quants `32 * blocks` bytes per row), so the kernel reads 34 bytes per
//! block, as GGUF stores them. Within a row the quants are repacked, not dequantized:
//! - stored offset by 128 (`q ^ 0x80` as an unsigned byte, `q + 128`), the unsigned operand
//!   `vpdpbusd` wants. The product is then `sum (q_w + 128) q_x - 128 sum q_x`: the correction
//!   `128 sum q_x` is per input block and computed once per call with the inputs, so the weights
//!   need no per-product sign trick and the int32 block sum stays exact;
//! - in groups of 16 blocks (512 bytes), interleaved by 4-byte words: word `i` (values `4i ..
//!   4i + 4`) of block `b` of the group at word `16 i + b`. A 64-byte load then holds one word of
//!   each of 16 blocks, so eight `vpdpbusd` accumulate lane `b` into block `b`'s whole int32 sum
//!   with no horizontal reduction; AVX2 reads the same group as 16 32-byte halves (blocks 0-7,
//!   8-15). The `T = blocks % 16` blocks past the last whole group are interleaved the same
//!   way at width `T` (word `i` of block `b` at word `T i + b`), so a masked load of `T` words
//!   at `T i` puts block `b` in lane `b` again: no horizontal sums anywhere. The inputs use the
//!   same layout (without the offset).
//!
//! Summation order (every path the same, so every path gives bit-identical results, tested): for
//! block `t` of a row, `term = (isum_t as f32) * (d_w * d_x)` (two f32 roundings, no FMA), added
//! into lane `t % 16` of 16 f32 lanes, blocks in increasing order; the 16 lanes are then summed
//! pairwise (`reduce16`; the SIMD kernels in registers, in the same order). The int32 sums are
//! exact (at most 32 * 128 * 127 in size, also exact as f32), so only the f32 steps could differ,
//! and they are the same operations.
//!
//! Kernels (`Q8Kernel`): AVX-512 VNNI, AVX-VNNI (the same on 256 bits), AVX2 (`vpmaddubsw` with the
//! sign trick on the unoffset weights: `|q_w|` unsigned times `q_x` with `q_w`'s sign; `|q_w| <=
//! 128`, `|q_x| <= 127`, so a pair of products never saturates 16 bits), and a portable loop. Each
//! takes up to 8 input rows per pass over the weights; more inputs are taken 8 at a time. Software
//! prefetch, one per 64-byte line of each weight row: when the inputs say the weights stream from
//! memory (`Q8Inputs::stream_weights`), the bf16 decode kernels' per-CPU choice
//! (`dispatch::decode_prefetch`: `t1` 4 KiB ahead on Intel, `nta` on AMD); otherwise `t0`
//! `PREFETCH_AHEAD` bytes ahead. Results do not depend on it.
#![allow(unsafe_code)]

#[cfg(target_arch = "x86_64")]
use crate::matvec::prefetch;
use std::ops::Range;

use crate::dispatch::{DecodePrefetch, PrefetchHint};

#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512;
mod f16;
#[cfg(test)]
mod tests;

pub use f16::{f16_to_f32, f32_to_f16};

/// Values per block.
pub const BLOCK: usize = 32;
/// Blocks per interleaved group (the lanes of the f32 sums).
const GROUP: usize = 16;
/// Bytes per interleaved group of quants.
const GROUP_BYTES: usize = GROUP * BLOCK;
/// Input rows per pass over the weights.
const MAX_BATCH: usize = 8;
/// Bytes ahead of the current line that cached weights are prefetched (and streaming weights
/// where the CPU's choice names no distance).
const PREFETCH_AHEAD: usize = 1024;

/// Byte offset of value `e` of block `block` within a row of `blocks` blocks in the kernel's
/// layout (see the module doc).
fn position(block: usize, e: usize, blocks: usize) -> usize {
    let whole = blocks / GROUP * GROUP;
    // The last group has `width` blocks: 16, or the `blocks % 16` past the whole groups.
    let (g, b) = (block / GROUP, block % GROUP);
    let width = if block < whole { GROUP } else { blocks - whole };
    g * GROUP_BYTES + ((e / 4) * width + b) * 4 + e % 4
}

/// llama.cpp's Q8_0 rule for one block: `d = amax / 127`, `q = round(x / d)` (as `x * (1 /
/// d)`, half away from zero), `q = 0` where `d = 0`. Returns the f32 `d` (callers round it to
/// f16 for weights).
fn quantize_block(x: &[f32], q: &mut [i8; BLOCK]) -> f32 {
    let amax = x.iter().fold(0f32, |m, v| m.max(v.abs()));
    let d = amax / 127.0;
    let id = if d != 0.0 { 1.0 / d } else { 0.0 };
    *q = [0; BLOCK];
    for (q, &v) in q.iter_mut().zip(x) {
        *q = (v * id).round() as i8;
    }
    d
}

/// A weight matrix `W[rows, cols]` in Q8_0, laid out for `q8_matvec` (see the module doc).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Q8Matrix {
    rows: usize,
    cols: usize,
    /// Blocks per row, `cols` rounded up to 32.
    blocks: usize,
    /// `rows * blocks * 32` bytes, `q + 128`, in the kernel's layout.
    quants: Vec<u8>,
    /// `rows * blocks` f16 bit patterns, row-major in block order.
    scales: Vec<u16>,
}

impl Q8Matrix {
    /// Quantizes row-major f32 weights `[rows, cols]` with llama.cpp's Q8_0 rule (see
    /// `quantize_block`; the scale is stored as f16, the quants from the f32 scale).
    pub fn quantize(w: &[f32], rows: usize, cols: usize) -> Q8Matrix {
        assert_eq!(
            w.len(),
            rows * cols,
            "Q8Matrix::quantize: {} values for [{rows}, {cols}]",
            w.len()
        );
        let mut m = Q8Matrix::zeros(rows, cols);
        let mut q = [0i8; BLOCK];
        for r in 0..rows {
            let row = &w[r * cols..(r + 1) * cols];
            for b in 0..m.blocks {
                let part = &row[b * BLOCK..((b + 1) * BLOCK).min(cols)];
                let mut padded = [0f32; BLOCK];
                padded[..part.len()].copy_from_slice(part);
                let d = quantize_block(&padded, &mut q);
                m.set_block(r, b, f32_to_f16(d), &q);
            }
        }
        m
    }

    /// Takes a GGUF Q8_0 tensor's raw data: `rows * cols / 32` blocks of 34 bytes (the scale as
    /// little-endian f16, then 32 int8), row-major. The bytes are rearranged, not dequantized.
    pub fn from_gguf_bytes(bytes: &[u8], rows: usize, cols: usize) -> Result<Q8Matrix, String> {
        const BLOCK_BYTES: usize = 2 + BLOCK;
        if !cols.is_multiple_of(BLOCK) {
            return Err(format!(
                "Q8_0 tensor [{rows}, {cols}]: a row must be whole blocks of {BLOCK} values, \
                 {cols} columns is not a multiple of {BLOCK}"
            ));
        }
        let expected = rows
            .checked_mul(cols / BLOCK)
            .and_then(|n| n.checked_mul(BLOCK_BYTES))
            .ok_or_else(|| format!("Q8_0 tensor [{rows}, {cols}]: size overflows"))?;
        if bytes.len() != expected {
            return Err(format!(
                "Q8_0 tensor [{rows}, {cols}]: expected {expected} bytes ({} blocks of \
                 {BLOCK_BYTES}), got {}",
                expected / BLOCK_BYTES,
                bytes.len()
            ));
        }
        let mut m = Q8Matrix::zeros(rows, cols);
        let mut q = [0i8; BLOCK];
        for (i, block) in bytes.chunks_exact(BLOCK_BYTES).enumerate() {
            let d = u16::from_le_bytes([block[0], block[1]]);
            for (q, &byte) in q.iter_mut().zip(&block[2..]) {
                *q = byte as i8;
            }
            m.set_block(i / m.blocks, i % m.blocks, d, &q);
        }
        Ok(m)
    }

    fn zeros(rows: usize, cols: usize) -> Q8Matrix {
        let blocks = cols.div_ceil(BLOCK);
        Q8Matrix {
            rows,
            cols,
            blocks,
            // q = 0 is stored as 128.
            quants: vec![0x80; rows * blocks * BLOCK],
            scales: vec![0; rows * blocks],
        }
    }

    fn set_block(&mut self, row: usize, block: usize, d: u16, q: &[i8; BLOCK]) {
        self.scales[row * self.blocks + block] = d;
        let base = row * self.blocks * BLOCK;
        for (e, &v) in q.iter().enumerate() {
            self.quants[base + position(block, e, self.blocks)] = (v as u8) ^ 0x80;
        }
    }

    /// Block `block` of row `row` as GGUF holds it: the f16 scale's bits and the 32 quants.
    pub fn block(&self, row: usize, block: usize) -> (u16, [i8; BLOCK]) {
        let base = row * self.blocks * BLOCK;
        let mut q = [0i8; BLOCK];
        for (e, q) in q.iter_mut().enumerate() {
            *q = (self.quants[base + position(block, e, self.blocks)] ^ 0x80) as i8;
        }
        (self.scales[row * self.blocks + block], q)
    }

    /// The values `d * q`, `[rows, cols]` row-major (the reference for tests).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.rows * self.cols);
        for r in 0..self.rows {
            for b in 0..self.blocks {
                let (d, q) = self.block(r, b);
                let d = f16_to_f32(d);
                let n = BLOCK.min(self.cols - b * BLOCK);
                out.extend(q[..n].iter().map(|&q| d * q as f32));
            }
        }
        out
    }

    pub fn rows(&self) -> usize {
        self.rows
    }

    pub fn cols(&self) -> usize {
        self.cols
    }

    /// Bytes the kernel reads per pass over the matrix: 34 per block.
    pub fn bytes(&self) -> usize {
        self.quants.len() + 2 * self.scales.len()
    }
}

/// Input rows quantized to Q8 blocks for `q8_matvec` (f32 scale per block, quants in the
/// weights' layout, and each block's `128 * sum q` for the weights' offset). Reused between
/// calls to avoid allocation.
#[derive(Debug, Clone, Default)]
pub struct Q8Inputs {
    batch: usize,
    cols: usize,
    blocks: usize,
    /// `batch * blocks * 32`, the kernel's layout.
    quants: Vec<i8>,
    /// `batch * blocks`.
    scales: Vec<f32>,
    /// `batch * blocks`: `128 * sum q` per block.
    offsets: Vec<i32>,
    /// The weights these inputs meet stream from memory (see `stream_weights`).
    stream: bool,
    /// Prefetch for streaming weights when not this CPU's choice.
    prefetch: Option<DecodePrefetch>,
}

impl Q8Inputs {
    pub fn new() -> Q8Inputs {
        Q8Inputs::default()
    }

    /// Quantizes `x` (`[batch, cols]` row-major) block by block with the Q8_0 rule (scale kept
    /// in f32).
    pub fn prepare(&mut self, x: &[f32], batch: usize, cols: usize) {
        assert_eq!(
            x.len(),
            batch * cols,
            "Q8Inputs: {} values for [{batch}, {cols}]",
            x.len()
        );
        let blocks = cols.div_ceil(BLOCK);
        self.batch = batch;
        self.cols = cols;
        self.blocks = blocks;
        self.quants.clear();
        self.quants.resize(batch * blocks * BLOCK, 0);
        self.scales.clear();
        self.offsets.clear();
        let mut q = [0i8; BLOCK];
        for (row, dst) in x
            .chunks_exact(cols.max(1))
            .zip(self.quants.chunks_exact_mut(blocks * BLOCK))
        {
            for b in 0..blocks {
                let part = &row[b * BLOCK..((b + 1) * BLOCK).min(cols)];
                let mut padded = [0f32; BLOCK];
                padded[..part.len()].copy_from_slice(part);
                self.scales.push(quantize_block(&padded, &mut q));
                self.offsets
                    .push(128 * q.iter().map(|&v| v as i32).sum::<i32>());
                for (e, &v) in q.iter().enumerate() {
                    dst[position(b, e, blocks)] = v;
                }
            }
        }
    }

    pub fn batch(&self) -> usize {
        self.batch
    }

    /// The quantized inputs' values `d * q`, `[batch, cols]` (the reference for tests).
    pub fn dequantize(&self) -> Vec<f32> {
        let mut out = Vec::with_capacity(self.batch * self.cols);
        for r in 0..self.batch {
            let row = &self.quants[r * self.blocks * BLOCK..(r + 1) * self.blocks * BLOCK];
            for b in 0..self.blocks {
                let d = self.scales[r * self.blocks + b];
                let n = BLOCK.min(self.cols - b * BLOCK);
                out.extend((0..n).map(|e| d * row[position(b, e, self.blocks)] as f32));
            }
        }
        out
    }

    /// Says whether the weights these inputs meet stream from memory; as
    /// `matvec::Inputs::stream_weights`. Results do not depend on it.
    pub fn stream_weights(&mut self, stream: bool) {
        self.stream = stream;
    }

    /// Prefetches streaming weights as `tuning` says instead of this CPU's choice (tests, A/B
    /// runs). Results do not depend on it.
    pub fn prefetch_with(&mut self, tuning: DecodePrefetch) {
        self.prefetch = Some(tuning);
    }

    /// The hint and distance in bytes the kernels prefetch weight rows with.
    fn prefetch_plan(&self) -> (PrefetchHint, usize) {
        if !self.stream {
            return (PrefetchHint::T0, PREFETCH_AHEAD);
        }
        let tuned = self
            .prefetch
            .unwrap_or_else(crate::dispatch::decode_prefetch);
        (tuned.hint, tuned.ahead.unwrap_or(PREFETCH_AHEAD))
    }
}

/// Which kernel runs `q8_matvec`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Q8Kernel {
    /// AVX-512F/BW/VL with VNNI (`vpdpbusd`): Intel Ice Lake / Sapphire Rapids and later, AMD
    /// Zen 4 and later.
    Avx512Vnni,
    /// AVX2 with F16C and AVX-VNNI (`vpdpbusd` on 256 bits): Intel Alder Lake and later.
    AvxVnni,
    /// AVX2 with F16C (`vpmaddubsw`, `vcvtph2ps`).
    Avx2,
    Portable,
}

impl Q8Kernel {
    pub const ALL: [Q8Kernel; 4] = [
        Q8Kernel::Avx512Vnni,
        Q8Kernel::AvxVnni,
        Q8Kernel::Avx2,
        Q8Kernel::Portable,
    ];

    pub fn name(self) -> &'static str {
        match self {
            Q8Kernel::Avx512Vnni => "avx512-vnni",
            Q8Kernel::AvxVnni => "avx-vnni",
            Q8Kernel::Avx2 => "avx2",
            Q8Kernel::Portable => "portable",
        }
    }

    /// Whether this CPU has the instructions (regardless of `STOKE_SIMD`).
    pub fn available(self) -> bool {
        match self {
            #[cfg(target_arch = "x86_64")]
            Q8Kernel::Avx512Vnni => {
                is_x86_feature_detected!("avx512f")
                    && is_x86_feature_detected!("avx512bw")
                    && is_x86_feature_detected!("avx512vl")
                    && is_x86_feature_detected!("avx512vnni")
                    && is_x86_feature_detected!("avx2")
            }
            #[cfg(target_arch = "x86_64")]
            Q8Kernel::AvxVnni => Q8Kernel::Avx2.available() && is_x86_feature_detected!("avxvnni"),
            #[cfg(target_arch = "x86_64")]
            Q8Kernel::Avx2 => is_x86_feature_detected!("avx2") && is_x86_feature_detected!("f16c"),
            #[cfg(not(target_arch = "x86_64"))]
            Q8Kernel::Avx512Vnni | Q8Kernel::AvxVnni | Q8Kernel::Avx2 => false,
            Q8Kernel::Portable => true,
        }
    }
}

/// The kernel in use: the widest this CPU has, within `dispatch::level()` (`STOKE_SIMD`).
pub fn kernel() -> Q8Kernel {
    use crate::dispatch::{Level, level};
    static CHOSEN: std::sync::OnceLock<Q8Kernel> = std::sync::OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let level = level();
        if level >= Level::Avx512 && Q8Kernel::Avx512Vnni.available() {
            Q8Kernel::Avx512Vnni
        } else if level >= Level::Avx2 && Q8Kernel::AvxVnni.available() {
            Q8Kernel::AvxVnni
        } else if level >= Level::Avx2 && Q8Kernel::Avx2.available() {
            Q8Kernel::Avx2
        } else {
            Q8Kernel::Portable
        }
    })
}

/// `out[b * out_stride + (j - rows.start)] = sum_k W[j, k] x[b, k]` for `j` in `rows`, every
/// input row `b`, on the quantized values (see the module doc).
pub fn q8_matvec(
    w: &Q8Matrix,
    x: &Q8Inputs,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    q8_matvec_with(kernel(), w, x, rows, out, out_stride)
}

/// As `q8_matvec` with a given kernel (tests, benchmarks). Panics if the CPU lacks it.
pub fn q8_matvec_with(
    kernel: Q8Kernel,
    w: &Q8Matrix,
    x: &Q8Inputs,
    rows: Range<usize>,
    out: &mut [f32],
    out_stride: usize,
) {
    let (batch, width) = (x.batch, rows.len());
    if batch == 0 || width == 0 {
        return;
    }
    assert!(
        out_stride >= width && out.len() >= (batch - 1) * out_stride + width,
        "q8_matvec: output of {} values too small for {batch} rows of {width} at stride \
         {out_stride}",
        out.len()
    );
    // SAFETY: the assertion above bounds every write; `out` is borrowed mutably.
    unsafe { q8_matvec_raw(kernel, w, x, rows, out.as_mut_ptr(), out_stride) }
}

/// `out[b, j] = sum_k W[j, k] x[b, k]` for every weight row `j` (`out` is `[x.batch(),
/// w.rows()]`), blocks of 256 weight rows in parallel (rayon). Each output is the same as
/// `q8_matvec`'s, whatever the split.
pub fn q8_matvec_parallel(w: &Q8Matrix, x: &Q8Inputs, out: &mut [f32]) {
    use rayon::prelude::*;
    const ROWS: usize = 256;
    let n = w.rows;
    assert!(
        out.len() >= x.batch * n,
        "q8_matvec_parallel: output of {} values too small for [{}, {n}]",
        out.len(),
        x.batch
    );
    if x.batch == 0 {
        return;
    }
    let kernel = kernel();
    let c = crate::bf16::SyncPtr(out.as_mut_ptr());
    (0..n.div_ceil(ROWS)).into_par_iter().for_each(|block| {
        let rows = block * ROWS..((block + 1) * ROWS).min(n);
        // SAFETY: block `block` writes columns `rows` of every output row, disjoint from every
        // other block's, inside `out` ([batch, n], checked above).
        unsafe { q8_matvec_raw(kernel, w, x, rows.clone(), c.get().add(rows.start), n) };
    });
}

/// # Safety
/// `out + b * out_stride + c` is valid for writes for every `b < x.batch()` and `c <
/// rows.len()`, and nothing else accesses those elements during the call.
unsafe fn q8_matvec_raw(
    kernel: Q8Kernel,
    w: &Q8Matrix,
    x: &Q8Inputs,
    rows: Range<usize>,
    out: *mut f32,
    out_stride: usize,
) {
    assert!(
        kernel.available(),
        "q8_matvec: the {} kernel is not available on this CPU",
        kernel.name()
    );
    assert!(rows.end <= w.rows, "q8_matvec: rows {rows:?} of {}", w.rows);
    assert_eq!(
        x.cols, w.cols,
        "q8_matvec: inputs quantized for {} columns, weights have {}",
        x.cols, w.cols
    );
    let mut b0 = 0;
    while b0 < x.batch {
        let nb = (x.batch - b0).min(MAX_BATCH);
        let part = Part {
            w,
            x,
            first: b0,
            nb,
            out: out.wrapping_add(b0 * out_stride),
            out_stride,
        };
        match kernel {
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the instructions (asserted); bounds as documented.
            Q8Kernel::Avx512Vnni => unsafe { avx512::rows(&part, rows.clone()) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the instructions (asserted); bounds as documented.
            Q8Kernel::AvxVnni => unsafe { avx2::vnni::rows(&part, rows.clone()) },
            #[cfg(target_arch = "x86_64")]
            // SAFETY: the CPU has the instructions (asserted); bounds as documented.
            Q8Kernel::Avx2 => unsafe { avx2::maddubs::rows(&part, rows.clone()) },
            // SAFETY: bounds as documented.
            _ => unsafe { portable(&part, rows.clone()) },
        }
        b0 += nb;
    }
}

/// One kernel call's operands: input rows `first .. first + nb` (at most `MAX_BATCH`), whose
/// outputs start at `out` (element (first, rows.start) of the caller's buffer).
struct Part<'a> {
    w: &'a Q8Matrix,
    x: &'a Q8Inputs,
    first: usize,
    nb: usize,
    out: *mut f32,
    out_stride: usize,
}

impl Part<'_> {
    /// Row `row`'s quants.
    fn w_quants(&self, row: usize) -> *const u8 {
        let len = self.w.blocks * BLOCK;
        self.w.quants[row * len..(row + 1) * len].as_ptr()
    }

    fn w_scales(&self, row: usize) -> *const u16 {
        self.w.scales[row * self.w.blocks..(row + 1) * self.w.blocks].as_ptr()
    }

    /// Input `b` (of this part)'s quants, scales and offsets.
    fn x_row(&self, b: usize) -> (*const i8, *const f32, *const i32) {
        let (blocks, i) = (self.x.blocks, self.first + b);
        (
            self.x.quants[i * blocks * BLOCK..(i + 1) * blocks * BLOCK].as_ptr(),
            self.x.scales[i * blocks..(i + 1) * blocks].as_ptr(),
            self.x.offsets[i * blocks..(i + 1) * blocks].as_ptr(),
        )
    }
}

/// The 16 lanes summed pairwise: `(l0 + l8) + (l4 + l12)` and so on, the same in every kernel.
fn reduce16(mut lanes: [f32; GROUP]) -> f32 {
    let mut width = GROUP / 2;
    while width > 0 {
        for l in 0..width {
            lanes[l] += lanes[l + width];
        }
        width /= 2;
    }
    lanes[0]
}

/// The canonical order in plain loops (see the module doc).
///
/// # Safety
/// As `q8_matvec_raw`, for the part's inputs.
unsafe fn portable(part: &Part, rows: Range<usize>) {
    let blocks = part.w.blocks;
    for j in rows.clone() {
        // SAFETY: row j exists (checked by the caller): `blocks * 32` quants, `blocks` scales.
        let (wq, ws) = unsafe {
            (
                std::slice::from_raw_parts(part.w_quants(j), blocks * BLOCK),
                std::slice::from_raw_parts(part.w_scales(j), blocks),
            )
        };
        for b in 0..part.nb {
            let (xq, xs, _) = part.x_row(b);
            // SAFETY: input rows hold as many blocks as the weight rows (checked by the caller).
            let (xq, xs) = unsafe {
                (
                    std::slice::from_raw_parts(xq, blocks * BLOCK),
                    std::slice::from_raw_parts(xs, blocks),
                )
            };
            let mut lanes = [0f32; GROUP];
            for t in 0..blocks {
                let isum: i32 = (0..BLOCK)
                    .map(|e| {
                        let p = position(t, e, blocks);
                        ((wq[p] ^ 0x80) as i8 as i32) * xq[p] as i32
                    })
                    .sum();
                lanes[t % GROUP] += isum as f32 * (f16_to_f32(ws[t]) * xs[t]);
            }
            // SAFETY: (b, j - rows.start) is inside the caller's output.
            unsafe { *part.out.add(b * part.out_stride + j - rows.start) = reduce16(lanes) };
        }
    }
}

/// `$f::<R, NB, HINT>(part, rows, ahead)` for the part's batch size (`$r` the tile heights for
/// 1..=8 inputs) and prefetch hint, as constants.
#[cfg(target_arch = "x86_64")]
macro_rules! dispatch_tile {
    ($f:ident, $part:expr, $rows:expr, [$r1:literal, $r2:literal, $r3:literal, $r4:literal, $r5:literal, $r6:literal, $r7:literal, $r8:literal]) => {{
        let (hint, ahead) = $part.x.prefetch_plan();
        dispatch_tile!(@hint $f, $part, $rows, ahead, hint, [$r1, $r2, $r3, $r4, $r5, $r6, $r7, $r8])
    }};
    (@hint $f:ident, $part:expr, $rows:expr, $ahead:expr, $hint:expr, $rs:tt) => {
        match $hint {
            PrefetchHint::None => dispatch_tile!(@nb $f, $part, $rows, $ahead, 0, $rs),
            PrefetchHint::T0 => dispatch_tile!(@nb $f, $part, $rows, $ahead, 1, $rs),
            PrefetchHint::T1 => dispatch_tile!(@nb $f, $part, $rows, $ahead, 2, $rs),
            PrefetchHint::T2 => dispatch_tile!(@nb $f, $part, $rows, $ahead, 3, $rs),
            PrefetchHint::Nta => dispatch_tile!(@nb $f, $part, $rows, $ahead, 4, $rs),
        }
    };
    (@nb $f:ident, $part:expr, $rows:expr, $ahead:expr, $hint:expr, [$r1:literal, $r2:literal, $r3:literal, $r4:literal, $r5:literal, $r6:literal, $r7:literal, $r8:literal]) => {
        match $part.nb {
            1 => walk::<$r1, 1, $hint>($part, $rows, $ahead),
            2 => walk::<$r2, 2, $hint>($part, $rows, $ahead),
            3 => walk::<$r3, 3, $hint>($part, $rows, $ahead),
            4 => walk::<$r4, 4, $hint>($part, $rows, $ahead),
            5 => walk::<$r5, 5, $hint>($part, $rows, $ahead),
            6 => walk::<$r6, 6, $hint>($part, $rows, $ahead),
            7 => walk::<$r7, 7, $hint>($part, $rows, $ahead),
            _ => walk::<$r8, 8, $hint>($part, $rows, $ahead),
        }
    };
}
#[cfg(target_arch = "x86_64")]
use dispatch_tile;
