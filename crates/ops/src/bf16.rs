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
#![allow(unsafe_code)]

use rayon::prelude::*;
use std::sync::OnceLock;

use crate::cpu::Level;

/// Columns of C per panel of B.
pub const NR: usize = 64;
/// Rows of C per AVX512 microkernel call.
const MR: usize = 6;
/// Rows of C per parallel task (a multiple of 32 and of MR).
const MC: usize = 192;
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

/// Which kernel runs the bf16 matmuls.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    Amx,
    Avx512Bf16,
    Avx2,
    Portable,
}

impl Backend {
    pub fn name(self) -> &'static str {
        match self {
            Backend::Amx => "amx",
            Backend::Avx512Bf16 => "avx512-bf16",
            Backend::Avx2 => "avx2",
            Backend::Portable => "portable",
        }
    }

    /// Whether this CPU (and kernel) can run the backend.
    pub fn available(self) -> bool {
        match self {
            Backend::Portable => true,
            Backend::Avx512Bf16 => avx512_bf16_supported(),
            Backend::Avx2 => crate::cpu::detected() >= crate::cpu::Level::Avx2,
            Backend::Amx => amx_supported(),
        }
    }
}

fn avx512_bf16_supported() -> bool {
    #[cfg(target_arch = "x86_64")]
    {
        is_x86_feature_detected!("avx512f") && is_x86_feature_detected!("avx512bf16")
    }
    #[cfg(not(target_arch = "x86_64"))]
    {
        false
    }
}

/// AMX-TILE and AMX-BF16 in CPUID, and Linux granted this process the tile data state.
fn amx_supported() -> bool {
    static OK: OnceLock<bool> = OnceLock::new();
    *OK.get_or_init(|| {
        #[cfg(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu"))]
        {
            // CPUID.(EAX=7, ECX=0):EDX bit 22 = AMX-BF16, bit 24 = AMX-TILE.
            let leaf = std::arch::x86_64::__cpuid_count(7, 0);
            let cpu = leaf.edx & (1 << 22) != 0 && leaf.edx & (1 << 24) != 0;
            // ARCH_REQ_XCOMP_PERM (0x1023) for XFEATURE_XTILEDATA (18): without it the first
            // tile instruction raises SIGILL. The permission is per process.
            // SAFETY: arch_prctl with these arguments only changes this process's xstate
            // permissions; it reads and writes no memory.
            cpu && unsafe { libc::syscall(libc::SYS_arch_prctl, 0x1023, 18) } == 0
        }
        #[cfg(not(all(target_arch = "x86_64", target_os = "linux", target_env = "gnu")))]
        {
            false
        }
    })
}

/// The kernel in use: `STOKE_BF16_KERNEL` if set (and available), else the fastest available.
pub fn backend() -> Backend {
    static CHOSEN: OnceLock<Backend> = OnceLock::new();
    *CHOSEN.get_or_init(|| {
        let forced = std::env::var("STOKE_BF16_KERNEL").ok();
        let wanted = match forced.as_deref() {
            Some("amx") => Some(Backend::Amx),
            Some("avx512") | Some("avx512-bf16") => Some(Backend::Avx512Bf16),
            Some("avx2") => Some(Backend::Avx2),
            Some("portable") => Some(Backend::Portable),
            _ => None,
        };
        // `STOKE_SIMD` (cpu::level) lowers the automatic choice too.
        let level = crate::cpu::level();
        match wanted {
            Some(b) if b.available() => b,
            _ if level >= Level::Avx512 && Backend::Amx.available() => Backend::Amx,
            _ if level >= Level::Avx512 && Backend::Avx512Bf16.available() => Backend::Avx512Bf16,
            _ if level >= Level::Avx2 && Backend::Avx2.available() => Backend::Avx2,
            _ => Backend::Portable,
        }
    })
}

/// The left operand, `[m, k]`, in bf16 pairs along k.
#[derive(Debug, Clone)]
pub struct PackedA {
    m: usize,
    k: usize,
    /// Pairs per row: `ceil(k / 2)` rounded up to KP_ALIGN.
    kp: usize,
    /// `round_up(m, M_ALIGN) * kp` pairs; padding rows and pairs are zero.
    data: Words,
}

/// A `PackedA`'s pair words: on the heap, or in a `PageRegion` (weights packed for decoding,
/// which streams them: see `crate::pages`). A clone is always on the heap.
#[derive(Debug)]
enum Words {
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
    n: usize,
    k: usize,
    kp: usize,
    data: Vec<u16>,
}

#[inline]
#[cfg_attr(target_endian = "little", allow(dead_code))]
fn pair(lo: f32, hi: f32) -> u32 {
    bf16_bits(lo) as u32 | ((bf16_bits(hi) as u32) << 16)
}

/// `bf16_bits` without a branch (the same bits for every input, NaN included), so that loops
/// over it vectorize.
#[inline(always)]
fn bits_branchless(x: f32) -> u16 {
    let bits = x.to_bits();
    let nan = (bits & 0x7fff_ffff) > 0x7f80_0000;
    let rounded = bits.wrapping_add(0x7fff + ((bits >> 16) & 1)) >> 16;
    let quiet = (bits >> 16) | 0x0040;
    (if nan { quiet } else { rounded }) as u16
}

/// The operand packs' loops, compiled for the widest instruction set at hand (`cpu::level`,
/// checked at run time) so that the compiler vectorizes the conversion: packing was about a
/// seventh of a bf16 training step at SmolLM2-135M's shapes on a Zen 4 with the scalar,
/// branching `bf16_bits`, called per element.
pub(crate) mod convert {
    use super::bits_branchless;

    /// `dst[i] = bf16_bits(src[i])`.
    #[inline(always)]
    fn bits_generic(src: &[f32], dst: &mut [u16]) {
        for (d, &v) in dst.iter_mut().zip(src) {
            *d = bits_branchless(v);
        }
    }

    /// `dst[i]` = the pair word of `lo[i]` (low half) and `hi[i]` (high half; 0 if `hi` is
    /// None): two rows of the contraction as pairs.
    #[inline(always)]
    fn pairs_generic(lo: &[f32], hi: Option<&[f32]>, dst: &mut [u32]) {
        match hi {
            Some(hi) => {
                for ((d, &a), &b) in dst.iter_mut().zip(lo).zip(hi) {
                    *d = bits_branchless(a) as u32 | (bits_branchless(b) as u32) << 16;
                }
            }
            None => {
                for (d, &a) in dst.iter_mut().zip(lo) {
                    *d = bits_branchless(a) as u32;
                }
            }
        }
    }

