//! bf16 matrix multiplication with f32 accumulation: `C[m, n] = sum_k A[m, k] * B[n, k]`, the
//! inputs rounded to bf16 (round to nearest even), every product and sum in f32.
//!
//! Why hand-written: candle 0.11's CPU matmul (the `gemm` crate) has no bf16 kernel with f32
//! accumulation (a bf16 tensor matmul there rounds every partial sum to bf16 and runs far
//! below the f32 speed), and no crate on crates.io offers an AMX or `vdpbf16ps` GEMM.
//!
//! Three kernels, chosen at run time (`backend()`; `STOKE_BF16_KERNEL=amx|avx512|portable`
//! forces one, for tests and benchmarks):
//! - **AMX** (Intel Sapphire Rapids and later: `amx-tile` + `amx-bf16`, with the kernel's
//!   permission for tile data asked once per process through `arch_prctl`): 2 x 2 tiles of
//!   16 x 16 f32 accumulators, `tdpbf16ps` over 32-deep slices. Measured on the 2-core Xeon
//!   development VM: about 930 GFLOP/s per core in the inner loop, against 165 for f32 FMA.
//! - **AVX512-BF16** (`vdpbf16ps`, e.g. AMD Zen 4/5): 6 x 64 accumulators in zmm registers.
//!   On the Xeon VM this instruction issues once per two cycles (82 GFLOP/s per core, half the
//!   f32 FMA rate), so it wins only where bytes, not arithmetic, bound the work (decoding).
//! - **AVX2 + FMA** (CPUs without AVX-512, e.g. AMD Zen 1-3; `cpu::level`): no bf16 dot
//!   product, so each pair word is split into its even and odd element as f32 (a shift and a
//!   mask: the products stay exact bf16 x bf16) and multiplied with f32 FMA, in 5 x 16 register
//!   tiles. Arithmetic runs at the f32 rate; what bf16 saves here is the bytes of the packed
//!   operands.
//! - **portable**: the same bf16 values multiplied in plain f32 loops.
//!
//! Layout: both operands are packed once per call (or once per weight version, for decoding)
//! into the pair layout both instruction sets read (AMX calls it VNNI). `PackedA` is row-major
//! with the contraction dimension in pairs (`u32` = two bf16 of consecutive k); `PackedB` is in
//! panels of `NR` = 64 columns, each panel `[k / 2][64 columns][2]` bf16. Both are zero-padded:
//! k to a multiple of 32, A's rows to a multiple of 16, B's columns to a multiple of 64, so
//! every AMX tile is full; zeros add nothing to any sum. Each kernel keeps a block of C in
//! registers over the whole contraction, so C is written once and B panels stream from L2.
//! Work is split over rayon in (row block, panel) tasks. All kernels give the same values up
//! to f32 summation order.
//!
//! What it is not: a bf16-output GEMM (C is always f32: the precision policy keeps
//! activations that feed norms and softmaxes in f32), nor a transposing matmul for arbitrary
//! strides (`from_rows` / `from_cols` cover the layouts a linear layer and its backward need).
//!
//! Files: `pack` (the operands and the rounding), `convert` (the packs' vectorized loops),
//! `tile` (the shapes the kernels share), `dispatch` (the kernel choice, the entry points and the
//! split of C into tasks), and one file per instruction set: `amx`, `avx512bf16`, `avx2`,
//! `portable`. This file only declares them and re-exports the public API. `matvec` builds on
//! these packs (`PackedA::weights`, `matvec::matmul_weight_rows`); nothing here uses `matvec`.

#[cfg(target_arch = "x86_64")]
mod amx;
#[cfg(target_arch = "x86_64")]
mod avx2;
#[cfg(target_arch = "x86_64")]
mod avx512bf16;
pub(crate) mod convert;
mod dispatch;
mod pack;
mod portable;
#[cfg(test)]
mod tests;
mod tile;

pub(crate) use dispatch::rows_times_panel;
pub use dispatch::{
    Backend, backend, matmul, matmul_acc, matmul_acc_with, matmul_into, matmul_new_with,
    matmul_with,
};
pub(crate) use pack::pair_words;
pub use pack::{PackedA, PackedB, bf16_bits, bf16_to_f32, round_bf16};
pub use tile::NR;
pub(crate) use tile::SyncPtr;
