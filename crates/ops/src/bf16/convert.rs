//! The operand packs' loops, compiled for the widest instruction set at hand (`cpu::level`,
//! checked at run time) so that the compiler vectorizes the conversion: packing was about a
//! seventh of a bf16 training step at SmolLM2-135M's shapes on a Zen 4 with the scalar,
//! branching `bf16_bits`, called per element.
//!
//! What it is not: the packs themselves (`pack`), nor the f32 -> bf16 rounding rule, which
//! `bf16_bits` defines and `bits_branchless` reproduces bit for bit, NaN included.
#![allow(unsafe_code)]

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
fn a_cols_block_generic(src: &[f32], k: usize, m: usize, first: usize, kp: usize, dst: &mut [u32]) {
    let rows = dst.len() / kp;
    let mut words = [0u32; 16];
    for j in 0..k.div_ceil(2) {
        let lo = &src[2 * j * m + first..2 * j * m + first + rows];
        let hi =
            (2 * j + 1 < k).then(|| &src[(2 * j + 1) * m + first..(2 * j + 1) * m + first + rows]);
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
fn a_cols_block_avx512(src: &[f32], k: usize, m: usize, first: usize, kp: usize, dst: &mut [u32]) {
    use std::arch::x86_64::*;
    if dst.len() != 16 * kp {
        return a_cols_block_generic(src, k, m, first, kp, dst);
    }
    assert!(first + 16 <= m && src.len() >= k * m && kp.is_multiple_of(16) && kp >= k.div_ceil(2));
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
        let rounded = _mm512_srli_epi32::<16>(_mm512_add_epi32(bits, _mm512_add_epi32(bias, lsb)));
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