    /// `PackedA::from_cols` for one block of `rows` (<= 16) rows of A starting at `first`:
    /// `dst` is the block's `rows * kp` pair words, `src` is A^T `[k, m]`.
    #[inline(always)]
    fn a_cols_block_generic(
        src: &[f32],
        k: usize,
        m: usize,
        first: usize,
        kp: usize,
        dst: &mut [u32],
    ) {
        let rows = dst.len() / kp;
        let mut words = [0u32; 16];
        for j in 0..k.div_ceil(2) {
            let lo = &src[2 * j * m + first..2 * j * m + first + rows];
            let hi = (2 * j + 1 < k)
                .then(|| &src[(2 * j + 1) * m + first..(2 * j + 1) * m + first + rows]);
            pairs_generic(lo, hi, &mut words[..rows]);
            for (r, &word) in words[..rows].iter().enumerate() {
                dst[r * kp + j] = word;
            }
        }
    }

    /// `$public`: `$generic` compiled for AVX2 (`$avx2`) and for AVX-512 (`$avx512`, generated
    /// too unless the `custom` form names a hand-written one), picked by `width()` per call.
    macro_rules! wide {
        ($generic:ident, $avx512:ident, $avx2:ident, $public:ident, ($($arg:ident: $ty:ty),*)) => {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
            fn $avx512($($arg: $ty),*) {
                $generic($($arg),*)
            }

            wide!(custom $generic, $avx512, $avx2, $public, ($($arg: $ty),*));
        };
        (custom $generic:ident, $avx512:ident, $avx2:ident, $public:ident, ($($arg:ident: $ty:ty),*)) => {
            #[cfg(target_arch = "x86_64")]
            #[target_feature(enable = "avx2")]
            fn $avx2($($arg: $ty),*) {
                $generic($($arg),*)
            }

            pub(crate) fn $public($($arg: $ty),*) {
                #[cfg(target_arch = "x86_64")]
                match width() {
                    // SAFETY: the CPU has AVX-512F/BW/VL (`width`).
                    2 => return unsafe { $avx512($($arg),*) },
                    // SAFETY: the CPU has AVX2 (`width`).
                    1 => return unsafe { $avx2($($arg),*) },
                    _ => {}
                }
                $generic($($arg),*)
            }
        };
    }

    wide!(bits_generic, bits_avx512, bits_avx2, bits, (src: &[f32], dst: &mut [u16]));
    wide!(pairs_generic, pairs_avx512, pairs_avx2, pairs, (lo: &[f32], hi: Option<&[f32]>, dst: &mut [u32]));
    // `PackedA::from_cols` for one block of rows (see `a_cols_block_generic`).
    wide!(
        custom a_cols_block_generic,
        a_cols_block_avx512,
        a_cols_block_avx2,
        a_cols_block,
        (src: &[f32], k: usize, m: usize, first: usize, kp: usize, dst: &mut [u32])
    );

    /// Full blocks of 16 rows: 16 pairs of the contraction at a time, rounded and paired in
    /// registers, then transposed (16 x 16 words) so that each row's 16 words are one store.
    /// A partial block (the last, when m is not a multiple of 16) takes the generic loop.
    #[cfg(target_arch = "x86_64")]
    #[target_feature(enable = "avx512f,avx512bw,avx512vl")]
    fn a_cols_block_avx512(
        src: &[f32],
        k: usize,
        m: usize,
        first: usize,
        kp: usize,
        dst: &mut [u32],
    ) {
        use std::arch::x86_64::*;
        if dst.len() != 16 * kp {
            return a_cols_block_generic(src, k, m, first, kp, dst);
        }
        assert!(
            first + 16 <= m && src.len() >= k * m && kp.is_multiple_of(16) && kp >= k.div_ceil(2)
        );
        let one = _mm512_set1_epi32(1);
        let bias = _mm512_set1_epi32(0x7fff);
        let abs_mask = _mm512_set1_epi32(0x7fff_ffff);
        let inf = _mm512_set1_epi32(0x7f80_0000);
        let quiet_bit = _mm512_set1_epi32(0x40);
        // bf16 bits (low 16 bits of each lane) of 16 values: `bits_branchless` in lanes.
        let round = |p: *const f32| {
            // SAFETY: the caller passes 16 readable values.
            let bits = _mm512_castps_si512(unsafe { _mm512_loadu_ps(p) });
            let lsb = _mm512_and_si512(_mm512_srli_epi32::<16>(bits), one);
            let rounded =
                _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, _mm512_add_epi32(bias, lsb)));
            let nan = _mm512_cmpgt_epu32_mask(_mm512_and_si512(bits, abs_mask), inf);
            let quiet = _mm512_or_si512(_mm512_srli_epi32::<16>(bits), quiet_bit);
            _mm512_mask_blend_epi32(nan, rounded, quiet)
        };
        let pairs = k.div_ceil(2);
        let base = src.as_ptr();
        let mut j0 = 0;
        while j0 < pairs {
            let mut v = [_mm512_setzero_si512(); 16];
            for (jj, vj) in v.iter_mut().enumerate() {
                let j = j0 + jj;
                if j >= pairs {
                    break;
                }
                // SAFETY: rows 2j (and 2j + 1 when < k) of src have columns first..first + 16.
                let lo = round(unsafe { base.add(2 * j * m + first) });
                let hi = if 2 * j + 1 < k {
                    // SAFETY: as above, row 2j + 1 < k.
                    round(unsafe { base.add((2 * j + 1) * m + first) })
                } else {
                    _mm512_setzero_si512()
                };
                *vj = _mm512_or_si512(lo, _mm512_slli_epi32::<16>(hi));
            }
            // v[a] lane b = word (row b, pair j0 + a); transpose so row b's 16 words are one
            // vector. After the 32- and 64-bit unpacks, u[4i + c] holds, in 128-bit lane L,
            // pairs 4i..4i + 4 of row 4L + c.
            let mut t = [_mm512_setzero_si512(); 16];
            for i in 0..8 {
                t[2 * i] = _mm512_unpacklo_epi32(v[2 * i], v[2 * i + 1]);
                t[2 * i + 1] = _mm512_unpackhi_epi32(v[2 * i], v[2 * i + 1]);
            }
            let mut u = [_mm512_setzero_si512(); 16];
            for i in 0..4 {
                u[4 * i] = _mm512_unpacklo_epi64(t[4 * i], t[4 * i + 2]);
                u[4 * i + 1] = _mm512_unpackhi_epi64(t[4 * i], t[4 * i + 2]);
                u[4 * i + 2] = _mm512_unpacklo_epi64(t[4 * i + 1], t[4 * i + 3]);
                u[4 * i + 3] = _mm512_unpackhi_epi64(t[4 * i + 1], t[4 * i + 3]);
            }
            for c in 0..4 {
                let p0 = _mm512_shuffle_i32x4::<0x44>(u[c], u[4 + c]);
                let p1 = _mm512_shuffle_i32x4::<0xEE>(u[c], u[4 + c]);
                let q0 = _mm512_shuffle_i32x4::<0x44>(u[8 + c], u[12 + c]);
                let q1 = _mm512_shuffle_i32x4::<0xEE>(u[8 + c], u[12 + c]);
                let rows = [
                    _mm512_shuffle_i32x4::<0x88>(p0, q0),
                    _mm512_shuffle_i32x4::<0xDD>(p0, q0),
                    _mm512_shuffle_i32x4::<0x88>(p1, q1),
                    _mm512_shuffle_i32x4::<0xDD>(p1, q1),
                ];
                for (l, row) in rows.into_iter().enumerate() {
                    let r = 4 * l + c;
                    // SAFETY: row r < 16 of the block has kp >= j0 + 16 words.
                    unsafe { _mm512_storeu_si512(dst.as_mut_ptr().add(r * kp + j0).cast(), row) };
                }
            }
            j0 += 16;
        }
    }

    /// 2: AVX-512 F/BW/VL, 1: AVX2, 0: neither (or lowered by `STOKE_SIMD`).
    #[cfg(target_arch = "x86_64")]
    fn width() -> u8 {
        static WIDTH: std::sync::OnceLock<u8> = std::sync::OnceLock::new();
        *WIDTH.get_or_init(|| match crate::cpu::level() {
            crate::cpu::Level::Avx512
                if is_x86_feature_detected!("avx512bw") && is_x86_feature_detected!("avx512vl") =>
            {
                2
            }
            crate::cpu::Level::Avx512 | crate::cpu::Level::Avx2 => 1,
            crate::cpu::Level::Baseline => 0,
        })
    }

    /// The bf16 halves of pair words, in memory order (low half first on little-endian
    /// targets, the only ones `PackedA::from_rows` reads them on).
    #[cfg(target_endian = "little")]
    pub(crate) fn halves(words: &mut [u32]) -> &mut [u16] {
        // SAFETY: u16 has no invalid bit patterns and half the alignment of u32; the slice
        // covers exactly the words' bytes and borrows them mutably for its lifetime.
        unsafe { std::slice::from_raw_parts_mut(words.as_mut_ptr().cast::<u16>(), words.len() * 2) }
    }

    /// [`halves`] of a shared slice: pair words read as a panel of bf16 (`PackedB`'s
    /// `[pairs][NR][2]` is `[pairs][NR]` words on little-endian targets).
    #[cfg(target_endian = "little")]
    pub(crate) fn halves_ref(words: &[u32]) -> &[u16] {
        // SAFETY: as for `halves`, shared.
        unsafe { std::slice::from_raw_parts(words.as_ptr().cast::<u16>(), words.len() * 2) }
    }

    /// The pair words of a panel row of bf16 (`PackedB`), in memory order: Some where the
    /// slice is 4-byte aligned (as a Vec's buffer and even offsets into it are), on
    /// little-endian targets.
    pub(super) fn words(halves: &mut [u16]) -> Option<&mut [u32]> {
        if cfg!(target_endian = "big") {
            return None;
        }
        // SAFETY: u32 has no invalid bit patterns; align_to_mut only reinterprets the aligned
        // middle part.
        let (head, words, tail) = unsafe { halves.align_to_mut::<u32>() };
        (head.is_empty() && tail.is_empty()).then_some(words)
    }
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

    /// This matrix as `matvec` weights: its rows of bf16 pairs, read in place.
    pub fn weights(&self) -> crate::matvec::Weights<'_> {
        crate::matvec::Weights::Bf16 {
            data: &self.data,
            rows: self.m,
            cols: self.k,
            stride: self.kp,
        }
    }
}

/// `x W^T` for `x` `[m, k]` row-major f32 and a weight `W` `[n, k]` held as a `PackedA` (the
/// layout inference keeps weights in: decoding reads its rows directly, see `matvec`). Returns
/// `[m, n]`. Few rows (decoding, a prefill's last positions) run the streaming `matvec` kernel
/// over row blocks in parallel; more rows run the GEMM as `(W x^T)^T`, so the weight is the
/// left operand and only the activations are packed per call.
pub fn matmul_weight_rows(x: &[f32], m: usize, w: &PackedA) -> Vec<f32> {
    let (n, k) = (w.m, w.k);
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
        let mut inputs = crate::matvec::Inputs::new();
        inputs.prepare(x, m, k, true);
        crate::matvec::matvec_parallel(&w.weights(), &inputs, &mut out);
        return out;
    }
    let transposed = matmul(w, &PackedB::from_rows(x, m, k));
    transpose_into(&transposed, n, m, &mut out);
    out
}

/// `dst[i, j] = src[j, i]` for `src` `[rows, cols]`, in 32 x 32 blocks (both sides stay in cache),
/// bands of 32 destination rows in parallel.
fn transpose_into(src: &[f32], rows: usize, cols: usize, dst: &mut [f32]) {
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

impl PackedB {
    fn panels(n: usize) -> usize {
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

    fn panel(&self, p: usize) -> &[u16] {
        let len = self.panel_len();
        &self.data[p * len..(p + 1) * len]
    }
}

#[cfg(test)]
mod weight_rows_tests {
    use super::*;

    #[test]
    fn weight_rows_products_equal_the_activation_side_gemm() {
        let (n, k) = (70, 96);
        let w: Vec<f32> = (0..n * k).map(|i| ((i as f32) * 0.61).sin()).collect();
        let packed = PackedA::from_rows(&w, n, k);
        for m in [1, 5, 16, 17, 40, 130] {
            let x: Vec<f32> = (0..m * k).map(|i| ((i as f32) * 0.23).cos()).collect();
            let want = matmul(&PackedA::from_rows(&x, m, k), &PackedB::from_rows(&w, n, k));
            let got = matmul_weight_rows(&x, m, &packed);
            for (i, (a, b)) in got.iter().zip(&want).enumerate() {
                assert!(
                    (a - b).abs() <= 1e-5 * (1.0 + b.abs()),
                    "m {m} element {i}: {a} vs {b}"
                );
            }
        }
    }
}

/// `C = A B^T` into a new `[m, n]` row-major f32 buffer.
pub fn matmul(a: &PackedA, b: &PackedB) -> Vec<f32> {
    let mut c = vec![0.0f32; a.m * b.n];
    matmul_into(a, b, &mut c);
    c
}

/// `C = A B^T`, overwriting `c` (`[m, n]` row-major).
pub fn matmul_into(a: &PackedA, b: &PackedB, c: &mut [f32]) {
    matmul_with(backend(), a, b, c)
}

/// `C += A B^T` (`c` is `[m, n]` row-major).
pub fn matmul_acc(a: &PackedA, b: &PackedB, c: &mut [f32]) {
    run_tiles(backend(), a, b, c, true)
}

/// `C += A B^T` with a given kernel (which must be `available()`).
pub fn matmul_acc_with(kernel: Backend, a: &PackedA, b: &PackedB, c: &mut [f32]) {
    run_tiles(kernel, a, b, c, true)
}

/// `C = A B^T` with a given kernel (which must be `available()`).
pub fn matmul_with(kernel: Backend, a: &PackedA, b: &PackedB, c: &mut [f32]) {
    run_tiles(kernel, a, b, c, false)
}

fn run_tiles(kernel: Backend, a: &PackedA, b: &PackedB, c: &mut [f32], accumulate: bool) {
    assert_eq!(
        c.len(),
        a.m * b.n,
        "bf16 matmul: C has {} values for [{}, {}]",
        c.len(),
        a.m,
        b.n
    );
    // SAFETY: C is an initialized [m, n] buffer (asserted).
    unsafe { run_tiles_raw(kernel, a, b, c.as_mut_ptr(), accumulate) }
}

/// `C = A B^T` into a new `[m, n]` buffer with a given kernel (which must be `available()`).
/// With the AVX512-BF16 kernel C is not zeroed first: when not accumulating that kernel only
/// stores to C, and its tiles cover every element (a training step at SmolLM2-135M made
/// about 2 GB of products, each zeroed on one thread before the kernels overwrote it).
pub fn matmul_new_with(kernel: Backend, a: &PackedA, b: &PackedB) -> Vec<f32> {
    let len = a.m * b.n;
    if kernel != Backend::Avx512Bf16 || a.kp == 0 || len == 0 {
        let mut c = vec![0.0f32; len];
        matmul_with(kernel, a, b, &mut c);
        return c;
    }
    let mut c: Vec<f32> = Vec::with_capacity(len);
    // SAFETY: C has room for [m, n] floats; with the AVX512-BF16 kernel and `accumulate`
    // false every one of them is stored (never read) by `run_tiles_raw`, so all are
    // initialized when the length is set.
    unsafe {
        run_tiles_raw(kernel, a, b, c.as_mut_ptr(), false);
        c.set_len(len);
    }
    c
}

/// # Safety
/// `c` points to `a.m * b.n` writable floats, initialized unless `accumulate` is false and
/// `kernel` is `Avx512Bf16` (which then only stores to them, each once).
unsafe fn run_tiles_raw(kernel: Backend, a: &PackedA, b: &PackedB, c: *mut f32, accumulate: bool) {
    assert_eq!(a.k, b.k, "bf16 matmul: A has depth {}, B {}", a.k, b.k);
    assert!(
        kernel.available(),
        "bf16 matmul: the {} kernel is not available",
        kernel.name()
    );
    let (m, n) = (a.m, b.n);
    if m == 0 || n == 0 {
        return;
    }
    if a.kp == 0 {
        // An empty contraction: C = 0 (or unchanged when accumulating).
        if !accumulate {
            // SAFETY: m * n writable floats (the caller's contract).
            unsafe { std::ptr::write_bytes(c, 0, m * n) };
        }
        return;
    }
    let panels = PackedB::panels(n);
    let row_blocks = m.div_ceil(MC);
    // One task per (row block, panel); rows of a block are disjoint across blocks and the
    // columns of a panel disjoint across panels, so tasks write disjoint tiles of C.
    let c_ptr = SyncPtr(c);
    let run = |task: usize| {
        let (block, p) = (task / panels, task % panels);
        let tile = Tile {
            row0: block * MC,
            rows: (m - block * MC).min(MC),
            col0: p * NR,
            cols: (n - p * NR).min(NR),
            accumulate,
        };
        // SAFETY: the tile lies inside C ([m, n], see Tile) and belongs to this task alone.
        unsafe { compute_tile(kernel, a, b.panel(p), c_ptr.get(), n, tile) };
    };
    if row_blocks * panels == 1 {
        run(0);
    } else {
        (0..row_blocks * panels).into_par_iter().for_each(run);
    }
}

/// Rows `row0..row0 + rows` and columns `col0..col0 + cols` (<= NR) of C.
#[derive(Clone, Copy)]
struct Tile {
    row0: usize,
    rows: usize,
    col0: usize,
    cols: usize,
    /// `C += A B^T` instead of `C = A B^T`.
    accumulate: bool,
}

#[derive(Clone, Copy)]
pub(crate) struct SyncPtr(pub(crate) *mut f32);
// SAFETY: used only to hand disjoint tiles of one buffer to rayon tasks (see matmul_with).
unsafe impl Send for SyncPtr {}
// SAFETY: as for Send: each task writes only its own tile through the pointer.
unsafe impl Sync for SyncPtr {}
impl SyncPtr {
    pub(crate) fn get(self) -> *mut f32 {
        self.0
    }
}

/// # Safety
/// `c` is C, `[m, ldc]` row-major, and `tile` lies inside it; `kernel` is available.
unsafe fn compute_tile(
    kernel: Backend,
    a: &PackedA,
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    tile: Tile,
) {
    match kernel {
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded; AMX is available (the caller checked) and A is padded to whole
        // tiles (PackedA::words).
        Backend::Amx => unsafe { amx::tile(a.kp, &a.data, panel, c, ldc, tile) },
        #[cfg(target_arch = "x86_64")]
        Backend::Avx512Bf16 => {
            let a_rows = &a.data[tile.row0 * a.kp..];
            // SAFETY: rows row0..row0 + rows < m of A (kp pairs each) and of C, columns
            // col0..col0 + cols <= ldc of C, all this tile's (the caller's contract).
            unsafe {
                avx512_rows(
                    a.kp,
                    a.kp,
                    a_rows,
                    tile.rows,
                    panel,
                    c.add(tile.row0 * ldc + tile.col0),
                    ldc,
                    tile.cols,
                    tile.accumulate,
                )
            }
        }
        #[cfg(target_arch = "x86_64")]
        // SAFETY: forwarded; the CPU has AVX2 and FMA (the backend is available).
        Backend::Avx2 => unsafe { avx2::tile(a.kp, &a.data, panel, c, ldc, tile) },
        // SAFETY: forwarded.
        _ => unsafe { portable_tile(a, panel, c, ldc, tile) },
    }
}

/// `C[r][c] (+)= sum_{j < pairs} A[r * lda + j] . panel[j][c]` for `r < rows`, `c < cols`
/// (<= NR): the AVX512-BF16 microkernel on raw operands, for callers that pack their own
/// (the attention kernels: sub-ranges of a contraction, strided rows). `a` holds pair words,
/// `panel` `[pairs][NR][2]` bf16; C is row-major with stride `ldc`. Needs
/// `Backend::Avx512Bf16.available()`.
#[allow(clippy::too_many_arguments)]
pub(crate) fn rows_times_panel(
    a: &[u32],
    lda: usize,
    rows: usize,
    pairs: usize,
    panel: &[u16],
    c: &mut [f32],
    ldc: usize,
    cols: usize,
    accumulate: bool,
) {
    if rows == 0 || cols == 0 {
        return;
    }
    assert!(
        Backend::Avx512Bf16.available(),
        "rows_times_panel: no AVX512-BF16"
    );
    assert!(
        pairs <= lda || rows == 1,
        "rows_times_panel: {pairs} pairs, stride {lda}"
    );
    assert!(
        a.len() >= (rows - 1) * lda + pairs,
        "rows_times_panel: A too short"
    );
    assert!(
        panel.len() >= pairs * NR * 2,
        "rows_times_panel: panel too short"
    );
    assert!(cols <= NR && cols <= ldc && c.len() >= (rows - 1) * ldc + cols);
    // SAFETY: AVX512-BF16 is available and the operands' extents were asserted above.
    #[cfg(target_arch = "x86_64")]
    unsafe {
        avx512_rows(
            pairs,
            lda,
            a,
            rows,
            panel,
            c.as_mut_ptr(),
            ldc,
            cols,
            accumulate,
        )
    };
}

/// `rows` rows of C from A's rows (`pairs` words each at stride `lda`) and one panel, in
/// microkernel blocks of MR rows.
///
/// # Safety
/// AVX512F and AVX512-BF16 are available; `a` holds (rows - 1) * lda + pairs words; `panel`
/// pairs * NR * 2 bf16; `c` `rows` rows of `ldc` floats with `cols` (<= NR) writable each.
#[cfg(target_arch = "x86_64")]
#[allow(clippy::too_many_arguments)]
unsafe fn avx512_rows(
    pairs: usize,
    lda: usize,
    a: &[u32],
    rows: usize,
    panel: &[u16],
    c: *mut f32,
    ldc: usize,
    cols: usize,
    acc: bool,
) {
    let mut r = 0;
    while r < rows {
        let mr = (rows - r).min(MR);
        let a_rows = &a[r * lda..];
        // SAFETY: rows r..r + mr of A and C lie inside the extents the caller guarantees.
        unsafe {
            let at = c.add(r * ldc);
            match mr {
                6 => avx512::kernel::<6>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                5 => avx512::kernel::<5>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                4 => avx512::kernel::<4>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                3 => avx512::kernel::<3>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                2 => avx512::kernel::<2>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
                _ => avx512::kernel::<1>(pairs, lda, a_rows, panel, at, ldc, cols, acc),
            }
        }
        r += mr;
    }
}

/// The same bf16 values, f32 products and sums, in plain loops.
///
/// # Safety
/// As `compute_tile`.
unsafe fn portable_tile(a: &PackedA, panel: &[u16], c: *mut f32, ldc: usize, tile: Tile) {
    let kp = a.kp;
    for r in 0..tile.rows {
        let row = tile.row0 + r;
        let pairs = &a.data[row * kp..(row + 1) * kp];
        let mut acc = [0.0f32; NR];
        for (j, &pr) in pairs.iter().enumerate() {
            let (lo, hi) = (bf16_to_f32(pr as u16), bf16_to_f32((pr >> 16) as u16));
            let b = &panel[j * NR * 2..(j + 1) * NR * 2];
            for (col, v) in acc.iter_mut().enumerate() {
                *v += lo * bf16_to_f32(b[col * 2]) + hi * bf16_to_f32(b[col * 2 + 1]);
            }
        }
        // SAFETY: row < m and col0 + cols <= ldc: inside C, owned by this tile.
        let dst =
            unsafe { std::slice::from_raw_parts_mut(c.add(row * ldc + tile.col0), tile.cols) };
        if tile.accumulate {
            dst.iter_mut().zip(&acc).for_each(|(d, v)| *d += v);
        } else {
            dst.copy_from_slice(&acc[..tile.cols]);
        }
    }
}

#[cfg(target_arch = "x86_64")]
mod amx {
    use super::{NR, Tile};
    use std::arch::asm;

    /// The tile configuration: palette 1, all eight tiles 16 rows x 64 bytes.
    /// Tiles 0-3: C (16 x 16 f32 each, a 2 x 2 block); 4, 5: A (16 rows x 32 bf16); 6, 7: B
    /// (16 pair rows x 16 columns x 2 bf16).
    #[repr(C, align(64))]
    struct Config([u8; 64]);

    const CONFIG: Config = {
        let mut bytes = [0u8; 64];
        bytes[0] = 1;
        let mut t = 0;
        while t < 8 {
            bytes[16 + 2 * t] = 64;
            bytes[48 + t] = 16;
            t += 1;
        }
        Config(bytes)
    };

    /// Bytes between consecutive pair rows of a B panel.
    const B_STRIDE: usize = NR * 2 * 2;

    /// Most pairs of the contraction per pass over a tile: the tile's slice of A (MC rows x
    /// 512 pairs = 384 KiB) and of the B panel (128 KiB) then stay in L2 while every 32 x 32
    /// block of the tile is updated. Longer contractions are split into equal passes.
    const KC_MAX: usize = 512;

    /// C tile of `tile.rows` x `tile.cols` from A's rows and one B panel (`C += ...` when
    /// `tile.accumulate`).
    ///
    /// # Safety
    /// AMX is available and permitted; `a` is PackedA data (`kp` a multiple of 16 pairs, rows
    /// padded to 16); `panel` has `kp` pair rows; `c` is C with row stride `ldc` and `tile`
    /// inside it.
    pub(super) unsafe fn tile(
        kp: usize,
        a: &[u32],
        panel: &[u16],
        c: *mut f32,
        ldc: usize,
        tile: Tile,
    ) {
        debug_assert!(kp.is_multiple_of(16) && panel.len() >= kp * NR * 2);
        let a_stride = kp * 4;
        let mut spill = [0.0f32; 32 * 32];
        // SAFETY: the configuration is valid for palette 1 (8 tiles of 16 x 64 bytes).
        unsafe { asm!("ldtilecfg [{}]", in(reg) CONFIG.0.as_ptr(), options(nostack, readonly)) };
        let passes = kp.div_ceil(KC_MAX).max(1);
        let kc = (kp / 16).div_ceil(passes) * 16;
        for j0 in (0..kp).step_by(kc.max(16)) {
            let j1 = (j0 + kc).min(kp);
            let fresh = j0 == 0 && !tile.accumulate;
            let mut r = 0;
            while r < tile.rows {
                let two_rows = tile.rows - r > 16;
                let row = tile.row0 + r;
                debug_assert!(a.len() >= (row + if two_rows { 32 } else { 16 }) * kp);
                for half in 0..2 {
                    let col = half * 32;
                    if col >= tile.cols {
                        break;
                    }
                    let rows_here = (tile.rows - r).min(32);
                    let cols_here = (tile.cols - col).min(32);
                    let direct = rows_here == 32 && cols_here == 32;
                    // The 32 x 32 block is read and written in C when whole, else in `spill`.
                    let (block, stride) = if direct {
                        // SAFETY: the 32 x 32 block at (row, col0 + col) lies inside the tile.
                        (unsafe { c.add(row * ldc + tile.col0 + col) }, ldc * 4)
                    } else {
                        (spill.as_mut_ptr(), 32 * 4)
                    };
                    if fresh {
                        // SAFETY: tilezero touches tile registers only.
                        unsafe {
                            asm!(
                                "tilezero tmm0",
                                "tilezero tmm1",
                                "tilezero tmm2",
                                "tilezero tmm3",
                                options(nostack, nomem)
                            );
                        }
                    } else {
                        if !direct {
                            spill.fill(0.0);
                            for rr in 0..rows_here {
                                // SAFETY: row + rr < m and col0 + col + cols_here <= ldc.
                                let src = unsafe {
                                    std::slice::from_raw_parts(
                                        c.add((row + rr) * ldc + tile.col0 + col),
                                        cols_here,
                                    )
                                };
                                spill[rr * 32..rr * 32 + cols_here].copy_from_slice(src);
                            }
                        }
                        let block = if direct { block } else { spill.as_mut_ptr() };
                        // SAFETY: `block` has 32 rows of `stride` bytes with 32 floats each.
                        unsafe {
                            asm!(
                                "tileloadd tmm0, [{d} + {s}*1]",
                                "tileloadd tmm1, [{d2} + {s}*1]",
                                "tileloadd tmm2, [{d3} + {s}*1]",
                                "tileloadd tmm3, [{d4} + {s}*1]",
                                d = in(reg) block,
                                d2 = in(reg) block.add(16),
                                d3 = in(reg) block.byte_add(16 * stride),
                                d4 = in(reg) block.byte_add(16 * stride).add(16),
                                s = in(reg) stride,
                                options(nostack, readonly),
                            );
                        }
                    }
                    let a0 = a[row * kp..].as_ptr();
                    let b0 = panel[col * 2..].as_ptr();
                    // SAFETY: every tile load reads 16 rows of 64 bytes inside A (rows row..row +
                    // 32 exist when two_rows, row..row + 16 always: padded) or inside the panel.
                    unsafe {
                        for j in (j0..j1).step_by(16) {
                            let ap = a0.add(j);
                            let bp = b0.add(j * NR * 2);
                            if two_rows {
                                asm!(
                                    "tileloadd tmm4, [{a} + {sa}*1]",
                                    "tileloadd tmm5, [{a2} + {sa}*1]",
                                    "tileloadd tmm6, [{b} + {sb}*1]",
                                    "tileloadd tmm7, [{b2} + {sb}*1]",
                                    "tdpbf16ps tmm0, tmm4, tmm6",
                                    "tdpbf16ps tmm1, tmm4, tmm7",
                                    "tdpbf16ps tmm2, tmm5, tmm6",
                                    "tdpbf16ps tmm3, tmm5, tmm7",
                                    a = in(reg) ap,
                                    a2 = in(reg) ap.add(16 * kp),
                                    sa = in(reg) a_stride,
                                    b = in(reg) bp,
                                    b2 = in(reg) bp.add(32),
                                    sb = in(reg) B_STRIDE,
                                    options(nostack, readonly),
                                );
                            } else {
                                asm!(
                                    "tileloadd tmm4, [{a} + {sa}*1]",
                                    "tileloadd tmm6, [{b} + {sb}*1]",
                                    "tileloadd tmm7, [{b2} + {sb}*1]",
                                    "tdpbf16ps tmm0, tmm4, tmm6",
                                    "tdpbf16ps tmm1, tmm4, tmm7",
                                    a = in(reg) ap,
                                    sa = in(reg) a_stride,
                                    b = in(reg) bp,
                                    b2 = in(reg) bp.add(32),
                                    sb = in(reg) B_STRIDE,
                                    options(nostack, readonly),
                                );
                            }
                        }
                    }
                    // SAFETY: as for the loads above; tiles 2 and 3 only hold rows of C when the
                    // block has a second row tile (else they would write past the tile's rows
                    // in C, so they are stored only then).
                    unsafe {
                        asm!(
                            "tilestored [{d} + {s}*1], tmm0",
                            "tilestored [{d2} + {s}*1], tmm1",
                            d = in(reg) block,
                            d2 = in(reg) block.add(16),
                            s = in(reg) stride,
                            options(nostack),
                        );
                        if two_rows {
                            asm!(
                                "tilestored [{d} + {s}*1], tmm2",
                                "tilestored [{d2} + {s}*1], tmm3",
                                d = in(reg) block.byte_add(16 * stride),
                                d2 = in(reg) block.byte_add(16 * stride).add(16),
                                s = in(reg) stride,
                                options(nostack),
                            );
                        }
                    }
                    if !direct {
                        for rr in 0..rows_here {
                            // SAFETY: row + rr < m and col0 + col + cols_here <= ldc.
                            let out = unsafe {
                                std::slice::from_raw_parts_mut(
                                    c.add((row + rr) * ldc + tile.col0 + col),
                                    cols_here,
                                )
                            };
                            out.copy_from_slice(&spill[rr * 32..rr * 32 + cols_here]);
                        }
                    }
                }
                r += 32;
            }
        }
        // SAFETY: releases this thread's tile state (configured above).
        unsafe { asm!("tilerelease", options(nostack, nomem)) };
    }
}

#[cfg(target_arch = "x86_64")]
// Register tiles are fixed-size arrays indexed by row: loops over indices read best.
#[allow(clippy::needless_range_loop)]
mod avx2 {
    use super::{NR, Tile};
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
}

#[cfg(target_arch = "x86_64")]
mod avx512 {
    use super::NR;
    use std::arch::x86_64::*;

    /// `C[0..R, 0..cols] = A[0..R] . panel`, R rows of A pairs (`kp` each, row `r` at
    /// `r * lda`).
    ///
    /// # Safety
    /// AVX512F and AVX512-BF16 are available; `a` holds (R - 1) * lda + kp pairs; `panel`
    /// kp * NR * 2 bf16; `c` R rows of `ldc` floats with `cols` (<= NR) writable each.
    #[allow(clippy::too_many_arguments)]
    #[target_feature(enable = "avx512f,avx512bf16")]
    pub(super) unsafe fn kernel<const R: usize>(
        kp: usize,
        lda: usize,
        a: &[u32],
        panel: &[u16],
        c: *mut f32,
        ldc: usize,
        cols: usize,
        accumulate: bool,
    ) {
        debug_assert!(a.len() >= (R - 1) * lda + kp && panel.len() >= kp * NR * 2 && cols <= NR);
        let mut acc = [[_mm512_setzero_ps(); 4]; R];
        let ap = a.as_ptr();
        let bp = panel.as_ptr();
        for j in 0..kp {
            // SAFETY: j < kp, so the four 64-byte loads stay inside panel row j.
            let b: [__m512bh; 4] = unsafe {
                let row = bp.add(j * NR * 2);
                [
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(row.cast())),
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        row.add(32).cast(),
                    )),
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        row.add(64).cast(),
                    )),
                    std::mem::transmute::<__m512i, __m512bh>(_mm512_loadu_si512(
                        row.add(96).cast(),
                    )),
                ]
            };
            for (r, acc_row) in acc.iter_mut().enumerate() {
                // SAFETY: r < R and j < kp index inside `a`.
                let pair = unsafe { *ap.add(r * lda + j) } as i32;
                // SAFETY: both are 64-byte vector types; the bits are 16 bf16 pairs.
                let av =
                    unsafe { std::mem::transmute::<__m512i, __m512bh>(_mm512_set1_epi32(pair)) };
                for q in 0..4 {
                    acc_row[q] = _mm512_dpbf16_ps(acc_row[q], av, b[q]);
                }
            }
        }
        for (r, acc_row) in acc.iter().enumerate() {
            // SAFETY: row r of C has `cols` writable floats.
            let row = unsafe { c.add(r * ldc) };
            for (q, v) in acc_row.iter().enumerate() {
                let first = q * 16;
                if first >= cols {
                    break;
                }
                let valid = (cols - first).min(16);
                let mask: __mmask16 = if valid == 16 {
                    0xffff
                } else {
                    (1u16 << valid) - 1
                };
                // SAFETY: the masked lanes are inside row r's `cols` floats.
                unsafe {
                    let v = if accumulate {
                        _mm512_add_ps(*v, _mm512_maskz_loadu_ps(mask, row.add(first)))
                    } else {
                        *v
                    };
                    _mm512_mask_storeu_ps(row.add(first), mask, v)
                };
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn values(n: usize, seed: f32) -> Vec<f32> {
        (0..n)
            .map(|i| ((i as f32 * 0.731 + seed).sin() * 1.7).powi(3))
            .collect()
    }

    /// The reference and, per entry, the sum of the products' magnitudes (the scale of f32
    /// summation error).
    fn reference_with_magnitude(
        a: &[f32],
        b: &[f32],
        m: usize,
        n: usize,
        k: usize,
    ) -> (Vec<f64>, Vec<f64>) {
        let mut c = vec![0.0f64; m * n];
        let mut mag = vec![0.0f64; m * n];
        for i in 0..m {
            for j in 0..n {
                for kk in 0..k {
                    let p = round_bf16(a[i * k + kk]) as f64 * round_bf16(b[j * k + kk]) as f64;
                    c[i * n + j] += p;
                    mag[i * n + j] += p.abs();
                }
            }
        }
        (c, mag)
    }

    /// f32 summation of `k` terms: about sqrt(k) units of f32 epsilon times the magnitude sum
    /// (a lost or doubled product is off by a whole product, far beyond this).
    fn tolerance(magnitude: f64, k: usize) -> f64 {
        1e-6 + 2.0 * (k as f64).sqrt() * f32::EPSILON as f64 * magnitude
    }

    fn transpose(x: &[f32], rows: usize, cols: usize) -> Vec<f32> {
        let mut t = vec![0.0; x.len()];
        for r in 0..rows {
            for c in 0..cols {
                t[c * rows + r] = x[r * cols + c];
            }
        }
        t
    }

    fn check(m: usize, n: usize, k: usize) {
        let a = values(m * k, 0.3);
        let b = values(n * k, 1.9);
        let (want, magnitude) = reference_with_magnitude(&a, &b, m, n, k);
        let (pa, pb) = (PackedA::from_rows(&a, m, k), PackedB::from_rows(&b, n, k));
        for kernel in [
            Backend::Portable,
            Backend::Avx2,
            Backend::Avx512Bf16,
            Backend::Amx,
        ] {
            if !kernel.available() {
                continue;
            }
            let mut c = vec![f32::NAN; m * n];
            matmul_with(kernel, &pa, &pb, &mut c);
            for (idx, (&got, &w)) in c.iter().zip(&want).enumerate() {
                assert!(
                    (got as f64 - w).abs() <= tolerance(magnitude[idx], k),
                    "{} {m}x{n}x{k} [{idx}]: {got} vs {w}",
                    kernel.name()
                );
            }
        }
        let from_rows = matmul(&pa, &pb);
        let from_cols = matmul(
            &PackedA::from_cols(&transpose(&a, m, k), k, m),
            &PackedB::from_cols(&transpose(&b, n, k), k, n),
        );
        assert_eq!(
            from_rows, from_cols,
            "packing layouts disagree at {m}x{n}x{k}"
        );
        for (idx, (&got, &w)) in from_rows.iter().zip(&want).enumerate() {
            // f32 accumulation of exact bf16 products: error ~ k * eps_f32 * |terms|.
            assert!(
                (got as f64 - w).abs() <= tolerance(magnitude[idx], k),
                "{m}x{n}x{k} [{idx}]: {got} vs {w}"
            );
        }
    }

    #[test]
    fn matches_the_bf16_rounded_reference_on_edge_shapes() {
        for &(m, n, k) in &[
            (1, 1, 1),
            (1, 64, 2),
            (7, 65, 3),
            (6, 128, 64),
            (13, 70, 33),
            (97, 129, 200),
            (200, 5, 577),
            (2, 300, 1),
            (40, 70, 1100),
            (3, 5, 0),
        ] {
            check(m, n, k);
        }
    }

    #[test]
    fn every_available_kernel_agrees_with_the_portable_one() {
        let mut ran = Vec::new();
        for &(m, n, k) in &[
            (1, 5, 3),
            (11, 77, 45),
            (33, 130, 64),
            (200, 64, 70),
            (17, 64, 1),
        ] {
            let a = PackedA::from_rows(&values(m * k, 0.1), m, k);
            let b = PackedB::from_rows(&values(n * k, 0.2), n, k);
            let mut portable = vec![f32::NAN; m * n];
            matmul_with(Backend::Portable, &a, &b, &mut portable);
            for kernel in [Backend::Amx, Backend::Avx512Bf16, Backend::Avx2] {
                if !kernel.available() {
                    eprintln!(
                        "skipped: the {} kernel is not available on this CPU",
                        kernel.name()
                    );
                    continue;
                }
                ran.push(kernel.name());
                let mut got = vec![f32::NAN; m * n];
                matmul_with(kernel, &a, &b, &mut got);
                for (x, y) in got.iter().zip(&portable) {
                    assert!(
                        (x - y).abs() <= 1e-4 * (1.0 + y.abs()),
                        "{} at {m}x{n}x{k}: {x} vs {y}",
                        kernel.name()
                    );
                }
            }
        }
        eprintln!("kernels checked against the portable one: {ran:?}");
    }

    #[test]
    fn accumulating_adds_to_c_with_every_kernel() {
        // k = 1100 spans several AMX passes (KC pairs each) and an edge block.
        let (m, n, k) = (37, 70, 1100);
        let (av, bv) = (values(m * k, 0.4), values(n * k, 0.8));
        let (a, b) = (PackedA::from_rows(&av, m, k), PackedB::from_rows(&bv, n, k));
        let (want, magnitude) = reference_with_magnitude(&av, &bv, m, n, k);
        let start: Vec<f32> = (0..m * n).map(|i| i as f32 * 0.5 - 100.0).collect();
        for kernel in [
            Backend::Portable,
            Backend::Avx2,
            Backend::Avx512Bf16,
            Backend::Amx,
        ] {
            if !kernel.available() {
                eprintln!(
                    "skipped: the {} kernel is not available on this CPU",
                    kernel.name()
                );
                continue;
            }
            let mut c = start.clone();
            run_tiles(kernel, &a, &b, &mut c, true);
            for (idx, &got) in c.iter().enumerate() {
                let w = want[idx] + start[idx] as f64;
                let tol = tolerance(magnitude[idx] + start[idx].abs() as f64, k);
                assert!(
                    (got as f64 - w).abs() <= tol,
                    "{} [{idx}]: {got} vs {w}",
                    kernel.name()
                );
            }
        }
    }

    #[test]
    fn rounding_is_to_nearest_even() {
        assert_eq!(bf16_bits(1.0), 0x3f80);
        // 1 + 2^-8 is halfway between 1 and 1 + 2^-7: ties to even (1.0).
        assert_eq!(bf16_bits(1.0 + 1.0 / 256.0), 0x3f80);
        // 1 + 3 * 2^-8 is halfway between 1 + 2^-7 and 1 + 2^-6: ties to even (the latter).
        assert_eq!(bf16_bits(1.0 + 3.0 / 256.0), 0x3f82);
        assert!(bf16_to_f32(bf16_bits(f32::NAN)).is_nan());
        assert_eq!(bf16_to_f32(bf16_bits(f32::INFINITY)), f32::INFINITY);
        assert_eq!(round_bf16(-0.0).to_bits(), (-0.0f32).to_bits());
    }

    #[test]
    fn the_vectorized_conversion_gives_the_scalar_bits() {
        // Specials, ties, subnormals, the largest finite values (which round to infinity),
        // then a sweep of bit patterns.
        let mut inputs = vec![
            0.0f32,
            -0.0,
            1.0,
            1.0 + 1.0 / 256.0,
            1.0 + 3.0 / 256.0,
            f32::MIN_POSITIVE,
            f32::from_bits(1),
            f32::from_bits(0x8000_7fff),
            f32::MAX,
            f32::MIN,
            f32::INFINITY,
            f32::NEG_INFINITY,
            f32::NAN,
            f32::from_bits(0x7f80_0001),
            f32::from_bits(0xffc0_1234),
        ];
        inputs.extend((0..100_000u32).map(|i| f32::from_bits(i.wrapping_mul(0x9e37_79b9))));
        let mut got = vec![0u16; inputs.len()];
        convert::bits(&inputs, &mut got);
        for (x, g) in inputs.iter().zip(&got) {
            assert_eq!(*g, bf16_bits(*x), "bits of {:#x}", x.to_bits());
        }
        let (lo, hi) = inputs.split_at(inputs.len() / 2);
        let mut words = vec![0u32; lo.len()];
        convert::pairs(lo, Some(&hi[..lo.len()]), &mut words);
        for (i, w) in words.iter().enumerate() {
            assert_eq!(
                *w,
                bf16_bits(lo[i]) as u32 | (bf16_bits(hi[i]) as u32) << 16
            );
        }
        convert::pairs(lo, None, &mut words);
        for (i, w) in words.iter().enumerate() {
            assert_eq!(*w, bf16_bits(lo[i]) as u32);
        }
    }

    #[test]
    fn packs_hold_the_rounded_values_in_their_layouts() {
        // Odd depths (a padded last pair), partial panels and row blocks.
        for (rows, k) in [(1, 1), (5, 7), (17, 33), (70, 64), (130, 77)] {
            let mut a = values(rows * k, 0.7);
            // Specials where the vector rounding has its own lanes for them.
            let len = a.len();
            a[len / 2] = f32::NAN;
            a[len - 1] = f32::INFINITY;
            a[len / 3] = f32::from_bits(0x7f80_0001);
            let at = transpose(&a, rows, k);
            let from_rows = PackedA::from_rows(&a, rows, k);
            let from_cols = PackedA::from_cols(&at, k, rows);
            assert_eq!(from_rows.data, from_cols.data, "PackedA [{rows}, {k}]");
            // Packed into a region (decoding's weights): the same words, padding zero, and a
            // second matrix after the first.
            let region = crate::pages::PageRegion::new(2 * PackedA::words(rows, k));
            for _ in 0..2 {
                let in_pages = PackedA::from_rows_in(&a, rows, k, region.as_ref());
                assert_eq!(
                    in_pages.data, from_rows.data,
                    "PackedA [{rows}, {k}] in pages"
                );
                assert_eq!(in_pages.region().is_some(), region.is_some());
                assert!(
                    in_pages.clone().region().is_none(),
                    "a clone is on the heap"
                );
            }
            for r in 0..rows {
                for kk in 0..k {
                    let word = from_rows.data[r * from_rows.kp + kk / 2];
                    let bits = if kk % 2 == 0 {
                        word as u16
                    } else {
                        (word >> 16) as u16
                    };
                    assert_eq!(bits, bf16_bits(a[r * k + kk]), "A ({r}, {kk})");
                }
            }
            assert!(
                from_rows.data[rows * from_rows.kp..]
                    .iter()
                    .all(|&w| w == 0),
                "A's padding rows"
            );
            let b_rows = PackedB::from_rows(&a, rows, k);
            let b_cols = PackedB::from_cols(&at, k, rows);
            assert_eq!(b_rows.data, b_cols.data, "PackedB [{rows}, {k}]");
            for c in 0..rows {
                let (p, col) = (c / NR, c % NR);
                let panel = b_rows.panel(p);
                for kk in 0..k {
                    let got = panel[(kk / 2) * NR * 2 + col * 2 + (kk & 1)];
                    assert_eq!(got, bf16_bits(a[c * k + kk]), "B ({c}, {kk})");
                }
            }
        }
    }
}
